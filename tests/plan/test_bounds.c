// test_bounds.c: the two bounds every plan carries (docs/planner.md, "The bounds"): the
// policy-independent lower_bound and the HDP-aware hdp_bound. Hand-computed values on a tiny cost
// model (hdp_bound >= lower_bound there), and both below the makespan of every policy's plan on random
// batches, with and without pipeline parallelism (lower_bound: plans of packs and rings).
// ctest: long (600 random batches under every policy)
#include "plan/plan_fixtures.h"

#include <math.h>

#include "bytescale/batch.h"
#include "bytescale/error.h"
#include "bytescale/hw.h"
#include "bytescale/model.h"
#include "bytescale/plan.h"
#include "bytescale/policy.h"
#include "bytescale/rng.h"

// One long sequence of 300 tokens and a short one of 10; C = 100, 8 ranks.
//   lower_bound: work 2e-3 x 310 = 0.62, at least ceil(310 / 100) = 4 slots of 2 x 0.01:
//     A = 0.70 / 8 = 0.0875; the longest at best on all 8 ranks: 2 (0.3 / 8 + 0.01) = 0.095.
//     lower = 0.095.
//   hdp_bound: the 300 tokens on exactly ceil(300 / 100) = 3 ranks: 2 (0.1 + 0.01) = 0.22 each,
//     work 3 x 0.22 = 0.66; the short one 0.02 + one pack's 0.02: A = 0.70 / 8 = 0.0875 (no ring
//     overhead in this model, so the same work); the indivisible time 0.22. hdp = 0.22.
//   pp = 2: the indivisible item crosses both stages forward and back (x 2), and the busiest rank's
//     fill and drain add (pp - 1) x l x layer_const = 0.02 to A: lower = max(0.1075, 0.19) = 0.19,
//     hdp = max(0.1075, 0.44) = 0.44.
static void test_one_long_sequence_by_hand(void **state) {
    (void)state;
    CostModel cm = hand_model();
    const int64_t lens[] = {300, 10};
    GlobalBatch b = make_batch(lens, 2);
    assert_close(plan_lower_bound(&b, &cm, 8, 100), 0.095, 1e-12, 0);
    assert_close(plan_lower_bound_pp(&b, &cm, 8, 100, 1), 0.095, 1e-12, 0);
    assert_close(plan_hdp_bound(&b, &cm, 8, 100, 1), 0.22, 1e-12, 0);
    assert_close(plan_lower_bound_pp(&b, &cm, 8, 100, 2), 0.19, 1e-12, 0);
    assert_close(plan_hdp_bound(&b, &cm, 8, 100, 2), 0.44, 1e-12, 0);
    // ring latency: every ring step pays 1 ms (bandwidth not modelled), D - 1 steps forward and D
    // backward (the dK/dV hop home) per layer: on 3 ranks 2 (0.1 + 0.01 + 5 x 0.001) = 0.23, work
    // 0.69 + 0.04 = 0.73 -> A = 0.09125 < 0.23.
    cm.ring_lat = 0.001;
    assert_close(plan_hdp_bound(&b, &cm, 8, 100, 1), 0.23, 1e-12, 0);
    // with 3 ranks for 310 tokens the average wins: (0.69 + 0.04) / 3
    assert_close(plan_hdp_bound(&b, &cm, 3, 100, 1), 0.73 / 3, 1e-12, 0);
    batch_free(&b);
}

// Under HDP's rule the slowest item need not hold the longest sequence: C = 100 tokens alone in a
// pack take 2 (0.1 + 0.01) = 0.22, 150 tokens on ceil(150/100) = 2 ranks 2 (0.075 + 0.01) = 0.17.
// Work: 0.2 + 0.02 (one pack) + 2 x 0.17 = 0.56 over 4 ranks = 0.14. hdp = 0.22, while the
// policy-independent bound lets the 150 tokens use all 4 ranks: lower = max(0.56 / 4, 0.095) = 0.14.
static void test_the_slowest_item_can_be_a_pack(void **state) {
    (void)state;
    CostModel cm = hand_model();
    const int64_t lens[] = {100, 150};
    GlobalBatch b = make_batch(lens, 2);
    assert_close(plan_hdp_bound(&b, &cm, 4, 100, 1), 0.22, 1e-12, 0);
    assert_close(plan_lower_bound(&b, &cm, 4, 100), 0.14, 1e-12, 0);
    batch_free(&b);
}

// plan_finalize fills both, for the plan's own pp.
static void test_finalize_fills_both_bounds(void **state) {
    (void)state;
    CostModel cm = hand_model();
    const int64_t lens[] = {300, 10};
    GlobalBatch b = make_batch(lens, 2);
    for (int32_t pp = 1; pp <= 3; pp++) {
        Plan p;
        assert_int_equal(plan_init(&p, &b, 8, 100, pp, "hand"), 0);
        Segment s0 = {0, 0, 300}, s1 = {1, 0, 10};
        int32_t ring[] = {0, 1, 2}, r3[] = {3};
        assert_true(plan_add_item(&p, &s0, 1, ring, 3, 0.0) >= 0);
        assert_true(plan_add_item(&p, &s1, 1, r3, 1, 0.0) >= 0);
        assert_int_equal(plan_finalize(&p, &cm), 0);
        assert_true(p.lower_bound == plan_lower_bound_pp(&b, &cm, 8, 100, pp));
        assert_true(p.hdp_bound == plan_hdp_bound(&b, &cm, 8, 100, pp));
        // this plan is the best there is: the ring alone sets the step, and meets the HDP bound
        assert_close(p.makespan, p.hdp_bound, 1e-12, 0);
        plan_free(&p);
    }
    batch_free(&b);
}

