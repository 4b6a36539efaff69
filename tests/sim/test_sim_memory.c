// test_sim_memory.c: the peak device memory of a simulated step (sim_memory, docs/simulator.md
// "Memory") against independent computations: without PP items run one at a time, so a rank's peak
// is its largest item (plus the shared buffers of its longest one); with PP and k equal micro-batches
// on one rank, 1F1B keeps min(k, pp - s) of them on stage s (cost_pipe_in_flight, and never more over
// random plans); over random plans the peak lies between the largest item and the sum of all the
// rank's items; the paper's presets fit an 80 GB device.
#include "test_util.h"

#include <math.h>

#include "bytescale/batch.h"
#include "bytescale/cluster.h"
#include "bytescale/cost.h"
#include "bytescale/error.h"
#include "bytescale/plan.h"
#include "bytescale/rng.h"
#include "bytescale/scenario.h"
#include "bytescale/sim.h"
#include "sim/sim_fixtures.h"

// Round activation numbers; the times only have to make a valid timeline.
static CostModel hand_cm(int layers, double shared_token, double shared_const) {
    CostModel cm;
    memset(&cm, 0, sizeof cm);
    cm.attn_pair = 1e-5;
    cm.lin_token = 1e-3;
    cm.layer_const = 1e-3;
    cm.act_token = 10;
    cm.act_const = 100;
    cm.act_shared_token = shared_token;
    cm.act_shared_const = shared_const;
    cm.n_layers = layers;
    cm.kv_token = 2;
    cm.ring_bw = 100;
    cm.ring_lat = 0.01;
    cm.offload_bw = 1e4;
    cm.optimizer = 0.01;
    return cm;
}

// Eq. 3's per-rank activations written out (docs/cost-model.md), apart: the layers' part of n
// tokens at offload ratio r, and the shared buffers.
static double layers_by_hand(const CostModel *cm, double n, double r) {
    int l = cm->n_layers;
    double resident = r > 0 && l > 2 ? 2 + (1 - fmin(r, 1.0)) * (l - 2) : l;
    return resident * (cm->act_token * n + cm->act_const);
}

static double shared_by_hand(const CostModel *cm, double n) { return cm->act_shared_token * n + cm->act_shared_const; }

static void simulate(SimResult *r, SimMemory *mem, const Plan *p, const SimConfig *cfg) {
    if (sim_run(r, p, cfg) != 0) fail_msg("%s", bs_errmsg());
    if (sim_memory(mem, r, p, cfg) != 0) fail_msg("%s", bs_errmsg());
    assert_int_equal(mem->n_res, r->n_res);
}

// The peak fields are the largest resource, static + activations.
static void check_peak(const SimMemory *mem) {
    int best = 0;
    for (int k = 0; k < mem->n_res; k++)
        if (mem->act_peak[k] > mem->act_peak[best]) best = k;
    assert_int_equal(mem->peak.rank, best / mem->pp);
    assert_int_equal(mem->peak.stage, best % mem->pp);
    assert_true(mem->peak.act_bytes == mem->act_peak[best]);
    assert_true(mem->peak.static_bytes == mem->static_bytes);
    assert_true(mem->peak.peak_bytes == mem->static_bytes + mem->act_peak[best]);
}

