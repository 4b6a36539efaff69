// test_sim_timeline.c: hand-computed timelines of small plans (2 to 8 ranks).
//
// Every expected time below is derived in the comments from the coefficients set in hand_cm():
//   attn_pair 0.006 s per visible pair, lin_token 0.003 s per token, layer_const 0.03 s (per layer,
//   forward + backward; forward is 1/3, backward 2/3), kv_token 1 byte per token,
//   links: inside a node 200 B/s + 0.001 s, across nodes 100 B/s + 0.01 s; 4 GPUs per node, tp 1,
//   act_token 10 B per token, offload_bw 100 B/s, grad_sync 0.5 s, optimizer 0.25 s.
// A pack of one sequence of s tokens therefore costs T(s) = 0.006 s(s+1)/2 + 0.003 s + 0.03 per
// layer: T(1) = 0.039, T(2) = 0.054, T(4) = 0.102, and {2, 3} together 0.006*9 + 0.003*5 + 0.03 = 0.099.
#include "test_util.h"

#include "sim/sim_fixtures.h"

#include <math.h>

#include "bytescale/batch.h"
#include "bytescale/cluster.h"
#include "bytescale/cost.h"
#include "bytescale/error.h"
#include "bytescale/plan.h"
#include "bytescale/sim.h"

#define EPS 1e-12

static CostModel hand_cm(int layers) {
    CostModel cm;
    memset(&cm, 0, sizeof cm);
    cm.attn_pair = 0.006;
    cm.lin_token = 0.003;
    cm.layer_const = 0.03;
    cm.act_token = 10;
    cm.act_const = 0;
    cm.n_layers = layers;
    cm.kv_token = 1;
    cm.ring_bw = 100;
    cm.ring_lat = 0.01;
    cm.ring_bw_intra = 200;
    cm.ring_lat_intra = 0.001;
    cm.ranks_per_node = 4;
    cm.offload_bw = 100;
    cm.grad_sync = 0.5;
    cm.optimizer = 0.25;
    cm.capacity_bytes = layers * 10.0 * 64;
    return cm;
}

typedef struct {
    int seqs[4], n_seqs;   // whole sequences of the batch
    int ranks[8], n_ranks; // ring order
    double r;              // offload ratio
} ItemSpec;

// A finalized plan over a batch of the given lengths.
static void build(Plan *p, const int64_t *lens, int n_lens, int n_ranks, int pp, const ItemSpec *items, int n_items,
                  const CostModel *cm) {
    GlobalBatch b;
    assert_int_equal(batch_init(&b, n_lens), 0);
    for (int i = 0; i < n_lens; i++) assert_int_equal(batch_push(&b, i, lens[i], -1), 0);
    assert_int_equal(plan_init(p, &b, n_ranks, 64, pp, "hand"), 0);
    batch_free(&b);
    for (int k = 0; k < n_items; k++) {
        Segment segs[4];
        for (int j = 0; j < items[k].n_seqs; j++) segs[j] = (Segment){items[k].seqs[j], 0, lens[items[k].seqs[j]]};
        assert_int_equal(plan_add_item(p, segs, items[k].n_seqs, items[k].ranks, items[k].n_ranks, items[k].r), k);
    }
    if (plan_finalize(p, cm) != 0) fail_msg("%s", bs_errmsg());
}

static void run(SimResult *r, const Plan *p, const CostModel *cm, const Cluster *c) {
    SimConfig cfg = {cm, c, NULL, NULL, 0};
    if (sim_run(r, p, &cfg) != 0) fail_msg("%s", bs_errmsg());
}

// The op of (item, stage, direction).
static const SimOp *find_op(const SimResult *r, int item, int stage, int bwd) {
    for (int i = 0; i < r->n_ops; i++)
        if (r->ops[i].item == item && r->ops[i].stage == stage && r->ops[i].bwd == bwd) return &r->ops[i];
    fail_msg("no op for item %d stage %d %s", item, stage, bwd ? "bwd" : "fwd");
    return NULL;
}