// plan_lower_bound's search for the longest sequence's fastest ring stops where a ring's floor passes
// the best time (ring_floor in plan.c); it must find the very minimum a search over every width finds.
// That search is what the same cost model with a negative optimizer time gives: no item time uses that
// field, but with a field below 0 no floor is trusted and every width is costed. Random models,
// links (latencies and K/V bytes from none to 10x), capacities and rank counts past the 65,536-width
// cut; both bounds equal to the bit. And a policy that finalizes several plans of one batch computes
// the batch's bounds once (plan_finalize_bounds): balance's and elastic's plans, pp 1 and 2, carry
// the very bounds of their batch.
static void test_bound_searches_stop_exactly(void **state) {
    (void)state;
    const char *models[] = {"llama-7b", "llama-13b", "mixtral-8x7b"};
    const char *hws[] = {"h800-sxm", "h100-sxm", "h100-measured"};
    const double scale[] = {0, 0.1, 1, 10};
    Rng g;
    rng_seed(&g, 777);
    for (int trial = 0; trial < test_trials(120); trial++) {
        int32_t pp = 1 + (int32_t)rng_below(&g, 2);
        int64_t C = (int64_t)(2 << 10) << rng_below(&g, 3);
        int32_t R = 2 + (int32_t)rng_below(&g, trial % 4 == 0 ? 90000 : 4000);
        CostModel cm;
        assert_int_equal(cost_derive(&cm, model_find(models[rng_below(&g, 3)]), hw_find(hws[rng_below(&g, 3)]),
                                     1 << rng_below(&g, 3), pp, R, C),
                         0);
        cm.ring_lat *= scale[rng_below(&g, 4)];
        cm.kv_token *= scale[rng_below(&g, 4)];
        CostModel all = cm;
        all.optimizer = -1;
        GlobalBatch b;
        int64_t tokens = (int64_t)(64 << 10) * (1 + (int64_t)rng_below(&g, 64));
        if (batch_generate(&b, trial % 2 ? "github" : "byted", rng_next(&g), tokens, 2 << 20) != 0)
            fail_msg("%s", bs_errmsg());
        double got = plan_lower_bound_pp(&b, &cm, R, C, pp), want = plan_lower_bound_pp(&b, &all, R, C, pp);
        if (got != want)
            fail_msg("trial %d (R %d, C %lld, pp %d): %.17g, every width gives %.17g", trial, R, (long long)C, pp, got,
                     want);
        if (trial % 8 == 0 && R <= 4000) {
            PlanConfig pc = {.n_ranks = R, .capacity = C, .context = 2 << 20, .pp = pp, .offload = 1};
            for (int k = 0; k < 2; k++) {
                Plan p;
                if (policy_plan(&p, k ? "elastic" : "balance", &b, &pc, &cm) != 0) fail_msg("%s", bs_errmsg());
                assert_true(p.lower_bound == got);
                assert_true(p.hdp_bound == plan_hdp_bound(&b, &cm, R, C, pp));
                plan_free(&p);
            }
        }
        batch_free(&b);
    }
}

