// seeds.c: one scenario over several seeds, every variant on each, reported as mean / min / max
// (seeds.h says why).
#include "bytescale/seeds.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "bytescale/error.h"

static const SimMetricInfo metrics[SIM_N_METRICS] = {
    [SIM_M_STEP_TIME] = {"step_time", "step_s", 1},
    [SIM_M_TOKENS_PER_S] = {"tokens_per_s", "tokens_per_s", 1},
    [SIM_M_SPEEDUP] = {"speedup_vs_static", "speedup_vs_static", 1},
    [SIM_M_MFU] = {"mfu", "mfu", 1},
    [SIM_M_BUSY_MEDIAN] = {"busy_median", "busy_median_s", 1},
    [SIM_M_COMM_MEDIAN] = {"comm_median", "comm_median_s", 1},
    [SIM_M_WAIT_MEDIAN] = {"wait_median", "wait_median_s", 1},
    [SIM_M_WAIT_MAX] = {"wait_max", "wait_max_s", 1},
    [SIM_M_SYNC_TIME] = {"sync_time", "sync_s", 1},
    [SIM_M_RING_BYTES] = {"ring_bytes", "ring_tb", 1e-12},
    [SIM_M_OFFLOAD_BYTES] = {"offload_bytes", "offload_tb", 1e-12},
    [SIM_M_ITEMS] = {"items", "items", 1},
    [SIM_M_RINGS] = {"rings", "rings", 1},
    [SIM_M_MAKESPAN_RATIO] = {"makespan_over_lower_bound", "makespan_over_lower_bound", 1},
    [SIM_M_MAKESPAN_HDP] = {"makespan_over_hdp_bound", "makespan_over_hdp_bound", 1},
    [SIM_M_TOKENS] = {"tokens", "tokens", 1},
    // wall-clock times vary run to run: in the table and JSON (as the single run has them), not the CSV
    [SIM_M_PLAN_SECONDS] = {"plan_seconds", "", 1},
    [SIM_M_SIM_SECONDS] = {"sim_seconds", "", 1},
    [SIM_M_BUSY_IMBALANCE] = {"busy_max_over_mean", "busy_max_over_mean", 1},
    [SIM_M_COMM_MEAN] = {"comm_mean", "comm_mean_s", 1},
    [SIM_M_WAIT_MEAN] = {"wait_mean", "wait_mean_s", 1},
    [SIM_M_LONGEST_ITEM] = {"longest_item", "longest_item_s", 1},
};

const SimMetricInfo *sim_metric_info(SimMetric m) { return &metrics[m]; }

SimStat sim_stat_of(const double *x, int n, int stride) {
    SimStat s = {0, INFINITY, -INFINITY};
    for (int k = 0; k < n; k++) {
        double v = x[(size_t)k * (size_t)stride];
        if (isnan(v)) return (SimStat){NAN, NAN, NAN};  // fmin / fmax would skip it
        s.mean += v;
        s.min = fmin(s.min, v);
        s.max = fmax(s.max, v);
    }
    s.mean /= n;
    return s;
}

static double mean_of(const double *x, int n) {
    double sum = 0;
    for (int i = 0; i < n; i++) sum += x[i];
    return n > 0 ? sum / n : NAN;
}

