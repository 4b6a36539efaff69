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

// ---- parameters -----------------------------------------------------------------------------------
enum { LLAMA_NAME_MAX = 48 };

typedef struct {
    char name[LLAMA_NAME_MAX];  // "tok_emb", "layers.0.wq", ..., "final_norm", "lm_head"
    size_t offset;              // index of its first float in params / grads
    size_t numel;
    int ndim;                   // 1 (norm gains) or 2 (matrices)
    int shape[2];               // (rows, cols); a vector has shape[0] = numel, shape[1] = 1
    int decay;                  // AdamW applies weight decay: matrices yes, norm gains no
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

// Named views into a flat buffer (params or grads).
typedef struct {
    float *tok_emb;        // (vocab, d_model)
    LayerWeights *layers;  // (n_layers,)
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

typedef struct {
    ModelConfig cfg;
    int q_dim, kv_dim;       // n_heads * head_dim, n_kv_heads * head_dim
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
    float offload_ratio;     // r in [0, 1]: the share of each of layers 0 .. n_layers-3 that goes to the tier
                             // (like attn, set per micro-batch: the executor sets its plan item's r)
    size_t act_budget;       // most resident activation bytes a micro-batch may need; 0 = no limit
    ActStats act;
} Llama;

// Make a model for micro-batches of up to max_T tokens: parameters (zero until llama_init_weights),
// zero gradients, activations. Refuses MoE and inconsistent configs with a clear error.
int llama_init(Llama *m, const ModelConfig *cfg, int max_T);
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
// norm gains 1. The same seed gives the same weights.
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
// Forward only (evaluation): the same loss, no gradients touched.
int llama_forward(Llama *m, const MicroBatch *mb, double *loss_sum, int64_t *n_targets);
// The gradient ranges GradReadyFn reports, in its order (i = 0 .. n_layers + 1): 0 = final_norm +
// lm_head, 1 .. n_layers = layer n_layers-1 .. 0, n_layers + 1 = the embedding. They tile the buffer.
void llama_grad_bucket(const Llama *m, int i, size_t *begin, size_t *end);

#endif
