// test_sim_seeds.c: results over seeds (seeds.h). The aggregate of N seeds equals the mean / min /
// max computed here from N single runs (sim_setup_init + sim_setup_run, seed by seed); one seed is
// the single run; the speedup is the mean of the per-seed ratios; failures, the hook and the
// progress count; the seeds as the steps of one run (wlb's delayed sequences come back, the last
// step flushes, every policy trains every token once, the run's throughput is total over total, the
// first and flushing steps' share of it); the per-rank breakdown (imbalance, exposed communication,
// wait, the longest item) from each seed's own run and plan.
#include "test_util.h"

#include <math.h>

#include "bytescale/error.h"
#include "bytescale/scenario.h"
#include "bytescale/seeds.h"

// The runner test's scenario (test_sim_outputs.c): 128 GPUs (64 HDP ranks), 4M tokens, GitHub, 256K.
static Scenario small(void) {
    Scenario sc;
    if (scenario_find("7b-1024-github-256k", &sc) != 0) fail_msg("%s", bs_errmsg());
    sc.gpus = 128;
    sc.tokens = 4 << 20;
    snprintf(sc.name, sizeof sc.name, "small");
    return sc;
}

static void all_variants(SimVariant *v) {
    int n = sim_variant_count();
    assert_true(n <= SIM_SEEDS_MAX_VARIANTS);
    for (int j = 0; j < n; j++) v[j] = *sim_variant_at(j);
    assert_string_equal(v[0].label, "static");  // the speedup's baseline is among them
}

enum { N_SEEDS = 3, FIRST_SEED = 5 };

// One seed's value of a metric by hand, from a single run of that seed and its plan.
static double by_hand(const SimOutcome *o, const Plan *p, SimMetric m, double static_tps) {
    const SimResult *r = &o->res;
    double busy = 0, busy_max = 0, comm = 0, wait = 0, longest = 0;
    for (int i = 0; i < r->n_res; i++)
        busy += r->busy[i], busy_max = fmax(busy_max, r->busy[i]), comm += r->comm[i], wait += r->wait[i];
    for (int32_t k = 0; k < p->n_items; k++) longest = fmax(longest, p->items[k].est_time);
    switch (m) {
    case SIM_M_BUSY_IMBALANCE: return busy_max / (busy / r->n_res);
    case SIM_M_COMM_MEAN: return comm / r->n_res;
    case SIM_M_WAIT_MEAN: return wait / r->n_res;
    case SIM_M_LONGEST_ITEM: return longest;
    case SIM_M_STEP_TIME: return o->res.step_time;
    case SIM_M_TOKENS_PER_S: return o->res.tokens_per_s;
    case SIM_M_SPEEDUP: return o->res.tokens_per_s / static_tps;
    case SIM_M_MFU: return o->res.mfu;
    case SIM_M_RING_BYTES: return o->res.ring_bytes;
    case SIM_M_OFFLOAD_BYTES: return o->res.offload_bytes;
    case SIM_M_MAKESPAN_RATIO: return o->planner_makespan / o->lower_bound;
    case SIM_M_WAIT_MAX: return o->res.wait_spread.max;
    case SIM_M_ITEMS: return o->n_items;
    default: return NAN;
    }
}

static const SimMetric checked[] = {SIM_M_STEP_TIME, SIM_M_TOKENS_PER_S, SIM_M_SPEEDUP, SIM_M_MFU,    SIM_M_RING_BYTES,
                                    SIM_M_OFFLOAD_BYTES, SIM_M_MAKESPAN_RATIO, SIM_M_WAIT_MAX, SIM_M_ITEMS,
                                    SIM_M_BUSY_IMBALANCE, SIM_M_COMM_MEAN, SIM_M_WAIT_MEAN, SIM_M_LONGEST_ITEM};
enum { N_CHECKED = sizeof checked / sizeof checked[0] };

