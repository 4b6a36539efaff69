// tok_hf.c: a Hugging Face tokenizer.json of the byte-level BPE kind (GPT-2, LLaMA-3, Qwen2
// families): its vocabulary, merges, special tokens and pre-tokenizer pattern (docs/tokenizers.md).
//
// Byte-level: vocabulary strings spell bytes through GPT-2's byte-to-character map (bytes_to_unicode
// in GPT-2's encoder.py), so each is decoded to the bytes it stands for. Merging follows the HF
// library's BPE (tokenizers' models/bpe/word.rs), not tiktoken's: the candidate pairs are pairs of
// *tokens*, ranked by the merge list (two tokens whose bytes join into a third but that no merge
// names never merge), the lowest rank first, the leftmost on ties. The NFC normalizer (Qwen2's) is
// utf8proc's, and the added tokens that are not special (Qwen2.5's <tool_call>, <|fim_prefix|>, ...)
// are found in the text first, as the HF library does. Everything else in a tokenizer.json that would
// change the ids (another normalizer, other pre-tokenizers, a unigram or WordPiece model, dropout,
// byte fallback, an added token that strips or matches whole words) is refused by name, never ignored.
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <utf8proc.h>

#include "bytescale/error.h"
#include "bytescale/json.h"
#include "data/tok_internal.h"

static const char BYTELEVEL_PATTERN[] =
    "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+";
// the end-of-document token: the first of these that the file has as a special token
static const char *const EOT_NAMES[] = {"<|endoftext|>", "<|end_of_text|>", "</s>", "<eos>"};
#define EMPTY UINT64_MAX
#define NONE UINT32_MAX

// ---- GPT-2's byte <-> character map ----------------------------------------------------------

// The character that stands for byte b: printable Latin-1 stands for itself, the other 68 bytes
// for 256, 257, ... in byte order.
static uint32_t byte_char(int b) {
    if ((b >= 33 && b <= 126) || (b >= 161 && b <= 172) || b >= 174) return (uint32_t)b;
    int k = 0;
    for (int c = 0; c < b; c++) k += !((c >= 33 && c <= 126) || (c >= 161 && c <= 172) || c >= 174);
    return 256u + (uint32_t)k;
}

// char_byte[c]: the byte character c stands for, -1 for another character (c < 324).
static void char_byte_map(int16_t *char_byte) {
    memset(char_byte, 0xff, 324 * sizeof *char_byte);
    for (int b = 0; b < 256; b++) char_byte[byte_char(b)] = (int16_t)b;
}

// Decode a vocabulary string into bytes (out has room for strlen(s)); -1 when a character is not
// one of the map's.
static long unmap_token(const char *s, const int16_t *char_byte, uint8_t *out) {
    const uint8_t *p = (const uint8_t *)s;
    long n = 0;
    while (*p) {
        uint32_t cp;
        if (p[0] < 0x80) cp = p[0], p += 1;
        else if ((p[0] & 0xe0) == 0xc0 && p[1]) cp = (uint32_t)(p[0] & 0x1f) << 6 | (p[1] & 0x3f), p += 2;
        else return -1;  // the map's characters are all below U+0144: one or two bytes of UTF-8
        if (cp >= 324 || char_byte[cp] < 0) return -1;
        out[n++] = (uint8_t)char_byte[cp];
    }
    return n;
}

// ---- what the file holds, and what it must not ---------------------------------------------

static int refuse_kind(const char *path, const char *type) {
    if (!strcmp(type, "Unigram"))
        return bs_fail("%s: a SentencePiece unigram model (\"Unigram\"); bytescale reads byte-level BPE only", path);
    if (!strcmp(type, "WordPiece"))
        return bs_fail("%s: a WordPiece model (BERT-style); bytescale reads byte-level BPE only", path);
    if (!strcmp(type, "WordLevel")) return bs_fail("%s: a WordLevel model; bytescale reads byte-level BPE only", path);
    return bs_fail("%s: model type \"%s\"; bytescale reads byte-level BPE only", path, type);
}

static const char *type_of(const cJSON *o) { return cJSON_GetStringValue(cJSON_GetObjectItem(o, "type")); }

static int is_true(const cJSON *o, const char *key) { return cJSON_IsTrue(cJSON_GetObjectItem(o, key)); }

