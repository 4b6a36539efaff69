// tok_bpe.c: tiktoken's byte-level BPE encodings - r50k_base (GPT-2's), cl100k_base and o200k_base:
// rank file, pre-tokenizer, merging. Hugging Face tokenizer.json files reuse the pre-tokenizer and
// the heap (tok_hf.c).
//
// Encoding is two steps. The pre-tokenizer splits text into pieces with GPT-2's regex (PCRE2, so
// Unicode letter / number / space classes are PCRE2's, not ours). Then each piece is merged on its
// own: start from single bytes and repeatedly join the adjacent pair whose concatenation has the
// lowest rank (the leftmost one on ties), until no adjacent pair is a token. The ranks are the
// merge order of training, so this replays training's merges on the piece.
#include <stdlib.h>
#include <string.h>

#include "bytescale/error.h"
#include "bytescale/fileio.h"
#include "data/tok_internal.h"

static const char GPT2_PATTERN[] =
    "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+";
// tiktoken_ext/openai_public.py's patterns, character for character
static const char CL100K_PATTERN[] = "'(?i:[sdmt]|ll|ve|re)|[^\\r\\n\\p{L}\\p{N}]?+\\p{L}++|\\p{N}{1,3}+| "
                                     "?[^\\s\\p{L}\\p{N}]++[\\r\\n]*+|\\s++$|\\s*[\\r\\n]|\\s+(?!\\S)|\\s";
static const char O200K_PATTERN[] =
    "[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]*[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?"
    "|[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]+[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?"
    "|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n/]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";

// The special tokens sit above the ranks, at the ids tiktoken gives them; the ids between are
// holes (no token: decoding one is an error).
typedef struct {
    const char *text;
    uint32_t id;
} Special;

typedef struct {
    const char *name;    // --tokenizer
    const char *tiktoken;  // tiktoken's name of the encoding, and of its rank file
    TokenizerKind kind;
    const char *pattern;
    uint32_t n_ranks;    // the rank file's tokens: a file of another size is the wrong file
    uint32_t vocab;      // tiktoken's n_vocab: the highest id + 1
    Special specials[5];
} Encoding;

static const Encoding ENCODINGS[] = {
    {"gpt2", "r50k_base", TOKENIZER_GPT2, GPT2_PATTERN, 50256, 50257, {{"<|endoftext|>", 50256}}},
    {"cl100k", "cl100k_base", TOKENIZER_CL100K, CL100K_PATTERN, 100256, 100277,
     {{"<|endoftext|>", 100257}, {"<|fim_prefix|>", 100258}, {"<|fim_middle|>", 100259}, {"<|fim_suffix|>", 100260},
      {"<|endofprompt|>", 100276}}},
    {"o200k", "o200k_base", TOKENIZER_O200K, O200K_PATTERN, 199998, 200019,
     {{"<|endoftext|>", 199999}, {"<|endofprompt|>", 200018}}},
};
enum { N_ENCODINGS = sizeof ENCODINGS / sizeof ENCODINGS[0] };

static const Encoding *encoding_named(const char *name) {
    for (int i = 0; i < N_ENCODINGS; i++)
        if (!strcmp(ENCODINGS[i].name, name)) return &ENCODINGS[i];
    return NULL;
}

const char *tiktoken_encoding_name(const char *name) {
    const Encoding *e = encoding_named(name);
    return e ? e->tiktoken : NULL;
}

#define NONE UINT32_MAX

// ---- byte string -> rank ---------------------------------------------------------------------

static uint64_t hash_bytes(const uint8_t *p, size_t n) {
    uint64_t h = 1469598103934665603ull;  // FNV-1a
    for (size_t i = 0; i < n; i++) {
        h ^= p[i];
        h *= 1099511628211ull;
    }
    return h ^ (h >> 29);  // FNV's low bits mix poorly; fold the high ones in before masking
}

int64_t gpt2_rank(const Tokenizer *t, const uint8_t *bytes, size_t n) {
    uint32_t i = (uint32_t)hash_bytes(bytes, n) & t->slot_mask;
    for (;;) {
        uint32_t s = t->slots[i];
        if (s == 0) return -1;
        uint32_t r = s - 1;
        if (t->tok_len[r] == n && memcmp(t->blob + t->tok_off[r], bytes, n) == 0) return r;
        i = (i + 1) & t->slot_mask;
    }
}