// One run's numbers in metric order. The speedup needs static's run on the same seed: filled later.
static void outcome_values(const SimOutcome *o, const Plan *p, double *x) {
    const SimResult *r = &o->res;
    double busy_mean = mean_of(r->busy, r->n_res), longest = 0;
    for (int32_t k = 0; k < p->n_items; k++) longest = fmax(longest, p->items[k].est_time);
    x[SIM_M_BUSY_IMBALANCE] = busy_mean > 0 ? r->busy_spread.max / busy_mean : NAN;
    x[SIM_M_COMM_MEAN] = mean_of(r->comm, r->n_res);
    x[SIM_M_WAIT_MEAN] = mean_of(r->wait, r->n_res);
    x[SIM_M_LONGEST_ITEM] = longest;
    x[SIM_M_STEP_TIME] = r->step_time;
    x[SIM_M_TOKENS_PER_S] = r->tokens_per_s;
    x[SIM_M_SPEEDUP] = NAN;
    x[SIM_M_MFU] = r->mfu;
    x[SIM_M_BUSY_MEDIAN] = r->busy_spread.median;
    x[SIM_M_COMM_MEDIAN] = r->comm_spread.median;
    x[SIM_M_WAIT_MEDIAN] = r->wait_spread.median;
    x[SIM_M_WAIT_MAX] = r->wait_spread.max;
    x[SIM_M_SYNC_TIME] = r->sync_time;
    x[SIM_M_RING_BYTES] = r->ring_bytes;
    x[SIM_M_OFFLOAD_BYTES] = r->offload_bytes;
    x[SIM_M_ITEMS] = o->n_items;
    x[SIM_M_RINGS] = r->n_rings;
    x[SIM_M_MAKESPAN_RATIO] = o->lower_bound > 0 ? o->planner_makespan / o->lower_bound : NAN;
    x[SIM_M_MAKESPAN_HDP] = o->hdp_bound > 0 ? o->planner_makespan / o->hdp_bound : NAN;
    x[SIM_M_TOKENS] = r->tokens;
    x[SIM_M_PLAN_SECONDS] = o->plan_seconds;
    x[SIM_M_SIM_SECONDS] = o->sim_seconds;
}

void sim_seeds_free(SimSeedsResult *r) {
    for (int j = 0; j < SIM_SEEDS_MAX_VARIANTS; j++) free(r->v[j].values);
    memset(r, 0, sizeof *r);
}

// The first and the last step's share of the run's simulated time (the last flushes).
static double first_flush_share(const SimSeedStats *st, int n) {
    const int M = SIM_N_METRICS;
    double total = 0;
    for (int k = 0; k < n; k++) total += st->values[(size_t)k * M + SIM_M_STEP_TIME];
    double edges = st->values[SIM_M_STEP_TIME] + (n > 1 ? st->values[(size_t)(n - 1) * M + SIM_M_STEP_TIME] : 0);
    return st->ok && total > 0 ? edges / total : NAN;
}

double sim_seeds_max_first_flush_share(const SimSeedsResult *r) {
    double most = NAN;
    for (int j = 0; j < r->n_v; j++)
        if (r->v[j].ok && !(r->v[j].first_flush_share <= most)) most = r->v[j].first_flush_share;
    return most;
}

double sim_seed_stats_run_tokens_per_s(const SimSeedStats *st) {
    double t = st->stat[SIM_M_STEP_TIME].mean;
    return st->ok && t > 0 ? st->stat[SIM_M_TOKENS].mean / t : NAN;
}

// The batch a policy plans at this step: the sequences its last step delayed (first, in order), then
// the seed's own. *own is set when it had to be built (batch_free it).
static int step_batch(const GlobalBatch *carry, const GlobalBatch *seed, GlobalBatch *out, int *own) {
    *own = 0;
    if (carry->n == 0) {
        *out = *seed;
        return 0;
    }
    if (batch_init(out, carry->n + seed->n) != 0) return -1;
    *own = 1;
    for (int pass = 0; pass < 2; pass++) {
        const GlobalBatch *b = pass ? seed : carry;
        for (int64_t i = 0; i < b->n; i++)
            if (batch_push(out, b->seqs[i].id, b->seqs[i].len, b->seqs[i].src) != 0) return -1;
    }
    return 0;
}

// The sequences plan p delays, as the next step's carry.
static int take_delayed(GlobalBatch *carry, const Plan *p) {
    batch_free(carry);
    if (batch_init(carry, p->n_delayed > 0 ? p->n_delayed : 1) != 0) return -1;
    for (int32_t d = 0; d < p->n_delayed; d++) {
        const Sequence *q = &p->batch.seqs[p->delayed[d]];
        if (batch_push(carry, q->id, q->len, q->src) != 0) return -1;
    }
    return 0;
}

static void advance(const SimSeedsConfig *cfg, int64_t by, const char *note) {
    if (!cfg->done) return;
    *cfg->done += by;
    if (cfg->progress) progress_update(cfg->progress, *cfg->done, note);
}

