// bench/kernels.c: how fast the compute kernels run on one core, as a fraction of its fp32 peak.
//
//   1. the reference: this core's fp32 peak from an FMA loop, and sgemm on a big square
//   2. sgemm on the model's matmul shapes (configs "small" and "base", T = 4096 tokens)
//   3. packed attention forward and backward: one causal segment of 1K..32K tokens, and an 8K pack
//      of short segments (block skipping)
//   4. end to end: a training micro-batch through the model (llama_forward_backward), tokens/s, MFU
//
// Usage: bench_kernels [--quick] [--max-tokens N] | --row SPEC
//   --quick         attention up to 4K tokens, end to end at 1K tokens (a smoke run)
//   --max-tokens N  longest attention sequence (default 32768; 16384 for "base", whose 32K run alone
//                   takes over a minute on one core, unless N is given)
//   --row SPEC      one row alone, machine-readable (bench/torch_kernels.py; see run_row)
// Tables go to stdout, progress to stderr. One thread: the bench sets OpenBLAS to one thread itself.
// Times are the thread's CPU time: on a quiet machine that equals wall time, and on a shared one
// it leaves out the time other processes hold the core (the closing line compares the two). The
// tables are printed at the end, against the best of four peak samples taken through the run.
// FLOP conventions (docs/kernels.md): a matmul (M, K) x (K, N) is 2MNK; attention forward is
// 4 * head_dim * n_heads per visible (query, key) pair, backward 10 * head_dim * n_heads (recompute
// QK^T, dV, dP, dQ, dK), pairs counted exactly by attn_visible_pairs. Model FLOPs for MFU are
// 3 x forward (6 x matmul parameters per token, 12 * head_dim * n_heads per pair and layer).
#include <cblas.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
#endif

#include "bytescale/attention.h"
#include "bytescale/error.h"
#include "bytescale/llama.h"
#include "bytescale/model.h"
#include "bytescale/progress.h"
#include "bytescale/rng.h"
#include "bytescale/timer.h"
#include "nn/ops.h"
#include "bench_util.h"
#include "nn/blas_core.h"

static double peak_gflops;  // the FMA loop's figure: every "% peak" column divides by it
static Progress progress;
static int64_t items_done;

// CPU seconds of the calling thread, which does all the work (OpenBLAS runs on it with one thread)
static double cpu_seconds(void) { return bench_cpu_seconds(CLOCK_THREAD_CPUTIME_ID); }

static void step_done(const char *what) { progress_update(&progress, ++items_done, what); }

// ---- the report ---------------------------------------------------------------------------------
// Lines are kept and printed at the end, so every "% of peak" divides by the best of the peak
// samples taken through the run: on a shared machine a single sample can land in a busy moment.
enum { MAX_LINES = 128, MAX_FIGURES = 3 };

typedef struct {
    char head[112];              // text before the figures (a whole line when n == 0)
    int n;                       // figures on the line
    double sec[MAX_FIGURES];     // seconds, printed before the figure when >= 0
    double gflops[MAX_FIGURES];  // printed with its fraction of the peak
    char tail[96];               // text after the figures
} Line;

static Line lines[MAX_LINES];
static int n_lines;
static int peak_line = -1;  // the line that shows the peak itself

static Line *line_add(const char *head) {
    if (n_lines == MAX_LINES) bs_die("bench_kernels: more than %d report lines", MAX_LINES);
    Line *l = &lines[n_lines++];
    memset(l, 0, sizeof *l);
    snprintf(l->head, sizeof l->head, "%s", head);
    return l;
}

static void line_figure(Line *l, double sec, double gflops) {
    l->sec[l->n] = sec;
    l->gflops[l->n++] = gflops;
}

static void report_print(void) {
    if (peak_line >= 0) lines[peak_line].gflops[0] = peak_gflops;
    for (int i = 0; i < n_lines; i++) {
        const Line *l = &lines[i];
        printf("%s", l->head);
        for (int f = 0; f < l->n; f++) {
            if (l->sec[f] >= 0) printf(" %9.3f", l->sec[f]);
            printf(" %8.1f %6.1f%%", l->gflops[f], 100 * l->gflops[f] / peak_gflops);
        }
        printf("%s\n", l->tail);
    }
}

