// test_cli_prepare_jsonl.c: `bytescale prepare` on JSONL inputs (plain, gzip, zstd): one document
// per line, the same dataset whatever the compression and the thread count; every kind of bad line
// stops the run naming file:line and the reason, leaving the dataset that was there and nothing of
// its own; --skip-bad-lines skips and counts them.
#include "cli/cli_run.h"

#include <dirent.h>
#include <zlib.h>
#include <zstd.h>

#include "bytescale/error.h"
#include "bytescale/fileio.h"
#include "bytescale/shard.h"

#define JDIR "test-tmp/cli_prepare_jsonl"

static void write_bytes(const char *path, const void *b, size_t n) { assert_int_equal(file_write_atomic(path, b, n), 0); }

static void write_gz(const char *path, const char *text, size_t n) {
    gzFile f = gzopen(path, "wb");
    assert_non_null(f);
    assert_int_equal(gzwrite(f, text, (unsigned)n), (int)n);
    assert_int_equal(gzclose(f), Z_OK);
}

static void write_zst(const char *path, const char *text, size_t n) {
    size_t cap = ZSTD_compressBound(n);
    char *z = malloc(cap);
    size_t zn = ZSTD_compress(z, cap, text, n, 3);
    assert_false(ZSTD_isError(zn));
    write_bytes(path, z, zn);
    free(z);
}

static int prepare(const char *args) {
    char a[4096];
    snprintf(a, sizeof a, "prepare %s", args);
    return cli_run(JDIR, "", a);
}

// n lines {"id": i, "text": "..."} with escapes, non-ASCII and one empty text; returns the text
static char *make_jsonl(int n, size_t *len) {
    size_t cap = (size_t)n * 160 + 64, at = 0;
    char *s = malloc(cap);
    for (int i = 0; i < n; i++) {
        if (i == 3) at += (size_t)snprintf(s + at, cap - at, "{\"id\": %d, \"text\": \"\"}\n", i);
        else at += (size_t)snprintf(s + at, cap - at, "{\"id\": %d, \"meta\": {\"a\": [1, 2.5e3, null]}, \"text\": \"doc %d\\n\\t\\u00e9\\u4e16\\ud83d\\ude00 \\\"q\\\"\"}\n", i, i);
    }
    *len = at;
    return s;
}

// The text line i decodes to (make_jsonl's escapes resolved).
static void want_text(int i, char *out, size_t cap) {
    if (i == 3) out[0] = '\0';
    else snprintf(out, cap, "doc %d\n\t\xc3\xa9\xe4\xb8\x96\xf0\x9f\x98\x80 \"q\"", i);
}

static void check_dataset(const char *dir, int n) {
    Dataset ds;
    if (dataset_open(&ds, dir) != 0) fail_msg("%s", bs_errmsg());
    assert_int_equal(ds.index.n_docs, n);
    for (int d = 0; d < n; d++) {
        char want[128];
        want_text(d, want, sizeof want);
        int64_t len = ds.index.docs[d].len;
        assert_int_equal(len, (int64_t)strlen(want));
        uint32_t ids[128];
        assert_int_equal(dataset_read(&ds, d, 0, len, ids), 0);
        for (int64_t i = 0; i < len; i++) assert_int_equal(ids[i], (uint8_t)want[i]);
        char src[64];
        snprintf(src, sizeof src, ":%d", d + 1);  // the source is <file>:<line>
        const char *s = docindex_source(&ds.index, d);
        assert_non_null(strstr(s, src));
    }
    dataset_close(&ds);
}

static int same_file(const char *a, const char *b) {
    char *x, *y;
    size_t nx, ny;
    assert_int_equal(file_read_all(a, &x, &nx), 0);
    assert_int_equal(file_read_all(b, &y, &ny), 0);
    int same = nx == ny && memcmp(x, y, nx) == 0;
    free(x);
    free(y);
    return same;
}

