// test_checkpoint.c: checkpoint files round-trip bit-exactly and every kind of damage is refused
// with a message naming the file and the problem.
#include "test_util.h"

#include <dirent.h>

#include "bytescale/checkpoint.h"
#include "bytescale/error.h"
#include "bytescale/fileio.h"
#include "bytescale/llama.h"
#include "bytescale/model.h"
#include "bytescale/optim.h"
#include "bytescale/rng.h"

enum { NPAR = 40 };

// What a trainer stores, in miniature.
typedef struct {
    char config[64];
    float params[NPAR], adam_m[NPAR], adam_v[NPAR];
    int64_t step, data_pos;
    Rng rng;
} State;

static void make_state(State *s, uint64_t seed) {
    memset(s, 0, sizeof *s);
    snprintf(s->config, sizeof s->config, "{\"model\": \"tiny\", \"seed\": %llu}", (unsigned long long)seed);
    rng_seed(&s->rng, seed);
    for (int i = 0; i < NPAR; i++) {
        s->params[i] = (float)rng_normal(&s->rng);
        s->adam_m[i] = (float)rng_normal(&s->rng);
        s->adam_v[i] = (float)rng_uniform(&s->rng);
    }
    s->step = 1234;
    s->data_pos = 987654321012345;
}

static int save_state(const char *path, const State *s) {
    CkptBlob blobs[] = {
        {"config", s->config, strlen(s->config)},
        {"params", s->params, sizeof s->params},
        {"adam_m", s->adam_m, sizeof s->adam_m},
        {"adam_v", s->adam_v, sizeof s->adam_v},
        {"step", &s->step, sizeof s->step},
        {"data_pos", &s->data_pos, sizeof s->data_pos},
        {"rng", &s->rng, sizeof s->rng},
        {"empty", NULL, 0},
    };
    return ckpt_save(path, blobs, (int)(sizeof blobs / sizeof blobs[0]));
}

static const char *const REQUIRED[] = {"params", "adam_m", "adam_v", "step", "data_pos", "rng"};
enum { N_REQUIRED = 6 };

static void write_bytes(const char *path, const void *data, size_t n) {
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    assert_int_equal(fwrite(data, 1, n, f), n);
    fclose(f);
}

// Load must fail and the message must contain the path and `what`.
static void expect_refused(const char *path, const char *what) {
    Checkpoint c;
    int rc = ckpt_load(&c, path, REQUIRED, N_REQUIRED);
    if (rc == 0) fail_msg("%s loaded, expected an error containing \"%s\"", path, what);
    if (!strstr(bs_errmsg(), path) || !strstr(bs_errmsg(), what))
        fail_msg("error \"%s\" does not name %s and \"%s\"", bs_errmsg(), path, what);
    assert_null(c.data);
    assert_null(c.entries);
}

static void test_round_trip_is_bit_exact(void **state) {
    (void)state;
    const char *dir = test_tmpdir("nn_ckpt_roundtrip");
    char path[600];
    snprintf(path, sizeof path, "%s/ckpt.bin", dir);
    State a, b;
    make_state(&a, 7);
    assert_int_equal(save_state(path, &a), 0);
    // overwrite with a different state: the rename replaces the file whole
    make_state(&a, 8);
    assert_int_equal(save_state(path, &a), 0);

    Checkpoint c;
    assert_int_equal(ckpt_load(&c, path, REQUIRED, N_REQUIRED), 0);
    memset(&b, 0, sizeof b);
    const void *cfg;
    uint64_t cfg_n;
    assert_int_equal(ckpt_find(&c, "config", &cfg, &cfg_n), 0);
    assert_int_equal(cfg_n, strlen(a.config));
    memcpy(b.config, cfg, cfg_n);
    assert_int_equal(ckpt_read(&c, "params", b.params, sizeof b.params), 0);
    assert_int_equal(ckpt_read(&c, "adam_m", b.adam_m, sizeof b.adam_m), 0);
    assert_int_equal(ckpt_read(&c, "adam_v", b.adam_v, sizeof b.adam_v), 0);
    assert_int_equal(ckpt_read(&c, "step", &b.step, sizeof b.step), 0);
    assert_int_equal(ckpt_read(&c, "data_pos", &b.data_pos, sizeof b.data_pos), 0);
    assert_int_equal(ckpt_read(&c, "rng", &b.rng, sizeof b.rng), 0);
    assert_memory_equal(&a, &b, sizeof a);
    // the random stream resumes exactly where it was
    for (int i = 0; i < 10; i++) assert_int_equal(rng_next(&a.rng), rng_next(&b.rng));
    assert_true(ckpt_has(&c, "empty"));
    assert_false(ckpt_has(&c, "nope"));
    // a size mismatch and an unknown section are refused by name
    assert_int_equal(ckpt_read(&c, "params", b.params, sizeof b.params - 4), -1);
    assert_non_null(strstr(bs_errmsg(), "\"params\" has 160 bytes, expected 156"));
    assert_int_equal(ckpt_read(&c, "nope", b.params, 4), -1);
    assert_non_null(strstr(bs_errmsg(), "no section \"nope\""));
    ckpt_free(&c);

    // nothing but the checkpoint is left in the directory (no temp files)
    DIR *d = opendir(dir);
    assert_non_null(d);
    int files = 0;
    for (struct dirent *e; (e = readdir(d));)
        if (e->d_name[0] != '.') files++, assert_string_equal(e->d_name, "ckpt.bin");
    closedir(d);
    assert_int_equal(files, 1);
}

