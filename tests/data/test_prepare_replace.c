// test_prepare_replace.c: `prepare` over a directory that already holds a dataset never destroys it
// (docs/data-format.md, "Replacing a dataset"): a run that fails at any point leaves the old dataset
// whole and readable and nothing of its own behind; a run that succeeds replaces it in one step and
// removes the old shards; what a killed run left is removed by the next; an output inside an input
// is refused; symbolic links in the inputs are followed, never silently dropped.
#include "test_util.h"

#include <dirent.h>
#include <sys/stat.h>
#include <unistd.h>

#include "bytescale/error.h"
#include "bytescale/fileio.h"
#include "bytescale/prepare.h"
#include "bytescale/shard.h"
#include "bytescale/tokenizer.h"

static void write_text(const char *dir, const char *name, const char *text) {
    char path[1024];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    char *slash = strrchr(path, '/');
    *slash = '\0';
    assert_int_equal(make_dirs(path), 0);
    *slash = '/';
    assert_int_equal(file_write_atomic(path, text, strlen(text)), 0);
}

// n files of distinct text, tag making one corpus differ from another
static void make_corpus(const char *dir, const char *tag, int n) {
    for (int f = 0; f < n; f++) {
        char name[32], text[512];
        snprintf(name, sizeof name, "f%02d.go", f);
        int len = snprintf(text, sizeof text, "package %s%d\n", tag, f);
        for (int k = 0; k < f * 3 && len < 400; k++)
            len += snprintf(text + len, sizeof text - (size_t)len, "// %s line %d\n", tag, k);
        write_text(dir, name, text);
    }
}

static int run_prepare(const char *in, const char *out, int64_t shard_bytes, PrepareStats *st) {
    const char *inputs[] = {in};
    PrepareConfig cfg = {.inputs = inputs, .n_inputs = 1, .tokenizer = "byte", .out_dir = out,
                         .shard_bytes = shard_bytes, .quiet = 1};
    return prepare_run(&cfg, st);
}

// What a dataset holds, as one number: every document's length and tokens, read through dataset_open
// (which checks every checksum). 0 when it does not open.
static uint32_t fingerprint(const char *dir) {
    Dataset ds;
    if (dataset_open(&ds, dir) != 0) return 0;
    uint32_t crc = checksum_crc32(0, &ds.index.n_docs, sizeof ds.index.n_docs);
    uint32_t buf[1024];
    for (int64_t d = 0; d < ds.index.n_docs; d++) {
        int64_t len = ds.index.docs[d].len;
        crc = checksum_crc32(crc, &len, sizeof len);
        for (int64_t at = 0; at < len; at += 1024) {
            int64_t k = len - at < 1024 ? len - at : 1024;
            assert_int_equal(dataset_read(&ds, d, at, k, buf), 0);
            crc = checksum_crc32(crc, buf, (size_t)k * sizeof *buf);
        }
    }
    dataset_close(&ds);
    return crc ? crc : 1;
}

// The directory holds exactly index.bin, the shards it names, and the extra names given (NULL-ended):
// no temporary file, no shard of another run.
static void expect_only_dataset(const char *dir, const char *const *extra) {
    DocIndex ix;
    if (docindex_read(&ix, dir) != 0) fail_msg("%s", bs_errmsg());
    DIR *d = opendir(dir);
    assert_non_null(d);
    struct dirent *e;
    int seen = 0;
    while ((e = readdir(d)) != NULL) {
        if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..") || !strcmp(e->d_name, INDEX_FILE)) continue;
        int ok = 0;
        for (int s = 0; s < ix.n_shards && !ok; s++) ok = !strcmp(e->d_name, ix.shards[s].name);
        for (int k = 0; extra && extra[k] && !ok; k++) ok = !strcmp(e->d_name, extra[k]);
        if (!ok) fail_msg("%s: unexpected file %s", dir, e->d_name);
        seen++;
    }
    closedir(d);
    int want = ix.n_shards;
    for (int k = 0; extra && extra[k]; k++) want++;
    assert_int_equal(seen, want);
    docindex_free(&ix);
}