// 3000 lines: the reader cuts them into chunks that the threads share
static void test_jsonl_plain_gz_zst_same_dataset(void **state) {
    (void)state;
    test_tmpdir("cli_prepare_jsonl");
    size_t n;
    char *text = make_jsonl(3000, &n);
    write_bytes(JDIR "/a.jsonl", text, n);
    write_gz(JDIR "/a.jsonl.gz", text, n);
    write_zst(JDIR "/a.jsonl.zst", text, n);
    const char *runs[][2] = {{"a.jsonl --threads 1", "p"}, {"a.jsonl.gz --threads 2", "g"}, {"a.jsonl.zst --threads 3", "z"}};
    for (int r = 0; r < 3; r++) {
        char args[512];
        snprintf(args, sizeof args, "--input " JDIR "/%s --out " JDIR "/%s", runs[r][0], runs[r][1]);
        if (prepare(args) != 0) fail_msg("%s: %s", args, cli_err);
        assert_non_null(strstr(cli_out, "into 3000 documents"));
    }
    check_dataset(JDIR "/p", 3000);
    // the tokens are the same whatever the compression or the thread count (only the paths differ)
    assert_true(same_file(JDIR "/p/shard-g1-00000.bin", JDIR "/g/shard-g1-00000.bin"));
    assert_true(same_file(JDIR "/p/shard-g1-00000.bin", JDIR "/z/shard-g1-00000.bin"));
    free(text);
}

// A line longer than the reader's chunk, without a final newline, and several files in a directory
static void test_jsonl_long_line_and_directory(void **state) {
    (void)state;
    test_tmpdir("cli_prepare_jsonl");
    assert_int_equal(make_dirs(JDIR "/in"), 0);
    size_t big = 3 << 20;
    char *s = malloc(big + 64);
    int at = sprintf(s, "{\"text\": \"");
    memset(s + at, 'x', big);
    strcpy(s + at + big, "\"}");  // no newline at the end of the file
    write_zst(JDIR "/in/b.jsonl.zst", s, strlen(s));
    write_bytes(JDIR "/in/a.jsonl", "{\"text\": \"first\"}\n", 18);
    write_bytes(JDIR "/in/c.txt", "a plain document", 16);
    if (prepare("--input " JDIR "/in --out " JDIR "/d --threads 2") != 0) fail_msg("%s", cli_err);
    assert_non_null(strstr(cli_out, "prepared 3 files"));
    assert_non_null(strstr(cli_out, "into 3 documents"));
    Dataset ds;
    assert_int_equal(dataset_open(&ds, JDIR "/d"), 0);
    assert_int_equal(ds.index.docs[0].len, 5);
    assert_int_equal(ds.index.docs[1].len, (int64_t)big);
    assert_int_equal(ds.index.docs[2].len, 16);
    assert_string_equal(docindex_source(&ds.index, 2), JDIR "/in/c.txt");
    dataset_close(&ds);
    free(s);
}

static int count_entries(const char *dir) {
    DIR *d = opendir(dir);
    if (!d) return -1;
    int n = 0;
    for (struct dirent *e; (e = readdir(d)) != NULL;) n += e->d_name[0] != '.';
    closedir(d);
    return n;
}

// Each bad line, on line 2500 of a file (past the first chunk), stops the run with file:line and the
// reason; the dataset already in --out is left as it was, with nothing of the failed run beside it.
static void test_jsonl_bad_lines_stop_the_run(void **state) {
    (void)state;
    test_tmpdir("cli_prepare_jsonl");
    size_t n;
    char *good = make_jsonl(2499, &n);
    write_bytes(JDIR "/old.jsonl", good, n);
    if (prepare("--input " JDIR "/old.jsonl --out " JDIR "/ds") != 0) fail_msg("%s", cli_err);
    int entries = count_entries(JDIR "/ds");
    struct {
        const char *line, *msg;
    } bad[] = {
        {"{\"text\": \"a\", }", ":2500: not JSON: expected a key at byte 15"},
        {"[1, 2]", ":2500: not a JSON object (the line is an array)"},
        {"{\"title\": \"x\"}", ":2500: no field \"text\""},
        {"{\"text\": [\"a\"]}", ":2500: field \"text\" is an array, not a string"},
        {"{\"text\": \"caf\xc3\"}", ":2500: invalid UTF-8 at byte 14"},
        {"{\"text\": \"\xed\xa0\x80\"}", ":2500: invalid UTF-8 at byte 11"},  // a surrogate, UTF-8-encoded
        {"{\"text\": \"\\udc00\"}", ":2500: invalid UTF-8: a lone low surrogate escape"},
        {"", ":2500: an empty line, not a JSON object"},
    };
    for (size_t b = 0; b < sizeof bad / sizeof bad[0]; b++) {
        char *t = malloc(n + 64);
        memcpy(t, good, n);
        size_t len = strlen(bad[b].line);
        memcpy(t + n, bad[b].line, len);
        memcpy(t + n + len, "\n{\"text\": \"after\"}\n", 19);
        write_zst(JDIR "/bad.jsonl.zst", t, n + len + 19);
        free(t);
        int rc = prepare("--input " JDIR "/bad.jsonl.zst --out " JDIR "/ds --threads 2");
        char want[256];
        snprintf(want, sizeof want, JDIR "/bad.jsonl.zst%s", bad[b].msg);
        if (rc != 1 || !strstr(cli_err, want)) fail_msg("case %zu: exit %d, stderr: %s (want '%s')", b, rc, cli_err, want);
        assert_int_equal(count_entries(JDIR "/ds"), entries);
        check_dataset(JDIR "/ds", 2499);
    }
    free(good);
}

