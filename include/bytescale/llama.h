// llama.h: a LLaMA-style decoder in fp32 on the CPU, forward and backward over one packed micro-batch.
//
//   tokens -> embedding -> n_layers x [ x += Wo attn(rope(Wq n1(x)), rope(Wk n1(x)), Wv n1(x))
//                                      x += Wdown (silu(Wgate n2(x)) * Wup n2(x)) ]
//          -> RMSNorm -> untied output head -> fused softmax cross-entropy
//
// All parameters live in ONE contiguous float buffer (params), described by a table of named tensors,
// so ZeRO-1 can shard a flat range and a checkpoint writes one blob; grads has the same layout.
// Activations are carved from an arena sized for max_T tokens when the model is made; the forward
// and backward allocate nothing. Attention goes through AttnOps so the distributed runtime can put
// ring attention in place of the local kernel. A micro-batch may offload a fraction r of most
// layers' activations to a slower tier (offload.h) and the model accounts the activation bytes it
// holds against a budget. docs/model.md describes all of it.
#ifndef BYTESCALE_LLAMA_H
#define BYTESCALE_LLAMA_H

#include <stddef.h>
#include <stdint.h>

#include "bytescale/arena.h"
#include "bytescale/attention.h"
#include "bytescale/model.h"
#include "bytescale/optim.h"

// ---- one packed micro-batch -----------------------------------------------------------------------
// Several documents (or chunks of documents) side by side. Token i sees token j iff they have the
// same segment id and pos[j] <= pos[i]; RoPE uses pos, so a chunk keeps its place in its document.
typedef struct {
    const int32_t *tokens;   // (T,) in [0, vocab)
    const int32_t *targets;  // (T,) the next token, or -1 where it is unknown (end of a document/chunk)
    const int32_t *pos;      // (T,) global position of the token in its document
    const int32_t *seg;      // (T,) segment id
    int T;
} MicroBatch;

// ---- the attention a layer calls ------------------------------------------------------------------
// q (T, n_heads, head_dim) and k, v (T, n_kv_heads, head_dim) are the micro-batch's own rows after
// RoPE; rows carries their positions and segments. An implementation may attend to more keys than
// the local ones (ring attention receives the other ring members' K/V).
typedef struct {
    // out (T, n_heads, head_dim), lse (T, n_heads): overwritten with the final (merged) result.
    int (*forward)(void *ctx, int layer, float *out, float *lse, const float *q, const float *k, const float *v,
                   AttnRows rows, AttnShape s);
    // dq (T, n_heads, head_dim), dk, dv (T, n_kv_heads, head_dim) arrive zeroed; add the gradients of
    // the loss through ALL keys into them (dk, dv of the local rows, summed over every query that saw
    // them). lse is forward's, delta (T, n_heads) = rowsum(dout * out) computed by the model.
    int (*backward)(void *ctx, int layer, float *dq, float *dk, float *dv, const float *dout, const float *lse,
                    const float *delta, const float *q, const float *k, const float *v, AttnRows rows, AttnShape s);
    void *ctx;
    int collective;  // 1 when the implementation talks to other ranks (ring attention): then the model
                     // runs every layer even for a micro-batch with no rows, so the ring is never stalled
} AttnOps;

// The default: attn_forward / attn_backward on the micro-batch itself (queries = keys = local rows).
AttnOps attn_ops_local(void);

// ---- tensor and pipeline parallelism: which part of the model this process holds -------------------
// A shard is one pipeline stage's layers [layer_begin, layer_end) (the first stage also holds the
// embedding, the last the final norm, output head and loss) and, of those, one tensor-parallel rank's
// share (Megatron-style, docs/model.md "Sharding"): query and K/V heads split over tp ranks (wq, wk,
// wv by rows: column parallel; wo by columns: row parallel), the MLP likewise (w_gate, w_up by rows;
// w_down by columns), the embedding and the output head by vocabulary rows (vocabulary parallel,
// with a vocabulary-parallel fused cross-entropy). Norm gains are replicated on every tp rank.
typedef struct {
    int tp, tp_rank;             // tensor-parallel ranks and this one's index (tp = 1: nothing split)
    int layer_begin, layer_end;  // this stage's layers
    int first, last;             // holds the embedding / the final norm + head + loss
} LlamaShard;

