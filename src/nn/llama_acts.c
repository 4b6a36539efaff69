// llama_acts.c: the model's activation memory (llama_acts.h, docs/model.md "Activations" and
// "Offloading").
//
// The arena is a page arena: [shared buffers, room for max_T rows][block of layer 0]...[layer L-1].
// Every micro-batch is carved for its own T rows, so a layer's block holds exactly its bytes and
// nothing else. With offloading, the page-aligned tail of each of layers 0 .. L-3 is written to the
// tier after the layer's forward (while the next layer computes) and its pages are released; during
// the backward it is read back into the same addresses while the layer above runs its backward, and
// every layer's block is released once its backward is done. The pointers never change within a
// micro-batch, so the math in llama.c does not know.
//
// A shard (docs/model.md "Sharding") is carved with its own widths (heads, d_ff, vocabulary divided
// by tp) and only its stage's layers: "layer 0 .. L-1" above are then the stage's held layers, each
// block at its index within the stage, and acts.layers stays indexed by the global layer number.
//
// The accounting follows that schedule: a block counts from the moment it is written (its x when
// the layer below starts, the rest when its own layer starts) until it is released (a tail when its
// copy out is waited for, a block after its backward). llama_resident_bytes is the closed form of
// the largest sum this reaches.
#include <math.h>
#include <string.h>

#include "bytescale/error.h"
#include "bytescale/offload.h"
#include "nn/llama_acts.h"

// ---- layout -------------------------------------------------------------------------------------------

static size_t up64(size_t n) { return (n + 63) / 64 * 64; }

// Hands out 64-byte aligned buffers in order from base + at (base NULL: only counts the bytes).
typedef struct {
    uint8_t *base;
    size_t at;
} Carver;

static float *take(Carver *c, size_t n_floats) {
    size_t start = c->at;
    c->at += up64(n_floats * sizeof(float));
    return c->base ? (float *)(c->base + start) : NULL;
}

ActDims acts_dims(const ModelConfig *cfg, const LlamaShard *sh) {
    int tp = sh->tp;
    return (ActDims){.d_model = cfg->d_model,
                     .head_dim = cfg->head_dim,
                     .n_heads = cfg->n_heads / tp,
                     .n_kv_heads = cfg->n_kv_heads / tp,
                     .d_ff = cfg->d_ff / tp,
                     .vocab = cfg->vocab_size / tp,
                     .n_layers = sh->layer_end - sh->layer_begin,
                     .last = sh->last,
                     .tp = tp};
}

static ActDims whole_dims(const ModelConfig *cfg) {
    LlamaShard sh = llama_shard_full(cfg);
    return acts_dims(cfg, &sh);
}

// One layer's block, x first: the layer below writes it before this layer's turn.
static void carve_layer(Carver *c, LayerActs *la, const ActDims *d, size_t T) {
    size_t D = (size_t)d->d_model, F = (size_t)d->d_ff, H = (size_t)d->n_heads;
    size_t Q = H * (size_t)d->head_dim, KV = (size_t)d->n_kv_heads * (size_t)d->head_dim;
    la->x = take(c, T * D);
    la->rstd1 = take(c, T);
    la->q = take(c, T * Q);
    la->k = take(c, T * KV);
    la->v = take(c, T * KV);
    la->att = take(c, T * Q);
    la->lse = take(c, T * H);
    la->x_mid = take(c, T * D);
    la->rstd2 = take(c, T);
    la->gate = take(c, T * F);
    la->up = take(c, T * F);
}

// The buffers all layers share: the head's input, RoPE tables, recomputation and backward scratch.
// Only the last stage runs the head: elsewhere lnf, rstdf and logits take no bytes. With tp > 1
// the logits scratch has 3 floats per row more, the vocabulary-parallel loss's row statistics
// (head_loss_vocab_parallel).
static void carve_globals(Carver *c, LlamaActs *a, const ActDims *d, size_t T, size_t chunk_rows) {
    size_t D = (size_t)d->d_model, F = (size_t)d->d_ff, H = (size_t)d->n_heads;
    size_t Q = H * (size_t)d->head_dim, KV = (size_t)d->n_kv_heads * (size_t)d->head_dim;
    size_t half = (size_t)d->head_dim / 2, V = (size_t)d->vocab, Th = d->last ? T : 0;
    size_t stats = d->tp > 1 ? 3 : 0;
    if (!d->last) chunk_rows = 0;
    a->x_out = take(c, T * D);
    a->lnf = take(c, Th * D);
    a->rstdf = take(c, Th);
    a->rope_cos = take(c, T * half);
    a->rope_sin = take(c, T * half);
    a->logits = take(c, chunk_rows * (V + stats));
    a->ln = take(c, T * D);
    a->h = take(c, T * F);
    a->dx = take(c, T * D);
    a->dln = take(c, T * D);
    a->datt = take(c, T * Q);
    a->dq = take(c, T * Q);
    a->dk = take(c, T * KV);
    a->dv = take(c, T * KV);
    a->delta = take(c, T * H);
    a->dh = take(c, T * F);
    a->dgate = take(c, T * F);
    a->dup = take(c, T * F);
    if (!d->last) a->lnf = a->rstdf = a->logits = NULL;  // nothing there to point at
}

