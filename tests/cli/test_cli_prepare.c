// test_cli_prepare.c: `bytescale prepare` end to end - a temp corpus becomes a readable dataset,
// and bad flags or inputs give the documented exit code and a message naming the problem.
#include "test_util.h"

#include <sys/wait.h>
#include <unistd.h>

#include "bytescale/fileio.h"
#include "bytescale/shard.h"

static char out_text[1 << 16], err_text[1 << 16];

static void slurp(const char *path, char *buf, size_t cap) {
    buf[0] = '\0';
    FILE *f = fopen(path, "rb");
    if (!f) return;
    size_t n = fread(buf, 1, cap - 1, f);
    buf[n] = '\0';
    fclose(f);
}

// Run `bytescale prepare <args>`; returns the exit code, output in out_text / err_text.
static int run_prepare(const char *args) {
    const char *bin = getenv("BS_BINARY");
    if (!bin) fail_msg("BS_BINARY is not set (run through ctest)");
    char cmd[4096];
    snprintf(cmd, sizeof cmd, "BS_QUIET=1 '%s' prepare %s >test-tmp/cli_prepare/stdout 2>test-tmp/cli_prepare/stderr",
             bin, args);
    int st = system(cmd);
    slurp("test-tmp/cli_prepare/stdout", out_text, sizeof out_text);
    slurp("test-tmp/cli_prepare/stderr", err_text, sizeof err_text);
    assert_true(WIFEXITED(st));
    return WEXITSTATUS(st);
}

static void expect(const char *args, int code, const char *in_stderr) {
    int rc = run_prepare(args);
    if (rc != code || !strstr(err_text, in_stderr))
        fail_msg("prepare %s: exit %d (want %d), stderr: %s (want '%s')", args, rc, code, err_text, in_stderr);
}

static void write_text(const char *path, const char *text) { assert_int_equal(file_write_atomic(path, text, strlen(text)), 0); }

static void test_prepare_corpus_and_read_back(void **state) {
    (void)state;
    const char *dir = test_tmpdir("cli_prepare");
    char path[700];
    snprintf(path, sizeof path, "%s/in/sub", dir);
    assert_int_equal(make_dirs(path), 0);
    const char *texts[] = {"package main\n\nfunc main() {}\n", "", "// nested\npackage sub\n"};
    const char *names[] = {"in/a.go", "in/b.go", "in/sub/c.go"};
    for (int i = 0; i < 3; i++) {
        snprintf(path, sizeof path, "%s/%s", dir, names[i]);
        write_text(path, texts[i]);
    }
    snprintf(path, sizeof path, "%s/in/skip.md", dir);
    write_text(path, "# not Go\n");
    int rc = run_prepare("--input test-tmp/cli_prepare/in --ext .go --out test-tmp/cli_prepare/out --shard-size 16");
    if (rc != 0) fail_msg("exit %d: %s", rc, err_text);
    assert_non_null(strstr(out_text, "prepared 3 files"));
    assert_non_null(strstr(out_text, "median"));
    Dataset ds;
    assert_int_equal(dataset_open(&ds, "test-tmp/cli_prepare/out"), 0);
    assert_int_equal(ds.index.n_docs, 3);
    assert_true(ds.index.n_shards >= 2);  // 16-byte shards: the two non-empty files cannot share one
    for (int d = 0; d < 3; d++) {
        int64_t len = ds.index.docs[d].len;
        assert_int_equal(len, (int64_t)strlen(texts[d]));
        uint32_t ids[64];
        assert_int_equal(dataset_read(&ds, d, 0, len, ids), 0);
        for (int64_t i = 0; i < len; i++) assert_int_equal(ids[i], (uint8_t)texts[d][i]);
    }
    dataset_close(&ds);

    // gpt2 with the rank file found through BS_SOURCE_DIR (set by ctest), as `make tokenizer` puts it
    rc = run_prepare("--input test-tmp/cli_prepare/in/a.go --tokenizer gpt2 --out=test-tmp/cli_prepare/gpt2");
    if (rc != 0) fail_msg("exit %d: %s", rc, err_text);
    assert_int_equal(dataset_open(&ds, "test-tmp/cli_prepare/gpt2"), 0);
    assert_int_equal(ds.index.n_docs, 1);
    assert_int_equal(ds.index.vocab, 50257);
    uint32_t last;
    assert_int_equal(dataset_read(&ds, 0, ds.index.docs[0].len - 1, 1, &last), 0);
    assert_int_equal(last, 50256);  // <|endoftext|> ends the document
    dataset_close(&ds);
}

static void test_prepare_bad_flags_and_inputs(void **state) {
    (void)state;
    test_tmpdir("cli_prepare");
    assert_int_equal(make_dirs("test-tmp/cli_prepare/empty"), 0);
    assert_int_equal(run_prepare("--help"), 0);
    assert_non_null(strstr(out_text, "--tokenizer"));
    // usage errors: exit 2
    expect("--bogus 1", 2, "unknown flag '--bogus'");
    expect("--tokenizer wordpiece --out x", 2, "'wordpiece' is not a tokenizer");
    expect("--shard-size 12X --out x", 2, "--shard-size");
    expect("--shard-size 0 --out x", 2, "--shard-size");
    expect("--input", 2, "--input needs a value");
    expect("--input test-tmp/cli_prepare/empty", 2, "--out is required");
    expect("stray", 2, "unexpected argument 'stray'");
    // run errors: exit 1
    expect("--input test-tmp/cli_prepare/nope --out test-tmp/cli_prepare/o", 1, "input test-tmp/cli_prepare/nope");
    expect("--input test-tmp/cli_prepare/empty --out test-tmp/cli_prepare/o", 1, "no input files");
    write_text("test-tmp/cli_prepare/empty/x.go", "package x\n");
    expect("--input test-tmp/cli_prepare/empty --out test-tmp/cli_prepare/o --tokenizer gpt2 --bpe-ranks test-tmp/none",
           1, "test-tmp/none");
    assert_int_equal(access("test-tmp/cli_prepare/o/index.bin", F_OK), -1);  // nothing written
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_prepare_corpus_and_read_back),
        cmocka_unit_test(test_prepare_bad_flags_and_inputs),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
