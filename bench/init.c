// bench/init.c: what drawing the initial weights costs a shard, and what a 3D job's start-up costs.
//
// Table 1, init only (no model, no training): for every dense model of the catalogue and the
// layouts tp 1, 2, 8 x pp 1, 4, the largest shard of the layout (the stage with the most floats, tp
// rank 0) is drawn by llama_shard_init_weights (a counter-based generator: the shard's own floats
// only) into a buffer touched beforehand, so the figure is the drawing alone. Beside it, where the
// whole model has at most --old-max floats, the walk the engine did before: one stream over the
// whole model, a shard keeping its runs and skipping the rest (two uniform draws per skipped float),
// and the ratio old / new. Times are CPU seconds of the drawing thread (a shared machine's other work
// does not count), the median of --reps. A layout the model does not divide into, or a shard above
// --max-shard bytes, is a row of "-" with the reason.
//
// Table 2, start-up: `bytescale train --model base --steps 0` from launch to exit on one process and
// as tp 2 x pp 2 (mpirun -np 4 --oversubscribe: 4 processes, here on fewer cores). With --steps 0
// the trainer is made (MPI, groups, dataset, shard, initial weights, optimizer) and the run stops
// where the first step would start: the time to the first step's start, plus process exit. Needs a
// prepared dataset (--data, default data/go-byte; `bytescale prepare` makes it); without one the
// table is skipped.
//
// Usage: bench_init [--quick] [--model NAME] [--reps N] [--old-max FLOATS] [--max-shard BYTES] [--data DIR]
//   --quick          tiny, small and base only, 1 rep, no start-up table
//   --model NAME     that catalogue model's rows only, no start-up table (bench_init --model llama-7b
//                    --reps 1 --old-max 7e9 times the old walk over a 7B model too)
//   --reps N         timed repetitions per cell (default 3)
//   --old-max N      time the old walk where the whole model has at most N floats (default 1073741824)
//   --max-shard B    skip shards above B bytes (default 2147483648)
// The tables go to stdout, progress to stderr.
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "bench_util.h"
#include "bytescale/llama.h"
#include "bytescale/model.h"
#include "bytescale/parallel.h"
#include "bytescale/rng.h"
#include "bytescale/timer.h"
#include "nn/llama_params.h"

typedef struct {
    int quick, reps;
    double old_max, max_shard;
    const char *data, *model;
} Options;

// ---- the walk llama_init_weights did before it drew per shard ------------------------------------------

static double old_std(const ParamTensor *t, int n_layers) {
    const char *dot = strrchr(t->name, '.');
    int resid = dot && (!strcmp(dot, ".wo") || !strcmp(dot, ".w_down"));
    return resid ? 0.02 / sqrt(2.0 * n_layers) : 0.02;
}

// One xoshiro stream over the whole model's matrices in buffer order; the shard keeps its runs.
static void old_init(const ModelConfig *cfg, const LlamaShard *sh, float *params, uint64_t seed) {
    LlamaShard whole = llama_shard_full(cfg);
    int n_full;
    size_t np_full, n_runs;
    ParamTensor *full = llama_make_table(cfg, &whole, &n_full, &np_full);
    ParamRun *runs;
    if (!full || llama_shard_runs(cfg, sh, &runs, &n_runs) != 0) bs_die_errmsg();
    Rng rng;
    rng_seed(&rng, seed);
    int k = 0;
    size_t cursor = 0;
    for (size_t r = 0; r < n_runs; r++) {
        float *p = params + runs[r].local;
        size_t want_begin = runs[r].full, want_end = runs[r].full + runs[r].len;
        while (cursor < want_end) {
            const ParamTensor *t = &full[k];
            size_t t_end = t->offset + t->numel, stop = t_end < want_end ? t_end : want_end;
            if (cursor < want_begin) stop = t_end < want_begin ? t_end : want_begin;
            int keep = cursor >= want_begin;
            double std = old_std(t, cfg->n_layers);
            for (size_t j = cursor; j < stop; j++) {
                if (t->ndim == 1) {
                    if (keep) *p++ = 1.0f;
                } else if (keep) {
                    *p++ = (float)(std * rng_normal(&rng));
                } else {
                    rng_uniform(&rng), rng_uniform(&rng);
                }
            }
            cursor = stop;
            if (cursor == t_end) k++;
        }
    }
    free(runs);
    free(full);
}

