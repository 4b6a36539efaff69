// bench/costcheck.c: the cost model against one measured H100 LLaMA-7B layer (docs/measured/).
//
// The measurement (docs/measured/README.md): one LLaMA-7B decoder layer on one H100 SXM, bf16, TP 1,
// forward and forward + backward times for s = 2K..64K tokens, the attention kernel alone, the bytes
// autograd keeps for backward, pinned host <-> device copies. This program prints, as markdown:
//   1. the fit behind the h100-measured profile (src/core/hw.c, docs/hardware.md): efficiency and
//      attn_efficiency re-derived from the file, beside the profile's rounded values;
//   2. per s, the measured layer forward + backward beside cost_layer_time on h100-sxm (datasheet)
//      and h100-measured, with relative errors; the largest error per profile;
//   3. the forward alone beside the cost model's forward (a third of the layer);
//   4. saved activation bytes per token beside act_token;
//   5. one ring step's block compute (docs/measured/h100-ring-step.json: n queries against n keys,
//      16 to 16K tokens per chunk) beside the cost model's attn_step + pairs x attn_pair, the fit of
//      attn_step (profile_lstsq, weights 1/t^2, as `bytescale profile` fits it on the engine), and
//      what the floor does to one micro-batch of short sequences on rings of growing width.
// Predictions use llama-7b with 32 K/V heads: the measured layer is LLaMA-7B as released (multi-head),
// while the catalogue's llama-7b has the paper's 8 K/V groups and 12% fewer linear FLOPs per token.
// Like is compared with like; the file's linear_flops_fwd is checked against the cost model's count.
//
// usage: bench_costcheck [FILE [RING_FILE]]   (defaults docs/measured/h100-llama7b-layer.json and
//        docs/measured/h100-ring-step.json, looked up in the current directory, then $BS_SOURCE_DIR,
//        then the source tree above the build directory)
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "bytescale/cost.h"
#include "bytescale/error.h"
#include "bytescale/fileio.h"
#include "bytescale/hw.h"
#include "bytescale/json.h"
#include "bytescale/model.h"
#include "bytescale/profile.h"

#define MEASURED_FILE "docs/measured/h100-llama7b-layer.json"
#define RING_FILE "docs/measured/h100-ring-step.json"
// h100-measured is fitted on the lengths from here up (the attention kernel's plateau, the lengths
// HDP's long-sequence decisions depend on); the shorter ones are held out to test the fit.
#define FIT_MIN_TOKENS 16384
#define MAX_ROWS 32

typedef struct {
    int64_t s;
    double fwdbwd, fwd;       // layer seconds
    double attn_fwdbwd;       // the attention kernel alone, forward + backward, seconds
    double act_bytes;         // bytes autograd keeps after the layer's forward
    double linear_flops_fwd;  // the measuring script's linear FLOP count (forward)
} Row;

typedef struct {
    char device[64];
    double gemm_tflops, h2d_GBps, d2h_GBps;
    int n;
    Row rows[MAX_ROWS];
} Measured;

static int read_measured(const char *path, Measured *M) {
    memset(M, 0, sizeof *M);
    cJSON *root;
    if (json_read_file(path, &root) != 0) return -1;
    const char *device;
    const cJSON *layer;
    int rc = json_get_string(root, "device", &device, path);
    if (rc == 0) snprintf(M->device, sizeof M->device, "%s", device);
    if (rc == 0) rc = json_get_double(root, "gemm_tflops", &M->gemm_tflops, path);
    if (rc == 0) rc = json_get_double(root, "h2d_GBps", &M->h2d_GBps, path);
    if (rc == 0) rc = json_get_double(root, "d2h_GBps", &M->d2h_GBps, path);
    if (rc == 0) rc = json_get_array(root, "layer", &layer, path);
    const cJSON *it;
    if (rc == 0) cJSON_ArrayForEach(it, layer) {
        if (M->n == MAX_ROWS) { rc = bs_fail("%s: more than %d rows in \"layer\"", path, MAX_ROWS); break; }
        char where[600];
        snprintf(where, sizeof where, "%s: layer[%d]", path, M->n);
        Row *r = &M->rows[M->n];
        if ((rc = json_get_int(it, "s", &r->s, where)) != 0) break;
        if ((rc = json_get_double(it, "layer_fwdbwd_s", &r->fwdbwd, where)) != 0) break;
        if ((rc = json_get_double(it, "layer_fwd_s", &r->fwd, where)) != 0) break;
        if ((rc = json_get_double(it, "attn_fwdbwd_s", &r->attn_fwdbwd, where)) != 0) break;
        if ((rc = json_get_double(it, "act_bytes", &r->act_bytes, where)) != 0) break;
        if ((rc = json_get_double(it, "linear_flops_fwd", &r->linear_flops_fwd, where)) != 0) break;
        if (r->s < 1 || !(r->fwdbwd > r->attn_fwdbwd) || !(r->attn_fwdbwd > 0)) {
            rc = bs_fail("%s: implausible row (s %lld, layer %g s, attention %g s)", where, (long long)r->s, r->fwdbwd,
                         r->attn_fwdbwd);
            break;
        }
        M->n++;
    }
    cJSON_Delete(root);
    if (rc == 0 && M->n == 0) rc = bs_fail("%s: no rows in \"layer\"", path);
    return rc;
}

