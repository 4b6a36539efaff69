// test_init.c: the initial weights (docs/model.md "Initialization") and the counter-based generator
// under them (rng.h, rng_at / rng_normal_fill). Every shard of every layout (tp 1, 2, 4 x 1 to 4
// stages, equal and random layer splits) holds exactly the whole model's floats, bit for bit; the
// whole model equals a per-element reference written here from rng_at; each matrix's mean and std
// match its init std within sampling error; the generator is deterministic, any slice of a stream
// is the same numbers as the whole, and streams of other keys, seeds and indices are uncorrelated.
#include "test_util.h"

#include <math.h>

#include "bytescale/error.h"
#include "bytescale/llama.h"
#include "bytescale/model.h"
#include "bytescale/rng.h"
#include "nn/llama_params.h"

// tp up to 4 divides n_heads, n_kv_heads, d_ff and vocab_size; 4 layers allow 4 stages.
static ModelConfig shard_config(void) {
    return (ModelConfig){.name = "inittest", .n_layers = 4, .n_heads = 8, .n_kv_heads = 4, .d_model = 32,
                         .head_dim = 8, .d_ff = 48, .vocab_size = 128, .n_experts = 1, .top_k = 1,
                         .rope_theta = 1e4, .norm_eps = 1e-5};
}

// The whole model's weights drawn through llama_shard_init_weights; NULL-free or the test fails.
static float *whole_weights(const ModelConfig *c, uint64_t seed, ParamTensor **table, int *n_tensors, size_t *n) {
    LlamaShard whole = llama_shard_full(c);
    *table = llama_make_table(c, &whole, n_tensors, n);
    if (!*table) fail_msg("%s", bs_errmsg());
    float *w = malloc(*n * sizeof(float));
    if (llama_shard_init_weights(c, &whole, w, seed) != 0) fail_msg("%s", bs_errmsg());
    return w;
}

// The std the model is documented to start from: 0.02, the residual projections 0.02 / sqrt(2 L).
static double documented_std(const char *name, int n_layers) {
    const char *dot = strrchr(name, '.');
    int resid = dot && (!strcmp(dot, ".wo") || !strcmp(dot, ".w_down"));
    return resid ? 0.02 / sqrt(2.0 * n_layers) : 0.02;
}

// One element by the definition in rng.h, alone: the pair of uniforms in (0, 1], Box-Muller, cos for
// an even index and sin for an odd one.
static float reference_normal(uint64_t seed, uint64_t key, uint64_t i, double scale) {
    uint64_t p = i / 2;
    double u1 = (double)((rng_at(seed, key, 2 * p) >> 11) + 1) / 9007199254740992.0;
    double u2 = (double)((rng_at(seed, key, 2 * p + 1) >> 11) + 1) / 9007199254740992.0;
    double r = sqrt(-2.0 * log(u1)), a = 2.0 * M_PI * u2;
    return (float)(scale * r * (i % 2 ? sin(a) : cos(a)));
}

// ---- the model's weights -------------------------------------------------------------------------------

// Tensor k of the whole model (its number in the table is its stream), element by element.
static void test_whole_model_matches_reference(void **state) {
    (void)state;
    ModelConfig c = shard_config();
    ParamTensor *t;
    int nt;
    size_t n;
    float *w = whole_weights(&c, 77, &t, &nt, &n);
    for (int k = 0; k < nt; k++) {
        double std = documented_std(t[k].name, c.n_layers);
        for (size_t j = 0; j < t[k].numel; j++) {
            float want = t[k].ndim == 1 ? 1.0f : reference_normal(77, (uint64_t)k, j, std);
            if (memcmp(&w[t[k].offset + j], &want, sizeof want) != 0)
                fail_msg("%s[%zu] = %.9g, the reference says %.9g", t[k].name, j, w[t[k].offset + j], want);
        }
    }
    // the seed matters: another one changes every matrix
    ParamTensor *t2;
    float *w2 = whole_weights(&c, 78, &t2, &nt, &n);
    for (int k = 0; k < nt; k++)
        if (t[k].ndim == 2) assert_true(memcmp(w + t[k].offset, w2 + t[k].offset, t[k].numel * sizeof(float)) != 0);
    free(w), free(w2), free(t), free(t2);
}