static double op_end(const SimOp *o) { return o->start + o->cost.compute + o->cost.comm + o->cost.offload; }

static void expect_op(const SimResult *r, int item, int stage, int bwd, double start, double end) {
    const SimOp *o = find_op(r, item, stage, bwd);
    assert_close(o->start, start, 0, EPS);
    assert_close(op_end(o), end, 0, EPS);
}

static Cluster hand_cluster(int gpus, int tp, int pp) {
    HardwareProfile hw = hand_hw(4);
    Cluster c;
    if (cluster_init(&c, &hw, gpus, tp, pp) != 0) fail_msg("%s", bs_errmsg());
    return c;
}

// ---- packs ------------------------------------------------------------------------------------

static void test_two_ranks_of_packs(void **state) {
    (void)state;
    // rank 0: item 0 = {4} (T = 0.102), item 2 = {1} (T = 0.039); rank 1: item 1 = {2, 3} (T = 0.099)
    const int64_t lens[] = {4, 2, 3, 1};
    ItemSpec items[] = {{{0}, 1, {0}, 1, 0}, {{1, 2}, 2, {1}, 1, 0}, {{3}, 1, {0}, 1, 0}};
    CostModel cm = hand_cm(1);
    Cluster c = hand_cluster(2, 1, 1);
    Plan p;
    build(&p, lens, 4, 2, 1, items, 3, &cm);
    SimResult r;
    run(&r, &p, &cm, &c);
    // rank 0: fwd 0 [0, 0.034], bwd 0 [0.034, 0.102], fwd 2 [0.102, 0.115], bwd 2 [0.115, 0.141]
    expect_op(&r, 0, 0, 0, 0.0, 0.034);
    expect_op(&r, 0, 0, 1, 0.034, 0.102);
    expect_op(&r, 2, 0, 0, 0.102, 0.115);
    expect_op(&r, 2, 0, 1, 0.115, 0.141);
    // rank 1: fwd 1 [0, 0.033], bwd 1 [0.033, 0.099]
    expect_op(&r, 1, 0, 0, 0.0, 0.033);
    expect_op(&r, 1, 0, 1, 0.033, 0.099);
    // compute ends at 0.141; + sync 0.5 + optimizer 0.25 = 0.891
    assert_close(r.compute_end, 0.141, 0, EPS);
    assert_close(r.step_time, 0.891, 0, EPS);
    assert_close(r.tokens_per_s, 10 / 0.891, 1e-12, 0);
    // rank 0 busy 0.141 + 0.25, rank 1 busy 0.099 + 0.25 and waits 0.141 - 0.099 = 0.042
    assert_close(r.busy[0], 0.391, 0, EPS);
    assert_close(r.busy[1], 0.349, 0, EPS);
    assert_close(r.wait[0], 0.0, 0, EPS);
    assert_close(r.wait[1], 0.042, 0, EPS);
    assert_close(r.comm[0], 0.5, 0, EPS);
    assert_close(r.ring_bytes, 0, 0, 0);
    assert_int_equal(r.n_rings, 0);
    sim_result_free(&r);
    plan_free(&p);
}

// ---- rings ------------------------------------------------------------------------------------

