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
// Usage: bench_offload [--quick] [--model NAME] [--tokens N] [--reps N] [--dir DIR]
//   --quick      4K tokens, 1 round
//   --model      catalogue model (default small)
//   --tokens N   sequence length (default 8192)
//   --reps N     timed rounds (default 3)
//   --dir DIR    where the file tier makes its file (default $TMPDIR or /tmp)
// The table goes to stdout, progress to stderr. One BLAS thread (set by the bench itself).
#include <cblas.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bytescale/error.h"
#include "bytescale/llama.h"
#include "bytescale/model.h"
#include "bytescale/offload.h"
#include "bytescale/progress.h"
#include "bytescale/rng.h"
#include "bytescale/timer.h"
#include "bench_util.h"

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

static long status_kb(const char *key) {
    FILE *f = fopen("/proc/self/status", "r");
    if (!f) return -1;
    char line[256];
    long v = -1;
    size_t n = strlen(key);
    while (fgets(line, sizeof line, f))
        if (!strncmp(line, key, n)) v = atol(line + n + 1);
    fclose(f);
    return v;
}

// Reset VmHWM to the current RSS. 0 when the kernel does not let us (then RSS figures are n/a).
static int reset_hwm(void) {
    FILE *f = fopen("/proc/self/clear_refs", "w");
    if (!f) return 0;
    int ok = fputs("5", f) >= 0;
    return fclose(f) == 0 && ok;
}

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
    long before = status_kb("VmRSS:");
    int rss_ok = before >= 0 && reset_hwm();
    double wall, cpu;
    step(row, mb, &wall, &cpu);
    row->rss = rss_ok ? (double)(status_kb("VmHWM:") - before) * 1024 : -1;
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

int main(int argc, char **argv) {
    const char *model = "small", *dir = NULL;
    int T = 8192, reps = 3;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--quick")) T = 4096, reps = 1;
        else if (!strcmp(a, "--model") && v) model = v, i++;
        else if (!strcmp(a, "--tokens") && v) T = atoi(v), i++;
        else if (!strcmp(a, "--reps") && v) reps = atoi(v), i++;
        else if (!strcmp(a, "--dir") && v) dir = v, i++;
        else bs_die("unknown argument '%s'; usage: bench_offload [--quick] [--model NAME] [--tokens N] [--reps N] "
                    "[--dir DIR]", a);
    }
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
    return exact ? 0 : 1;
}