// The aggregate equals mean / min / max over single runs done here, seed by seed.
static void test_aggregate_equals_single_runs(void **state) {
    (void)state;
    Scenario sc = small();
    SimVariant v[SIM_SEEDS_MAX_VARIANTS];
    all_variants(v);
    int n_v = sim_variant_count();
    SimSeedsConfig cfg = {FIRST_SEED, N_SEEDS, NULL, NULL, NULL, NULL, NULL};
    SimSeedsResult r;
    if (sim_seeds_run(&r, &sc, v, n_v, &cfg) != 0) fail_msg("%s", bs_errmsg());
    assert_int_equal(r.n_seeds, N_SEEDS);
    assert_int_equal(r.n_ranks, 64);

    double want[SIM_SEEDS_MAX_VARIANTS][N_CHECKED][N_SEEDS];
    double seqs[N_SEEDS];
    for (int k = 0; k < N_SEEDS; k++) {
        SimSetup s;
        if (sim_setup_init(&s, &sc, FIRST_SEED + k) != 0) fail_msg("%s", bs_errmsg());
        seqs[k] = (double)s.batch.n;
        SimOutcome o[SIM_SEEDS_MAX_VARIANTS];
        Plan p[SIM_SEEDS_MAX_VARIANTS];
        for (int j = 0; j < n_v; j++)
            if (sim_setup_run(&s, &v[j], &o[j], &p[j]) != 0) fail_msg("%s", bs_errmsg());
        for (int j = 0; j < n_v; j++)
            for (int c = 0; c < N_CHECKED; c++)
                want[j][c][k] = by_hand(&o[j], &p[j], checked[c], o[0].res.tokens_per_s);
        for (int j = 0; j < n_v; j++) sim_outcome_free(&o[j]), plan_free(&p[j]);
        sim_setup_free(&s);
    }
    for (int j = 0; j < n_v; j++) {
        const SimSeedStats *st = &r.v[j];
        if (!st->ok) fail_msg("%s: %s", v[j].label, st->why);
        for (int c = 0; c < N_CHECKED; c++) {
            double sum = 0, lo = INFINITY, hi = -INFINITY;
            for (int k = 0; k < N_SEEDS; k++) {
                double x = want[j][c][k];
                sum += x, lo = fmin(lo, x), hi = fmax(hi, x);
                // the stored per-seed value is that seed's single run
                assert_close(st->values[k * SIM_N_METRICS + checked[c]], x, 1e-12, 0);
            }
            const SimStat *t = &st->stat[checked[c]];
            assert_close(t->mean, sum / N_SEEDS, 1e-12, 0);
            assert_close(t->min, lo, 1e-12, 0);
            assert_close(t->max, hi, 1e-12, 0);
        }
    }
    // static against itself is exactly 1 on every seed
    assert_true(r.v[0].stat[SIM_M_SPEEDUP].min == 1 && r.v[0].stat[SIM_M_SPEEDUP].max == 1);
    // the batches differ from seed to seed (else averaging would mean nothing)
    assert_true(seqs[0] != seqs[1] || seqs[1] != seqs[2]);
    SimStat sq = sim_stat_of(seqs, N_SEEDS, 1);
    assert_close(r.sequences.mean, sq.mean, 1e-12, 0);
    assert_true(r.sequences.min == sq.min && r.sequences.max == sq.max);
    sim_seeds_free(&r);
}

// The speedup is the mean of the per-seed ratios (each batch against static on the same batch),
// not the ratio of the mean tokens/s.
static void test_speedup_is_the_mean_of_per_seed_ratios(void **state) {
    (void)state;
    Scenario sc = small();
    SimVariant v[2];
    assert_int_equal(sim_variant_find("static", &v[0]), 0);
    assert_int_equal(sim_variant_find("balance", &v[1]), 0);
    SimSeedsConfig cfg = {FIRST_SEED, N_SEEDS, NULL, NULL, NULL, NULL, NULL};
    SimSeedsResult r;
    if (sim_seeds_run(&r, &sc, v, 2, &cfg) != 0) fail_msg("%s", bs_errmsg());
    double sum = 0;
    for (int k = 0; k < N_SEEDS; k++) {
        const double *s = &r.v[0].values[k * SIM_N_METRICS], *b = &r.v[1].values[k * SIM_N_METRICS];
        sum += b[SIM_M_TOKENS_PER_S] / s[SIM_M_TOKENS_PER_S];
    }
    assert_close(r.v[1].stat[SIM_M_SPEEDUP].mean, sum / N_SEEDS, 1e-12, 0);
    double of_means = r.v[1].stat[SIM_M_TOKENS_PER_S].mean / r.v[0].stat[SIM_M_TOKENS_PER_S].mean;
    print_message("balance over static: mean of ratios %.6f, ratio of means %.6f\n", sum / N_SEEDS, of_means);
    sim_seeds_free(&r);
    // without static there is nothing to compare with: the speedup is undefined, not 1
    if (sim_seeds_run(&r, &sc, &v[1], 1, &cfg) != 0) fail_msg("%s", bs_errmsg());
    assert_true(r.v[0].ok && isnan(r.v[0].stat[SIM_M_SPEEDUP].mean));
    assert_true(r.v[0].stat[SIM_M_TOKENS_PER_S].mean > 0);
    sim_seeds_free(&r);
}