static void test_ring_of_two_inside_a_node(void **state) {
    (void)state;
    // one sequence of 8 tokens on ranks {0, 1} (node 0): n = 4 tokens each, area 36.
    // forward, per layer: linear (0.003*4 + 0.03)/3 = 0.014; block b = 0.006*36/4/3 = 0.018;
    //   K/V transfer x = 4 B / 200 + 0.001 = 0.021 > b: attention 0.018 + 0.021 = 0.039,
    //   compute 0.014 + 2*0.018 = 0.050, exposed 0.039 - 0.036 = 0.003; total 0.053
    // backward: linear 0.028; b = 0.036; x = 8 B / 200 + 0.001 = 0.041; dK/dV home 0.021:
    //   attention 0.036 + 0.041 + 0.021 = 0.098, compute 0.028 + 0.072 = 0.100, exposed 0.026
    // item: 0.053 + 0.126 = 0.179
    const int64_t lens[] = {8};
    ItemSpec items[] = {{{0}, 1, {0, 1}, 2, 0}};
    CostModel cm = hand_cm(1);
    Cluster c = hand_cluster(8, 1, 1);
    Plan p;
    build(&p, lens, 1, 8, 1, items, 1, &cm);
    SimResult r;
    run(&r, &p, &cm, &c);
    const SimOp *f = find_op(&r, 0, 0, 0), *b = find_op(&r, 0, 0, 1);
    assert_close(f->cost.compute, 0.050, 0, EPS);
    assert_close(f->cost.comm, 0.003, 0, EPS);
    assert_close(b->cost.compute, 0.100, 0, EPS);
    assert_close(b->cost.comm, 0.026, 0, EPS);
    expect_op(&r, 0, 0, 1, 0.053, 0.179);
    // bytes per member device: forward 1 x 4, backward (2 + 1) x 4 = 12; two members
    assert_close(r.ring_bytes, 32, 0, EPS);
    assert_int_equal(r.n_rings, 1);
    // the planner's estimate uses the intra-node link for D = 2 <= 4 ranks per node: the same
    assert_close(p.items[0].est_time, 0.179, 0, EPS);
    // ranks 2..7 do nothing and wait the whole compute phase
    assert_close(r.wait[5], 0.179, 0, EPS);
    sim_result_free(&r);
    plan_free(&p);
}

static void test_ring_of_four_across_nodes(void **state) {
    (void)state;
    // one sequence of 16 tokens on ranks {2, 3, 4, 5}: nodes 0, 0, 1, 1, so the ring's slowest hop
    // crosses nodes (100 B/s + 0.01 s). n = 4 tokens each, area 136.
    // forward: linear 0.014; b = 0.006*136/16/3 = 0.017; x = 4/100 + 0.01 = 0.05:
    //   attention 0.017 + 3*0.05 = 0.167, compute 0.014 + 4*0.017 = 0.082, exposed 0.099
    // backward: linear 0.028; b = 0.034; x = 8/100 + 0.01 = 0.09, home 0.05:
    //   attention 0.034 + 3*0.09 + 0.05 = 0.354, compute 0.028 + 0.136 = 0.164, exposed 0.218
    const int64_t lens[] = {16};
    ItemSpec items[] = {{{0}, 1, {2, 3, 4, 5}, 4, 0}};
    CostModel cm = hand_cm(1);
    Cluster c = hand_cluster(8, 1, 1);
    Plan p;
    build(&p, lens, 1, 8, 1, items, 1, &cm);
    SimResult r;
    run(&r, &p, &cm, &c);
    const SimOp *f = find_op(&r, 0, 0, 0), *b = find_op(&r, 0, 0, 1);
    assert_close(f->cost.compute, 0.082, 0, EPS);
    assert_close(f->cost.comm, 0.099, 0, EPS);
    assert_close(b->cost.compute, 0.164, 0, EPS);
    assert_close(b->cost.comm, 0.218, 0, EPS);
    expect_op(&r, 0, 0, 1, 0.181, 0.563);
    // bytes: per member 3*4 + 7*4 = 40; four members
    assert_close(r.ring_bytes, 160, 0, EPS);
    // the planner charges the same ring the intra-node link (D = 4 <= 4 ranks per node), so its
    // estimate is lower than what this placement costs: forward 0.014 + 0.017 + 3*0.021 = 0.094,
    // backward 0.028 + 0.034 + 3*0.041 + 0.021 = 0.206
    assert_close(p.items[0].est_time, 0.300, 0, EPS);
    // the same ring inside node 1 (ranks 4..7) costs what the planner says
    sim_result_free(&r);
    plan_free(&p);
    ItemSpec inside[] = {{{0}, 1, {4, 5, 6, 7}, 4, 0}};
    build(&p, lens, 1, 8, 1, inside, 1, &cm);
    run(&r, &p, &cm, &c);
    assert_close(op_end(find_op(&r, 0, 0, 1)), 0.300, 0, EPS);
    sim_result_free(&r);
    plan_free(&p);
}

