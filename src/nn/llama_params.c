// llama_params.c: the parameter layout of a model or of one shard of it: the tensor table, the
// runs that place a shard in the whole model's buffer, and the initial weights (llama.h,
// docs/model.md "Parameter layout" and "Sharding").
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bytescale/error.h"
#include "bytescale/llama.h"
#include "bytescale/rng.h"
#include "nn/llama_params.h"

// ---- configuration, shards and the parameter layout ---------------------------------------------

// The catalogue's own consistency check (core), after refusing what this CPU model cannot run.
int llama_check_config(const ModelConfig *c) {
    if (c->n_experts != 1)
        return bs_fail("model %s: mixture-of-experts (n_experts %d, top_k %d) is not supported by the CPU model; "
                       "use a dense configuration",
                       c->name, c->n_experts, c->top_k);
    return model_check(c);
}

LlamaShard llama_shard_full(const ModelConfig *cfg) {
    return (LlamaShard){.tp = 1, .tp_rank = 0, .layer_begin = 0, .layer_end = cfg->n_layers, .first = 1, .last = 1};
}

int llama_shard_check(const ModelConfig *c, const LlamaShard *sh) {
    const char *n = c->name;
    int tp = sh->tp;
    if (tp < 1) return bs_fail("model %s: tensor parallelism %d: must be at least 1", n, tp);
    if (sh->tp_rank < 0 || sh->tp_rank >= tp)
        return bs_fail("model %s: tensor-parallel rank %d outside [0, %d)", n, sh->tp_rank, tp);
    // whole heads, whole GQA groups (tp divides n_kv_heads, so a rank's query heads use only its
    // own K/V heads), whole rows of the MLP and of the vocabulary on every rank
    struct {
        const char *field;
        int value;
    } divided[] = {{"n_heads", c->n_heads}, {"n_kv_heads", c->n_kv_heads}, {"d_ff", c->d_ff},
                   {"vocab_size", c->vocab_size}};
    for (size_t i = 0; i < sizeof divided / sizeof divided[0]; i++)
        if (divided[i].value % tp != 0)
            return bs_fail("tensor parallelism %d does not divide %s %d of model %s", tp, divided[i].field,
                           divided[i].value, n);
    if (sh->layer_begin < 0 || sh->layer_end > c->n_layers || sh->layer_begin >= sh->layer_end)
        return bs_fail("model %s: a stage's layers [%d, %d) must be a non-empty range within the model's %d layers", n,
                       sh->layer_begin, sh->layer_end, c->n_layers);
    if (!sh->first != !(sh->layer_begin == 0))
        return bs_fail("model %s: the stage of layers [%d, %d) %s the first (it holds the embedding iff it starts "
                       "at layer 0; first = %d)",
                       n, sh->layer_begin, sh->layer_end, sh->layer_begin == 0 ? "is" : "is not", sh->first);
    if (!sh->last != !(sh->layer_end == c->n_layers))
        return bs_fail("model %s: the stage of layers [%d, %d) %s the last (it holds the head iff it ends at layer "
                       "%d; last = %d)",
                       n, sh->layer_begin, sh->layer_end, sh->layer_end == c->n_layers ? "is" : "is not",
                       c->n_layers, sh->last);
    return 0;
}

// A tensor table being built: counts while t is NULL, fills it otherwise.
typedef struct {
    ParamTensor *t;
    int n;
    size_t n_params;
} Table;

static void add_tensor(Table *tb, const char *name, int rows, int cols, int ndim, int split) {
    size_t numel = (size_t)rows * (size_t)cols;
    if (tb->t) {
        ParamTensor *t = &tb->t[tb->n];
        snprintf(t->name, sizeof t->name, "%s", name);
        t->offset = tb->n_params;
        t->numel = numel;
        t->ndim = ndim;
        t->shape[0] = rows;
        t->shape[1] = cols;
        t->decay = ndim == 2;  // matrices decay; norm gains keep their scale free
        t->split = split;
    }
    tb->n++;
    tb->n_params += numel;
}

