// test_shard_read_limits.c: the reader side of a dataset at its limits (issue 8): indexes whose
// numbers overflow an int64 when summed, shards that are directories or FIFOs, an index that is a
// directory, indexes whose documents are all empty (the sampler used to spin forever) or hold no
// labelled token (training would run on nothing).
#include "test_util.h"

#include <sys/stat.h>
#include <unistd.h>

#include "bytescale/error.h"
#include "bytescale/fileio.h"
#include "bytescale/sampler.h"
#include "bytescale/shard.h"
#include "data/format.h"

typedef struct {
    uint64_t n_tokens;  // of the shard
} ShardSpec;

typedef struct {
    uint32_t shard;
    uint64_t offset, len;
} DocSpec;

// Write <dir>/index.bin: byte tokenizer, the given shards (named s0.bin, s1.bin, ...) and documents,
// with valid checksums, so only the numbers themselves are wrong. header_tokens: the header's total.
static void write_index(const char *dir, const ShardSpec *sh, int n_sh, const DocSpec *docs, int n_docs,
                        uint64_t header_tokens) {
    size_t body = (size_t)n_sh * SHARD_ENTRY_BYTES + (size_t)n_docs * DOC_ENTRY_BYTES;
    uint8_t *b = calloc(1, HEADER_BYTES + body);
    assert_non_null(b);
    memcpy(b, INDEX_MAGIC, 8);
    put_u32(b + IX_VERSION, INDEX_VERSION);
    put_u32(b + IX_TOKENIZER, TOKENIZER_BYTE);
    put_u32(b + IX_VOCAB, 256);
    put_u32(b + IX_WIDTH, 1);
    put_u32(b + IX_NSHARDS, (uint32_t)n_sh);
    put_u32(b + IX_FLAGS, 0);
    put_u64(b + IX_NDOCS, (uint64_t)n_docs);
    put_u64(b + IX_NTOKENS, header_tokens);
    put_u64(b + IX_BODY_BYTES, body);
    uint8_t *p = b + HEADER_BYTES;
    for (int s = 0; s < n_sh; s++, p += SHARD_ENTRY_BYTES) {
        snprintf((char *)p, SHARD_NAME_MAX, "s%d.bin", s);
        put_u64(p + 48, sh[s].n_tokens);
    }
    for (int d = 0; d < n_docs; d++, p += DOC_ENTRY_BYTES) {
        put_u32(p, docs[d].shard);
        put_u64(p + 8, docs[d].offset);
        put_u64(p + 16, docs[d].len);
    }
    put_u32(b + IX_BODY_CRC, checksum_crc32(0, b + HEADER_BYTES, body));
    put_u32(b + HEADER_CRC_AT, checksum_crc32(0, b, HEADER_CRC_AT));
    char path[700];
    snprintf(path, sizeof path, "%s/%s", dir, INDEX_FILE);
    assert_int_equal(file_write_atomic(path, b, HEADER_BYTES + body), 0);
    free(b);
}

static void expect_index_refused(const char *dir, const char *what) {
    DocIndex ix;
    assert_int_equal(docindex_read(&ix, dir), -1);
    if (!strstr(bs_errmsg(), what)) fail_msg("expected '%s' in: %s", what, bs_errmsg());
}

// Token counts whose sums pass INT64_MAX: refused with a message, not a signed overflow (UBSan
// reported src/data/shard_read.c here).
static void test_sums_that_overflow_are_refused(void **state) {
    (void)state;
    const char *dir = test_tmpdir("data_read_limits_sums");
    const uint64_t big = (uint64_t)1 << 62;
    // two shards of 2^62 tokens each: their bases overflow
    ShardSpec two[2] = {{big}, {big}};
    DocSpec d0[1] = {{0, 0, 1}};
    write_index(dir, two, 2, d0, 1, 0);
    expect_index_refused(dir, "hold more than 9223372036854775807 tokens");
    // one shard of 2^62 + 2^61 tokens and two documents covering it: their lengths sum past INT64_MAX
    uint64_t n = big + (big >> 1);
    ShardSpec one[1] = {{n}};
    DocSpec overlap[2] = {{0, 0, n}, {0, 0, n}};
    write_index(dir, one, 1, overlap, 2, n);
    expect_index_refused(dir, "documents 0 to 1 hold more than 9223372036854775807 tokens");
    // a document whose offset + length would overflow in the message
    DocSpec past[1] = {{0, (uint64_t)INT64_MAX, (uint64_t)INT64_MAX}};
    write_index(dir, one, 1, past, 1, n);
    expect_index_refused(dir, "index points past the end of shard 0");
}

