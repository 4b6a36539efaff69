// llama.c: the LLaMA-style decoder: making a model (or a shard, or a view), forward and backward
// over one packed micro-batch, a pipeline stage's halves (see llama.h and docs/model.md). The
// parameter layout of a model or a shard and the initial weights are llama_params.c's; where the
// activations lie, what of them is resident and their offloading are llama_acts.c's.
#include "bytescale/llama.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bytescale/error.h"
#include "nn/llama_acts.h"
#include "nn/llama_params.h"
#include "nn/ops.h"

// ---- the default attention: the packed kernel on the micro-batch's own rows ------------------------

static int local_forward(void *ctx, int layer, float *out, float *lse, const float *q, const float *k, const float *v,
                         AttnRows rows, AttnShape s) {
    (void)ctx, (void)layer;
    attn_forward(out, lse, q, rows, k, v, rows, s);
    return 0;
}

static int local_backward(void *ctx, int layer, float *dq, float *dk, float *dv, const float *dout, const float *lse,
                          const float *delta, const float *q, const float *k, const float *v, AttnRows rows,
                          AttnShape s) {
    (void)ctx, (void)layer;
    attn_backward(dq, dk, dv, dout, lse, delta, q, rows, k, v, rows, s);
    return 0;
}

AttnOps attn_ops_local(void) { return (AttnOps){.forward = local_forward, .backward = local_backward, .ctx = NULL}; }

// Named views into a flat buffer with the layout of m->tensors. Tensors the shard does not hold
// stay NULL (w->layers comes zeroed).
static void bind_weights(const Llama *m, LlamaWeights *w, float *base) {
    const ParamTensor *t = m->tensors;
    const LlamaShard *sh = &m->shard;
    int i = 0;
    w->tok_emb = sh->first ? base + t[i++].offset : NULL;
    for (int l = sh->layer_begin; l < sh->layer_end; l++) {
        LayerWeights *lw = &w->layers[l];
        lw->attn_norm = base + t[i++].offset;
        lw->wq = base + t[i++].offset;
        lw->wk = base + t[i++].offset;
        lw->wv = base + t[i++].offset;
        lw->wo = base + t[i++].offset;
        lw->mlp_norm = base + t[i++].offset;
        lw->w_gate = base + t[i++].offset;
        lw->w_up = base + t[i++].offset;
        lw->w_down = base + t[i++].offset;
    }
    w->final_norm = sh->last ? base + t[i++].offset : NULL;
    w->lm_head = sh->last ? base + t[i++].offset : NULL;
}

// The tp group's collectives: a view uses its owner's, so the caller sets them in one place.
static const TpOps *tp_ops_of(const Llama *m) { return m->owner ? &m->owner->tp_ops : &m->tp_ops; }

static int tp_sum(const Llama *m, float *x, size_t n) {
    const TpOps *ops = tp_ops_of(m);
    if (ops->allreduce(ops->ctx, x, n, LLAMA_TP_SUM) != 0)
        return bs_fail_ctx("tensor-parallel allreduce of %zu floats", n);
    return 0;
}

// ---- making and freeing -----------------------------------------------------------------------------

int llama_init(Llama *m, const ModelConfig *cfg, int max_T) {
    memset(m, 0, sizeof *m);
    if (llama_check_config(cfg) != 0) return -1;
    LlamaShard whole = llama_shard_full(cfg);
    return llama_init_shard(m, cfg, max_T, &whole);
}

