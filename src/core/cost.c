// cost.c: the analytic cost model (see cost.h; every formula is written out in docs/cost-model.md).
//
// All times are per HDP rank (one TP x PP group of devices), per layer unless a name says
// otherwise, forward + backward. A training pass costs 3x the forward FLOPs (the backward pass
// computes the gradients of both the inputs and the weights: 2x forward).
#include "bytescale/cost.h"
#include "core/fminmax.h"

#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>

#include "bytescale/error.h"
#include "bytescale/json.h"

// Fixed cost of one layer for one micro-batch, forward + backward: ~40 kernels (norms, RoPE,
// projections, attention, SwiGLU, residuals, TP collectives) at a few microseconds of launch and
// tail each that large inputs do not hide. Small against any real layer (LLaMA-7B at 4K tokens on
// 8 H800s: ~1 ms); it matters only for tiny micro-batches.
#define COST_LAYER_CONST 50e-6

// AdamW streams, per parameter of the rank's shard: gradient read (elem_bytes), fp32 master or
// parameter read + write (8), m and v read + write (16), 16-bit parameter write (elem_bytes, only
// with a master copy). Both the bf16 and the fp32 case come to 28 bytes.
#define ADAMW_BYTES_PER_PARAM 28.0

// ---- FLOPs --------------------------------------------------------------------------------------

double cost_linear_flops_per_token(const ModelConfig *m) {
    double d = m->d_model;
    double d_attn = (double)m->n_heads * m->head_dim;
    double d_kv = (double)m->n_kv_heads * m->head_dim;
    double q_o = 2.0 * 2.0 * d * d_attn;                     // Q and O projections
    double k_v = 2.0 * 2.0 * d * d_kv;                       // K and V projections (GQA: n_kv heads)
    double mlp = 2.0 * 3.0 * d * m->d_ff * (double)m->top_k; // gate, up, down of each active expert
    double router = m->n_experts > 1 ? 2.0 * d * m->n_experts : 0.0;
    return q_o + k_v + mlp + router;
}

// Per visible (query, key) pair, every query head does one dot product for the score (QK^T) and
// one scaled accumulation of a value row (PV): 2 * head_dim FLOPs each. K/V heads shared by GQA
// do not reduce this work, only the K/V bytes.
double cost_attn_flops_per_pair(const ModelConfig *m) { return 4.0 * (double)m->n_heads * m->head_dim; }

double cost_head_flops_per_token(const ModelConfig *m) { return 2.0 * (double)m->d_model * m->vocab_size; }

double cost_causal_area(int64_t s) {
    if (s <= 0) return 0.0;
    // exact in 64-bit integers while s(s+1) fits (s < 3.03e9); beyond that a double is close enough
    if (s < 3037000499LL) return (double)(s * (s + 1) / 2);
    return (double)s * ((double)s + 1.0) / 2.0;
}

// Tokens and visible (query, key) pairs of a pack of causal segments (lengths <= 0 are skipped).
// The sums run in locals: through the two pointers (which might alias) every step was a store and a
// reload, a chain of store forwards on every item the planners time.
static void pack_size(const int64_t *segs, int n_segs, double *tokens, double *area) {
    double t = 0, a = 0;
    for (int i = 0; i < n_segs; i++) {
        if (segs[i] <= 0) continue;
        t += (double)segs[i];
        a += cost_causal_area(segs[i]);
    }
    *tokens = t;
    *area = a;
}

double cost_train_flops(const ModelConfig *m, const int64_t *segs, int n_segs) {
    double tokens, area;
    pack_size(segs, n_segs, &tokens, &area);
    double per_layer = cost_linear_flops_per_token(m) * tokens + cost_attn_flops_per_pair(m) * area;
    return 3.0 * (m->n_layers * per_layer + cost_head_flops_per_token(m) * tokens);
}

// ---- memory -------------------------------------------------------------------------------------

// K/V heads one TP device holds: TP splits the heads; with more devices than K/V heads each device
// keeps (a replica of) one.
static double kv_heads_per_device(const ModelConfig *m, int tp) {
    return (double)((m->n_kv_heads + tp - 1) / tp);
}

// Bytes one device keeps per token of one layer for the backward pass, with flash attention (no
// s x s scores, only the log-sum-exp) and Megatron sequence parallelism (the d_model-wide tensors
// are split over the TP group along the sequence):
//   x, RMSNorm(x), x_mid, RMSNorm(x_mid)      4 * d_model / tp       (norm and projection inputs)
//   q, attention output                       2 * n_heads * head_dim / tp
//   k, v                                      2 * kv heads per device * head_dim
//   gate, up, SwiGLU output (down's input)    3 * d_ff * top_k / tp
// in elem_bytes each, plus fp32 side tensors: the log-sum-exp (n_heads / tp), the two RMSNorm
// reciprocal RMS values (2 / tp) and, for MoE, the router probabilities (n_experts / tp).
static double act_bytes_per_token(const ModelConfig *m, int elem_bytes, int tp) {
    double d_attn = (double)m->n_heads * m->head_dim;
    double elems = 4.0 * m->d_model / tp + 2.0 * d_attn / tp + 2.0 * kv_heads_per_device(m, tp) * m->head_dim +
                   3.0 * (double)m->d_ff * m->top_k / tp;
    double fp32 = (double)m->n_heads / tp + 2.0 / tp + (m->n_experts > 1 ? (double)m->n_experts / tp : 0.0);
    return elems * elem_bytes + fp32 * 4.0;
}

// Parameters of the most loaded pipeline stage: its layers plus the embedding (first stage) or the
// final norm and output head (last stage); with one stage, all of them.
static double stage_params(const ModelConfig *m, int pp) {
    int layers = (m->n_layers + pp - 1) / pp;
    double emb = (double)m->vocab_size * m->d_model;
    double head = (double)m->vocab_size * m->d_model + m->d_model;
    double outer = pp == 1 ? emb + head : cost_fmax(emb, head);
    return layers * (double)model_params_per_layer(m) + outer;
}

static int check_layout(const ModelConfig *m, const HardwareProfile *hw, int tp, int pp, int hdp_ranks,
                        int64_t capacity) {
    if (model_check(m) != 0 || hw_check(hw) != 0) return -1;
    if (tp < 1 || pp < 1 || hdp_ranks < 1 || capacity < 1)
        return bs_fail("cost model: tp (%d), pp (%d), hdp_ranks (%d) and capacity (%lld) must all be >= 1", tp, pp,
                       hdp_ranks, (long long)capacity);
    if (m->n_heads % tp != 0)
        return bs_fail("cost model: tp %d must divide the %d query heads of %s", tp, m->n_heads, m->name);
    if (tp > hw->gpus_per_node)
        return bs_fail("cost model: tp %d exceeds the %d devices per node of %s (TP stays inside a node)", tp,
                       hw->gpus_per_node, hw->name);
    if (pp > m->n_layers)
        return bs_fail("cost model: pp %d exceeds the %d layers of %s", pp, m->n_layers, m->name);
    return 0;
}