// One seed: min = mean = max = the single run of that seed.
static void test_one_seed_is_the_single_run(void **state) {
    (void)state;
    Scenario sc = small();
    SimVariant v[SIM_SEEDS_MAX_VARIANTS];
    all_variants(v);
    int n_v = sim_variant_count();
    SimSeedsConfig cfg = {FIRST_SEED, 1, NULL, NULL, NULL, NULL, NULL};
    SimSeedsResult r;
    if (sim_seeds_run(&r, &sc, v, n_v, &cfg) != 0) fail_msg("%s", bs_errmsg());
    SimSetup s;
    if (sim_setup_init(&s, &sc, FIRST_SEED) != 0) fail_msg("%s", bs_errmsg());
    double static_tps = 0;
    for (int j = 0; j < n_v; j++) {
        SimOutcome o;
        Plan p;
        if (sim_setup_run(&s, &v[j], &o, &p) != 0) fail_msg("%s", bs_errmsg());
        if (j == 0) static_tps = o.res.tokens_per_s;
        for (int c = 0; c < N_CHECKED; c++) {
            const SimStat *t = &r.v[j].stat[checked[c]];
            double x = by_hand(&o, &p, checked[c], static_tps);
            assert_true(t->mean == x && t->min == x && t->max == x);
        }
        assert_true(r.v[j].first_flush_share == 1);  // one step is the first and the last
        sim_outcome_free(&o);
        plan_free(&p);
    }
    assert_true(r.sequences.mean == (double)s.batch.n);
    sim_setup_free(&s);
    sim_seeds_free(&r);
}

// A variant that cannot run (static needs d_cp = 2M / 8K = 256 ranks, the cluster has 64) is marked
// and says why; the others run, and their speedup over the missing static is undefined.
static void test_a_failing_variant_is_marked_and_the_rest_run(void **state) {
    (void)state;
    Scenario sc = small();
    sc.context = 2 << 20;
    SimVariant v[2];
    assert_int_equal(sim_variant_find("static", &v[0]), 0);
    assert_int_equal(sim_variant_find("balance", &v[1]), 0);
    SimSeedsConfig cfg = {FIRST_SEED, 2, NULL, NULL, NULL, NULL, NULL};
    SimSeedsResult r;
    if (sim_seeds_run(&r, &sc, v, 2, &cfg) != 0) fail_msg("%s", bs_errmsg());
    assert_false(r.v[0].ok);
    assert_non_null(strstr(r.v[0].why, "seed 5: "));
    assert_true(isnan(r.v[0].stat[SIM_M_TOKENS_PER_S].mean));
    assert_true(r.v[1].ok && r.v[1].stat[SIM_M_TOKENS_PER_S].mean > 0);
    assert_true(isnan(r.v[1].stat[SIM_M_SPEEDUP].mean));
    sim_seeds_free(&r);
    // a set-up that does not fit fails the whole run with the single run's message
    sc.gpus = 100, sc.tp = 8;
    assert_int_equal(sim_seeds_run(&r, &sc, v, 2, &cfg), -1);
    assert_non_null(strstr(bs_errmsg(), "100 GPUs are not a multiple of tp x pp"));
    cfg.n_seeds = 0;
    assert_int_equal(sim_seeds_run(&r, &sc, v, 2, &cfg), -1);
    assert_non_null(strstr(bs_errmsg(), "1 to 1024 seeds"));
}

typedef struct {
    int calls, stop_at;
    uint64_t seeds[64];
    int variants[64];
} HookLog;

static int hook(void *ctx, const SimSetup *s, int j, const SimOutcome *o, const Plan *p) {
    HookLog *h = ctx;
    assert_true(p->n_items == o->n_items && o->res.step_time > 0);
    h->seeds[h->calls] = s->seed;
    h->variants[h->calls] = j;
    if (++h->calls == h->stop_at) return bs_fail("stopped by the hook");
    return 0;
}