static int check_model(const char *path, const cJSON *model) {
    const char *type = type_of(model);
    if (!model || !type) return bs_fail("%s: no model.type: not a tokenizer.json", path);
    if (strcmp(type, "BPE") != 0) return refuse_kind(path, type);
    const cJSON *d = cJSON_GetObjectItem(model, "dropout");
    if (cJSON_IsNumber(d) && d->valuedouble != 0.0) return bs_fail("%s: BPE dropout %g: encoding would be random", path, d->valuedouble);
    if (is_true(model, "byte_fallback"))
        return bs_fail("%s: a byte-fallback BPE (SentencePiece-style, as LLaMA-2's): not byte-level", path);
    const char *keys[] = {"continuing_subword_prefix", "end_of_word_suffix"};
    for (int i = 0; i < 2; i++) {
        const char *v = cJSON_GetStringValue(cJSON_GetObjectItem(model, keys[i]));
        if (v && *v) return bs_fail("%s: model.%s \"%s\": not a byte-level BPE", path, keys[i], v);
    }
    if (!cJSON_IsObject(cJSON_GetObjectItem(model, "vocab")) || !cJSON_IsArray(cJSON_GetObjectItem(model, "merges")))
        return bs_fail("%s: model.vocab (an object) and model.merges (an array) are required", path);
    return 0;
}

// A Split pre-tokenizer that isolates its regex's matches, as GPT-2's pattern does.
static int split_pattern(const char *path, const cJSON *split, const char **pattern, int *literal) {
    const char *behavior = cJSON_GetStringValue(cJSON_GetObjectItem(split, "behavior"));
    if (!behavior || strcmp(behavior, "Isolated") != 0)
        return bs_fail("%s: a Split pre-tokenizer with behavior \"%s\" (only \"Isolated\" is read)", path,
                       behavior ? behavior : "?");
    if (is_true(split, "invert")) return bs_fail("%s: an inverted Split pre-tokenizer is not read", path);
    const cJSON *pat = cJSON_GetObjectItem(split, "pattern");
    *pattern = cJSON_GetStringValue(cJSON_GetObjectItem(pat, "Regex"));
    *literal = 0;
    if (!*pattern) {
        *pattern = cJSON_GetStringValue(cJSON_GetObjectItem(pat, "String"));
        *literal = 1;
    }
    return *pattern ? 0 : bs_fail("%s: a Split pre-tokenizer without a pattern", path);
}

// ByteLevel alone (its own GPT-2 pattern, or none), or Sequence [Split, ByteLevel without regex].
static int read_pretokenizer(Tokenizer *t, const char *path, const cJSON *pre) {
    const char *type = type_of(pre), *pattern = NULL;
    int literal = 0;
    if (!type) return bs_fail("%s: no pre_tokenizer: not a byte-level tokenizer", path);
    const cJSON *bl = pre;
    if (!strcmp(type, "Sequence")) {
        const cJSON *list = cJSON_GetObjectItem(pre, "pretokenizers");
        const cJSON *a = cJSON_GetArrayItem(list, 0), *b = cJSON_GetArrayItem(list, 1);
        if (cJSON_GetArraySize(list) != 2 || !type_of(a) || strcmp(type_of(a), "Split") != 0 || !type_of(b) ||
            strcmp(type_of(b), "ByteLevel") != 0)
            return bs_fail("%s: a pre-tokenizer Sequence other than [Split, ByteLevel] is not read", path);
        if (split_pattern(path, a, &pattern, &literal) != 0) return -1;
        if (is_true(b, "use_regex") || is_true(b, "add_prefix_space"))
            return bs_fail("%s: a ByteLevel after a Split must have use_regex and add_prefix_space false", path);
        bl = b;
    } else if (strcmp(type, "ByteLevel") != 0) {
        return bs_fail("%s: pre-tokenizer \"%s\"; bytescale reads ByteLevel, or Split then ByteLevel", path, type);
    }
    const cJSON *use_regex = cJSON_GetObjectItem(bl, "use_regex");
    if (bl == pre && (!use_regex || cJSON_IsTrue(use_regex))) pattern = BYTELEVEL_PATTERN;
    t->prefix_space = is_true(bl, "add_prefix_space");
    if (!pattern) pattern = "(?s).+";  // no splitting: the whole text is one piece
    // the HF library's Split runs Oniguruma with Ruby syntax, where ^ and $ match at every line
    return bpe_compile_pattern(t, pattern, PCRE2_MULTILINE | (literal ? PCRE2_LITERAL : 0), "hf");
}