// Check every shard of a layout against the whole model's floats: each run holds exactly the whole
// model's floats at its place, and the shards of a stage's tp ranks together cover the stage's part.
static void check_layout(const ModelConfig *c, const float *whole, size_t n_whole, int tp, int pp,
                         const int *begin, uint64_t seed) {
    unsigned char *seen = calloc(n_whole, 1);
    for (int s = 0; s < pp; s++)
        for (int r = 0; r < tp; r++) {
            LlamaShard sh = {.tp = tp, .tp_rank = r, .layer_begin = begin[s], .layer_end = begin[s + 1],
                             .first = s == 0, .last = s == pp - 1};
            int nt;
            size_t np;
            ParamTensor *t = llama_make_table(c, &sh, &nt, &np);
            ParamRun *runs;
            size_t n_runs;
            if (!t || llama_shard_runs(c, &sh, &runs, &n_runs) != 0) fail_msg("%s", bs_errmsg());
            float *w = malloc(np * sizeof(float));
            for (size_t i = 0; i < np; i++) w[i] = NAN;  // a float the init forgets stays NaN
            if (llama_shard_init_weights(c, &sh, w, seed) != 0) fail_msg("%s", bs_errmsg());
            size_t covered = 0;
            for (size_t i = 0; i < n_runs; i++) {
                if (memcmp(w + runs[i].local, whole + runs[i].full, runs[i].len * sizeof(float)) != 0)
                    fail_msg("tp %d, pp %d, stage %d (layers %d..%d), tp rank %d: run %zu differs from the whole "
                             "model",
                             tp, pp, s, begin[s], begin[s + 1] - 1, r, i);
                for (size_t j = 0; j < runs[i].len; j++) seen[runs[i].full + j] = 1;
                covered += runs[i].len;
            }
            assert_int_equal(covered, np);  // the runs are the whole shard, so no float is left out
            free(w), free(runs), free(t);
        }
    for (size_t i = 0; i < n_whole; i++)
        if (!seen[i]) fail_msg("tp %d, pp %d: float %zu of the whole model is in no shard", tp, pp, i);
    free(seen);
}

static void test_every_layout_gets_the_whole_models_weights(void **state) {
    (void)state;
    ModelConfig c = shard_config();
    ParamTensor *t;
    int nt;
    size_t n;
    float *whole = whole_weights(&c, 5, &t, &nt, &n);
    Rng rng;
    rng_seed(&rng, 11);
    const int tps[3] = {1, 2, 4};
    for (int ti = 0; ti < 3; ti++)
        for (int pp = 1; pp <= 4; pp++) {
            int begin[5];
            for (int s = 0; s <= pp; s++) begin[s] = s * c.n_layers / pp;  // equal stages
            check_layout(&c, whole, n, tps[ti], pp, begin, 5);
            if (pp == 1 || pp == 4) continue;
            for (int trial = 0; trial < 4; trial++) {  // random non-empty stages
                for (int s = 1; s < pp; s++) {
                    int lo = begin[s - 1] + 1, hi = c.n_layers - (pp - s);
                    begin[s] = lo + (int)rng_below(&rng, (uint64_t)(hi - lo + 1));
                }
                check_layout(&c, whole, n, tps[ti], pp, begin, 5);
            }
        }
    free(whole), free(t);
}

// Each matrix of the catalogue's `small` model: mean 0 and its documented std, within 5 standard
// errors (the sample std's is std / sqrt(2 n)); norm gains exactly 1.
static void test_statistics_per_tensor(void **state) {
    (void)state;
    const ModelConfig *c = model_find("small");
    assert_non_null(c);
    ParamTensor *t;
    int nt;
    size_t n;
    float *w = whole_weights(c, 2024, &t, &nt, &n);
    for (int k = 0; k < nt; k++) {
        const float *p = w + t[k].offset;
        double m = (double)t[k].numel, sum = 0, sum2 = 0;
        for (size_t j = 0; j < t[k].numel; j++) sum += p[j], sum2 += (double)p[j] * p[j];
        if (t[k].ndim == 1) {
            assert_true(sum == m && sum2 == m);
            continue;
        }
        double std = documented_std(t[k].name, c->n_layers), mean = sum / m, sd = sqrt(sum2 / m - mean * mean);
        if (fabs(mean) > 5 * std / sqrt(m) || fabs(sd - std) > 5 * std / sqrt(2 * m))
            fail_msg("%s (%zu floats): mean %.3g, std %.5g, want 0 and %.5g", t[k].name, t[k].numel, mean, sd, std);
    }
    free(w), free(t);
}

// ---- the generator ---------------------------------------------------------------------------------------