// The byte layout docs/model.md and checkpoint.h promise, read back by hand.
static void test_byte_layout(void **state) {
    (void)state;
    const char *dir = test_tmpdir("nn_ckpt_layout");
    char path[600];
    snprintf(path, sizeof path, "%s/ckpt.bin", dir);
    uint8_t payload[5] = {1, 2, 3, 4, 5};
    CkptBlob blobs[2] = {{"ab", payload, 5}, {"c", payload + 1, 2}};
    assert_int_equal(ckpt_save(path, blobs, 2), 0);
    char *data;
    size_t n;
    assert_int_equal(file_read_all(path, &data, &n), 0);
    const uint8_t *d = (const uint8_t *)data;
    assert_int_equal(n, 24 + 2 * 80 + 5 + 2);
    assert_memory_equal(d, "BSCKPT\r\n", 8);
    assert_int_equal(d[8] | d[9] << 8, 1);    // version, little-endian
    assert_int_equal(d[12] | d[13] << 8, 2);  // count
    assert_string_equal((const char *)d + 24, "ab");
    assert_int_equal(d[24 + 64], 5);  // size of "ab"
    uint32_t crc = (uint32_t)d[24 + 72] | (uint32_t)d[24 + 73] << 8 | (uint32_t)d[24 + 74] << 16 |
                   (uint32_t)d[24 + 75] << 24;
    assert_int_equal(crc, checksum_crc32(0, payload, 5));
    assert_string_equal((const char *)d + 104, "c");
    assert_memory_equal(d + 184, payload, 5);
    assert_memory_equal(d + 189, payload + 1, 2);
    uint32_t tcrc = (uint32_t)d[16] | (uint32_t)d[17] << 8 | (uint32_t)d[18] << 16 | (uint32_t)d[19] << 24;
    assert_int_equal(tcrc, checksum_crc32(0, d + 24, 160));
    free(data);
}

static void test_truncation_at_every_length_is_refused(void **state) {
    (void)state;
    const char *dir = test_tmpdir("nn_ckpt_trunc");
    char path[600], cut[600];
    snprintf(path, sizeof path, "%s/ckpt.bin", dir);
    snprintf(cut, sizeof cut, "%s/cut.bin", dir);
    State s;
    make_state(&s, 9);
    assert_int_equal(save_state(path, &s), 0);
    char *data;
    size_t n;
    assert_int_equal(file_read_all(path, &data, &n), 0);
    // every length: inside the header, the table, and each section
    for (size_t len = 0; len < n; len++) {
        write_bytes(cut, data, len);
        char what[64];
        snprintf(what, sizeof what, "truncated at byte %zu", len);
        expect_refused(cut, what);
    }
    // and one byte too many
    char *longer = malloc(n + 1);
    memcpy(longer, data, n);
    longer[n] = 0;
    write_bytes(cut, longer, n + 1);
    expect_refused(cut, "trailing data");
    free(longer);
    free(data);
}