// Insert rank r (its bytes already in blob). -1 when the same bytes are there already.
int bpe_table_insert(Tokenizer *t, uint32_t r) {
    const uint8_t *b = t->blob + t->tok_off[r];
    uint32_t n = t->tok_len[r];
    uint32_t i = (uint32_t)hash_bytes(b, n) & t->slot_mask;
    while (t->slots[i] != 0) {
        uint32_t o = t->slots[i] - 1;
        if (t->tok_len[o] == n && memcmp(t->blob + t->tok_off[o], b, n) == 0) return -1;
        i = (i + 1) & t->slot_mask;
    }
    t->slots[i] = r + 1;
    return 0;
}

// ---- the rank file ---------------------------------------------------------------------------

static int b64_value(int c) {
    if (c >= 'A' && c <= 'Z') return c - 'A';
    if (c >= 'a' && c <= 'z') return c - 'a' + 26;
    if (c >= '0' && c <= '9') return c - '0' + 52;
    if (c == '+') return 62;
    if (c == '/') return 63;
    return -1;
}

// Standard base64 with '=' padding. Returns the decoded length, or -1 on a malformed string.
static long b64_decode(const char *s, size_t n, uint8_t *out) {
    if (n == 0 || n % 4 != 0) return -1;
    long len = 0;
    for (size_t i = 0; i < n; i += 4) {
        int v[4], pad = 0;
        for (int k = 0; k < 4; k++) {
            if (s[i + k] == '=' && i + 4 == n && k >= 2) {
                v[k] = 0;
                pad++;
            } else {
                if (pad) return -1;  // data after padding
                v[k] = b64_value((unsigned char)s[i + k]);
                if (v[k] < 0) return -1;
            }
        }
        uint32_t w = (uint32_t)v[0] << 18 | (uint32_t)v[1] << 12 | (uint32_t)v[2] << 6 | (uint32_t)v[3];
        out[len++] = (uint8_t)(w >> 16);
        if (pad < 2) out[len++] = (uint8_t)(w >> 8);
        if (pad < 1) out[len++] = (uint8_t)w;
    }
    return len;
}

// Parse "<base64> <rank>" lines into t (blob, tok_off, tok_len, n_ranks). data is NUL-terminated.
static int parse_ranks(Tokenizer *t, const char *path, char *data, size_t size) {
    // count lines for the arrays; the blob never exceeds the text size
    uint32_t lines = 0;
    for (size_t i = 0; i < size; i++) lines += data[i] == '\n';
    lines += 1;
    t->blob = bs_malloc(size + 1);
    t->tok_off = bs_malloc(((size_t)lines + 1) * sizeof(uint32_t));
    t->tok_len = bs_calloc((size_t)lines + 1, sizeof(uint32_t));
    uint8_t *seen = bs_calloc((size_t)lines + 1, 1);
    if (!t->blob || !t->tok_off || !t->tok_len || !seen) {
        free(seen);
        return -1;
    }
    uint32_t n = 0, blob_used = 0;
    int line_no = 0;
    char *p = data, *end = data + size;
    while (p < end) {
        line_no++;
        char *eol = memchr(p, '\n', (size_t)(end - p));
        if (!eol) eol = end;
        char *line = p;
        size_t len = (size_t)(eol - p);
        p = eol + 1;
        if (len > 0 && line[len - 1] == '\r') len--;
        if (len == 0) continue;
        char *sp = memchr(line, ' ', len);
        if (!sp) {
            free(seen);
            return bs_fail("%s:%d: expected '<base64 bytes> <rank>'", path, line_no);
        }
        long nb = b64_decode(line, (size_t)(sp - line), t->blob + blob_used);
        char *rank_end;
        long rank = strtol(sp + 1, &rank_end, 10);
        if (nb <= 0 || rank_end != line + len || rank_end == sp + 1 || rank < 0 || rank >= (long)lines) {
            free(seen);
            return bs_fail("%s:%d: expected '<base64 bytes> <rank>' with a rank in [0, %u)", path, line_no, lines);
        }
        if (seen[rank]) {
            free(seen);
            return bs_fail("%s:%d: rank %ld appears twice", path, line_no, rank);
        }
        seen[rank] = 1;
        t->tok_off[rank] = blob_used;
        t->tok_len[rank] = (uint32_t)nb;
        blob_used += (uint32_t)nb;
        n++;
    }
    for (uint32_t r = 0; r < n; r++) {
        if (!seen[r]) {
            free(seen);
            return bs_fail("%s: rank %u is missing (%u ranks must be 0..%u)", path, r, n, n - 1);
        }
    }
    free(seen);
    if (n < 256) return bs_fail("%s: %u ranks; a byte-level BPE needs at least the 256 single bytes", path, n);
    t->n_ranks = n;
    t->blob_used = blob_used;
    return 0;
}

