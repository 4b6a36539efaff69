// test_sim_invariants.c: properties of the simulated timeline over many random plans, and the
// simulator against two independent computations: a fixpoint schedule of the plan's items and the
// planner's own cost model (cost_item_time).
//
// Random plans: 2 to 12 HDP ranks, 1 to 3 pipeline stages, TP 1 or 2 on nodes of 4 GPUs, items of
// 1 to 3 sequences as packs or rings of 2 to 4 random ranks, some offloading; also the plans the
// real policies make for sampled batches of the paper's datasets.
#include "test_util.h"

#include <math.h>

#include "bytescale/batch.h"
#include "bytescale/cluster.h"
#include "bytescale/cost.h"
#include "bytescale/error.h"
#include "bytescale/plan.h"
#include "bytescale/policy.h"
#include "bytescale/rng.h"
#include "bytescale/sim.h"

static CostModel random_cm(Rng *g, int layers, int ranks_per_node) {
    CostModel cm;
    memset(&cm, 0, sizeof cm);
    cm.attn_pair = 1e-5 * (0.5 + rng_uniform(g));
    cm.lin_token = 1e-3 * (0.5 + rng_uniform(g));
    cm.layer_const = 1e-3 * rng_uniform(g);
    cm.act_token = 10;
    cm.n_layers = layers;
    cm.kv_token = 1 + 4 * rng_uniform(g);
    cm.ring_bw = 200 + 200 * rng_uniform(g);
    cm.ring_lat = 1e-3;
    cm.ring_bw_intra = 2000;
    cm.ring_lat_intra = 1e-4;
    cm.ranks_per_node = ranks_per_node;
    cm.offload_bw = 5000 + 5000 * rng_uniform(g);
    cm.grad_sync = 0.05 * rng_uniform(g);
    cm.optimizer = 0.01 * rng_uniform(g);
    cm.capacity_bytes = layers * 10.0 * 64;
    if (rng_below(g, 2)) {  // the embedding, head and loss, as a profile measures them
        cm.head_token = 2e-4 * rng_uniform(g);
        cm.head_const = 1e-3 * rng_uniform(g);
    }
    return cm;
}

static HardwareProfile links_like(const CostModel *cm) {
    HardwareProfile hw;
    memset(&hw, 0, sizeof hw);
    snprintf(hw.name, sizeof hw.name, "test");
    hw.gpus_per_node = 4;
    hw.peak_flops = 1e12;
    hw.efficiency = 1;
    hw.mem_bytes = 1e9;
    hw.intra_bw = cm->ring_bw_intra;
    hw.intra_lat = cm->ring_lat_intra;
    hw.inter_bw = cm->ring_bw;
    hw.inter_lat = cm->ring_lat;
    hw.host_bw = cm->offload_bw;
    hw.elem_bytes = 2;
    return hw;
}

// A random (valid) plan: every sequence once, in items on random distinct ranks.
static void random_plan(Plan *p, Rng *g, int n_ranks, int pp, const CostModel *cm) {
    int n_items = 1 + (int)rng_below(g, 30);
    GlobalBatch b;
    assert_int_equal(batch_init(&b, 3 * n_items), 0);
    int64_t n_seq = 0;
    int shape[64][2];  // (first sequence, count) per item
    for (int k = 0; k < n_items; k++) {
        int cnt = 1 + (int)rng_below(g, 3);
        shape[k][0] = (int)n_seq;
        shape[k][1] = cnt;
        for (int j = 0; j < cnt; j++) assert_int_equal(batch_push(&b, n_seq++, 1 + (int64_t)rng_below(g, 64), -1), 0);
    }
    assert_int_equal(plan_init(p, &b, n_ranks, 256, pp, "random"), 0);
    for (int k = 0; k < n_items; k++) {
        Segment segs[3];
        for (int j = 0; j < shape[k][1]; j++) segs[j] = (Segment){shape[k][0] + j, 0, b.seqs[shape[k][0] + j].len};
        int maxd = n_ranks < 4 ? n_ranks : 4;
        int D = rng_below(g, 2) ? 1 : 1 + (int)rng_below(g, (uint64_t)maxd);
        int32_t perm[16];
        for (int r = 0; r < n_ranks; r++) perm[r] = r;
        for (int r = n_ranks - 1; r > 0; r--) {
            int s = (int)rng_below(g, (uint64_t)r + 1);
            int32_t t = perm[r];
            perm[r] = perm[s];
            perm[s] = t;
        }
        double off = rng_below(g, 3) == 0 ? rng_uniform(g) : 0.0;
        assert_int_equal(plan_add_item(p, segs, shape[k][1], perm, D, off), k);
    }
    batch_free(&b);
    if (plan_finalize(p, cm) != 0) fail_msg("%s", bs_errmsg());
}