// Best time of fn over repeats: one run, then more until min_total seconds have passed.
typedef void (*BenchFn)(void *ctx);
static double time_best(BenchFn fn, void *ctx, double min_total, int max_reps) {
    double best = 1e30, total = 0;
    for (int rep = 0; rep < max_reps && (rep == 0 || total < min_total); rep++) {
        double t0 = cpu_seconds();
        fn(ctx);
        double t = cpu_seconds() - t0;
        total += t;
        best = t < best ? t : best;
    }
    return best;
}

static float *rand_floats(Rng *rng, size_t n, float scale) {
    float *x = malloc(n * sizeof(float));
    if (!x) bs_die("out of memory allocating %zu floats", n);
    for (size_t i = 0; i < n; i++) x[i] = (float)(rng_uniform(rng) * 2 - 1) * scale;
    return x;
}

// ---- 1. the reference -------------------------------------------------------------------------

#if defined(__AVX2__) && defined(__FMA__)
// 12 independent accumulators cover the FMA latency (4 cycles) times the two FMA pipes, so the loop
// runs at the core's issue limit: 2 FMA x LANES x 2 FLOPs per cycle. One body for both widths: a
// core with AVX-512 reaches twice the AVX2 figure only if it has two 512-bit FMA units, and
// OpenBLAS's SkylakeX kernels use them, so the peak is the wider loop's.
#define FMA_LOOP(name, vec, lanes, set1, fmadd, add, first)                                                   \
    static double name(void) {                                                                              \
        const long iters = 20 * 1000 * 1000;                                                                \
        vec x = set1(0.999999f), y = set1(1e-7f), a[12];                                                    \
        double best = 1e30;                                                                                 \
        float sink = 0;                                                                                     \
        for (int rep = 0; rep < 5; rep++) {                                                                 \
            for (int k = 0; k < 12; k++) a[k] = set1(0.1f * (float)k);                                      \
            vec a0 = a[0], a1 = a[1], a2 = a[2], a3 = a[3], a4 = a[4], a5 = a[5];                           \
            vec a6 = a[6], a7 = a[7], a8 = a[8], a9 = a[9], a10 = a[10], a11 = a[11];                       \
            double t0 = cpu_seconds();                                                                      \
            for (long i = 0; i < iters; i++) {                                                              \
                a0 = fmadd(a0, x, y), a1 = fmadd(a1, x, y), a2 = fmadd(a2, x, y), a3 = fmadd(a3, x, y);     \
                a4 = fmadd(a4, x, y), a5 = fmadd(a5, x, y), a6 = fmadd(a6, x, y), a7 = fmadd(a7, x, y);     \
                a8 = fmadd(a8, x, y), a9 = fmadd(a9, x, y), a10 = fmadd(a10, x, y), a11 = fmadd(a11, x, y); \
            }                                                                                               \
            double t = cpu_seconds() - t0;                                                                  \
            best = t < best ? t : best;                                                                     \
            vec s = add(add(add(a0, a1), add(a2, a3)), add(add(a4, a5), add(a6, a7)));                      \
            sink += first(add(s, add(add(a8, a9), add(a10, a11))));                                         \
        }                                                                                                   \
        if (sink == 12345.f) printf("(%g)\n", sink); /* keeps the loop's result alive */                    \
        return (double)iters * 12 * lanes * 2 / best / 1e9;                                                 \
    }
FMA_LOOP(fma_loop_avx2, __m256, 8, _mm256_set1_ps, _mm256_fmadd_ps, _mm256_add_ps, _mm256_cvtss_f32)
#if defined(__AVX512F__)
FMA_LOOP(fma_loop_avx512, __m512, 16, _mm512_set1_ps, _mm512_fmadd_ps, _mm512_add_ps, _mm512_cvtss_f32)
static const char *fma_loop_name = "FMA loop (AVX-512, 12 accumulators)      ";
static double fma_loop_gflops(void) {
    double w = fma_loop_avx512(), n = fma_loop_avx2();  // the wider loop, unless the core splits it
    return w > n ? w : n;
}
#else
static const char *fma_loop_name = "FMA loop (AVX2, 12 accumulators)         ";
static double fma_loop_gflops(void) { return fma_loop_avx2(); }
#endif
#else
static const char *fma_loop_name = "";
static double fma_loop_gflops(void) {
    bs_die("bench_kernels measures the peak with AVX2 + FMA; build with -march=native on such a CPU (BS_NATIVE=ON)");
}
#endif

