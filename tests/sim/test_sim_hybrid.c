// test_sim_hybrid.c: the simulator's side of hybrid items (Item.ulysses, docs/simulator.md):
//   - on a cluster whose links are the cost model's, a hybrid item's forward + backward operations
//     take exactly the planner's estimate (cost_hybrid_item_time), its groups inside nodes;
//   - a hybrid whose groups straddle nodes pays the slow link for its all-to-alls: slower than that;
//   - the bytes the simulator moves are the bytes plan_stats counts, for hybrid, a2a, ring and pack
//     items in one plan.
#include "plan/plan_fixtures.h"
#include "sim/sim_fixtures.h"

#include "bytescale/error.h"
#include "bytescale/plan.h"
#include "bytescale/sim.h"

// The links of sim_fixtures.h's hand hardware (2 GPUs a node: 200 bytes/s, 1 ms inside; 100 bytes/s,
// 10 ms across) in the cost model, with 4 query heads and 1 K/V head per shard (GQA).
static CostModel model_of_hw(void) {
    CostModel cm = hand_model();
    cm.attn_pair = 1e-6;
    cm.attn_step = 1e-3;
    cm.head_token = 1e-4;
    cm.kv_token = 0.08, cm.a2a_token = 0.24;
    cm.a2a_heads = 4, cm.a2a_kv_heads = 1;
    cm.ring_bw = 100, cm.ring_lat = 0.01;
    cm.ring_bw_intra = 200, cm.ring_lat_intra = 0.001;
    cm.ranks_per_node = 2;
    return cm;
}

// Sequence 0 (1,200 tokens) as a hybrid of 2 groups of 2 on `ranks`; sequence 1 (600) as an a2a group
// on ranks 4, 5; sequence 2 (400) as a ring on 6, 7; sequence 3 (100) as a pack on rank 4. Finalized
// and valid.
static void build(Plan *p, GlobalBatch *b, const int32_t *ranks, const CostModel *cm) {
    int64_t lens[] = {1200, 600, 400, 100};
    *b = make_batch(lens, 4);
    assert_int_equal(plan_init(p, b, 8, 300, 1, "hand"), 0);
    Segment s[] = {{0, 0, 1200}, {1, 0, 600}, {2, 0, 400}, {3, 0, 100}};
    int32_t a2a[] = {4, 5}, ring[] = {6, 7}, pack[] = {4};
    assert_int_equal(plan_add_item(p, &s[0], 1, ranks, 4, 0), 0);
    assert_int_equal(plan_add_item(p, &s[1], 1, a2a, 2, 0), 1);
    assert_int_equal(plan_add_item(p, &s[2], 1, ring, 2, 0), 2);
    assert_int_equal(plan_add_item(p, &s[3], 1, pack, 1, 0), 3);
    p->items[0].ulysses = 2;
    p->items[1].a2a = 1;
    assert_int_equal(plan_finalize(p, cm), 0);
    if (plan_validate(p, cm) != 0) fail_msg("%s", bs_errmsg());
}

static void run(const Plan *p, const CostModel *cm, SimResult *r) {
    HardwareProfile hw = hand_hw(2);
    Cluster c;
    assert_int_equal(cluster_init(&c, &hw, 8, 1, 1), 0);
    SimConfig cfg = {cm, &c, NULL, NULL, 0};
    if (sim_run(r, p, &cfg) != 0) fail_msg("%s", bs_errmsg());
}

// The time item k's operations take on a member: forward + backward, compute and exposed traffic.
static double item_time(const SimResult *r, int32_t k) {
    double t = 0;
    for (int32_t o = 0; o < r->n_ops; o++)
        if (r->ops[o].item == k) t += r->ops[o].cost.compute + r->ops[o].cost.comm + r->ops[o].cost.offload;
    return t;
}

static void test_matches_estimate_and_stats(void **state) {
    (void)state;
    CostModel cm = model_of_hw();
    GlobalBatch b;
    Plan p;
    int32_t aligned[] = {0, 1, 2, 3};  // groups {0, 1} and {2, 3}: each inside a node
    build(&p, &b, aligned, &cm);
    SimResult r;
    run(&p, &cm, &r);
    int64_t seg = 1200;
    double est = cost_hybrid_item_time(&cm, &seg, 1, 2, 2, 0.0);
    assert_close(p.items[0].est_time, est, 1e-12, 0);
    assert_close(item_time(&r, 0), est, 1e-12, 0);
    // the other kinds as the cost model has them too (an a2a group of 2 and a ring of 2 in one node)
    assert_close(item_time(&r, 1), p.items[1].est_time, 1e-12, 0);
    assert_close(item_time(&r, 2), p.items[2].est_time, 1e-12, 0);
    PlanStats st;
    assert_int_equal(plan_stats(&p, &cm, &st), 0);
    assert_close(r.ring_bytes, st.ring_bytes, 1e-12, 0);
    // by hand, per layer (2 layers): the hybrid's all-to-alls 2 x (0.24 + 0.08) x 1200 / 2 = 384 and
    // ring 4 members x 4 x 0.08 x 600 = 768; the a2a group (K/V replicated too) 2 x 0.32 x 600 / 2 =
    // 192; the ring 0.08 x 400 x (3 x 2 - 2) = 128
    assert_close(st.ring_bytes, 2 * (384 + 768 + 192 + 128), 1e-12, 0);
    sim_result_free(&r);
    plan_free(&p);
    batch_free(&b);
    // groups {1, 2} and {3, 4} each span two nodes: the all-to-alls take the slow link, the plan's
    // estimate (which places groups inside nodes) is below the simulated time; the bytes are the same
    int32_t straddle[] = {1, 2, 3, 0};
    build(&p, &b, straddle, &cm);
    run(&p, &cm, &r);
    assert_true(item_time(&r, 0) > est * (1 + 1e-6));
    assert_int_equal(plan_stats(&p, &cm, &st), 0);
    assert_close(r.ring_bytes, st.ring_bytes, 1e-12, 0);
    sim_result_free(&r);
    plan_free(&p);
    batch_free(&b);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_matches_estimate_and_stats),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