// The sizes for T rows (chunk_rows rows of logits); layer0 and tail are the caller's.
static ActLayout layout_for(const ActDims *d, int T, int chunk_rows) {
    ActLayout s = {.paged = d->n_layers >= 3};
    LlamaActs ga;
    LayerActs la;
    Carver c = {NULL, 0};
    carve_globals(&c, &ga, d, (size_t)T, (size_t)chunk_rows);
    s.globals = c.at;
    c.at = 0;
    carve_layer(&c, &la, d, (size_t)T);
    s.block = c.at;
    s.x = up64((size_t)T * (size_t)d->d_model * sizeof(float));
    if (s.paged) {
        s.globals = arena_page_round(s.globals);
        s.block = arena_page_round(s.block);
        s.x = arena_page_round(s.x);
    }
    return s;
}

// Bytes of each offloaded block's tail at ratio r: r of its pages, rounded up (offloading a little
// more never breaks a budget that r was chosen for). 0 when the model cannot offload.
static size_t tail_for(const ActLayout *s, int n_layers, double r) {
    if (!s->paged || n_layers < 3 || !(r > 0)) return 0;
    size_t page = arena_page_size(), pages = s->block / page;
    double want = ceil(fmin(r, 1.0) * (double)pages - 1e-9);
    size_t n = want > 0 ? (size_t)want : 0;
    return (n < pages ? n : pages) * page;
}

// The largest resident sum of the schedule (the file comment), closed form. Without offloading:
// everything. With it, the forward of layer L-1 holds the shared buffers, layers L-2 and L-1 whole
// and L-2 kept parts; the forward of layer L-2 holds L-3 kept parts, layer L-3 whole (its copy
// out in flight), L-2 whole and layer L-1's x. The backward never holds more: each layer's block is
// released after its backward, and only one tail is read ahead.
static size_t peak_for(const ActLayout *s, int n_layers) {
    size_t L = (size_t)n_layers;
    if (s->tail == 0) return s->globals + L * s->block;
    size_t keep = s->block - s->tail;
    return s->globals + 2 * s->block + (L - 3) * keep + (keep > s->x ? keep : s->x);
}

int acts_head_chunk(const ActDims *d, int max_T) {
    int chunk = (1 << 21) / d->vocab;  // about 2M logits (8 MB) at a time
    if (chunk < 16) chunk = 16;
    if (chunk > max_T) chunk = max_T;
    return chunk < 1 ? 1 : chunk;
}

size_t acts_activation_bytes(const ActDims *d, int max_T) {
    ActLayout s = layout_for(d, max_T, acts_head_chunk(d, max_T));
    return s.globals + (size_t)d->n_layers * s.block;
}

size_t acts_resident_bytes(const ActDims *d, int T, double r) {
    if (T < 0) T = 0;
    ActLayout s = layout_for(d, T, T > 0 ? acts_head_chunk(d, T) : 0);
    s.tail = tail_for(&s, d->n_layers, r);
    return peak_for(&s, d->n_layers);
}

size_t llama_activation_bytes(const ModelConfig *cfg, int max_T) {
    ActDims d = whole_dims(cfg);
    return acts_activation_bytes(&d, max_T);
}

size_t llama_resident_bytes(const ModelConfig *cfg, int T, double r) {
    ActDims d = whole_dims(cfg);
    return acts_resident_bytes(&d, T, r);
}

int acts_reserve(Llama *m, int max_T) {
    ActDims d = acts_dims(&m->cfg, &m->shard);
    ActLayout full = layout_for(&d, max_T, acts_head_chunk(&d, max_T));
    Arena a;
    if (arena_init_pages(&a, full.globals + (size_t)d.n_layers * full.block) != 0) return -1;
    arena_free(&m->arena);
    m->arena = a;
    m->lay = (ActLayout){.layer0 = full.globals};
    m->act_dirty = 0;
    return 0;
}

// ---- accounting -----------------------------------------------------------------------------------------

static void acquire(Llama *m, size_t n) {
    m->act.resident += n;
    if (m->act.resident > m->act.peak) m->act.peak = m->act.resident;
}

static void drop(Llama *m, size_t n) { m->act.resident -= n; }

// The schedule runs over the layers the shard holds: i = l - layer_begin is a layer's block in the
// arena, and the last two held layers stay resident (a pipeline stage is a model of its own here).
static int held(const Llama *m) { return m->shard.layer_end - m->shard.layer_begin; }

static int offloads(const Llama *m, int i) { return m->lay.tail > 0 && i >= 0 && i <= held(m) - 3; }