int llama_init_shard(Llama *m, const ModelConfig *cfg, int max_T, const LlamaShard *sh) {
    memset(m, 0, sizeof *m);
    if (llama_check_config(cfg) != 0 || llama_shard_check(cfg, sh) != 0) return -1;
    if (max_T < 1) return bs_fail("model %s: max_T must be >= 1 (got %d)", cfg->name, max_T);
    m->cfg = *cfg;
    m->shard = *sh;
    m->shard.first = sh->first != 0, m->shard.last = sh->last != 0;
    int tp = sh->tp;
    m->n_heads = cfg->n_heads / tp;
    m->n_kv_heads = cfg->n_kv_heads / tp;
    m->d_ff = cfg->d_ff / tp;
    m->vocab = cfg->vocab_size / tp;
    m->vocab_begin = sh->tp_rank * m->vocab;
    m->q_dim = m->n_heads * cfg->head_dim;
    m->kv_dim = m->n_kv_heads * cfg->head_dim;
    m->max_T = max_T;
    ActDims d = acts_dims(cfg, &m->shard);
    m->chunk = acts_head_chunk(&d, max_T);
    m->attn = attn_ops_local();

    m->tensors = llama_make_table(cfg, &m->shard, &m->n_tensors, &m->n_params);
    m->params = m->tensors ? bs_calloc(m->n_params, sizeof(float)) : NULL;
    m->grads = m->params ? bs_calloc(m->n_params, sizeof(float)) : NULL;
    m->w.layers = bs_calloc((size_t)cfg->n_layers, sizeof(LayerWeights));
    m->g.layers = bs_calloc((size_t)cfg->n_layers, sizeof(LayerWeights));
    m->acts.layers = bs_calloc((size_t)cfg->n_layers, sizeof(LayerActs));
    int ok = m->tensors && m->params && m->grads && m->w.layers && m->g.layers && m->acts.layers;
    if (ok) {
        bind_weights(m, &m->w, m->params);
        bind_weights(m, &m->g, m->grads);
        ok = acts_reserve(m, max_T) == 0;
    }
    if (!ok) {
        bs_fail_ctx("model %s: allocating %zu parameters and activations for %d tokens", cfg->name, m->n_params,
                    max_T);
        llama_free(m);
        return -1;
    }
    return 0;
}

int llama_init_view(Llama *view, Llama *owner, int max_T) {
    memset(view, 0, sizeof *view);
    if (owner->owner) owner = owner->owner;  // a view of a view shares the same parameters
    if (max_T < 1) return bs_fail("model %s: max_T must be >= 1 (got %d)", owner->cfg.name, max_T);
    // the parameters, gradients and their table are the owner's (pointers); the activations, their
    // layout and accounting are the view's own, and it offloads only when the caller says so
    view->cfg = owner->cfg;
    view->shard = owner->shard;
    view->tp_ops = owner->tp_ops;
    view->n_heads = owner->n_heads, view->n_kv_heads = owner->n_kv_heads;
    view->d_ff = owner->d_ff, view->vocab = owner->vocab, view->vocab_begin = owner->vocab_begin;
    view->owner = owner;
    view->q_dim = owner->q_dim, view->kv_dim = owner->kv_dim;
    view->n_params = owner->n_params;
    view->params = owner->params;
    view->grads = owner->grads;
    view->tensors = owner->tensors;
    view->n_tensors = owner->n_tensors;
    view->w = owner->w;
    view->g = owner->g;
    view->attn = owner->attn;
    view->grad_ready = owner->grad_ready;
    view->grad_ready_ctx = owner->grad_ready_ctx;
    view->max_T = max_T;
    ActDims d = acts_dims(&view->cfg, &view->shard);
    view->chunk = acts_head_chunk(&d, max_T);
    view->acts.layers = bs_calloc((size_t)view->cfg.n_layers, sizeof(LayerActs));
    if (!view->acts.layers || acts_reserve(view, max_T) != 0) {
        bs_fail_ctx("model %s: a view's activations for %d tokens", owner->cfg.name, max_T);
        llama_free(view);
        return -1;
    }
    return 0;
}

int llama_reserve(Llama *m, int max_T) {
    if (max_T <= m->max_T) return 0;
    // activations live only within a call, so the arena is simply made again, larger
    if (acts_reserve(m, max_T) != 0) return bs_fail_ctx("model %s: activations for %d tokens", m->cfg.name, max_T);
    m->max_T = max_T;
    ActDims d = acts_dims(&m->cfg, &m->shard);
    m->chunk = acts_head_chunk(&d, max_T);
    return 0;
}

void llama_free(Llama *m) {
    if (!m->owner) {  // a view's parameters, gradients and table are its owner's
        free(m->tensors);
        free(m->params);
        free(m->grads);
        free(m->w.layers);
        free(m->g.layers);
    }
    free(m->acts.layers);
    arena_free(&m->arena);
    memset(m, 0, sizeof *m);
}

void llama_zero_grad(Llama *m) { memset(m->grads, 0, m->n_params * sizeof(float)); }

const ParamTensor *llama_find_tensor(const Llama *m, const char *name) {
    for (int i = 0; i < m->n_tensors; i++)
        if (strcmp(m->tensors[i].name, name) == 0) return &m->tensors[i];
    bs_fail("model %s: no parameter tensor \"%s\"", m->cfg.name, name);
    return NULL;
}