typedef struct {
    float *out, *x, *w, *dout, *dx, *dw;
    int T, C, OC;
} MatmulCase;

static void run_mm_forward(void *p) {
    MatmulCase *c = p;
    matmul_forward(c->out, c->x, c->w, c->T, c->C, c->OC, 0);
}

static void run_mm_dx(void *p) {
    MatmulCase *c = p;
    matmul_backward(c->dx, NULL, c->dout, c->x, c->w, c->T, c->C, c->OC, 0);
}

static void run_mm_dw(void *p) {
    MatmulCase *c = p;
    matmul_backward(NULL, c->dw, c->dout, c->x, c->w, c->T, c->C, c->OC, 0);
}

// Take another peak sample; the report uses the best one.
static void sample_peak(void) {
    double g = fma_loop_gflops();
    peak_gflops = g > peak_gflops ? g : peak_gflops;
}

static void bench_reference(void) {
    sample_peak();
    step_done("fma peak");
    Rng rng;
    rng_seed(&rng, 1);
    int n = 2048;
    MatmulCase c = {.T = n, .C = n, .OC = n};
    c.x = rand_floats(&rng, (size_t)n * n, 1);
    c.w = rand_floats(&rng, (size_t)n * n, 1);
    c.out = rand_floats(&rng, (size_t)n * n, 1);
    double t = time_best(run_mm_forward, &c, 1.0, 5);
    step_done("sgemm 2048");
    line_add("== 1. reference: one core's fp32 peak ==");
    line_add("                                          GFLOP/s   %peak");
    peak_line = n_lines;  // its figure is the best sample, filled in when the report is printed
    Line *l = line_add(fma_loop_name);
    line_figure(l, -1, 0);
    l = line_add("sgemm 2048 x 2048 x 2048 (OpenBLAS)      ");
    line_figure(l, -1, 2.0 * n * n * n / t / 1e9);
    char blas[256], head[112];
    blas_core_describe(blas, sizeof blas);
    snprintf(head, sizeof head, "(matmuls: %s)", blas);
    line_add(head);
    line_add("");
    free(c.x), free(c.w), free(c.out);
}

// ---- 2. the model's matmul shapes ---------------------------------------------------------------

typedef struct {
    const char *name;
    int C, OC;  // weight (OC, C)
} MatmulShape;

enum { N_MATMUL_SHAPES = 6 };

static void matmul_shapes(const ModelConfig *m, MatmulShape shapes[N_MATMUL_SHAPES]) {
    const int q = m->n_heads * m->head_dim, kv = m->n_kv_heads * m->head_dim, d = m->d_model, f = m->d_ff;
    MatmulShape all[N_MATMUL_SHAPES] = {{"wq", d, q},          {"wk / wv", d, kv}, {"wo", q, d},
                                        {"w_gate / w_up", d, f}, {"w_down", f, d},  {"lm_head", d, m->vocab_size}};
    memcpy(shapes, all, sizeof all);
}

