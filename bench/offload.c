// bench/offload.c: what selective activation offloading saves and costs on this machine.
//
// One long causal sequence on one process (the `small` model, 8K tokens by default: about half a GB
// of activations), one forward + backward per step, at offload ratio r = 0, 0.25, 0.5, 0.75 and 1,
// with the file tier (a deleted file in --dir, O_DIRECT) and the memory tier (host memory: what a
// GPU build's pinned buffers would be). Every (tier, r) has a model of its own, made fresh so its
// memory starts with no activation resident. Per row:
//   accounted peak  the model's own accounting of resident activation bytes (llama_resident_bytes)
//   RSS peak        the process's peak resident set during the row's first step minus the resident
//                   set before it (VmHWM after resetting it through /proc/self/clear_refs; VmRSS).
//                   With the memory tier the offloaded bytes stay in the process (in the tier), so
//                   its RSS cannot drop: the figure shows that.
//   step s          wall time of a step, median over --reps rounds
//   CPU s           CPU time of the thread that computes, median: what the engine itself pays
//                   (page faults of released pages, copies started; waiting excluded)
//   moved MB        bytes copied out per step (the same come back)
//   waited s        seconds per step the model was blocked on the tier: what the copies did not hide
// After every row's first step (the warm-up), the rounds time one step of every row in turn, the
// order rotating from round to round, so a machine shared with other work slows all rows alike;
// a row's ratio to r = 0 is the median of the per-round ratios to the same tier's r = 0 step. Each
// cell: value / the same tier's r = 0 value (ratio). The losses of every row are checked to be
// bitwise the r = 0 loss.
//
// Options:
//   --quick      4K tokens, 1 round, 2 training steps
//   --model      catalogue model (default small)
//   --tokens N   sequence length (default 8192)
//   --reps N     timed rounds (default 3)
//   --dir DIR    where the file tier makes its file (default $TMPDIR or /tmp)
//   --cost FILE  the planner's speeds for table 2 (default: the `cpu` hardware profile)
//   --data DIR   the dataset of table 3 (default data/go-byte; without one, table 3 is skipped)
//
// Table 2, the planner: how many ranks the sequence needs at a memory budget, with and without
// offloading. A budget is given as the capacity C it holds without offloading (the engine's
// accounting, cost_rank_act); Eq. 3 (cost_min_ranks) gives the fewest ranks with offloading and its
// ratio r, at the `cpu` profile's speeds (or --cost FILE, a profile of this machine) so that r is
// chosen only where the copies hide.
//
// Table 3, training on 2 ranks (mpirun -np 2, started by the bench itself): model `small`, 2K-token
// sequences of the Go corpus (--data, default data/go-byte), a budget of 60 MiB per rank, which
// holds C < 1K tokens without offloading. Without offloading the planner needs 3 ranks for a 2K
// sequence and the run is refused; with the file tier it trains on 2 within the budget; the same
// plans kept resident (--offload-tier resident, capacity C, no budget) give bitwise the same losses
// and hold more than the budget.
//
// Usage: bench_offload [--quick] [--model NAME] [--tokens N] [--reps N] [--dir DIR] [--cost FILE]
//                      [--data DIR]
// The tables go to stdout, progress to stderr. One BLAS thread (set by the bench itself).
#include <cblas.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bytescale/comm.h"
#include "bytescale/cost.h"
#include "bytescale/error.h"
#include "bytescale/hw.h"
#include "bytescale/llama.h"
#include "bytescale/model.h"
#include "bytescale/offload.h"
#include "bytescale/procmem.h"
#include "bytescale/profile.h"
#include "bytescale/progress.h"
#include "bytescale/rng.h"
#include "bytescale/timer.h"
#include "bytescale/train.h"
#include "bench_util.h"
#include "nn/blas_core.h"


static const double RATIOS[] = {0, 0.25, 0.5, 0.75, 1};
enum { N_RATIOS = 5, MAX_REPS = 64 };

typedef struct {
    Llama m;
    Offloader *o;
    int file;
    double r;
    double accounted, rss, loss;
    double t[MAX_REPS], cpu[MAX_REPS], ratio[MAX_REPS], cpu_ratio[MAX_REPS];  // per round
    uint64_t moved;
    double waited;
} Row;

static Progress progress;
static int64_t done;