// A shard file with the given header numbers and `payload` zero bytes, checksums valid.
static void write_shard(const char *dir, const char *name, uint64_t n_tokens, uint32_t width, uint32_t vocab,
                        size_t payload) {
    uint8_t *b = calloc(1, HEADER_BYTES + payload);
    assert_non_null(b);
    memcpy(b, SHARD_MAGIC, 8);
    put_u32(b + SH_VERSION, SHARD_VERSION);
    put_u32(b + SH_TOKENIZER, TOKENIZER_BYTE);
    put_u32(b + SH_VOCAB, vocab);
    put_u32(b + SH_WIDTH, width);
    put_u64(b + SH_NTOKENS, n_tokens);
    put_u32(b + SH_CRC, checksum_crc32(0, b + HEADER_BYTES, payload));
    put_u32(b + HEADER_CRC_AT, checksum_crc32(0, b, HEADER_CRC_AT));
    char path[700];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    assert_int_equal(file_write_atomic(path, b, HEADER_BYTES + payload), 0);
    free(b);
}

static void test_shards_that_are_not_files_are_refused(void **state) {
    (void)state;
    const char *dir = test_tmpdir("data_read_limits_shards");
    ShardSpec one[1] = {{4}};
    DocSpec d[1] = {{0, 0, 4}};
    write_index(dir, one, 1, d, 1, 4);
    char shard[700];
    snprintf(shard, sizeof shard, "%s/s0.bin", dir);
    Dataset ds;
    // a directory in the shard's place
    assert_int_equal(mkdir(shard, 0755), 0);
    assert_int_equal(dataset_open(&ds, dir), -1);
    if (!strstr(bs_errmsg(), "shard 0 is a directory, not a regular file")) fail_msg("%s", bs_errmsg());
    rmdir(shard);
    // a FIFO in the shard's place: refused at once (opening it used to wait for a writer forever)
    assert_int_equal(mkfifo(shard, 0600), 0);
    assert_int_equal(dataset_open(&ds, dir), -1);
    if (!strstr(bs_errmsg(), "shard 0 is a FIFO, not a regular file")) fail_msg("%s", bs_errmsg());
    unlink(shard);
    // the index file itself a directory: named as one, not "out of memory allocating 2^63 bytes"
    char index[700];
    snprintf(index, sizeof index, "%s/%s", dir, INDEX_FILE);
    unlink(index);
    assert_int_equal(mkdir(index, 0755), 0);
    DocIndex ix;
    assert_int_equal(docindex_read(&ix, dir), -1);
    if (!strstr(bs_errmsg(), "index.bin: is a directory")) fail_msg("%s", bs_errmsg());
    rmdir(index);
}

// A shard whose header claims 2^62 tokens of 4 bytes: HEADER_BYTES + n * width wraps around to the
// size of a bare header, so the dataset used to open and reads would run off the mapping.
static void test_shard_token_count_that_wraps_is_refused(void **state) {
    (void)state;
    const char *dir = test_tmpdir("data_read_limits_wrap");
    // 2^62 tokens x 4 bytes = 2^64: HEADER_BYTES + n * width wraps to 64, the size of a header alone
    const uint64_t n = (uint64_t)1 << 62;
    ShardSpec one[1] = {{n}};
    DocSpec d[1] = {{0, 0, 1}};
    write_index(dir, one, 1, d, 1, n);
    // the index says 4-byte tokens: a vocab > 65536
    char index[700];
    snprintf(index, sizeof index, "%s/%s", dir, INDEX_FILE);
    char *data;
    size_t size;
    assert_int_equal(file_read_all(index, &data, &size), 0);
    uint8_t *b = (uint8_t *)data;
    put_u32(b + IX_VOCAB, 100000);
    put_u32(b + IX_WIDTH, 4);
    put_u32(b + HEADER_CRC_AT, checksum_crc32(0, b, HEADER_CRC_AT));
    assert_int_equal(file_write_atomic(index, b, size), 0);
    free(data);
    write_shard(dir, "s0.bin", n, 4, 100000, 0);
    Dataset ds;
    assert_int_equal(dataset_open(&ds, dir), -1);
    if (!strstr(bs_errmsg(), "more than any file holds")) fail_msg("%s", bs_errmsg());
}