static void bench_matmuls(const ModelConfig *m, int T) {
    MatmulShape shapes[N_MATMUL_SHAPES];
    matmul_shapes(m, shapes);
    int n = N_MATMUL_SHAPES, cmax = 0, ocmax = 0;
    for (int i = 0; i < n; i++) {
        cmax = shapes[i].C > cmax ? shapes[i].C : cmax;
        ocmax = shapes[i].OC > ocmax ? shapes[i].OC : ocmax;
    }
    Rng rng;
    rng_seed(&rng, 2);
    MatmulCase c = {.T = T};
    c.x = rand_floats(&rng, (size_t)T * cmax, 1);
    c.dx = rand_floats(&rng, (size_t)T * cmax, 1);
    c.out = rand_floats(&rng, (size_t)T * ocmax, 1);
    c.dout = rand_floats(&rng, (size_t)T * ocmax, 1);
    c.w = rand_floats(&rng, (size_t)ocmax * cmax, 1);
    c.dw = rand_floats(&rng, (size_t)ocmax * cmax, 1);
    char text[112];
    snprintf(text, sizeof text, "== 2. matmul shapes of model \"%s\" (T = %d tokens) ==", m->name, T);
    line_add(text);
    snprintf(text, sizeof text, "%-14s %18s  %16s  %16s  %16s", "weight", "T x C -> OC", "forward x W^T", "backward dX",
             "backward dW");
    line_add(text);
    snprintf(text, sizeof text, "%-14s %18s  %16s  %16s  %16s", "", "", "GFLOP/s  %peak", "GFLOP/s  %peak",
             "GFLOP/s  %peak");
    line_add(text);
    for (int i = 0; i < n; i++) {
        c.C = shapes[i].C, c.OC = shapes[i].OC;
        double flops = 2.0 * T * c.C * c.OC;
        double gf = flops / time_best(run_mm_forward, &c, 0.3, 50) / 1e9;
        double gx = flops / time_best(run_mm_dx, &c, 0.3, 50) / 1e9;
        double gw = flops / time_best(run_mm_dw, &c, 0.3, 50) / 1e9;
        char dims[40];
        snprintf(dims, sizeof dims, "%d x %d -> %d", T, c.C, c.OC);
        snprintf(text, sizeof text, "%-14s %18s ", shapes[i].name, dims);
        Line *l = line_add(text);
        line_figure(l, -1, gf);
        line_figure(l, -1, gx);
        line_figure(l, -1, gw);
        char note[64];
        snprintf(note, sizeof note, "matmul %s %s", m->name, shapes[i].name);
        step_done(note);
    }
    line_add("");
    free(c.x), free(c.dx), free(c.out), free(c.dout), free(c.w), free(c.dw);
}

// ---- 3. attention -------------------------------------------------------------------------------

typedef struct {
    AttnShape s;
    AttnRows rows;
    float *q, *k, *v, *out, *lse, *dout, *delta, *dq, *dk, *dv;
} AttnCase;

static void attn_case_init(AttnCase *c, Rng *rng, AttnShape s, const int32_t *pos, const int32_t *seg, int T) {
    size_t nq = (size_t)T * s.n_heads * s.head_dim, nk = (size_t)T * s.n_kv_heads * s.head_dim;
    c->s = s;
    c->rows = (AttnRows){pos, seg, T};
    c->q = rand_floats(rng, nq, 1), c->k = rand_floats(rng, nk, 1), c->v = rand_floats(rng, nk, 1);
    c->dout = rand_floats(rng, nq, 1), c->out = rand_floats(rng, nq, 1), c->dq = rand_floats(rng, nq, 1);
    c->dk = rand_floats(rng, nk, 1), c->dv = rand_floats(rng, nk, 1);
    c->lse = rand_floats(rng, (size_t)T * s.n_heads, 1), c->delta = rand_floats(rng, (size_t)T * s.n_heads, 1);
}

static void attn_case_free(AttnCase *c) {
    free(c->q), free(c->k), free(c->v), free(c->out), free(c->lse), free(c->dout), free(c->delta);
    free(c->dq), free(c->dk), free(c->dv);
}

static void run_attn_forward(void *p) {
    AttnCase *c = p;
    attn_forward(c->out, c->lse, c->q, c->rows, c->k, c->v, c->rows, c->s);
}

// the whole backward as the model runs it: delta, then the kernel (dq, dk, dv accumulate, so the
// values grow over repeats; the time does not depend on them)
static void run_attn_backward(void *p) {
    AttnCase *c = p;
    attn_backward_delta(c->delta, c->dout, c->out, c->rows.n, c->s);
    attn_backward(c->dq, c->dk, c->dv, c->dout, c->lse, c->delta, c->q, c->rows, c->k, c->v, c->rows, c->s);
}

