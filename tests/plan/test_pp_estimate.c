// test_pp_estimate.c: the planner's makespan with pipeline parallelism (plan.c, pipeline_makespan):
// timelines worked out by hand on a tiny cost model, the textbook 1F1B time for equal micro-batches,
// and bounds every schedule must respect on random plans. The comparison with the simulator itself
// is tests/sim/test_sim_pp.c.
#include "plan/plan_fixtures.h"

#include <math.h>

#include "bytescale/error.h"
#include "bytescale/plan.h"
#include "bytescale/rng.h"

// A batch of the given lengths and an empty plan for it.
static void start_plan(Plan *p, GlobalBatch *b, const int64_t *lens, int n, int32_t ranks, int32_t pp) {
    assert_int_equal(batch_init(b, n), 0);
    for (int i = 0; i < n; i++) assert_int_equal(batch_push(b, i, lens[i], -1), 0);
    assert_int_equal(plan_init(p, b, ranks, 4096, pp, "hand"), 0);
}

static void add(Plan *p, int seq, int64_t len, const int32_t *ranks, int nr) {
    Segment s = {seq, 0, len};
    assert_true(plan_add_item(p, &s, 1, ranks, nr, 0.0) >= 0);
}

// One pipeline of m equal micro-batches of per-stage time t: (m + pp - 1) t, i.e. the items' time
// plus (pp - 1) x (the first forward's fill + the last backward's drain).
static void test_equal_items_take_the_textbook_1f1b_time(void **state) {
    (void)state;
    CostModel cm = hand_model();
    const int pps[] = {1, 2, 3, 4, 8}, ms[] = {1, 2, 5, 13};
    for (int a = 0; a < 5; a++)
        for (int c = 0; c < 4; c++) {
            int pp = pps[a], m = ms[c];
            int64_t lens[13];
            for (int i = 0; i < m; i++) lens[i] = 490;  // t = 2 (0.49 + 0.01) = 1
            GlobalBatch b;
            Plan p;
            start_plan(&p, &b, lens, m, 1, pp);
            int32_t r0[] = {0};
            for (int i = 0; i < m; i++) add(&p, i, 490, r0, 1);
            assert_int_equal(plan_finalize(&p, &cm), 0);
            assert_close(p.makespan, (m + pp - 1) * 1.0, 1e-12, 0);
            assert_close(p.rank_busy[0], m * 1.0, 1e-12, 0);  // busy stays one stage's time
            plan_free(&p);
            batch_free(&b);
        }
}

// pp = 2, one rank: A (1490 tokens: t = 3, F = 1, B = 2), then S (140 tokens: t = 0.3, F = 0.1,
// B = 0.2). Keys: A slot 0 (F 0 on stage 0, 2 on stage 1, B 3), S slot 1 (F 2 on stage 0, 4 on
// stage 1, B 5):
//   key 0  F(A) stage 0  [0, 1]
//   key 2  F(S) stage 0  [1, 1.1]       F(A) stage 1  [1, 2]
//   key 3  B(A) stage 1  [2, 4]         B(A) stage 0  [4, 6]
//   key 4  F(S) stage 1  [4, 4.1]       (stage 1 was busy with A's backward)
//   key 5  B(S) stage 1  [4.1, 4.3]     B(S) stage 0  [6, 6.2]
// makespan 6.2: the 3.3 s of work, A's fill (1) and S's drain (0.2), and 1.7 s more on the last
// stage waiting for A's backward to drain before S can come through. In the other order (S, then
// A) the small item runs inside A's fill:
//   key 0  F(S) s0 [0, 0.1]; key 2  F(A) s0 [0.1, 1.1], F(S) s1 [0.1, 0.2];
//   key 3  B(S) s1 [0.2, 0.4], B(S) s0 [1.1, 1.3]; key 4  F(A) s1 [1.1, 2.1];
//   key 5  B(A) s1 [2.1, 4.1], B(A) s0 [4.1, 6.1]             makespan 6.1.
static void test_a_level_change_by_hand(void **state) {
    (void)state;
    CostModel cm = hand_model();
    const int64_t lens[] = {1490, 140};
    int32_t r0[] = {0};
    for (int order = 0; order < 2; order++) {
        GlobalBatch b;
        Plan p;
        start_plan(&p, &b, lens, 2, 1, 2);
        add(&p, order, lens[order], r0, 1);
        add(&p, 1 - order, lens[1 - order], r0, 1);
        assert_int_equal(plan_finalize(&p, &cm), 0);
        assert_close(p.items[order == 0 ? 0 : 1].est_time, 3.0, 1e-12, 0);
        assert_close(p.makespan, order == 0 ? 6.2 : 6.1, 1e-12, 0);
        plan_free(&p);
        batch_free(&b);
    }
}

