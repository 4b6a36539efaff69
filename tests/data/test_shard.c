// test_shard.c: prepare a small corpus, read every document back, and refuse damaged files.
#include "test_util.h"

#include <dirent.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include "bytescale/error.h"
#include "bytescale/fileio.h"
#include "bytescale/prepare.h"
#include "bytescale/rng.h"
#include "bytescale/shard.h"
#include "bytescale/tokenizer.h"

static char ranks_path[4096];

// The rank file from `make tokenizer`; without it the GPT-2 cases skip, saying so (test_util.h).
static const char *ranks(void) {
    TEST_TOKENIZER_OR_SKIP("r50k_base.tiktoken");
    snprintf(ranks_path, sizeof ranks_path, "%s", test_tokenizer_path("r50k_base.tiktoken"));
    return ranks_path;
}

static void write_file(const char *dir, const char *name, const void *data, size_t n) {
    char path[1024];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    char *slash = strrchr(path, '/');
    *slash = '\0';
    assert_int_equal(make_dirs(path), 0);
    *slash = '/';
    assert_int_equal(file_write_atomic(path, data, n), 0);
}

// A corpus with an empty file, a large file (longer than a shard), text with invalid UTF-8, a file
// the extension filter must skip, and names whose sorted order differs from creation order.
static void make_corpus(const char *dir, uint64_t seed) {
    Rng rng;
    rng_seed(&rng, seed);
    const char *b = "package b\n\nfunc B() int { return 42 }\n";
    write_file(dir, "b.go", b, strlen(b));
    write_file(dir, "a.go", "package a // ä世界 🌍\n", strlen("package a // ä世界 🌍\n"));
    write_file(dir, "empty.go", "", 0);
    write_file(dir, "notes.txt", "not Go\n", 7);
    static char big[300000];
    const char *words[] = {"func ", "return ", "x", " := ", "\t", "\n", "// comment ", "42", "\"str\"", "é", "\xff", "{", "}"};
    size_t n = 0;
    while (n + 16 < sizeof big) {
        const char *w = words[rng_below(&rng, sizeof words / sizeof words[0])];
        memcpy(big + n, w, strlen(w));
        n += strlen(w);
    }
    write_file(dir, "sub/big.go", big, n);
    char small[200];
    for (int i = 0; i < 20; i++) {
        int len = snprintf(small, sizeof small, "package p%d\nvar v = %llu\n", i, (unsigned long long)rng_next(&rng));
        char name[32];
        snprintf(name, sizeof name, "sub/deeper/f%02d.go", 19 - i);
        write_file(dir, name, small, (size_t)len);
    }
}

static void prepare_dir(const char *in, const char *out, const char *tok, int64_t shard_bytes, PrepareStats *st) {
    const char *inputs[] = {in};
    PrepareConfig cfg = {.inputs = inputs, .n_inputs = 1, .ext = ".go", .tokenizer = tok, .out_dir = out,
                         .shard_bytes = shard_bytes, .quiet = 1};
    if (!strcmp(tok, "gpt2")) cfg.bpe_ranks = ranks();
    if (prepare_run(&cfg, st) != 0) fail_msg("prepare: %s", bs_errmsg());
}