// One row of the attention table: forward (which also gives backward its real lse), then backward.
static void attn_row(const char *label, AttnShape s, const int32_t *pos, const int32_t *seg, int T, double *t_fwd_out) {
    Rng rng;
    rng_seed(&rng, (uint64_t)T);
    AttnCase c;
    attn_case_init(&c, &rng, s, pos, seg, T);
    int64_t pairs = attn_visible_pairs(c.rows, c.rows);
    double tf = time_best(run_attn_forward, &c, 0.5, 10);
    double tb = time_best(run_attn_backward, &c, 0.5, 10);
    char text[112];
    snprintf(text, sizeof text, "%-22s %6d %13lld ", label, T, (long long)pairs);
    Line *l = line_add(text);
    line_figure(l, tf, 4.0 * s.head_dim * s.n_heads * (double)pairs / tf / 1e9);
    line_figure(l, tb, 10.0 * s.head_dim * s.n_heads * (double)pairs / tb / 1e9);
    if (t_fwd_out) *t_fwd_out = tf;
    attn_case_free(&c);
}

// The pack: segments of 64..1024 tokens (uniform, fixed seed), T tokens in all; returns their count.
// bench/torch_kernels.py reads the same segments from --row-pack.
static int make_pack(int32_t *pos, int32_t *seg, int T) {
    Rng rng;
    rng_seed(&rng, 3);
    int nseg = 0;
    for (int i = 0; i < T; nseg++) {
        int len = 64 + (int)rng_below(&rng, 961);
        for (int t = 0; t < len && i < T; t++, i++) pos[i] = t, seg[i] = nseg;
    }
    return nseg;
}

static void bench_attention(const ModelConfig *m, int max_tokens) {
    AttnShape s = {m->n_heads, m->n_kv_heads, m->head_dim};
    char text[112];
    snprintf(text, sizeof text, "== 3. attention, model \"%s\": %d query heads, %d K/V heads, head_dim %d ==", m->name,
             s.n_heads, s.n_kv_heads, s.head_dim);
    line_add(text);
    snprintf(text, sizeof text, "%-22s %6s %13s  %9s %8s %7s %9s %8s %7s", "rows", "tokens", "visible pairs", "fwd s",
             "GFLOP/s", "%peak", "bwd s", "GFLOP/s", "%peak");
    line_add(text);
    int32_t *pos = malloc(sizeof(int32_t) * max_tokens), *seg = malloc(sizeof(int32_t) * max_tokens);
    if (!pos || !seg) bs_die("out of memory");
    double t8k = 0;
    for (int T = 1024; T <= max_tokens; T *= 2) {
        for (int i = 0; i < T; i++) pos[i] = i, seg[i] = 0;
        attn_row("one causal segment", s, pos, seg, T, T == 8192 ? &t8k : NULL);
        char note[64];
        snprintf(note, sizeof note, "attention %s %dK", m->name, T / 1024);
        step_done(note);
    }
    int T = 8192;
    if (T <= max_tokens) {
        int nseg = make_pack(pos, seg, T);
        char label[40];
        snprintf(label, sizeof label, "pack of %d segments", nseg);
        double tp = 0;
        attn_row(label, s, pos, seg, T, &tp);
        snprintf(text, sizeof text, "(the pack's forward takes %.1f%% of the one-segment 8K forward's time)",
                 100 * tp / t8k);
        line_add(text);
        step_done("attention pack");
    }
    line_add("");
    free(pos), free(seg);
}

// ---- 4. end to end ------------------------------------------------------------------------------
// The model (src/nn/llama.c) on one micro-batch of T tokens, one causal segment: forward, loss and
// backward, as a training step runs them (the optimizer step is not included).

typedef struct {
    Llama *m;
    MicroBatch *mb;
} StepCase;

static void run_step(void *p) {
    StepCase *c = p;
    double loss;
    if (llama_forward_backward(c->m, c->mb, 1.0f / (float)c->mb->T, &loss, NULL) != 0) bs_die_errmsg();
}

