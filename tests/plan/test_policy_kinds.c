// test_policy_kinds.c: balance and elastic choose each long sequence's kind of item (a ring, an
// all-to-all group or a hybrid; src/plan/policy_util.c, policy_item_choice; docs/planner.md "Which kind of item"):
//   - by hand: one sequence of 300 tokens on 3 ranks, ring latency 1 ms: a ring pays 5 steps a layer
//     (0.23 s), an all-to-all group two exchanges (0.224 s); with 4 heads per TP shard balance runs
//     it as the group, with 2 heads (fewer than the members) or an unknown head count as the ring;
//   - property test over random batches, models, TP degrees and rank counts: every plan valid, every
//     all-to-all item within the head limit, every hybrid's groups dividing its ranks and the heads,
//     neither offloading, every multi-rank item's estimate no
//     slower than a ring on the same ranks (the choice is by the cost model), balance's makespan at or
//     above the HDP-aware bound, and all-to-all groups and hybrids chosen in some of the plans.
// ctest: long (240 random batches under two policies)
#include "plan/plan_fixtures.h"

#include <math.h>

#include "bytescale/batch.h"
#include "bytescale/error.h"
#include "bytescale/hw.h"
#include "bytescale/model.h"
#include "bytescale/plan.h"
#include "bytescale/policy.h"
#include "bytescale/rng.h"

static void plan_ok(Plan *p, const char *policy, const GlobalBatch *b, const PlanConfig *cfg, const CostModel *cm) {
    if (policy_plan(p, policy, b, cfg, cm) != 0)
        fail_msg("%s R %d, C %lld, pp %d: %s", policy, cfg->n_ranks, (long long)cfg->capacity, cfg->pp, bs_errmsg());
}

// hand_model (2 layers: 1e-3 s a token, 0.01 s a layer, no attention term, no bandwidth term) with
// 1 ms a message. 300 tokens on 3 ranks, per layer:
//   ring:  0.1 + 0.01 + (D - 1) + D = 5 steps of 1 ms   -> 2 x 0.115 = 0.230 s
//   a2a:   0.1 + 0.01 + two all-to-alls of 1 ms each     -> 2 x 0.112 = 0.224 s
static void test_by_hand(void **state) {
    (void)state;
    const int64_t len = 300;
    GlobalBatch b = make_batch(&len, 1);
    PlanConfig cfg = {.n_ranks = 3, .capacity = 100, .pp = 1};
    const struct { int heads; int a2a; double t; } cases[] = {{4, 1, 0.224}, {3, 1, 0.224}, {2, 0, 0.23}, {0, 0, 0.23}};
    for (int c = 0; c < 4; c++) {
        CostModel cm = hand_model();
        cm.ring_lat = 0.001;
        cm.a2a_heads = cm.a2a_kv_heads = cases[c].heads;
        for (int e = 0; e < 2; e++) {
            Plan p;
            plan_ok(&p, e ? "elastic" : "balance", &b, &cfg, &cm);
            assert_int_equal(p.n_items, 1);
            assert_int_equal(p.items[0].n_ranks, 3);
            assert_int_equal(p.items[0].a2a, cases[c].a2a);
            assert_close(p.items[0].est_time, cases[c].t, 1e-12, 0);
            assert_close(p.makespan, cases[c].t, 1e-12, 0);
            assert_close(p.hdp_bound, cases[c].t, 1e-12, 0);  // the one sequence at its fastest kind
            plan_free(&p);
        }
    }
    batch_free(&b);
}

