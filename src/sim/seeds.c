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
    // wall-clock times vary run to run: in the table and JSON (as the single run has them), not the CSV
    [SIM_M_PLAN_SECONDS] = {"plan_seconds", "", 1},
    [SIM_M_SIM_SECONDS] = {"sim_seconds", "", 1},
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

// One run's numbers in metric order. The speedup needs static's run on the same seed: filled later.
static void outcome_values(const SimOutcome *o, double *x) {
    const SimResult *r = &o->res;
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
    x[SIM_M_PLAN_SECONDS] = o->plan_seconds;
    x[SIM_M_SIM_SECONDS] = o->sim_seconds;
}

void sim_seeds_free(SimSeedsResult *r) {
    for (int j = 0; j < SIM_SEEDS_MAX_VARIANTS; j++) free(r->v[j].values);
    memset(r, 0, sizeof *r);
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
            if (sim_setup_run(&s, &v[j], &o, cfg->hook ? &p : NULL) != 0) {
                st->ok = 0;
                snprintf(st->why, sizeof st->why, "seed %llu: %s", (unsigned long long)seed, bs_errmsg());
                advance(cfg, 1, sc->name);
                continue;
            }
            outcome_values(&o, &st->values[(size_t)k * M]);
            if (cfg->hook) {
                if (cfg->hook(cfg->hook_ctx, &s, j, &o, &p) != 0) rc = -1;
                plan_free(&p);
            }
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
    if (rc != 0) {
        sim_seeds_free(out);
        return -1;
    }
    out->sequences = sim_stat_of(sequences, n, 1);
    for (int j = 0; j < n_v; j++) {
        SimSeedStats *st = &out->v[j];
        for (int m = 0; m < M; m++)
            st->stat[m] = st->ok ? sim_stat_of(&st->values[m], n, M) : (SimStat){NAN, NAN, NAN};
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
    if (several)
        fprintf(f, "mean over %d seeds (seeds %llu..%llu); min-max in brackets\n", r->n_seeds,
                (unsigned long long)r->seed, (unsigned long long)(r->seed + (uint64_t)r->n_seeds - 1));
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
    return o;
oom:
    cJSON_Delete(o);
    bs_fail("out of memory building JSON");
    return NULL;
}