int cost_memory(CostMemory *out, const ModelConfig *m, const HardwareProfile *hw, int tp, int pp, int hdp_ranks,
                int64_t capacity) {
    memset(out, 0, sizeof *out);
    if (check_layout(m, hw, tp, pp, hdp_ranks, capacity) != 0) return -1;
    double params = stage_params(m, pp) / tp;          // this device's TP shard of its stage
    double master = hw->elem_bytes < 4 ? 4.0 : 0.0;    // fp32 master copy only for 16-bit training
    int l = (m->n_layers + pp - 1) / pp;
    out->param_bytes = params * hw->elem_bytes;
    out->grad_bytes = params * hw->elem_bytes;
    out->optimizer_bytes = params / hdp_ranks * (master + 8.0);  // + Adam m and v in fp32
    out->act_bytes = l * act_bytes_per_token(m, hw->elem_bytes, tp) * (double)capacity;
    out->total_bytes = out->param_bytes + out->grad_bytes + out->optimizer_bytes + out->act_bytes;
    out->mem_bytes = hw->mem_bytes;
    out->fits = out->total_bytes <= out->mem_bytes;
    return 0;
}

// ---- deriving the coefficients --------------------------------------------------------------------

int cost_derive(CostModel *cm, const ModelConfig *m, const HardwareProfile *hw, int tp, int pp, int hdp_ranks,
                int64_t capacity) {
    if (check_layout(m, hw, tp, pp, hdp_ranks, capacity) != 0) return -1;
    CostModel c;
    memset(&c, 0, sizeof c);
    double matmul_rate = tp * hw->peak_flops * hw->efficiency;
    double attn_eff = hw->attn_efficiency > 0 ? hw->attn_efficiency : hw->efficiency;
    double attn_rate = tp * hw->peak_flops * attn_eff;
    c.attn_pair = 3.0 * cost_attn_flops_per_pair(m) / attn_rate;
    c.lin_token = 3.0 * cost_linear_flops_per_token(m) / matmul_rate;
    c.layer_const = COST_LAYER_CONST;
    c.attn_step = hw->attn_step;  // per kernel call: the same on every TP device and stage

    c.n_layers = (m->n_layers + pp - 1) / pp;
    c.act_token = act_bytes_per_token(m, hw->elem_bytes, tp);
    c.act_const = 0.0;
    c.capacity_bytes = c.n_layers * (c.act_token * (double)capacity + c.act_const);

    c.kv_token = 2.0 * kv_heads_per_device(m, tp) * m->head_dim * hw->elem_bytes;
    // Ulysses (flexsp): Q and the attention output are n_heads / tp heads each, K and V as above
    c.a2a_token = c.kv_token + 2.0 * m->n_heads / tp * m->head_dim * hw->elem_bytes;
    c.a2a_heads = m->n_heads / tp;  // check_layout: tp divides n_heads
    c.a2a_kv_heads = (int)kv_heads_per_device(m, tp);
    // a rank is tp x pp devices, laid out in order (cluster.c): a node holds gpus_per_node / (tp x pp)
    // of them, at least one (a rank larger than a node still counts as one)
    c.ranks_per_node = hw->gpus_per_node / (tp * pp) > 1 ? hw->gpus_per_node / (tp * pp) : 1;
    c.ring_bw = hw->inter_bw;
    c.ring_lat = hw->inter_lat;
    c.ring_bw_intra = hw->intra_bw;
    c.ring_lat_intra = hw->intra_lat;
    c.offload_bw = hw->host_bw;

    // ZeRO-1 over all HDP ranks: reduce-scatter the gradients, all-gather the parameters; each is a
    // ring moving (R-1)/R of the device's shard per device, in elem_bytes.
    int R = hdp_ranks;
    double shard = stage_params(m, pp) / tp;
    double sync_bw = R <= c.ranks_per_node ? hw->intra_bw : hw->inter_bw;
    c.grad_sync = R > 1 ? 2.0 * (R - 1) / R * shard * hw->elem_bytes / sync_bw : 0.0;
    c.optimizer = hw->mem_bw > 0 ? ADAMW_BYTES_PER_PARAM * shard / R / hw->mem_bw : 0.0;

    // 3D: the TP group stays inside a node (check_layout), so its all-reduces use NVLink; the stage
    // messages are left to the simulator's cluster (stage_bw 0), whose placement knows whether two
    // stages share a node. Sequence parallelism splits the stage message over the TP group.
    cost_layout_3d(&c, m, tp, pp, hw->elem_bytes, 1);
    c.tp_bw = hw->intra_bw;
    c.tp_lat = hw->intra_lat;
    *cm = c;
    return 0;
}

void cost_shard(CostModel *cm, const ModelConfig *m, int tp, int pp) {
    if (tp < 1) tp = 1;
    if (pp < 1) pp = 1;
    cm->n_layers = (m->n_layers + pp - 1) / pp;
    cm->attn_pair /= tp, cm->lin_token /= tp, cm->kv_token /= tp, cm->head_token /= tp;
    // the heads a Ulysses group splits, as cost_derive's: a file does not carry them, and without
    // them the policies would plan no all-to-all group or hybrid and flexsp no bound on a group.
    // A group moves Q and the output (a2a_heads heads each) beside K and V (kv_token: 2 x the K/V
    // heads x head_dim x the file's element bytes)
    cm->a2a_heads = m->n_heads / tp;
    cm->a2a_kv_heads = (int)kv_heads_per_device(m, tp);
    cm->a2a_token = cm->kv_token * (1.0 + (double)cm->a2a_heads / cm->a2a_kv_heads);
    // the engine (src/nn/llama.c, src/runtime/pipeline.c) all-reduces and sends the whole fp32
    // residual stream, rows x d_model floats, on every TP rank
    cost_layout_3d(cm, m, tp, pp, (int)sizeof(float), 0);
}

// ---- tensor and pipeline parallelism ----------------------------------------------------------------