static void add_layer_tensor(Table *tb, int layer, const char *what, int rows, int cols, int ndim, int split) {
    char name[LLAMA_NAME_MAX];
    snprintf(name, sizeof name, "layers.%d.%s", layer, what);
    add_tensor(tb, name, rows, cols, ndim, split);
}

// A shard's tensors in buffer order, with its local shapes: the whole model's order (tok_emb, the
// layers, final_norm, lm_head) less what the stage does not hold. Column-parallel matrices (wq, wk,
// wv, w_gate, w_up) and the vocabulary-parallel ones (tok_emb, lm_head) keep a block of rows; the
// row-parallel ones (wo, w_down) a block of columns; norm gains are whole.
static void layout_tensors(Table *tb, const ModelConfig *c, const LlamaShard *sh) {
    int tp = sh->tp, D = c->d_model, V = c->vocab_size / tp, F = c->d_ff / tp;
    int Q = c->n_heads / tp * c->head_dim, KV = c->n_kv_heads / tp * c->head_dim;
    tb->n = 0;
    tb->n_params = 0;
    if (sh->first) add_tensor(tb, "tok_emb", V, D, 2, LLAMA_SPLIT_ROWS);
    for (int l = sh->layer_begin; l < sh->layer_end; l++) {
        add_layer_tensor(tb, l, "attn_norm", D, 1, 1, LLAMA_REPLICATED);
        add_layer_tensor(tb, l, "wq", Q, D, 2, LLAMA_SPLIT_ROWS);
        add_layer_tensor(tb, l, "wk", KV, D, 2, LLAMA_SPLIT_ROWS);
        add_layer_tensor(tb, l, "wv", KV, D, 2, LLAMA_SPLIT_ROWS);
        add_layer_tensor(tb, l, "wo", D, Q, 2, LLAMA_SPLIT_COLS);
        add_layer_tensor(tb, l, "mlp_norm", D, 1, 1, LLAMA_REPLICATED);
        add_layer_tensor(tb, l, "w_gate", F, D, 2, LLAMA_SPLIT_ROWS);
        add_layer_tensor(tb, l, "w_up", F, D, 2, LLAMA_SPLIT_ROWS);
        add_layer_tensor(tb, l, "w_down", D, F, 2, LLAMA_SPLIT_COLS);
    }
    if (sh->last) {
        add_tensor(tb, "final_norm", D, 1, 1, LLAMA_REPLICATED);
        add_tensor(tb, "lm_head", V, D, 2, LLAMA_SPLIT_ROWS);
    }
}

// The table of a shard, allocated (NULL + error when out of memory).
ParamTensor *llama_make_table(const ModelConfig *c, const LlamaShard *sh, int *n, size_t *n_params) {
    Table tb = {0};
    layout_tensors(&tb, c, sh);  // count
    tb.t = bs_calloc((size_t)tb.n, sizeof *tb.t);
    if (!tb.t) return NULL;
    layout_tensors(&tb, c, sh);  // fill
    *n = tb.n;
    *n_params = tb.n_params;
    return tb.t;
}