// None, or NFC (the Qwen2 family's): any other normalizer changes the text in ways not read here.
static int read_normalizer(Tokenizer *t, const char *path, const cJSON *root) {
    const cJSON *n = cJSON_GetObjectItem(root, "normalizer");
    if (!n || cJSON_IsNull(n)) return 0;
    const char *type = type_of(n);
    if (type && !strcmp(type, "NFC")) return t->nfc = 1, 0;
    return bs_fail("%s: normalizer \"%s\" is not supported (bytescale reads none, or NFC)", path, type ? type : "?");
}

// An added token that is not special is matched in the text before anything else (below). Only the
// plain kind is read: one that strips the spaces beside it or matches whole words only would need
// the library's rules for those, and one matched in the normalized text differs where NFC changes it.
static int check_added(const Tokenizer *t, const char *path, const cJSON *e, const char *content) {
    const char *flags[] = {"lstrip", "rstrip", "single_word"};
    for (int i = 0; i < 3; i++)
        if (is_true(e, flags[i])) return bs_fail("%s: added token \"%s\" has %s: not supported", path, content, flags[i]);
    if (!*content) return bs_fail("%s: an added token with empty content", path);
    if (t->nfc && is_true(e, "normalized"))
        return bs_fail("%s: added token \"%s\" is matched in NFC-normalized text (\"normalized\": true): not supported",
                       path, content);
    return 0;
}

// ---- vocabulary, special tokens, merges ----------------------------------------------------

// The ids: model.vocab plus the added tokens; vocab = the highest id + 1.
static int read_vocab(Tokenizer *t, const char *path, const cJSON *vocab, const cJSON *added) {
    int64_t max_id = -1;
    size_t text = 0;
    const cJSON *e;
    cJSON_ArrayForEach(e, vocab) {
        if (!cJSON_IsNumber(e) || e->valuedouble < 0 || e->valuedouble >= (double)UINT32_MAX / 4)
            return bs_fail("%s: model.vocab[\"%s\"] is not an id", path, e->string);
        if ((int64_t)e->valuedouble > max_id) max_id = (int64_t)e->valuedouble;
        text += strlen(e->string);
    }
    cJSON_ArrayForEach(e, added) {
        const cJSON *id = cJSON_GetObjectItem(e, "id");
        const char *content = cJSON_GetStringValue(cJSON_GetObjectItem(e, "content"));
        if (!cJSON_IsNumber(id) || id->valuedouble < 0 || id->valuedouble >= (double)UINT32_MAX / 4 || !content)
            return bs_fail("%s: an added token without an id or content", path);
        if (!is_true(e, "special")) {
            if (check_added(t, path, e, content) != 0) return -1;
            t->n_added++;
        }
        if ((int64_t)id->valuedouble > max_id) max_id = (int64_t)id->valuedouble;
        text += strlen(content);
    }
    if (max_id < 255) return bs_fail("%s: %lld tokens: a byte-level BPE has at least 256", path, (long long)max_id + 1);
    t->vocab = (uint32_t)max_id + 1;
    t->blob = bs_malloc(text + 1);
    t->tok_off = bs_calloc(t->vocab, sizeof(uint32_t));
    t->tok_len = bs_calloc(t->vocab, sizeof(uint32_t));
    t->added = bs_calloc(t->n_added + 1, sizeof(uint32_t));
    return t->blob && t->tok_off && t->tok_len && t->added ? 0 : -1;
}