static void step(Row *row, const MicroBatch *mb, double *wall, double *cpu) {
    double t0 = now_seconds(), c0 = bench_cpu_seconds(CLOCK_THREAD_CPUTIME_ID);
    if (llama_forward_backward(&row->m, mb, 1.0f / (float)mb->T, &row->loss, NULL) != 0) bs_die_errmsg();
    *wall = now_seconds() - t0;
    *cpu = bench_cpu_seconds(CLOCK_THREAD_CPUTIME_ID) - c0;
    char note[64];
    snprintf(note, sizeof note, "%s r %.2f", row->file ? "file" : "memory", row->r);
    progress_update(&progress, ++done, note);
}

// A fresh model for the row, and its first step: the memory figures.
static void start_row(Row *row, const ModelConfig *cfg, const MicroBatch *mb, const char *dir) {
    if (llama_init(&row->m, cfg, mb->T) != 0) bs_die_errmsg();
    llama_init_weights(&row->m, 1);
    llama_zero_grad(&row->m);  // the gradients' pages are touched before the measurement starts
    OffloadTier tier;
    if ((row->file ? offload_tier_file(&tier, dir) : offload_tier_memory(&tier)) != 0) bs_die_errmsg();
    if (offloader_init(&row->o, tier) != 0) bs_die_errmsg();
    row->m.offload = row->o;
    row->m.offload_ratio = (float)row->r;
    long before = procmem_status_kb("VmRSS:");
    int rss_ok = before >= 0 && procmem_reset_peak();
    double wall, cpu;
    step(row, mb, &wall, &cpu);
    row->rss = rss_ok ? (double)(procmem_status_kb("VmHWM:") - before) * 1024 : -1;
    row->accounted = (double)row->m.act.peak;
    row->moved = row->m.act.offloaded;
    row->waited = row->m.act.wait;
}

// "value / baseline (ratio)" in the given unit
static const char *beside(char *buf, size_t cap, double v, double base, double unit, const char *fmt) {
    if (v < 0 || base <= 0) return snprintf(buf, cap, "n/a"), buf;
    char a[32], b[32];
    snprintf(a, sizeof a, fmt, v / unit);
    snprintf(b, sizeof b, fmt, base / unit);
    snprintf(buf, cap, "%s / %s (%.2fx)", a, b, v / base);
    return buf;
}

// ---- table 2: the ranks a sequence needs at a budget -------------------------------------------------

static void ranks_table(const ModelConfig *cfg, int T, const char *cost_file) {
    CostModel cm;
    if (cost_file) {
        if (cost_load(&cm, cost_file) != 0) bs_die_errmsg();
        if (cm.n_layers != cfg->n_layers)
            bs_die("--cost %s: made for %d layers, model %s has %d", cost_file, cm.n_layers, cfg->name, cfg->n_layers);
    } else if (cost_derive(&cm, cfg, hw_find("cpu"), 1, 1, 2, T) != 0) {
        bs_die_errmsg();
    }
    // what the planner budgets by: the engine's own accounting, as `train` plans
    if (profile_engine_act(cfg, &cm, NULL, NULL) != 0) bs_die_errmsg();
    printf("\n## The ranks one sequence of %d tokens needs, model %s, by budget\n\n", T, cfg->name);
    printf("Budget: the activation bytes per rank that hold C tokens without offloading (the engine's "
           "accounting). Eq. 3 at %s: offload tier %.2f GB/s; r is used only where its copies hide.\n\n",
           cost_file ? cost_file : "the `cpu` profile's speeds", cm.offload_bw / 1e9);
    printf("| C tokens | budget MB | ranks without offloading | ranks with offloading | r | est. time, fewest "
           "ranks / ceil(s/C) ranks |\n|---:|---:|---:|---:|---:|---:|\n");
    for (int div = 2; div <= 32; div *= 2) {
        int64_t C = T / div, s = T;
        double r = 0;
        int64_t plain = (s + C - 1) / C;
        int d = cost_min_ranks(&cm, s, C, 1, 1 << 20, &r);
        if (d < 1) bs_die_errmsg();
        double t_off = cost_item_time(&cm, &s, 1, d, r), t_plain = cost_item_time(&cm, &s, 1, (int)plain, 0);
        printf("| %lld | %.1f | %lld | %d | %.3f | %.3f s / %.3f s |\n", (long long)C,
               cost_act_budget(&cm, C) / 1048576, (long long)plain, d, r, t_off, t_plain);
    }
}

// ---- table 3: 2-rank training within a budget --------------------------------------------------------