// The ids above the ranks: the encoding's special tokens at their ids, holes between them.
static int add_specials(Tokenizer *t, const Encoding *e, const char *path) {
    if (t->n_ranks != e->n_ranks)
        return bs_fail("%s: %u ranks, but %s has %u: the rank file of another encoding? (%s wants %s.tiktoken)", path,
                       t->n_ranks, e->tiktoken, e->n_ranks, e->name, e->tiktoken);
    size_t text = 0;
    for (int i = 0; i < 5 && e->specials[i].text; i++) text += strlen(e->specials[i].text);
    uint8_t *blob = bs_realloc(t->blob, t->blob_used + text + 1);
    uint32_t *off = blob ? bs_realloc(t->tok_off, (size_t)e->vocab * sizeof *off) : NULL;
    uint32_t *len = off ? bs_realloc(t->tok_len, (size_t)e->vocab * sizeof *len) : NULL;
    if (blob) t->blob = blob;
    if (off) t->tok_off = off;
    if (len) t->tok_len = len;
    if (!len) return -1;
    for (uint32_t id = t->n_ranks; id < e->vocab; id++) off[id] = 0, len[id] = 0;  // holes
    for (int i = 0; i < 5 && e->specials[i].text; i++) {
        size_t n = strlen(e->specials[i].text);
        memcpy(blob + t->blob_used, e->specials[i].text, n);
        off[e->specials[i].id] = t->blob_used;
        len[e->specials[i].id] = (uint32_t)n;
        t->blob_used += (uint32_t)n;
    }
    t->vocab = e->vocab;
    t->eot = e->specials[0].id;  // <|endoftext|>, first in every table
    return 0;
}

static int build_table(Tokenizer *t, const char *path) {
    uint32_t n_slots = 1;
    while (n_slots < 2 * t->n_ranks) n_slots *= 2;
    t->slots = bs_calloc(n_slots, sizeof(uint32_t));
    if (!t->slots) return -1;
    t->slot_mask = n_slots - 1;
    for (uint32_t r = 0; r < t->n_ranks; r++)
        if (bpe_table_insert(t, r) != 0) return bs_fail("%s: rank %u repeats the bytes of another rank", path, r);
    // every single byte must be a token, or some byte strings could not be encoded
    for (int b = 0; b < 256; b++) {
        uint8_t c = (uint8_t)b;
        if (gpt2_rank(t, &c, 1) < 0) return bs_fail("%s: byte 0x%02x is not a token; not a byte-level BPE", path, b);
    }
    return 0;
}

int bpe_compile_pattern(Tokenizer *t, const char *pattern, uint32_t extra_flags, const char *what) {
    int err;
    PCRE2_SIZE err_at;
    // MATCH_INVALID_UTF: invalid UTF-8 is allowed in the subject and simply never matches, so the
    // bytes between matches (see gpt2_split) still reach the merger and round-trip.
    t->re = pcre2_compile((PCRE2_SPTR)pattern, PCRE2_ZERO_TERMINATED,
                          PCRE2_UTF | PCRE2_UCP | PCRE2_MATCH_INVALID_UTF | extra_flags, &err, &err_at, NULL);
    if (!t->re) {
        PCRE2_UCHAR msg[256];
        pcre2_get_error_message(err, msg, sizeof msg);
        return bs_fail("%s pre-tokenizer regex: %s at offset %zu", what, (char *)msg, (size_t)err_at);
    }
    pcre2_jit_compile(t->re, PCRE2_JIT_COMPLETE);  // much faster; the interpreter still works without it
    t->md = pcre2_match_data_create_from_pattern(t->re, NULL);
    if (!t->md) return bs_fail("%s pre-tokenizer: out of memory for match data", what);
    return 0;
}

int tokenizer_open_tiktoken(Tokenizer **out, const char *name, const char *ranks_path) {
    *out = NULL;
    const Encoding *e = encoding_named(name);
    if (!e) return bs_fail("'%s' is not a tiktoken encoding (gpt2, cl100k or o200k)", name);
    if (!ranks_path) return bs_fail("%s tokenizer: no rank file given", name);
    char *data;
    size_t size;
    if (file_read_all(ranks_path, &data, &size) != 0) return bs_fail_ctx("%s tokenizer ranks", name);
    if (size >= UINT32_MAX / 2) {
        free(data);
        return bs_fail("%s: rank file too large (%zu bytes)", ranks_path, size);
    }
    Tokenizer *t = bs_calloc(1, sizeof *t);
    if (!t) {
        free(data);
        return -1;
    }
    t->kind = e->kind;
    int rc = parse_ranks(t, ranks_path, data, size);
    free(data);
    if (rc == 0) rc = add_specials(t, e, ranks_path);
    if (rc == 0) rc = build_table(t, ranks_path);
    // $ in tiktoken's patterns (Rust regex) is the end of the text only, never before a final newline
    if (rc == 0) rc = bpe_compile_pattern(t, e->pattern, PCRE2_DOLLAR_ENDONLY, name);
    if (rc != 0) {
        tokenizer_gpt2_free(t);  // not tokenizer_free: that is tokenizer.c's, which calls this file
        free(t);
        return -1;
    }
    *out = t;
    return 0;
}