// pp = 1: a rank runs its items one at a time (forward, backward, next item), so its activation peak
// is the largest item's layers plus the shared buffers of its longest micro-batch, once. Packs and
// rings (n = tokens / D on each member), with and without offloading, with and without shared buffers.
static void test_pp1_peak_is_the_largest_item(void **state) {
    (void)state;
    const int64_t lens[] = {100, 20, 300, 50, 40, 90, 7};
    GlobalBatch b;
    assert_int_equal(batch_init(&b, 7), 0);
    for (int i = 0; i < 7; i++) assert_int_equal(batch_push(&b, i, lens[i], -1), 0);
    for (int with_shared = 0; with_shared < 2; with_shared++) {
        CostModel cm = hand_cm(6, with_shared ? 3 : 0, with_shared ? 500 : 0);
        HardwareProfile hw = hand_hw(4);
        Cluster c;
        assert_int_equal(cluster_init(&c, &hw, 3, 1, 1), 0);
        Plan p;
        assert_int_equal(plan_init(&p, &b, 3, 256, 1, "hand"), 0);
        Segment a[] = {{0, 0, 100}, {1, 0, 20}}, ring[] = {{2, 0, 300}}, c1[] = {{3, 0, 50}}, d[] = {{4, 0, 40}},
                e[] = {{5, 0, 90}}, f[] = {{6, 0, 7}};
        int32_t r0[] = {0}, r01[] = {0, 1}, r1[] = {1}, r2[] = {2}, r12[] = {1, 2};
        const struct {
            const Segment *segs;
            int n_segs;
            const int32_t *ranks;
            int D;
            double r;
        } items[] = {{a, 2, r0, 1, 0}, {ring, 1, r01, 2, 0.5}, {c1, 1, r1, 1, 0}, {d, 1, r2, 1, 0},
                     {e, 1, r12, 2, 1.0}, {f, 1, r2, 1, 0}};
        for (int i = 0; i < 6; i++)
            assert_int_equal(
                plan_add_item(&p, items[i].segs, items[i].n_segs, items[i].ranks, items[i].D, items[i].r), i);
        if (plan_finalize(&p, &cm) != 0) fail_msg("%s", bs_errmsg());
        SimConfig cfg = {&cm, &c, NULL, NULL, 0};
        SimResult r;
        SimMemory mem;
        simulate(&r, &mem, &p, &cfg);
        for (int rank = 0; rank < 3; rank++) {
            double layers = 0, shared = 0;
            for (int i = 0; i < 6; i++) {
                int on = 0;
                for (int m = 0; m < items[i].D; m++) on |= items[i].ranks[m] == rank;
                if (!on) continue;
                double n = (double)p.items[i].tokens / items[i].D;
                layers = fmax(layers, layers_by_hand(&cm, n, items[i].r));
                shared = fmax(shared, shared_by_hand(&cm, n));
            }
            assert_close(mem.act_peak[rank], layers + shared, 1e-12, 0);
        }
        // by hand, rank 0: the ring's 150 tokens at r = 0.5 keep 2 + 0.5 x 4 = 4 layers of 1,600
        // bytes (6,400); the pack of 120 keeps all 6 layers of 1,300 (7,800); shared: 3 x 150 + 500
        assert_close(mem.act_peak[0], 7800 + with_shared * 950.0, 1e-12, 0);
        // without a model and hardware the static part is not known
        assert_true(mem.static_bytes == 0);
        check_peak(&mem);
        sim_memory_free(&mem);
        sim_result_free(&r);
        plan_free(&p);
    }
    batch_free(&b);
}

// pp > 1, k equal micro-batches on one rank: 1F1B runs pp - 1 - s warm-up forwards on stage s before
// its first backward, so stage s holds min(k, pp - s) micro-batches at its peak (and the shared
// buffers once).
static void test_pipeline_holds_the_1f1b_micro_batches_in_flight(void **state) {
    (void)state;
    for (int pp = 2; pp <= 4; pp++)
        for (int k = 1; k <= 6; k++) {
            GlobalBatch b;
            assert_int_equal(batch_init(&b, k), 0);
            for (int i = 0; i < k; i++) assert_int_equal(batch_push(&b, i, 64, -1), 0);
            CostModel cm = hand_cm(4, 2, 300);
            HardwareProfile hw = hand_hw(8);
            Cluster c;
            assert_int_equal(cluster_init(&c, &hw, pp, 1, pp), 0);
            Plan p;
            assert_int_equal(plan_init(&p, &b, 1, 64, pp, "hand"), 0);
            int32_t r0[] = {0};
            for (int i = 0; i < k; i++) {
                Segment s = {i, 0, 64};
                assert_int_equal(plan_add_item(&p, &s, 1, r0, 1, 0), i);
            }
            if (plan_finalize(&p, &cm) != 0) fail_msg("%s", bs_errmsg());
            SimConfig cfg = {&cm, &c, NULL, NULL, 0};
            SimResult r;
            SimMemory mem;
            simulate(&r, &mem, &p, &cfg);
            double one = layers_by_hand(&cm, 64, 0);  // 4 x (10 x 64 + 100)
            for (int s = 0; s < pp; s++) {
                int in_flight = cost_pipe_in_flight(pp, s, k);  // the engine's count (train's budget)
                assert_int_equal(in_flight, k < pp - s ? k : pp - s);
                assert_close(mem.act_peak[s], in_flight * one + shared_by_hand(&cm, 64), 1e-12, 0);
            }
            assert_int_equal(mem.peak.rank, 0);
            assert_int_equal(mem.peak.stage, 0);  // stage 0 holds the most
            check_peak(&mem);
            sim_memory_free(&mem);
            sim_result_free(&r);
            plan_free(&p);
            batch_free(&b);
        }
}