enum { TRAIN_MAX_STEPS = 32 };
static const double TRAIN_BUDGET = 60.0 * 1048576;

typedef struct {
    int steps;
    double loss[TRAIN_MAX_STEPS], seconds[TRAIN_MAX_STEPS];
    double peak, moved, waited;  // the largest rank peak; bytes and seconds per step, the busier rank
    int rings;
    int64_t capacity;
} TrainRow;

// Train `steps` steps on the ranks of comm with one offload tier; budget 0 = none, capacity 0 = from
// the budget. Collective.
static void train_row(Comm *comm, const char *data, int steps, const char *tier, double budget, int64_t capacity,
                      TrainRow *row) {
    TrainConfig c = train_defaults();
    snprintf(c.data, sizeof c.data, "%s", data);
    snprintf(c.model, sizeof c.model, "small");
    snprintf(c.policy, sizeof c.policy, "balance");
    snprintf(c.offload_tier, sizeof c.offload_tier, "%s", tier);
    c.context = 2048, c.tokens = 8192, c.capacity = capacity, c.mem_budget = (int64_t)budget;
    c.steps = steps, c.warmup = 1, c.ckpt_every = 0;
    Trainer *t = malloc(sizeof *t);
    if (!t || trainer_init_comm(t, &c, comm) != 0) bs_die_errmsg();
    memset(row, 0, sizeof *row);
    row->capacity = t->capacity;
    for (int k = 0; k < steps; k++) {
        StepStats st;
        if (trainer_step(t, &st) != 0) bs_die_errmsg();
        row->loss[k] = st.loss, row->seconds[k] = st.seconds;
        row->rings += st.n_rings > 0;
        double moved = 0, waited = 0;
        for (int r = 0; r < st.n_ranks; r++) {
            row->peak = fmax(row->peak, st.ranks[r].act_peak_bytes);
            moved = fmax(moved, st.ranks[r].offload_bytes), waited = fmax(waited, st.ranks[r].offload_wait);
        }
        row->moved += moved / steps, row->waited += waited / steps;
        if (comm->rank == 0) fprintf(stderr, "\rbench_offload: 2 ranks, %s, step %d of %d  ", tier, k + 1, steps);
    }
    if (comm->rank == 0) fprintf(stderr, "\n");
    row->steps = steps;
    trainer_free(t);
    free(t);
}

// The 2-rank part (under mpirun): the planner without offloading, then two trainings.
static int train_part(int argc, char **argv, const char *data, int steps) {
    Comm *comm;
    if (comm_mpi_init(&comm, &argc, &argv) != 0) bs_die_errmsg();
    int lead = comm->rank == 0;
    if (comm->size != 2) bs_die("bench_offload --train-part: wants 2 ranks, got %d", comm->size);
    TrainRow off, kept;
    train_row(comm, data, steps, "file", TRAIN_BUDGET, 0, &off);
    // the same plans without copies: capacity C as the budget gave it, no budget to enforce
    train_row(comm, data, steps, "resident", 0, off.capacity, &kept);
    // and the planner without offloading, on one sequence of the context's length
    char refused[512] = "";
    if (lead) {
        CostModel cm;
        if (cost_derive(&cm, model_find("small"), hw_find("cpu"), 1, 1, 2, off.capacity) != 0 ||
            profile_engine_act(model_find("small"), &cm, NULL, NULL) != 0)
            bs_die_errmsg();
        double r;
        if (cost_min_ranks(&cm, 2048, off.capacity, 0, 2, &r) < 0) snprintf(refused, sizeof refused, "%s", bs_errmsg());
    }
    if (lead) {
        printf("\n## Training on 2 ranks within %.0f MiB of activations per rank (model small, context 2K, 8K "
               "tokens per step, balance, %d steps)\n\n",
               TRAIN_BUDGET / 1048576, steps);
        printf("The budget holds C = %lld tokens without offloading: a 2K-token sequence needs %lld ranks of C.\n",
               (long long)off.capacity, (long long)((2048 + off.capacity - 1) / off.capacity));
        printf("Without offloading the planner refuses: %s\n\n", refused[0] ? refused : "(it did not: unexpected)");
        printf("| run | steps with a ring | median step s | peak activation MB (budget %.0f) | moved MB/step | "
               "waited s/step |\n|---|---:|---:|---:|---:|---:|\n", TRAIN_BUDGET / 1048576);
        const TrainRow *rows[2] = {&off, &kept};
        const char *names[2] = {"offloading to a file (O_DIRECT), budget enforced", "the same plans kept resident"};
        for (int i = 0; i < 2; i++) {
            double sec[TRAIN_MAX_STEPS];
            memcpy(sec, rows[i]->seconds, sizeof sec);
            printf("| %s | %d of %d | %.3f | %.1f | %.1f | %.4f |\n", names[i], rows[i]->rings, rows[i]->steps,
                   bench_median(sec, rows[i]->steps), rows[i]->peak / 1048576, rows[i]->moved / 1048576,
                   rows[i]->waited);
        }
        int same = memcmp(off.loss, kept.loss, sizeof off.loss) == 0;
        printf("\nLosses bitwise equal: %s; the offloading run stayed within the budget: %s.\n", same ? "yes" : "NO",
               off.peak <= TRAIN_BUDGET ? "yes" : "NO");
        fflush(stdout);
    }
    comm_mpi_finalize();
    return 0;
}