void llama_decay_ranges(const Llama *m, DecayRange *out) {
    for (int i = 0; i < m->n_tensors; i++) {
        const ParamTensor *t = &m->tensors[i];
        out[i] = (DecayRange){t->offset, t->offset + t->numel, t->decay};
    }
}

// ---- forward and backward ---------------------------------------------------------------------------

// Tokens are read by the first stage, targets by the last; positions by every stage (RoPE, mask).
static int check_batch(const Llama *m, const MicroBatch *mb) {
    const char *n = m->cfg.name;
    if (mb->T < 0 || mb->T > m->max_T)
        return bs_fail("model %s: micro-batch of %d tokens, but the model was made for at most %d", n, mb->T,
                       m->max_T);
    int V = m->cfg.vocab_size, first = m->shard.first, last = m->shard.last;
    for (int t = 0; t < mb->T; t++) {
        if (first && (mb->tokens[t] < 0 || mb->tokens[t] >= V))
            return bs_fail("model %s: micro-batch row %d: token %d outside the vocabulary [0, %d)", n, t, mb->tokens[t],
                           V);
        if (last && (mb->targets[t] < -1 || mb->targets[t] >= V))
            return bs_fail("model %s: micro-batch row %d: target %d outside [-1, %d)", n, t, mb->targets[t], V);
        if (mb->pos[t] < 0) return bs_fail("model %s: micro-batch row %d: negative position %d", n, t, mb->pos[t]);
    }
    if (!(m->offload_ratio >= 0 && m->offload_ratio <= 1))
        return bs_fail("model %s: offload ratio %g outside [0, 1]", n, (double)m->offload_ratio);
    const TpOps *ops = tp_ops_of(m);
    if (m->shard.tp > 1 && !ops->allreduce)
        return bs_fail("model %s: a shard with tensor parallelism %d needs the tp group's collectives (tp_ops)", n,
                       m->shard.tp);
    if (m->shard.tp > 1 && ops->start && !ops->wait)
        return bs_fail("model %s: tp_ops has a non-blocking all-reduce start but no wait", n);
    return 0;
}

// This shard's heads: attention runs on the local query heads and their own K/V heads.
static AttnShape attn_shape(const Llama *m) {
    return (AttnShape){.n_heads = m->n_heads, .n_kv_heads = m->n_kv_heads, .head_dim = m->cfg.head_dim};
}

int llama_grad_buckets(const Llama *m) {
    const LlamaShard *sh = &m->shard;
    return sh->last + (sh->layer_end - sh->layer_begin) + sh->first;
}

// Gradient range i in the order the backward finishes them (GradReadyFn): the head (final_norm +
// lm_head, last stage), the held layers from the last to the first, the embedding (first stage).
// Each layer's tensors are contiguous in the flat buffer (layout_tensors), so every range is one block.
static void grad_bucket(const Llama *m, int i, size_t *begin, size_t *end) {
    const LlamaShard *sh = &m->shard;
    int lb = sh->layer_begin, le = sh->layer_end;
    size_t head = sh->last ? (size_t)(m->w.final_norm - m->params) : m->n_params;
    if (sh->last && i == 0) {
        *begin = head, *end = m->n_params;
        return;
    }
    i -= sh->last;
    if (i < le - lb) {
        int l = le - 1 - i;
        *begin = (size_t)(m->w.layers[l].attn_norm - m->params);
        *end = l + 1 < le ? (size_t)(m->w.layers[l + 1].attn_norm - m->params) : head;
    } else {
        *begin = 0, *end = (size_t)(m->w.layers[lb].attn_norm - m->params);
    }
}

static void report(Llama *m, int bucket) {
    if (!m->grad_ready) return;
    size_t rb, re;
    grad_bucket(m, bucket, &rb, &re);
    m->grad_ready(m->grad_ready_ctx, rb, re);
}