static void test_ring_waits_for_a_busy_member(void **state) {
    (void)state;
    // item 0: {4} on rank 0 (0.102); item 1: the 8-token ring of test_ring_of_two_inside_a_node on
    // {0, 1} (0.179): rank 1 is free at 0 but must wait for rank 0 until 0.102, so the ring runs
    // [0.102, 0.281]; item 2: {1} on rank 1 (0.039) runs [0.281, 0.320].
    const int64_t lens[] = {4, 8, 1};
    ItemSpec items[] = {{{0}, 1, {0}, 1, 0}, {{1}, 1, {0, 1}, 2, 0}, {{2}, 1, {1}, 1, 0}};
    CostModel cm = hand_cm(1);
    Cluster c = hand_cluster(2, 1, 1);
    Plan p;
    build(&p, lens, 3, 2, 1, items, 3, &cm);
    SimResult r;
    run(&r, &p, &cm, &c);
    expect_op(&r, 1, 0, 0, 0.102, 0.155);
    expect_op(&r, 1, 0, 1, 0.155, 0.281);
    expect_op(&r, 2, 0, 0, 0.281, 0.294);
    expect_op(&r, 2, 0, 1, 0.294, 0.320);
    assert_close(r.compute_end, 0.320, 0, EPS);
    assert_close(r.step_time, 0.320 + 0.75, 0, EPS);
    // rank 1 waited 0.102 for the ring; rank 0 idles 0.320 - 0.281 = 0.039 before the sync
    assert_close(r.wait[1], 0.102, 0, EPS);
    assert_close(r.wait[0], 0.039, 0, EPS);
    // exposed ring time: 0.003 + 0.026 per member
    assert_close(r.comm[0], 0.029 + 0.5, 0, EPS);
    assert_close(r.exposed_comm, 2 * 0.029, 0, EPS);
    sim_result_free(&r);
    plan_free(&p);
}

// ---- offloading ---------------------------------------------------------------------------------

static void test_offload_that_cannot_hide(void **state) {
    (void)state;
    // {4} on one rank, 4 layers, r = 0.125 (exact in the plan's float): layers 0 and 1 move
    // 0.125 * 10 * 4 = 5 B each way at 100 B/s: 0.05 s per copy. A layer's forward is
    // 0.102/3 = 0.034 < 0.05: 0.016 exposed per copy, 0.032 in all; its backward (0.068) hides the
    // copy back in. Compute 4 * 0.102 = 0.408.
    const int64_t lens[] = {4};
    ItemSpec items[] = {{{0}, 1, {0}, 1, 0.125}};
    CostModel cm = hand_cm(4);
    Cluster c = hand_cluster(1, 1, 1);
    Plan p;
    build(&p, lens, 1, 1, 1, items, 1, &cm);
    SimResult r;
    run(&r, &p, &cm, &c);
    const SimOp *f = find_op(&r, 0, 0, 0), *b = find_op(&r, 0, 0, 1);
    assert_close(f->cost.offload, 0.032, 0, EPS);
    assert_close(b->cost.offload, 0.0, 0, EPS);
    assert_close(f->cost.compute, 0.136, 0, EPS);
    assert_close(op_end(b), 0.408 + 0.032, 0, EPS);
    // bytes: 2 layers x 5 B out + 2 x 5 B in
    assert_close(r.offload_bytes, 20, 0, EPS);
    assert_close(r.exposed_offload, 0.032, 0, EPS);
    assert_close(r.offload[0], 0.032, 0, EPS);
    // the planner's cost model charges the same
    assert_close(p.items[0].est_time, 0.440, 0, EPS);
    sim_result_free(&r);
    plan_free(&p);

    // r = 0.5: 20 B per copy, 0.2 s: forward exposes 2 * (0.2 - 0.034) = 0.332, backward
    // 2 * (0.2 - 0.068) = 0.264
    items[0].r = 0.5;
    build(&p, lens, 1, 1, 1, items, 1, &cm);
    run(&r, &p, &cm, &c);
    assert_close(find_op(&r, 0, 0, 0)->cost.offload, 0.332, 0, EPS);
    assert_close(find_op(&r, 0, 0, 1)->cost.offload, 0.264, 0, EPS);
    assert_close(r.compute_end, 0.408 + 0.596, 0, EPS);
    sim_result_free(&r);
    plan_free(&p);
}