int sim_seeds_run(SimSeedsResult *out, const Scenario *sc, const SimVariant *v, int n_v, const SimSeedsConfig *cfg) {
    memset(out, 0, sizeof *out);
    if (n_v < 1 || n_v > SIM_SEEDS_MAX_VARIANTS)
        return bs_fail("%s: 1 to %d policies (got %d)", sc->name, SIM_SEEDS_MAX_VARIANTS, n_v);
    if (cfg->n_seeds < 1 || cfg->n_seeds > SIM_SEEDS_MAX)
        return bs_fail("%s: 1 to %d seeds (got %d)", sc->name, SIM_SEEDS_MAX, cfg->n_seeds);
    const int n = cfg->n_seeds, M = SIM_N_METRICS;
    out->sc = *sc;
    out->seed = cfg->seed;
    out->n_seeds = n;
    out->n_v = n_v;
    for (int j = 0; j < n_v; j++) {
        out->v[j].variant = v[j];
        out->v[j].ok = 1;
        out->v[j].values = bs_calloc((size_t)n * M, sizeof(double));
        if (!out->v[j].values) {
            sim_seeds_free(out);
            return -1;
        }
    }
    int js = -1;  // static, the baseline of the speedup
    for (int j = 0; j < n_v; j++)
        if (!strcmp(v[j].label, "static")) js = j;
    double sequences[SIM_SEEDS_MAX];  // per seed
    GlobalBatch carry[SIM_SEEDS_MAX_VARIANTS];  // per variant: the sequences its last step delayed
    memset(carry, 0, sizeof carry);
    int rc = 0;
    for (int k = 0; k < n && rc == 0; k++) {
        uint64_t seed = cfg->seed + (uint64_t)k;
        SimSetup s;
        if (sim_setup_init(&s, sc, seed) != 0) {
            sim_setup_free(&s);
            // the first seed's message stands alone: shapes that do not fit fail there, whatever the seed
            rc = k > 0 ? bs_fail_ctx("seed %llu", (unsigned long long)seed) : -1;
            break;
        }
        if (cfg->cm) s.cm = *cfg->cm;
        if (k == 0) {
            snprintf(out->hardware, sizeof out->hardware, "%s", s.hw.name);
            out->n_ranks = s.cluster.n_ranks;
        }
        sequences[k] = (double)s.batch.n;
        for (int j = 0; j < n_v && rc == 0; j++) {
            SimSeedStats *st = &out->v[j];
            if (!st->ok) {
                advance(cfg, 1, sc->name);
                continue;
            }
            SimOutcome o;
            Plan p;
            // this variant's step: its carried sequences first; the last seed's step flushes
            SimSetup t = s;
            int own = 0;
            t.flush = k == n - 1;
            t.carried = carry[j].n;
            if (step_batch(&carry[j], &s.batch, &t.batch, &own) != 0) {
                if (own) batch_free(&t.batch);
                rc = bs_fail_ctx("seed %llu", (unsigned long long)seed);
                break;
            }
            int run = sim_setup_run(&t, &v[j], &o, &p);
            if (run != 0) {
                if (own) batch_free(&t.batch);
                st->ok = 0;
                snprintf(st->why, sizeof st->why, "seed %llu: %s", (unsigned long long)seed, bs_errmsg());
                advance(cfg, 1, sc->name);
                continue;
            }
            outcome_values(&o, &p, &st->values[(size_t)k * M]);
            if (take_delayed(&carry[j], &p) != 0) rc = bs_fail_ctx("seed %llu", (unsigned long long)seed);
            if (rc == 0 && cfg->hook && cfg->hook(cfg->hook_ctx, &t, j, &o, &p) != 0) rc = -1;
            plan_free(&p);
            if (own) batch_free(&t.batch);
            sim_outcome_free(&o);
            advance(cfg, 1, sc->name);
        }
        // every variant has run on this seed: the per-seed speedups over static's run
        for (int j = 0; js >= 0 && j < n_v; j++) {
            double *x = &out->v[j].values[(size_t)k * M];
            double base = out->v[js].values[(size_t)k * M + SIM_M_TOKENS_PER_S];
            if (out->v[j].ok && out->v[js].ok && base > 0) x[SIM_M_SPEEDUP] = x[SIM_M_TOKENS_PER_S] / base;
        }
        sim_setup_free(&s);
    }
    for (int j = 0; j < n_v; j++) batch_free(&carry[j]);
    if (rc != 0) {
        sim_seeds_free(out);
        return -1;
    }
    out->sequences = sim_stat_of(sequences, n, 1);
    for (int j = 0; j < n_v; j++) {
        SimSeedStats *st = &out->v[j];
        for (int m = 0; m < M; m++)
            st->stat[m] = st->ok ? sim_stat_of(&st->values[m], n, M) : (SimStat){NAN, NAN, NAN};
        st->first_flush_share = first_flush_share(st, n);
    }
    return 0;
}