// Random batches, cost models and shapes, pp 1, 2 and 4: lower_bound <= hdp_bound; lower_bound <= the
// makespan of every policy; hdp_bound <= the makespan of every policy that follows HDP's rule (every
// policy but static and elastic). The static mesh gives every sequence d_cp = ceil(context / C)
// ranks, more than the ceil(s / C) HDP allows whenever s is shorter than the context, so the HDP
// bound is no bound for it: on these small batches it beats it now and then (counted, not
// asserted); on the paper's batches it is 1.6x-6.7x above it. elastic widens rings past ceil(s / C)
// on purpose, and beats the HDP bound wherever that pays (counted too). The peers' policies
// (docs/peers.md) follow their own rules and are held to lower_bound only.
static void test_bounds_hold_for_every_policy(void **state) {
    (void)state;
    const char *models[] = {"llama-7b", "llama-13b", "mixtral-8x7b"};
    const char *hws[] = {"h800-sxm", "h100-sxm", "h100-measured"};  // the last with a ring-step floor (attn_step)
    const char *dists[] = {"github", "byted", "uniform:1:40000", "lognormal:8:1.5"};
    Rng g;
    rng_seed(&g, 4242);
    int plans = 0, static_below = 0, elastic_below = 0, flexsp_below = 0, hdp_below = 0;
    double tightest = INFINITY;  // smallest makespan / hdp_bound seen over the HDP policies
    const int trials = test_trials(600);
    for (int trial = 0; trial < trials; trial++) {
        int32_t pp = (int32_t[]){1, 2, 4}[trial % 3];
        int tp = 1 << rng_below(&g, 3);
        int64_t C = (int64_t)(2 << 10) << rng_below(&g, 3);
        int32_t R = 2 + (int32_t)rng_below(&g, 63);
        int64_t ctx = C;
        while (ctx * 2 <= C * R && ctx < (512 << 10) && rng_below(&g, 5) != 0) ctx *= 2;
        CostModel cm;
        assert_int_equal(cost_derive(&cm, model_find(models[rng_below(&g, 3)]), hw_find(hws[rng_below(&g, 3)]), tp, pp,
                                     R, C),
                         0);
        GlobalBatch b;
        int64_t tokens = (int64_t)(32 << 10) * (1 + (int64_t)rng_below(&g, 64));
        if (batch_generate(&b, dists[rng_below(&g, 4)], rng_next(&g), tokens, ctx) != 0) fail_msg("%s", bs_errmsg());
        double lower = plan_lower_bound_pp(&b, &cm, R, C, pp), hdp = plan_hdp_bound(&b, &cm, R, C, pp);
        assert_true(lower > 0);
        // hdp_bound times a long sequence by its fastest kind, all-to-all groups and hybrids included,
        // lower_bound the longest on rings only (plan_fastest_item): where a group beats every ring of
        // the longest, hdp_bound may be the lower one (counted)
        hdp_below += hdp < lower * (1 - 1e-12);
        for (int k = 0; k < policy_count(); k++) {
            // flexsp solves a MILP per wave: every tenth batch keeps the test quick
            if (!strcmp(policy_at(k)->name, "flexsp") && trial % 10 != 0) continue;
            PlanConfig pc;
            memset(&pc, 0, sizeof pc);
            pc.n_ranks = R;
            pc.capacity = C;
            pc.context = ctx;
            pc.pp = pp;
            pc.offload = strcmp(policy_at(k)->name, "static") != 0 && rng_below(&g, 4) != 0;
            pc.flush = 1;  // wlb: train the whole batch (its bounds leave delayed documents out)
            Plan p;
            if (policy_plan(&p, policy_at(k)->name, &b, &pc, &cm) != 0)
                fail_msg("%s (R %d, C %lld, pp %d): %s", policy_at(k)->name, R, (long long)C, pp, bs_errmsg());
            assert_true(p.lower_bound == lower);
            assert_true(p.hdp_bound == hdp);
            int groups = 0;  // all-to-all or hybrid items: lower_bound times rings only
            for (int32_t j = 0; j < p.n_items; j++) groups |= p.items[j].a2a || p.items[j].ulysses;
            if (!(p.makespan >= lower * (1 - 1e-12))) {
                // an all-to-all group, a hybrid and a block item compute attention without the ring's
                // steps: lower_bound, which times the longest sequence on rings, does not bound flexsp,
                // blocks, nor the plans of balance and elastic that hold such groups (counted)
                if (strcmp(policy_at(k)->name, "flexsp") != 0 && strncmp(policy_at(k)->name, "blocks", 6) != 0 &&
                    !groups)
                    fail_msg("%s (R %d, C %lld, pp %d): makespan %.9g < lower_bound %.9g", policy_at(k)->name, R,
                             (long long)C, pp, p.makespan, lower);
                flexsp_below++;
            }
            plans++;
            int is_static = !strcmp(policy_at(k)->name, "static"), is_elastic = !strcmp(policy_at(k)->name, "elastic");
            // the peers (docs/peers.md) size their groups by powers of two, a static mesh or all-to-all
            int is_peer = !strcmp(policy_at(k)->name, "megatron-hcp") || !strcmp(policy_at(k)->name, "wlb") ||
                          !strcmp(policy_at(k)->name, "flexsp") || !strncmp(policy_at(k)->name, "blocks", 6);
            if (is_static || is_elastic || is_peer) {  // not bound by HDP's rule
                int below = p.makespan < hdp * (1 - 1e-12);
                static_below += is_static && below;
                elastic_below += is_elastic && below;
                plan_free(&p);
                continue;
            }
            if (!(p.makespan >= hdp * (1 - 1e-12)))
                fail_msg("%s (R %d, C %lld, pp %d): makespan %.9g < hdp_bound %.9g", policy_at(k)->name, R,
                         (long long)C, pp, p.makespan, hdp);
            tightest = fmin(tightest, p.makespan / hdp);
            plan_free(&p);
        }
        batch_free(&b);
    }
    printf("%d plans; the tightest makespan / hdp_bound %.6f; of %d batches, below hdp_bound: static %d, elastic %d; "
           "flexsp, blocks or plans with all-to-all / hybrid items below lower_bound: %d; hdp_bound below lower_bound: "
           "%d\n",
           plans, tightest, trials, static_below, elastic_below, flexsp_below, hdp_below);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_one_long_sequence_by_hand),
        cmocka_unit_test(test_the_slowest_item_can_be_a_pack),
        cmocka_unit_test(test_finalize_fills_both_bounds),
        cmocka_unit_test(test_bound_searches_stop_exactly),
        cmocka_unit_test(test_bounds_hold_for_every_policy),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