// One micro-batch of T tokens through the model: its time (best of reps), model FLOPs and the
// attention's share of them.
static double measure_step(const ModelConfig *cfg, int T, int reps, double *flops_out, double *attn_share) {
    Llama m;
    if (llama_init(&m, cfg, T) != 0) bs_die_errmsg();
    llama_init_weights(&m, 1);
    int32_t *tok = malloc(sizeof(int32_t) * T), *tgt = malloc(sizeof(int32_t) * T);
    int32_t *pos = malloc(sizeof(int32_t) * T), *seg = malloc(sizeof(int32_t) * T);
    if (!tok || !tgt || !pos || !seg) bs_die("out of memory");
    Rng rng;
    rng_seed(&rng, 4);
    for (int i = 0; i < T; i++) tok[i] = (int32_t)rng_below(&rng, (uint64_t)cfg->vocab_size);
    for (int i = 0; i < T; i++) tgt[i] = i + 1 < T ? tok[i + 1] : -1, pos[i] = i, seg[i] = 0;
    MicroBatch mb = {tok, tgt, pos, seg, T};
    // warm-up on a short prefix (BLAS buffers, the attention scratch); the arena is zeroed at init
    MicroBatch warm = {tok, tgt, pos, seg, T < 256 ? T : 256};
    StepCase c = {&m, &warm};
    run_step(&c);
    c.mb = &mb;
    double t = time_best(run_step, &c, 0.0, reps);

    // model FLOPs: 3 x forward; forward = 2 x matmul parameters per token + 4 hd H per visible pair
    const int q = cfg->n_heads * cfg->head_dim, kv = cfg->n_kv_heads * cfg->head_dim, d = cfg->d_model;
    double mm_params = (double)cfg->n_layers * ((double)d * q * 2 + (double)d * kv * 2 + 3.0 * d * cfg->d_ff) +
                       (double)d * cfg->vocab_size;
    AttnRows rows = {pos, seg, T};
    double pairs = (double)attn_visible_pairs(rows, rows);
    double attn_fwd = (double)cfg->n_layers * 4.0 * cfg->head_dim * cfg->n_heads * pairs;
    double flops = 3.0 * (2.0 * mm_params * T + attn_fwd);
    *flops_out = flops, *attn_share = 3.0 * attn_fwd / flops;
    free(tok), free(tgt), free(pos), free(seg);
    llama_free(&m);
    return t;
}

static void bench_end_to_end(const ModelConfig *cfg, int T) {
    double flops, share, t = measure_step(cfg, T, 1, &flops, &share);
    char text[112];
    snprintf(text, sizeof text, "%-8s %6d  %9.3f %10.0f %9.1f", cfg->name, T, t, T / t, flops / 1e9);
    Line *l = line_add(text);
    line_figure(l, -1, flops / t / 1e9);
    snprintf(l->tail, sizeof l->tail, "   (attention: %.1f%% of the model FLOPs)", 100 * share);
}

// ---- one row alone: --row SPEC ------------------------------------------------------------------
// bench/torch_kernels.py puts PyTorch beside the engine row by row, alternating the two sides' runs
// of the same row, and runs the engine's side through this. SPEC is one of
//   peak                              the FMA loop: prints "peak GFLOP/s"
//   seglens                           the pack's segment lengths: prints "seglens n l1 .. ln"
//   mm:MODEL:WEIGHT:fwd|dx|dw         a matmul of section 2 (T = 4096; WEIGHT wq, wk, wo, w_gate, ...)
//   attn:MODEL:TOKENS|pack:fwd|bwd    a row of section 3 (one causal segment, or the 8K pack)
//   step:MODEL:TOKENS                 section 4 at TOKENS tokens (one micro-batch, best of 2)
// and for the last three "row SPEC SECONDS GFLOP": the best time of the row's repeats, as the tables
// take it, and the work under the FLOP conventions above.