static double op_end(const SimOp *o) { return o->start + o->cost.compute + o->cost.comm + o->cost.offload; }

// Every property the simulator promises, checked from its outputs.
static void check_invariants(const SimResult *r, const Plan *p) {
    int pp = r->pp;
    double tol = 1e-9 * (1 + r->step_time);
    assert_int_equal(r->n_ops, 2 * pp * p->n_items);
    // where each (item, stage, direction) sits in ops
    int32_t *at = malloc(sizeof(int32_t) * (size_t)r->n_ops);
    assert_non_null(at);
    for (int i = 0; i < r->n_ops; i++) at[i] = -1;
    for (int i = 0; i < r->n_ops; i++) {
        const SimOp *o = &r->ops[i];
        int slot = (o->item * pp + o->stage) * 2 + o->bwd;
        assert_int_equal(at[slot], -1);
        at[slot] = i;
    }
    // 1. no resource runs two operations at once, and 2. each operation is listed exactly on the
    //    resources of its ring members (so all members start it at the same moment)
    int32_t *seen = calloc((size_t)r->n_ops, sizeof(int32_t));
    assert_non_null(seen);
    for (int res = 0; res < r->n_res; res++) {
        double t = 0;
        for (int k = r->res_begin[res]; k < r->res_begin[res + 1]; k++) {
            const SimOp *o = &r->ops[r->res_ops[k]];
            assert_int_equal(o->stage, res % pp);
            const Item *it = &p->items[o->item];
            int member = 0;
            for (int m = 0; m < it->n_ranks; m++) member |= p->ranks[it->rank_begin + m] == res / pp;
            assert_true(member);
            assert_true(o->start >= t - tol);
            assert_true(o->start >= o->ready - tol);
            t = op_end(o);
            seen[r->res_ops[k]]++;
        }
        assert_true(t <= r->stage_sync_start[res % pp] + tol);
    }
    for (int i = 0; i < r->n_ops; i++) assert_int_equal(seen[i], p->items[r->ops[i].item].n_ranks);
    // 3. busy + communication + wait = step time on every resource
    for (int res = 0; res < r->n_res; res++) {
        assert_true(r->busy[res] >= 0 && r->comm[res] >= 0 && r->wait[res] >= -tol);
        assert_close(r->busy[res] + r->comm[res] + r->wait[res], r->step_time, 1e-9, 1e-12);
    }
    // 4. data dependencies between stages
    for (int i = 0; i < p->n_items; i++)
        for (int s = 0; s < pp; s++) {
            const SimOp *f = &r->ops[at[(i * pp + s) * 2]], *b = &r->ops[at[(i * pp + s) * 2 + 1]];
            if (s > 0) assert_true(f->start >= op_end(&r->ops[at[(i * pp + s - 1) * 2]]) - tol);
            if (s == pp - 1) assert_true(b->start >= op_end(f) - tol);
            else assert_true(b->start >= op_end(&r->ops[at[(i * pp + s + 1) * 2 + 1]]) - tol);
        }
    // 5. as soon as possible: an operation starts when its input is ready or when the last of its
    //    members' previous operations ends, never later
    double *prev_end = calloc((size_t)r->n_ops, sizeof(double));
    assert_non_null(prev_end);
    for (int res = 0; res < r->n_res; res++) {
        double t = 0;
        for (int k = r->res_begin[res]; k < r->res_begin[res + 1]; k++) {
            int o = r->res_ops[k];
            if (t > prev_end[o]) prev_end[o] = t;
            t = op_end(&r->ops[o]);
        }
    }
    for (int i = 0; i < r->n_ops; i++) {
        double expect = fmax(r->ops[i].ready, prev_end[i]);
        assert_close(r->ops[i].start, expect, 0, tol);
    }
    free(prev_end);
    free(seen);
    free(at);
}