int tokenizer_open_gpt2(Tokenizer **out, const char *ranks_path) { return tokenizer_open_tiktoken(out, "gpt2", ranks_path); }

void tokenizer_gpt2_free(Tokenizer *t) {
    free(t->blob);
    free(t->tok_off);
    free(t->tok_len);
    free(t->slots);
    free(t->next);
    free(t->prev);
    free(t->ver);
    free(t->heap);
    free(t->pid);
    free(t->pair_key);
    free(t->pair_val);
    free(t->cache);
    free(t->added);
    if (t->md) pcre2_match_data_free(t->md);
    if (t->re) pcre2_code_free(t->re);
}

// ---- pre-tokenizer ---------------------------------------------------------------------------

int gpt2_split(Tokenizer *t, const uint8_t *text, size_t n, int (*fn)(void *ctx, const uint8_t *piece, size_t len),
               void *ctx) {
    size_t at = 0;
    while (at < n) {
        int rc = pcre2_match(t->re, text, n, at, 0, t->md, NULL);
        if (rc == PCRE2_ERROR_NOMATCH) return fn(ctx, text + at, n - at);  // only invalid UTF-8 left
        if (rc < 0) {
            PCRE2_UCHAR msg[256];
            pcre2_get_error_message(rc, msg, sizeof msg);
            return bs_fail("gpt2 pre-tokenizer: match failed at byte %zu: %s", at, (char *)msg);
        }
        PCRE2_SIZE *ov = pcre2_get_ovector_pointer(t->md);
        size_t s = ov[0], e = ov[1];
        if (e <= s) return bs_fail("gpt2 pre-tokenizer: empty match at byte %zu", s);  // the pattern cannot do this
        // bytes no alternative could start a match at: invalid UTF-8. They form a piece of their own.
        if (s > at && fn(ctx, text + at, s - at) != 0) return -1;
        if (fn(ctx, text + s, e - s) != 0) return -1;
        at = e;
    }
    return 0;
}

// ---- merging ---------------------------------------------------------------------------------

static int entry_less(MergeEntry a, MergeEntry b) { return a.rank < b.rank || (a.rank == b.rank && a.pos < b.pos); }

void bpe_heap_push(MergeEntry *h, size_t *n, MergeEntry e) {
    size_t i = (*n)++;
    while (i > 0) {
        size_t parent = (i - 1) / 2;
        if (!entry_less(e, h[parent])) break;
        h[i] = h[parent];
        i = parent;
    }
    h[i] = e;
}

MergeEntry bpe_heap_pop(MergeEntry *h, size_t *n) {
    MergeEntry top = h[0], last = h[--*n];
    size_t i = 0;
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= *n) break;
        if (c + 1 < *n && entry_less(h[c + 1], h[c])) c++;
        if (!entry_less(h[c], last)) break;
        h[i] = h[c];
        i = c;
    }
    h[i] = last;
    return top;
}

int bpe_ensure_scratch(Tokenizer *t, size_t n) {
    if (n <= t->scratch_cap) return 0;
    size_t cap = t->scratch_cap ? t->scratch_cap : 256;
    while (cap < n) cap *= 2;
    free(t->next);
    free(t->prev);
    free(t->ver);
    free(t->heap);
    free(t->pid);
    t->pid = bs_malloc(cap * sizeof(uint32_t));
    t->next = bs_malloc(cap * sizeof(uint32_t));
    t->prev = bs_malloc(cap * sizeof(uint32_t));
    t->ver = bs_malloc(cap * sizeof(uint32_t));
    t->heap = bs_malloc(3 * cap * sizeof(MergeEntry));
    t->scratch_cap = (t->pid && t->next && t->prev && t->ver && t->heap) ? cap : 0;
    return t->scratch_cap ? 0 : -1;
}

