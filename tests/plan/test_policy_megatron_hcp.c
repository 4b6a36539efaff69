// test_policy_megatron_hcp.c: Megatron-LM's hybrid DP x CP scheduler (src/plan/policy_megatron_hcp.c,
// docs/peers.md "megatron-hcp"):
//   - a worked example traced by hand through the source's steps (CP sizes, equal-work buckets, the
//     greedy placement, the wave ending when nothing more fits, filling idle ranks by doubling), with
//     the barrier's effect on the makespan;
//   - the barriers survive the JSON file and the binary wire form;
//   - property test over random batches, rank counts and pp: every plan valid, every sequence whole in
//     one item, every item a power-of-two ring on an aligned contiguous block, no rank twice in a wave.
#include "plan/plan_fixtures.h"

#include <math.h>
#include <stdlib.h>
#include <unistd.h>

#include "bytescale/error.h"
#include "bytescale/hw.h"
#include "bytescale/model.h"
#include "bytescale/policy.h"
#include "bytescale/rng.h"

static void plan_ok(Plan *p, const GlobalBatch *b, const PlanConfig *cfg, const CostModel *cm) {
    if (policy_plan(p, "megatron-hcp", b, cfg, cm) != 0)
        fail_msg("R %d, C %lld, pp %d: %s", cfg->n_ranks, (long long)cfg->capacity, cfg->pp, bs_errmsg());
}

static void expect_item(const Plan *p, int k, int32_t seq, int32_t first_rank, int32_t n_ranks) {
    const Item *it = &p->items[k];
    assert_int_equal(it->n_segs, 1);
    assert_int_equal(p->segs[it->seg_begin].seq, seq);
    assert_int_equal(it->n_ranks, n_ranks);
    for (int32_t j = 0; j < n_ranks; j++) assert_int_equal(p->ranks[it->rank_begin + j], first_rank + j);
}