// One ring step's block compute, measured (h100-ring-step.json): n queries against n keys, causal
// (the diagonal block) or full (every other block), seconds.
typedef struct {
    int n;
    struct {
        int64_t n;
        int causal;
        double fwd, fwdbwd;
    } rows[MAX_ROWS];
} RingSteps;

static int read_ring_steps(const char *path, RingSteps *R) {
    memset(R, 0, sizeof *R);
    cJSON *root;
    if (json_read_file(path, &root) != 0) return -1;
    int rc = cJSON_IsArray(root) ? 0 : bs_fail("%s: expected an array of ring steps", path);
    const cJSON *it;
    if (rc == 0) cJSON_ArrayForEach(it, root) {
        if (R->n == MAX_ROWS) { rc = bs_fail("%s: more than %d ring steps", path, MAX_ROWS); break; }
        char where[600];
        snprintf(where, sizeof where, "%s: [%d]", path, R->n);
        const cJSON *c = cJSON_GetObjectItemCaseSensitive(it, "causal");
        double fwd_us, fwdbwd_us;
        if ((rc = json_get_int(it, "n", &R->rows[R->n].n, where)) != 0) break;
        if ((rc = json_get_double(it, "fwd_us", &fwd_us, where)) != 0) break;
        if ((rc = json_get_double(it, "fwdbwd_us", &fwdbwd_us, where)) != 0) break;
        if (!cJSON_IsBool(c)) { rc = bs_fail("%s: \"causal\" must be true or false", where); break; }
        if (R->rows[R->n].n < 1 || !(fwd_us > 0) || !(fwdbwd_us > fwd_us)) {
            rc = bs_fail("%s: implausible ring step (n %lld, fwd %g us, fwd+bwd %g us)", where,
                         (long long)R->rows[R->n].n, fwd_us, fwdbwd_us);
            break;
        }
        R->rows[R->n].causal = cJSON_IsTrue(c);
        R->rows[R->n].fwd = fwd_us * 1e-6;
        R->rows[R->n++].fwdbwd = fwdbwd_us * 1e-6;
    }
    cJSON_Delete(root);
    if (rc == 0 && R->n < 2) rc = bs_fail("%s: fewer than 2 ring steps to fit", path);
    return rc;
}

// (predicted - measured) / measured; below 0.005% it is shown as zero, not as "-0.00%"
static double rel_err(double predicted, double measured) {
    double e = (predicted - measured) / measured;
    return fabs(e) < 5e-5 ? 0.0 : e;
}

// What every section reads: the two measurement files and the cost models of the measured layer.
typedef struct {
    const char *path, *ring_path;
    Measured M;
    RingSteps R;
    ModelConfig m;                // llama-7b with 32 K/V heads: the layer that was measured
    const HardwareProfile *meas;  // h100-measured
    CostModel cs, cmeas;          // the layer on h100-sxm (the datasheet) and on h100-measured
    double lin_flops, pair_flops; // forward FLOPs per token of the linear layers, per attention pair
    double peak;                  // h100-measured's peak FLOP/s
} Check;

