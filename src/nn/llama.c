// llama.c: the LLaMA-style decoder: parameter layout, forward and backward over one packed
// micro-batch (see llama.h and docs/model.md). Where the activations lie, what of them is resident
// and their offloading are llama_acts.c's, called around each layer.
#include "bytescale/llama.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bytescale/error.h"
#include "bytescale/rng.h"
#include "nn/llama_acts.h"
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

// ---- configuration and parameter layout ------------------------------------------------------------

// The catalogue's own consistency check (core), after refusing what this CPU model cannot run.
static int check_config(const ModelConfig *c) {
    if (c->n_experts != 1)
        return bs_fail("model %s: mixture-of-experts (n_experts %d, top_k %d) is not supported by the CPU model; "
                       "use a dense configuration",
                       c->name, c->n_experts, c->top_k);
    return model_check(c);
}

// Append one tensor to the table (or only count it while m->tensors is NULL).
static void add_tensor(Llama *m, const char *name, int rows, int cols, int ndim) {
    size_t numel = (size_t)rows * (size_t)cols;
    if (m->tensors) {
        ParamTensor *t = &m->tensors[m->n_tensors];
        snprintf(t->name, sizeof t->name, "%s", name);
        t->offset = m->n_params;
        t->numel = numel;
        t->ndim = ndim;
        t->shape[0] = rows;
        t->shape[1] = cols;
        t->decay = ndim == 2;  // matrices decay; norm gains keep their scale free
    }
    m->n_tensors++;
    m->n_params += numel;
}

static void add_layer_tensor(Llama *m, int layer, const char *what, int rows, int cols, int ndim) {
    char name[LLAMA_NAME_MAX];
    snprintf(name, sizeof name, "layers.%d.%s", layer, what);
    add_tensor(m, name, rows, cols, ndim);
}

// The tensors in buffer order. Called twice: to count (m->tensors NULL) and to fill the table.
static void layout_tensors(Llama *m) {
    const ModelConfig *c = &m->cfg;
    int D = c->d_model, V = c->vocab_size, F = c->d_ff;
    m->n_tensors = 0;
    m->n_params = 0;
    add_tensor(m, "tok_emb", V, D, 2);
    for (int l = 0; l < c->n_layers; l++) {
        add_layer_tensor(m, l, "attn_norm", D, 1, 1);
        add_layer_tensor(m, l, "wq", m->q_dim, D, 2);
        add_layer_tensor(m, l, "wk", m->kv_dim, D, 2);
        add_layer_tensor(m, l, "wv", m->kv_dim, D, 2);
        add_layer_tensor(m, l, "wo", D, m->q_dim, 2);
        add_layer_tensor(m, l, "mlp_norm", D, 1, 1);
        add_layer_tensor(m, l, "w_gate", F, D, 2);
        add_layer_tensor(m, l, "w_up", F, D, 2);
        add_layer_tensor(m, l, "w_down", D, F, 2);
    }
    add_tensor(m, "final_norm", D, 1, 1);
    add_tensor(m, "lm_head", V, D, 2);
}