// C = 100, 8 ranks, lengths 700 300 150 90 80 60 50 40. CP sizes (next power of two of s / C): 8, 4,
// 2, 1, 1, 1, 1, 1; work s^2 / cp: 61250, 22500, 11250, 8100, 6400, 3600, 2500, 1600.
// Wave 1: four CP sizes, so four buckets of ~117200 / 4 = 29300 (closing past 1.1 x): [700] [300]
//   [150 90 80 60 50] [40]. 700 takes all 8 ranks; nothing else finds a group or free ranks: the
//   wave is the 700 alone.
// Wave 2: [300] [150 90] [80 60 50 40]. 300 -> a new group of 4, 150 -> a new group of 2, 90 -> a
//   new group of 1, 80 -> the group of 90 is full (170 > 100): a new group of 1, the last free rank;
//   60 fits no group of 1 (150, 140 > 100) and no rank is free: the wave ends. Spread 22500 vs 6400:
//   trimming cannot help (the most loaded group holds one sequence).
// Wave 3: [60 50] [40]: 60 and 50 get groups of 1 (110 > 100), 40 fits 50's group but a new group
//   with no work wins while ranks are free. 5 ranks idle: doubling the first smallest group three
//   times (1 -> 2 for 60, 50, 40), then 60's again (2 -> 4). Largest first from rank 0.
static void test_worked_example(void **state) {
    (void)state;
    int64_t lens[] = {700, 300, 150, 90, 80, 60, 50, 40};
    GlobalBatch b = make_batch(lens, 8);
    CostModel cm = hand_model();
    PlanConfig cfg = {.n_ranks = 8, .capacity = 100, .pp = 1};
    Plan p;
    plan_ok(&p, &b, &cfg, &cm);
    assert_string_equal(p.policy, "megatron-hcp");
    assert_int_equal(p.n_items, 8);
    expect_item(&p, 0, 0, 0, 8);
    expect_item(&p, 1, 1, 0, 4);
    expect_item(&p, 2, 2, 4, 2);
    expect_item(&p, 3, 3, 6, 1);
    expect_item(&p, 4, 4, 7, 1);
    expect_item(&p, 5, 5, 0, 4);
    expect_item(&p, 6, 6, 4, 2);
    expect_item(&p, 7, 7, 6, 2);
    assert_int_equal(p.n_barriers, 2);
    assert_int_equal(p.barriers[0], 1);
    assert_int_equal(p.barriers[1], 5);
    // hand_model: 2 (1e-3 T / D + 0.01). Wave 1 0.195; wave 2 the slowest is 90 alone, 0.2; wave 3
    // the slowest is 50 on 2 ranks, 0.07: 0.465. Without the barrier 40 on ranks 6, 7 could start
    // before rank 6's neighbours finish, and 50 on ranks 4, 5 at 0.365: 0.455.
    assert_close(p.makespan, 0.465, 1e-12, 0);
    Plan q = p;
    q.n_barriers = 0;
    assert_int_equal(plan_finalize(&q, &cm), 0);
    assert_close(q.makespan, 0.455, 1e-12, 0);
    q.n_barriers = 2;
    assert_int_equal(plan_finalize(&q, &cm), 0);  // (q shares p's arrays: p is q now)
    assert_close(q.makespan, 0.465, 1e-12, 0);
    // with pipelines the waves stay apart too: every item of wave 3 starts after wave 2's last
    p = q;
    plan_free(&p);
    cfg.pp = 2;
    plan_ok(&p, &b, &cfg, &cm);
    int32_t *slot = malloc((size_t)p.n_items * sizeof *slot);
    assert_int_equal(plan_pipeline_slots(&p, slot), 0);
    for (int k = 1; k < 5; k++) assert_true(slot[k] >= slot[0] + 2);  // past the backward of wave 1
    for (int k = 5; k < 8; k++)
        for (int j = 1; j < 5; j++) assert_true(slot[k] >= slot[j] + 2);
    free(slot);
    // pp stages: wave by wave, each wave's longest item through both stages and back
    assert_true(p.makespan >= 0.195 * 2 + 0.2 * 2 - 1e-12);
    plan_free(&p);
    batch_free(&b);
}

// The barriers go through a plan file and the wire form unchanged; a plan without them is written
// and sent as before (no "barriers" member, wire version 1).
static void test_barriers_round_trip(void **state) {
    (void)state;
    int64_t lens[] = {700, 300, 150, 90, 80, 60, 50, 40};
    GlobalBatch b = make_batch(lens, 8);
    CostModel cm = hand_model();
    PlanConfig cfg = {.n_ranks = 8, .capacity = 100, .pp = 1};
    Plan p, q, w;
    plan_ok(&p, &b, &cfg, &cm);
    char path[] = "/tmp/bs_test_mhcp_XXXXXX";
    int fd = mkstemp(path);
    assert_true(fd >= 0);
    close(fd);
    assert_int_equal(plan_write_json(&p, path), 0);
    if (plan_read_json_cm(&q, path, &cm) != 0) fail_msg("%s", bs_errmsg());
    assert_int_equal(q.n_barriers, 2);
    assert_int_equal(q.barriers[0], 1);
    assert_int_equal(q.barriers[1], 5);
    assert_close(q.makespan, p.makespan, 1e-12, 0);
    uint8_t *buf;
    size_t size;
    assert_int_equal(plan_pack(&p, &buf, &size), 0);
    assert_int_equal(((uint32_t *)buf)[1], 2);  // version 2: it has peer fields
    if (plan_unpack(&w, buf, size) != 0) fail_msg("%s", bs_errmsg());
    assert_int_equal(w.n_barriers, 2);
    assert_int_equal(w.barriers[1], 5);
    free(buf);
    // a barrier out of order is refused
    q.barriers[1] = 1;
    assert_int_equal(plan_validate(&q, &cm), -1);
    assert_non_null(strstr(bs_errmsg(), "barrier 1"));
    plan_free(&q);
    plan_free(&w);
    Plan s;
    assert_int_equal(policy_plan(&s, "balance", &b, &cfg, &cm), 0);
    assert_int_equal(plan_pack(&s, &buf, &size), 0);
    assert_int_equal(((uint32_t *)buf)[1], 1);
    free(buf);
    plan_free(&s);
    plan_free(&p);
    unlink(path);
    batch_free(&b);
}