void sim_seeds_describe(FILE *f, const SimSeedsResult *r) {
    const Scenario *sc = &r->sc;
    char cap[24], ctx[24], tok[24], seqs[64], seeds[64];
    if (r->sequences.min == r->sequences.max) snprintf(seqs, sizeof seqs, "%.0f", r->sequences.min);
    else snprintf(seqs, sizeof seqs, "%.0f-%.0f", r->sequences.min, r->sequences.max);
    if (r->n_seeds == 1) snprintf(seeds, sizeof seeds, "seed %llu", (unsigned long long)r->seed);
    else
        snprintf(seeds, sizeof seeds, "seeds %llu..%llu", (unsigned long long)r->seed,
                 (unsigned long long)(r->seed + (uint64_t)r->n_seeds - 1));
    fprintf(f, "%s: %s on %d x %s (tp %d, pp %d: %d HDP ranks), C %s, context %s, %s, %s tokens (%s sequences), %s\n",
            sc->name, sc->model, sc->gpus, r->hardware, sc->tp, sc->pp, r->n_ranks,
            sim_tokens_text(cap, sizeof cap, sc->capacity), sim_tokens_text(ctx, sizeof ctx, sc->context), sc->dataset,
            sim_tokens_text(tok, sizeof tok, sc->tokens), seqs, seeds);
}

// 832400 -> "832.4K": tokens/s with its range must fit a column
static const char *count_text(char *buf, size_t n, double x) {
    if (x >= 1e6) snprintf(buf, n, "%.4gM", x / 1e6);
    else if (x >= 1e3) snprintf(buf, n, "%.4gK", x / 1e3);
    else snprintf(buf, n, "%.4g", x);
    return buf;
}

// Why one policy beats another, per policy: the per-(rank, stage) breakdown's means over the steps,
// and the first and flushing steps' share of the run (docs/simulator.md, "Runs").
static void breakdown_print(FILE *f, const SimSeedsResult *r) {
    fprintf(f, "%-12s %14s %14s %14s %15s %13s\n", "policy", "busy max/mean", "comm mean s", "wait mean s",
            "longest item s", "first+flush");
    for (int j = 0; j < r->n_v; j++) {
        const SimSeedStats *st = &r->v[j];
        if (!st->ok) continue;
        const SimStat *x = st->stat;
        fprintf(f, "%-12s %14.3f %14.3f %14.3f %15.3f %12.1f%%\n", st->variant.label, x[SIM_M_BUSY_IMBALANCE].mean,
                x[SIM_M_COMM_MEAN].mean, x[SIM_M_WAIT_MEAN].mean, x[SIM_M_LONGEST_ITEM].mean,
                100 * st->first_flush_share);
    }
}