// ---- pipeline parallelism ---------------------------------------------------------------------------

static void test_pp2_one_f_one_b_with_unequal_micro_batches(void **state) {
    (void)state;
    // one pipeline of 2 stages (1 layer each), micro-batches a = {4} (F 0.034, B 0.068),
    // b = {1} (F 0.013, B 0.026), c = {2} (F 0.018, B 0.036). 1F1B: stage 0 runs
    // F a, F b, B a, F c, B b, B c (one warm-up forward); stage 1 runs F a, B a, F b, B b, F c, B c.
    //   S0 F a [0, 0.034]            S1 F a [0.034, 0.068]
    //   S0 F b [0.034, 0.047]        S1 B a [0.068, 0.136]
    //   S1 F b [0.136, 0.149]        S0 B a [0.136, 0.204]  (waits for S1's B a)
    //   S0 F c [0.204, 0.222]        S1 B b [0.149, 0.175]
    //   S0 B b [0.222, 0.248]        S1 F c [0.222, 0.240]  (waits for S0's F c)
    //   S1 B c [0.240, 0.276]        S0 B c [0.276, 0.312]
    const int64_t lens[] = {4, 1, 2};
    ItemSpec items[] = {{{0}, 1, {0}, 1, 0}, {{1}, 1, {0}, 1, 0}, {{2}, 1, {0}, 1, 0}};
    CostModel cm = hand_cm(1);
    Cluster c = hand_cluster(2, 1, 2);
    Plan p;
    build(&p, lens, 3, 1, 2, items, 3, &cm);
    SimResult r;
    run(&r, &p, &cm, &c);
    expect_op(&r, 0, 0, 0, 0.000, 0.034);
    expect_op(&r, 0, 1, 0, 0.034, 0.068);
    expect_op(&r, 1, 0, 0, 0.034, 0.047);
    expect_op(&r, 0, 1, 1, 0.068, 0.136);
    expect_op(&r, 1, 1, 0, 0.136, 0.149);
    expect_op(&r, 0, 0, 1, 0.136, 0.204);
    expect_op(&r, 2, 0, 0, 0.204, 0.222);
    expect_op(&r, 1, 1, 1, 0.149, 0.175);
    expect_op(&r, 1, 0, 1, 0.222, 0.248);
    expect_op(&r, 2, 1, 0, 0.222, 0.240);
    expect_op(&r, 2, 1, 1, 0.240, 0.276);
    expect_op(&r, 2, 0, 1, 0.276, 0.312);
    // the execution order of stage 0 is 1F1B
    const int want0[][2] = {{0, 0}, {1, 0}, {0, 1}, {2, 0}, {1, 1}, {2, 1}};
    for (int k = 0; k < 6; k++) {
        const SimOp *o = &r.ops[r.res_ops[r.res_begin[0] + k]];
        assert_int_equal(o->item, want0[k][0]);
        assert_int_equal(o->bwd, want0[k][1]);
    }
    // each stage syncs when it is done: stage 0 at 0.312 -> 1.062, stage 1 at 0.276 -> 1.026
    assert_close(r.stage_sync_start[0], 0.312, 0, EPS);
    assert_close(r.stage_sync_start[1], 0.276, 0, EPS);
    assert_close(r.step_time, 1.062, 0, EPS);
    // stage 0 waited 0.089 (before B a) + 0.028 (before B c); stage 1 waited 0.034 (start)
    // + 0.047 (before F c) + 0.036 (after its optimizer step, for stage 0)
    assert_close(r.wait[0], 0.117, 0, EPS);
    assert_close(r.wait[1], 0.117, 0, EPS);
    assert_close(r.busy[0], 0.195 + 0.25, 0, EPS);
    sim_result_free(&r);
    plan_free(&p);
}