static void test_success_replaces_old_dataset(void **state) {
    (void)state;
    const char *dir = test_tmpdir("prepare_replace_ok");
    char a[600], b[600], out[600];
    snprintf(a, sizeof a, "%s/a", dir);
    snprintf(b, sizeof b, "%s/b", dir);
    snprintf(out, sizeof out, "%s/out", dir);
    make_corpus(a, "alpha", 12);
    make_corpus(b, "beta", 7);
    PrepareStats st;
    assert_int_equal(run_prepare(a, out, 256, &st), 0);
    uint32_t fa = fingerprint(out);
    assert_true(fa != 0);
    assert_true(st.n_shards >= 3);
    expect_only_dataset(out, NULL);
    // another corpus over it: the new dataset, and none of the old shards left
    assert_int_equal(run_prepare(b, out, 256, &st), 0);
    uint32_t fb = fingerprint(out);
    assert_true(fb != 0 && fb != fa);
    assert_int_equal(st.n_files, 7);
    expect_only_dataset(out, NULL);
    // and back again: the same content as the first run gave
    assert_int_equal(run_prepare(a, out, 1 << 20, &st), 0);
    assert_int_equal(fingerprint(out), fa);
    expect_only_dataset(out, NULL);
}

// A run that fails after writing some shards, and one that fails writing its index: the old dataset
// reads back as before, and the failed run's files are gone. The failure is a directory in the way
// of the temporary file the run is about to create (its name holds our pid), as a full disk or an
// I/O error would stop it there.
static void test_failed_run_keeps_old_dataset(void **state) {
    (void)state;
    const char *dir = test_tmpdir("prepare_replace_fail");
    char a[600], b[600], out[600], block[800];
    snprintf(a, sizeof a, "%s/a", dir);
    snprintf(b, sizeof b, "%s/b", dir);
    snprintf(out, sizeof out, "%s/out", dir);
    make_corpus(a, "alpha", 12);
    make_corpus(b, "beta", 9);
    PrepareStats st;
    assert_int_equal(run_prepare(a, out, 256, &st), 0);  // generation 1
    uint32_t fa = fingerprint(out);
    assert_true(fa != 0);

    // the second shard of generation 2 cannot be created
    snprintf(block, sizeof block, "%s/shard-g2-00001.bin.tmp.%ld", out, (long)getpid());
    assert_int_equal(mkdir(block, 0755), 0);
    assert_int_equal(run_prepare(b, out, 256, &st), -1);
    assert_non_null(strstr(bs_errmsg(), "shard-g2-00001.bin.tmp"));
    assert_int_equal(fingerprint(out), fa);
    const char *extra[] = {strrchr(block, '/') + 1, NULL};
    expect_only_dataset(out, extra);  // shard-g2-00000.bin, complete, was removed too
    assert_int_equal(rmdir(block), 0);

    // every shard written, the index cannot be
    snprintf(block, sizeof block, "%s/index.bin.tmp.%ld", out, (long)getpid());
    assert_int_equal(mkdir(block, 0755), 0);
    assert_int_equal(run_prepare(b, out, 256, &st), -1);
    assert_non_null(strstr(bs_errmsg(), "index.bin"));
    assert_int_equal(fingerprint(out), fa);
    extra[0] = strrchr(block, '/') + 1;
    expect_only_dataset(out, extra);
    assert_int_equal(rmdir(block), 0);

    // nothing in the way: the new dataset replaces the old
    assert_int_equal(run_prepare(b, out, 256, &st), 0);
    uint32_t fb = fingerprint(out);
    assert_true(fb != 0 && fb != fa);
    expect_only_dataset(out, NULL);
}