void cost_layout_3d(CostModel *cm, const ModelConfig *m, int tp, int pp, int elem_bytes, int seq_parallel) {
    if (tp < 1) tp = 1;
    // the weight gradients of wq, wk, wv and of w_gate, w_up are a third of those matmuls' forward +
    // backward; cost_linear_flops_per_token counts forward FLOPs, lin_token forward + backward (3x)
    double d = m->d_model;
    double lin = cost_linear_flops_per_token(m);
    double qkv = 2.0 * d * ((double)m->n_heads * m->head_dim + 2.0 * (double)m->n_kv_heads * m->head_dim);
    double gate_up = 2.0 * 2.0 * d * m->d_ff * (double)m->top_k;
    cm->tp = tp;
    cm->tp_head = pp <= 1;  // cost.h: the head's all-reduces in the item estimate only without stages
    cm->tp_token = d * elem_bytes;
    cm->stage_token = seq_parallel ? cm->tp_token / tp : cm->tp_token;
    cm->tp_hide_qkv = lin > 0 ? qkv / (3.0 * lin) : 0.0;
    cm->tp_hide_mlp = lin > 0 ? gate_up / (3.0 * lin) : 0.0;
}

// A ring all-reduce of `bytes` over the TP group.
static double tp_ring(const CostModel *cm, double bytes) {
    int T = cm->tp;
    if (T <= 1 || !(cm->tp_bw > 0) || !(bytes > 0)) return 0.0;
    return 2.0 * (T - 1) / T * bytes / cm->tp_bw + 2.0 * (T - 1) * cm->tp_lat;
}

double cost_tp_allreduce(const CostModel *cm, double rows) { return tp_ring(cm, rows * cm->tp_token); }

// cost_tp_head_times and cost_tp_layer_times given ar, the all-reduce of these rows: one item's
// layer and head share it (cost_item_terms makes it once).
static void tp_head_times(const CostModel *cm, double rows, double ar, int first, int last, double *fwd, double *bwd) {
    *fwd = first ? ar : 0.0;
    // the vocabulary-parallel loss: the row max (4 bytes a row), then the exp-sum and the target logit
    // (8), then the head's input gradient (the residual stream)
    *bwd = last ? tp_ring(cm, 4.0 * rows) + tp_ring(cm, 8.0 * rows) + ar : 0.0;
}

static void tp_layer_times(const CostModel *cm, double rows, double ar, double *fwd, double *bwd) {
    double lin = cm->lin_token * (rows > 0 ? rows : 0);
    *fwd = 2.0 * ar;  // after wo and after w_down: the next op needs the sum
    *bwd = cost_fmax(0.0, ar - cm->tp_hide_qkv * lin) + cost_fmax(0.0, ar - cm->tp_hide_mlp * lin);
}

void cost_tp_head_times(const CostModel *cm, double rows, int first, int last, double *fwd, double *bwd) {
    tp_head_times(cm, rows, cost_tp_allreduce(cm, rows), first, last, fwd, bwd);
}

void cost_tp_layer_times(const CostModel *cm, double rows, double *fwd, double *bwd) {
    tp_layer_times(cm, rows, cost_tp_allreduce(cm, rows), fwd, bwd);
}

const char *cost_derived_3d_fields(const CostModel *cm) {
    static const char *names[] = {NULL, "tp_bw, tp_lat", "stage_bw, stage_lat", "tp_bw, tp_lat, stage_bw, stage_lat"};
    return names[cm->derived_3d & 3];
}

double cost_stage_transfer(const CostModel *cm, double rows) {
    if (!(cm->stage_bw > 0) || !(rows > 0)) return 0.0;
    return rows * cm->stage_token / cm->stage_bw + cm->stage_lat;
}

// ---- T(s), Act(s) and item times -------------------------------------------------------------------

double cost_layer_time(const CostModel *cm, int64_t s) {
    return cm->attn_pair * cost_causal_area(s) + cm->lin_token * (double)(s > 0 ? s : 0) + cm->layer_const +
           cm->attn_step;
}

double cost_layer_act(const CostModel *cm, int64_t s) { return cm->act_token * (double)(s > 0 ? s : 0) + cm->act_const; }

double cost_head_time(const CostModel *cm, double n) { return n > 0 ? cm->head_token * n + cm->head_const : 0.0; }

double cost_rank_act(const CostModel *cm, double n, double r) {
    if (n < 0) n = 0;
    int l = cm->n_layers;
    double layer = cm->act_token * n + cm->act_const;
    double shared = cm->act_shared_token * n + cm->act_shared_const;
    if (!(r > 0) || l <= 2) return shared + l * layer;  // also NaN: nothing moves
    if (r > 1) r = 1;
    return shared + (2.0 + (1.0 - r) * (l - 2)) * layer;
}

double cost_act_budget(const CostModel *cm, int64_t C) { return cost_rank_act(cm, (double)C, 0.0); }

int64_t cost_capacity_for(const CostModel *cm, double budget, int64_t most) {
    if (most < 1 || cost_rank_act(cm, 1.0, 0.0) > budget) return 0;
    int64_t lo = 1, hi = most;  // cost_rank_act(lo, 0) <= budget; it grows with the tokens
    while (lo < hi) {
        int64_t mid = lo + (hi - lo + 1) / 2;
        if (cost_rank_act(cm, (double)mid, 0.0) <= budget) lo = mid;
        else hi = mid - 1;
    }
    return lo;
}

int cost_pipe_in_flight(int pp, int stage, int64_t n_micro) {
    int k = pp > stage && stage >= 0 ? pp - stage : 1;
    return n_micro > 0 && n_micro < k ? (int)n_micro : k;
}

double cost_max_offload_tokens(const CostModel *cm, int64_t C) {
    double best = (double)C;
    double per_token = cm->act_shared_token + 2.0 * cm->act_token;
    if (cm->n_layers > 2 && per_token > 0) {
        // cost_rank_act(t, 1) = shared(t) + 2 Act(t) <= budget, solved for t
        double t = (cost_act_budget(cm, C) - cm->act_shared_const - 2.0 * cm->act_const) / per_token;
        if (t > best) best = t;
    }
    return best;
}

// The link a ring of D consecutive ranks uses: inside one node when it fits there.
static void ring_link(const CostModel *cm, int D, double *bw, double *lat) {
    if (cm->ranks_per_node > 1 && cm->ring_bw_intra > 0 && D <= cm->ranks_per_node) {
        *bw = cm->ring_bw_intra;
        *lat = cm->ring_lat_intra;
    } else {
        *bw = cm->ring_bw;
        *lat = cm->ring_lat;
    }
}

static double transfer_time(double bytes, double bw, double lat) { return (bw > 0 ? bytes / bw : 0.0) + lat; }