// The stage's layers, up to the final norm on the last stage; the caller runs the head. Fills the
// activations (acts_begin laid them out). Around each layer, acts_* account its memory and move its
// offloaded part out. With tp > 1 every rank computes its heads and its share of d_ff, and the
// row-parallel projections (wo, w_down) end in an allreduce of the residual stream: rank 0 starts
// the sum from the residual input, the others from 0, so x + sum of the ranks' parts needs no
// buffer of its own. The residual stream is then the same on every rank.
static int forward_layers(Llama *m, const MicroBatch *mb, const float *x_in) {
    const ModelConfig *c = &m->cfg;
    const LlamaShard *sh = &m->shard;
    int T = mb->T, D = c->d_model, F = m->d_ff, Q = m->q_dim, KV = m->kv_dim;
    int split = sh->tp > 1, rank0 = sh->tp_rank == 0, lb = sh->layer_begin, le = sh->layer_end;
    size_t TD = (size_t)T * D;
    float eps = (float)c->norm_eps;
    LlamaActs *a = &m->acts;
    AttnRows rows = {.pos = mb->pos, .seg = mb->seg, .n = T};
    AttnShape s = attn_shape(m);

    rope_tables(a->rope_cos, a->rope_sin, mb->pos, T, c->head_dim, c->rope_theta);
    float *x0 = a->layers[lb].x;  // (T, D)
    if (!sh->first) {
        if (TD) memcpy(x0, x_in, TD * sizeof(float));  // the previous stage's output
    } else if (!split) {
        embedding_forward(x0, mb->tokens, m->w.tok_emb, T, D);
    } else {
        embedding_forward_vocab(x0, mb->tokens, m->w.tok_emb, T, D, m->vocab_begin, m->vocab);
        if (tp_sum(m, x0, TD) != 0) return bs_fail_ctx("model %s: embedding", c->name);
    }
    for (int l = lb; l < le; l++) {
        const LayerWeights *w = &m->w.layers[l];
        LayerActs *la = &a->layers[l];
        float *x_next = l + 1 < le ? a->layers[l + 1].x : a->x_out;  // (T, D)
        acts_forward_layer(m, l);
        // attention block: x_mid = x + Wo attn(q, k, v)
        rmsnorm_forward(a->ln, la->rstd1, la->x, w->attn_norm, T, D, eps);
        matmul_forward(la->q, a->ln, w->wq, T, D, Q, 0);
        matmul_forward(la->k, a->ln, w->wk, T, D, KV, 0);
        matmul_forward(la->v, a->ln, w->wv, T, D, KV, 0);
        rope_forward(la->q, a->rope_cos, a->rope_sin, T, m->n_heads, c->head_dim);
        rope_forward(la->k, a->rope_cos, a->rope_sin, T, m->n_kv_heads, c->head_dim);
        if (m->attn.forward(m->attn.ctx, l, la->att, la->lse, la->q, la->k, la->v, rows, s) != 0)
            return bs_fail_ctx("model %s: layer %d: attention forward", c->name, l);
        if (rank0)
            memcpy(la->x_mid, la->x, TD * sizeof(float));
        else
            memset(la->x_mid, 0, TD * sizeof(float));
        matmul_forward(la->x_mid, la->att, w->wo, T, Q, D, 1);
        if (split && tp_sum(m, la->x_mid, TD) != 0) return bs_fail_ctx("model %s: layer %d: attention", c->name, l);
        // MLP block: x_next = x_mid + Wdown (silu(Wgate n) * Wup n)
        rmsnorm_forward(a->ln, la->rstd2, la->x_mid, w->mlp_norm, T, D, eps);
        matmul_forward(la->gate, a->ln, w->w_gate, T, D, F, 0);
        matmul_forward(la->up, a->ln, w->w_up, T, D, F, 0);
        swiglu_forward(a->h, la->gate, la->up, (int64_t)T * F);
        if (rank0)
            memcpy(x_next, la->x_mid, TD * sizeof(float));
        else
            memset(x_next, 0, TD * sizeof(float));
        matmul_forward(x_next, a->h, w->w_down, T, F, D, 1);
        if (split && tp_sum(m, x_next, TD) != 0) return bs_fail_ctx("model %s: layer %d: MLP", c->name, l);
        if (acts_forward_done(m, l) != 0) return bs_fail_ctx("model %s", c->name);
    }
    if (sh->last) rmsnorm_forward(a->lnf, a->rstdf, a->x_out, m->w.final_norm, T, D, eps);
    return 0;
}