static void row_matmul(const ModelConfig *m, const char *weight, const char *dir, double *sec, double *gflop) {
    MatmulShape shapes[N_MATMUL_SHAPES];
    matmul_shapes(m, shapes);
    const MatmulShape *sh = NULL;
    size_t len = strlen(weight);
    for (int i = 0; i < N_MATMUL_SHAPES; i++)  // "wk" names "wk / wv"
        if (strncmp(shapes[i].name, weight, len) == 0 && (shapes[i].name[len] == 0 || shapes[i].name[len] == ' '))
            sh = &shapes[i];
    BenchFn fn = strcmp(dir, "fwd") == 0 ? run_mm_forward : strcmp(dir, "dx") == 0 ? run_mm_dx
                                                          : strcmp(dir, "dw") == 0 ? run_mm_dw : NULL;
    if (!sh || !fn) bs_die("--row mm:%s:%s:%s: no such weight or direction (fwd, dx, dw)", m->name, weight, dir);
    Rng rng;
    rng_seed(&rng, 2);
    const int T = 4096;
    MatmulCase c = {.T = T, .C = sh->C, .OC = sh->OC};
    c.x = rand_floats(&rng, (size_t)T * c.C, 1), c.dx = rand_floats(&rng, (size_t)T * c.C, 1);
    c.out = rand_floats(&rng, (size_t)T * c.OC, 1), c.dout = rand_floats(&rng, (size_t)T * c.OC, 1);
    c.w = rand_floats(&rng, (size_t)c.OC * c.C, 1), c.dw = rand_floats(&rng, (size_t)c.OC * c.C, 1);
    *sec = time_best(fn, &c, 0.3, 50);
    *gflop = 2.0 * T * c.C * c.OC / 1e9;
    free(c.x), free(c.dx), free(c.out), free(c.dout), free(c.w), free(c.dw);
}

static void row_attention(const ModelConfig *m, const char *tokens, const char *dir, double *sec, double *gflop) {
    int pack = strcmp(tokens, "pack") == 0, T = pack ? 8192 : atoi(tokens);
    int bwd = strcmp(dir, "bwd") == 0;
    if (T < 1 || (!bwd && strcmp(dir, "fwd") != 0))
        bs_die("--row attn:%s:%s:%s: want TOKENS|pack:fwd|bwd", m->name, tokens, dir);
    int32_t *pos = malloc(sizeof(int32_t) * T), *seg = malloc(sizeof(int32_t) * T);
    if (!pos || !seg) bs_die("out of memory");
    if (pack) make_pack(pos, seg, T);
    else
        for (int i = 0; i < T; i++) pos[i] = i, seg[i] = 0;
    AttnShape s = {m->n_heads, m->n_kv_heads, m->head_dim};
    Rng rng;
    rng_seed(&rng, (uint64_t)T);
    AttnCase c;
    attn_case_init(&c, &rng, s, pos, seg, T);
    double pairs = (double)attn_visible_pairs(c.rows, c.rows);
    if (bwd) run_attn_forward(&c);  // the backward's real lse
    *sec = time_best(bwd ? run_attn_backward : run_attn_forward, &c, 0.5, 10);
    *gflop = (bwd ? 10.0 : 4.0) * s.head_dim * s.n_heads * pairs / 1e9;
    attn_case_free(&c);
    free(pos), free(seg);
}

static void run_row(const char *spec) {
    char buf[128], *part[4] = {0};
    snprintf(buf, sizeof buf, "%s", spec);
    int n = 0;
    for (char *p = strtok(buf, ":"); p && n < 4; p = strtok(NULL, ":")) part[n++] = p;
    if (strcmp(spec, "peak") == 0) {
        printf("peak %.3f\n", fma_loop_gflops());
        return;
    }
    if (strcmp(spec, "seglens") == 0) {
        int32_t pos[8192], seg[8192];
        int nseg = make_pack(pos, seg, 8192);
        printf("seglens %d", nseg);
        for (int i = 0, start = 0; i <= 8192; i++)
            if (i == 8192 || seg[i] != seg[start]) printf(" %d", i - start), start = i;
        printf("\n");
        return;
    }
    const ModelConfig *m = n >= 2 ? model_find(part[1]) : NULL;
    if (!m) bs_die("--row %s: want peak, seglens, mm:MODEL:WEIGHT:DIR, attn:MODEL:TOKENS:DIR, step:MODEL:TOKENS", spec);
    double sec = 0, gflop = 0, share;
    if (strcmp(part[0], "mm") == 0 && n == 4) {
        row_matmul(m, part[2], part[3], &sec, &gflop);
    } else if (strcmp(part[0], "attn") == 0 && n == 4) {
        row_attention(m, part[2], part[3], &sec, &gflop);
    } else if (strcmp(part[0], "step") == 0 && n == 3 && atoi(part[2]) > 0) {
        sec = measure_step(m, atoi(part[2]), 2, &gflop, &share);
        gflop /= 1e9;
    } else {
        bs_die("--row %s: want mm:MODEL:WEIGHT:DIR, attn:MODEL:TOKENS:DIR or step:MODEL:TOKENS", spec);
    }
    printf("row %s %.6f %.6f\n", spec, sec, gflop);
}

