// bench/layout3d.c: one pair of cores, three ways to use it - 2 HDP ranks, one HDP rank of 2
// tensor-parallel processes (--tp 2), one HDP rank of 2 pipeline stages (--pp 2) - on the same
// global batches from the same weights. tp 2 runs twice: with the backward's all-reduces overlapped
// with the weight gradients (the default) and blocking (TrainConfig.tp_blocking, what
// BS_TP_OVERLAP=0 gives `bytescale train`), the before and after of the overlap.
//
// The four trainers live side by side in one MPI job of 2 ranks (each makes its own groups) and
// take their steps in turn, so a change in the machine's load falls on all four alike. Each policy
// step is the `balance` plan of the same batch for its layout (1 HDP rank of 2 processes plans for 1
// rank; PP-Balance with 2 stages). Defaults: model tiny, data/go-byte, 32K tokens per step, context
// = capacity = 8K (packs only: with one HDP rank there is no ring to compare), 6 measured steps after
// 1 warm-up; every figure is the median over the measured steps.
//
// Columns: tokens/s and its ratio to HDP; the tp all-reduces (tp 2): the share of the step the
// model was blocked in them (exposed), and per step, ms blocked and ms from each one's start to its
// end (total: the same as exposed when blocking; with the overlap, the backward's sums also run
// while the weight gradients compute, so total - exposed is the hidden part); the
// share each pipeline stage spent waiting for its neighbour (pp 2: the bubble, measured in the
// trace's "wait activations" / "wait gradients" spans) beside the planner's prediction of it (1 -
// the stage's busy time / the replayed 1F1B makespan); the planner's step estimate (its cost model:
// the `cpu` profile unless --cost is given) over the measured step; the least core share of any
// rank (below 0.9: the machine was shared and the times are not to be trusted).
//
// usage: bench_layout3d [--quick] [--model NAME] [--tokens N] [--capacity N] [--steps N] [--data DIR]
//                       [--cost FILE]
// Started without an MPI launcher it runs itself as `mpirun -np 2 --bind-to core`.
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bytescale/error.h"
#include "bytescale/timer.h"
#include "bytescale/train.h"
#include "bench_util.h"
#include "nn/blas_core.h"

enum { N_LAYOUTS = 4, MAX_STEPS = 64 };
static const struct {
    const char *name;
    int tp, pp, tp_blocking;
} LAYOUTS[N_LAYOUTS] = {{"hdp 2", 1, 1, 0}, {"tp 2 blocking", 2, 1, 1}, {"tp 2 overlapped", 2, 1, 0}, {"pp 2", 1, 2, 0}};

typedef struct {
    double tps[MAX_STEPS], tp_share[MAX_STEPS], tp_exposed[MAX_STEPS], tp_total[MAX_STEPS], bubble[MAX_STEPS],
        bubble_pred[MAX_STEPS], est[MAX_STEPS], core[MAX_STEPS];
} Rec;

static int64_t tokens_flag(const char *flag, const char *v) {
    char *end;
    long long x = strtoll(v, &end, 10);
    if (*end == 'K') x <<= 10, end++;
    if (*end || x < 1) bs_die("%s '%s': want a positive number (suffix K)", flag, v);
    return x;
}

// The flags into the base configuration every layout starts from, and the measured steps; --help
// prints the usage and exits.
static void read_flags(int argc, char **argv, TrainConfig *base, int *steps) {
    for (int i = 1; i < argc; i++)
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            printf("usage: bench_layout3d [--quick] [--model NAME] [--tokens N] [--capacity N] [--steps N] [--data DIR]\n"
                   "                      [--cost FILE]\n"
                   "2 HDP ranks vs --tp 2 (all-reduces blocking, then overlapped) vs --pp 2 on the same batches\n"
                   "(defaults: tiny, 32K tokens, capacity 8K, 6 steps)\n");
            exit(0);
        }
    if (!comm_launched_by_mpi()) bench_relaunch_under_mpirun("bench_layout3d", "2", argc, argv);
    *base = train_defaults();
    snprintf(base->model, sizeof base->model, "tiny");
    snprintf(base->policy, sizeof base->policy, "balance");
    base->tokens = 32 << 10;
    base->context = base->capacity = 8 << 10;
    base->quiet = 1;
    *steps = 6;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--quick")) {
            base->tokens = 8 << 10, base->context = base->capacity = 2 << 10, *steps = 2;
            continue;
        }
        if (!v) bs_die("unknown flag '%s', or it needs a value (--help: see the file's head)", a);
        if (!strcmp(a, "--model")) snprintf(base->model, sizeof base->model, "%s", v);
        else if (!strcmp(a, "--data")) snprintf(base->data, sizeof base->data, "%s", v);
        else if (!strcmp(a, "--cost")) snprintf(base->cost, sizeof base->cost, "%s", v);
        else if (!strcmp(a, "--tokens")) base->tokens = tokens_flag(a, v);
        else if (!strcmp(a, "--capacity")) base->context = base->capacity = tokens_flag(a, v);
        else if (!strcmp(a, "--steps")) *steps = (int)tokens_flag(a, v);
        else bs_die("unknown flag '%s'", a);
        i++;
    }
    if (*steps > MAX_STEPS) *steps = MAX_STEPS;
    base->steps = *steps + 1;
}

