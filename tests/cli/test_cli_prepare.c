// test_cli_prepare.c: `bytescale prepare` end to end - a temp corpus becomes a readable dataset,
// and bad flags or inputs give the documented exit code and a message naming the problem; a dataset
// already in --out survives a run that fails, even for want of disk space.
#include "cli/cli_run.h"

#include <dirent.h>
#include <unistd.h>

#include "bytescale/error.h"
#include "bytescale/fileio.h"
#include "bytescale/shard.h"

#define PDIR "test-tmp/cli_prepare"

static int run_prepare(const char *args) {
    char a[4096];
    snprintf(a, sizeof a, "prepare %s", args);
    return cli_run(PDIR, "", a);
}

static void expect(const char *args, int code, const char *in_stderr) {
    char a[4096];
    snprintf(a, sizeof a, "prepare %s", args);
    cli_expect(PDIR, a, code, in_stderr);
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
}

// gpt2 with the rank file found through BS_SOURCE_DIR (set by ctest), as `make tokenizer` puts it
static void test_prepare_gpt2(void **state) {
    (void)state;
    TEST_TOKENIZER_OR_SKIP("r50k_base.tiktoken");
    test_tmpdir("cli_prepare");
    write_text("test-tmp/cli_prepare/a.go", "package main\n\nfunc main() {}\n");
    int rc = run_prepare("--input test-tmp/cli_prepare/a.go --tokenizer gpt2 --out=test-tmp/cli_prepare/gpt2");
    if (rc != 0) fail_msg("exit %d: %s", rc, cli_err);
    Dataset ds;
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

// A directory holding a file and a symbolic link to another file is two documents (it was one: the
// link was dropped without a word).
static void test_prepare_follows_symlinks(void **state) {
    (void)state;
    test_tmpdir("cli_prepare");
    assert_int_equal(make_dirs(PDIR "/in"), 0);
    assert_int_equal(make_dirs(PDIR "/other"), 0);
    write_text(PDIR "/in/a.go", "package a\n");
    write_text(PDIR "/other/b.go", "package b\n");
    assert_int_equal(symlink("../other/b.go", PDIR "/in/b.go"), 0);
    int rc = run_prepare("--input " PDIR "/in --out " PDIR "/out");
    if (rc != 0) fail_msg("exit %d: %s", rc, cli_err);
    assert_non_null(strstr(cli_out, "prepared 2 files"));
}

// An output directory inside the input (it would read its own shards next time, or this time) is
// refused before anything is written.
static void test_prepare_refuses_output_inside_input(void **state) {
    (void)state;
    test_tmpdir("cli_prepare");
    assert_int_equal(make_dirs(PDIR "/in"), 0);
    write_text(PDIR "/in/a.go", "package a\n");
    expect("--input " PDIR "/in --out " PDIR "/in/ds", 1, "is inside the input " PDIR "/in");
    expect("--input " PDIR " --out " PDIR "/in/../ds", 1, "is inside the input");
    expect("--input " PDIR "/in --out " PDIR "/in", 1, "is inside the input");
    assert_int_equal(access(PDIR "/in/ds", F_OK), -1);
}

static int count_tmp_files(const char *dir, int *all) {
    DIR *d = opendir(dir);
    assert_non_null(d);
    int tmp = 0;
    *all = 0;
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        if (e->d_name[0] == '.') continue;
        (*all)++;
        tmp += strstr(e->d_name, ".tmp.") != NULL;
    }
    closedir(d);
    return tmp;
}

// A disk that fills up half-way (a file size limit: writes past it fail with EFBIG, as they would
// with ENOSPC) stops the run with an error; the dataset that was there reads back whole, and the
// run's own files are gone (they were hundreds of MB of .tmp, and index.bin was already deleted).
static void test_prepare_full_disk_keeps_old_dataset(void **state) {
    (void)state;
    test_tmpdir("cli_prepare");
    assert_int_equal(make_dirs(PDIR "/old"), 0);
    assert_int_equal(make_dirs(PDIR "/new"), 0);
    write_text(PDIR "/old/a.go", "package old\n");
    write_text(PDIR "/old/b.go", "package old // two\n");
    int rc = run_prepare("--input " PDIR "/old --out " PDIR "/ds");
    if (rc != 0) fail_msg("exit %d: %s", rc, cli_err);
    // the new corpus: small files that fit, then one far larger than the limit
    static char big[1 << 20];
    memset(big, 'x', sizeof big - 1);
    write_text(PDIR "/new/a.go", "package small\n");
    write_text(PDIR "/new/b.go", "package small // too\n");
    write_text(PDIR "/new/c.go", big);
    // 64 blocks: 32 KB under dash, 64 KB under bash; SIGXFSZ ignored so the write fails instead
    rc = cli_run(PDIR, "trap '' XFSZ; ulimit -f 64;", "prepare --input " PDIR "/new --out " PDIR "/ds --shard-size 16");
    if (rc != 1 || !strstr(cli_err, "File too large")) fail_msg("exit %d: %s", rc, cli_err);
    Dataset ds;
    if (dataset_open(&ds, PDIR "/ds") != 0) fail_msg("the old dataset is gone: %s", bs_errmsg());
    assert_int_equal(ds.index.n_docs, 2);
    uint32_t ids[32];
    assert_int_equal(dataset_read(&ds, 1, 0, ds.index.docs[1].len, ids), 0);
    for (int64_t i = 0; i < ds.index.docs[1].len; i++) assert_int_equal(ids[i], (uint8_t)"package old // two\n"[i]);
    int all;
    assert_int_equal(count_tmp_files(PDIR "/ds", &all), 0);
    assert_int_equal(all, 1 + ds.index.n_shards);  // the index and its shards, nothing of the failed run
    dataset_close(&ds);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_prepare_corpus_and_read_back),
        cmocka_unit_test(test_prepare_gpt2),
        cmocka_unit_test(test_prepare_bad_flags_and_inputs),
        cmocka_unit_test(test_prepare_follows_symlinks),
        cmocka_unit_test(test_prepare_refuses_output_inside_input),
        cmocka_unit_test(test_prepare_full_disk_keeps_old_dataset),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