// The collectives a tensor-parallel shard needs, over its tp group (the runtime gives them; nn has
// no communicator of its own). In place over x[0 .. n); every rank of the group calls them in the
// same order. Unused (may be zero) when tp = 1.
//
// The non-blocking sum (start, progress, wait) is optional: with it, the backward of a
// column-parallel group (wq, wk, wv; w_gate, w_up) starts the sum of its input gradient, computes
// the weight gradients while it runs (calling progress between slices of them) and then waits
// (docs/model.md, "Sharding"). start returns a handle; x is neither read nor written by the model
// until wait(handle) returns. The model has at most one in flight. Without start (NULL) the backward
// sums with allreduce at once, at the same point; the weight gradients are computed in the same
// slices either way, so the bits differ only if allreduce and start/wait reduce differently (the
// runtime's blocking setting keeps its start and waits inside it: train.c).
enum { LLAMA_TP_SUM = 0, LLAMA_TP_MAX = 1 };
typedef struct {
    int (*allreduce)(void *ctx, float *x, size_t n, int op);  // op: LLAMA_TP_SUM or LLAMA_TP_MAX
    int (*start)(void *ctx, float *x, size_t n, int *handle);  // a LLAMA_TP_SUM in flight; NULL = none
    int (*progress)(void *ctx, int handle);                    // drive it on (may be NULL)
    int (*wait)(void *ctx, int handle);                        // its result is in x
    void *ctx;
} TpOps;

// How a tensor is split over tp ranks: LLAMA_SPLIT_ROWS (a contiguous block of rows per rank),
// LLAMA_SPLIT_COLS (a contiguous block of columns per rank), LLAMA_REPLICATED (norm gains).
enum { LLAMA_REPLICATED = 0, LLAMA_SPLIT_ROWS = 1, LLAMA_SPLIT_COLS = 2 };

// The whole model on one process: tp 1, every layer, first and last.
LlamaShard llama_shard_full(const ModelConfig *cfg);
// Whether cfg can be cut this way: tp divides n_heads, n_kv_heads, d_ff and vocab_size;
// 0 <= tp_rank < tp; 0 <= layer_begin < layer_end <= n_layers; first iff layer_begin = 0, last iff
// layer_end = n_layers. -1 + an error naming the numbers.
int llama_shard_check(const ModelConfig *cfg, const LlamaShard *sh);

// Where a shard's flat buffer lies in the whole model's (llama_shard_full) flat buffer: the shard's
// floats [local, local + len) are the whole model's [full, full + len). Runs are in local order and
// tile the shard's buffer. *runs is allocated (free it). A checkpoint, initial weights and the
// parity tests go through these, so every layout reads and writes the one full layout.
typedef struct {
    size_t local, full, len;
} ParamRun;
int llama_shard_runs(const ModelConfig *cfg, const LlamaShard *sh, ParamRun **runs, size_t *n_runs);

// ---- parameters -----------------------------------------------------------------------------------
enum { LLAMA_NAME_MAX = 48 };

typedef struct {
    char name[LLAMA_NAME_MAX];  // "tok_emb", "layers.0.wq", ..., "final_norm", "lm_head"
    size_t offset;              // index of its first float in params / grads
    size_t numel;
    int ndim;                   // 1 (norm gains) or 2 (matrices)
    int shape[2];               // (rows, cols); a vector has shape[0] = numel, shape[1] = 1
    int decay;                  // AdamW applies weight decay: matrices yes, norm gains no
    int split;                  // LLAMA_REPLICATED / LLAMA_SPLIT_ROWS / LLAMA_SPLIT_COLS over tp ranks
} ParamTensor;

typedef struct {
    float *attn_norm;  // (d_model,)
    float *wq;         // (n_heads * head_dim, d_model)
    float *wk;         // (n_kv_heads * head_dim, d_model)
    float *wv;         // (n_kv_heads * head_dim, d_model)
    float *wo;         // (d_model, n_heads * head_dim)
    float *mlp_norm;   // (d_model,)
    float *w_gate;     // (d_ff, d_model)
    float *w_up;       // (d_ff, d_model)
    float *w_down;     // (d_model, d_ff)
} LayerWeights;