static void check_dataset(const char *in, const char *out, const char *tok_name, int64_t shard_bytes) {
    PrepareStats st;
    prepare_dir(in, out, tok_name, shard_bytes, &st);
    Tokenizer *tok;
    assert_int_equal(tokenizer_open(&tok, tok_name, tok_name[0] == 'g' ? ranks() : NULL), 0);
    Dataset ds;
    if (dataset_open(&ds, out) != 0) fail_msg("%s", bs_errmsg());
    const DocIndex *ix = &ds.index;
    // 24 .go files (notes.txt filtered out), in byte order of their paths
    assert_int_equal(ix->n_docs, 24);
    assert_int_equal(st.n_files, 24);
    assert_int_equal(ix->n_shards, st.n_shards);
    assert_true(ix->n_shards >= 3);  // the shard size forces several
    assert_int_equal(ix->vocab, tokenizer_vocab_size(tok));
    for (int64_t d = 1; d < ix->n_docs; d++) assert_true(strcmp(docindex_source(ix, d - 1), docindex_source(ix, d)) < 0);
    assert_non_null(strstr(docindex_source(ix, 0), "/a.go"));
    int64_t at = 0, max_len = 0, total = 0;
    for (int64_t d = 0; d < ix->n_docs; d++) {
        const DocEntry *e = &ix->docs[d];
        // documents follow each other: global offsets are the running sum of lengths
        assert_int_equal(e->start, at);
        at += e->len;
        // every document's tokens == the tokenizer applied to its file now
        char *text;
        size_t size;
        assert_int_equal(file_read_all(docindex_source(ix, d), &text, &size), 0);
        Tokens want = {0};
        if (ix->tokenizer == TOKENIZER_BYTE) {
            for (size_t i = 0; i < size; i++) tokens_push(&want, (uint8_t)text[i]);  // independent of the tokenizer
        } else {
            assert_int_equal(tokenizer_encode(tok, text, size, &want), 0);
            if (size > 0) tokens_push(&want, (uint32_t)tokenizer_eot(tok));
        }
        assert_int_equal(e->len, want.n);
        uint32_t *got = malloc((size_t)(e->len + 1) * sizeof *got);
        assert_int_equal(dataset_read(&ds, d, 0, e->len, got), 0);
        if (e->len) assert_memory_equal(got, want.ids, (size_t)e->len * sizeof *got);
        // a shard that is over the size limit holds that one document only
        int64_t shard_tokens = ix->shards[e->shard].n_tokens;
        if (shard_tokens * ix->width > shard_bytes) assert_int_equal(shard_tokens, e->len);
        // spans: clipped at the document end, exact inside
        for (int k = 0; k < 20 && e->len > 0; k++) {
            int64_t first = (int64_t)(((uint64_t)k * 7919u) % (uint64_t)e->len), n = 1 + (k * 31) % 50, n_got;
            assert_int_equal(dataset_read_span(&ds, d, e->start + first, n + 1, got, &n_got), 0);
            int64_t left = e->len - first;
            assert_int_equal(n_got, n + 1 < left ? n + 1 : left);
            assert_memory_equal(got, want.ids + first, (size_t)n_got * sizeof *got);
        }
        if (e->len > max_len) max_len = e->len;
        total += e->len;
        free(got);
        free(text);
        tokens_free(&want);
    }
    assert_int_equal(total, ix->n_tokens);
    assert_int_equal(st.n_tokens, total);
    assert_int_equal(st.len_min, 0);  // the empty file
    assert_int_equal(st.len_max, max_len);
    // out-of-range reads are refused
    uint32_t one;
    int64_t n_got;
    assert_int_equal(dataset_read(&ds, ix->n_docs, 0, 1, &one), -1);
    assert_int_equal(dataset_read(&ds, 0, ix->docs[0].len, 1, &one), -1);
    assert_non_null(strstr(bs_errmsg(), "outside document 0"));
    assert_int_equal(dataset_read_span(&ds, 1, ix->docs[0].start, 1, &one, &n_got), -1);
    dataset_close(&ds);
    tokenizer_free(tok);
}

static void test_prepare_then_read_back_byte(void **state) {
    (void)state;
    char in[600], out[600];
    snprintf(in, sizeof in, "%s/in", test_tmpdir("data_prepare_byte"));
    snprintf(out, sizeof out, "test-tmp/data_prepare_byte/out");
    make_corpus(in, 1);
    check_dataset(in, out, "byte", 64 << 10);
}

static void test_prepare_then_read_back_gpt2(void **state) {
    (void)state;
    char in[600], out[600];
    snprintf(in, sizeof in, "%s/in", test_tmpdir("data_prepare_gpt2"));
    snprintf(out, sizeof out, "test-tmp/data_prepare_gpt2/out");
    make_corpus(in, 2);
    check_dataset(in, out, "gpt2", 32 << 10);
}

