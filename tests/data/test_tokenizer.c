// test_tokenizer.c: tiktoken's encodings (r50k_base = gpt2, cl100k_base, o200k_base) against
// tiktoken's own ids (pip), the merge against a naive reference, byte-level round trips (invalid UTF-8 included), rank-file errors.
#include "test_util.h"

#include <cJSON.h>

#include "bytescale/error.h"
#include "bytescale/fileio.h"
#include "bytescale/rng.h"
#include "bytescale/tokenizer.h"

#if defined(__SANITIZE_ADDRESS__)
#define SANITIZER_BUILD 1
#else
#define SANITIZER_BUILD 0
#endif

static char data_dir[4096];

// The tokenizer data from `make tokenizer`; without it the GPT-2 cases skip, saying so (test_util.h).
static const char *tokenizer_file(const char *name) {
    TEST_TOKENIZER_OR_SKIP(name);
    snprintf(data_dir, sizeof data_dir, "%s", test_tokenizer_path(name));
    return data_dir;
}

static Tokenizer *open_gpt2(void) {
    Tokenizer *t;
    if (tokenizer_open_gpt2(&t, tokenizer_file("r50k_base.tiktoken")) != 0) fail_msg("%s", bs_errmsg());
    return t;
}

// ---- tiktoken's encodings ----------------------------------------------------------------------

// A line's "ids" array (a JSON array of integers) into *ids, and blanked out of the line (the
// array becomes 0 and spaces), so that cJSON parses only the rest: a cJSON node for each of the
// millions of reference ids was half this test's time. The key can only be the member's: inside a
// JSON string every quote is escaped. Returns how many ids, or -1 when the line has no such array.
static int64_t take_ids(char *line, uint32_t **ids) {
    char *at = strstr(line, "\"ids\": [");
    if (!at) return -1;
    char *open = at + 7, *p = open + 1;
    int64_t n = 0, cap = 0;
    *ids = NULL;
    for (;;) {
        while (*p == ' ' || *p == ',') p++;
        if (*p == ']') break;
        char *end;
        unsigned long v = strtoul(p, &end, 10);
        if (end == p) fail_msg("the ids array holds something else than integers: %.40s", p);
        if (n == cap) *ids = realloc(*ids, (size_t)(cap = cap ? 2 * cap : 256) * sizeof **ids);
        assert_non_null(*ids);
        (*ids)[n++] = (uint32_t)v;
        p = end;
    }
    memset(open, ' ', (size_t)(p - open + 1));
    *open = '0';
    return n;
}