static void test_corruption_is_refused(void **state) {
    (void)state;
    const char *dir = test_tmpdir("nn_ckpt_corrupt");
    char path[600], bad[600];
    snprintf(path, sizeof path, "%s/ckpt.bin", dir);
    snprintf(bad, sizeof bad, "%s/bad.bin", dir);
    State s;
    make_state(&s, 10);
    assert_int_equal(save_state(path, &s), 0);
    char *data;
    size_t n;
    assert_int_equal(file_read_all(path, &data, &n), 0);
    Checkpoint c;
    assert_int_equal(ckpt_load(&c, path, NULL, 0), 0);

    // a flipped byte anywhere in a section's data names that section (first, middle, last byte)
    for (int i = 0; i < c.n; i++) {
        if (c.entries[i].size == 0) continue;
        uint64_t at[3] = {0, c.entries[i].size / 2, c.entries[i].size - 1};
        for (int k = 0; k < 3; k++) {
            data[c.entries[i].offset + at[k]] ^= 0x10;
            write_bytes(bad, data, n);
            char what[96];
            snprintf(what, sizeof what, "checksum mismatch in section \"%s\"", c.entries[i].name);
            expect_refused(bad, what);
            data[c.entries[i].offset + at[k]] ^= 0x10;
        }
    }
    // a flipped byte in the table (a section's name, a size, a checksum) is caught by its checksum
    size_t table_bytes[3] = {24 + 3, 24 + 80 + 64, 24 + 2 * 80 + 72};
    for (int k = 0; k < 3; k++) {
        data[table_bytes[k]] ^= 0x01;
        write_bytes(bad, data, n);
        expect_refused(bad, "checksum mismatch in the section table");
        data[table_bytes[k]] ^= 0x01;
    }
    // wrong magic
    data[0] = 'X';
    write_bytes(bad, data, n);
    expect_refused(bad, "bad magic");
    data[0] = 'B';
    // a version from the future
    data[8] = 2;
    write_bytes(bad, data, n);
    expect_refused(bad, "unknown checkpoint version 2");
    data[8] = 1;
    // the intact bytes still load (the test's edits were undone)
    write_bytes(bad, data, n);
    Checkpoint ok;
    assert_int_equal(ckpt_load(&ok, bad, REQUIRED, N_REQUIRED), 0);
    ckpt_free(&ok);
    ckpt_free(&c);
    free(data);
    expect_refused("test-tmp/nn_ckpt_corrupt/missing.bin", "cannot open");
}

static void test_missing_required_section_is_refused(void **state) {
    (void)state;
    const char *dir = test_tmpdir("nn_ckpt_required");
    char path[600];
    snprintf(path, sizeof path, "%s/ckpt.bin", dir);
    State s;
    make_state(&s, 11);
    CkptBlob blobs[] = {{"params", s.params, sizeof s.params}, {"step", &s.step, sizeof s.step}};
    assert_int_equal(ckpt_save(path, blobs, 2), 0);
    expect_refused(path, "missing required section \"adam_m\"");
}

static void test_save_refuses_bad_names(void **state) {
    (void)state;
    const char *dir = test_tmpdir("nn_ckpt_names");
    char path[600], long_name[100];
    snprintf(path, sizeof path, "%s/ckpt.bin", dir);
    int x = 1;
    CkptBlob dup[2] = {{"a", &x, 4}, {"a", &x, 4}};
    assert_int_equal(ckpt_save(path, dup, 2), -1);
    assert_non_null(strstr(bs_errmsg(), "\"a\" given twice"));
    memset(long_name, 'n', sizeof long_name - 1);
    long_name[sizeof long_name - 1] = 0;
    CkptBlob lng[1] = {{long_name, &x, 4}};
    assert_int_equal(ckpt_save(path, lng, 1), -1);
    CkptBlob empty[1] = {{"", &x, 4}};
    assert_int_equal(ckpt_save(path, empty, 1), -1);
    // none of the refused saves left a file behind
    FILE *f = fopen(path, "rb");
    assert_null(f);
    // a directory that does not exist: an error naming the path, not a crash
    assert_int_equal(ckpt_save("test-tmp/nn_ckpt_names/no/such/dir/c.bin", dup, 1), -1);
    assert_non_null(strstr(bs_errmsg(), "no/such/dir"));
}

// ---- exact resume of training ----------------------------------------------------------------------

// A trainer in miniature (not train.h's Trainer): model, optimizer, schedule, clipping, and a data
// stream driven by an rng.
typedef struct {
    Llama m;
    AdamW opt;
    Rng data_rng;
    int64_t step;
} MiniTrainer;

static void mini_init(MiniTrainer *tr) {
    const ModelConfig *cfg = model_find("tiny");
    assert_non_null(cfg);
    assert_int_equal(llama_init(&tr->m, cfg, 32), 0);
    llama_init_weights(&tr->m, 5);
    DecayRange *r = malloc(sizeof(DecayRange) * (size_t)tr->m.n_tensors);
    llama_decay_ranges(&tr->m, r);
    AdamWConfig oc = adamw_defaults();
    assert_int_equal(adamw_init(&tr->opt, &oc, 0, tr->m.n_params, r, tr->m.n_tensors), 0);
    free(r);
    rng_seed(&tr->data_rng, 77);
    tr->step = 0;
}

static void mini_free(MiniTrainer *tr) {
    llama_free(&tr->m);
    adamw_free(&tr->opt);
}