static void test_prepare_errors(void **state) {
    (void)state;
    const char *dir = test_tmpdir("data_prepare_errors");
    char empty[600], out[600];
    snprintf(empty, sizeof empty, "%s/empty", dir);
    snprintf(out, sizeof out, "%s/out", dir);
    assert_int_equal(make_dirs(empty), 0);
    PrepareStats st;
    const char *inputs[] = {empty};
    PrepareConfig cfg = {.inputs = inputs, .n_inputs = 1, .tokenizer = "byte", .out_dir = out, .quiet = 1};
    assert_int_equal(prepare_run(&cfg, &st), -1);
    assert_non_null(strstr(bs_errmsg(), "no input files"));
    const char *missing[] = {"test-tmp/data_prepare_errors/nope"};
    cfg.inputs = missing;
    assert_int_equal(prepare_run(&cfg, &st), -1);
    assert_non_null(strstr(bs_errmsg(), "input test-tmp/data_prepare_errors/nope"));
    write_file(empty, "x.go", "x", 1);
    cfg.inputs = inputs;
    cfg.tokenizer = "gpt2";
    cfg.bpe_ranks = "test-tmp/data_prepare_errors/none.tiktoken";
    assert_int_equal(prepare_run(&cfg, &st), -1);
    assert_non_null(strstr(bs_errmsg(), "none.tiktoken"));
    assert_int_equal(access("test-tmp/data_prepare_errors/out/index.bin", F_OK), -1);
}

// ---- damaged files -------------------------------------------------------------------------

static void read_bytes(const char *path, uint8_t **data, size_t *n) {
    char *d;
    assert_int_equal(file_read_all(path, &d, n), 0);
    *data = (uint8_t *)d;
}

static void expect_refused(const char *dir, const char *path, const uint8_t *bytes, size_t n, const char *what) {
    assert_int_equal(file_write_atomic(path, bytes, n), 0);
    Dataset ds;
    assert_int_equal(dataset_open(&ds, dir), -1);
    const char *msg = bs_errmsg();
    const char *name = strrchr(path, '/') + 1;
    if (!strstr(msg, what) || !strstr(msg, name)) fail_msg("expected '%s' and '%s' in: %s", what, name, msg);
}

static void put32(uint8_t *p, uint32_t v) {
    for (int i = 0; i < 4; i++) p[i] = (uint8_t)(v >> (8 * i));
}

// Rewrite a header's own checksum (the last 4 of its 64 bytes) so a deliberate change gets past it.
static void fix_header_crc(uint8_t *h) { put32(h + 60, checksum_crc32(0, h, 60)); }

static void test_damaged_shards_are_refused(void **state) {
    (void)state;
    const char *dir = test_tmpdir("data_damaged_shard");
    char in[600], out[600], shard[700];
    snprintf(in, sizeof in, "%s/in", dir);
    snprintf(out, sizeof out, "%s/out", dir);
    const char *one = "package one\n// some text to make a hundred bytes or so of payload .............\n";
    write_file(in, "one.go", one, strlen(one));
    write_file(in, "two.go", "package two\n", 12);
    PrepareStats st;
    prepare_dir(in, out, "gpt2", 1 << 20, &st);
    DocIndex ix;  // the shard's file name, as the index has it
    assert_int_equal(docindex_read(&ix, out), 0);
    snprintf(shard, sizeof shard, "%s/%s", out, ix.shards[0].name);
    docindex_free(&ix);
    uint8_t *orig;
    size_t n;
    read_bytes(shard, &orig, &n);
    assert_true(n > 64 + 20);
    uint8_t *b = malloc(n);
    // every truncation length: inside the header, at its end, and inside the payload
    for (size_t len = 0; len < n; len++) expect_refused(out, shard, orig, len, "truncated");
    // one byte too many
    uint8_t *longer = calloc(1, n + 1);
    memcpy(longer, orig, n);
    expect_refused(out, shard, longer, n + 1, "trailing bytes");
    free(longer);
    // any flipped payload byte
    for (size_t i = 64; i < n; i++) {
        memcpy(b, orig, n);
        b[i] ^= 0x10;
        expect_refused(out, shard, b, n, "checksum mismatch");
    }
    // any flipped header byte other than the magic
    for (size_t i = 8; i < 64; i++) {
        memcpy(b, orig, n);
        b[i] ^= 0x01;
        expect_refused(out, shard, b, n, i >= 8 && i < 12 ? "unsupported version" : "header checksum mismatch");
    }
    memcpy(b, orig, n);
    b[0] = 'X';
    expect_refused(out, shard, b, n, "bad magic");
    memcpy(b, orig, n);
    put32(b + 8, 2);
    fix_header_crc(b);
    expect_refused(out, shard, b, n, "unsupported version 2");
    // a valid shard of another dataset: its own checksums pass, the index's do not
    memcpy(b, orig, n);
    b[64] ^= 1;
    put32(b + 32, checksum_crc32(0, b + 64, n - 64));
    fix_header_crc(b);
    expect_refused(out, shard, b, n, "differs from the index");
    // put the original back: the dataset opens again
    assert_int_equal(file_write_atomic(shard, orig, n), 0);
    Dataset ds;
    assert_int_equal(dataset_open(&ds, out), 0);
    dataset_close(&ds);
    unlink(shard);
    assert_int_equal(dataset_open(&ds, out), -1);
    assert_non_null(strstr(bs_errmsg(), "cannot open shard 0"));
    free(b);
    free(orig);
}

