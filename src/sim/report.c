// report.c: the simulated step for a person (lines, tables) and for programs (JSON).
#include <math.h>
#include <string.h>

#include "bytescale/error.h"
#include "bytescale/scenario.h"
#include "bytescale/sim.h"

const char *sim_tokens_text(char *buf, size_t n, int64_t t) {
    if (t >= (1 << 20) && t % (1 << 20) == 0) snprintf(buf, n, "%lldM", (long long)(t >> 20));
    else if (t >= (1 << 10) && t % (1 << 10) == 0) snprintf(buf, n, "%lldK", (long long)(t >> 10));
    else snprintf(buf, n, "%lld", (long long)t);
    return buf;
}

const char *sim_bytes_text(char *buf, size_t n, double x) {
    static const char *units[] = {"B", "KB", "MB", "GB", "TB", "PB", "EB"};
    int u = 0;
    while (x >= 1000 && u < 6) x /= 1000, u++;
    snprintf(buf, n, u ? "%.1f %s" : "%.0f %s", x, units[u]);
    return buf;
}

int sim_memory_exceeds(const SimMemPeak *m, double mem_bytes) { return mem_bytes > 0 && m->peak_bytes > mem_bytes; }

const char *sim_memory_text(char *buf, size_t n, const SimMemPeak *m, double mem_bytes) {
    char peak[24], stat[24], act[24], mem[24];
    int used = snprintf(buf, n, "%s at rank %d, stage %d (static %s + activations %s), ",
                        sim_bytes_text(peak, sizeof peak, m->peak_bytes), m->rank, m->stage,
                        sim_bytes_text(stat, sizeof stat, m->static_bytes),
                        sim_bytes_text(act, sizeof act, m->act_bytes));
    if (used < 0 || (size_t)used >= n) return buf;
    if (mem_bytes > 0)
        snprintf(buf + used, n - (size_t)used, "%.0f%% of mem_bytes %s: %s", 100 * m->peak_bytes / mem_bytes,
                 sim_bytes_text(mem, sizeof mem, mem_bytes),
                 sim_memory_exceeds(m, mem_bytes) ? "DOES NOT FIT" : "fits");
    else snprintf(buf + used, n - (size_t)used, "mem_bytes unknown");
    return buf;
}

void sim_result_print(FILE *f, const SimResult *r) {
    fprintf(f, "step time        %.4f s  (compute phase %.4f s, gradient sync %.4f s, optimizer %.4f s)\n",
            r->step_time, r->compute_end, r->sync_time, r->optimizer_time);
    fprintf(f, "throughput       %.4g tokens/s", r->tokens_per_s);
    if (r->mfu > 0) fprintf(f, ", MFU %.1f%%", 100 * r->mfu);
    fprintf(f, "\n");
    fprintf(f, "per rank x stage busy %.4f / %.4f / %.4f s   comm %.4f / %.4f / %.4f s   wait %.4f / %.4f / %.4f s"
               "   (min / median / max over %d)\n",
            r->busy_spread.min, r->busy_spread.median, r->busy_spread.max, r->comm_spread.min,
            r->comm_spread.median, r->comm_spread.max, r->wait_spread.min, r->wait_spread.median,
            r->wait_spread.max, r->n_res);
    fprintf(f,
            "traffic          ring %.4g TB (exposed %.4g rank-s over %d rings), offload %.4g TB (exposed %.4g "
            "rank-s)\n",
            r->ring_bytes / 1e12, r->exposed_comm - r->exposed_tp, r->n_rings, r->offload_bytes / 1e12,
            r->exposed_offload);
    if (r->exposed_tp > 0 || r->stage_msgs > 0)
        fprintf(f, "3D               TP all-reduces exposed %.4g rank-s, stage-to-stage messages %.4g s (summed over "
                   "operations)\n",
                r->exposed_tp, r->stage_msgs);
}

void sim_setup_describe(FILE *f, const SimSetup *s) {
    const Scenario *sc = &s->sc;
    char cap[24], ctx[24], tok[24];
    fprintf(f, "%s: %s on %d x %s (tp %d, pp %d: %d HDP ranks), C %s, context %s, %s, %s tokens (%lld sequences), "
               "seed %llu\n",
            sc->name, sc->model, sc->gpus, s->hw.name, sc->tp, sc->pp, s->cluster.n_ranks,
            sim_tokens_text(cap, sizeof cap, sc->capacity), sim_tokens_text(ctx, sizeof ctx, sc->context), sc->dataset,
            sim_tokens_text(tok, sizeof tok, sc->tokens),
            (long long)s->batch.n, (unsigned long long)s->seed);
}

void sim_table_print(FILE *f, const SimOutcome *o, int n) {
    double base = 0;
    for (int i = 0; i < n; i++)
        if (!strcmp(o[i].variant.label, "static")) base = o[i].res.tokens_per_s;
    fprintf(f, "%-12s %9s %11s %7s %6s %8s %8s %8s %8s %9s %10s %6s %7s %7s %7s\n", "policy", "step s", "tokens/s",
            "vs stat", "MFU", "busy med", "comm med", "wait med", "wait max", "ring TB", "offload TB", "rings",
            "items", "plan s", "sim s");
    for (int i = 0; i < n; i++) {
        const SimResult *r = &o[i].res;
        char speed[16] = "-";
        if (base > 0) snprintf(speed, sizeof speed, "%.2fx", r->tokens_per_s / base);
        fprintf(f, "%-12s %9.3f %11.4g %7s %5.1f%% %8.3f %8.3f %8.3f %8.3f %9.2f %10.2f %6d %7d %7.3f %7.3f\n",
                o[i].variant.label, r->step_time, r->tokens_per_s, speed, 100 * r->mfu, r->busy_spread.median,
                r->comm_spread.median, r->wait_spread.median, r->wait_spread.max, r->ring_bytes / 1e12,
                r->offload_bytes / 1e12, r->n_rings, o[i].n_items, o[i].plan_seconds, o[i].sim_seconds);
    }
}

