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
//   4. saved activation bytes per token beside act_token.
// Predictions use llama-7b with 32 K/V heads: the measured layer is LLaMA-7B as released (multi-head),
// while the catalogue's llama-7b has the paper's 8 K/V groups and 12% fewer linear FLOPs per token.
// Like is compared with like; the file's linear_flops_fwd is checked against the cost model's count.
//
// usage: bench_costcheck [FILE]   (default docs/measured/h100-llama7b-layer.json, looked up in the
//        current directory, then $BS_SOURCE_DIR, then the source tree above the build directory)
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

#define MEASURED_FILE "docs/measured/h100-llama7b-layer.json"
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

// (predicted - measured) / measured; below 0.005% it is shown as zero, not as "-0.00%"
static double rel_err(double predicted, double measured) {
    double e = (predicted - measured) / measured;
    return fabs(e) < 5e-5 ? 0.0 : e;
}

int main(int argc, char **argv) {
    if (argc > 2) bs_die("usage: bench_costcheck [FILE]   (default %s)", MEASURED_FILE);
    char path[4096];
    if (argc == 2) snprintf(path, sizeof path, "%s", argv[1]);
    else if (file_find_source(MEASURED_FILE, path, sizeof path) != 0) bs_die_errmsg();
    Measured M;
    if (read_measured(path, &M) != 0) bs_die_errmsg();

    // the layer that was measured: LLaMA-7B as released, 32 query heads and 32 K/V heads
    ModelConfig m = *model_find("llama-7b");
    m.n_kv_heads = m.n_heads;
    snprintf(m.name, sizeof m.name, "llama-7b-mha");
    const HardwareProfile *sheet = hw_find("h100-sxm"), *meas = hw_find("h100-measured");
    if (!sheet || !meas) bs_die_errmsg();
    CostModel cs, cmeas;
    if (cost_derive(&cs, &m, sheet, 1, 1, 1, 65536) != 0 || cost_derive(&cmeas, &m, meas, 1, 1, 1, 65536) != 0)
        bs_die_errmsg();
    double lin_flops = cost_linear_flops_per_token(&m), pair_flops = cost_attn_flops_per_pair(&m);

    printf("# bench_costcheck: the cost model vs one measured LLaMA-7B layer\n\n");
    printf("%s, %s, bf16, TP 1; model %s (linear %.4g FLOP/token forward, attention %.0f FLOP/pair forward); "
           "forward + backward = 3x forward.\n\n",
           path, M.device, m.name, lin_flops, pair_flops);
    for (int i = 0; i < M.n; i++)
        if (fabs(M.rows[i].linear_flops_fwd - lin_flops * (double)M.rows[i].s) > 1e-9 * M.rows[i].linear_flops_fwd)
            printf("WARNING: s = %lld: the file counts %.6g linear FLOPs, the cost model %.6g: not the same layer\n",
                   (long long)M.rows[i].s, M.rows[i].linear_flops_fwd, lin_flops * (double)M.rows[i].s);

    // ---- 1. the fit --------------------------------------------------------------------------
    // attn_efficiency: the attention kernel's forward + backward alone, in the cost model's FLOP
    // convention (3 x 4 x heads x head_dim per visible pair). efficiency: what is left of the layer
    // after the attention and the model's fixed per-layer cost, against the linear FLOPs. Both as
    // total FLOPs / total seconds over the fit lengths: the rate that reproduces their summed time.
    double attn_flop = 0, attn_sec = 0, lin_flop = 0, lin_sec = 0;
    for (int i = 0; i < M.n; i++) {
        const Row *r = &M.rows[i];
        if (r->s < FIT_MIN_TOKENS) continue;
        attn_flop += 3.0 * pair_flops * cost_causal_area(r->s);
        attn_sec += r->attn_fwdbwd;
        lin_flop += 3.0 * lin_flops * (double)r->s;
        lin_sec += r->fwdbwd - r->attn_fwdbwd - cmeas.layer_const;
    }
    if (!(attn_sec > 0 && lin_sec > 0)) bs_die("%s: no rows with s >= %d to fit on", path, FIT_MIN_TOKENS);
    double peak = meas->peak_flops;
    printf("## The fit behind h100-measured (s >= %d; shorter lengths held out)\n\n", FIT_MIN_TOKENS);
    printf("| quantity | FLOPs | seconds | TFLOP/s | / peak %.0f TFLOP/s | profile |\n|---|---:|---:|---:|---:|---:|\n",
           peak / 1e12);
    printf("| attention fwd+bwd (3 x %.0f x pairs) | %.4e | %.4f | %.1f | %.4f | %.3f |\n", pair_flops, attn_flop,
           attn_sec, attn_flop / attn_sec / 1e12, attn_flop / attn_sec / peak, meas->attn_efficiency);
    printf("| layer - attention - %.0f us (3 x %.4g x s) | %.4e | %.4f | %.1f | %.4f | %.3f |\n",
           cmeas.layer_const * 1e6, lin_flops, lin_flop, lin_sec, lin_flop / lin_sec / 1e12, lin_flop / lin_sec / peak,
           meas->efficiency);
    printf("| bf16 GEMM 8192^3 (not used) | | | %.1f | %.4f | |\n", M.gemm_tflops, M.gemm_tflops * 1e12 / peak);
    printf("| host_bw: min(h2d %.2f, d2h %.2f) GB/s | | | | | %.1f GB/s |\n\n", M.h2d_GBps, M.d2h_GBps,
           meas->host_bw / 1e9);

    // per length, the same two rates, to show how flat they are
    printf("| s | attention fwd+bwd ms | attention / peak | linear rest ms | linear / peak | in fit |\n");
    printf("|---:|---:|---:|---:|---:|:---:|\n");
    for (int i = 0; i < M.n; i++) {
        const Row *r = &M.rows[i];
        double rest = r->fwdbwd - r->attn_fwdbwd - cmeas.layer_const;
        printf("| %lld | %.3f | %.3f | %.3f | %.3f | %s |\n", (long long)r->s, r->attn_fwdbwd * 1e3,
               3.0 * pair_flops * cost_causal_area(r->s) / r->attn_fwdbwd / peak, rest * 1e3,
               3.0 * lin_flops * (double)r->s / rest / peak, r->s >= FIT_MIN_TOKENS ? "yes" : "held out");
    }

    // ---- 2. the layer, forward + backward ---------------------------------------------------------
    printf("\n## Layer forward + backward: measured vs cost_layer_time\n\n");
    printf("| s | measured ms | h100-sxm ms | error | h100-measured ms | error | in the fit |\n");
    printf("|---:|---:|---:|---:|---:|---:|:---:|\n");
    double worst_sheet = 0, worst_meas = 0, worst_held = 0;
    for (int i = 0; i < M.n; i++) {
        const Row *r = &M.rows[i];
        double ps = cost_layer_time(&cs, r->s), pm = cost_layer_time(&cmeas, r->s);
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
    HardwareProfile gemm = *meas;
    gemm.efficiency = M.gemm_tflops * 1e12 / peak;
    CostModel cg;
    if (cost_derive(&cg, &m, &gemm, 1, 1, 1, 65536) != 0) bs_die_errmsg();
    double worst_gemm = 0;
    for (int i = 0; i < M.n; i++)
        worst_gemm = fmax(worst_gemm, fabs(rel_err(cost_layer_time(&cg, M.rows[i].s), M.rows[i].fwdbwd)));
    printf("With efficiency = the GEMM figure (%.3f) instead, the largest |error| would be %.1f%%.\n", gemm.efficiency,
           100 * worst_gemm);
    // and the catalogue's llama-7b (8 K/V groups) on h100-measured, for scale
    CostModel cq;
    if (cost_derive(&cq, model_find("llama-7b"), meas, 1, 1, 1, 65536) != 0) bs_die_errmsg();
    printf("The catalogue's llama-7b (8 K/V heads) does %.3f of this layer's linear FLOPs; on h100-measured it "
           "predicts %.2f ms at s = %lld.\n",
           cost_linear_flops_per_token(model_find("llama-7b")) / lin_flops, cost_layer_time(&cq, M.rows[0].s) * 1e3,
           (long long)M.rows[0].s);

    // ---- 3. the forward alone -------------------------------------------------------------------
    printf("\n## Forward alone: measured vs a third of the layer (h100-measured)\n\n");
    printf("| s | measured fwd ms | fwd / (fwd+bwd) | predicted fwd ms | error |\n|---:|---:|---:|---:|---:|\n");
    double worst_fwd = 0;
    for (int i = 0; i < M.n; i++) {
        const Row *r = &M.rows[i];
        double pf = cost_layer_time(&cmeas, r->s) / 3.0, e = rel_err(pf, r->fwd);
        worst_fwd = fmax(worst_fwd, fabs(e));
        printf("| %lld | %.2f | %.3f | %.2f | %+.1f%% |\n", (long long)r->s, r->fwd * 1e3, r->fwd / r->fwdbwd, pf * 1e3,
               100 * e);
    }
    printf("\nLargest |error| of the forward: %.1f%%.\n", 100 * worst_fwd);

    // ---- 4. activations ---------------------------------------------------------------------------
    // act_token models a fused layer. Eager PyTorch keeps three more bf16 tensors per token: the
    // rotated q and k beside the QKV projection's output (which the saved v, a view of it, keeps
    // alive), the attention output's contiguous copy for the O projection, and silu(gate) beside
    // gate, up and their product. docs/hardware.md lists every tensor.
    double d_attn = (double)m.n_heads * m.head_dim;
    double eager_extra = meas->elem_bytes * (2.0 * d_attn + d_attn + (double)m.d_ff);
    printf("\n## Saved activations per token: measured vs act_token (tp 1, bf16)\n\n");
    printf("| s | measured bytes/token | act_token | act_token / measured | "
           "act_token + eager extras (%.0f) | error |\n",
           eager_extra);
    printf("|---:|---:|---:|---:|---:|---:|\n");
    for (int i = 0; i < M.n; i++) {
        const Row *r = &M.rows[i];
        double per = r->act_bytes / (double)r->s;
        printf("| %lld | %.1f | %.0f | %.3f | %.0f | %+.2f%% |\n", (long long)r->s, per, cmeas.act_token,
               cmeas.act_token / per, cmeas.act_token + eager_extra, 100 * rel_err(cmeas.act_token + eager_extra, per));
    }
    return 0;
}