// Named views into a flat buffer (params or grads). A shard's shapes are its local ones (the
// comments give the whole model's): heads, K/V heads, d_ff and vocab divided by tp. Tensors the
// shard does not hold are NULL (tok_emb off the first stage, final_norm and lm_head off the last,
// layers outside [layer_begin, layer_end)).
typedef struct {
    float *tok_emb;        // (vocab, d_model)
    LayerWeights *layers;  // (n_layers,) indexed by the global layer number
    float *final_norm;     // (d_model,)
    float *lm_head;        // (vocab, d_model) untied from tok_emb
} LlamaWeights;

// ---- activations kept for the backward ------------------------------------------------------------
// Carved for each micro-batch's T rows (the pointers move between calls, never during one). Each
// layer's buffers are one contiguous block, x first. The RMSNorm outputs and the SwiGLU output are
// not kept per layer: the backward recomputes them (elementwise, bit-identical) into shared
// scratch, which saves about a third of the activation memory.
typedef struct {
    float *x;      // (T, d_model) the layer's input (residual stream)
    float *rstd1;  // (T,) attention RMSNorm's 1/rms
    float *q;      // (T, n_heads, head_dim) after RoPE
    float *k;      // (T, n_kv_heads, head_dim) after RoPE
    float *v;      // (T, n_kv_heads, head_dim)
    float *att;    // (T, n_heads, head_dim) attention output
    float *lse;    // (T, n_heads) its log-sum-exp
    float *x_mid;  // (T, d_model) residual stream after attention
    float *rstd2;  // (T,) MLP RMSNorm's 1/rms
    float *gate;   // (T, d_ff) pre-activations of the SwiGLU
    float *up;     // (T, d_ff)
} LayerActs;

typedef struct {
    LayerActs *layers;  // (n_layers,)
    float *x_out;       // (T, d_model) output of the last layer
    float *lnf;         // (T, d_model) final RMSNorm output
    float *rstdf;       // (T,)
    float *rope_cos;    // (T, head_dim / 2)
    float *rope_sin;    // (T, head_dim / 2)
    float *logits;      // (chunk, vocab) head + loss scratch
    float *ln;          // (T, d_model) a layer's RMSNorm output (forward, recomputed in backward)
    float *h;           // (T, d_ff) a layer's silu(gate) * up (forward, recomputed in backward)
    // backward scratch, shared by all layers
    float *dx;          // (T, d_model) gradient of the residual stream
    float *dln;         // (T, d_model)
    float *datt;        // (T, n_heads, head_dim)
    float *dq;          // (T, n_heads, head_dim)
    float *dk;          // (T, n_kv_heads, head_dim)
    float *dv;          // (T, n_kv_heads, head_dim)
    float *delta;       // (T, n_heads)
    float *dh;          // (T, d_ff)
    float *dgate;       // (T, d_ff)
    float *dup;         // (T, d_ff)
} LlamaActs;

// ---- activation memory: where it is, how much is resident, offloading ---------------------------------
// Where one micro-batch's activations lie in the arena, in bytes. The arena holds the shared buffers
// (room for max_T rows) and then one block per layer. With n_layers >= 3 (a model that can offload)
// every block is page-aligned and rounded to pages, so a block's tail can be released page by page.
typedef struct {
    size_t globals;  // bytes of the buffers all layers share (page-rounded when paged), at offset 0
    size_t layer0;   // offset of layer 0's block: the shared buffers' room for max_T rows
    size_t block;    // bytes of one layer's block; layer l's is [layer0 + l * block, + block)
    size_t x;        // its first bytes, holding the layer's input x (written by the layer below)
    size_t tail;     // bytes of each offloaded block's tail this micro-batch; 0 = nothing offloaded
    int paged;       // blocks page-aligned (n_layers >= 3)
} ActLayout;

// What the model accounts: bytes of the arena that hold live activations (written and not released).
typedef struct {
    size_t resident;     // now
    size_t peak;         // the most since the caller last set it to 0
    uint64_t offloaded;  // bytes copied out to the offload tier (each comes back once), cumulative
    double wait;         // seconds the model waited for the tier's copies, cumulative
} ActStats;

struct Offloader;  // offload.h