// One layer of an item on one of its D ranks, forward and backward, without offloading. tokens and
// area: the item's total tokens and visible (query, key) pairs.
static void item_layer_compute(const CostModel *cm, double tokens, double area, int D, double *fwd, double *bwd) {
    double attn = cm->attn_pair * area;
    double lin = cm->lin_token * tokens + cm->layer_const;
    if (D == 1) {  // forward is a third of the layer's work, backward two thirds; one attention block
        *fwd = (attn + cm->attn_step + lin) / 3.0;
        *bwd = 2.0 * (attn + cm->attn_step + lin) / 3.0;
        return;
    }
    // The symmetric 2D-chunk layout gives every rank 1/D of every segment and 1/D of its mask
    // area, and every ring step the same 1/D^2 of the area. Step k computes on the K/V block
    // that arrived in step k-1 while the next block travels; the local block (step 0) hides
    // the first transfer. Backward sends K/V and the partial dK/dV together (twice the bytes)
    // and, after the last step, the summed dK/dV travel home once more: exposed. Every block
    // pays the per-call floor attn_step, however few pairs it holds: a wide ring over short
    // chunks is D floors per layer, not its FLOPs.
    double bw, lat;
    ring_link(cm, D, &bw, &lat);
    double kv_bytes = cm->kv_token * tokens / D;  // one rank's K/V block
    double x_fwd = transfer_time(kv_bytes, bw, lat);
    double x_bwd = transfer_time(2.0 * kv_bytes, bw, lat);
    double blk_fwd = (attn / ((double)D * D) + cm->attn_step) / 3.0;
    double blk_bwd = 2.0 * (attn / ((double)D * D) + cm->attn_step) / 3.0;
    double lin_rank = cm->lin_token * tokens / D;
    *fwd = (lin_rank + cm->layer_const) / 3.0 + blk_fwd + (D - 1) * cost_fmax(blk_fwd, x_fwd);
    *bwd = 2.0 * (lin_rank + cm->layer_const) / 3.0 + blk_bwd + (D - 1) * cost_fmax(blk_bwd, x_bwd) + x_fwd;
}

// The same with the layer's TP all-reduces (cost_tp_layer_times of the rank's tokens / D).
static void item_layer_times(const CostModel *cm, double tokens, double area, int D, double *fwd, double *bwd) {
    double tp_fwd, tp_bwd;
    cost_tp_layer_times(cm, tokens / D, &tp_fwd, &tp_bwd);
    item_layer_compute(cm, tokens, area, D, fwd, bwd);
    *fwd += tp_fwd;
    *bwd += tp_bwd;
}

// Offloading, the one definition both the item time and Eq. 3's overlap test use: all but two
// layers copy r of their activations out while the NEXT layer runs forward, and back in while the
// previous one runs backward. The copy hides when it takes no longer than a layer's forward
// (backward is longer, so the copy in hides then too); what outlasts it is paid.
static double offload_copy_time(const CostModel *cm, double tokens, int D, double r) {
    return r * (cm->act_token * tokens / D + cm->act_const) / cm->offload_bw;
}

double cost_offload_hidden_max(const CostModel *cm, int64_t s, int D) {
    if (D < 1) D = 1;
    double act_rank = cm->act_token * (double)s / D + cm->act_const;
    if (!(cm->offload_bw > 0) || !(act_rank > 0)) return 1.0;  // a tier that is not modelled is free
    double fwd, bwd;
    item_layer_times(cm, (double)s, cost_causal_area(s), D, &fwd, &bwd);
    double r = fwd * cm->offload_bw / act_rank;
    return r < 1.0 ? r : 1.0;
}

// What offloading r of the activations adds to an item whose layer takes fwd and bwd on each of its
// D members, whatever its kind: a member holds tokens / D of the activations under every kind (a
// ring's chunks, a Ulysses group's rows), and the copy of each of l - 2 layers hides behind the
// next layer's work (offload_copy_time). r <= 0 (or NaN) adds nothing; r > 1 is 1.
static double offload_exposed(const CostModel *cm, double tokens, int D, double r, double fwd, double bwd) {
    int n_off = cm->n_layers > 2 ? cm->n_layers - 2 : 0;
    if (!(r > 0) || n_off == 0 || !(cm->offload_bw > 0)) return 0.0;
    double copy = offload_copy_time(cm, tokens, D, r > 1 ? 1.0 : r);
    return n_off * (cost_fmax(0.0, copy - fwd) + cost_fmax(0.0, copy - bwd));
}

void cost_item_terms(const CostModel *cm, const int64_t *segs, int n_segs, int D, ItemTerms *t) {
    pack_size(segs, n_segs, &t->tokens, &t->area);
    t->D = D < 1 ? 1 : D;
    double rows = t->tokens / t->D, ar = cost_tp_allreduce(cm, rows);  // the layer's and the head's
    tp_layer_times(cm, rows, ar, &t->tp_fwd, &t->tp_bwd);
    t->head = cost_head_time(cm, rows);  // one stage holds both ends here (the planner's per-rank estimate)
    tp_head_times(cm, rows, ar, cm->tp_head, cm->tp_head, &t->head_fwd, &t->head_bwd);
}

// An item's time from its layer's forward and backward on a member: every layer, the head, and
// what offloading r of the activations leaves exposed. The sum in one order for every kind.
static double item_total(const CostModel *cm, const ItemTerms *t, double r, double fwd, double bwd) {
    return cm->n_layers * (fwd + bwd) + t->head + t->head_fwd + t->head_bwd +
           offload_exposed(cm, t->tokens, t->D, r, fwd, bwd);
}

double cost_ring_terms_time(const CostModel *cm, const ItemTerms *t, double r) {
    if (t->tokens <= 0) return 0.0;
    double fwd, bwd;
    item_layer_compute(cm, t->tokens, t->area, t->D, &fwd, &bwd);
    return item_total(cm, t, r, fwd + t->tp_fwd, bwd + t->tp_bwd);
}

double cost_item_time(const CostModel *cm, const int64_t *segs, int n_segs, int D, double r) {
    ItemTerms t;
    cost_item_terms(cm, segs, n_segs, D, &t);
    return cost_ring_terms_time(cm, &t, r);
}

// A block member's fetch (docs/cost-model.md, "Block items"): the tokens from its own node travel
// on the intra-node link, the rest on the inter-node one, at the same time; the slower sets the time.
static double blocks_fetch_time(const CostModel *cm, double intra, double inter, double token_bytes) {
    double bw, lat, x = 0;
    if (intra > 0) {
        ring_link(cm, 1, &bw, &lat);  // a "ring" inside one node: the intra-node link when there is one
        x = transfer_time(intra * token_bytes, bw, lat);
    }
    if (inter > 0) x = cost_fmax(x, transfer_time(inter * token_bytes, cm->ring_bw, cm->ring_lat));
    return x;
}