// ---- table 1 ------------------------------------------------------------------------------------------

typedef void (*InitFn)(const ModelConfig *, const LlamaShard *, float *, uint64_t);

static void new_init(const ModelConfig *cfg, const LlamaShard *sh, float *params, uint64_t seed) {
    if (llama_shard_init_weights(cfg, sh, params, seed) != 0) bs_die_errmsg();
}

// Median CPU seconds of reps draws of the shard.
static double time_init(InitFn fn, const ModelConfig *cfg, const LlamaShard *sh, float *buf, int reps) {
    double t[16];
    for (int i = 0; i < reps; i++) {
        double t0 = thread_cpu_seconds();
        fn(cfg, sh, buf, 1);
        t[i] = thread_cpu_seconds() - t0;
    }
    return bench_median(t, reps);
}

// The layout's largest shard (tp rank 0 of the stage with the most floats); 0 when it does not fit
// the model (the error says why).
static size_t largest_shard(const ModelConfig *c, int tp, int pp, LlamaShard *out) {
    int begin[257];
    if (pp > c->n_layers || pipeline_split_layers(c->n_layers, pp, NULL, 0, begin) != 0) {
        bs_fail("%d layers", c->n_layers);
        return 0;
    }
    size_t best = 0;
    for (int s = 0; s < pp; s++) {
        LlamaShard sh = {.tp = tp, .tp_rank = 0, .layer_begin = begin[s], .layer_end = begin[s + 1],
                         .first = s == 0, .last = s == pp - 1};
        if (llama_shard_check(c, &sh) != 0) return 0;
        int nt;
        size_t np;
        ParamTensor *t = llama_make_table(c, &sh, &nt, &np);
        if (!t) bs_die_errmsg();
        free(t);
        if (np > best) best = np, *out = sh;
    }
    return best;
}

static void init_row(const ModelConfig *c, double whole, int tp, int pp, const Options *o) {
    printf("%-10s %8.1fM  %2d x %d  ", c->name, whole / 1e6, tp, pp);
    LlamaShard sh;
    size_t np = largest_shard(c, tp, pp, &sh);
    if (np == 0) {
        printf("%10s %9s %7s %9s %7s  (%s)\n", "-", "-", "-", "-", "-", bs_errmsg());
        return;
    }
    if ((double)np * sizeof(float) > o->max_shard) {
        printf("%9.1fM %9s %7s %9s %7s  (above --max-shard)\n", (double)np / 1e6, "-", "-", "-", "-");
        return;
    }
    float *buf = malloc(np * sizeof(float));
    if (!buf) bs_die("out of memory for a shard of %zu floats", np);
    memset(buf, 0, np * sizeof(float));  // the pages exist before the clock starts
    fprintf(stderr, "bench_init: %s tp %d pp %d (%zu floats)\n", c->name, tp, pp, np);
    double t_new = time_init(new_init, c, &sh, buf, o->reps);
    printf("%9.1fM %9.4f %7.2f", (double)np / 1e6, t_new, t_new / (double)np * 1e9);
    if (whole <= o->old_max) {
        double t_old = time_init(old_init, c, &sh, buf, o->reps);
        printf(" %9.4f %6.1fx\n", t_old, t_old / t_new);
    } else {
        printf(" %9s %7s\n", "-", "-");
    }
    free(buf);
}

static void table_init(const Options *o) {
    printf("Initial weights per shard: the largest shard of each layout, CPU seconds (median of %d)\n", o->reps);
    printf("%-10s %9s  %-6s  %10s %9s %7s %9s %7s\n", "model", "params", "tp x pp", "shard", "new s", "ns/flt",
           "old s", "old/new");
    static const int tps[3] = {1, 2, 8}, pps[2] = {1, 4};
    for (int i = 0; i < model_count(); i++) {
        const ModelConfig *c = model_at(i);
        if (c->n_experts != 1) continue;  // the CPU model is dense (llama_check_config)
        int small = !strcmp(c->name, "tiny") || !strcmp(c->name, "small") || !strcmp(c->name, "base");
        if ((o->quick && !small) || (o->model && strcmp(o->model, c->name) != 0)) continue;
        LlamaShard whole_sh = llama_shard_full(c);
        int nt;
        size_t whole;
        ParamTensor *t = llama_make_table(c, &whole_sh, &nt, &whole);
        if (!t) bs_die_errmsg();
        free(t);
        for (int a = 0; a < 3; a++)
            for (int b = 0; b < 2; b++) init_row(c, (double)whole, tps[a], pps[b], o);
    }
    printf("new: llama_shard_init_weights, the shard's own floats; old: one stream over the whole model, "
           "skipping what the shard does not hold (timed up to %.0fM floats)\n\n",
           o->old_max / 1e6);
}