// The same through the writer itself: a run stopped by a bad token, then aborted.
static void test_aborted_writer_keeps_old_dataset(void **state) {
    (void)state;
    const char *dir = test_tmpdir("prepare_replace_abort");
    char out[600];
    snprintf(out, sizeof out, "%s/out", dir);
    Tokenizer *tok;
    assert_int_equal(tokenizer_open_byte(&tok), 0);
    ShardWriter w;
    uint32_t ids[100];
    for (int i = 0; i < 100; i++) ids[i] = (uint32_t)i;
    assert_int_equal(shard_writer_open(&w, out, tok, 64), 0);
    assert_int_equal(shard_writer_add(&w, ids, 100, "x"), 0);
    assert_int_equal(shard_writer_finish(&w), 0);
    uint32_t before = fingerprint(out);
    assert_true(before != 0);
    // three shards complete, one in progress, then a bad token
    assert_int_equal(shard_writer_open(&w, out, tok, 64), 0);
    for (int k = 0; k < 3; k++) assert_int_equal(shard_writer_add(&w, ids, 60, "y"), 0);
    // while it runs, a second writer is kept out of the directory
    ShardWriter w2;
    assert_int_equal(shard_writer_open(&w2, out, tok, 64), -1);
    assert_non_null(strstr(bs_errmsg(), "another prepare is writing"));
    ids[5] = 256;
    assert_int_equal(shard_writer_add(&w, ids, 60, "bad"), -1);
    assert_non_null(strstr(bs_errmsg(), "out of range for vocab 256"));
    shard_writer_abort(&w);
    assert_int_equal(fingerprint(out), before);
    expect_only_dataset(out, NULL);
    // the lock went with the writer
    assert_int_equal(shard_writer_open(&w2, out, tok, 64), 0);
    shard_writer_abort(&w2);
    tokenizer_free(tok);
}

// What killed runs leave - temporary files of every kind, complete shards of a generation no index
// names, shards in the first version's naming - goes at the next run's start; files that are not
// ours stay. An index.bin that is not a bytescale index is never replaced.
static void test_leftovers_of_killed_runs_removed(void **state) {
    (void)state;
    const char *dir = test_tmpdir("prepare_replace_leftovers");
    char a[600], out[600];
    snprintf(a, sizeof a, "%s/a", dir);
    snprintf(out, sizeof out, "%s/out", dir);
    make_corpus(a, "alpha", 5);
    PrepareStats st;
    assert_int_equal(run_prepare(a, out, 256, &st), 0);
    uint32_t fa = fingerprint(out);
    const char *junk[] = {"shard-g7-00000.bin.tmp.123", "index.bin.tmp.99999", "shard-g5-00002.bin", "shard-00001.bin",
                          "shard-00003.bin.tmp.42"};
    for (int k = 0; k < 5; k++) write_text(out, junk[k], "partial");
    write_text(out, "notes.txt", "mine");
    write_text(out, "shard-g3-00000.bin.orig", "mine too");
    assert_int_equal(run_prepare(a, out, 256, &st), 0);
    assert_int_equal(fingerprint(out), fa);
    const char *mine[] = {"notes.txt", "shard-g3-00000.bin.orig", NULL};
    expect_only_dataset(out, mine);
    // the new names are past every shard's generation seen, the removed ones included
    DocIndex ix;
    assert_int_equal(docindex_read(&ix, out), 0);
    assert_string_equal(ix.shards[0].name, "shard-g6-00000.bin");
    docindex_free(&ix);

    // not ours: refused, and left as it was
    char other[600];
    snprintf(other, sizeof other, "%s/other", dir);
    write_text(other, "index.bin", "a user's own file, not a dataset index");
    assert_int_equal(run_prepare(a, other, 256, &st), -1);
    assert_non_null(strstr(bs_errmsg(), "not a bytescale index"));
    char *text;
    size_t n;
    snprintf(other, sizeof other, "%s/other/index.bin", dir);
    assert_int_equal(file_read_all(other, &text, &n), 0);
    assert_string_equal(text, "a user's own file, not a dataset index");
    free(text);
}

// An output inside an input would be read as input by the next run (or this one): refused, whatever
// the spelling, before anything is written.
static void test_output_inside_input_refused(void **state) {
    (void)state;
    const char *dir = test_tmpdir("prepare_replace_nested");
    char a[600], out[700], link[700], elsewhere[600];
    snprintf(a, sizeof a, "%s/a", dir);
    make_corpus(a, "alpha", 3);
    PrepareStats st;
    const char *outs[] = {"%s/a", "%s/a/", "%s/a/out", "%s/a/new/deeper/out", "%s/a/../a/x", "%s/b/../a/y"};
    for (int k = 0; k < 6; k++) {
        snprintf(out, sizeof out, outs[k], dir);
        bs_error_clear();
        if (run_prepare(a, out, 256, &st) != -1) fail_msg("--out %s inside --input %s was accepted", out, a);
        if (!strstr(bs_errmsg(), "is inside the input")) fail_msg("--out %s: %s", out, bs_errmsg());
    }
    struct stat sb;
    snprintf(out, sizeof out, "%s/a/out", dir);
    assert_int_equal(stat(out, &sb), -1);  // nothing created
    // through a symbolic link: a/link -> ../elsewhere, output in elsewhere
    snprintf(elsewhere, sizeof elsewhere, "%s/elsewhere", dir);
    assert_int_equal(make_dirs(elsewhere), 0);
    snprintf(link, sizeof link, "%s/a/link", dir);
    assert_int_equal(symlink("../elsewhere", link), 0);
    snprintf(out, sizeof out, "%s/elsewhere/out", dir);
    assert_int_equal(run_prepare(a, out, 256, &st), -1);
    assert_non_null(strstr(bs_errmsg(), "through the symbolic link"));
    // and a plain sibling is fine
    snprintf(out, sizeof out, "%s/out", dir);
    assert_int_equal(unlink(link), 0);
    assert_int_equal(run_prepare(a, out, 256, &st), 0);
    assert_int_equal(st.n_files, 3);
}

