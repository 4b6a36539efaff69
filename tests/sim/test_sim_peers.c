// test_sim_peers.c: the simulator's side of the peers' plan fields (docs/peers.md, docs/simulator.md):
//   - barriers: no operation of a wave starts before every operation of the earlier waves has ended
//     (megatron-hcp's worked example, pp 1 and 2), and the simulated compute never ends before the
//     planner's makespan, whose waves it reproduces with free links;
//   - all-to-all items: flexsp's group of 4 pays exposed traffic, its packs none, and plan_stats
//     counts the bytes the simulator moves (all-to-all bytes, not a ring's);
//   - delayed sequences are not counted as trained tokens;
//   - block items (the block peer's worked example, test_policy_blocks.c): the simulator moves the
//     K/V the owners send (forward 16 + 6 tokens, backward those again and 6 + 16 of dK/dV), as
//     plan_stats counts them, and computes the slowest member's pairs.
#include "plan/plan_fixtures.h"

#include <math.h>

#include "bytescale/error.h"
#include "bytescale/hw.h"
#include "bytescale/model.h"
#include "bytescale/policy.h"
#include "bytescale/sim.h"

static void simulate(const Plan *p, CostModel *cm, int pp, SimResult *r) {
    Cluster c;
    assert_int_equal(cluster_init(&c, hw_find("h100-sxm"), p->n_ranks * pp, 1, pp), 0);
    SimConfig cfg = {cm, &c, NULL, NULL, 0};
    if (sim_run(r, p, &cfg) != 0) fail_msg("%s", bs_errmsg());
}

static void test_barriers_hold(void **state) {
    (void)state;
    int64_t lens[] = {700, 300, 150, 90, 80, 60, 50, 40};
    GlobalBatch b = make_batch(lens, 8);
    CostModel cm = hand_model();
    for (int pp = 1; pp <= 2; pp++) {
        PlanConfig cfg = {.n_ranks = 8, .capacity = 100, .pp = pp};
        Plan p;
        if (policy_plan(&p, "megatron-hcp", &b, &cfg, &cm) != 0) fail_msg("%s", bs_errmsg());
        assert_int_equal(p.n_barriers, 2);
        SimResult r;
        simulate(&p, &cm, pp, &r);
        for (int w = 0; w < p.n_barriers; w++) {
            double end_before = 0, start_after = INFINITY;
            for (int32_t o = 0; o < r.n_ops; o++) {
                const SimOp *op = &r.ops[o];
                double end = op->start + op->cost.compute + op->cost.comm + op->cost.offload;
                if (op->item < p.barriers[w]) end_before = fmax(end_before, end);
                else start_after = fmin(start_after, op->start);
            }
            assert_true(start_after >= end_before - 1e-12);
        }
        // the cluster's links cost little against hand_model's items: the simulator's waves are the
        // planner's, within the rings' transfers
        if (pp == 1) assert_close(r.compute_end, p.makespan, 1e-3, 0);
        assert_true(r.compute_end >= p.makespan * (1 - 1e-9));
        sim_result_free(&r);
        plan_free(&p);
    }
    batch_free(&b);
}