// The files (arguments, else found in the source tree) read, and the cost models derived; a
// failure ends the program.
static void load(Check *k, int argc, char **argv, char *path, char *ring_path, size_t cap) {
    if (argc > 3) bs_die("usage: bench_costcheck [FILE [RING_FILE]]   (defaults %s, %s)", MEASURED_FILE, RING_FILE);
    if (argc >= 2) snprintf(path, cap, "%s", argv[1]);
    else if (file_find_source(MEASURED_FILE, path, cap) != 0) bs_die_errmsg();
    if (argc == 3) snprintf(ring_path, cap, "%s", argv[2]);
    else if (file_find_source(RING_FILE, ring_path, cap) != 0) bs_die_errmsg();
    k->path = path, k->ring_path = ring_path;
    if (read_measured(path, &k->M) != 0 || read_ring_steps(ring_path, &k->R) != 0) bs_die_errmsg();
    // the layer that was measured: LLaMA-7B as released, 32 query heads and 32 K/V heads
    k->m = *model_find("llama-7b");
    k->m.n_kv_heads = k->m.n_heads;
    snprintf(k->m.name, sizeof k->m.name, "llama-7b-mha");
    const HardwareProfile *sheet = hw_find("h100-sxm");
    k->meas = hw_find("h100-measured");
    if (!sheet || !k->meas) bs_die_errmsg();
    if (cost_derive(&k->cs, &k->m, sheet, 1, 1, 1, 65536) != 0 ||
        cost_derive(&k->cmeas, &k->m, k->meas, 1, 1, 1, 65536) != 0)
        bs_die_errmsg();
    k->lin_flops = cost_linear_flops_per_token(&k->m), k->pair_flops = cost_attn_flops_per_pair(&k->m);
    k->peak = k->meas->peak_flops;
}

// The title, and a warning for every row whose linear FLOP count is not the cost model's.
static void print_header(const Check *k) {
    const Measured *M = &k->M;
    printf("# bench_costcheck: the cost model vs one measured LLaMA-7B layer\n\n");
    printf("%s, %s, bf16, TP 1; model %s (linear %.4g FLOP/token forward, attention %.0f FLOP/pair forward); "
           "forward + backward = 3x forward.\n\n",
           k->path, M->device, k->m.name, k->lin_flops, k->pair_flops);
    for (int i = 0; i < M->n; i++) {
        double counted = M->rows[i].linear_flops_fwd;
        if (fabs(counted - k->lin_flops * (double)M->rows[i].s) > 1e-9 * counted)
            printf("WARNING: s = %lld: the file counts %.6g linear FLOPs, the cost model %.6g: not the same layer\n",
                   (long long)M->rows[i].s, counted, k->lin_flops * (double)M->rows[i].s);
    }
}

// 1. The fit. attn_efficiency: the attention kernel's forward + backward alone, less its per-call
// floor (attn_step, section 5: one call per length), in the cost model's FLOP convention (3 x 4 x
// heads x head_dim per visible pair). efficiency: what is left of the layer after the attention and
// the model's fixed per-layer cost, against the linear FLOPs. Both as total FLOPs / total seconds
// over the fit lengths: the rate that reproduces their summed time.
static void print_fit(const Check *k) {
    const Measured *M = &k->M;
    const HardwareProfile *meas = k->meas;
    double pair_flops = k->pair_flops, lin_flops = k->lin_flops, peak = k->peak;
    double attn_flop = 0, attn_sec = 0, lin_flop = 0, lin_sec = 0;
    for (int i = 0; i < M->n; i++) {
        const Row *r = &M->rows[i];
        if (r->s < FIT_MIN_TOKENS) continue;
        attn_flop += 3.0 * pair_flops * cost_causal_area(r->s);
        attn_sec += r->attn_fwdbwd - meas->attn_step;
        lin_flop += 3.0 * lin_flops * (double)r->s;
        lin_sec += r->fwdbwd - r->attn_fwdbwd - k->cmeas.layer_const;
    }
    if (!(attn_sec > 0 && lin_sec > 0)) bs_die("%s: no rows with s >= %d to fit on", k->path, FIT_MIN_TOKENS);
    printf("## The fit behind h100-measured (s >= %d; shorter lengths held out)\n\n", FIT_MIN_TOKENS);
    printf("| quantity | FLOPs | seconds | TFLOP/s | / peak %.0f TFLOP/s | profile |\n|---|---:|---:|---:|---:|---:|\n",
           peak / 1e12);
    printf("| attention fwd+bwd - %.0f us floor (3 x %.0f x pairs) | %.4e | %.4f | %.1f | %.4f | %.3f |\n",
           meas->attn_step * 1e6, pair_flops, attn_flop, attn_sec, attn_flop / attn_sec / 1e12, attn_flop / attn_sec / peak,
           meas->attn_efficiency);
    printf("| layer - attention - %.0f us (3 x %.4g x s) | %.4e | %.4f | %.1f | %.4f | %.3f |\n",
           k->cmeas.layer_const * 1e6, lin_flops, lin_flop, lin_sec, lin_flop / lin_sec / 1e12, lin_flop / lin_sec / peak,
           meas->efficiency);
    printf("| bf16 GEMM 8192^3 (not used) | | | %.1f | %.4f | |\n", M->gemm_tflops, M->gemm_tflops * 1e12 / peak);
    printf("| host_bw: min(h2d %.2f, d2h %.2f) GB/s | | | | | %.1f GB/s |\n\n", M->h2d_GBps, M->d2h_GBps,
           meas->host_bw / 1e9);

    // per length, the same two rates, to show how flat they are
    printf("| s | attention fwd+bwd ms | attention / peak | linear rest ms | linear / peak | in fit |\n");
    printf("|---:|---:|---:|---:|---:|:---:|\n");
    for (int i = 0; i < M->n; i++) {
        const Row *r = &M->rows[i];
        double rest = r->fwdbwd - r->attn_fwdbwd - k->cmeas.layer_const;
        printf("| %lld | %.3f | %.3f | %.3f | %.3f | %s |\n", (long long)r->s, r->attn_fwdbwd * 1e3,
               3.0 * pair_flops * cost_causal_area(r->s) / (r->attn_fwdbwd - meas->attn_step) / peak, rest * 1e3,
               3.0 * lin_flops * (double)r->s / rest / peak, r->s >= FIT_MIN_TOKENS ? "yes" : "held out");
    }
}