static cJSON *spread_json(const SimSpread *s) {
    cJSON *o = cJSON_CreateObject();
    if (!o) return NULL;
    cJSON_AddNumberToObject(o, "min", s->min);
    cJSON_AddNumberToObject(o, "median", s->median);
    cJSON_AddNumberToObject(o, "max", s->max);
    return o;
}

cJSON *sim_setup_json(const SimSetup *s) {
    const Scenario *sc = &s->sc;
    cJSON *o = cJSON_CreateObject();
    if (!o) {
        bs_fail("out of memory building JSON");
        return NULL;
    }
    cJSON_AddStringToObject(o, "scenario", sc->name);
    cJSON_AddStringToObject(o, "model", sc->model);
    cJSON_AddStringToObject(o, "hardware", s->hw.name);
    cJSON_AddNumberToObject(o, "gpus", sc->gpus);
    cJSON_AddNumberToObject(o, "tp", sc->tp);
    cJSON_AddNumberToObject(o, "pp", sc->pp);
    cJSON_AddNumberToObject(o, "hdp_ranks", s->cluster.n_ranks);
    cJSON_AddNumberToObject(o, "capacity", (double)sc->capacity);
    cJSON_AddNumberToObject(o, "context", (double)sc->context);
    cJSON_AddNumberToObject(o, "tokens", (double)sc->tokens);
    cJSON_AddStringToObject(o, "dataset", sc->dataset);
    cJSON_AddNumberToObject(o, "seed", (double)s->seed);
    cJSON_AddNumberToObject(o, "sequences", (double)s->batch.n);
    return o;
}

cJSON *sim_outcome_json(const SimOutcome *oc) {
    const SimResult *r = &oc->res;
    cJSON *o = cJSON_CreateObject();
    if (!o) {
        bs_fail("out of memory building JSON");
        return NULL;
    }
    cJSON_AddStringToObject(o, "policy", oc->variant.label);
    cJSON_AddStringToObject(o, "planner", oc->variant.policy);
    cJSON_AddBoolToObject(o, "offload", oc->variant.offload);
    cJSON_AddNumberToObject(o, "step_time", r->step_time);
    cJSON_AddNumberToObject(o, "compute_end", r->compute_end);
    cJSON_AddNumberToObject(o, "sync_time", r->sync_time);
    cJSON_AddNumberToObject(o, "optimizer_time", r->optimizer_time);
    cJSON_AddNumberToObject(o, "tokens_per_s", r->tokens_per_s);
    cJSON_AddNumberToObject(o, "mfu", r->mfu);
    cJSON_AddNumberToObject(o, "model_flops", r->model_flops);
    cJSON_AddItemToObject(o, "busy", spread_json(&r->busy_spread));
    cJSON_AddItemToObject(o, "comm", spread_json(&r->comm_spread));
    cJSON_AddItemToObject(o, "wait", spread_json(&r->wait_spread));
    cJSON_AddNumberToObject(o, "ring_bytes", r->ring_bytes);
    cJSON_AddNumberToObject(o, "offload_bytes", r->offload_bytes);
    cJSON_AddNumberToObject(o, "exposed_comm_rank_seconds", r->exposed_comm);
    cJSON_AddNumberToObject(o, "exposed_offload_rank_seconds", r->exposed_offload);
    cJSON_AddNumberToObject(o, "exposed_tp_rank_seconds", r->exposed_tp);
    cJSON_AddNumberToObject(o, "stage_msg_seconds", r->stage_msgs);
    cJSON_AddNumberToObject(o, "items", oc->n_items);
    cJSON_AddNumberToObject(o, "rings", r->n_rings);
    cJSON_AddNumberToObject(o, "planner_makespan", oc->planner_makespan);
    cJSON_AddNumberToObject(o, "lower_bound", oc->lower_bound);
    cJSON_AddNumberToObject(o, "hdp_bound", oc->hdp_bound);
    cJSON_AddNumberToObject(o, "plan_seconds", oc->plan_seconds);
    cJSON_AddNumberToObject(o, "sim_seconds", oc->sim_seconds);
    return o;
}

cJSON *sim_memory_json(const SimMemPeak *m, double mem_bytes) {
    cJSON *o = cJSON_CreateObject();
    if (!o) {
        bs_fail("out of memory building JSON");
        return NULL;
    }
    cJSON_AddNumberToObject(o, "peak_bytes", m->peak_bytes);
    cJSON_AddNumberToObject(o, "static_bytes", m->static_bytes);
    cJSON_AddNumberToObject(o, "activation_bytes", m->act_bytes);
    cJSON_AddNumberToObject(o, "rank", m->rank);
    cJSON_AddNumberToObject(o, "stage", m->stage);
    // not known (a cost file without a hardware profile): null, not a guess
    if (mem_bytes > 0) {
        cJSON_AddNumberToObject(o, "mem_bytes", mem_bytes);
        cJSON_AddBoolToObject(o, "fits", !sim_memory_exceeds(m, mem_bytes));
    } else {
        cJSON_AddNullToObject(o, "mem_bytes");
        cJSON_AddNullToObject(o, "fits");
    }
    return o;
}