// The head, the loss and their backward down to the last layer's output: the lm_head and
// final_norm gradients are added, a->dx = d loss / d x_out. With tp > 1 the head is
// vocabulary-parallel and a->dln (hence a->dx) comes out the same on every rank.
static int head_backward(Llama *m, const MicroBatch *mb, float loss_scale, double *loss_sum, int64_t *n_targets) {
    const ModelConfig *c = &m->cfg;
    int T = mb->T, D = c->d_model;
    LlamaActs *a = &m->acts;
    // head + loss, chunk by chunk: dln = d loss / d lnf (T, D), lm_head gradient accumulated
    if (m->shard.tp == 1)
        *loss_sum = head_loss(a->dln, m->g.lm_head, a->lnf, m->w.lm_head, mb->targets, T, D, m->vocab, loss_scale,
                              a->logits, m->chunk, n_targets);
    else if (head_loss_vocab_parallel(loss_sum, a->dln, m->g.lm_head, a->lnf, m->w.lm_head, mb->targets, T, D,
                                      m->vocab, m->vocab_begin, loss_scale, a->logits, m->chunk, n_targets,
                                      tp_ops_of(m)) != 0)
        return bs_fail_ctx("model %s: output head: tensor-parallel allreduce", c->name);
    // a->dx is d loss / d (residual stream); rmsnorm_backward adds into it
    memset(a->dx, 0, (size_t)T * D * sizeof(float));
    rmsnorm_backward(a->dx, m->g.final_norm, a->dln, a->x_out, a->rstdf, m->w.final_norm, T, D);
    return 0;
}

// One projection of a column-parallel group, out (T, OC) = ln (T, D) @ w^T.
typedef struct {
    const float *w;     // (OC, D) this shard's rows
    float *dw;          // (OC, D) its gradient, added to
    const float *dout;  // (T, OC) the gradient of its output
    int OC;
} ColProj;

// Slices of each weight gradient while the input gradient's sum is in flight: a progress call after
// each lets the sum move on while the next slice computes (MPI advances a non-blocking collective
// mostly inside MPI calls; docs/runtime.md, "Tensor parallelism").
enum { TP_DW_SLICES = 4 };

// The backward of a column-parallel group: projections p[0 .. n) that share one input ln (T, D),
// wq, wk, wv on n1(x) or w_gate, w_up on n2(x_mid). dln (T, D) = the sum of their input gradients,
// summed over the tp group too; each weight gradient is added into its dw. With tp > 1 the input
// gradients come first, their sum over the group starts, the weight gradients (which do not need
// it) compute meanwhile, and only then does the backward wait for it (Megatron's overlap). Without
// a non-blocking sum (tp_ops.start NULL) the sum runs at once: the arithmetic is the same either way.
static int column_backward(Llama *m, float *dln, const float *ln, const ColProj *p, int n, int T) {
    int D = m->cfg.d_model;
    for (int i = 0; i < n; i++) matmul_backward(dln, NULL, p[i].dout, ln, p[i].w, T, D, p[i].OC, i > 0);
    if (m->shard.tp == 1) {  // nothing to sum: the weight gradients whole, as a one-process model does
        for (int i = 0; i < n; i++) matmul_backward(NULL, p[i].dw, p[i].dout, ln, NULL, T, D, p[i].OC, 0);
        return 0;
    }
    const TpOps *ops = tp_ops_of(m);
    size_t TD = (size_t)T * D;
    int h = -1;  // the sum in flight; -1 = already done (blocking)
    int rc = ops->start ? ops->start(ops->ctx, dln, TD, &h) : ops->allreduce(ops->ctx, dln, TD, LLAMA_TP_SUM);
    if (rc != 0) return bs_fail_ctx("tensor-parallel allreduce of %zu floats", TD);
    for (int i = 0; i < n; i++)
        for (int k = 0; k < TP_DW_SLICES; k++) {
            int o0 = (int)((int64_t)p[i].OC * k / TP_DW_SLICES), o1 = (int)((int64_t)p[i].OC * (k + 1) / TP_DW_SLICES);
            matmul_backward_dw_rows(p[i].dw, p[i].dout, ln, T, D, p[i].OC, o0, o1);
            if (h >= 0 && ops->progress && ops->progress(ops->ctx, h) != 0)
                return bs_fail_ctx("tensor-parallel allreduce of %zu floats", TD);
        }
    if (h >= 0 && ops->wait(ops->ctx, h) != 0) return bs_fail_ctx("tensor-parallel allreduce of %zu floats", TD);
    return 0;
}