// vectors-<encoding>.jsonl (scripts/tiktoken_vectors.py, run by `make tokenizer`): one document a
// line, {"name", "text", "ids"}, the ids from tiktoken (pip) given the same rank file. Every document
// is encoded here and must give tiktoken's ids exactly, then decode back to its text.
// prefix_space: the tokenizer encodes a text not starting with ' ' as if it did (ByteLevel's
// add_prefix_space), so it decodes back with that space in front.
static void compare_vectors(Tokenizer *t, const char *encoding, const char *vectors, const char *reference,
                            int prefix_space) {
    char *text;
    size_t size;
    if (file_read_all(tokenizer_file(vectors), &text, &size) != 0) fail_msg("%s", bs_errmsg());
    int64_t docs = 0, tokens = 0, multilingual = 0, debian = 0;
    char *line = text;
    int64_t go_docs = 0, skipped = 0;
    while (line < text + size) {
        char *eol = memchr(line, '\n', (size_t)(text + size - line));
        if (!eol) eol = text + size;
        *eol = '\0';
        // under the sanitizers (ten times slower) an eighth of the Go files, every other document
        static const char CASE[] = "{\"name\": \"case ", MULTI[] = "{\"name\": \"multilingual ";
        if (SANITIZER_BUILD && strncmp(line, CASE, sizeof CASE - 1) != 0 && strncmp(line, MULTI, sizeof MULTI - 1) != 0 &&
            go_docs++ % 8 != 0) {
            skipped++, docs++;
            line = eol + 1;
            continue;
        }
        uint32_t *want_ids = NULL;
        int64_t n_want = take_ids(line, &want_ids), first_diff = -1;
        if (n_want < 0) fail_msg("%s: line %lld has no \"ids\" array", vectors, (long long)docs + 1);
        cJSON *doc = cJSON_Parse(line);
        if (!doc) fail_msg("%s: line %lld is not JSON", vectors, (long long)docs + 1);
        const char *dname = cJSON_GetStringValue(cJSON_GetObjectItem(doc, "name"));
        const char *sample = cJSON_GetStringValue(cJSON_GetObjectItem(doc, "text"));
        // a tokenizer with a normalizer decodes to the reference library's normalized text
        const char *normalized = cJSON_GetStringValue(cJSON_GetObjectItem(doc, "normalized"));
        assert_non_null(dname);
        assert_non_null(sample);
        size_t len = strlen(sample);
        Tokens got = {0};
        assert_int_equal(tokenizer_encode(t, sample, len, &got), 0);
        for (int64_t i = 0; i < n_want && first_diff < 0; i++)
            if (i >= got.n || got.ids[i] != want_ids[i]) first_diff = i;
        if (first_diff < 0 && got.n != n_want) first_diff = n_want;
        free(want_ids);
        if (first_diff >= 0)
            fail_msg("%s: %s: %lld tokens, %s %lld; first difference at token %lld", encoding, dname,
                     (long long)got.n, reference, (long long)n_want, (long long)first_diff);
        uint8_t *back;
        size_t back_n;
        assert_int_equal(tokenizer_decode(t, got.ids, got.n, &back, &back_n), 0);
        const char *want = normalized ? normalized : sample;
        size_t skip = prefix_space && len > 0 && sample[0] != ' ', want_n = strlen(want);
        assert_int_equal(back_n, want_n + skip);
        if (skip) assert_int_equal(back[0], ' ');
        assert_memory_equal(back + skip, want, want_n);
        free(back);
        tokens += got.n;
        multilingual += !strncmp(dname, "multilingual", 12);
        debian += !strncmp(dname, "multilingual python-cjk", 23) || !strncmp(dname, "multilingual emoji-test", 23) ||
                  !strncmp(dname, "multilingual normalization-test", 31);
        docs++;
        tokens_free(&got);
        cJSON_Delete(doc);
        line = eol + 1;
    }
    free(text);
    print_message("%s: %lld documents (%lld multilingual), %lld tokens, equal to %s's%s\n", encoding,
                  (long long)(docs - skipped), (long long)multilingual, (long long)tokens, reference,
                  skipped ? " (a sanitizer build: an eighth of the Go files)" : "");
    // the file holds the hand-written cases, the multilingual samples (Debian's among them) and a
    // tenth of the Go corpus: fewer means it was cut short
    assert_true(docs >= 600 && multilingual >= 60 && debian >= 50 && tokens >= (skipped ? 200000 : 1000000));
}

static void check_vectors(const char *name, const char *encoding, uint32_t vocab, int64_t eot) {
    char ranks[128], vectors[128];
    snprintf(ranks, sizeof ranks, "%s.tiktoken", encoding);
    snprintf(vectors, sizeof vectors, "vectors-%s.jsonl", encoding);
    Tokenizer *t;
    if (tokenizer_open_tiktoken(&t, name, tokenizer_file(ranks)) != 0) fail_msg("%s", bs_errmsg());
    assert_int_equal(tokenizer_vocab_size(t), vocab);
    assert_int_equal(tokenizer_eot(t), eot);
    compare_vectors(t, encoding, vectors, "tiktoken", 0);
    tokenizer_free(t);
}

// hf-<name>.json and vectors-hf-<name>.jsonl (scripts/hf_tokenizers.py, run by `make tokenizer`):
// tokenizer.json files written offline and the Hugging Face tokenizers library's ids for the same
// documents.
static void check_hf(const char *name, uint32_t vocab, int64_t eot) {
    char json[128], vectors[128], spec[4200];
    snprintf(json, sizeof json, "hf-%s.json", name);
    snprintf(vectors, sizeof vectors, "vectors-hf-%s.jsonl", name);
    snprintf(spec, sizeof spec, "hf:%s", tokenizer_file(json));
    Tokenizer *t;
    if (tokenizer_open(&t, spec, NULL) != 0) fail_msg("%s", bs_errmsg());
    if (vocab) assert_int_equal(tokenizer_vocab_size(t), vocab);
    assert_int_equal(tokenizer_eot(t), eot);
    compare_vectors(t, json, vectors, "HF tokenizers", !strcmp(name, "trained"));
    tokenizer_free(t);
}

static void test_hf_gpt2_matches_hf_tokenizers(void **state) {
    (void)state;
    check_hf("gpt2", 50257, 50256);
}

static void test_hf_llama3_matches_hf_tokenizers(void **state) {
    (void)state;
    check_hf("llama3", 100258, 100257);
}

static void test_hf_o200k_matches_hf_tokenizers(void **state) {
    (void)state;
    check_hf("o200k", 200000, 199999);
}