// Token bytes of model.vocab (through the byte map) and of the special tokens (their text); the
// bytes -> id table of the model's tokens; each byte's token.
static int fill_tokens(Tokenizer *t, const char *path, const cJSON *vocab, const cJSON *added) {
    int16_t char_byte[324];
    char_byte_map(char_byte);
    const cJSON *e;
    cJSON_ArrayForEach(e, vocab) {
        uint32_t id = (uint32_t)e->valuedouble;
        long n = unmap_token(e->string, char_byte, t->blob + t->blob_used);
        if (n <= 0) return bs_fail("%s: token \"%s\" (id %u) is not byte-level (GPT-2's byte map)", path, e->string, id);
        if (t->tok_len[id]) return bs_fail("%s: id %u is given to two tokens", path, id);
        t->tok_off[id] = t->blob_used;
        t->tok_len[id] = (uint32_t)n;
        t->blob_used += (uint32_t)n;
    }
    uint32_t n_slots = 1;
    while (n_slots < 2 * t->vocab) n_slots *= 2;
    t->slots = bs_calloc(n_slots, sizeof(uint32_t));
    if (!t->slots) return -1;
    t->slot_mask = n_slots - 1;
    for (uint32_t id = 0; id < t->vocab; id++)
        if (t->tok_len[id]) bpe_table_insert(t, id);
    for (int b = 0; b < 256; b++) {
        uint8_t c = (uint8_t)b;
        int64_t id = gpt2_rank(t, &c, 1);
        if (id < 0) return bs_fail("%s: byte 0x%02x has no token; not a byte-level BPE", path, b);
        t->byte_id[b] = (uint32_t)id;
    }
    t->eot = -1;
    uint32_t k_added = 0;
    cJSON_ArrayForEach(e, added) {
        uint32_t id = (uint32_t)cJSON_GetObjectItem(e, "id")->valuedouble;
        const char *content = cJSON_GetStringValue(cJSON_GetObjectItem(e, "content"));
        size_t n = strlen(content);
        memcpy(t->blob + t->blob_used, content, n);
        t->tok_off[id] = t->blob_used, t->tok_len[id] = (uint32_t)n;
        t->blob_used += (uint32_t)n;
        if (!is_true(e, "special")) {  // matched in text, the longest first (insertion: a handful of them)
            uint32_t k = k_added++;
            for (; k > 0 && t->tok_len[t->added[k - 1]] < n; k--) t->added[k] = t->added[k - 1];
            t->added[k] = id;
            t->added_first[(uint8_t)content[0]] = 1;
        }
        for (size_t k = 0; k < sizeof EOT_NAMES / sizeof *EOT_NAMES; k++)
            if (!strcmp(content, EOT_NAMES[k]) && (t->eot < 0 || k < (size_t)t->eot_rank)) t->eot = id, t->eot_rank = (int)k;
    }
    return 0;
}

static uint64_t pair_hash(uint64_t key) {
    key ^= key >> 33;
    key *= 0xff51afd7ed558ccdull;
    return key ^ (key >> 33);
}

static int64_t pair_find(const Tokenizer *t, uint32_t a, uint32_t b, uint32_t *merged) {
    uint64_t key = (uint64_t)a << 32 | b;
    for (uint32_t i = (uint32_t)pair_hash(key) & t->pair_mask;; i = (i + 1) & t->pair_mask) {
        if (t->pair_key[i] == EMPTY) return -1;
        if (t->pair_key[i] == key) {
            *merged = (uint32_t)t->pair_val[i];
            return (int64_t)(t->pair_val[i] >> 32);
        }
    }
}

// The id of a vocabulary string, through its bytes (the table fill_tokens built: a lookup in the
// JSON object would be a linear scan per merge).
static int64_t id_of(const Tokenizer *t, const char *s, const int16_t *char_byte) {
    uint8_t b[1024];
    if (strlen(s) >= sizeof b) return -1;
    long n = unmap_token(s, char_byte, b);
    return n > 0 ? gpt2_rank(t, b, (size_t)n) : -1;
}

// One merge, "A B" or ["A", "B"]: the ids of A, B and of their concatenation.
static int merge_ids(const Tokenizer *t, const char *path, const cJSON *m, int64_t rank, const int16_t *char_byte,
                     uint32_t ids[3]) {
    char a[1024], b[1024];
    const char *s = cJSON_GetStringValue(m), *sp = s ? strchr(s, ' ') : NULL;
    if (sp && !strchr(sp + 1, ' ') && (size_t)(sp - s) < sizeof a && strlen(sp + 1) < sizeof b) {
        snprintf(a, sizeof a, "%.*s", (int)(sp - s), s);
        snprintf(b, sizeof b, "%s", sp + 1);
    } else if (cJSON_GetArraySize(m) == 2 && cJSON_GetStringValue(cJSON_GetArrayItem(m, 0)) &&
               cJSON_GetStringValue(cJSON_GetArrayItem(m, 1))) {
        snprintf(a, sizeof a, "%s", cJSON_GetStringValue(cJSON_GetArrayItem(m, 0)));
        snprintf(b, sizeof b, "%s", cJSON_GetStringValue(cJSON_GetArrayItem(m, 1)));
    } else {
        return bs_fail("%s: merges[%lld] is not \"A B\" or [\"A\", \"B\"]", path, (long long)rank);
    }
    char ab[2048];
    snprintf(ab, sizeof ab, "%s%s", a, b);
    const char *names[3] = {a, b, ab};
    for (int k = 0; k < 3; k++) {
        int64_t id = id_of(t, names[k], char_byte);
        if (id < 0) return bs_fail("%s: merges[%lld]: \"%s\" is not in the vocabulary", path, (long long)rank, names[k]);
        ids[k] = (uint32_t)id;
    }
    return 0;
}