// Random batches: valid plans of power-of-two rings on aligned contiguous blocks, every sequence whole,
// every rank at most once per wave.
static void test_invariants(void **state) {
    (void)state;
    const char *dists[] = {"github", "byted", "uniform:1:40000", "lognormal:8:1.5"};
    Rng g;
    rng_seed(&g, 2020);
    int plans = 0, waves = 0;
    for (int trial = 0; trial < 300; trial++) {
        int32_t R = 1 + (int32_t)rng_below(&g, 96), pp = 1 + (int32_t)rng_below(&g, 2);
        int64_t C = (int64_t)(1 << 10) << rng_below(&g, 4);
        int32_t block = 1;
        while (block * 2 <= R) block *= 2;
        CostModel cm;
        if (cost_derive(&cm, model_find("llama-7b"), hw_find("h800-sxm"), 1, pp, R, C) != 0) fail_msg("%s", bs_errmsg());
        GlobalBatch b;
        int64_t tokens = C * (1 + (int64_t)rng_below(&g, 4 * R));
        if (batch_generate(&b, dists[rng_below(&g, 4)], rng_next(&g), tokens, block * C) != 0)
            fail_msg("%s", bs_errmsg());
        PlanConfig cfg = {.n_ranks = R, .capacity = C, .pp = pp};
        Plan p;
        plan_ok(&p, &b, &cfg, &cm);
        int32_t *seen = calloc((size_t)b.n, sizeof *seen), *used = calloc((size_t)R, sizeof *used);
        for (int32_t k = 0, w = 0; k < p.n_items; k++) {
            if (w < p.n_barriers && p.barriers[w] == k) w++;
            const Item *it = &p.items[k];
            int32_t D = it->n_ranks, r0 = p.ranks[it->rank_begin];
            assert_true((D & (D - 1)) == 0);
            assert_int_equal(r0 % D, 0);
            for (int32_t j = 0; j < D; j++) {
                int32_t r = p.ranks[it->rank_begin + j];
                assert_int_equal(r, r0 + j);
                assert_true(used[r] < w + 1);  // one item per rank and wave
                used[r] = w + 1;
            }
            for (int32_t j = 0; j < it->n_segs; j++) {
                const Segment *s = &p.segs[it->seg_begin + j];
                assert_int_equal(s->start, 0);
                assert_int_equal(s->len, b.seqs[s->seq].len);
                seen[s->seq]++;
            }
        }
        for (int64_t i = 0; i < b.n; i++) assert_int_equal(seen[i], 1);
        assert_true(p.makespan >= p.lower_bound * (1 - 1e-12));
        waves += p.n_barriers + 1;
        plans++;
        free(seen), free(used);
        plan_free(&p);
        batch_free(&b);
    }
    printf("%d plans, %d waves\n", plans, waves);
}

static void test_errors(void **state) {
    (void)state;
    int64_t lens[] = {500};
    GlobalBatch b = make_batch(lens, 1);
    CostModel cm = hand_model();
    PlanConfig cfg = {.n_ranks = 6, .capacity = 100, .pp = 1};  // 500 needs CP 8; the largest block is 4
    Plan p;
    assert_int_equal(policy_plan(&p, "megatron-hcp", &b, &cfg, &cm), -1);
    assert_non_null(strstr(bs_errmsg(), "needs a CP group of 8 ranks"));
    batch_free(&b);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_worked_example),
        cmocka_unit_test(test_barriers_round_trip),
        cmocka_unit_test(test_invariants),
        cmocka_unit_test(test_errors),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