static void test_a2a_and_delayed(void **state) {
    (void)state;
    int64_t lens[] = {300, 100, 100, 100, 100};
    GlobalBatch b = make_batch(lens, 5);
    CostModel cm = hand_model();
    cm.ring_bw = 1e5;
    PlanConfig cfg = {.n_ranks = 8, .capacity = 100, .pp = 1};
    Plan p;
    if (policy_plan(&p, "flexsp", &b, &cfg, &cm) != 0) fail_msg("%s", bs_errmsg());
    assert_int_equal(p.items[0].a2a, 1);
    SimResult r;
    simulate(&p, &cm, 1, &r);
    for (int32_t o = 0; o < r.n_ops; o++) {
        const SimOp *op = &r.ops[o];
        if (op->item == 0) assert_true(op->cost.comm > 0 && op->cost.ring_bytes > 0);
        else assert_true(op->cost.comm == 0);
    }
    assert_true(r.tokens == 700);
    PlanStats st;
    assert_int_equal(plan_stats(&p, &cm, &st), 0);
    assert_close(st.ring_bytes, r.ring_bytes, 1e-12, 0);  // tp 1: one device a rank
    // 300 tokens, 4 members, 2 layers, Q K V O of 20 bytes a token, forward and backward
    assert_close(st.ring_bytes, 2 * 2 * 20.0 * 300 * 3 / 4, 1e-12, 0);
    sim_result_free(&r);
    plan_free(&p);
    // a delayed sequence is not trained (docs/peers.md's wlb example: the 300 waits)
    Plan q;
    int64_t wl[] = {500, 450, 300, 100, 90, 60};
    GlobalBatch w = make_batch(wl, 6);
    CostModel wm = hand_model();
    wm.attn_pair = 1, wm.lin_token = 0, wm.n_layers = 1;
    PlanConfig wc = {.n_ranks = 2, .capacity = 800, .context = 800, .pp = 1};
    if (policy_plan(&q, "wlb", &w, &wc, &wm) != 0) fail_msg("%s", bs_errmsg());
    assert_int_equal(q.n_delayed, 1);
    simulate(&q, &wm, 1, &r);
    assert_true(r.tokens == 1200);
    sim_result_free(&r);
    plan_free(&q);
    batch_free(&w);
    batch_free(&b);
}

static void test_blocks(void **state) {
    (void)state;
    int64_t lens[] = {24, 8};
    GlobalBatch b = make_batch(lens, 2);
    CostModel cm = hand_model();
    cm.attn_pair = 1e-4, cm.attn_step = 1e-3, cm.ring_bw = 1e5;
    PlanConfig cfg = {.n_ranks = 2, .capacity = 16, .context = 32, .pp = 1};
    Plan p;
    if (policy_plan(&p, "blocks", &b, &cfg, &cm) != 0) fail_msg("%s", bs_errmsg());
    SimResult r;
    simulate(&p, &cm, 1, &r);
    double l = cm.n_layers;
    for (int32_t o = 0; o < r.n_ops; o++) {
        const SimOp *op = &r.ops[o];
        double phi = op->bwd ? 2.0 / 3.0 : 1.0 / 3.0, kv = op->bwd ? 22 + 22 : 22;
        assert_close(op->cost.ring_bytes, l * kv * cm.kv_token / 2, 1e-12, 0);  // per member
        // both members own 16 tokens and 168 pairs, each in a local and a remote call
        double work = cm.lin_token * 16 + cm.layer_const + cm.attn_pair * 168 + 2 * cm.attn_step;
        assert_close(op->cost.compute, l * phi * work + phi * cost_head_time(&cm, 16), 1e-9, 0);
        // forward, the fetch hides behind the local attention on H100 links; backward, the dK/dV
        // reduction after the remote part does not
        if (op->bwd) assert_true(op->cost.comm > 0);
        else assert_true(op->cost.comm == 0);
    }
    assert_true(r.tokens == 32);
    PlanStats st;
    assert_int_equal(plan_stats(&p, &cm, &st), 0);
    assert_close(st.ring_bytes, r.ring_bytes, 1e-12, 0);
    assert_close(st.ring_bytes, l * 66 * cm.kv_token, 1e-12, 0);
    // the model FLOPs (MFU) count each block's pairs against the start of its sequence: the same as
    // the whole sequences on one rank
    Plan whole;
    PlanConfig one = {.n_ranks = 1, .capacity = 32, .context = 32, .pp = 1};
    if (policy_plan(&whole, "static", &b, &one, &cm) != 0) fail_msg("%s", bs_errmsg());
    const ModelConfig *m = model_find("llama-7b");
    assert_close(sim_model_flops(m, &p), sim_model_flops(m, &whole), 1e-12, 0);
    plan_free(&whole);
    sim_result_free(&r);
    plan_free(&p);
    batch_free(&b);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_barriers_hold),
        cmocka_unit_test(test_a2a_and_delayed),
        cmocka_unit_test(test_blocks),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