void cost_blocks_layer_times(const CostModel *cm, const BlockLoad *ld, double *fwd, double *bwd) {
    double lin = cm->lin_token * ld->tokens + cm->layer_const;
    double local = cm->attn_pair * ld->local_pairs + cm->attn_step;
    double remote = ld->remote_pairs > 0 ? cm->attn_pair * ld->remote_pairs + cm->attn_step : 0;
    double x_kv = blocks_fetch_time(cm, ld->kv_intra, ld->kv_inter, cm->kv_token);
    double x_dkv = blocks_fetch_time(cm, ld->dkv_intra, ld->dkv_inter, cm->kv_token);
    // the remote K/V arrive while the local attention runs (one remote stage); the remote attention
    // waits for them; backward fetches them again and reduces the partial dK/dV after the remote part
    *fwd = lin / 3.0 + cost_fmax(local / 3.0, x_kv) + remote / 3.0;
    *bwd = 2.0 * lin / 3.0 + cost_fmax(2.0 * local / 3.0, x_kv) + 2.0 * remote / 3.0 + x_dkv;
    double tp_fwd, tp_bwd;
    cost_tp_layer_times(cm, ld->tokens, &tp_fwd, &tp_bwd);
    *fwd += tp_fwd;
    *bwd += tp_bwd;
}

double cost_blocks_member_time(const CostModel *cm, const BlockLoad *ld) {
    if (ld->tokens <= 0) return 0.0;  // a member that owns no block this micro-batch
    double fwd, bwd, head_fwd, head_bwd;
    cost_blocks_layer_times(cm, ld, &fwd, &bwd);
    cost_tp_head_times(cm, ld->tokens, cm->tp_head, cm->tp_head, &head_fwd, &head_bwd);
    return cm->n_layers * (fwd + bwd) + cost_head_time(cm, ld->tokens) + head_fwd + head_bwd;
}

double cost_a2a_token(const CostModel *cm) { return cm->a2a_token > 0 ? cm->a2a_token : 2.0 * cm->kv_token; }

double cost_a2a_bytes(const CostModel *cm, int D) {
    double bytes = cost_a2a_token(cm);
    int kv = cm->a2a_kv_heads;
    if (kv > 0 && D > kv) bytes += (double)(D - kv) * cm->kv_token / kv;  // K/V replicated to D heads
    return bytes;
}

double cost_a2a_head_share(const CostModel *cm, int D) {
    if (D <= 1) return 1.0;
    int h = cm->a2a_heads;
    if (h <= 0) return 1.0 / D;
    return (double)((h + D - 1) / D) / h;
}

int cost_a2a_max(const CostModel *cm, int most) {
    return cm->a2a_heads > 0 && cm->a2a_heads < most ? cm->a2a_heads : most;
}

double cost_a2a_terms_time(const CostModel *cm, const ItemTerms *t, double off) {
    if (t->D <= 1) return cost_ring_terms_time(cm, t, off);
    if (t->tokens <= 0) return 0.0;
    // every member: 1/D of the tokens through the linear layers, its share of the heads over the
    // whole mask; the all-to-alls sit between the projections and attention, so nothing overlaps them
    int D = t->D;
    double bw, lat;
    ring_link(cm, D, &bw, &lat);
    double x = transfer_time(cost_a2a_bytes(cm, D) * t->tokens / D * (D - 1) / D, bw, lat);
    double work = cm->lin_token * t->tokens / D + cm->layer_const + cm->attn_pair * t->area * cost_a2a_head_share(cm, D) +
                  cm->attn_step;  // one attention call over whole segments
    return item_total(cm, t, off, work / 3.0 + x + t->tp_fwd, 2.0 * work / 3.0 + x + t->tp_bwd);
}

double cost_a2a_item_time(const CostModel *cm, const int64_t *segs, int n_segs, int D, double off) {
    ItemTerms t;
    cost_item_terms(cm, segs, n_segs, D, &t);
    return cost_a2a_terms_time(cm, &t, off);
}

double cost_hybrid_kv_share(const CostModel *cm, int u) {
    if (u <= 1) return 1.0;
    int kv = cm->a2a_kv_heads;
    if (kv <= 0) return 1.0 / u;
    return (double)((kv + u - 1) / u) / kv;  // u > kv: one (replicated) K/V head, 1 / kv
}

// One layer of a hybrid item (a ring of r Ulysses groups of u) on one of its D = u r members,
// forward and backward, without TP and offloading. tokens and area: the item's. Per direction the
// group's all-to-all comes first (forward: Q, K, V scattered by heads, gathered by sequence; backward:
// the output's gradient, then dQ, dK, dV back), exposed: attention needs all of it. Then a ring of r
// steps over the groups as item_layer_compute's ring, with the member's heads only: each block is the
// group's queries against one group's keys (1/r^2 of the area) on the member's head share, each
// transfer one group block's K/V on the member's K/V heads. u = 1 is the ring of r, r = 1 the group.
static void hybrid_layer_compute(const CostModel *cm, double tokens, double area, int u, int r, double *fwd,
                                 double *bwd) {
    int D = u * r;
    double bw, lat, lin = cm->lin_token * tokens / D + cm->layer_const;
    double x_a2a = 0;
    if (u >= 2) {  // the group: u consecutive ranks
        ring_link(cm, u, &bw, &lat);
        x_a2a = transfer_time(cost_a2a_bytes(cm, u) * tokens / D * (u - 1) / u, bw, lat);
    }
    double blk = cm->attn_pair * area * cost_a2a_head_share(cm, u) / ((double)r * r) + cm->attn_step;
    double blk_fwd = blk / 3.0, blk_bwd = 2.0 * blk / 3.0;
    *fwd = lin / 3.0 + x_a2a + blk_fwd;
    *bwd = 2.0 * lin / 3.0 + x_a2a + blk_bwd;
    if (r < 2) return;
    // the ring: member j of group g passes to member j of group g+1; the r groups span D ranks
    ring_link(cm, D, &bw, &lat);
    double kv_bytes = cm->kv_token * cost_hybrid_kv_share(cm, u) * tokens / r;  // one group block, its heads
    double x_fwd = transfer_time(kv_bytes, bw, lat);
    double x_bwd = transfer_time(2.0 * kv_bytes, bw, lat);
    *fwd += (r - 1) * cost_fmax(blk_fwd, x_fwd);
    *bwd += (r - 1) * cost_fmax(blk_bwd, x_bwd) + x_fwd;  // the summed dK/dV travel home once more
}