// Named views into a flat buffer with the layout of m->tensors.
static void bind_weights(const Llama *m, LlamaWeights *w, float *base) {
    const ParamTensor *t = m->tensors;
    int i = 0;
    w->tok_emb = base + t[i++].offset;
    for (int l = 0; l < m->cfg.n_layers; l++) {
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
    w->final_norm = base + t[i++].offset;
    w->lm_head = base + t[i++].offset;
}

// ---- making and freeing -----------------------------------------------------------------------------

int llama_init(Llama *m, const ModelConfig *cfg, int max_T) {
    memset(m, 0, sizeof *m);
    if (check_config(cfg) != 0) return -1;
    if (max_T < 1) return bs_fail("model %s: max_T must be >= 1 (got %d)", cfg->name, max_T);
    m->cfg = *cfg;
    m->q_dim = cfg->n_heads * cfg->head_dim;
    m->kv_dim = cfg->n_kv_heads * cfg->head_dim;
    m->max_T = max_T;
    m->chunk = acts_head_chunk(cfg, max_T);
    m->attn = attn_ops_local();

    layout_tensors(m);  // count
    m->tensors = bs_calloc((size_t)m->n_tensors, sizeof *m->tensors);
    m->params = bs_calloc(m->n_params, sizeof(float));
    m->grads = bs_calloc(m->n_params, sizeof(float));
    m->w.layers = bs_calloc((size_t)cfg->n_layers, sizeof(LayerWeights));
    m->g.layers = bs_calloc((size_t)cfg->n_layers, sizeof(LayerWeights));
    m->acts.layers = bs_calloc((size_t)cfg->n_layers, sizeof(LayerActs));
    int ok = m->tensors && m->params && m->grads && m->w.layers && m->g.layers && m->acts.layers;
    if (ok) {
        layout_tensors(m);  // fill
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

int llama_reserve(Llama *m, int max_T) {
    if (max_T <= m->max_T) return 0;
    // activations live only within a call, so the arena is simply made again, larger
    if (acts_reserve(m, max_T) != 0) return bs_fail_ctx("model %s: activations for %d tokens", m->cfg.name, max_T);
    m->max_T = max_T;
    m->chunk = acts_head_chunk(&m->cfg, max_T);
    return 0;
}

void llama_free(Llama *m) {
    free(m->tensors);
    free(m->params);
    free(m->grads);
    free(m->w.layers);
    free(m->g.layers);
    free(m->acts.layers);
    arena_free(&m->arena);
    memset(m, 0, sizeof *m);
}

void llama_init_weights(Llama *m, uint64_t seed) {
    Rng rng;
    rng_seed(&rng, seed);
    // GPT-2: the projections that write into the residual stream are scaled down so the stream's
    // variance does not grow with depth (2 per layer: attention and MLP).
    double resid_std = 0.02 / sqrt(2.0 * m->cfg.n_layers);
    for (int i = 0; i < m->n_tensors; i++) {
        const ParamTensor *t = &m->tensors[i];
        float *p = m->params + t->offset;
        if (t->ndim == 1) {
            for (size_t j = 0; j < t->numel; j++) p[j] = 1.0f;
            continue;
        }
        size_t len = strlen(t->name);
        int resid = (len > 3 && strcmp(t->name + len - 3, ".wo") == 0) ||
                    (len > 7 && strcmp(t->name + len - 7, ".w_down") == 0);
        double std = resid ? resid_std : 0.02;
        for (size_t j = 0; j < t->numel; j++) p[j] = (float)(std * rng_normal(&rng));
    }
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

static int check_batch(const Llama *m, const MicroBatch *mb) {
    const char *n = m->cfg.name;
    if (mb->T < 0 || mb->T > m->max_T)
        return bs_fail("model %s: micro-batch of %d tokens, but the model was made for at most %d", n, mb->T,
                       m->max_T);
    int V = m->cfg.vocab_size;
    for (int t = 0; t < mb->T; t++) {
        if (mb->tokens[t] < 0 || mb->tokens[t] >= V)
            return bs_fail("model %s: micro-batch row %d: token %d outside the vocabulary [0, %d)", n, t, mb->tokens[t],
                           V);
        if (mb->targets[t] < -1 || mb->targets[t] >= V)
            return bs_fail("model %s: micro-batch row %d: target %d outside [-1, %d)", n, t, mb->targets[t], V);
        if (mb->pos[t] < 0) return bs_fail("model %s: micro-batch row %d: negative position %d", n, t, mb->pos[t]);
    }
    if (!(m->offload_ratio >= 0 && m->offload_ratio <= 1))
        return bs_fail("model %s: offload ratio %g outside [0, 1]", n, (double)m->offload_ratio);
    return 0;
}

static AttnShape attn_shape(const Llama *m) {
    return (AttnShape){.n_heads = m->cfg.n_heads, .n_kv_heads = m->cfg.n_kv_heads, .head_dim = m->cfg.head_dim};
}

// Gradient range i in the order the backward finishes them (GradReadyFn): 0 = final_norm + lm_head,
// 1 .. n_layers = layer n_layers-1 .. 0, n_layers + 1 = the embedding. Each layer's tensors are
// contiguous in the flat buffer (layout_tensors), so every range is one block.
static void grad_bucket(const Llama *m, int i, size_t *begin, size_t *end) {
    int L = m->cfg.n_layers;
    size_t head = (size_t)(m->w.final_norm - m->params);
    if (i == 0) {
        *begin = head, *end = m->n_params;
    } else if (i <= L) {
        int l = L - i;
        *begin = (size_t)(m->w.layers[l].attn_norm - m->params);
        *end = l + 1 < L ? (size_t)(m->w.layers[l + 1].attn_norm - m->params) : head;
    } else {
        *begin = 0, *end = (size_t)(m->w.layers[0].attn_norm - m->params);
    }
}

// Everything up to the final norm; the caller runs the head. Fills the activations (acts_begin laid
// them out). Around each layer, acts_* account its memory and move its offloaded part out.
static int forward_layers(Llama *m, const MicroBatch *mb) {
    const ModelConfig *c = &m->cfg;
    int T = mb->T, D = c->d_model, F = c->d_ff, Q = m->q_dim, KV = m->kv_dim;
    float eps = (float)c->norm_eps;
    LlamaActs *a = &m->acts;
    AttnRows rows = {.pos = mb->pos, .seg = mb->seg, .n = T};
    AttnShape s = attn_shape(m);

    rope_tables(a->rope_cos, a->rope_sin, mb->pos, T, c->head_dim, c->rope_theta);
    embedding_forward(a->layers[0].x, mb->tokens, m->w.tok_emb, T, D);
    for (int l = 0; l < c->n_layers; l++) {
        const LayerWeights *w = &m->w.layers[l];
        LayerActs *la = &a->layers[l];
        float *x_next = l + 1 < c->n_layers ? a->layers[l + 1].x : a->x_out;  // (T, D)
        acts_forward_layer(m, l);
        // attention block: x_mid = x + Wo attn(q, k, v)
        rmsnorm_forward(a->ln, la->rstd1, la->x, w->attn_norm, T, D, eps);
        matmul_forward(la->q, a->ln, w->wq, T, D, Q, 0);
        matmul_forward(la->k, a->ln, w->wk, T, D, KV, 0);
        matmul_forward(la->v, a->ln, w->wv, T, D, KV, 0);
        rope_forward(la->q, a->rope_cos, a->rope_sin, T, c->n_heads, c->head_dim);
        rope_forward(la->k, a->rope_cos, a->rope_sin, T, c->n_kv_heads, c->head_dim);
        if (m->attn.forward(m->attn.ctx, l, la->att, la->lse, la->q, la->k, la->v, rows, s) != 0)
            return bs_fail_ctx("model %s: layer %d: attention forward", c->name, l);
        memcpy(la->x_mid, la->x, (size_t)T * D * sizeof(float));
        matmul_forward(la->x_mid, la->att, w->wo, T, Q, D, 1);
        // MLP block: x_next = x_mid + Wdown (silu(Wgate n) * Wup n)
        rmsnorm_forward(a->ln, la->rstd2, la->x_mid, w->mlp_norm, T, D, eps);
        matmul_forward(la->gate, a->ln, w->w_gate, T, D, F, 0);
        matmul_forward(la->up, a->ln, w->w_up, T, D, F, 0);
        swiglu_forward(a->h, la->gate, la->up, (int64_t)T * F);
        memcpy(x_next, la->x_mid, (size_t)T * D * sizeof(float));
        matmul_forward(x_next, a->h, w->w_down, T, F, D, 1);
        if (acts_forward_done(m, l) != 0) return bs_fail_ctx("model %s", c->name);
    }
    rmsnorm_forward(a->lnf, a->rstdf, a->x_out, m->w.final_norm, T, D, eps);
    return 0;
}

int llama_forward(Llama *m, const MicroBatch *mb, double *loss_sum, int64_t *n_targets) {
    *loss_sum = 0;
    if (n_targets) *n_targets = 0;
    if (check_batch(m, mb) != 0) return -1;
    if (mb->T == 0 && !m->attn.collective) return 0;  // a ring member with no rows still passes K/V on
    if (acts_begin(m, mb, 0) != 0) return -1;
    if (acts_end(m, forward_layers(m, mb)) != 0) return -1;
    const ModelConfig *c = &m->cfg;
    *loss_sum = head_loss(NULL, NULL, m->acts.lnf, m->w.lm_head, mb->targets, mb->T, c->d_model, c->vocab_size, 1.0f,
                          m->acts.logits, m->chunk, n_targets);
    return 0;
}

static int forward_backward(Llama *m, const MicroBatch *mb, float loss_scale, double *loss_sum, int64_t *n_targets) {
    if (forward_layers(m, mb) != 0) return -1;
    const ModelConfig *c = &m->cfg;
    int T = mb->T, D = c->d_model, F = c->d_ff, Q = m->q_dim, KV = m->kv_dim;
    LlamaActs *a = &m->acts;
    float eps = (float)c->norm_eps;
    AttnRows rows = {.pos = mb->pos, .seg = mb->seg, .n = T};
    AttnShape s = attn_shape(m);

    // head + loss, chunk by chunk: dln = d loss / d lnf (T, D), lm_head gradient accumulated
    *loss_sum = head_loss(a->dln, m->g.lm_head, a->lnf, m->w.lm_head, mb->targets, T, D, c->vocab_size, loss_scale,
                          a->logits, m->chunk, n_targets);
    // a->dx is d loss / d (residual stream); rmsnorm_backward adds into it
    memset(a->dx, 0, (size_t)T * D * sizeof(float));
    rmsnorm_backward(a->dx, m->g.final_norm, a->dln, a->x_out, a->rstdf, m->w.final_norm, T, D);
    size_t rb, re;
    if (m->grad_ready) {
        grad_bucket(m, 0, &rb, &re);
        m->grad_ready(m->grad_ready_ctx, rb, re);
    }

    for (int l = c->n_layers - 1; l >= 0; l--) {
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
        matmul_backward(a->dln, g->w_gate, a->dgate, a->ln, w->w_gate, T, D, F, 0);
        matmul_backward(a->dln, g->w_up, a->dup, a->ln, w->w_up, T, D, F, 1);
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
        rope_backward(a->dq, a->rope_cos, a->rope_sin, T, c->n_heads, c->head_dim);
        rope_backward(a->dk, a->rope_cos, a->rope_sin, T, c->n_kv_heads, c->head_dim);
        rmsnorm_forward(a->ln, la->rstd1, la->x, w->attn_norm, T, D, eps);  // recompute n1(x)
        matmul_backward(a->dln, g->wq, a->dq, a->ln, w->wq, T, D, Q, 0);
        matmul_backward(a->dln, g->wk, a->dk, a->ln, w->wk, T, D, KV, 1);
        matmul_backward(a->dln, g->wv, a->dv, a->ln, w->wv, T, D, KV, 1);
        rmsnorm_backward(a->dx, g->attn_norm, a->dln, la->x, la->rstd1, w->attn_norm, T, D);
        if (acts_backward_done(m, l) != 0) return bs_fail_ctx("model %s: layer %d", c->name, l);
        if (m->grad_ready) {
            grad_bucket(m, c->n_layers - l, &rb, &re);
            m->grad_ready(m->grad_ready_ctx, rb, re);
        }
    }
    embedding_backward(m->g.tok_emb, a->dx, mb->tokens, T, D);
    if (m->grad_ready) {
        grad_bucket(m, c->n_layers + 1, &rb, &re);
        m->grad_ready(m->grad_ready_ctx, rb, re);
    }
    return 0;
}

int llama_forward_backward(Llama *m, const MicroBatch *mb, float loss_scale, double *loss_sum, int64_t *n_targets) {
    *loss_sum = 0;
    if (n_targets) *n_targets = 0;
    if (check_batch(m, mb) != 0) return -1;
    if (mb->T == 0 && !m->attn.collective) return 0;  // a ring member with no rows still passes K/V on
    if (acts_begin(m, mb, 1) != 0) return -1;
    return acts_end(m, forward_backward(m, mb, loss_scale, loss_sum, n_targets));
}

void llama_grad_bucket(const Llama *m, int i, size_t *begin, size_t *end) { grad_bucket(m, i, begin, end); }