// Every item of p: an all-to-all group within the head limit, a hybrid of groups dividing its ranks
// and the heads, each timed as its kind with its offload ratio; a multi-rank item no slower than a
// ring of its segments on its ranks with the same ratio. Returns the all-to-all items; adds the hybrids to *n_hybrid.
static int check_kinds(const Plan *p, const CostModel *cm, const char *policy, int *n_hybrid) {
    int n_a2a = 0;
    int64_t lens[4096];
    for (int32_t k = 0; k < p->n_items; k++) {
        const Item *it = &p->items[k];
        if (it->n_ranks < 2) {
            assert_int_equal(it->a2a, 0);
            assert_int_equal(it->ulysses, 0);
            continue;
        }
        assert_true(it->n_segs <= 4096);
        for (int32_t j = 0; j < it->n_segs; j++) lens[j] = p->segs[it->seg_begin + j].len;
        double ring = cost_item_time(cm, lens, it->n_segs, it->n_ranks, it->offload);
        if (!(it->est_time <= ring * (1 + 1e-12)))
            fail_msg("%s item %d (D %d, a2a %d): %.9g s, slower than its ring's %.9g s", policy, k, it->n_ranks, it->a2a,
                     it->est_time, ring);
        if (it->a2a) {
            n_a2a++;
            assert_true(cm->a2a_heads > 0 && it->n_ranks <= cm->a2a_heads);
            assert_close(it->est_time, cost_a2a_item_time(cm, lens, it->n_segs, it->n_ranks, it->offload), 1e-12, 0);
        }
        if (it->ulysses) {
            int u = it->ulysses;
            ++*n_hybrid;
            assert_true(u >= 2 && u < it->n_ranks && it->n_ranks % u == 0 && cm->a2a_heads % u == 0);
            assert_true(!it->a2a);
            assert_close(it->est_time, cost_hybrid_item_time(cm, lens, it->n_segs, u, it->n_ranks / u, it->offload),
                         1e-12, 0);
        }
    }
    return n_a2a;
}

static void test_random_batches(void **state) {
    (void)state;
    const char *models[] = {"llama-7b", "llama-13b", "llama-70b"};
    const char *dists[] = {"github", "byted", "uniform:1:40000", "lognormal:8:1.5"};
    Rng g;
    rng_seed(&g, 3030);
    int plans = 0, with_a2a = 0, a2a_items = 0, hybrids = 0;
    const int trials = test_trials(240);
    for (int trial = 0; trial < trials; trial++) {
        int32_t pp = trial % 4 == 3 ? 2 : 1;
        int tp = (int[]){1, 2, 8}[rng_below(&g, 3)];
        int64_t C = (int64_t)(1 << 10) << rng_below(&g, 4);
        int32_t R = 2 + (int32_t)rng_below(&g, 47);
        int64_t ctx = C;
        while (ctx * 2 <= C * R && ctx < (256 << 10) && rng_below(&g, 4) != 0) ctx *= 2;
        CostModel cm;
        assert_int_equal(cost_derive(&cm, model_find(models[rng_below(&g, 3)]), hw_find("h800-sxm"), tp, pp, R, C), 0);
        GlobalBatch b;
        int64_t tokens = (int64_t)(16 << 10) * (1 + (int64_t)rng_below(&g, 32));
        if (batch_generate(&b, dists[rng_below(&g, 4)], rng_next(&g), tokens, ctx) != 0) fail_msg("%s", bs_errmsg());
        for (int e = 0; e < 2; e++) {
            const char *policy = e ? "elastic" : "balance";
            PlanConfig cfg = {.n_ranks = R, .capacity = C, .context = ctx, .pp = pp, .offload = rng_below(&g, 3) != 0};
            Plan p;
            plan_ok(&p, policy, &b, &cfg, &cm);  // policy_plan validates it
            int n = check_kinds(&p, &cm, policy, &hybrids);
            a2a_items += n;
            with_a2a += n > 0;
            plans++;
            if (e == 0 && !(p.makespan >= p.hdp_bound * (1 - 1e-12)))
                fail_msg("balance R %d C %lld pp %d: makespan %.9g below hdp_bound %.9g", R, (long long)C, pp, p.makespan,
                         p.hdp_bound);
            plan_free(&p);
        }
        batch_free(&b);
    }
    printf("%d plans, %d with all-to-all groups (%d groups), %d hybrid items\n", plans, with_a2a, a2a_items, hybrids);
    assert_true(with_a2a > 0);  // the choices are made, not only allowed
    assert_true(hybrids > 0);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_by_hand),
        cmocka_unit_test(test_random_batches),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