int cost_gcd(int a, int b) {
    while (b > 0) {
        int r = a % b;
        a = b;
        b = r;
    }
    return a;
}

int cost_hybrid_next(int u, int g, int D) {
    for (u++; u <= g && u < D; u++)
        if (u >= 2 && g % u == 0) return u;
    return 0;
}

double cost_hybrid_terms_time(const CostModel *cm, const ItemTerms *t, int u, double off) {
    if (t->tokens <= 0) return 0.0;
    double fwd, bwd;
    hybrid_layer_compute(cm, t->tokens, t->area, u, t->D / u, &fwd, &bwd);
    return item_total(cm, t, off, fwd + t->tp_fwd, bwd + t->tp_bwd);
}

double cost_hybrid_item_time(const CostModel *cm, const int64_t *segs, int n_segs, int u, int r, double off) {
    if (u < 1) u = 1;
    if (r < 1) r = 1;
    ItemTerms t;
    cost_item_terms(cm, segs, n_segs, u * r, &t);
    return cost_hybrid_terms_time(cm, &t, u, off);
}

int cost_fields_nonneg(const CostModel *cm) {
    for (int i = 0; i < cost_field_count(); i++)
        if (!(cost_field_value(cm, i) >= 0)) return 0;  // also NaN
    return cm->n_layers >= 1;
}

// Each kind's layer on a member (fwd + bwd) holds lin_token s / D + layer_const and at least the
// area / D of attention plus one attn_step: a ring's D blocks of area / D^2 and a floor each; an
// all-to-all group's head share ceil(h / D) / h >= 1 / D of the whole area in one call; a hybrid's
// r blocks of head share >= 1 / u over area / r^2. Every other term (transfers beyond the blocks
// they overlap, TP all-reduces, offload copies) adds >= 0, and the head is head_token s / D +
// head_const.
double cost_seq_work(const CostModel *cm, int64_t s) {
    return cm->n_layers * (cm->attn_pair * cost_causal_area(s) + cm->lin_token * (double)s) +
           cm->head_token * (double)s;
}

double cost_slot_const(const CostModel *cm) { return cm->n_layers * (cm->layer_const + cm->attn_step) + cm->head_const; }

double cost_item_floor(const CostModel *cm, int64_t s, int D) {
    if (D < 1) D = 1;
    return cost_seq_work(cm, s) / D + cost_slot_const(cm);
}

// ---- Eq. 3: the fewest ranks for a long sequence ---------------------------------------------------

// The least offload ratio whose memory fits, unclamped (> 1: not even offloading every layer; < 0: no
// copy needed). Memory per rank: shared(s/D) + (2 + (1 - r)(l - 2)) Act(s/D) <= budget, solved for r.
// Needs l > 2 and act_token > 0.
static double offload_ratio_needed(const CostModel *cm, int64_t s, int64_t C, int D) {
    double share = (double)s / (double)D;
    double act_rank = cm->act_token * share + cm->act_const;
    double room = cost_act_budget(cm, C) - (cm->act_shared_token * share + cm->act_shared_const);
    return 1.0 - (room / act_rank - 2.0) / (cm->n_layers - 2);
}

int cost_offload_ratio(const CostModel *cm, int64_t s, int64_t C, int D, double *r) {
    *r = 0.0;
    if (s <= (int64_t)D * C) return 1;  // fits without copying
    if (cm->n_layers <= 2 || !(cm->act_token > 0)) return 0;
    double r_need = offload_ratio_needed(cm, s, C, D);
    if (r_need > 1.0) return 0;
    if (r_need < 0.0) r_need = 0.0;
    // overlap: the copy must hide behind the next layer's forward on this ring (cost_item_time's
    // definition), so the chosen r never makes the item slower than the estimate without copies
    if (!(r_need <= cost_offload_hidden_max(cm, s, D) * (1.0 + 1e-12))) return 0;
    *r = r_need;
    return 1;
}

const char *cost_offload_why(const CostModel *cm, int64_t s, int64_t C, int D, char *buf, size_t size) {
    double share = (double)s / (double)D, r;
    if (cost_offload_ratio(cm, s, C, D, &r)) {
        snprintf(buf, size, "%lld tokens fit on %d ranks (offload ratio %.3g)", (long long)s, D, r);
        return buf;
    }
    int l = cm->n_layers;
    if (l <= 2 || !(cm->act_token > 0)) {
        snprintf(buf, size, "%.0f tokens per rank are over the capacity %lld and a stage of %d layers cannot offload "
                 "(it needs >= 3)", share, (long long)C, l);
        return buf;
    }
    double r_need = offload_ratio_needed(cm, s, C, D);
    if (r_need > 1.0) {
        snprintf(buf, size, "%.0f tokens per rank need %.3g bytes with every layer offloaded: act_token %g x %.0f + "
                 "act_const %g per layer x 2 resident layers, + act_shared_token %g x %.0f + act_shared_const %g, "
                 "over the budget of %.3g bytes (capacity_bytes %g)",
                 share, cost_rank_act(cm, share, 1.0), cm->act_token, share, cm->act_const, cm->act_shared_token, share,
                 cm->act_shared_const, cost_act_budget(cm, C), cm->capacity_bytes);
        return buf;
    }
    snprintf(buf, size, "offloading %.3g of each layer is needed but only %.3g hides: the copies at offload_bw %g "
             "bytes/s take longer than a layer's forward (lin_token %g, attn_pair %g)",
             r_need, cost_offload_hidden_max(cm, s, D), cm->offload_bw, cm->lin_token, cm->attn_pair);
    return buf;
}

