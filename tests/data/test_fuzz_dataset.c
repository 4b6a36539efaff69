// test_fuzz_dataset.c: a prepared dataset's index and shard files under fuzzing (fuzz_util.h): each
// mutant replaces the file in a copy of a real dataset, which is then opened (every header, size,
// checksum and document range checked) and, when accepted, read end to end.
#include "fuzz_util.h"
#include "test_corpus.h"

#include "bytescale/shard.h"

#define DIR "test-tmp/fuzz_dataset"

typedef struct {
    char dir[256];    // the dataset copy the mutant goes into
    char file[400];   // which of its files the mutant replaces
    int calls;        // every other mutant gets its checksums repaired
} Target;

// Make a mutant's checksums right again (docs/data-format.md: both files carry the CRC-32 of what
// follows the 64-byte header at byte 32 (shard) or 56 (index), and of the header's first 60 bytes at
// byte 60), so the parser's range checks see it and not only its checksum test.
static void repair_checksums(uint8_t *b, size_t n) {
    if (n < 64) return;
    size_t body_crc_at = memcmp(b, "BSINDEX", 7) == 0 ? 56 : 32;
    fuzz_put_u32(b + body_crc_at, checksum_crc32(0, b + 64, n - 64));
    fuzz_put_u32(b + 60, checksum_crc32(0, b, 60));
}

static int parse_dataset(const char *path, void *ctx) {
    Target *t = ctx;
    char *text;
    size_t n;
    if (file_read_all(path, &text, &n) != 0) return -1;
    if (t->calls++ % 2) repair_checksums((uint8_t *)text, n);
    int rc = fuzz_write(t->file, text, n);
    free(text);
    if (rc != 0) return -1;
    Dataset ds;
    if (dataset_open(&ds, t->dir) != 0) return -1;
    // accepted: every document must read back
    uint32_t buf[512];
    for (int64_t d = 0; d < ds.index.n_docs && rc == 0; d++)
        for (int64_t at = 0; at < ds.index.docs[d].len && rc == 0; at += 512) {
            int64_t k = ds.index.docs[d].len - at < 512 ? ds.index.docs[d].len - at : 512;
            rc = dataset_read(&ds, d, at, k, buf);
        }
    dataset_close(&ds);
    return rc;
}

static void test_fuzz_index_and_shards(void **state) {
    (void)state;
    test_tmpdir("fuzz_dataset");
    char data[300];
    if (test_corpus_make(DIR, 12, 5, 400, 9, data, sizeof data) != 0) fail_msg("%s", bs_errmsg());
    // a copy of the dataset to break
    Target t = {0};
    snprintf(t.dir, sizeof t.dir, DIR "/copy");
    char cmd[700];
    snprintf(cmd, sizeof cmd, "rm -rf %s && cp -r %s %s", t.dir, data, t.dir);
    assert_int_equal(system(cmd), 0);
    char index[300], shard[400];
    snprintf(index, sizeof index, "%s/index.bin", data);
    DocIndex ix;  // the first shard's file name, as the index has it
    if (docindex_read(&ix, data) != 0) fail_msg("%s", bs_errmsg());
    snprintf(shard, sizeof shard, "%s/%s", data, ix.shards[0].name);
    const char *seed_index[] = {index}, *seed_shard[] = {shard};

    snprintf(t.file, sizeof t.file, "%s/index.bin", t.dir);
    fuzz_run(DIR, "dataset index", seed_index, 1, 2000, parse_dataset, &t);
    assert_int_equal(system(cmd), 0);  // a fresh copy: the index back
    snprintf(t.file, sizeof t.file, "%s/%s", t.dir, ix.shards[0].name);
    docindex_free(&ix);
    fuzz_run(DIR, "dataset shard", seed_shard, 1, 1500, parse_dataset, &t);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_fuzz_index_and_shards),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
