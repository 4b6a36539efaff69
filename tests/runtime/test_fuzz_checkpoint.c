// test_fuzz_checkpoint.c: training checkpoints under fuzzing (fuzz_util.h): the container
// (ckpt_load: table, sections, checksums), the settings a resume reads (train_read_config), and a
// full trainer_load into a live trainer, which must either take the checkpoint or stay unchanged.
// ctest: long (hundreds of damaged checkpoints, loaded into a live trainer)
#include "fuzz_util.h"
#include "test_corpus.h"

#include <math.h>

#include "bytescale/checkpoint.h"
#include "bytescale/fileio.h"
#include "bytescale/train.h"

#define DIR "test-tmp/fuzz_checkpoint"

static uint64_t get_u64(const uint8_t *p) {
    uint64_t x = 0;
    for (int i = 0; i < 8; i++) x |= (uint64_t)p[i] << (8 * i);
    return x;
}

// Make a mutant's checksums right again (checkpoint.h: each table entry holds its section's CRC-32,
// the header the table's), so the loaders' range and content checks see it, not only the checksums.
static void repair_checksums(uint8_t *b, size_t n) {
    if (n < CKPT_HEADER_BYTES) return;
    uint32_t count = (uint32_t)b[12] | (uint32_t)b[13] << 8 | (uint32_t)b[14] << 16 | (uint32_t)b[15] << 24;
    if (count > 64 || CKPT_HEADER_BYTES + (size_t)count * CKPT_ENTRY_BYTES > n) return;
    size_t at = CKPT_HEADER_BYTES + (size_t)count * CKPT_ENTRY_BYTES;
    for (uint32_t i = 0; i < count; i++) {
        uint8_t *e = b + CKPT_HEADER_BYTES + (size_t)i * CKPT_ENTRY_BYTES;
        uint64_t size = get_u64(e + CKPT_NAME_MAX);
        if (size > n - at) break;
        fuzz_put_u32(e + CKPT_NAME_MAX + 8, checksum_crc32(0, b + at, size));
        at += size;
    }
    fuzz_put_u32(b + 16, checksum_crc32(0, b + CKPT_HEADER_BYTES, (size_t)count * CKPT_ENTRY_BYTES));
}

// Every other mutant gets its checksums repaired before it is parsed (in place on disk).
static int repaired(const char *path) {
    static int calls;
    if (calls++ % 2 == 0) return 0;
    char *text;
    size_t n;
    if (file_read_all(path, &text, &n) != 0) return -1;
    repair_checksums((uint8_t *)text, n);
    int rc = fuzz_write(path, text, n);
    free(text);
    return rc;
}

static int parse_container(const char *path, void *ctx) {
    (void)ctx;
    Checkpoint c;
    if (repaired(path) != 0 || ckpt_load(&c, path, NULL, 0) != 0) return -1;
    ckpt_free(&c);
    return 0;
}

static int parse_config(const char *path, void *ctx) {
    (void)ctx;
    TrainConfig c;
    if (repaired(path) != 0) return -1;
    return train_read_config(path, &c);
}

static int parse_into_trainer(const char *path, void *ctx) {
    Trainer *t = ctx;
    size_t bytes = t->llama.n_params * sizeof(float);
    float *before = malloc(bytes);
    memcpy(before, t->llama.params, bytes);
    int64_t step = t->step;
    if (repaired(path) != 0) return -1;
    int rc = trainer_load(t, path);
    if (rc != 0 && (t->step != step || memcmp(before, t->llama.params, bytes) != 0))
        fail_msg("a refused checkpoint changed the trainer (%s)", bs_errmsg());
    free(before);
    if (rc == 0) {  // accepted: the state must be finite and trainable
        for (size_t i = 0; i < t->llama.n_params; i++)
            if (!isfinite(t->llama.params[i]) || !isfinite(t->opt.m[i]) || !(t->opt.v[i] >= 0) ||
                !isfinite(t->opt.v[i]))
                fail_msg("an accepted checkpoint holds a state training cannot continue from (element %zu)", i);
    }
    return rc;
}

static void test_fuzz_checkpoints(void **state) {
    (void)state;
    test_tmpdir("fuzz_checkpoint");
    char data[300];
    if (test_corpus_make(DIR, 8, 20, 300, 4, data, sizeof data) != 0) fail_msg("%s", bs_errmsg());
    TrainConfig c = train_defaults();
    snprintf(c.model, sizeof c.model, "tiny");
    snprintf(c.data, sizeof c.data, "%s", data);
    c.tokens = 256;
    c.context = 64;
    c.steps = 2;
    c.quiet = 1;
    Trainer *t = malloc(sizeof *t);
    if (trainer_init(t, &c) != 0) fail_msg("%s", bs_errmsg());
    StepStats st;
    if (trainer_step(t, &st) != 0) fail_msg("%s", bs_errmsg());
    const char *seeds[] = {DIR "/ckpt.bin"};
    if (trainer_save(t, seeds[0]) != 0) fail_msg("%s", bs_errmsg());
    fuzz_run(DIR, "checkpoint container", seeds, 1, 1500, parse_container, NULL);
    fuzz_run(DIR, "checkpoint settings", seeds, 1, 1500, parse_config, NULL);
    fuzz_run(DIR, "checkpoint -> trainer", seeds, 1, 800, parse_into_trainer, t);
    trainer_free(t);
    free(t);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_fuzz_checkpoints),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