// A shard truncated in place while the dataset is open (a dataset changed under a running job): a
// read from it fails with an error naming the shard and saying the dataset changed, for tokens past
// the file's new end on its last page (which read as zeros) and on a page past it (SIGBUS, which
// killed the process). A shard replaced by another file leaves the open dataset reading the one it
// opened, and several threads reading at once each get their own error.
static void test_shard_truncated_while_open(void **state) {
    (void)state;
    const char *dir = test_tmpdir("data_truncated");
    char in[600], out[600], shard[700];
    snprintf(in, sizeof in, "%s/in", dir);
    snprintf(out, sizeof out, "%s/out", dir);
    long page = sysconf(_SC_PAGESIZE);
    size_t len = (size_t)(4 * page);  // one document of byte tokens, 1 byte each, over 4 pages
    char *text = malloc(len);
    for (size_t i = 0; i < len; i++) text[i] = (char)('a' + i % 26);
    write_file(in, "a.go", text, len);
    PrepareStats st;
    prepare_dir(in, out, "byte", 1 << 20, &st);
    Dataset ds;
    if (dataset_open(&ds, out) != 0) fail_msg("%s", bs_errmsg());
    snprintf(shard, sizeof shard, "%s/%s", out, ds.index.shards[0].name);
    assert_int_equal(ds.index.width, 1);
    uint32_t *ids = malloc(len * sizeof *ids);
    assert_int_equal(dataset_read(&ds, 0, 0, (int64_t)len, ids), 0);
    for (size_t i = 0; i < len; i++) assert_int_equal(ids[i], (uint8_t)text[i]);

    // replaced by another file under the same name: the open dataset still reads what it opened
    assert_int_equal(file_write_atomic(shard, "not a shard", 11), 0);
    assert_int_equal(dataset_read(&ds, 0, 0, (int64_t)len, ids), 0);
    for (size_t i = 0; i < len; i++) assert_int_equal(ids[i], (uint8_t)text[i]);
    dataset_close(&ds);

    // truncated in place, to its header and 100 tokens
    prepare_dir(in, out, "byte", 1 << 20, &st);
    if (dataset_open(&ds, out) != 0) fail_msg("%s", bs_errmsg());
    snprintf(shard, sizeof shard, "%s/%s", out, ds.index.shards[0].name);
    assert_int_equal(truncate(shard, 64 + 100), 0);
    const struct {
        int64_t first, n;
    } reads[] = {
        {200, 50},            // on the first page, past the new end: read zeros
        {2 * page, 50},       // on a page past the new end: SIGBUS
        {page - 80, 200},     // from the first page into the next
        {0, 10},              // before the new end, but from a file that is no longer the one checked
    };
    for (size_t r = 0; r < sizeof reads / sizeof reads[0]; r++) {
        memset(ids, 0xff, 50 * sizeof *ids);
        assert_int_equal(dataset_read(&ds, 0, reads[r].first, reads[r].n, ids), -1);
        const char *msg = bs_errmsg();
        if (!strstr(msg, "the dataset changed while it was in use") || !strstr(msg, ds.index.shards[0].name) ||
            !strstr(msg, "was truncated"))
            fail_msg("read [%lld, +%lld): %s", (long long)reads[r].first, (long long)reads[r].n, msg);
        int64_t got = -1;
        assert_int_equal(dataset_read_span(&ds, 0, ds.index.docs[0].start + reads[r].first, reads[r].n, ids, &got),
                         -1);
        assert_int_equal(got, 0);
        assert_non_null(strstr(bs_errmsg(), "the dataset changed"));
    }
    // the process goes on: a SIGBUS outside a guarded copy is still not swallowed (the default
    // action is restored for it), which a child process shows
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        // the reader's handler over the default action (not cmocka's, whose handler the test runs
        // under): a dataset_open installs it, even one that fails on the truncated shard
        signal(SIGBUS, SIG_DFL);
        Dataset again;
        if (dataset_open(&again, out) == 0) _exit(5);
        volatile const uint8_t *p = ds.payload[0];
        uint8_t x = p[2 * page];  // unguarded: must die of SIGBUS
        _exit(x == 0x7f ? 3 : 4);
    }
    int status;
    assert_int_equal(waitpid(pid, &status, 0), pid);
    assert_true(WIFSIGNALED(status) && WTERMSIG(status) == SIGBUS);
    dataset_close(&ds);
    free(ids);
    free(text);
}