int cost_min_ranks(const CostModel *cm, int64_t s, int64_t C, int offload, int max_ranks, double *r_out) {
    if (r_out) *r_out = 0.0;
    if (s < 1 || C < 1 || max_ranks < 1)
        return bs_fail("cost_min_ranks: sequence length (%lld), capacity (%lld) and max_ranks (%d) must be >= 1",
                       (long long)s, (long long)C, max_ranks);
    if (!(cm->act_token > 0) || cm->act_const < 0 || cm->n_layers < 1)
        return bs_fail("cost_min_ranks: the cost model needs act_token > 0, act_const >= 0 and n_layers >= 1");
    int l = cm->n_layers;
    // Without offloading a rank holds at most C tokens (Act is increasing): D = ceil(s / C).
    int64_t d_plain = s / C + (s % C != 0);
    int64_t d_hi = d_plain < max_ranks ? d_plain : max_ranks;
    int64_t d_lo = d_hi;
    if (offload && l > 2) {
        // With r = 1 only the shared buffers and the two resident layers count: s/D tokens at most
        // cost_max_offload_tokens per rank bounds D below.
        // clamp in double before converting: with extreme coefficients (a cost file may hold 1e308)
        // the quotient is huge, infinite or NaN, and converting that to an integer is undefined
        double lo = floor((double)s / cost_max_offload_tokens(cm, C));
        d_lo = !(lo >= 1) ? 1 : lo >= (double)d_hi ? d_hi : (int64_t)lo;
    }
    for (int64_t D = d_lo; D <= d_hi; D++) {
        if (D >= d_plain) return (int)D;  // fits without copying: r = 0
        double r;
        if (offload && cost_offload_ratio(cm, s, C, (int)D, &r)) {
            if (r_out) *r_out = r;
            return (int)D;
        }
    }
    return bs_fail("a sequence of %lld tokens does not fit on %d ranks of capacity %lld tokens (%s)", (long long)s,
                   max_ranks, (long long)C, offload ? "even with offloading" : "offloading off");
}

// ---- profile files -----------------------------------------------------------------------------------

// Each field's physical kind and the range a real machine can have (docs/cost-model.md, "Profile
// files"): a number outside it is a typo or a broken measurement, refused at load time with its name,
// before it can make every ring look infeasible with no word of why.
typedef enum {
    K_TIME_PER,   // seconds per token or per (query, key) pair of one layer: [0, 1]
    K_TIME,       // seconds per micro-batch or per step: [0, 3600]
    K_BYTES_PER,  // bytes per token: [0, 1e12]
    K_BYTES,      // bytes: [0, 1e15]
    K_BW,         // bytes per second: [1e3, 1e14] (1 KB/s .. 100 TB/s)
    K_LAT,        // seconds per message: [0, 10]
    K_CALL,       // seconds per kernel call of one layer: [0, 1]
} FieldKind;

typedef struct {
    double lo, hi;
    const char *unit;
} KindRange;

static const KindRange kind_range[] = {
    [K_TIME_PER] = {0, 1, "s"},       [K_TIME] = {0, 3600, "s"},  [K_BYTES_PER] = {0, 1e12, "bytes"},
    [K_BYTES] = {0, 1e15, "bytes"},   [K_BW] = {1e3, 1e14, "bytes/s"}, [K_LAT] = {0, 10, "s"},
    [K_CALL] = {0, 1, "s"},
};

typedef struct {
    const char *key;
    size_t offset;
    int positive;  // 1: must be > 0; 0: must be >= 0
    int optional;  // may be absent (fields added after the first draft)
    FieldKind kind;
} CostField;

#define DFIELD(name, pos, opt, kind) {#name, offsetof(CostModel, name), pos, opt, kind}
static const CostField cost_fields[] = {
    DFIELD(attn_pair, 0, 0, K_TIME_PER),      DFIELD(lin_token, 1, 0, K_TIME_PER),
    DFIELD(layer_const, 0, 0, K_TIME),        DFIELD(act_token, 1, 0, K_BYTES_PER),
    DFIELD(act_const, 0, 0, K_BYTES),         DFIELD(kv_token, 0, 0, K_BYTES_PER),
    DFIELD(ring_bw, 1, 0, K_BW),              DFIELD(ring_lat, 0, 0, K_LAT),
    DFIELD(offload_bw, 1, 0, K_BW),           DFIELD(grad_sync, 0, 0, K_TIME),
    DFIELD(optimizer, 0, 0, K_TIME),          DFIELD(capacity_bytes, 1, 0, K_BYTES),
    DFIELD(ring_bw_intra, 0, 1, K_BW),        DFIELD(ring_lat_intra, 0, 1, K_LAT),
    DFIELD(act_shared_token, 0, 1, K_BYTES_PER), DFIELD(act_shared_const, 0, 1, K_BYTES),
    DFIELD(head_token, 0, 1, K_TIME_PER),     DFIELD(head_const, 0, 1, K_TIME),
    DFIELD(attn_step, 0, 1, K_CALL),
    DFIELD(tp_bw, 0, 1, K_BW),                DFIELD(tp_lat, 0, 1, K_LAT),
    DFIELD(stage_bw, 0, 1, K_BW),             DFIELD(stage_lat, 0, 1, K_LAT),
};
#undef DFIELD
enum { N_COST_FIELDS = (int)(sizeof cost_fields / sizeof cost_fields[0]) };

static double *field_ptr(CostModel *cm, const CostField *f) { return (double *)((char *)cm + f->offset); }
static double field_val(const CostModel *cm, const CostField *f) {
    return *(const double *)((const char *)cm + f->offset);
}

int cost_field_count(void) { return N_COST_FIELDS; }
const char *cost_field_name(int i) { return i >= 0 && i < N_COST_FIELDS ? cost_fields[i].key : NULL; }
double cost_field_value(const CostModel *cm, int i) {
    return i >= 0 && i < N_COST_FIELDS ? field_val(cm, &cost_fields[i]) : 0.0;
}

// Validate every field; `where` names the file or object in the message.
static int check_fields(const CostModel *cm, const char *where) {
    for (int i = 0; i < N_COST_FIELDS; i++) {
        const CostField *f = &cost_fields[i];
        double v = field_val(cm, f);
        if (!isfinite(v) || v < 0 || (f->positive && v == 0))
            return bs_fail("%s: \"%s\" must be %s (got %g)", where, f->key, f->positive ? "> 0" : ">= 0", v);
        const KindRange *k = &kind_range[f->kind];
        if (v == 0) continue;  // allowed by the test above (an absent optional field, or a free term)
        if (v < k->lo || v > k->hi)
            return bs_fail("%s: \"%s\" is %g %s, outside what a machine can have [%g, %g] %s "
                           "(docs/cost-model.md, \"Profile files\")",
                           where, f->key, v, k->unit, k->lo, k->hi, k->unit);
    }
    if (cm->n_layers < 1) return bs_fail("%s: \"n_layers\" must be >= 1 (got %d)", where, cm->n_layers);
    if (cm->ranks_per_node < 1) return bs_fail("%s: \"ranks_per_node\" must be >= 1 (got %d)", where, cm->ranks_per_node);
    return 0;
}