// A compressed file cut short: the line it ends in, and the kind of stream
static void test_jsonl_truncated_streams(void **state) {
    (void)state;
    test_tmpdir("cli_prepare_jsonl");
    size_t n;
    char *text = make_jsonl(5000, &n);
    write_gz(JDIR "/t.jsonl.gz", text, n);
    write_zst(JDIR "/t.jsonl.zst", text, n);
    const char *names[] = {JDIR "/t.jsonl.gz", JDIR "/t.jsonl.zst"};
    const char *kinds[] = {"truncated gzip stream", "truncated zstd stream"};
    for (int k = 0; k < 2; k++) {
        char *z;
        size_t zn;
        assert_int_equal(file_read_all(names[k], &z, &zn), 0);
        write_bytes(names[k], z, zn / 2);
        free(z);
        char args[512];
        snprintf(args, sizeof args, "--input %s --out " JDIR "/t%d --skip-bad-lines", names[k], k);
        int rc = prepare(args);
        char want[256];
        snprintf(want, sizeof want, "%s:", names[k]);
        if (rc != 1 || !strstr(cli_err, want) || !strstr(cli_err, kinds[k])) fail_msg("exit %d: %s", rc, cli_err);
        snprintf(args, sizeof args, JDIR "/t%d", k);
        assert_int_equal(count_entries(args), 0);  // the new directory holds nothing
    }
    // a file whose name says zstd but is not
    write_bytes(JDIR "/x.jsonl.zst", "{\"text\": \"a\"}\n", 14);
    cli_expect(JDIR, "prepare --input " JDIR "/x.jsonl.zst --out " JDIR "/x", 1, "x.jsonl.zst: not a zstd file");
    free(text);
}

static void test_jsonl_skip_bad_lines(void **state) {
    (void)state;
    test_tmpdir("cli_prepare_jsonl");
    const char *t = "{\"text\": \"one\"}\n"
                    "not json\n"
                    "{\"text\": 7}\n"
                    "{\"body\": \"b\", \"text\": \"two\"}\n"
                    "{\"body\": \"only\"}\n";
    write_bytes(JDIR "/s.jsonl", t, strlen(t));
    if (prepare("--input " JDIR "/s.jsonl --out " JDIR "/s --skip-bad-lines") != 0) fail_msg("%s", cli_err);
    assert_non_null(strstr(cli_out, "into 2 documents"));
    assert_non_null(strstr(cli_out, "skipped 3 bad lines"));
    assert_non_null(strstr(cli_err, JDIR "/s.jsonl:2: not JSON"));
    assert_non_null(strstr(cli_err, JDIR "/s.jsonl:3: field \"text\" is a number"));
    assert_non_null(strstr(cli_err, JDIR "/s.jsonl:5: no field \"text\""));
    // --text-field picks another member
    if (prepare("--input " JDIR "/s.jsonl --out " JDIR "/b --skip-bad-lines --text-field body") != 0) fail_msg("%s", cli_err);
    assert_non_null(strstr(cli_out, "into 2 documents"));
    Dataset ds;
    assert_int_equal(dataset_open(&ds, JDIR "/b"), 0);
    assert_int_equal(ds.index.docs[1].len, 4);
    assert_string_equal(docindex_source(&ds.index, 1), JDIR "/s.jsonl:5");
    dataset_close(&ds);
    cli_expect(JDIR, "prepare --input " JDIR "/s.jsonl --out " JDIR "/b --threads 0", 2, "--threads");
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_jsonl_plain_gz_zst_same_dataset),
        cmocka_unit_test(test_jsonl_long_line_and_directory),
        cmocka_unit_test(test_jsonl_bad_lines_stop_the_run),
        cmocka_unit_test(test_jsonl_truncated_streams),
        cmocka_unit_test(test_jsonl_skip_bad_lines),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