// Push the pair starting at part `pos` (its right neighbour must exist) if it is a token.
static void push_pair(Tokenizer *t, const uint8_t *piece, uint32_t pos, size_t *heap_n) {
    uint32_t end = t->next[t->next[pos]];
    int64_t r = gpt2_rank(t, piece + pos, end - pos);
    if (r >= 0) bpe_heap_push(t->heap, heap_n, (MergeEntry){(uint32_t)r, pos, t->ver[pos]});
}

int gpt2_encode_piece(Tokenizer *t, const uint8_t *piece, size_t n, Tokens *out) {
    if (n == 0) return 0;
    int64_t whole = gpt2_rank(t, piece, n);
    if (whole >= 0) return tokens_push(out, (uint32_t)whole);  // the common case: a known word
    if (n >= UINT32_MAX / 4) return bs_fail("gpt2: a piece of %zu bytes is too long to merge", n);
    if (bpe_ensure_scratch(t, n) != 0) return -1;
    uint32_t *next = t->next, *prev = t->prev, *ver = t->ver;
    // parts start as single bytes; part i covers [i, next[i])
    for (uint32_t i = 0; i < n; i++) {
        next[i] = i + 1;
        prev[i] = i == 0 ? NONE : i - 1;
        ver[i] = 0;
    }
    size_t heap_n = 0;
    for (uint32_t i = 0; i + 1 < n; i++) push_pair(t, piece, i, &heap_n);
    while (heap_n > 0) {
        MergeEntry e = bpe_heap_pop(t->heap, &heap_n);
        if (ver[e.pos] != e.ver) continue;  // stale: that pair changed since it was pushed
        uint32_t pos = e.pos, right = next[pos], after = next[right];
        // join `right` into `pos`
        next[pos] = after;
        if (after < n) prev[after] = pos;
        ver[right]++;  // right is no longer a part: its entries die
        ver[pos]++;
        if (prev[pos] != NONE) {
            ver[prev[pos]]++;
            push_pair(t, piece, prev[pos], &heap_n);
        }
        if (after < n) push_pair(t, piece, pos, &heap_n);
    }
    for (uint32_t i = 0; i < n; i = next[i]) {
        int64_t r = gpt2_rank(t, piece + i, next[i] - i);  // a token: merges only ever make tokens
        if (tokens_push(out, (uint32_t)r) != 0) return -1;
    }
    return 0;
}

// Pieces repeat (a corpus has far fewer distinct words than words), and each that is not a token
// whole (and, for tok_hf.c, each at all unless ignore_merges) costs a merge. So short pieces' ids are
// kept in a direct-mapped cache, as the HF library keeps its own: a hit is a hash and a compare.
enum { CACHE_SLOTS = 1 << 14, CACHE_BYTES = 24, CACHE_IDS = 12 };

struct PieceCache {
    uint8_t len, n_ids;  // len 0: empty
    uint8_t bytes[CACHE_BYTES];
    uint32_t ids[CACHE_IDS];
};



int bpe_encode_cached(Tokenizer *t, const uint8_t *piece, size_t n, Tokens *out,
                      int (*merge)(Tokenizer *t, const uint8_t *piece, size_t n, Tokens *out)) {
    if (n == 0 || n > CACHE_BYTES) return merge(t, piece, n, out);
    if (!t->cache && !(t->cache = bs_calloc(CACHE_SLOTS, sizeof *t->cache))) return -1;
    PieceCache *c = &t->cache[(uint32_t)hash_bytes(piece, n) & (CACHE_SLOTS - 1)];
    if (c->len == n && memcmp(c->bytes, piece, n) == 0) {
        if (tokens_reserve(out, c->n_ids) != 0) return -1;
        memcpy(out->ids + out->n, c->ids, c->n_ids * sizeof *c->ids);
        out->n += c->n_ids;
        return 0;
    }
    int64_t before = out->n;
    if (merge(t, piece, n, out) != 0) return -1;
    if (out->n - before <= CACHE_IDS) {
        c->len = (uint8_t)n, c->n_ids = (uint8_t)(out->n - before);
        memcpy(c->bytes, piece, n);
        memcpy(c->ids, out->ids + before, c->n_ids * sizeof *c->ids);
    }
    return 0;
}

typedef struct {
    Tokenizer *t;
    Tokens *out;
} EncodeCtx;

static int encode_one(void *ctx, const uint8_t *piece, size_t len) {
    EncodeCtx *c = ctx;
    return bpe_encode_cached(c->t, piece, len, c->out, gpt2_encode_piece);
}

int tokenizer_gpt2_encode(Tokenizer *t, const uint8_t *text, size_t n, Tokens *out) {
    EncodeCtx c = {t, out};
    return gpt2_split(t, text, n, encode_one, &c);
}