// 2. The layer, forward + backward, on both profiles; what the GEMM figure as efficiency and the
// catalogue's llama-7b would give, for scale.
static void print_layer(const Check *k) {
    const Measured *M = &k->M;
    printf("\n## Layer forward + backward: measured vs cost_layer_time\n\n");
    printf("| s | measured ms | h100-sxm ms | error | h100-measured ms | error | in the fit |\n");
    printf("|---:|---:|---:|---:|---:|---:|:---:|\n");
    double worst_sheet = 0, worst_meas = 0, worst_held = 0;
    for (int i = 0; i < M->n; i++) {
        const Row *r = &M->rows[i];
        double ps = cost_layer_time(&k->cs, r->s), pm = cost_layer_time(&k->cmeas, r->s);
        double es = rel_err(ps, r->fwdbwd), em = rel_err(pm, r->fwdbwd);
        worst_sheet = fmax(worst_sheet, fabs(es));
        worst_meas = fmax(worst_meas, fabs(em));
        if (r->s < FIT_MIN_TOKENS) worst_held = fmax(worst_held, fabs(em));
        printf("| %lld | %.2f | %.2f | %+.1f%% | %.2f | %+.1f%% | %s |\n", (long long)r->s, r->fwdbwd * 1e3, ps * 1e3,
               100 * es, pm * 1e3, 100 * em, r->s >= FIT_MIN_TOKENS ? "yes" : "held out");
    }
    printf("\nLargest |error|: h100-sxm %.1f%%, h100-measured %.1f%% (%.1f%% on the held-out s < %d).\n",
           100 * worst_sheet, 100 * worst_meas, 100 * worst_held, FIT_MIN_TOKENS);

    // what the GEMM figure would have given as efficiency (why it is not used)
    HardwareProfile gemm = *k->meas;
    gemm.efficiency = M->gemm_tflops * 1e12 / k->peak;
    CostModel cg;
    if (cost_derive(&cg, &k->m, &gemm, 1, 1, 1, 65536) != 0) bs_die_errmsg();
    double worst_gemm = 0;
    for (int i = 0; i < M->n; i++)
        worst_gemm = fmax(worst_gemm, fabs(rel_err(cost_layer_time(&cg, M->rows[i].s), M->rows[i].fwdbwd)));
    printf("With efficiency = the GEMM figure (%.3f) instead, the largest |error| would be %.1f%%.\n", gemm.efficiency,
           100 * worst_gemm);
    // and the catalogue's llama-7b (8 K/V groups) on h100-measured, for scale
    CostModel cq;
    if (cost_derive(&cq, model_find("llama-7b"), k->meas, 1, 1, 1, 65536) != 0) bs_die_errmsg();
    printf("The catalogue's llama-7b (8 K/V heads) does %.3f of this layer's linear FLOPs; on h100-measured it "
           "predicts %.2f ms at s = %lld.\n",
           cost_linear_flops_per_token(model_find("llama-7b")) / k->lin_flops, cost_layer_time(&cq, M->rows[0].s) * 1e3,
           (long long)M->rows[0].s);
}