// Without PP: item start times by an independent computation, a fixpoint over the rank schedules
// (each item starts when all its members have finished their previous item), iterated in reverse
// order until nothing changes.
static void check_against_fixpoint(const SimResult *r, const Plan *p) {
    assert_int_equal(r->pp, 1);
    int n = p->n_items;
    double *dur = calloc((size_t)n, sizeof(double)), *start = calloc((size_t)n, sizeof(double));
    double *f_start = calloc((size_t)n, sizeof(double));
    assert_non_null(dur);
    assert_non_null(start);
    assert_non_null(f_start);
    for (int i = 0; i < r->n_ops; i++) {
        const SimOp *o = &r->ops[i];
        dur[o->item] += o->cost.compute + o->cost.comm + o->cost.offload;
        if (!o->bwd) f_start[o->item] = o->start;
    }
    for (int changed = 1, rounds = 0; changed; rounds++) {
        assert_true(rounds <= n + 1);
        changed = 0;
        for (int i = n - 1; i >= 0; i--) {
            const Item *it = &p->items[i];
            double s = 0;
            for (int m = 0; m < it->n_ranks; m++) {
                int rank = p->ranks[it->rank_begin + m];
                // the item before i on this rank
                for (int k = p->rank_begin[rank]; k < p->rank_begin[rank + 1]; k++)
                    if (p->rank_items[k] == i && k > p->rank_begin[rank]) {
                        int prev = p->rank_items[k - 1];
                        s = fmax(s, start[prev] + dur[prev]);
                    }
            }
            if (s != start[i]) start[i] = s, changed = 1;
        }
    }
    for (int i = 0; i < n; i++) assert_close(f_start[i], start[i], 1e-12, 1e-12);
    free(f_start);
    free(dur);
    free(start);
}

static void test_random_plans_keep_every_invariant(void **state) {
    (void)state;
    Rng g;
    rng_seed(&g, 20250301);
    for (int trial = 0; trial < 300; trial++) {
        int pp = 1 + (int)rng_below(&g, 3), tp = 1 + (int)rng_below(&g, 2);
        int n_ranks = 2 + (int)rng_below(&g, 11);
        int layers = 1 + (int)rng_below(&g, 5);
        CostModel cm = random_cm(&g, layers, 4 / tp);
        HardwareProfile hw = links_like(&cm);
        Cluster c;
        assert_int_equal(cluster_init(&c, &hw, n_ranks * tp * pp, tp, pp), 0);
        Plan p;
        random_plan(&p, &g, n_ranks, pp, &cm);
        SimConfig cfg = {&cm, &c, NULL, NULL, 0};
        SimResult r;
        if (sim_run(&r, &p, &cfg) != 0) fail_msg("trial %d: %s", trial, bs_errmsg());
        check_invariants(&r, &p);
        // never faster than the planner's bound
        assert_true(r.step_time >= p.lower_bound * (1 - 1e-12));
        if (pp == 1) {
            check_against_fixpoint(&r, &p);
            // the planner's estimate is the same schedule with its own (never slower) link
            // assumption, so the simulated compute phase is never shorter than its makespan
            assert_true(r.compute_end >= p.makespan * (1 - 1e-12));
        }
        sim_result_free(&r);
        plan_free(&p);
    }
}

// The simulator's per-operation costs against the planner's cost_item_time, an independent
// implementation of the same formulas: equal whenever the ring's link is the one the planner
// assumes (inside one node for D <= ranks per node, across nodes otherwise), never lower.
static void test_op_costs_match_the_planners_item_time(void **state) {
    (void)state;
    Rng g;
    rng_seed(&g, 7);
    int equal = 0, slower = 0;
    for (int trial = 0; trial < 200; trial++) {
        int tp = 1 + (int)rng_below(&g, 2), n_ranks = 2 + (int)rng_below(&g, 11);
        CostModel cm = random_cm(&g, 1 + (int)rng_below(&g, 5), 4 / tp);
        HardwareProfile hw = links_like(&cm);
        Cluster c;
        assert_int_equal(cluster_init(&c, &hw, n_ranks * tp, tp, 1), 0);
        Plan p;
        random_plan(&p, &g, n_ranks, 1, &cm);
        SimConfig cfg = {&cm, &c, NULL, NULL, 0};
        for (int i = 0; i < p.n_items; i++) {
            SimOpCost f = sim_op_cost(&cfg, &p, i, 0, 0), b = sim_op_cost(&cfg, &p, i, 0, 1);
            double t = f.compute + f.comm + f.offload + b.compute + b.comm + b.offload;
            const Item *it = &p.items[i];
            const int32_t *rk = p.ranks + it->rank_begin;
            int one_node = 1;
            for (int k = 0; k < it->n_ranks; k++) one_node &= cluster_node(&c, rk[k], 0) == cluster_node(&c, rk[0], 0);
            int same_link = it->n_ranks == 1 || (it->n_ranks <= cm.ranks_per_node) == one_node;
            if (same_link) {
                assert_close(t, it->est_time, 1e-12, 1e-15);
                equal++;
            } else {
                assert_true(t >= it->est_time * (1 - 1e-12));
                slower += t > it->est_time * (1 + 1e-9);
            }
        }
        plan_free(&p);
    }
    assert_true(equal > 100 && slower > 10);  // both cases were exercised
}