// A random valid plan: every sequence once, items of 1 to 3 sequences as packs or rings of random
// distinct ranks, some offloading.
static void random_plan(Plan *p, Rng *g, int n_ranks, int pp, const CostModel *cm) {
    int n_items = 1 + (int)rng_below(g, 30);
    GlobalBatch b;
    assert_int_equal(batch_init(&b, 3 * n_items), 0);
    int first[32], count[32];
    int64_t n_seq = 0;
    for (int k = 0; k < n_items; k++) {
        first[k] = (int)n_seq;
        count[k] = 1 + (int)rng_below(g, 3);
        for (int j = 0; j < count[k]; j++)
            assert_int_equal(batch_push(&b, n_seq++, 1 + (int64_t)rng_below(g, 64), -1), 0);
    }
    assert_int_equal(plan_init(p, &b, n_ranks, 256, pp, "random"), 0);
    for (int k = 0; k < n_items; k++) {
        Segment segs[3];
        for (int j = 0; j < count[k]; j++) segs[j] = (Segment){first[k] + j, 0, b.seqs[first[k] + j].len};
        int D = rng_below(g, 2) ? 1 : 1 + (int)rng_below(g, (uint64_t)(n_ranks < 4 ? n_ranks : 4));
        int32_t perm[16];
        for (int r = 0; r < n_ranks; r++) perm[r] = r;
        for (int r = n_ranks - 1; r > 0; r--) {
            int s = (int)rng_below(g, (uint64_t)r + 1);
            int32_t t = perm[r];
            perm[r] = perm[s], perm[s] = t;
        }
        double off = rng_below(g, 3) == 0 ? rng_uniform(g) : 0.0;
        assert_int_equal(plan_add_item(p, segs, count[k], perm, D, off), k);
    }
    batch_free(&b);
    if (plan_finalize(p, cm) != 0) fail_msg("%s", bs_errmsg());
}