static int read_merges(Tokenizer *t, const char *path, const cJSON *merges) {
    int16_t char_byte[324];
    char_byte_map(char_byte);
    int64_t n = cJSON_GetArraySize(merges);
    uint32_t cap = 1;
    while (cap < 2 * n + 2) cap *= 2;
    t->pair_key = bs_malloc(cap * sizeof(uint64_t));
    t->pair_val = bs_malloc(cap * sizeof(uint64_t));
    if (!t->pair_key || !t->pair_val) return -1;
    memset(t->pair_key, 0xff, cap * sizeof(uint64_t));
    t->pair_mask = cap - 1;
    int64_t rank = 0;
    const cJSON *m;
    cJSON_ArrayForEach(m, merges) {
        uint32_t ids[3], merged;
        if (merge_ids(t, path, m, rank, char_byte, ids) != 0) return -1;
        if (pair_find(t, ids[0], ids[1], &merged) >= 0) {  // a repeated merge: the first rank stands
            rank++;
            continue;
        }
        uint64_t key = (uint64_t)ids[0] << 32 | ids[1];
        uint32_t i = (uint32_t)pair_hash(key) & t->pair_mask;
        while (t->pair_key[i] != EMPTY) i = (i + 1) & t->pair_mask;
        t->pair_key[i] = key;
        t->pair_val[i] = (uint64_t)rank << 32 | ids[2];
        rank++;
    }
    return 0;
}

static int read_tokenizer(Tokenizer *t, const char *path, const cJSON *root) {
    const cJSON *model = cJSON_GetObjectItem(root, "model"), *added = cJSON_GetObjectItem(root, "added_tokens");
    if (check_model(path, model) != 0 || read_normalizer(t, path, root) != 0) return -1;
    if (read_pretokenizer(t, path, cJSON_GetObjectItem(root, "pre_tokenizer")) != 0) return -1;
    const cJSON *vocab = cJSON_GetObjectItem(model, "vocab");
    if (read_vocab(t, path, vocab, added) != 0 || fill_tokens(t, path, vocab, added) != 0) return -1;
    t->ignore_merges = is_true(model, "ignore_merges");
    return read_merges(t, path, cJSON_GetObjectItem(model, "merges"));
}

int tokenizer_open_hf(Tokenizer **out, const char *json_path) {
    *out = NULL;
    cJSON *root;
    if (json_read_file(json_path, &root) != 0) return bs_fail_ctx("hf tokenizer");
    Tokenizer *t = bs_calloc(1, sizeof *t);
    int rc = t ? 0 : -1;
    if (rc == 0) {
        t->kind = TOKENIZER_HF;
        rc = read_tokenizer(t, json_path, root);
    }
    cJSON_Delete(root);
    if (rc != 0) {
        if (t) tokenizer_gpt2_free(t);
        free(t);
        return -1;
    }
    *out = t;
    return 0;
}

// ---- encoding --------------------------------------------------------------------------------

static void push_pair(Tokenizer *t, uint32_t pos, size_t *heap_n) {
    uint32_t merged;
    int64_t r = pair_find(t, t->pid[pos], t->pid[t->next[pos]], &merged);
    if (r >= 0) bpe_heap_push(t->heap, heap_n, (MergeEntry){(uint32_t)r, pos, t->ver[pos]});
}

static int merge_piece(Tokenizer *t, const uint8_t *piece, size_t n, Tokens *out);

static int encode_piece(Tokenizer *t, const uint8_t *piece, size_t n, Tokens *out) {
    return bpe_encode_cached(t, piece, n, out, merge_piece);
}