// The derived-only 3D terms (cost_layout_3d) that cost_save writes for a derived model of a 3D
// layout, as the object "layout_3d"; absent in profiles and older files (then a command sets them
// for its layout). Each range-checked, named in the message.
static int layout_3d_load(CostModel *c, const cJSON *root, const char *path) {
    const cJSON *o = cJSON_GetObjectItemCaseSensitive(root, "layout_3d");
    if (!o) return 0;
    if (!cJSON_IsObject(o)) return bs_fail("%s: \"layout_3d\" must be an object", path);
    int64_t tp = 1, head = 0;
    if (json_get_int(o, "tp", &tp, path) != 0 || json_opt_int(o, "tp_head", &head, path) != 0 ||
        json_get_double(o, "tp_token", &c->tp_token, path) != 0 ||
        json_get_double(o, "stage_token", &c->stage_token, path) != 0 ||
        json_get_double(o, "tp_hide_qkv", &c->tp_hide_qkv, path) != 0 ||
        json_get_double(o, "tp_hide_mlp", &c->tp_hide_mlp, path) != 0)
        return -1;
    if (tp < 1 || tp > 4096) return bs_fail("%s: \"layout_3d\".\"tp\" must be in [1, 4096] (got %lld)", path, (long long)tp);
    if (head != 0 && head != 1) return bs_fail("%s: \"layout_3d\".\"tp_head\" must be 0 or 1 (got %lld)", path, (long long)head);
    const double *bytes[] = {&c->tp_token, &c->stage_token}, *hide[] = {&c->tp_hide_qkv, &c->tp_hide_mlp};
    const char *bname[] = {"tp_token", "stage_token"}, *hname[] = {"tp_hide_qkv", "tp_hide_mlp"};
    for (int i = 0; i < 2; i++) {
        if (!(*bytes[i] >= 0 && *bytes[i] <= 1e12))
            return bs_fail("%s: \"layout_3d\".\"%s\" must be in [0, 1e12] bytes per token (got %g)", path, bname[i], *bytes[i]);
        if (!(*hide[i] >= 0 && *hide[i] <= 1))
            return bs_fail("%s: \"layout_3d\".\"%s\" must be a fraction in [0, 1] (got %g)", path, hname[i], *hide[i]);
    }
    c->tp = (int)tp;
    c->tp_head = (int)head;
    return 0;
}

int cost_load(CostModel *cm, const char *path) {
    cJSON *root;
    if (json_read_file(path, &root) != 0) return -1;
    CostModel c;
    memset(&c, 0, sizeof c);
    int rc = 0;
    int64_t version = 1, n_layers = 0, ranks_per_node = 1;
    if (json_opt_int(root, "version", &version, path) != 0) rc = -1;
    else if (version != 1) rc = bs_fail("%s: \"version\" %lld is not supported (this build reads 1)", path, (long long)version);
    for (int i = 0; rc == 0 && i < N_COST_FIELDS; i++) {
        const CostField *f = &cost_fields[i];
        rc = f->optional ? json_opt_double(root, f->key, field_ptr(&c, f), path)
                         : json_get_double(root, f->key, field_ptr(&c, f), path);
    }
    if (rc == 0) rc = json_get_int(root, "n_layers", &n_layers, path);
    if (rc == 0) rc = json_opt_int(root, "ranks_per_node", &ranks_per_node, path);
    // a 3D link field given as 0 (a derived model's stage_bw: the cluster prices it) stays 0
    int has_tp_bw = cJSON_GetObjectItemCaseSensitive(root, "tp_bw") != NULL;
    int has_stage_bw = cJSON_GetObjectItemCaseSensitive(root, "stage_bw") != NULL;
    if (rc == 0) rc = layout_3d_load(&c, root, path);
    cJSON_Delete(root);
    if (rc != 0) return -1;
    if (n_layers < 1 || n_layers > 1 << 20)
        return bs_fail("%s: \"n_layers\" must be in [1, %d] (got %lld)", path, 1 << 20, (long long)n_layers);
    if (ranks_per_node < 1 || ranks_per_node > 1 << 20)
        return bs_fail("%s: \"ranks_per_node\" must be in [1, %d] (got %lld)", path, 1 << 20, (long long)ranks_per_node);
    c.n_layers = (int)n_layers;
    c.ranks_per_node = (int)ranks_per_node;
    // files written before the intra-node fields existed: every ring uses ring_bw
    if (c.ring_bw_intra == 0) c.ring_bw_intra = c.ring_bw, c.ring_lat_intra = c.ring_lat;
    // files written before the 3D fields existed: the TP all-reduce and the stage messages ran over
    // the link the profile's two ranks measured (docs/profile.md, "Old files")
    // (checked first, so that a bad latency given without its bandwidth is named, not replaced)
    if (check_fields(&c, path) != 0) return -1;
    if (!has_tp_bw) c.tp_bw = c.ring_bw_intra, c.tp_lat = c.ring_lat_intra, c.derived_3d |= 1;
    if (!has_stage_bw) c.stage_bw = c.ring_bw_intra, c.stage_lat = c.ring_lat_intra, c.derived_3d |= 2;
    if (check_fields(&c, path) != 0) return -1;
    *cm = c;
    return 0;
}

int cost_save(const CostModel *cm, const char *path) {
    if (check_fields(cm, path) != 0) return bs_fail_ctx("not saved");
    cJSON *root = cJSON_CreateObject();
    if (!root) return bs_fail("%s: out of memory building JSON", path);
    int ok = cJSON_AddNumberToObject(root, "version", 1) != NULL;
    ok = ok && cJSON_AddNumberToObject(root, "n_layers", cm->n_layers);
    ok = ok && cJSON_AddNumberToObject(root, "ranks_per_node", cm->ranks_per_node);
    for (int i = 0; ok && i < N_COST_FIELDS; i++)
        ok = json_add_exact(root, cost_fields[i].key, field_val(cm, &cost_fields[i]));
    // the layout's 3D terms of a derived model, so that the file plans as the model it was saved from
    if (ok && (cm->tp > 1 || cm->stage_token > 0)) {
        cJSON *o = cJSON_AddObjectToObject(root, "layout_3d");
        ok = o && cJSON_AddNumberToObject(o, "tp", cm->tp > 1 ? cm->tp : 1) && cJSON_AddNumberToObject(o, "tp_head", cm->tp_head) &&
             json_add_exact(o, "tp_token", cm->tp_token) && json_add_exact(o, "stage_token", cm->stage_token) &&
             json_add_exact(o, "tp_hide_qkv", cm->tp_hide_qkv) && json_add_exact(o, "tp_hide_mlp", cm->tp_hide_mlp);
    }
    int rc = ok ? json_write_file(path, root, 1) : bs_fail("%s: out of memory building JSON", path);
    cJSON_Delete(root);
    return rc;
}