// Over random plans (2-12 ranks, pp 1-3, packs and rings, offloading, shared buffers or none), on
// every resource: the peak holds at least any one of the rank's items (cost_rank_act) and at most
// all of them at once; without PP it is exactly the largest item's layers plus the largest shared
// buffers.
static void test_random_plans_peak_between_one_item_and_all(void **state) {
    (void)state;
    Rng g;
    rng_seed(&g, 20250721);
    for (int trial = 0; trial < 300; trial++) {
        int pp = 1 + (int)rng_below(&g, 3), n_ranks = 2 + (int)rng_below(&g, 11);
        int layers = 1 + (int)rng_below(&g, 6);
        int shared = (int)rng_below(&g, 2);
        CostModel cm = hand_cm(layers, shared ? 7 * rng_uniform(&g) : 0, shared ? 1000 * rng_uniform(&g) : 0);
        cm.act_token = 1 + 20 * rng_uniform(&g);
        cm.act_const = 200 * rng_uniform(&g);
        HardwareProfile hw = hand_hw(4);
        Cluster c;
        assert_int_equal(cluster_init(&c, &hw, n_ranks * pp, 1, pp), 0);
        Plan p;
        random_plan(&p, &g, n_ranks, pp, &cm);
        SimConfig cfg = {&cm, &c, NULL, NULL, 0};
        SimResult r;
        SimMemory mem;
        simulate(&r, &mem, &p, &cfg);
        for (int rank = 0; rank < n_ranks; rank++) {
            double largest = 0, sum = 0, layers_max = 0, shared_max = 0;
            for (int q = p.rank_begin[rank]; q < p.rank_begin[rank + 1]; q++) {
                const Item *it = &p.items[p.rank_items[q]];
                double n = (double)it->tokens / it->n_ranks, one = cost_rank_act(&cm, n, it->offload);
                largest = fmax(largest, one);
                sum += one;
                layers_max = fmax(layers_max, layers_by_hand(&cm, n, it->offload));
                shared_max = fmax(shared_max, shared_by_hand(&cm, n));
            }
            int n_items = p.rank_begin[rank + 1] - p.rank_begin[rank];
            for (int s = 0; s < pp; s++) {
                // the walk never holds more micro-batches than cost_pipe_in_flight says (the count
                // the engine's per-process budget is shared among)
                int held = 0, most = 0, k = rank * pp + s;
                for (int32_t q = r.res_begin[k]; q < r.res_begin[k + 1]; q++) {
                    held += r.ops[r.res_ops[q]].bwd ? -1 : 1;
                    most = held > most ? held : most;
                }
                if (most > cost_pipe_in_flight(pp, s, n_items))
                    fail_msg("trial %d, rank %d, stage %d of %d: %d micro-batches in flight of %d", trial, rank, s, pp,
                             most, n_items);
                double peak = mem.act_peak[rank * pp + s];
                if (peak < largest * (1 - 1e-12) || peak > sum * (1 + 1e-12))
                    fail_msg("trial %d, rank %d, stage %d: peak %.9g outside [%.9g, %.9g]", trial, rank, s, peak,
                             largest, sum);
                if (pp == 1) assert_close(peak, layers_max + shared_max, 1e-12, 1e-9);
            }
        }
        check_peak(&mem);
        sim_memory_free(&mem);
        sim_result_free(&r);
        plan_free(&p);
    }
}