// Table 3 from the single-process run: the same program under mpirun -np 2 with --train-part.
static void run_train_part(const char *data, int steps) {
    char index[4200], steps_s[16];
    snprintf(index, sizeof index, "%s/index.bin", data);
    if (access(index, R_OK) != 0) {
        printf("\n(table 3 skipped: no prepared dataset in %s; `make data` or pass --data DIR)\n", data);
        return;
    }
    snprintf(steps_s, sizeof steps_s, "%d", steps);
    char *args[] = {"--train-part", "--data", (char *)data, "--steps", steps_s, NULL};
    if (bench_run_self_under_mpirun(2, 0, args) != 0) bs_die("bench_offload: the 2-rank part failed");
}

int main(int argc, char **argv) {
    blas_core_reexec("bench_offload", argv);  // OpenBLAS's fastest kernels for this CPU (nn/blas_core.h)
    const char *model = "small", *dir = NULL, *cost = NULL, *data = "data/go-byte";
    int T = 8192, reps = 3, steps = 6, train_only = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--quick")) T = 4096, reps = 1, steps = 2;
        else if (!strcmp(a, "--model") && v) model = v, i++;
        else if (!strcmp(a, "--tokens") && v) T = atoi(v), i++;
        else if (!strcmp(a, "--reps") && v) reps = atoi(v), i++;
        else if (!strcmp(a, "--dir") && v) dir = v, i++;
        else if (!strcmp(a, "--cost") && v) cost = v, i++;
        else if (!strcmp(a, "--data") && v) data = v, i++;
        else if (!strcmp(a, "--steps") && v) steps = atoi(v), i++;
        else if (!strcmp(a, "--train-part")) train_only = 1;
        else bs_die("unknown argument '%s'; usage: bench_offload [--quick] [--model NAME] [--tokens N] [--reps N] "
                    "[--dir DIR] [--cost FILE] [--data DIR]", a);
    }
    if (steps < 1 || steps > TRAIN_MAX_STEPS) bs_die("--steps %d: want 1 .. %d", steps, TRAIN_MAX_STEPS);
    if (train_only) return train_part(argc, argv, data, steps);
    if (T < 16 || T > (1 << 22)) bs_die("--tokens %d: want 16 .. 4M", T);
    if (reps < 1 || reps > MAX_REPS) bs_die("--reps %d: want 1 .. %d", reps, MAX_REPS);
    const ModelConfig *cfg = model_find(model);
    if (!cfg) bs_die_errmsg();
    if (cfg->n_layers < 3) bs_die("model %s has %d layers: nothing to offload (the last two always stay)", model,
                                  cfg->n_layers);
    openblas_set_num_threads(1);
#ifndef __OPTIMIZE__
    fprintf(stderr, "bench_offload: note: built without optimization (a Debug build): the times mean little\n");