int llama_shard_runs(const ModelConfig *cfg, const LlamaShard *sh, ParamRun **runs, size_t *n_runs) {
    *runs = NULL;
    *n_runs = 0;
    if (llama_check_config(cfg) != 0 || llama_shard_check(cfg, sh) != 0) return -1;
    LlamaShard whole = llama_shard_full(cfg);
    int n_loc = 0, n_full = 0;
    size_t np_loc = 0, np_full = 0;
    ParamTensor *loc = llama_make_table(cfg, sh, &n_loc, &np_loc), *full = llama_make_table(cfg, &whole, &n_full, &np_full);
    size_t cap = 0;
    for (int i = 0; loc && i < n_loc; i++) cap += loc[i].split == LLAMA_SPLIT_COLS ? (size_t)loc[i].shape[0] : 1;
    ParamRun *r = loc && full ? bs_calloc(cap, sizeof *r) : NULL;
    if (!r) {
        free(loc), free(full);
        return bs_fail_ctx("model %s: the parameter runs of a shard", cfg->name);
    }
    size_t n = 0;
    int j = 0;  // the shard's tensors are a subsequence of the whole model's, in the same order
    for (int i = 0; i < n_loc; i++) {
        const ParamTensor *t = &loc[i];
        while (strcmp(full[j].name, t->name) != 0) j++;
        const ParamTensor *f = &full[j];
        // one run per block of floats that is contiguous in both layouts: a row block is, a
        // column block is one piece per row (rank r's columns sit in the middle of every full row)
        size_t pieces = 1, len = t->numel, step_loc = 0, step_full = 0, at = f->offset;
        if (t->split == LLAMA_SPLIT_ROWS) at += (size_t)sh->tp_rank * t->numel;
        if (t->split == LLAMA_SPLIT_COLS) {
            pieces = (size_t)t->shape[0], len = (size_t)t->shape[1];
            step_loc = len, step_full = (size_t)f->shape[1];
            at += (size_t)sh->tp_rank * len;
        }
        for (size_t p = 0; p < pieces; p++) {
            ParamRun run = {t->offset + p * step_loc, at + p * step_full, len};
            ParamRun *last = n ? &r[n - 1] : NULL;
            if (last && last->local + last->len == run.local && last->full + last->len == run.full)
                last->len += run.len;  // contiguous on both sides: one copy does
            else
                r[n++] = run;
        }
    }
    free(loc), free(full);
    *runs = r;
    *n_runs = n;
    return 0;
}

// GPT-2: the projections that write into the residual stream are scaled down so the stream's
// variance does not grow with depth (2 per layer: attention and MLP).
static double init_std(const ParamTensor *t, int n_layers) {
    size_t len = strlen(t->name);
    int resid = (len > 3 && strcmp(t->name + len - 3, ".wo") == 0) ||
                (len > 7 && strcmp(t->name + len - 7, ".w_down") == 0);
    return resid ? 0.02 / sqrt(2.0 * n_layers) : 0.02;
}

// Every float of the whole model has its own normal draw, rng_normal_fill's stream (seed, tensor
// number in the whole model's table) at the float's index in the whole tensor: a shard draws exactly
// its own floats, in time proportional to its own size, and every layout gets the same numbers.
// Norm gains draw nothing. A run of the shard may span several tensors (a whole stage is one run),
// so each run is cut at the whole model's tensor boundaries.
int llama_shard_init_weights(const ModelConfig *cfg, const LlamaShard *sh, float *params, uint64_t seed) {
    ParamRun *runs;
    size_t n_runs;
    LlamaShard whole = llama_shard_full(cfg);
    int n_full = 0;
    size_t np_full = 0;
    ParamTensor *full = llama_make_table(cfg, &whole, &n_full, &np_full);
    if (!full || llama_shard_runs(cfg, sh, &runs, &n_runs) != 0) {
        free(full);
        return bs_fail_ctx("model %s: initial weights", cfg->name);
    }
    int k = 0;  // the whole model's tensor that holds `at`: runs go up the whole buffer
    for (size_t r = 0; r < n_runs; r++) {
        float *p = params + runs[r].local;
        size_t at = runs[r].full, end = runs[r].full + runs[r].len;
        while (at < end) {
            while (full[k].offset + full[k].numel <= at) k++;
            const ParamTensor *t = &full[k];
            size_t stop = t->offset + t->numel < end ? t->offset + t->numel : end, n = stop - at;
            if (t->ndim == 1)
                for (size_t j = 0; j < n; j++) p[j] = 1.0f;
            else
                rng_normal_fill(seed, (uint64_t)k, at - t->offset, n, init_std(t, cfg->n_layers), p);
            p += n;
            at = stop;
        }
    }
    free(runs);
    free(full);
    return 0;
}

void llama_init_weights(Llama *m, uint64_t seed) {
    // out of memory for two small tables: the weights stay as they were, the error is recorded
    (void)llama_shard_init_weights(&m->cfg, &m->shard, m->params, seed);
}