// The hook sees every (seed, variant) run in order with its plan, and can stop the run; the progress
// count is seeds x variants.
static void test_hook_and_progress(void **state) {
    (void)state;
    Scenario sc = small();
    SimVariant v[2];
    assert_int_equal(sim_variant_find("static", &v[0]), 0);
    assert_int_equal(sim_variant_find("balance", &v[1]), 0);
    HookLog h = {0, -1, {0}, {0}};
    int64_t done = 0;
    SimSeedsConfig cfg = {FIRST_SEED, N_SEEDS, NULL, NULL, &done, hook, &h};
    SimSeedsResult r;
    if (sim_seeds_run(&r, &sc, v, 2, &cfg) != 0) fail_msg("%s", bs_errmsg());
    assert_int_equal(h.calls, N_SEEDS * 2);
    assert_int_equal(done, N_SEEDS * 2);
    for (int i = 0; i < h.calls; i++) {
        assert_int_equal(h.seeds[i], FIRST_SEED + i / 2);
        assert_int_equal(h.variants[i], i % 2);
    }
    sim_seeds_free(&r);
    h = (HookLog){0, 3, {0}, {0}};
    assert_int_equal(sim_seeds_run(&r, &sc, v, 2, &cfg), -1);
    assert_string_equal(bs_errmsg(), "stopped by the hook");
    assert_int_equal(h.calls, 3);
}

// The seeds are the steps of one run: wlb's delayed sequences go into its next step and the last
// step flushes, so over the run wlb trains exactly the tokens of all the seeds' batches, as balance
// does step by step; the run's throughput is total tokens over total time.
static void test_run_carries_delayed(void **state) {
    (void)state;
    enum { N = 4 };
    Scenario sc = small();
    SimVariant v[2];
    assert_int_equal(sim_variant_find("balance", &v[0]), 0);
    assert_int_equal(sim_variant_find("wlb", &v[1]), 0);
    SimSeedsConfig cfg = {FIRST_SEED, N, NULL, NULL, NULL, NULL, NULL};
    SimSeedsResult r;
    if (sim_seeds_run(&r, &sc, v, 2, &cfg) != 0) fail_msg("%s", bs_errmsg());
    double batch[N], total = 0;
    for (int k = 0; k < N; k++) {
        SimSetup s;
        if (sim_setup_init(&s, &sc, FIRST_SEED + k) != 0) fail_msg("%s", bs_errmsg());
        batch[k] = (double)s.batch.n_tokens;
        total += batch[k];
        sim_setup_free(&s);
    }
    int moved = 0;
    for (int j = 0; j < 2; j++) {
        const SimSeedStats *st = &r.v[j];
        if (!st->ok) fail_msg("%s: %s", v[j].label, st->why);
        double tokens = 0, time = 0;
        for (int k = 0; k < N; k++) {
            double t = st->values[k * SIM_N_METRICS + SIM_M_TOKENS];
            if (j == 0) assert_true(t == batch[k]);  // balance trains its batch, every step
            else moved += t != batch[k];
            tokens += t;
            time += st->values[k * SIM_N_METRICS + SIM_M_STEP_TIME];
        }
        assert_true(tokens == total);  // every token of the run once
        assert_close(sim_seed_stats_run_tokens_per_s(st), tokens / time, 1e-12, 0);
        // the first and the last (flushing) step's share of the run's time
        double edges = st->values[SIM_M_STEP_TIME] + st->values[(N - 1) * SIM_N_METRICS + SIM_M_STEP_TIME];
        assert_close(st->first_flush_share, edges / time, 1e-12, 0);
        assert_true(st->first_flush_share > 0 && st->first_flush_share < 1);
    }
    assert_true(moved > 0);  // wlb delayed some sequences to a later step
    sim_seeds_free(&r);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_aggregate_equals_single_runs),
        cmocka_unit_test(test_speedup_is_the_mean_of_per_seed_ratios),
        cmocka_unit_test(test_one_seed_is_the_single_run),
        cmocka_unit_test(test_a_failing_variant_is_marked_and_the_rest_run),
        cmocka_unit_test(test_hook_and_progress),
        cmocka_unit_test(test_run_carries_delayed),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