// One piece: its bytes' tokens, merged pair by pair in merge-list order (the leftmost on ties).
static int merge_piece(Tokenizer *t, const uint8_t *piece, size_t n, Tokens *out) {
    if (n == 0) return 0;
    if (t->ignore_merges) {
        int64_t whole = gpt2_rank(t, piece, n);
        if (whole >= 0) return tokens_push(out, (uint32_t)whole);
    }
    if (n >= UINT32_MAX / 4) return bs_fail("hf: a piece of %zu bytes is too long to merge", n);
    if (bpe_ensure_scratch(t, n) != 0) return -1;
    uint32_t *next = t->next, *prev = t->prev, *ver = t->ver, *pid = t->pid;
    for (uint32_t i = 0; i < n; i++) next[i] = i + 1, prev[i] = i == 0 ? NONE : i - 1, ver[i] = 0, pid[i] = t->byte_id[piece[i]];
    size_t heap_n = 0;
    for (uint32_t i = 0; i + 1 < n; i++) push_pair(t, i, &heap_n);
    while (heap_n > 0) {
        MergeEntry e = bpe_heap_pop(t->heap, &heap_n);
        if (ver[e.pos] != e.ver) continue;  // stale: that pair changed since it was pushed
        uint32_t pos = e.pos, right = next[pos], after = next[right], merged = 0;
        pair_find(t, pid[pos], pid[right], &merged);
        pid[pos] = merged;
        next[pos] = after;
        if (after < n) prev[after] = pos;
        ver[right]++;
        ver[pos]++;
        if (prev[pos] != NONE) {
            ver[prev[pos]]++;
            push_pair(t, prev[pos], &heap_n);
        }
        if (after < n) push_pair(t, pos, &heap_n);
    }
    for (uint32_t i = 0; i < n; i = next[i])
        if (tokens_push(out, pid[i]) != 0) return -1;
    return 0;
}

typedef struct {
    Tokenizer *t;
    Tokens *out;
} EncodeCtx;

static int encode_one(void *ctx, const uint8_t *piece, size_t len) {
    EncodeCtx *c = ctx;
    return encode_piece(c->t, piece, len, c->out);
}

// Text without added tokens: pre-tokenized (with ByteLevel's add_prefix_space: as if it began with a
// space), each piece merged.
static int encode_plain(Tokenizer *t, const uint8_t *text, size_t n, Tokens *out) {
    EncodeCtx c = {t, out};
    if (!t->prefix_space || n == 0 || text[0] == ' ') return gpt2_split(t, text, n, encode_one, &c);
    uint8_t *spaced = bs_malloc(n + 1);
    if (!spaced) return -1;
    spaced[0] = ' ';
    memcpy(spaced + 1, text, n);
    int rc = gpt2_split(t, spaced, n + 1, encode_one, &c);
    free(spaced);
    return rc;
}

// The HF library's NFC has Unicode 9.0's tables (its crate unicode-normalization-alignments), where
// utf8proc has 15.0's. To the library, the characters that later versions made part of normalization
// (combining marks, Dives Akuru's compositions) are unassigned: starters that nothing reorders,
// composes or decomposes. So the text is normalized piece by piece between them, and they are kept as
// they are. The 111 code points, from Debian's unicode-data by scripts/unicode_since9.py (which
// python/tests/test_prepare_corpora.py checks this table against, with the library's version):
static const uint32_t SINCE_9[][2] = {
    {0x7FD, 0x7FD}, {0x898, 0x89F}, {0x8CA, 0x8D3}, {0x9FE, 0x9FE}, {0xC3C, 0xC3C}, {0xD3B, 0xD3C}, {0xEBA, 0xEBA},
    {0x1715, 0x1715}, {0x1ABF, 0x1ACE}, {0x1DF6, 0x1DFA}, {0xA82C, 0xA82C}, {0x10D24, 0x10D27}, {0x10EAB, 0x10EAC},
    {0x10EFD, 0x10EFF}, {0x10F46, 0x10F50}, {0x10F82, 0x10F85}, {0x11070, 0x11070}, {0x1133B, 0x1133B},
    {0x1145E, 0x1145E}, {0x11839, 0x1183A}, {0x11930, 0x11930}, {0x11935, 0x11935}, {0x11938, 0x11938},
    {0x1193D, 0x1193E}, {0x11943, 0x11943}, {0x119E0, 0x119E0}, {0x11A34, 0x11A34}, {0x11A47, 0x11A47},
    {0x11A99, 0x11A99}, {0x11D42, 0x11D42}, {0x11D44, 0x11D45}, {0x11D97, 0x11D97}, {0x11F41, 0x11F42},
    {0x16FF0, 0x16FF1}, {0x1E08F, 0x1E08F}, {0x1E130, 0x1E136}, {0x1E2AE, 0x1E2AE}, {0x1E2EC, 0x1E2EF},
    {0x1E4EC, 0x1E4EF},
};