// The backward of the stage's layers from a->dx, then the embedding on the first stage. With tp > 1
// a->dx is the same on every rank: the row-parallel projections' backward (wo, w_down) needs no
// communication, and the column-parallel ones' input gradient (through wq, wk, wv and w_gate,
// w_up) is each rank's part, summed over the group (column_backward, overlapped with the weight
// gradients) before the RMSNorm backward, so the norm gains' gradients are the same on every rank too.
static int backward_layers(Llama *m, const MicroBatch *mb) {
    const ModelConfig *c = &m->cfg;
    const LlamaShard *sh = &m->shard;
    int T = mb->T, D = c->d_model, F = m->d_ff, Q = m->q_dim, KV = m->kv_dim;
    int split = sh->tp > 1, lb = sh->layer_begin, le = sh->layer_end;
    LlamaActs *a = &m->acts;
    float eps = (float)c->norm_eps;
    AttnRows rows = {.pos = mb->pos, .seg = mb->seg, .n = T};
    AttnShape s = attn_shape(m);

    if (sh->last) report(m, 0);  // the head's gradients were final at the end of the forward
    for (int l = le - 1; l >= lb; l--) {
        const LayerWeights *w = &m->w.layers[l];
        LayerWeights *g = &m->g.layers[l];
        LayerActs *la = &a->layers[l];
        if (acts_backward_layer(m, l) != 0) return bs_fail_ctx("model %s", c->name);
        // MLP block backward; the residual path passes a->dx through unchanged.
        // Recompute what the forward did not keep: h = silu(gate) * up and ln = n2(x_mid).
        swiglu_forward(a->h, la->gate, la->up, (int64_t)T * F);
        rmsnorm_forward(a->ln, la->rstd2, la->x_mid, w->mlp_norm, T, D, eps);
        matmul_backward(a->dh, g->w_down, a->dx, a->h, w->w_down, T, F, D, 0);
        swiglu_backward(a->dgate, a->dup, a->dh, la->gate, la->up, (int64_t)T * F);
        ColProj mlp[2] = {{w->w_gate, g->w_gate, a->dgate, F}, {w->w_up, g->w_up, a->dup, F}};
        if (column_backward(m, a->dln, a->ln, mlp, 2, T) != 0)
            return bs_fail_ctx("model %s: layer %d: MLP backward", c->name, l);
        rmsnorm_backward(a->dx, g->mlp_norm, a->dln, la->x_mid, la->rstd2, w->mlp_norm, T, D);
        // attention block backward
        matmul_backward(a->datt, g->wo, a->dx, la->att, w->wo, T, Q, D, 0);
        attn_backward_delta(a->delta, a->datt, la->att, T, s);
        memset(a->dq, 0, (size_t)T * Q * sizeof(float));
        memset(a->dk, 0, (size_t)T * KV * sizeof(float));
        memset(a->dv, 0, (size_t)T * KV * sizeof(float));
        if (m->attn.backward(m->attn.ctx, l, a->dq, a->dk, a->dv, a->datt, la->lse, a->delta, la->q, la->k, la->v, rows,
                             s) != 0)
            return bs_fail_ctx("model %s: layer %d: attention backward", c->name, l);
        rope_backward(a->dq, a->rope_cos, a->rope_sin, T, m->n_heads, c->head_dim);
        rope_backward(a->dk, a->rope_cos, a->rope_sin, T, m->n_kv_heads, c->head_dim);
        rmsnorm_forward(a->ln, la->rstd1, la->x, w->attn_norm, T, D, eps);  // recompute n1(x)
        ColProj qkv[3] = {{w->wq, g->wq, a->dq, Q}, {w->wk, g->wk, a->dk, KV}, {w->wv, g->wv, a->dv, KV}};
        if (column_backward(m, a->dln, a->ln, qkv, 3, T) != 0)
            return bs_fail_ctx("model %s: layer %d: attention backward", c->name, l);
        rmsnorm_backward(a->dx, g->attn_norm, a->dln, la->x, la->rstd1, w->attn_norm, T, D);
        if (acts_backward_done(m, l) != 0) return bs_fail_ctx("model %s: layer %d", c->name, l);
        report(m, sh->last + (le - 1 - l));
    }
    if (!sh->first) return 0;
    if (!split)
        embedding_backward(m->g.tok_emb, a->dx, mb->tokens, T, D);
    else
        embedding_backward_vocab(m->g.tok_emb, a->dx, mb->tokens, T, D, m->vocab_begin, m->vocab);
    report(m, llama_grad_buckets(m) - 1);
    return 0;
}