// Qwen2's shape: the NFC normalizer (the multilingual sample's decomposed letters and combining marks)
// and added tokens that are not special, matched in text (the cases that hold them)
static void test_hf_qwen2_matches_hf_tokenizers(void **state) {
    (void)state;
    check_hf("qwen2", 100267, 100256);
    // NFC needs Unicode text: bytes that are not UTF-8 are an error naming where, never ids (the
    // other tokenizers take any bytes); ASCII around them is no excuse
    char spec[4200];
    snprintf(spec, sizeof spec, "hf:%s", tokenizer_file("hf-qwen2.json"));
    Tokenizer *t;
    if (tokenizer_open(&t, spec, NULL) != 0) fail_msg("%s", bs_errmsg());
    Tokens got = {0};
    static const char bad[] = "caf\xc3\xa9 ok \xff<tool_call>";
    assert_int_equal(tokenizer_encode(t, bad, sizeof bad - 1, &got), -1);
    if (!strstr(bs_errmsg(), "needs UTF-8 text: invalid UTF-8 at byte 9")) fail_msg("unclear message: %s", bs_errmsg());
    tokens_free(&got);
    tokenizer_free(t);
}

static void test_hf_trained_matches_hf_tokenizers(void **state) {
    (void)state;
    check_hf("trained", 2000, 0);
}

static void test_gpt2_matches_tiktoken(void **state) {
    (void)state;
    check_vectors("gpt2", "r50k_base", 50257, 50256);
}

static void test_cl100k_matches_tiktoken(void **state) {
    (void)state;
    check_vectors("cl100k", "cl100k_base", 100277, 100257);
}

static void test_o200k_matches_tiktoken(void **state) {
    (void)state;
    check_vectors("o200k", "o200k_base", 200019, 199999);
}

// The ids between the ranks and the special tokens are no tokens; a rank file of the wrong size for
// the encoding is refused, naming both counts.
static void test_tiktoken_holes_and_wrong_file(void **state) {
    (void)state;
    Tokenizer *t;
    if (tokenizer_open(&t, "cl100k", tokenizer_file("cl100k_base.tiktoken")) != 0) fail_msg("%s", bs_errmsg());
    size_t len;
    assert_null(tokenizer_token_bytes(t, 100256, &len));
    const uint8_t *b = tokenizer_token_bytes(t, 100276, &len);
    assert_non_null(b);
    assert_int_equal(len, strlen("<|endofprompt|>"));
    uint32_t hole = 100270;
    uint8_t *out;
    assert_int_equal(tokenizer_decode(t, &hole, 1, &out, &len), -1);
    assert_non_null(strstr(bs_errmsg(), "no token has that id"));
    assert_string_equal(tokenizer_name(t), "cl100k");
    tokenizer_free(t);
    assert_int_equal(tokenizer_open(&t, "o200k", tokenizer_file("r50k_base.tiktoken")), -1);
    assert_non_null(strstr(bs_errmsg(), "50256 ranks, but o200k_base has 199998"));
}

// ---- the merge against a naive reference ---------------------------------------------------

// Naive BPE: parts as (start, len); repeatedly merge the leftmost adjacent pair of lowest rank.
static int64_t naive_bpe(const Tokenizer *t, const uint8_t *p, size_t n, uint32_t *out) {
    size_t *start = malloc(n * sizeof *start), *len = malloc(n * sizeof *len);
    size_t k = n;
    for (size_t i = 0; i < n; i++) start[i] = i, len[i] = 1;
    for (;;) {
        int64_t best = -1;
        size_t at = 0;
        for (size_t i = 0; i + 1 < k; i++) {
            int64_t r = gpt2_rank(t, p + start[i], len[i] + len[i + 1]);
            if (r >= 0 && (best < 0 || r < best)) best = r, at = i;
        }
        if (best < 0) break;
        len[at] += len[at + 1];
        memmove(start + at + 1, start + at + 2, (k - at - 2) * sizeof *start);
        memmove(len + at + 1, len + at + 2, (k - at - 2) * sizeof *len);
        k--;
    }
    for (size_t i = 0; i < k; i++) out[i] = (uint32_t)gpt2_rank(t, p + start[i], len[i]);
    free(start);
    free(len);
    return (int64_t)k;
}

static void check_piece(Tokenizer *t, const uint8_t *p, size_t n) {
    uint32_t *want = malloc((n + 1) * sizeof *want);
    int64_t n_want = naive_bpe(t, p, n, want);
    Tokens got = {0};
    assert_int_equal(gpt2_encode_piece(t, p, n, &got), 0);
    assert_int_equal(got.n, n_want);
    assert_memory_equal(got.ids, want, (size_t)n_want * sizeof *want);
    tokens_free(&got);
    free(want);
}