// Every document empty while the shards hold tokens: the sampler used to loop forever looking for a
// token; now sampler_init refuses, and so does docindex_check_trainable.
static void test_all_empty_documents_are_refused(void **state) {
    (void)state;
    const char *dir = test_tmpdir("data_read_limits_empty");
    ShardSpec one[1] = {{10}};
    DocSpec empty[3] = {{0, 0, 0}, {0, 5, 0}, {0, 10, 0}};
    write_index(dir, one, 1, empty, 3, 10);
    DocIndex ix;
    assert_int_equal(docindex_read(&ix, dir), 0);
    Sampler s;
    assert_int_equal(sampler_init(&s, &ix, 1), -1);
    if (!strstr(bs_errmsg(), "all 3 documents")) fail_msg("%s", bs_errmsg());
    sampler_free(&s);
    assert_int_equal(docindex_check_trainable(&ix), -1);
    if (!strstr(bs_errmsg(), "all 3 documents are empty")) fail_msg("%s", bs_errmsg());
    docindex_free(&ix);
}

// Documents of one token each: tokens to sample but no next token to predict.
static void test_no_labelled_token_is_refused(void **state) {
    (void)state;
    const char *dir = test_tmpdir("data_read_limits_labels");
    ShardSpec one[1] = {{3}};
    DocSpec singles[4] = {{0, 0, 1}, {0, 1, 0}, {0, 1, 1}, {0, 2, 1}};
    write_index(dir, one, 1, singles, 4, 3);
    DocIndex ix;
    assert_int_equal(docindex_read(&ix, dir), 0);
    assert_int_equal(docindex_check_trainable(&ix), -1);
    if (!strstr(bs_errmsg(), "no labelled token")) fail_msg("%s", bs_errmsg());
    docindex_free(&ix);
    // one document of two tokens is enough
    DocSpec pair[2] = {{0, 0, 1}, {0, 1, 2}};
    write_index(dir, one, 1, pair, 2, 3);
    assert_int_equal(docindex_read(&ix, dir), 0);
    if (docindex_check_trainable(&ix) != 0) fail_msg("%s", bs_errmsg());
    docindex_free(&ix);
    // no documents at all
    DocIndex none;
    memset(&none, 0, sizeof none);
    snprintf(none.dir, sizeof none.dir, "memory");
    assert_int_equal(docindex_check_trainable(&none), -1);
    if (!strstr(bs_errmsg(), "no documents")) fail_msg("%s", bs_errmsg());
}

// An index read through a pipe (a FIFO with a writer): read as a stream, whatever st_size says.
static void test_index_through_a_fifo(void **state) {
    (void)state;
    const char *dir = test_tmpdir("data_read_limits_fifo");
    ShardSpec one[1] = {{3}};
    DocSpec pair[1] = {{0, 0, 3}};
    write_index(dir, one, 1, pair, 1, 3);
    char index[700], fifo[700], cmd[1600];
    snprintf(index, sizeof index, "%s/%s", dir, INDEX_FILE);
    snprintf(fifo, sizeof fifo, "%s/index.fifo", dir);
    assert_int_equal(mkfifo(fifo, 0600), 0);
    snprintf(cmd, sizeof cmd, "cat '%s' > '%s' &", index, fifo);
    assert_int_equal(system(cmd), 0);
    DocIndex ix;
    if (docindex_read(&ix, fifo) != 0) fail_msg("%s", bs_errmsg());
    assert_int_equal(ix.n_docs, 1);
    assert_int_equal(ix.docs[0].len, 3);
    docindex_free(&ix);
    unlink(fifo);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_sums_that_overflow_are_refused),
        cmocka_unit_test(test_shards_that_are_not_files_are_refused),
        cmocka_unit_test(test_shard_token_count_that_wraps_is_refused),
        cmocka_unit_test(test_all_empty_documents_are_refused),
        cmocka_unit_test(test_no_labelled_token_is_refused),
        cmocka_unit_test(test_index_through_a_fifo),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