// The same (seed, key, index) gives the same bits; a slice [a, a + len) of a stream, from any start
// (odd or even) and of any length, is the same floats as the whole stream's.
static void test_generator_slices_and_determinism(void **state) {
    (void)state;
    enum { N = 1001 };
    float all[N], part[N];
    rng_normal_fill(9, 3, 0, N, 1.0, all);
    for (size_t i = 0; i < N; i++) assert_true(all[i] == reference_normal(9, 3, i, 1.0));
    Rng rng;
    rng_seed(&rng, 4);
    for (int trial = 0; trial < 500; trial++) {
        size_t a = rng_below(&rng, N), len = rng_below(&rng, N - a + 1);
        for (size_t i = 0; i < N; i++) part[i] = NAN;
        rng_normal_fill(9, 3, a, len, 1.0, part);
        assert_memory_equal(part, all + a, len * sizeof(float));
        if (a + len < N) assert_true(isnan(part[len]));  // nothing written past the slice
        assert_int_equal(rng_at(9, 3, a), rng_at(9, 3, a));
    }
    // far into a stream (a 70B model's tensor has 2^31 floats) the values are still normal draws
    rng_normal_fill(9, 3, (1ull << 40) + 1, N, 1.0, part);
    double s2 = 0;
    for (size_t i = 0; i < N; i++) s2 += (double)part[i] * part[i];
    assert_true(s2 / N > 0.8 && s2 / N < 1.2);
}

// The sample correlation of two streams' first n normals.
static double correlation(uint64_t seed_a, uint64_t key_a, uint64_t first_a, uint64_t seed_b, uint64_t key_b,
                          uint64_t first_b, size_t n) {
    float *a = malloc(n * sizeof(float)), *b = malloc(n * sizeof(float));
    rng_normal_fill(seed_a, key_a, first_a, n, 1.0, a);
    rng_normal_fill(seed_b, key_b, first_b, n, 1.0, b);
    double sa = 0, sb = 0, saa = 0, sbb = 0, sab = 0;
    for (size_t i = 0; i < n; i++) sa += a[i], sb += b[i], saa += a[i] * a[i], sbb += b[i] * b[i], sab += a[i] * b[i];
    double m = (double)n, cov = sab / m - sa / m * sb / m;
    free(a), free(b);
    return cov / sqrt((saa / m - sa / m * sa / m) * (sbb / m - sb / m * sb / m));
}

// Neighbouring keys, seeds, swapped (seed, key) and a stream shifted by one are uncorrelated (|r|
// within 5 / sqrt(n)); the normals have the moments and the mass within one sigma of N(0, 1); every
// bit of rng_at over consecutive keys (the tensors of a model) is a fair coin.
static void test_generator_independence_and_distribution(void **state) {
    (void)state;
    size_t n = 200000;
    double bound = 5 / sqrt((double)n);
    const uint64_t pairs[][6] = {
        {1, 0, 0, 1, 1, 0},   // neighbouring tensors
        {1, 7, 0, 2, 7, 0},   // neighbouring seeds
        {3, 5, 0, 5, 3, 0},   // seed and key swapped
        {1, 7, 0, 1, 7, 1},   // a stream against itself one element on
        {1, 7, 0, 1, 7, 2},   // ... and one pair on
        {0, 0, 0, 0, 0, 1ull << 32},
    };
    for (size_t i = 0; i < sizeof pairs / sizeof pairs[0]; i++) {
        const uint64_t *q = pairs[i];
        double r = correlation(q[0], q[1], q[2], q[3], q[4], q[5], n);
        if (fabs(r) > bound)
            fail_msg("streams (%llu, %llu, %llu) and (%llu, %llu, %llu): correlation %.4f", (unsigned long long)q[0],
                     (unsigned long long)q[1], (unsigned long long)q[2], (unsigned long long)q[3],
                     (unsigned long long)q[4], (unsigned long long)q[5], r);
    }
    float *z = malloc(n * sizeof(float));
    rng_normal_fill(12, 34, 0, n, 1.0, z);
    double s = 0, s2 = 0, s4 = 0, inside = 0;
    for (size_t i = 0; i < n; i++) s += z[i], s2 += z[i] * z[i], s4 += pow(z[i], 4), inside += fabs(z[i]) < 1;
    double m = (double)n;
    assert_true(fabs(s / m) < 5 / sqrt(m));
    assert_true(fabs(s2 / m - 1) < 5 * sqrt(2 / m));
    assert_true(fabs(s4 / m - 3) < 5 * sqrt(96 / m));                          // var of z^4 is 105 - 9
    assert_true(fabs(inside / m - 0.682689) < 5 * sqrt(0.682689 * 0.317311 / m));
    free(z);
    int ones[64] = {0}, keys = 20000;
    for (int k = 0; k < keys; k++) {
        uint64_t x = rng_at(2024, (uint64_t)k, 0);
        for (int b = 0; b < 64; b++) ones[b] += (int)(x >> b & 1);
    }
    for (int b = 0; b < 64; b++)
        if (fabs(ones[b] - keys / 2.0) > 5 * sqrt(keys / 4.0)) fail_msg("bit %d is 1 for %d of %d keys", b, ones[b], keys);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_whole_model_matches_reference),
        cmocka_unit_test(test_every_layout_gets_the_whole_models_weights),
        cmocka_unit_test(test_statistics_per_tensor),
        cmocka_unit_test(test_generator_slices_and_determinism),
        cmocka_unit_test(test_generator_independence_and_distribution),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