// 3. The forward alone against a third of the layer (h100-measured).
static void print_forward(const Check *k) {
    const Measured *M = &k->M;
    printf("\n## Forward alone: measured vs a third of the layer (h100-measured)\n\n");
    printf("| s | measured fwd ms | fwd / (fwd+bwd) | predicted fwd ms | error |\n|---:|---:|---:|---:|---:|\n");
    double worst_fwd = 0;
    for (int i = 0; i < M->n; i++) {
        const Row *r = &M->rows[i];
        double pf = cost_layer_time(&k->cmeas, r->s) / 3.0, e = rel_err(pf, r->fwd);
        worst_fwd = fmax(worst_fwd, fabs(e));
        printf("| %lld | %.2f | %.3f | %.2f | %+.1f%% |\n", (long long)r->s, r->fwd * 1e3, r->fwd / r->fwdbwd, pf * 1e3,
               100 * e);
    }
    printf("\nLargest |error| of the forward: %.1f%%.\n", 100 * worst_fwd);
}

// 4. Activations. act_token models a fused layer. Eager PyTorch keeps three more bf16 tensors per
// token: the rotated q and k beside the QKV projection's output (which the saved v, a view of it,
// keeps alive), the attention output's contiguous copy for the O projection, and silu(gate) beside
// gate, up and their product. docs/hardware.md lists every tensor.
static void print_activations(const Check *k) {
    const Measured *M = &k->M;
    const CostModel *cmeas = &k->cmeas;
    double d_attn = (double)k->m.n_heads * k->m.head_dim;
    double eager_extra = k->meas->elem_bytes * (2.0 * d_attn + d_attn + (double)k->m.d_ff);
    printf("\n## Saved activations per token: measured vs act_token (tp 1, bf16)\n\n");
    printf("| s | measured bytes/token | act_token | act_token / measured | "
           "act_token + eager extras (%.0f) | error |\n",
           eager_extra);
    printf("|---:|---:|---:|---:|---:|---:|\n");
    for (int i = 0; i < M->n; i++) {
        const Row *r = &M->rows[i];
        double per = r->act_bytes / (double)r->s;
        printf("| %lld | %.1f | %.0f | %.3f | %.0f | %+.2f%% |\n", (long long)r->s, per, cmeas->act_token,
               cmeas->act_token / per, cmeas->act_token + eager_extra, 100 * rel_err(cmeas->act_token + eager_extra, per));
    }
}