static void test_gpt2_merge_matches_naive_reference(void **state) {
    (void)state;
    Tokenizer *t = open_gpt2();
    Rng rng;
    rng_seed(&rng, 7);
    uint8_t buf[600];
    const char *alpha[] = {"abcdefghijklmnopqrstuvwxyz", "etaoinshr", "ab", " \t\n", "0123456789"};
    for (int iter = 0; iter < 3000; iter++) {
        size_t n = 1 + rng_below(&rng, iter < 2900 ? 40 : 600);
        int mode = (int)rng_below(&rng, 6);
        for (size_t i = 0; i < n; i++) {
            if (mode == 5) buf[i] = (uint8_t)rng_below(&rng, 256);  // arbitrary bytes
            else buf[i] = (uint8_t)alpha[mode][rng_below(&rng, strlen(alpha[mode]))];
        }
        if (mode != 3 && rng_below(&rng, 2)) buf[0] = ' ';  // pieces often start with a space
        check_piece(t, buf, n);
    }
    // repeated pairs: ties between equal ranks must go to the leftmost pair
    memset(buf, 'a', 301);
    check_piece(t, buf, 301);
    tokenizer_free(t);
}

// ---- round trips ----------------------------------------------------------------------------

static void roundtrip(Tokenizer *t, const uint8_t *x, size_t n) {
    Tokens ids = {0};
    assert_int_equal(tokenizer_encode(t, x, n, &ids), 0);
    for (int64_t i = 0; i < ids.n; i++) assert_true(ids.ids[i] < tokenizer_vocab_size(t));
    uint8_t *back;
    size_t back_n;
    assert_int_equal(tokenizer_decode(t, ids.ids, ids.n, &back, &back_n), 0);
    assert_int_equal(back_n, n);
    if (n) assert_memory_equal(back, x, n);
    free(back);
    tokens_free(&ids);
}

static void test_gpt2_roundtrip_any_bytes(void **state) {
    (void)state;
    Tokenizer *t = open_gpt2();
    Rng rng;
    rng_seed(&rng, 11);
    // fragments: ASCII words, whitespace runs, contractions, multi-byte UTF-8, and invalid UTF-8
    // (lone continuation bytes, truncated sequences, overlongs, surrogates, 0xff)
    const char *frags[] = {"hello", " world", "  ", "\t\t", "\n\n", "'s", "'ll", "123", " 45", "!!", "é", "世界",
                           "🌍", "\x80", "\xff", "\xc3", "\xe4\xb8", "\xc0\xaf", "\xed\xa0\x80", "\xf4\x90\x80\x80", "\0",
                           " \xff", "a\xfe" "b", "\r\n"};
    int n_frags = sizeof frags / sizeof frags[0];
    uint8_t buf[4096];
    for (int iter = 0; iter < 2000; iter++) {
        size_t n = 0;
        int mode = iter % 2;
        size_t target = 1 + rng_below(&rng, 300);
        while (n < target) {
            if (mode == 0) {
                buf[n++] = (uint8_t)rng_below(&rng, 256);  // uniformly random bytes
            } else {
                const char *f = frags[rng_below(&rng, (uint64_t)n_frags)];
                size_t len = f[0] ? strlen(f) : 1;  // "\0" is one NUL byte
                memcpy(buf + n, f, len);
                n += len;
            }
        }
        roundtrip(t, buf, n);
    }
    roundtrip(t, (const uint8_t *)"", 0);
    tokenizer_free(t);
}

typedef struct {
    char pieces[16][32];
    int n;
} Pieces;

static int collect(void *ctx, const uint8_t *piece, size_t len) {
    Pieces *p = ctx;
    assert_true(p->n < 16 && len < 32);
    memcpy(p->pieces[p->n], piece, len);
    p->pieces[p->n][len] = '\0';
    p->n++;
    return 0;
}

static void test_gpt2_split_follows_the_regex(void **state) {
    (void)state;
    Tokenizer *t = open_gpt2();
    // each expectation follows from the pattern's alternatives, tried left to right:
    // a space joins the following word; of a run of spaces before a word, all but the last form
    // a piece (\s+(?!\S)); contractions split off; invalid bytes match nothing and stand alone.
    struct {
        const char *text;
        const char *want[8];
    } cases[] = {
        {"a  b", {"a", " ", " b"}},
        {"I'll go", {"I", "'ll", " go"}},
        {"x = 42;\n", {"x", " =", " 42", ";", "\n"}},
        {"x\xffy", {"x", "\xff", "y"}},
        {"end  ", {"end", "  "}},
        {"\xe4\xb8\x96\xe7\x95\x8c!", {"\xe4\xb8\x96\xe7\x95\x8c", "!"}},
    };
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        Pieces p = {.n = 0};
        assert_int_equal(gpt2_split(t, (const uint8_t *)cases[c].text, strlen(cases[c].text), collect, &p), 0);
        int n_want = 0;
        while (n_want < 8 && cases[c].want[n_want]) n_want++;
        assert_int_equal(p.n, n_want);
        for (int i = 0; i < n_want; i++) assert_string_equal(p.pieces[i], cases[c].want[i]);
    }
    tokenizer_free(t);
}

