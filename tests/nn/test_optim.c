// test_optim.c: AdamW against a reference written out in double, sharding, weight decay ranges,
// gradient clipping and the learning-rate schedule.
#include "test_util.h"

#include <math.h>

#include "bytescale/error.h"
#include "bytescale/optim.h"
#include "bytescale/rng.h"

enum { N = 7 };

// The AdamW update of optim.h, step by step in double: the reference the float code must follow.
typedef struct {
    double p[N], m[N], v[N];
} RefState;

static void ref_step(RefState *s, const float *g, int t, double lr, double scale, const int *decay,
                     const AdamWConfig *c) {
    for (int i = 0; i < N; i++) {
        double gi = g[i] * scale;
        s->m[i] = c->beta1 * s->m[i] + (1 - c->beta1) * gi;
        s->v[i] = c->beta2 * s->v[i] + (1 - c->beta2) * gi * gi;
        double mhat = s->m[i] / (1 - pow(c->beta1, t)), vhat = s->v[i] / (1 - pow(c->beta2, t));
        s->p[i] -= lr * (mhat / (sqrt(vhat) + c->eps) + (decay[i] ? c->weight_decay * s->p[i] : 0));
    }
}

static void test_adamw_matches_reference(void **state) {
    (void)state;
    AdamWConfig cfg = {.beta1 = 0.9, .beta2 = 0.95, .eps = 1e-8, .weight_decay = 0.1};
    // elements 0..3 decay (a matrix), 4..5 do not (a norm gain), 6 decays again
    DecayRange ranges[3] = {{4, 6, 0}, {0, 4, 1}, {6, 7, 1}};  // any order
    int decay[N] = {1, 1, 1, 1, 0, 0, 1};
    float p[N] = {0.5f, -1.25f, 2.0f, 0.0f, 3.0f, -0.75f, 1e-3f};
    RefState ref = {0};
    for (int i = 0; i < N; i++) ref.p[i] = p[i];
    AdamW opt;
    assert_int_equal(adamw_init(&opt, &cfg, 0, N, ranges, 3), 0);
    Rng rng;
    rng_seed(&rng, 11);
    for (int t = 1; t <= 20; t++) {
        float g[N];
        for (int i = 0; i < N; i++) g[i] = (float)rng_normal(&rng);
        double lr = 1e-2 * t, scale = t % 3 == 0 ? 0.5 : 1.0;  // changing lr and a clipping factor
        adamw_step(&opt, p, g, (float)lr, (float)scale);
        ref_step(&ref, g, t, lr, scale, decay, &cfg);
        for (int i = 0; i < N; i++) assert_close(p[i], ref.p[i], 1e-5, 1e-6);
    }
    assert_int_equal(opt.t, 20);
    adamw_free(&opt);
}

// Hand-derivable cases: (a) with zero gradients the moments stay 0, so the update is the decay
// alone, p *= 1 - lr * wd on decayed elements and nothing on the others; (b) on the first step
// mhat = g and vhat = g^2, so the Adam part is lr * g / (|g| + eps) = lr * sign(g) for |g| >> eps.
static void test_adamw_decay_and_first_step(void **state) {
    (void)state;
    AdamWConfig cfg = adamw_defaults();
    DecayRange ranges[2] = {{0, 3, 1}, {3, 5, 0}};
    float p[5] = {1, -2, 4, 1, -2}, g0[5] = {0};
    AdamW opt;
    assert_int_equal(adamw_init(&opt, &cfg, 0, 5, ranges, 2), 0);
    adamw_step(&opt, p, g0, 0.5f, 1.0f);
    float want[5] = {1 * 0.95f, -2 * 0.95f, 4 * 0.95f, 1, -2};  // 1 - 0.5 * 0.1
    for (int i = 0; i < 5; i++) assert_close(p[i], want[i], 1e-6, 0);
    adamw_free(&opt);

    cfg.weight_decay = 0;
    assert_int_equal(adamw_init(&opt, &cfg, 0, 5, ranges, 2), 0);
    float q[5] = {0, 0, 0, 0, 0}, g[5] = {3, -0.01f, 200, -7, 1e-3f};
    adamw_step(&opt, q, g, 0.1f, 1.0f);
    for (int i = 0; i < 5; i++) assert_close(q[i], g[i] > 0 ? -0.1 : 0.1, 1e-4, 0);
    adamw_free(&opt);
}

// ZeRO-1: optimizers on disjoint shards, each with its own moments, do exactly what one optimizer
// over the whole vector does (every element's update only involves that element).
static void test_adamw_shards_equal_whole(void **state) {
    (void)state;
    AdamWConfig cfg = adamw_defaults();
    DecayRange ranges[2] = {{0, 5, 1}, {5, 12, 0}};
    float whole[12], sharded[12], g[12];
    Rng rng;
    rng_seed(&rng, 12);
    for (int i = 0; i < 12; i++) whole[i] = sharded[i] = (float)rng_normal(&rng);
    size_t cuts[4] = {0, 3, 8, 12};  // one shard boundary inside each decay range
    AdamW full, part[3];
    assert_int_equal(adamw_init(&full, &cfg, 0, 12, ranges, 2), 0);
    for (int s = 0; s < 3; s++) assert_int_equal(adamw_init(&part[s], &cfg, cuts[s], cuts[s + 1], ranges, 2), 0);
    for (int step = 0; step < 5; step++) {
        for (int i = 0; i < 12; i++) g[i] = (float)rng_normal(&rng);
        adamw_step(&full, whole, g, 1e-2f, 1.0f);
        for (int s = 0; s < 3; s++) {
            float shard_grads[12];  // a separate buffer, as a reduce-scatter leaves it
            memcpy(shard_grads, g + cuts[s], (cuts[s + 1] - cuts[s]) * sizeof(float));
            adamw_step(&part[s], sharded + cuts[s], shard_grads, 1e-2f, 1.0f);
        }
    }
    assert_memory_equal(whole, sharded, sizeof whole);
    adamw_free(&full);
    for (int s = 0; s < 3; s++) adamw_free(&part[s]);
}