// ---- main ---------------------------------------------------------------------------------------

int main(int argc, char **argv) {
    blas_core_reexec("bench_kernels", argv);  // OpenBLAS's fastest kernels for this CPU (nn/blas_core.h)
    int quick = 0, max_tokens = 0;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--quick") == 0) {
            quick = 1;
        } else if (strcmp(argv[i], "--row") == 0 && i + 1 < argc) {
            openblas_set_num_threads(1);
            run_row(argv[i + 1]);
            return 0;
        } else if (strcmp(argv[i], "--max-tokens") == 0 && i + 1 < argc) {
            char *end;
            long v = strtol(argv[++i], &end, 10);
            if (*end || v < 1024 || v > (1 << 20)) bs_die("--max-tokens %s: want a number in [1024, 1048576]", argv[i]);
            max_tokens = (int)v;
        } else {
            bs_die("unknown argument '%s'; usage: bench_kernels [--quick] [--max-tokens N] | --row SPEC", argv[i]);
        }
    }
    openblas_set_num_threads(1);  // one core; and the thread CPU clock then sees all the work
#ifndef __OPTIMIZE__
    fprintf(stderr, "bench_kernels: note: built without optimization (a Debug build): the figures mean little\n");
#endif
    const ModelConfig *small = model_find("small"), *base = model_find("base");
    if (!small || !base) bs_die_errmsg();
    int max_small = max_tokens ? max_tokens : quick ? 4096 : 32768;
    int max_base = max_tokens ? max_tokens : quick ? 4096 : 16384;
    int e2e_T = quick ? 1024 : 4096;

    int64_t items = 2 + 12;  // reference, 2 x 6 matmul shapes
    for (int T = 1024; T <= max_small; T *= 2) items++;
    for (int T = 1024; T <= max_base; T *= 2) items++;
    items += (max_small >= 8192) + (max_base >= 8192) + 2;
    progress_start(&progress, "bench_kernels", items);
    double wall0 = now_seconds(), cpu0 = cpu_seconds();

    bench_reference();
    bench_matmuls(small, 4096);
    bench_matmuls(base, 4096);
    sample_peak();
    bench_attention(small, max_small);
    bench_attention(base, max_base);
    sample_peak();

    line_add("== 4. end to end: llama_forward_backward on one micro-batch (one causal segment) ==");
    char text[112];
    snprintf(text, sizeof text, "%-8s %6s  %9s %10s %9s %8s %7s", "model", "tokens", "step s", "tokens/s", "GFLOP",
             "GFLOP/s", "MFU");
    line_add(text);
    bench_end_to_end(small, e2e_T);
    step_done("end to end small");
    bench_end_to_end(base, e2e_T);
    step_done("end to end base");
    sample_peak();

    double wall = now_seconds() - wall0, cpu = cpu_seconds() - cpu0;
    progress_finish(&progress, items_done, NULL);
    report_print();
    printf("\n%% of peak (and MFU) = GFLOP/s / %.1f, the best of 4 samples of the FMA loop. Wall %.0f s, CPU %.0f s",
           peak_gflops, wall, cpu);
    if (cpu < 0.9 * wall)
        printf(" -- the bench had %.0f%% of a core: other processes shared it, so expect noise (cache, clock)",
               100 * cpu / wall);
    printf(".\n");
    return 0;
}