// Called during a backward as soon as a range [begin, end) of the gradient buffer will not be
// written again by this micro-batch: the head (final_norm + lm_head) first, then layer n_layers-1
// down to 0, then the embedding. The runtime starts the gradient reduce-scatter of a range there,
// while the layers below still compute (ZeRO-1 overlap, docs/runtime.md).
typedef void (*GradReadyFn)(void *ctx, size_t begin, size_t end);

typedef struct Llama {
    ModelConfig cfg;         // the whole model's configuration
    LlamaShard shard;        // what this process holds (llama_shard_full for the whole model)
    TpOps tp_ops;            // the tp group's collectives (set by the caller when shard.tp > 1)
    int n_heads, n_kv_heads, d_ff, vocab;  // this shard's: the config's divided by shard.tp
    int vocab_begin;         // first vocabulary row this shard holds (tp_rank * vocab)
    struct Llama *owner;     // a view (llama_init_view): the model whose parameters it shares; else NULL
    int q_dim, kv_dim;       // n_heads * head_dim, n_kv_heads * head_dim (this shard's)
    size_t n_params;
    float *params;           // (n_params,) every weight, one block
    float *grads;            // (n_params,) same layout; forward_backward adds into it
    ParamTensor *tensors;    // (n_tensors,) in buffer order
    int n_tensors;
    LlamaWeights w;          // views of params
    LlamaWeights g;          // views of grads
    AttnOps attn;            // attn_ops_local() unless the caller sets another
    GradReadyFn grad_ready;  // NULL unless the caller sets it (llama_forward_backward)
    void *grad_ready_ctx;
    int max_T;               // most tokens in one micro-batch
    int chunk;               // rows per head + loss chunk; may be lowered, never raised
    Arena arena;             // all activations: a page arena with room for max_T tokens
    LlamaActs acts;          // carved for the current micro-batch
    ActLayout lay;           // ... from this layout
    size_t act_dirty;        // arena offset below which pages may still be resident from earlier calls
    // offloading and the memory budget (docs/model.md, "Offloading"); set by the caller
    struct Offloader *offload;  // NULL (default): everything stays resident whatever offload_ratio says
    int offload_set;         // its activation set in the tier: 0, or a pipeline stage's set (offload.h)
    float offload_ratio;     // r in [0, 1]: the share of each of layers 0 .. n_layers-3 that goes to the tier
                             // (like attn, set per micro-batch: the executor sets its plan item's r)
    size_t act_budget;       // most resident activation bytes a micro-batch may need; 0 = no limit
    ActStats act;
} Llama;

// Make a model for micro-batches of up to max_T tokens: parameters (zero until llama_init_weights),
// zero gradients, activations. Refuses MoE and inconsistent configs with a clear error.
int llama_init(Llama *m, const ModelConfig *cfg, int max_T);
// The same for one shard of the model (llama_shard_check first). llama_init is this with
// llama_shard_full. A shard with tp > 1 needs m->tp_ops set before its first forward.
int llama_init_shard(Llama *m, const ModelConfig *cfg, int max_T, const LlamaShard *sh);
// A second set of activations for the same parameters: a view shares owner's parameters,
// gradients, tensor table, shard and tp_ops, and has an arena of its own (max_T rows), so a
// pipeline stage can hold several micro-batches between their forward and their backward. The
// owner must outlive it. A view starts without offloading; a caller that offloads it gives it the
// owner's offloader and a set of its own (offload_set), so its bytes never meet another set's.
int llama_init_view(Llama *view, Llama *owner, int max_T);
// Frees what m owns (a view: its activations only).
void llama_free(Llama *m);
// Make room for micro-batches of up to max_T tokens (a ring member can hold a few more tokens than
// the capacity, docs/runtime.md). Activations are re-carved; parameters and gradients are kept.
// Nothing changes when max_T <= m->max_T or on failure (-1 + error).
int llama_reserve(Llama *m, int max_T);
// Bytes of activation memory a model needs for max_T tokens (what llama_init reserves).
size_t llama_activation_bytes(const ModelConfig *cfg, int max_T);
// The most activation bytes a micro-batch of T tokens at offload ratio r holds at once (the model's
// accounting, m->act.peak, never exceeds it): all of it without offloading (r = 0 or n_layers < 3),
// else the shared buffers + 2 whole blocks + (n_layers - 3) blocks less their tails + the larger of
// one such kept part and the x of the next layer (docs/model.md, "Offloading"). What a planner
// choosing r, and the budget (m->act_budget), go by.
size_t llama_resident_bytes(const ModelConfig *cfg, int T, double r);