// The plans of the real policies on sampled batches of both datasets, with and without PP.
static void test_policy_plans_keep_every_invariant(void **state) {
    (void)state;
    const ModelConfig *m = model_find("llama-7b");
    const HardwareProfile *hw = hw_find("h100-sxm");
    assert_non_null(m);
    assert_non_null(hw);
    const char *policies[] = {"static", "naive", "balance"};
    const char *datasets[] = {"byted", "github"};
    for (int pp = 1; pp <= 2; pp++)
        for (int d = 0; d < 2; d++) {
            int tp = 2, gpus = 64 * pp;
            Cluster c;
            assert_int_equal(cluster_init(&c, hw, gpus, tp, pp), 0);
            CostModel cm;
            int64_t C = 8 << 10, ctx = 256 << 10;
            assert_int_equal(cost_derive(&cm, m, hw, tp, pp, c.n_ranks, C), 0);
            GlobalBatch b;
            if (batch_generate(&b, datasets[d], 11 + (uint64_t)d, 2 << 20, ctx) != 0) fail_msg("%s", bs_errmsg());
            for (int k = 0; k < 3; k++) {
                PlanConfig pc;
                memset(&pc, 0, sizeof pc);
                pc.n_ranks = c.n_ranks;
                pc.capacity = C;
                pc.context = ctx;
                pc.pp = pp;
                pc.offload = k > 0;
                Plan p;
                if (policy_plan(&p, policies[k], &b, &pc, &cm) != 0) fail_msg("%s: %s", policies[k], bs_errmsg());
                SimConfig cfg = {&cm, &c, m, hw, 0};
                SimResult r;
                if (sim_run(&r, &p, &cfg) != 0) fail_msg("%s: %s", policies[k], bs_errmsg());
                check_invariants(&r, &p);
                assert_true(r.step_time >= p.lower_bound);
                assert_true(r.mfu > 0 && r.mfu < 1);
                assert_close(r.tokens, (double)b.n_tokens, 0, 0);
                if (pp == 1) assert_true(r.compute_end >= p.makespan * (1 - 1e-12));
                sim_result_free(&r);
                plan_free(&p);
            }
            batch_free(&b);
        }
}

// MFU counts the exact attention area: against a brute-force count of visible pairs.
static void test_model_flops_count_the_exact_area(void **state) {
    (void)state;
    const ModelConfig *m = model_find("llama-7b");
    assert_non_null(m);
    const int64_t lens[] = {1, 7, 100, 33};
    GlobalBatch b;
    assert_int_equal(batch_init(&b, 4), 0);
    for (int i = 0; i < 4; i++) assert_int_equal(batch_push(&b, i, lens[i], -1), 0);
    Plan p;
    assert_int_equal(plan_init(&p, &b, 2, 256, 1, "flops"), 0);
    Segment s01[] = {{0, 0, 1}, {1, 0, 7}}, s2[] = {{2, 0, 100}}, s3[] = {{3, 0, 33}};
    int32_t r0[] = {0}, r01[] = {0, 1}, r1[] = {1};
    assert_int_equal(plan_add_item(&p, s01, 2, r0, 1, 0), 0);
    assert_int_equal(plan_add_item(&p, s2, 1, r01, 2, 0), 1);
    assert_int_equal(plan_add_item(&p, s3, 1, r1, 1, 0), 2);
    double pairs = 0, tokens = 0;
    for (int i = 0; i < 4; i++) {
        tokens += (double)lens[i];
        for (int64_t q = 0; q < lens[i]; q++)
            for (int64_t k = 0; k < lens[i]; k++) pairs += k <= q;
    }
    double d = m->d_model, attn = (double)m->n_heads * m->head_dim, kv = (double)m->n_kv_heads * m->head_dim;
    double lin = 2 * (2 * d * attn + 2 * d * kv) + 2 * 3 * d * m->d_ff;  // Q,O + K,V + SwiGLU, 2 FLOPs per MAC
    double want = 3 * (m->n_layers * (lin * tokens + 4 * attn * pairs) + 2 * d * m->vocab_size * tokens);
    assert_close(sim_model_flops(m, &p), want, 1e-12, 0);
    plan_free(&p);
    batch_free(&b);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_random_plans_keep_every_invariant),
        cmocka_unit_test(test_op_costs_match_the_planners_item_time),
        cmocka_unit_test(test_policy_plans_keep_every_invariant),
        cmocka_unit_test(test_model_flops_count_the_exact_area),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
