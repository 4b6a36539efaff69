// test_cli_prepare.c: `bytescale prepare` end to end - a temp corpus becomes a readable dataset,
// and bad flags or inputs give the documented exit code and a message naming the problem.
#include "cli/cli_run.h"

#include <unistd.h>

#include "bytescale/fileio.h"
#include "bytescale/shard.h"

#define DIR "test-tmp/cli_prepare"

static int run_prepare(const char *args) {
    char a[4096];
    snprintf(a, sizeof a, "prepare %s", args);
    return cli_run(DIR, "", a);
}

static void expect(const char *args, int code, const char *in_stderr) {
    char a[4096];
    snprintf(a, sizeof a, "prepare %s", args);
    cli_expect(DIR, a, code, in_stderr);
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
    if (rc != 0) fail_msg("exit %d: %s", rc, cli_err);
    assert_non_null(strstr(cli_out, "prepared 3 files"));
    assert_non_null(strstr(cli_out, "median"));
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
    if (rc != 0) fail_msg("exit %d: %s", rc, cli_err);
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
    assert_non_null(strstr(cli_out, "--tokenizer"));
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