// normal(0, 0.02) for matrices, residual projections (wo, w_down) scaled by 1/sqrt(2 n_layers),
// norm gains 1. The same seed gives the same weights, and a shard gets its part of the whole model's,
// drawn in time proportional to the shard alone (a counter-based generator, rng_normal_fill).
void llama_init_weights(Llama *m, uint64_t seed);
void llama_zero_grad(Llama *m);
const ParamTensor *llama_find_tensor(const Llama *m, const char *name);  // NULL + error when unknown
// One DecayRange per tensor, in buffer order, for adamw_init. out has room for m->n_tensors.
void llama_decay_ranges(const Llama *m, DecayRange *out);

// Forward and backward over one micro-batch. *loss_sum = the SUM of the token cross-entropies over
// rows with a target (unscaled). Gradients of loss_scale * loss_sum are ADDED to m->grads; the
// trainer passes loss_scale = 1 / (target tokens in the whole global batch), so the accumulated
// gradient is that of the token-level mean loss whatever the micro-batches were.
// *n_targets (may be NULL) = rows with a target. -1 + error on a bad micro-batch or attention failure.
// With m->grad_ready set, it is called for every finished range of the gradient (GradReadyFn).
// With m->offload set and m->offload_ratio r > 0, layers 0 .. n_layers-3 move the tail r of their
// activations to the tier and back (same results, bit for bit). A micro-batch whose resident peak
// (llama_resident_bytes) exceeds m->act_budget is refused before anything runs. A failed copy out
// is found before the backward starts (the gradients are untouched); a failed copy back stops the
// backward midway (the gradients are then partly added: the caller must not apply them).
int llama_forward_backward(Llama *m, const MicroBatch *mb, float loss_scale, double *loss_sum, int64_t *n_targets);
// ---- one pipeline stage: the forward and the backward of a micro-batch, apart -------------------
// The stage's forward of mb: the first stage embeds mb->tokens, the others start from x_in (T,
// d_model), the previous stage's output. A stage that is not the last sets *x_out to its output (T,
// d_model), inside m's activations, valid until m's next stage_forward. The last stage runs the
// head and the loss and already computes the loss's gradient with respect to its input (scaled by
// loss_scale, the lm_head and final_norm gradients added): *loss_sum and *n_targets as
// llama_forward_backward's, 0 on other stages; *x_out = NULL there. Every tp rank of a stage gets
// the same loss. mb's pos and seg are needed on every stage, targets only on the last.
int llama_stage_forward(Llama *m, const MicroBatch *mb, const float *x_in, float loss_scale, double *loss_sum,
                        int64_t *n_targets, float **x_out);
// The backward of the micro-batch m's last stage_forward ran: from dy (T, d_model), the gradient of
// the stage's output (the next stage's *dx_in; ignored on the last stage, NULL allowed), gradients
// added into m's (its owner's) grads, m->grad_ready called for each finished range. A stage that is
// not the first sets *dx_in to the gradient of its input (T, d_model), inside m's activations, valid
// until m's next stage_forward; the first stage ends in the embedding and sets it NULL.
// llama_forward_backward on a shard = stage_forward + stage_backward, bit for bit.
int llama_stage_backward(Llama *m, const MicroBatch *mb, const float *dy, float **dx_in);

// Forward only (evaluation): the same loss, no gradients touched.
int llama_forward(Llama *m, const MicroBatch *mb, double *loss_sum, int64_t *n_targets);
// The gradient ranges GradReadyFn reports, in its order (i = 0 .. llama_grad_buckets(m) - 1): the
// final_norm + lm_head (last stage only), then the shard's layers from its last to its first, then
// the embedding (first stage only). For the whole model: 0 = head, 1 .. n_layers = layer
// n_layers-1 .. 0, n_layers + 1 = the embedding. They tile the buffer.
int llama_grad_buckets(const Llama *m);
void llama_grad_bucket(const Llama *m, int i, size_t *begin, size_t *end);

#endif