// tp 2 x pp 2: the TP all-reduces on every operation and the stage messages between stages, as the
// engine executes them. On top of hand_cm(1): tp_token 2 B per token, tp_bw 100 B/s, tp_lat 0.001 s,
// so a ring all-reduce of b bytes is 2 (1/2) b / 100 + 2 x 0.001 and one of r rows 0.02 r + 0.002; dW
// shares 0.5 and 1 of lin_token (0.0015 r and 0.003 r); stage messages 1 B per token at 100 B/s + 0.002 s.
//   a = {4}: layer all-reduce 0.082; forward 0.034 + 2 x 0.082 = 0.198, on stage 0 + the embedding's
//            0.082 = 0.280; backward 0.068 + (0.082 - 0.006) + (0.082 - 0.012) = 0.214, on stage 1 + the
//            loss's (16 B: 0.162, 32 B: 0.322) and the head's 0.082 = 0.780; message 0.042
//   b = {1}: layer all-reduce 0.022; forward 0.013 + 0.044 = 0.057, stage 0: 0.079; backward 0.026 +
//            0.0205 + 0.019 = 0.0655, stage 1: + 0.042 + 0.082 + 0.022 = 0.2115; message 0.012
// 1F1B (stage 0: F a, F b, B a, B b; stage 1: F a, B a, F b, B b):
//   S0 F a [0, 0.280]          S1 F a [0.280 + 0.042 = 0.322, 0.520]
//   S0 F b [0.280, 0.359]      S1 B a [0.520, 1.300]
//   S0 B a [1.300 + 0.042 = 1.342, 1.556]
//   S1 F b [1.300, 1.357] (its input was there at 0.359 + 0.012)
//   S1 B b [1.357, 1.5685]     S0 B b [1.5685 + 0.012 = 1.5805, 1.646]
static void test_tp2_pp2_all_reduces_and_stage_messages(void **state) {
    (void)state;
    const int64_t lens[] = {4, 1};
    ItemSpec items[] = {{{0}, 1, {0}, 1, 0}, {{1}, 1, {0}, 1, 0}};
    CostModel cm = hand_cm(1);
    cm.tp = 2, cm.tp_token = 2, cm.tp_bw = 100, cm.tp_lat = 0.001, cm.tp_hide_qkv = 0.5, cm.tp_hide_mlp = 1;
    cm.stage_token = 1, cm.stage_bw = 100, cm.stage_lat = 0.002;
    Cluster c = hand_cluster(4, 2, 2);
    Plan p;
    build(&p, lens, 2, 1, 2, items, 2, &cm);
    SimResult r;
    run(&r, &p, &cm, &c);
    expect_op(&r, 0, 0, 0, 0.000, 0.280);
    expect_op(&r, 0, 1, 0, 0.322, 0.520);
    expect_op(&r, 1, 0, 0, 0.280, 0.359);
    expect_op(&r, 0, 1, 1, 0.520, 1.300);
    expect_op(&r, 0, 0, 1, 1.342, 1.556);
    expect_op(&r, 1, 1, 0, 1.300, 1.357);
    expect_op(&r, 1, 1, 1, 1.357, 1.5685);
    expect_op(&r, 1, 0, 1, 1.5805, 1.646);
    // the all-reduces are comm, not compute
    assert_close(find_op(&r, 0, 1, 0)->cost.tp, 0.164, 0, EPS);
    assert_close(find_op(&r, 0, 0, 0)->cost.tp, 0.246, 0, EPS);
    assert_close(find_op(&r, 0, 1, 1)->cost.tp, 0.146 + 0.566, 0, EPS);
    assert_close(find_op(&r, 1, 0, 1)->cost.tp, 0.0395, 0, EPS);
    assert_close(find_op(&r, 1, 0, 1)->cost.compute, 0.026, 0, EPS);
    assert_close(r.exposed_tp, (0.246 + 0.066 + 0.146 + 0.0395) + (0.164 + 0.044 + 0.712 + 0.1855), 0, EPS);
    assert_close(r.stage_msgs, 2 * 0.042 + 2 * 0.012, 0, EPS);
    // the step: stage 0 ends last, then its sync (0.5) and the optimizer (0.25)
    assert_close(r.step_time, 1.646 + 0.75, 0, EPS);
    sim_result_free(&r);
    plan_free(&p);
}