// 5. One ring step. t = attn_step + pairs x rate over every measured block, weights 1/t^2 (relative
// error): the constant is the floor a block pays whatever its size, the slope the kernel's rate
// once it is large. The same solver `bytescale profile` fits the engine's ring steps with.
static void print_ring_step(const Check *k) {
    const RingSteps *R = &k->R;
    const CostModel *cmeas = &k->cmeas;
    double X[2 * MAX_ROWS], y[MAX_ROWS], w[MAX_ROWS], coef[2];
    for (int i = 0; i < R->n; i++) {
        double pairs = R->rows[i].causal ? cost_causal_area(R->rows[i].n) : (double)R->rows[i].n * R->rows[i].n;
        X[2 * i] = 1.0, X[2 * i + 1] = pairs;
        y[i] = R->rows[i].fwdbwd, w[i] = 1.0 / (y[i] * y[i]);
    }
    if (profile_lstsq(X, y, w, R->n, 2, coef) != 0) bs_die_errmsg();
    double fit_eff = 3.0 * k->pair_flops / coef[1] / k->peak;
    printf("\n## One ring step: measured block compute vs attn_step + pairs x attn_pair\n\n");
    printf("%s: queries of n tokens against keys of n tokens, LLaMA-7B heads (32 x 128), bf16, fused attention "
           "called from Python, median of 20. Fit over all %d blocks, weights 1/t^2: attn_step = **%.1f us** "
           "(profile %.1f us), rate %.4f of peak (the layer fit's attn_efficiency: %.3f).\n\n",
           k->ring_path, R->n, coef[0] * 1e6, k->meas->attn_step * 1e6, fit_eff, k->meas->attn_efficiency);
    printf("| n | block | pairs | measured fwd+bwd us | h100-measured us | error | without the floor us | error | "
           "measured TFLOP/s | model TFLOP/s |\n|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|\n");
    double worst_step = 0;
    for (int i = 0; i < R->n; i++) {
        double pairs = X[2 * i + 1], t = R->rows[i].fwdbwd;
        double model = cmeas->attn_step + cmeas->attn_pair * pairs, bare = cmeas->attn_pair * pairs;
        double flops = 3.0 * k->pair_flops * pairs;
        if (R->rows[i].n >= 64) worst_step = fmax(worst_step, fabs(rel_err(model, t)));
        printf("| %lld | %s | %.4g | %.1f | %.1f | %+.1f%% | %.1f | %+.1f%% | %.2f | %.2f |\n", (long long)R->rows[i].n,
               R->rows[i].causal ? "causal" : "full", pairs, t * 1e6, model * 1e6, 100 * rel_err(model, t), bare * 1e6,
               100 * rel_err(bare, t), flops / t / 1e12, flops / model / 1e12);
    }
    printf("\nLargest |error| from 64 tokens per chunk up: %.1f%% (16 tokens: Python's launch noise, the causal "
           "block slower than at 64).\n", 100 * worst_step);
    printf("The forward alone is %.0f%%-%.0f%% of a small block's forward + backward (the model splits it 1/3 : "
           "2/3 like the rest of the layer).\n", 100 * R->rows[0].fwd / R->rows[0].fwdbwd, 100 * R->rows[1].fwd / R->rows[1].fwdbwd);
}

// What the floor does to a static mesh: the catalogue's llama-7b (32 layers, 8 K/V groups) on
// h100-measured. A static CP mesh of degree D runs micro-batches of D x C tokens of packed short
// sequences as rings of D, C = 8K tokens per member; HDP packs the same C tokens on each rank.
// Sequences of 1K tokens.
static void print_static_mesh(const Check *k) {
    CostModel c7, c7bare;
    if (cost_derive(&c7, model_find("llama-7b"), k->meas, 1, 1, 1024, 8192) != 0) bs_die_errmsg();
    c7bare = c7;
    c7bare.attn_step = 0;
    enum { SEQ = 1024, C = 8192, MAX_D = 256 };
    static int64_t segs[MAX_D * C / SEQ];
    for (int j = 0; j < MAX_D * C / SEQ; j++) segs[j] = SEQ;
    double pack = cost_item_time(&c7, segs, C / SEQ, 1, 0), pack_bare = cost_item_time(&c7bare, segs, C / SEQ, 1, 0);
    printf("\n### What the floor does to a static mesh: llama-7b (%d layers) on h100-measured, %d tokens per "
           "rank of %d-token sequences\n\n", c7.n_layers, C, SEQ);
    printf("| CP degree D | micro-batch tokens | per-rank time ms | without the floor ms | the floor adds | "
           "vs HDP's pack | without the floor |\n|---:|---:|---:|---:|---:|---:|---:|\n");
    for (int D = 1; D <= MAX_D; D *= 4) {
        int n = D * C / SEQ;
        double t = cost_item_time(&c7, segs, n, D, 0), tb = cost_item_time(&c7bare, segs, n, D, 0);
        printf("| %d | %d | %.1f | %.1f | %+.1f%% | %.2fx | %.2fx |\n", D, D * C, t * 1e3, tb * 1e3,
               100 * (t / tb - 1), t / pack, tb / pack_bare);
    }
    printf("\n(`vs HDP's pack`: the ring member's time over the same %d tokens packed on one rank. D = 256 is "
           "the static mesh of the paper's 2M context at C = 8K. Where the K/V transfers outlast the blocks "
           "(RDMA, D > 8) they hide the floor: a block waits for its K/V either way.)\n", C);
}

int main(int argc, char **argv) {
    Check k;
    char path[4096], ring_path[4096];
    load(&k, argc, argv, path, ring_path, sizeof path);
    print_header(&k);
    print_fit(&k);          // 1.
    print_layer(&k);        // 2.
    print_forward(&k);      // 3.
    print_activations(&k);  // 4.
    print_ring_step(&k);    // 5.
    print_static_mesh(&k);
    return 0;
}