// Measured step i of one layout: its throughput, the tp all-reduces and stage waits averaged over
// the ranks, the planner's bubble and step estimate, the least core share.
static void record_step(Rec *x, int i, const Trainer *t, const StepStats *st) {
    const Plan *p = &t->plans[t->step % 2];
    double tp = 0, tp_total = 0, wait = 0, core = 1;
    for (int r = 0; r < st->n_ranks; r++) {
        tp += st->ranks[r].tp_seconds / st->n_ranks;
        tp_total += st->ranks[r].tp_total_seconds / st->n_ranks;
        wait += st->ranks[r].p2p_wait / st->n_ranks;
        core = fmin(core, st->ranks[r].core_share);
    }
    x->tps[i] = st->tokens_per_s;
    x->tp_share[i] = tp / st->seconds;
    x->tp_exposed[i] = tp;
    x->tp_total[i] = tp_total;
    x->bubble[i] = wait / st->seconds;
    x->bubble_pred[i] = p->makespan > 0 ? 1 - p->rank_busy[0] / p->makespan : 0;
    x->est[i] = st->est_seconds / st->seconds;
    x->core[i] = core;
}

// The table: every layout's medians over the measured steps (bench_median sorts them in place).
static void print_table(Rec *rec, const TrainConfig *base, int steps) {
    printf("layouts on 2 ranks (model %s, %lld tokens/step, capacity %lld, balance; medians of %d steps)\n\n",
           base->model, (long long)base->tokens, (long long)base->capacity, steps);
    printf("| layout | tokens/s | vs hdp 2 | tp all-reduce exposed share | exposed ms/step | total ms/step | stage "
           "wait (bubble) | planned bubble | planned / measured step | least core share |\n"
           "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n");
    double ref = bench_median(rec[0].tps, steps);
    for (int l = 0; l < N_LAYOUTS; l++) {
        Rec *x = &rec[l];
        double tps = bench_median(x->tps, steps);
        printf("| %s | %.0f | %.2fx | %.1f%% | %.0f | %.0f | %.1f%% | %.1f%% | %.2f | %.2f |\n", LAYOUTS[l].name, tps,
               tps / ref, 100 * bench_median(x->tp_share, steps), 1e3 * bench_median(x->tp_exposed, steps),
               1e3 * bench_median(x->tp_total, steps), 100 * bench_median(x->bubble, steps),
               100 * bench_median(x->bubble_pred, steps), bench_median(x->est, steps), bench_median(x->core, steps));
    }
}

int main(int argc, char **argv) {
    blas_core_reexec("bench_layout3d", argv);  // OpenBLAS's fastest kernels for this CPU (nn/blas_core.h)
    TrainConfig base;
    int steps;
    read_flags(argc, argv, &base, &steps);
    Comm *comm;
    if (comm_mpi_init(&comm, &argc, &argv) != 0) bs_die_errmsg();
    if (comm->size != 2) bs_die("bench_layout3d compares layouts of 2 processes: run it on 2 ranks");
    int lead = comm->rank == 0;

    Trainer *t[N_LAYOUTS];
    for (int l = 0; l < N_LAYOUTS; l++) {
        TrainConfig c = base;
        c.tp = LAYOUTS[l].tp, c.pp = LAYOUTS[l].pp, c.tp_blocking = LAYOUTS[l].tp_blocking;
        t[l] = malloc(sizeof *t[l]);
        if (!t[l] || trainer_init_comm(t[l], &c, comm) != 0) {
            fprintf(stderr, "bench_layout3d: %s: %s\n", LAYOUTS[l].name, bs_errmsg());
            comm_abort(comm, 1);
        }
    }
    if (lead)
        fprintf(stderr, "bench_layout3d: model %s, %lld tokens/step, capacity %lld, %d steps + 1 warm-up per layout\n",
                base.model, (long long)base.tokens, (long long)base.capacity, steps);
    Rec *rec = calloc(N_LAYOUTS, sizeof *rec);
    if (!rec) bs_die("out of memory");
    for (int s = 0; s <= steps; s++) {
        for (int k = 0; k < N_LAYOUTS; k++) {
            int l = (k + s) % N_LAYOUTS;  // the order rotates: no layout always goes first
            StepStats st;
            if (trainer_step(t[l], &st) != 0) {
                fprintf(stderr, "bench_layout3d: %s step %d: %s\n", LAYOUTS[l].name, s + 1, bs_errmsg());
                comm_abort(comm, 1);
            }
            if (s > 0) record_step(&rec[l], s - 1, t[l], &st);  // step 0 is the warm-up
        }
        if (lead) fprintf(stderr, "  step %d of %d\r", s, steps);
    }
    if (lead) {
        fprintf(stderr, "\n");
        print_table(rec, &base, steps);
    }
    for (int l = 0; l < N_LAYOUTS; l++) {
        trainer_free(t[l]);
        free(t[l]);
    }
    free(rec);
    comm_mpi_finalize();
    return 0;
}