// pp = 2, two ranks. Rank 0: A (t = 3) then the ring X over {0, 1} (280 tokens on 2 ranks: t = 0.3
// per member); rank 1: X, then the pack P (140 tokens, t = 0.3). Slots: A 0, X 1, P 2.
//   key 0  F(A) r0 s0 [0, 1]
//   key 2  F(X) s0 on r0 and r1: r0's stage 0 is busy until 1: [1, 1.1]      F(A) r0 s1 [1, 2]
//   key 3  B(A) r0 s1 [2, 4], r0 s0 [4, 6]
//   key 4  F(X) s1: r0's stage 1 is busy until 4: [4, 4.1]                    F(P) r1 s0 [1.1, 1.2]
//   key 5  B(X) s1 [4.1, 4.3], s0: r0's stage 0 is busy until 6: [6, 6.2]
//   key 6  F(P) r1 s1 [4.3, 4.4]
//   key 7  B(P) r1 s1 [4.4, 4.6], r1 s0: after B(X) [6.2, 6.4]
// makespan 6.4: rank 1 has 0.6 s of work per stage and is held in step by rank 0's big item.
static void test_a_ring_holds_its_pipelines_in_step(void **state) {
    (void)state;
    CostModel cm = hand_model();
    const int64_t lens[] = {1490, 280, 140};
    GlobalBatch b;
    Plan p;
    start_plan(&p, &b, lens, 3, 2, 2);
    int32_t r0[] = {0}, r1[] = {1}, r01[] = {0, 1};
    add(&p, 0, 1490, r0, 1);
    add(&p, 1, 280, r01, 2);
    add(&p, 2, 140, r1, 1);
    assert_int_equal(plan_finalize(&p, &cm), 0);
    assert_close(p.items[1].est_time, 0.3, 1e-12, 0);
    assert_close(p.makespan, 6.4, 1e-12, 0);
    assert_close(p.rank_busy[1], 0.6, 1e-12, 0);
    plan_free(&p);
    batch_free(&b);
}

// Random plans: whatever the schedule, (1) every rank's last stage runs all its items after the fill
// of its first and before the drain of its last: makespan >= busy + (pp - 1)(F_first + B_last);
// (2) every item crosses all stages forward and back: makespan >= pp x est_time; (3) at every moment
// some operation runs: makespan <= the sum of all operations, pp x the sum of est_time; (4) more
// stages never make the same plan faster.
static void test_random_plans_respect_the_pipeline_bounds(void **state) {
    (void)state;
    CostModel cm = hand_model();
    Rng g;
    rng_seed(&g, 99);
    for (int trial = 0; trial < 300; trial++) {
        int32_t R = 1 + (int32_t)rng_below(&g, 8);
        int n = 1 + (int)rng_below(&g, 25);
        int64_t lens[25];
        for (int i = 0; i < n; i++) lens[i] = 1 + (int64_t)rng_below(&g, 2000);
        double prev = 0;
        for (int32_t pp = 1; pp <= 6; pp++) {
            Rng same = g;  // the same plan for every pp
            GlobalBatch b;
            Plan p;
            start_plan(&p, &b, lens, n, R, pp);
            for (int i = 0; i < n; i++) {
                int32_t perm[8];
                for (int32_t r = 0; r < R; r++) perm[r] = r;
                for (int32_t r = R - 1; r > 0; r--) {
                    int32_t s = (int32_t)rng_below(&same, (uint64_t)r + 1), t = perm[r];
                    perm[r] = perm[s];
                    perm[s] = t;
                }
                int D = 1 + (int)rng_below(&same, (uint64_t)R);
                add(&p, i, lens[i], perm, D);
            }
            assert_int_equal(plan_finalize(&p, &cm), 0);
            double tol = 1e-9 * p.makespan, total = 0;
            for (int32_t k = 0; k < p.n_items; k++) {
                assert_true(p.makespan >= pp * p.items[k].est_time - tol);
                total += pp * p.items[k].est_time;
            }
            assert_true(p.makespan <= total + tol);
            for (int32_t r = 0; r < R; r++) {
                int32_t lo = p.rank_begin[r], hi = p.rank_begin[r + 1];
                if (lo == hi) continue;
                double fill = p.items[p.rank_items[lo]].est_time / 3;
                double drain = 2 * p.items[p.rank_items[hi - 1]].est_time / 3;
                assert_true(p.makespan >= p.rank_busy[r] + (pp - 1) * (fill + drain) - tol);
            }
            assert_true(p.makespan >= prev - tol);
            prev = p.makespan;
            if (pp == 6) g = same;
            plan_free(&p);
            batch_free(&b);
        }
    }
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_equal_items_take_the_textbook_1f1b_time),
        cmocka_unit_test(test_a_level_change_by_hand),
        cmocka_unit_test(test_a_ring_holds_its_pipelines_in_step),
        cmocka_unit_test(test_random_plans_respect_the_pipeline_bounds),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