static void test_adamw_refuses_bad_ranges(void **state) {
    (void)state;
    AdamWConfig cfg = adamw_defaults();
    AdamW opt;
    DecayRange gap[2] = {{0, 4, 1}, {5, 10, 0}};
    assert_int_equal(adamw_init(&opt, &cfg, 0, 10, gap, 2), -1);
    assert_non_null(strstr(bs_errmsg(), "leave out parameter 4"));
    DecayRange overlap[2] = {{0, 6, 1}, {5, 10, 0}};
    assert_int_equal(adamw_init(&opt, &cfg, 0, 10, overlap, 2), -1);
    assert_non_null(strstr(bs_errmsg(), "cover twice"));
    DecayRange shortr[1] = {{0, 8, 1}};
    assert_int_equal(adamw_init(&opt, &cfg, 0, 10, shortr, 1), -1);
    // a shard inside the gap-free part is fine even though the ranges are for the whole vector
    assert_int_equal(adamw_init(&opt, &cfg, 2, 4, gap, 2), 0);
    adamw_free(&opt);
    cfg.beta2 = 1.0;
    assert_int_equal(adamw_init(&opt, &cfg, 0, 4, gap, 2), -1);
}

static void test_grad_clipping(void **state) {
    (void)state;
    Rng rng;
    rng_seed(&rng, 13);
    float g[100];
    double ref = 0;
    for (int i = 0; i < 100; i++) {
        g[i] = (float)rng_normal(&rng);
        ref += (double)g[i] * g[i];
    }
    // the squared norm over shards adds up to the whole (what the all-reduce relies on)
    double s = grad_sumsq(g, 30) + grad_sumsq(g + 30, 45) + grad_sumsq(g + 75, 25);
    assert_close(s, ref, 1e-12, 0);
    double norm;
    float k = grad_clip_scale(s, 1.0, &norm);
    assert_close(norm, sqrt(ref), 1e-12, 0);
    // after scaling, the norm is exactly max_norm
    for (int i = 0; i < 100; i++) g[i] *= k;
    assert_close(sqrt(grad_sumsq(g, 100)), 1.0, 1e-6, 0);
    assert_true(grad_clip_scale(0.25, 1.0, NULL) == 1.0f);   // norm 0.5 <= 1: untouched
    assert_true(grad_clip_scale(400.0, 0.0, NULL) == 1.0f);  // clipping off
    assert_close(grad_clip_scale(400.0, 5.0, NULL), 0.25, 1e-7, 0);  // norm 20 -> 5
}

static void test_lr_schedule(void **state) {
    (void)state;
    LrSchedule s = {.max_lr = 1e-3, .min_lr = 1e-4, .warmup_steps = 10, .total_steps = 110};
    assert_close(lr_schedule(&s, 0), 1e-4, 1e-12, 0);  // 1/10 of the peak
    assert_close(lr_schedule(&s, 4), 5e-4, 1e-12, 0);
    assert_close(lr_schedule(&s, 9), 1e-3, 1e-12, 0);   // warmup ends at the peak
    assert_close(lr_schedule(&s, 10), 1e-3, 1e-12, 0);  // cosine starts at the peak
    assert_close(lr_schedule(&s, 60), 5.5e-4, 1e-12, 0);  // halfway: (max + min) / 2
    assert_close(lr_schedule(&s, 35), 1e-4 + 9e-4 * (1 + sqrt(0.5)) / 2, 1e-12, 0);  // a quarter: cos(pi/4)
    assert_close(lr_schedule(&s, 110), 1e-4, 1e-12, 0);
    assert_close(lr_schedule(&s, 5000), 1e-4, 1e-12, 0);
    for (int64_t t = 10; t < 120; t++) assert_true(lr_schedule(&s, t + 1) <= lr_schedule(&s, t));
    LrSchedule nowarm = {.max_lr = 2.0, .min_lr = 0.0, .warmup_steps = 0, .total_steps = 4};
    assert_close(lr_schedule(&nowarm, 0), 2.0, 1e-12, 0);
    assert_close(lr_schedule(&nowarm, 2), 1.0, 1e-12, 0);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_adamw_matches_reference),
        cmocka_unit_test(test_adamw_decay_and_first_step),
        cmocka_unit_test(test_adamw_shards_equal_whole),
        cmocka_unit_test(test_adamw_refuses_bad_ranges),
        cmocka_unit_test(test_grad_clipping),
        cmocka_unit_test(test_lr_schedule),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