// Evaluation runs the whole model's layers: one stage (any tp).
static int check_whole_stage(const Llama *m, const char *what) {
    const LlamaShard *sh = &m->shard;
    if (sh->first && sh->last) return 0;
    return bs_fail("model %s: %s needs every layer, but this shard holds layers [%d, %d) of %d (a pipeline stage): "
                   "use llama_stage_forward and llama_stage_backward",
                   m->cfg.name, what, sh->layer_begin, sh->layer_end, m->cfg.n_layers);
}

int llama_forward(Llama *m, const MicroBatch *mb, double *loss_sum, int64_t *n_targets) {
    *loss_sum = 0;
    if (n_targets) *n_targets = 0;
    if (check_whole_stage(m, "llama_forward") != 0 || check_batch(m, mb) != 0) return -1;
    if (mb->T == 0 && !m->attn.collective) return 0;  // a ring member with no rows still passes K/V on
    if (acts_begin(m, mb, 0) != 0) return -1;
    if (acts_end(m, forward_layers(m, mb, NULL)) != 0) return -1;
    const ModelConfig *c = &m->cfg;
    if (m->shard.tp == 1) {
        *loss_sum = head_loss(NULL, NULL, m->acts.lnf, m->w.lm_head, mb->targets, mb->T, c->d_model, m->vocab, 1.0f,
                              m->acts.logits, m->chunk, n_targets);
        return 0;
    }
    if (head_loss_vocab_parallel(loss_sum, NULL, NULL, m->acts.lnf, m->w.lm_head, mb->targets, mb->T, c->d_model,
                                 m->vocab, m->vocab_begin, 1.0f, m->acts.logits, m->chunk, n_targets,
                                 tp_ops_of(m)) != 0)
        return bs_fail_ctx("model %s: output head: tensor-parallel allreduce", c->name);
    return 0;
}

int llama_stage_forward(Llama *m, const MicroBatch *mb, const float *x_in, float loss_scale, double *loss_sum,
                        int64_t *n_targets, float **x_out) {
    *loss_sum = 0;
    if (n_targets) *n_targets = 0;
    if (x_out) *x_out = NULL;
    if (check_batch(m, mb) != 0) return -1;
    if (mb->T == 0 && !m->attn.collective) return 0;  // a ring member with no rows still passes K/V on
    if (!m->shard.first && !x_in && mb->T > 0)
        return bs_fail("model %s: the stage of layers [%d, %d) needs the previous stage's output (x_in)", m->cfg.name,
                       m->shard.layer_begin, m->shard.layer_end);
    if (acts_begin(m, mb, 1) != 0) return -1;
    int rc = forward_layers(m, mb, x_in);
    if (rc == 0 && m->shard.last) rc = head_backward(m, mb, loss_scale, loss_sum, n_targets);
    if (rc != 0) return acts_end(m, rc);  // the backward will not run: the micro-batch ends here
    if (!m->shard.last && x_out) *x_out = m->acts.x_out;
    return 0;
}

int llama_stage_backward(Llama *m, const MicroBatch *mb, const float *dy, float **dx_in) {
    if (dx_in) *dx_in = NULL;
    if (mb->T == 0 && !m->attn.collective) return 0;  // its forward did nothing either
    if (!m->shard.last && mb->T > 0) {
        if (!dy)
            return acts_end(m, bs_fail("model %s: the stage of layers [%d, %d) needs the next stage's input gradient "
                                       "(dy)",
                                       m->cfg.name, m->shard.layer_begin, m->shard.layer_end));
        memcpy(m->acts.dx, dy, (size_t)mb->T * m->cfg.d_model * sizeof(float));  // the gradient of x_out
    }
    int rc = acts_end(m, backward_layers(m, mb));
    if (rc == 0 && !m->shard.first && dx_in) *dx_in = m->acts.dx;
    return rc;
}

int llama_forward_backward(Llama *m, const MicroBatch *mb, float loss_scale, double *loss_sum, int64_t *n_targets) {
    *loss_sum = 0;
    if (n_targets) *n_targets = 0;
    if (check_whole_stage(m, "llama_forward_backward") != 0) return -1;
    if (llama_stage_forward(m, mb, NULL, loss_scale, loss_sum, n_targets, NULL) != 0) return -1;
    return llama_stage_backward(m, mb, NULL, NULL);
}

void llama_grad_bucket(const Llama *m, int i, size_t *begin, size_t *end) { grad_bucket(m, i, begin, end); }