static void test_damaged_index_is_refused(void **state) {
    (void)state;
    const char *dir = test_tmpdir("data_damaged_index");
    char in[600], out[600], index[700];
    snprintf(in, sizeof in, "%s/in", dir);
    snprintf(out, sizeof out, "%s/out", dir);
    snprintf(index, sizeof index, "%s/index.bin", out);
    write_file(in, "a.go", "package a\n", 10);
    write_file(in, "b.go", "package b\n", 10);
    PrepareStats st;
    prepare_dir(in, out, "byte", 1 << 20, &st);
    uint8_t *orig;
    size_t n;
    read_bytes(index, &orig, &n);
    uint8_t *b = malloc(n);
    for (size_t len = 0; len < n; len++) expect_refused(out, index, orig, len, "truncated");
    for (size_t i = 64; i < n; i++) {
        memcpy(b, orig, n);
        b[i] ^= 0x80;
        expect_refused(out, index, b, n, "checksum mismatch");
    }
    memcpy(b, orig, n);
    memcpy(b, "BSSHARD", 8);  // a shard's magic is not an index's
    expect_refused(out, index, b, n, "bad magic");
    memcpy(b, orig, n);
    put32(b + 8, 7);
    fix_header_crc(b);
    expect_refused(out, index, b, n, "unsupported version 7");
    // document 1 made one token longer than its shard holds, with valid checksums
    memcpy(b, orig, n);
    const size_t doc1 = 64 + 64 + 24;  // header, one shard entry, document 0
    b[doc1 + 16] += 1;                 // low byte of document 1's length
    put32(b + 56, checksum_crc32(0, b + 64, n - 64));
    fix_header_crc(b);
    expect_refused(out, index, b, n, "index points past the end of shard 0");
    // the directory or the file itself both name the dataset
    assert_int_equal(file_write_atomic(index, orig, n), 0);
    DocIndex ix;
    assert_int_equal(docindex_read(&ix, index), 0);
    assert_int_equal(ix.n_docs, 2);
    assert_int_equal(ix.docs[1].len, 10);
    docindex_free(&ix);
    free(b);
    free(orig);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_prepare_then_read_back_byte),
        cmocka_unit_test(test_prepare_then_read_back_gpt2),
        cmocka_unit_test(test_prepare_errors),
        cmocka_unit_test(test_damaged_shards_are_refused),
        cmocka_unit_test(test_damaged_index_is_refused),
        cmocka_unit_test(test_shard_truncated_while_open),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