#endif

    // one causal sequence of T tokens, random bytes
    int32_t *tok = malloc(sizeof(int32_t) * (size_t)T), *tgt = malloc(sizeof(int32_t) * (size_t)T);
    int32_t *pos = malloc(sizeof(int32_t) * (size_t)T), *seg = calloc((size_t)T, sizeof(int32_t));
    if (!tok || !tgt || !pos || !seg) bs_die("out of memory");
    Rng rng;
    rng_seed(&rng, 9);
    for (int t = 0; t < T; t++) tok[t] = (int32_t)rng_below(&rng, (uint64_t)cfg->vocab_size), pos[t] = t;
    for (int t = 0; t < T; t++) tgt[t] = t + 1 < T ? tok[t + 1] : -1;
    MicroBatch mb = {.tokens = tok, .targets = tgt, .pos = pos, .seg = seg, .T = T};

    OffloadTier probe;  // for the header: where the file goes and whether O_DIRECT holds there
    if (offload_tier_file(&probe, dir) != 0) bs_die_errmsg();
    char where[OFFLOAD_NAME_MAX];
    snprintf(where, sizeof where, "%s", probe.name);
    offload_tier_close(&probe);

    enum { N_ROWS = 2 * N_RATIOS };
    Row *rows = calloc(N_ROWS, sizeof *rows);  // [0 .. N_RATIOS) file, then memory; r = 0 first
    if (!rows) bs_die("out of memory");
    for (int i = 0; i < N_ROWS; i++) rows[i].file = i < N_RATIOS, rows[i].r = RATIOS[i % N_RATIOS];
    progress_start(&progress, "bench_offload", (int64_t)N_ROWS * (reps + 1));
    for (int i = 0; i < N_ROWS; i++) start_row(&rows[i], cfg, &mb, dir);
    for (int i = 0; i < N_ROWS; i++) rows[i].moved = rows[i].m.act.offloaded, rows[i].waited = rows[i].m.act.wait;
    for (int k = 0; k < reps; k++) {
        for (int j = 0; j < N_ROWS; j++) {
            Row *row = &rows[(j + k) % N_ROWS];  // the order rotates from round to round
            step(row, &mb, &row->t[k], &row->cpu[k]);
        }
        for (int i = 0; i < N_ROWS; i++) {
            const Row *base = &rows[i < N_RATIOS ? 0 : N_RATIOS];
            rows[i].ratio[k] = rows[i].t[k] / base->t[k];
            rows[i].cpu_ratio[k] = rows[i].cpu[k] / base->cpu[k];
        }
    }
    progress_finish(&progress, done, NULL);

    printf("## Activation offloading: model %s, one sequence of %d tokens, 1 process, 1 BLAS thread\n\n", model, T);
    printf("File tier: %s. Each cell: value / the same tier's r = 0 (ratio); times: medians of %d rounds, the ratio the "
           "median of the per-round ratios.\n\n",
           where, reps);
    printf("| r | tier | accounted peak MB | RSS peak MB | step s | CPU s | moved MB/step | waited s/step |\n");
    printf("|---:|---|---:|---:|---:|---:|---:|---:|\n");
    int exact = 1;
    for (int i = 0; i < N_ROWS; i++) {
        Row *x = &rows[i];
        const Row *b = &rows[i < N_RATIOS ? 0 : N_RATIOS];
        double t = bench_median(x->t, reps), bt = bench_median((double *)b->t, reps);
        double c = bench_median(x->cpu, reps), bc = bench_median((double *)b->cpu, reps);
        char acc[64], rss[64], sec[64], cpu[64];
        beside(acc, sizeof acc, x->accounted, b->accounted, 1048576, "%.1f");
        beside(rss, sizeof rss, x->rss, b->rss, 1048576, "%.1f");
        // times: the medians, and the median of the per-round ratios
        snprintf(sec, sizeof sec, "%.2f / %.2f (%.2fx)", t, bt, bench_median(x->ratio, reps));
        snprintf(cpu, sizeof cpu, "%.2f / %.2f (%.2fx)", c, bc, bench_median(x->cpu_ratio, reps));
        printf("| %.2f | %s | %s | %s | %s | %s | %.1f | %.3f |\n", x->r, x->file ? "file" : "memory", acc, rss, sec,
               cpu, (double)(x->m.act.offloaded - x->moved) / reps / 1048576, (x->m.act.wait - x->waited) / reps);
        exact &= memcmp(&x->loss, &rows[0].loss, sizeof x->loss) == 0;
    }
    printf("\nLosses of every row bitwise equal to r = 0: %s. Predicted peak at r = 1: %.1f MB "
           "(llama_resident_bytes), all activations %.1f MB.\n",
           exact ? "yes" : "NO", (double)llama_resident_bytes(cfg, T, 1) / 1048576,
           (double)llama_resident_bytes(cfg, T, 0) / 1048576);
    for (int i = 0; i < N_ROWS; i++) llama_free(&rows[i].m), offloader_free(rows[i].o);
    free(rows);
    free(tok), free(tgt), free(pos), free(seg);
    ranks_table(cfg, T, cost);
    run_train_part(data, steps);
    return exact ? 0 : 1;
}