static void test_pp2_rings_with_different_schedules_do_not_deadlock(void **state) {
    (void)state;
    // Pipelines A = rank 0 and B = rank 1 share rings j (item 0) and i (item 2); B also has the pack
    // x (item 1) between them. Plain per-pipeline 1F1B would order stage 0 of A as F j, F i, B j and
    // of B as F j, F x, B j, F i: A waits in F i for B, B waits in B j for A. With the global keys,
    // slot(j) = 0, slot(x) = 1, slot(i) = 2, so on stage 0 F i (key 4) comes after B j (key 3) on
    // both pipelines. Every op of every item must be simulated and ring members start together.
    const int64_t lens[] = {8, 1, 8};
    ItemSpec items[] = {{{0}, 1, {0, 1}, 2, 0}, {{1}, 1, {1}, 1, 0}, {{2}, 1, {0, 1}, 2, 0}};
    CostModel cm = hand_cm(1);
    Cluster c = hand_cluster(4, 1, 2);
    Plan p;
    build(&p, lens, 3, 2, 2, items, 3, &cm);
    SimResult r;
    run(&r, &p, &cm, &c);
    assert_int_equal(r.n_ops, 12);
    // stage 0 order on A: F j, B j, F i, B i
    const int wantA[][2] = {{0, 0}, {0, 1}, {2, 0}, {2, 1}};
    for (int k = 0; k < 4; k++) {
        const SimOp *o = &r.ops[r.res_ops[r.res_begin[0] + k]];
        assert_int_equal(o->item, wantA[k][0]);
        assert_int_equal(o->bwd, wantA[k][1]);
    }
    // F i on stage 0 starts after B j on stage 0 ended
    assert_true(find_op(&r, 2, 0, 0)->start >= op_end(find_op(&r, 0, 0, 1)) - EPS);
    sim_result_free(&r);
    plan_free(&p);
}

// ---- misuse -----------------------------------------------------------------------------------------

static void test_mismatched_cluster_is_an_error(void **state) {
    (void)state;
    const int64_t lens[] = {4};
    ItemSpec items[] = {{{0}, 1, {0}, 1, 0}};
    CostModel cm = hand_cm(1);
    Cluster c = hand_cluster(8, 1, 1);  // 8 ranks, the plan has 2
    Plan p;
    build(&p, lens, 1, 2, 1, items, 1, &cm);
    SimResult r;
    SimConfig cfg = {&cm, &c, NULL, NULL, 0};
    assert_int_equal(sim_run(&r, &p, &cfg), -1);
    assert_non_null(strstr(bs_errmsg(), "2 HDP ranks"));
    plan_free(&p);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_two_ranks_of_packs),
        cmocka_unit_test(test_ring_of_two_inside_a_node),
        cmocka_unit_test(test_ring_of_four_across_nodes),
        cmocka_unit_test(test_ring_waits_for_a_busy_member),
        cmocka_unit_test(test_offload_that_cannot_hide),
        cmocka_unit_test(test_pp2_one_f_one_b_with_unequal_micro_batches),
        cmocka_unit_test(test_tp2_pp2_all_reduces_and_stage_messages),
        cmocka_unit_test(test_pp2_rings_with_different_schedules_do_not_deadlock),
        cmocka_unit_test(test_mismatched_cluster_is_an_error),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
