// test_fuzz_checkpoint.c: training checkpoints under fuzzing (fuzz_util.h): the container
// (ckpt_load: table, sections, checksums), the settings a resume reads (train_read_config), and a
// full trainer_load into a live trainer, which must either take the checkpoint or stay unchanged.
#include "fuzz_util.h"
#include "test_corpus.h"

#include <math.h>

#include "bytescale/checkpoint.h"
#include "bytescale/train.h"

#define DIR "test-tmp/fuzz_checkpoint"

static int parse_container(const char *path, void *ctx) {
    (void)ctx;
    Checkpoint c;
    if (ckpt_load(&c, path, NULL, 0) != 0) return -1;
    ckpt_free(&c);
    return 0;
}

static int parse_config(const char *path, void *ctx) {
    (void)ctx;
    TrainConfig c;
    return train_read_config(path, &c);
}

static int parse_into_trainer(const char *path, void *ctx) {
    Trainer *t = ctx;
    size_t bytes = t->llama.n_params * sizeof(float);
    float *before = malloc(bytes);
    memcpy(before, t->llama.params, bytes);
    int64_t step = t->step;
    int rc = trainer_load(t, path);
    if (rc != 0 && (t->step != step || memcmp(before, t->llama.params, bytes) != 0))
        fail_msg("a refused checkpoint changed the trainer (%s)", bs_errmsg());
    free(before);
    if (rc == 0) {  // accepted: the state must be finite and trainable
        for (size_t i = 0; i < t->llama.n_params; i++)
            if (!isfinite(t->llama.params[i])) fail_msg("an accepted checkpoint holds a non-finite parameter");
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