// Binary search: this runs on every code point of non-ASCII text (CJK lies above most ranges).
static int since_9(int32_t cp) {
    size_t lo = 0, hi = sizeof SINCE_9 / sizeof *SINCE_9;
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        if ((uint32_t)cp > SINCE_9[mid][1]) lo = mid + 1;
        else hi = mid;
    }
    return lo < sizeof SINCE_9 / sizeof *SINCE_9 && (uint32_t)cp >= SINCE_9[lo][0];
}

// Append text[0..n) to *buf (length *len), NFC-normalized when nfc is set.
static int append(uint8_t **buf, size_t *len, const uint8_t *text, size_t n, int nfc) {
    utf8proc_uint8_t *norm = NULL;
    if (nfc && n > 0) {
        utf8proc_ssize_t m = utf8proc_map(text, (utf8proc_ssize_t)n, &norm, UTF8PROC_STABLE | UTF8PROC_COMPOSE);
        if (m < 0) return bs_fail("hf: the NFC normalizer: %s", utf8proc_errmsg(m));
        text = norm, n = (size_t)m;
    }
    uint8_t *grown = realloc(*buf, *len + n + 1);
    if (!grown) {
        free(norm);
        return bs_fail("hf: out of memory normalizing %zu bytes", n);
    }
    memcpy(grown + *len, text, n);
    *buf = grown, *len += n;
    free(norm);
    return 0;
}

// The normalizer first (NFC, as the library does it: above), then the pieces. ASCII is its own NFC,
// and most of a code corpus is ASCII, so that is looked for before anything is copied.
static int encode_segment(Tokenizer *t, const uint8_t *text, size_t n, Tokens *out) {
    if (!t->nfc) return encode_plain(t, text, n, out);
    size_t i = 0;
    while (i < n && text[i] < 0x80) i++;
    if (i == n) return encode_plain(t, text, n, out);
    uint8_t *buf = NULL;
    size_t len = 0, from = 0;
    int rc = 0;
    while (rc == 0 && i < n) {
        utf8proc_int32_t cp = text[i];
        utf8proc_ssize_t k = cp < 0x80 ? 1 : utf8proc_iterate(text + i, (utf8proc_ssize_t)(n - i), &cp);
        if (k < 0) {
            rc = bs_fail("hf: the NFC normalizer needs UTF-8 text: invalid UTF-8 at byte %zu", i);
            break;
        }
        if (since_9(cp)) {  // the text before it normalized, itself as it is
            rc = append(&buf, &len, text + from, i - from, 1);
            if (rc == 0) rc = append(&buf, &len, text + i, (size_t)k, 0);
            from = i + (size_t)k;
        }
        i += (size_t)k;
    }
    if (rc == 0) rc = append(&buf, &len, text + from, n - from, 1);
    if (rc == 0) rc = encode_plain(t, buf, len, out);
    free(buf);
    return rc;
}

// The added token (not special) at text[0..n), the longest one; 0 when none is.
static size_t added_at(const Tokenizer *t, const uint8_t *text, size_t n, uint32_t *id) {
    for (uint32_t k = 0; k < t->n_added; k++) {
        uint32_t a = t->added[k], len = t->tok_len[a];
        if (len <= n && !memcmp(text, t->blob + t->tok_off[a], len)) return *id = a, len;
    }
    return 0;
}

// As the HF library: the added tokens that are not special are found in the raw text first, the
// leftmost and then the longest; the text between them is normalized, pre-tokenized and merged
// apart (no piece spans one). Special tokens' text is ordinary text (docs/tokenizers.md).
int tokenizer_hf_encode(Tokenizer *t, const uint8_t *text, size_t n, Tokens *out) {
    size_t from = 0;
    for (size_t i = 0; t->n_added && i < n; i++) {
        uint32_t id, len = t->added_first[text[i]] ? (uint32_t)added_at(t, text + i, n - i, &id) : 0;
        if (!len) continue;
        if (encode_segment(t, text + from, i - from, out) != 0 || tokens_push(out, id) != 0) return -1;
        from = i + len;
        i = from - 1;
    }
    return encode_segment(t, text + from, n - from, out);
}