// Block i, and where its tail starts: in the arena and at the same offset in the model's set of the
// tier, which so mirrors the arena (page-aligned, as O_DIRECT wants); each activation set of a
// pipeline stage mirrors its own arena in its own set.
static uint8_t *block_at(const Llama *m, int i) { return m->arena.base + m->lay.layer0 + (size_t)i * m->lay.block; }
static size_t tail_off(const Llama *m, int i) { return m->lay.layer0 + (size_t)(i + 1) * m->lay.block - m->lay.tail; }

// ---- one micro-batch --------------------------------------------------------------------------------------

int acts_begin(Llama *m, const MicroBatch *mb, int backward) {
    const ModelConfig *c = &m->cfg;
    ActDims d = acts_dims(c, &m->shard);
    int L = d.n_layers, lb = m->shard.layer_begin, T = mb->T, chunk_rows = m->chunk < T ? m->chunk : T;
    size_t layer0 = m->lay.layer0;
    m->lay = layout_for(&d, T, chunk_rows);
    m->lay.layer0 = layer0;
    m->lay.tail = backward && m->offload ? tail_for(&m->lay, L, m->offload_ratio) : 0;
    size_t need = peak_for(&m->lay, L);
    if (m->act_budget && need > m->act_budget)
        return bs_fail("model %s: a micro-batch of %d tokens at offload ratio %g holds up to %zu bytes of activations, "
                       "over the memory budget of %zu bytes%s",
                       c->name, T, (double)m->offload_ratio, need, m->act_budget,
                       m->offload || !(m->offload_ratio > 0) ? "" : " (offloading is off: every byte stays resident)");

    Carver g = {m->arena.base, 0};
    carve_globals(&g, &m->acts, &d, (size_t)T, (size_t)chunk_rows);
    for (int i = 0; i < L; i++) {
        Carver b = {m->arena.base, layer0 + (size_t)i * m->lay.block};
        carve_layer(&b, &m->acts.layers[lb + i], &d, (size_t)T);
    }
    if (m->lay.tail) {
        // start from nothing but what this micro-batch writes: pages a larger micro-batch, or one
        // that did not offload, left resident are given back, so the accounting is what is there
        size_t g_end = m->lay.globals, dirty = m->act_dirty > layer0 ? m->act_dirty : layer0;
        if (arena_discard(m->arena.base + g_end, layer0 - g_end) != 0 ||
            arena_discard(m->arena.base + layer0, arena_page_round(dirty) - layer0) != 0)
            return bs_fail_ctx("model %s", c->name);
        m->act_dirty = layer0;
    }
    m->act.resident = 0;
    acquire(m, m->lay.globals);
    acquire(m, m->lay.x);  // the embedding (or the previous stage's output) writes the first layer's input
    return 0;
}

void acts_forward_layer(Llama *m, int l) {
    int i = l - m->shard.layer_begin;
    acquire(m, m->lay.block - m->lay.x);              // what layer l writes into its block
    if (i + 1 < held(m)) acquire(m, m->lay.x);        // and the next layer's input
}

int acts_forward_done(Llama *m, int l) {
    if (!m->lay.tail) return 0;
    int i = l - m->shard.layer_begin;
    // one copy out at a time: layer l-1's (which ran beside layer l) ends before layer l's starts
    if (offloads(m, i - 1)) {
        if (offload_wait(m->offload, OFFLOAD_OUT, &m->act.wait) != 0) return -1;
        drop(m, m->lay.tail);
    }
    if (offloads(m, i)) {
        offload_start(m->offload, OFFLOAD_OUT, m->offload_set, l, block_at(m, i) + m->lay.block - m->lay.tail,
                      m->lay.tail, tail_off(m, i));
        m->act.offloaded += m->lay.tail;
    }
    return 0;
}

int acts_backward_layer(Llama *m, int l) {
    if (!m->lay.tail) return 0;
    int i = l - m->shard.layer_begin;
    if (offloads(m, i) && offload_wait(m->offload, OFFLOAD_IN, &m->act.wait) != 0) return -1;
    // layer l-1's tail comes back while this layer's backward runs
    if (offloads(m, i - 1)) {
        acquire(m, m->lay.tail);
        offload_start(m->offload, OFFLOAD_IN, m->offload_set, l - 1,
                      block_at(m, i - 1) + m->lay.block - m->lay.tail, m->lay.tail, tail_off(m, i - 1));
    }
    return 0;
}

int acts_backward_done(Llama *m, int l) {
    if (!m->lay.tail) return 0;
    // the layer's activations are spent: its block goes back, so the backward shrinks what the
    // forward grew and the next micro-batch starts from the shared buffers alone
    if (arena_discard(block_at(m, l - m->shard.layer_begin), m->lay.block) != 0) return -1;
    drop(m, m->lay.block);
    return 0;
}

int acts_end(Llama *m, int rc) {
    size_t end = m->lay.layer0 + (size_t)held(m) * m->lay.block;
    if (rc != 0) {
        offload_drain(m->offload);  // nothing may write into the arena once the caller has the error
        m->act_dirty = m->arena.cap;  // what is resident now is unknown
    } else if (!m->lay.tail && end > m->act_dirty) {
        m->act_dirty = end;
    }
    return rc;
}