// With a model and hardware the static part is cost_memory's parameters, gradients and optimizer
// state (its most loaded stage), on every resource; a result of another plan is refused.
static void test_static_part_and_mismatch(void **state) {
    (void)state;
    const ModelConfig *m = model_find("tiny");
    const HardwareProfile *h100 = hw_find("h100-sxm");
    assert_non_null(m);
    assert_non_null(h100);
    GlobalBatch b;
    assert_int_equal(batch_init(&b, 3), 0);
    for (int i = 0; i < 3; i++) assert_int_equal(batch_push(&b, i, 100 + 10 * i, -1), 0);
    CostModel cm;
    assert_int_equal(cost_derive(&cm, m, h100, 1, 2, 2, 256), 0);
    Cluster c;
    assert_int_equal(cluster_init(&c, h100, 4, 1, 2), 0);
    Plan p;
    assert_int_equal(plan_init(&p, &b, 2, 256, 2, "hand"), 0);
    int32_t r0[] = {0}, r1[] = {1}, r01[] = {0, 1};
    Segment s0 = {0, 0, 100}, s1 = {1, 0, 110}, s2 = {2, 0, 120};
    assert_int_equal(plan_add_item(&p, &s0, 1, r0, 1, 0), 0);
    assert_int_equal(plan_add_item(&p, &s1, 1, r1, 1, 0), 1);
    assert_int_equal(plan_add_item(&p, &s2, 1, r01, 2, 0), 2);
    if (plan_finalize(&p, &cm) != 0) fail_msg("%s", bs_errmsg());
    SimConfig cfg = {&cm, &c, m, h100, 0};
    SimResult r;
    SimMemory mem;
    simulate(&r, &mem, &p, &cfg);
    CostMemory want;
    assert_int_equal(cost_memory(&want, m, h100, 1, 2, 2, 256), 0);
    assert_true(mem.static_bytes > 0);
    assert_close(mem.static_bytes, want.param_bytes + want.grad_bytes + want.optimizer_bytes, 1e-15, 0);
    check_peak(&mem);
    char text[320];
    sim_memory_text(text, sizeof text, &mem.peak, 80e9);
    assert_non_null(strstr(text, "of mem_bytes 80.0 GB: fits"));
    assert_false(sim_memory_exceeds(&mem.peak, 80e9));
    sim_memory_text(text, sizeof text, &mem.peak, mem.peak.peak_bytes * 0.5);
    assert_non_null(strstr(text, "200% of mem_bytes"));
    assert_non_null(strstr(text, "DOES NOT FIT"));
    assert_true(sim_memory_exceeds(&mem.peak, mem.peak.peak_bytes * 0.5));
    sim_memory_text(text, sizeof text, &mem.peak, 0);
    assert_non_null(strstr(text, "mem_bytes unknown"));
    assert_false(sim_memory_exceeds(&mem.peak, 0));
    sim_memory_free(&mem);
    // the result of a plan with other items is refused with a message, not read out of bounds
    Plan q;
    assert_int_equal(plan_init(&q, &b, 2, 256, 2, "other"), 0);
    assert_int_equal(plan_add_item(&q, &s0, 1, r0, 1, 0), 0);
    if (plan_finalize(&q, &cm) != 0) fail_msg("%s", bs_errmsg());
    assert_int_equal(sim_memory(&mem, &r, &q, &cfg), -1);
    assert_non_null(strstr(bs_errmsg(), "is not of this plan"));
    assert_null(mem.act_peak);
    plan_free(&q);
    sim_result_free(&r);
    plan_free(&p);
    batch_free(&b);
}

// Every preset of the paper's grid fits an 80 GB device at its simulated peak, 1F1B's in-flight
// micro-batches included (cost_memory alone counts one micro-batch): seed 1, static and balance.
static void test_presets_fit_at_their_simulated_peak(void **state) {
    (void)state;
    SimVariant v[2];
    assert_int_equal(sim_variant_find("static", &v[0]), 0);
    assert_int_equal(sim_variant_find("balance", &v[1]), 0);
    for (int i = 0; i < scenario_grid_count(); i++) {
        Scenario sc;
        assert_int_equal(scenario_get(i, &sc), 0);
        SimSetup s;
        if (sim_setup_init(&s, &sc, 1) != 0) fail_msg("%s", bs_errmsg());
        SimConfig cfg = sim_setup_config(&s);
        for (int j = 0; j < 2; j++) {
            SimOutcome o;
            Plan p;
            if (sim_setup_run(&s, &v[j], &o, &p) != 0) fail_msg("%s", bs_errmsg());
            SimMemory mem;
            if (sim_memory(&mem, &o.res, &p, &cfg) != 0) fail_msg("%s", bs_errmsg());
            if (sim_memory_exceeds(&mem.peak, s.hw.mem_bytes) || !(mem.peak.act_bytes > 0 && mem.static_bytes > 0)) {
                char text[320];
                fail_msg("%s, %s: %s", sc.name, v[j].label,
                         sim_memory_text(text, sizeof text, &mem.peak, s.hw.mem_bytes));
            }
            sim_memory_free(&mem);
            sim_outcome_free(&o);
            plan_free(&p);
        }
        sim_setup_free(&s);
    }
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_pp1_peak_is_the_largest_item),
        cmocka_unit_test(test_pipeline_holds_the_1f1b_micro_batches_in_flight),
        cmocka_unit_test(test_random_plans_peak_between_one_item_and_all),
        cmocka_unit_test(test_static_part_and_mismatch),
        cmocka_unit_test(test_presets_fit_at_their_simulated_peak),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