void sim_seeds_table_print(FILE *f, const SimSeedsResult *r) {
    int several = r->n_seeds > 1;
    int wt = several ? 22 : 11, ws = several ? 17 : 7;  // tokens/s and vs stat, wider for [min-max]
    fprintf(f, "%-12s %9s %*s %*s %6s %8s %8s %8s %8s %9s %10s %6s %7s %7s %7s\n", "policy", "step s", wt, "tokens/s",
            ws, "vs stat", "MFU", "busy med", "comm med", "wait med", "wait max", "ring TB", "offload TB", "rings",
            "items", "plan s", "sim s");
    for (int j = 0; j < r->n_v; j++) {
        const SimSeedStats *st = &r->v[j];
        if (!st->ok) continue;
        const SimStat *x = st->stat;
        char tps[64], speed[48] = "-", a[16], b[16], c[16];
        const SimStat *t = &x[SIM_M_TOKENS_PER_S], *sp = &x[SIM_M_SPEEDUP];
        if (several) {
            snprintf(tps, sizeof tps, "%s [%s-%s]", count_text(a, sizeof a, t->mean), count_text(b, sizeof b, t->min),
                     count_text(c, sizeof c, t->max));
            if (!isnan(sp->mean)) snprintf(speed, sizeof speed, "%.2fx [%.2f-%.2f]", sp->mean, sp->min, sp->max);
        } else {  // one seed: the single run's table
            snprintf(tps, sizeof tps, "%.4g", t->mean);
            if (!isnan(sp->mean)) snprintf(speed, sizeof speed, "%.2fx", sp->mean);
        }
        fprintf(f, "%-12s %9.3f %*s %*s %5.1f%% %8.3f %8.3f %8.3f %8.3f %9.2f %10.2f %6.0f %7.0f %7.3f %7.3f\n",
                st->variant.label, x[SIM_M_STEP_TIME].mean, wt, tps, ws, speed,
                100 * x[SIM_M_MFU].mean, x[SIM_M_BUSY_MEDIAN].mean, x[SIM_M_COMM_MEDIAN].mean,
                x[SIM_M_WAIT_MEDIAN].mean, x[SIM_M_WAIT_MAX].mean, x[SIM_M_RING_BYTES].mean / 1e12,
                x[SIM_M_OFFLOAD_BYTES].mean / 1e12, x[SIM_M_RINGS].mean, x[SIM_M_ITEMS].mean,
                x[SIM_M_PLAN_SECONDS].mean, x[SIM_M_SIM_SECONDS].mean);
    }
    if (several) {
        fprintf(f, "mean over %d seeds (seeds %llu..%llu); min-max in brackets\n", r->n_seeds,
                (unsigned long long)r->seed, (unsigned long long)(r->seed + (uint64_t)r->n_seeds - 1));
        // the seeds as the steps of one run: total tokens over total time (seeds.h)
        fprintf(f, "run of %d steps, total tokens / total time:", r->n_seeds);
        for (int j = 0; j < r->n_v; j++) {
            char a[16];
            double run = sim_seed_stats_run_tokens_per_s(&r->v[j]);
            if (!isnan(run)) fprintf(f, " %s %s", r->v[j].variant.label, count_text(a, sizeof a, run));
        }
        fprintf(f, "\n");
        breakdown_print(f, r);
    }
}

cJSON *sim_seed_stats_json(const SimSeedStats *st) {
    cJSON *o = cJSON_CreateObject();
    if (!o) goto oom;
    cJSON_AddStringToObject(o, "policy", st->variant.label);
    cJSON_AddStringToObject(o, "planner", st->variant.policy);
    cJSON_AddBoolToObject(o, "offload", st->variant.offload);
    cJSON *mean = cJSON_AddObjectToObject(o, "mean"), *lo = cJSON_AddObjectToObject(o, "min"),
          *hi = cJSON_AddObjectToObject(o, "max");
    if (!mean || !lo || !hi) goto oom;
    for (int m = 0; m < SIM_N_METRICS; m++) {
        if (isnan(st->stat[m].mean)) continue;  // JSON has no NaN: an undefined metric is left out
        cJSON_AddNumberToObject(mean, metrics[m].json, st->stat[m].mean);
        cJSON_AddNumberToObject(lo, metrics[m].json, st->stat[m].min);
        cJSON_AddNumberToObject(hi, metrics[m].json, st->stat[m].max);
    }
    double run = sim_seed_stats_run_tokens_per_s(st);
    if (!isnan(run)) cJSON_AddNumberToObject(o, "run_tokens_per_s", run);
    if (!isnan(st->first_flush_share)) cJSON_AddNumberToObject(o, "first_flush_share", st->first_flush_share);
    return o;
oom:
    cJSON_Delete(o);
    bs_fail("out of memory building JSON");
    return NULL;
}