// Symbolic links are followed: a link to a file is that file, a link to a directory is walked, a
// link back up (a loop) is not walked twice; what would be taken but cannot be is an error.
static void test_symlinks_followed(void **state) {
    (void)state;
    const char *dir = test_tmpdir("prepare_replace_links");
    char in[600], path[800], out[600];
    snprintf(in, sizeof in, "%s/in", dir);
    snprintf(out, sizeof out, "%s/out", dir);
    write_text(in, "a.go", "package a\n");
    write_text(dir, "other/b.go", "package b\n");
    write_text(dir, "lib/c.go", "package c\n");
    write_text(dir, "lib/d.txt", "not Go\n");
    snprintf(path, sizeof path, "%s/b.go", in);
    assert_int_equal(symlink("../other/b.go", path), 0);
    PrepareStats st;
    const char *inputs[] = {in};
    PrepareConfig cfg = {.inputs = inputs, .n_inputs = 1, .ext = ".go", .tokenizer = "byte", .out_dir = out,
                         .quiet = 1};
    assert_int_equal(prepare_run(&cfg, &st), 0);
    assert_int_equal(st.n_files, 2);  // the file and the link to the other file
    // a link to a directory, and a loop back to the input itself
    snprintf(path, sizeof path, "%s/lib", in);
    assert_int_equal(symlink("../lib", path), 0);
    snprintf(path, sizeof path, "%s/lib/up", dir);
    assert_int_equal(symlink("../in", path), 0);
    char **files;
    int64_t n;
    assert_int_equal(prepare_list_files(inputs, 1, ".go", &files, &n), 0);
    // in/a.go, in/b.go, in/lib/c.go, and through in/lib/up -> in: nothing again (a loop)
    assert_int_equal(n, 3);
    snprintf(path, sizeof path, "%s/lib/c.go", in);
    assert_string_equal(files[2], path);
    for (int64_t i = 0; i < n; i++) free(files[i]);
    free(files);
    // a dangling link the filter would take: an error naming it; one it would not take: ignored
    snprintf(path, sizeof path, "%s/gone.txt", in);
    assert_int_equal(symlink("nowhere", path), 0);
    assert_int_equal(prepare_run(&cfg, &st), 0);
    snprintf(path, sizeof path, "%s/gone.go", in);
    assert_int_equal(symlink("nowhere", path), 0);
    assert_int_equal(prepare_run(&cfg, &st), -1);
    assert_non_null(strstr(bs_errmsg(), "gone.go: symbolic link to a missing file"));
    assert_int_equal(unlink(path), 0);
    // a FIFO the filter would take cannot be a document: an error, not a silent omission
    snprintf(path, sizeof path, "%s/pipe.go", in);
    assert_int_equal(mkfifo(path, 0644), 0);
    assert_int_equal(prepare_run(&cfg, &st), -1);
    assert_non_null(strstr(bs_errmsg(), "pipe.go: not a regular file"));
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_success_replaces_old_dataset),
        cmocka_unit_test(test_failed_run_keeps_old_dataset),
        cmocka_unit_test(test_aborted_writer_keeps_old_dataset),
        cmocka_unit_test(test_leftovers_of_killed_runs_removed),
        cmocka_unit_test(test_output_inside_input_refused),
        cmocka_unit_test(test_symlinks_followed),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