static void test_byte_tokenizer_is_identity(void **state) {
    (void)state;
    Tokenizer *t;
    assert_int_equal(tokenizer_open(&t, "byte", NULL), 0);
    assert_int_equal(tokenizer_vocab_size(t), 256);
    assert_int_equal(tokenizer_eot(t), -1);
    uint8_t all[256];
    for (int i = 0; i < 256; i++) all[i] = (uint8_t)(255 - i);
    Tokens ids = {0};
    assert_int_equal(tokenizer_encode(t, all, 256, &ids), 0);
    assert_int_equal(ids.n, 256);
    for (int i = 0; i < 256; i++) assert_int_equal(ids.ids[i], all[i]);
    tokens_free(&ids);
    roundtrip(t, all, 256);
    uint32_t bad = 256;
    uint8_t *out;
    size_t n;
    assert_int_equal(tokenizer_decode(t, &bad, 1, &out, &n), -1);
    assert_non_null(strstr(bs_errmsg(), "out of range"));
    tokenizer_free(t);
    assert_int_equal(tokenizer_open(&t, "unigram", NULL), -1);
    assert_non_null(strstr(bs_errmsg(), "unknown tokenizer 'unigram'"));
    assert_non_null(strstr(bs_errmsg(), "cl100k, o200k or hf:PATH"));
    tokenizer_free(NULL);
}

static void expect_rank_file_error(const char *dir, const char *name, const char *content, const char *msg) {
    char path[700];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    assert_int_equal(file_write_atomic(path, content, strlen(content)), 0);
    Tokenizer *t;
    assert_int_equal(tokenizer_open_gpt2(&t, path), -1);
    assert_null(t);
    if (!strstr(bs_errmsg(), msg)) fail_msg("expected '%s' in: %s", msg, bs_errmsg());
    assert_non_null(strstr(bs_errmsg(), name));
}

static void test_rank_file_errors(void **state) {
    (void)state;
    const char *dir = test_tmpdir("data_ranks");
    expect_rank_file_error(dir, "noseparator.tiktoken", "IQ==0\n", "noseparator.tiktoken:1: expected");
    expect_rank_file_error(dir, "badb64.tiktoken", "IQ== 0\nI*== 1\n", "badb64.tiktoken:2: expected");
    expect_rank_file_error(dir, "dup.tiktoken", "IQ== 0\nIg== 0\n", "rank 0 appears twice");
    expect_rank_file_error(dir, "gap.tiktoken", "IQ== 0\nIg== 2\n\n\n", "rank 1 is missing");
    // a valid file but without all 256 bytes cannot encode everything
    expect_rank_file_error(dir, "small.tiktoken", "IQ== 0\nIg== 1\n", "256 single bytes");
    Tokenizer *t;
    assert_int_equal(tokenizer_open_gpt2(&t, "/nonexistent/r50k.tiktoken"), -1);
    assert_non_null(strstr(bs_errmsg(), "/nonexistent/r50k.tiktoken"));
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_gpt2_matches_tiktoken),
        cmocka_unit_test(test_cl100k_matches_tiktoken),
        cmocka_unit_test(test_o200k_matches_tiktoken),
        cmocka_unit_test(test_tiktoken_holes_and_wrong_file),
        cmocka_unit_test(test_hf_gpt2_matches_hf_tokenizers),
        cmocka_unit_test(test_hf_llama3_matches_hf_tokenizers),
        cmocka_unit_test(test_hf_o200k_matches_hf_tokenizers),
        cmocka_unit_test(test_hf_qwen2_matches_hf_tokenizers),
        cmocka_unit_test(test_hf_trained_matches_hf_tokenizers),
        cmocka_unit_test(test_gpt2_merge_matches_naive_reference),
        cmocka_unit_test(test_gpt2_roundtrip_any_bytes),
        cmocka_unit_test(test_gpt2_split_follows_the_regex),
        cmocka_unit_test(test_byte_tokenizer_is_identity),
        cmocka_unit_test(test_rank_file_errors),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