static void mini_step(MiniTrainer *tr) {
    int32_t tok[32], tgt[32], pos[32], seg[32];
    for (int i = 0; i < 32; i++) tok[i] = (int32_t)rng_below(&tr->data_rng, 256);
    for (int i = 0; i < 32; i++) {  // two documents of 16 tokens
        tgt[i] = i % 16 == 15 ? -1 : tok[i + 1];
        pos[i] = i % 16;
        seg[i] = i / 16;
    }
    MicroBatch mb = {tok, tgt, pos, seg, 32};
    llama_zero_grad(&tr->m);
    double loss;
    assert_int_equal(llama_forward_backward(&tr->m, &mb, 1.0f / 30, &loss, NULL), 0);
    float clip = grad_clip_scale(grad_sumsq(tr->m.grads, tr->m.n_params), 0.5, NULL);
    LrSchedule s = {.max_lr = 1e-2, .min_lr = 1e-3, .warmup_steps = 2, .total_steps = 6};
    adamw_step(&tr->opt, tr->m.params, tr->m.grads, (float)lr_schedule(&s, tr->step), clip);
    tr->step++;
}

static int mini_save(MiniTrainer *tr, const char *path) {
    size_t n = tr->m.n_params * sizeof(float);
    CkptBlob blobs[] = {
        {"config", &tr->m.cfg, sizeof tr->m.cfg}, {"params", tr->m.params, n},
        {"adam_m", tr->opt.m, n},                 {"adam_v", tr->opt.v, n},
        {"adam_t", &tr->opt.t, sizeof tr->opt.t}, {"step", &tr->step, sizeof tr->step},
        {"rng", &tr->data_rng, sizeof tr->data_rng},
    };
    return ckpt_save(path, blobs, 7);
}

static void mini_load(MiniTrainer *tr, const char *path) {
    static const char *const req[] = {"params", "adam_m", "adam_v", "adam_t", "step", "rng"};
    Checkpoint c;
    assert_int_equal(ckpt_load(&c, path, req, 6), 0);
    size_t n = tr->m.n_params * sizeof(float);
    assert_int_equal(ckpt_read(&c, "params", tr->m.params, n), 0);
    assert_int_equal(ckpt_read(&c, "adam_m", tr->opt.m, n), 0);
    assert_int_equal(ckpt_read(&c, "adam_v", tr->opt.v, n), 0);
    assert_int_equal(ckpt_read(&c, "adam_t", &tr->opt.t, sizeof tr->opt.t), 0);
    assert_int_equal(ckpt_read(&c, "step", &tr->step, sizeof tr->step), 0);
    assert_int_equal(ckpt_read(&c, "rng", &tr->data_rng, sizeof tr->data_rng), 0);
    ckpt_free(&c);
}

// Six steps straight through, or three steps, a checkpoint, a fresh process state (different
// initial weights, so nothing carries over by accident), a load, and three more: bit-identical.
static void test_exact_resume_of_training(void **state) {
    (void)state;
    const char *dir = test_tmpdir("nn_ckpt_resume");
    char path[600];
    snprintf(path, sizeof path, "%s/ckpt.bin", dir);
    MiniTrainer a, b;
    mini_init(&a);
    for (int i = 0; i < 6; i++) mini_step(&a);

    mini_init(&b);
    for (int i = 0; i < 3; i++) mini_step(&b);
    assert_int_equal(mini_save(&b, path), 0);
    mini_free(&b);
    mini_init(&b);
    llama_init_weights(&b.m, 999);
    mini_load(&b, path);
    for (int i = 0; i < 3; i++) mini_step(&b);

    assert_int_equal(b.step, 6);
    assert_int_equal(b.opt.t, 6);
    assert_memory_equal(a.m.params, b.m.params, a.m.n_params * sizeof(float));
    assert_memory_equal(a.opt.m, b.opt.m, a.m.n_params * sizeof(float));
    assert_memory_equal(a.opt.v, b.opt.v, a.m.n_params * sizeof(float));
    // and training did move the weights
    MiniTrainer fresh;
    mini_init(&fresh);
    assert_true(memcmp(fresh.m.params, a.m.params, a.m.n_params * sizeof(float)) != 0);
    mini_free(&fresh);
    mini_free(&a);
    mini_free(&b);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_round_trip_is_bit_exact),
        cmocka_unit_test(test_byte_layout),
        cmocka_unit_test(test_truncation_at_every_length_is_refused),
        cmocka_unit_test(test_corruption_is_refused),
        cmocka_unit_test(test_missing_required_section_is_refused),
        cmocka_unit_test(test_save_refuses_bad_names),
        cmocka_unit_test(test_exact_resume_of_training),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