// ---- table 2 ------------------------------------------------------------------------------------------

// Wall seconds from launch to exit of `[mpirun -np 4 --oversubscribe] bytescale train ... --steps 0`.
static double time_startup(const char *bin, const char *data, int procs) {
    char cmd[8192];
    snprintf(cmd, sizeof cmd,
             "%s%s train --model base --steps 0 --data '%s'%s > /dev/null",
             procs > 1 ? "mpirun -np 4 --oversubscribe --bind-to none " : "", bin, data,
             procs > 1 ? " --tp 2 --pp 2" : "");
    double t0 = now_seconds();
    int rc = system(cmd);
    double t = now_seconds() - t0;
    if (rc != 0) bs_die("bench_init: '%s' failed (exit %d)", cmd, rc);
    return t;
}

static void table_startup(const Options *o) {
    char bin[4096], data_index[4200];
    ssize_t n = readlink("/proc/self/exe", bin, sizeof bin - 16);
    if (n <= 0) bs_die("bench_init: cannot find its own path");
    bin[n] = '\0';
    char *slash = strrchr(bin, '/');
    snprintf(slash ? slash + 1 : bin, 16, "bytescale");
    snprintf(data_index, sizeof data_index, "%s/index.bin", o->data);
    if (access(data_index, R_OK) != 0) {
        printf("Start-up: skipped (no prepared dataset %s: `bytescale prepare` makes data/go-byte)\n", o->data);
        return;
    }
    setenv("BS_QUIET", "1", 1);
    setenv("OPENBLAS_NUM_THREADS", "1", 1);
    if (geteuid() == 0) setenv("OMPI_ALLOW_RUN_AS_ROOT", "1", 0), setenv("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1", 0);
    printf("Start-up of `bytescale train --model base --steps 0` (launch to the first step's start, and exit), "
           "wall seconds, median of %d\n",
           o->reps);
    printf("%-34s %9s\n", "job", "seconds");
    double t1[16], t4[16];
    for (int i = 0; i < o->reps; i++) {
        fprintf(stderr, "bench_init: start-up round %d\n", i + 1);
        t1[i] = time_startup(bin, o->data, 1);
        t4[i] = time_startup(bin, o->data, 4);
    }
    printf("%-34s %9.3f\n", "one process", bench_median(t1, o->reps));
    printf("%-34s %9.3f\n", "tp 2 x pp 2 (4 procs, oversubscr.)", bench_median(t4, o->reps));
}

int main(int argc, char **argv) {
    Options o = {.reps = 3, .old_max = 1024.0 * 1024 * 1024, .max_shard = 2.0 * 1024 * 1024 * 1024,
                 .data = "data/go-byte"};
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--quick")) {
            o.quick = 1, o.reps = 1;
            continue;
        }
        if (!v) bs_die("bench_init: unknown flag or missing value: %s", a);
        i++;
        if (!strcmp(a, "--reps")) o.reps = atoi(v);
        else if (!strcmp(a, "--old-max")) o.old_max = atof(v);
        else if (!strcmp(a, "--max-shard")) o.max_shard = atof(v);
        else if (!strcmp(a, "--data")) o.data = v;
        else if (!strcmp(a, "--model")) o.model = v;
        else bs_die("bench_init: unknown flag %s", a);
    }
    if (o.reps < 1 || o.reps > 16) bs_die("bench_init: --reps must be in [1, 16]");
    table_init(&o);
    if (o.model && !model_find(o.model)) bs_die_errmsg();
    if (!o.quick && !o.model) table_startup(&o);
    return 0;
}
