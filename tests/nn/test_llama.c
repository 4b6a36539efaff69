// test_llama.c: the whole model. Finite differences of every parameter tensor, packing documents
// into one micro-batch vs running them alone, RoPE on global positions, the attention interface,
// initialization, loss normalization, and refusal of bad configurations and micro-batches.
#include "test_util.h"

#include <math.h>

#include "bytescale/error.h"
#include "bytescale/llama.h"
#include "bytescale/model.h"
#include "bytescale/rng.h"

// ---- helpers -----------------------------------------------------------------------------------------

// A packed micro-batch built from documents: each document gets its own segment id and positions
// first_pos[d] .. first_pos[d] + len[d] - 1; targets are the next token inside the document, and
// the last row's target is next_tok[d] (-1 = the document ends there).
enum { MAXT = 256 };
typedef struct {
    int32_t tokens[MAXT], targets[MAXT], pos[MAXT], seg[MAXT];
    int T;
} Batch;

static void batch_add_doc(Batch *b, const int32_t *toks, int len, int32_t first_pos, int32_t seg, int32_t next_tok) {
    for (int i = 0; i < len; i++) {
        int t = b->T++;
        b->tokens[t] = toks[i];
        b->targets[t] = i + 1 < len ? toks[i + 1] : next_tok;
        b->pos[t] = first_pos + i;
        b->seg[t] = seg;
    }
}

static MicroBatch batch_view(const Batch *b) {
    return (MicroBatch){.tokens = b->tokens, .targets = b->targets, .pos = b->pos, .seg = b->seg, .T = b->T};
}

static ModelConfig tiny(void) {
    const ModelConfig *c = model_find("tiny");
    if (!c) fail_msg("%s", bs_errmsg());
    return *c;
}

// Parameters far from the small init, so attention is sharp and every path carries a sizable
// gradient: matrices normal(0, 1.5 / sqrt(fan_in)), norm gains 1 + normal(0, 0.2).
static void randomize_params(Llama *m, uint64_t seed) {
    Rng rng;
    rng_seed(&rng, seed);
    for (int i = 0; i < m->n_tensors; i++) {
        const ParamTensor *t = &m->tensors[i];
        float *p = m->params + t->offset;
        double std = t->ndim == 2 ? 1.5 / sqrt((double)t->shape[1]) : 0.2;
        for (size_t j = 0; j < t->numel; j++) p[j] = (float)((t->ndim == 1 ? 1.0 : 0.0) + std * rng_normal(&rng));
    }
}

static double model_loss(Llama *m, const MicroBatch *mb) {
    double loss;
    if (llama_forward(m, mb, &loss, NULL) != 0) fail_msg("%s", bs_errmsg());
    return loss;
}

static double max_abs(const float *x, size_t n) {
    double mx = 0;
    for (size_t i = 0; i < n; i++) mx = fabs(x[i]) > mx ? fabs(x[i]) : mx;
    return mx;
}

// ---- finite differences of the whole model --------------------------------------------------------

// For every parameter tensor: the entry with the largest analytic gradient plus 5 random entries
// (for tok_emb, entries of rows whose tokens occur: other rows have no gradient at all; since the
// embedding rows are the model's input, this is also the check of the input gradient).
//
// Tolerance: the loss is a sum of T = 24 token losses of size ~3-6 computed through 2 layers in fp32
// (~1e2 operations in each dot product), so a forward's loss carries a rounding error of roughly
// 1e-6 * |loss| ~ 1e-4 in the worst case, typically less; divided by 2 eps = 2e-3 that is noise up
// to ~5e-2 absolute in the difference quotient, so we use eps = 1e-2 (noise <= 5e-3) and accept
// |analytic - numeric| <= 1e-2 + 3e-2 * |numeric|; the O(eps^2) truncation error of the central
// difference is ~1e-4 relative at these parameter scales. Gradients here are O(0.1 - 10), and a
// broken layer (a missing term, a transposed weight, a wrong scale) is off by far more.
static void test_whole_model_finite_differences(void **state) {
    (void)state;
    ModelConfig cfg = tiny();
    Llama m;
    assert_int_equal(llama_init(&m, &cfg, 64), 0);
    randomize_params(&m, 1);
    Rng rng;
    rng_seed(&rng, 2);
    // three segments: a whole document, a chunk of a long document at global positions 1000.. (its
    // last target is the next chunk's first token), and a document that ends with no target
    Batch b = {0};
    int32_t d0[9], d1[6], d2[9];
    for (int i = 0; i < 9; i++) d0[i] = (int32_t)rng_below(&rng, 256), d2[i] = (int32_t)rng_below(&rng, 256);
    for (int i = 0; i < 6; i++) d1[i] = (int32_t)rng_below(&rng, 256);
    batch_add_doc(&b, d0, 9, 0, 0, -1);
    batch_add_doc(&b, d1, 6, 1000, 1, 42);
    batch_add_doc(&b, d2, 9, 0, 2, -1);
    MicroBatch mb = batch_view(&b);

    llama_zero_grad(&m);
    double loss;
    int64_t nt;
    assert_int_equal(llama_forward_backward(&m, &mb, 1.0f, &loss, &nt), 0);
    assert_int_equal(nt, 22);
    assert_close(loss, model_loss(&m, &mb), 1e-6, 0);  // forward-only agrees

    const float eps = 1e-2f;
    double worst = 0;
    for (int ti = 0; ti < m.n_tensors; ti++) {
        const ParamTensor *t = &m.tensors[ti];
        const float *g = m.grads + t->offset;
        size_t pick[6];
        size_t arg = 0;
        for (size_t j = 0; j < t->numel; j++) arg = fabsf(g[j]) > fabsf(g[arg]) ? j : arg;
        pick[0] = arg;
        for (int k = 1; k < 6; k++) {
            if (strcmp(t->name, "tok_emb") == 0)
                pick[k] = (size_t)b.tokens[rng_below(&rng, (uint64_t)b.T)] * (size_t)cfg.d_model +
                          rng_below(&rng, (uint64_t)cfg.d_model);
            else
                pick[k] = rng_below(&rng, t->numel);
        }
        assert_true(fabsf(g[arg]) > 1e-2f);  // every tensor takes part in the loss
        for (int k = 0; k < 6; k++) {
            float *p = m.params + t->offset + pick[k];
            float old = *p, hi = old + eps, lo = old - eps;
            *p = hi;
            double lp = model_loss(&m, &mb);
            *p = lo;
            double lm = model_loss(&m, &mb);
            *p = old;
            double num = (lp - lm) / ((double)hi - (double)lo), ana = g[pick[k]];
            double err = fabs(ana - num) / (1e-2 + 3e-2 * fabs(num));
            worst = err > worst ? err : worst;
            if (err > 1) fail_msg("%s[%zu]: analytic %.6g, numeric %.6g", t->name, pick[k], ana, num);
        }
    }
    print_message("whole-model finite differences: worst error / tolerance = %.3f\n", worst);
    llama_free(&m);
}

// ---- packing ---------------------------------------------------------------------------------------

// Documents packed into one micro-batch (distinct segments, positions restarting at 0) give the
// same summed loss and the same gradients as running each alone and summing.
static void test_packing_equals_separate_documents(void **state) {
    (void)state;
    ModelConfig cfg = tiny();
    Llama m;
    assert_int_equal(llama_init(&m, &cfg, 128), 0);
    llama_init_weights(&m, 3);
    randomize_params(&m, 4);
    Rng rng;
    rng_seed(&rng, 5);
    int lens[5] = {17, 3, 30, 1, 24};
    int32_t docs[5][32];
    Batch packed = {0};
    for (int d = 0; d < 5; d++) {
        for (int i = 0; i < lens[d]; i++) docs[d][i] = (int32_t)rng_below(&rng, 256);
        batch_add_doc(&packed, docs[d], lens[d], 0, 10 + d, -1);
    }
    MicroBatch mb = batch_view(&packed);
    llama_zero_grad(&m);
    double loss_packed;
    assert_int_equal(llama_forward_backward(&m, &mb, 0.5f, &loss_packed, NULL), 0);
    float *g_packed = malloc(m.n_params * sizeof(float));
    memcpy(g_packed, m.grads, m.n_params * sizeof(float));

    llama_zero_grad(&m);
    double loss_sep = 0;
    for (int d = 0; d < 5; d++) {
        Batch one = {0};
        batch_add_doc(&one, docs[d], lens[d], 0, 0, -1);
        MicroBatch mb1 = batch_view(&one);
        double l;
        assert_int_equal(llama_forward_backward(&m, &mb1, 0.5f, &l, NULL), 0);  // gradients accumulate
        loss_sep += l;
    }
    // fp32 rounding: sums of the same terms in a different order and different sgemm blockings;
    // relative 1e-5 on the loss, and 1e-4 of the largest gradient per element
    assert_close(loss_packed, loss_sep, 1e-5, 0);
    double gmax = max_abs(g_packed, m.n_params);
    assert_true(gmax > 1e-3);
    for (size_t i = 0; i < m.n_params; i++) assert_close(m.grads[i], g_packed[i], 0, 1e-4 * gmax);
    free(g_packed);
    llama_free(&m);
}

// ---- RoPE on global positions ----------------------------------------------------------------------

// A chunk of a document at positions [p, p+n) gets the same layer-0 q and k as those rows of the
// full document (the ring attention's correctness rests on this); a chunk with positions restarted
// at 0 does not.
static void test_rope_chunk_matches_full_document(void **state) {
    (void)state;
    ModelConfig cfg = tiny();
    Llama m;
    assert_int_equal(llama_init(&m, &cfg, 64), 0);
    llama_init_weights(&m, 6);
    randomize_params(&m, 7);
    Rng rng;
    rng_seed(&rng, 8);
    int32_t doc[48];
    for (int i = 0; i < 48; i++) doc[i] = (int32_t)rng_below(&rng, 256);
    int Q = m.q_dim, KV = m.kv_dim, p = 20, n = 16;
    float *q_full = malloc(sizeof(float) * 48 * Q), *k_full = malloc(sizeof(float) * 48 * KV);

    Batch full = {0};
    batch_add_doc(&full, doc, 48, 0, 0, -1);
    MicroBatch mb = batch_view(&full);
    model_loss(&m, &mb);
    memcpy(q_full, m.acts.layers[0].q, sizeof(float) * 48 * Q);
    memcpy(k_full, m.acts.layers[0].k, sizeof(float) * 48 * KV);

    Batch chunk = {0};
    batch_add_doc(&chunk, doc + p, n, p, 0, doc[p + n]);
    mb = batch_view(&chunk);
    model_loss(&m, &mb);
    for (int i = 0; i < n * Q; i++) assert_close(m.acts.layers[0].q[i], q_full[p * Q + i], 1e-5, 1e-6);
    for (int i = 0; i < n * KV; i++) assert_close(m.acts.layers[0].k[i], k_full[p * KV + i], 1e-5, 1e-6);

    Batch restarted = {0};
    batch_add_doc(&restarted, doc + p, n, 0, 0, doc[p + n]);
    mb = batch_view(&restarted);
    model_loss(&m, &mb);
    double diff = 0;
    for (int i = Q; i < n * Q; i++) diff = fmax(diff, fabs(m.acts.layers[0].q[i] - q_full[p * Q + i]));
    assert_true(diff > 1e-2);
    free(q_full);
    free(k_full);
    llama_free(&m);
}

// ---- the attention interface -----------------------------------------------------------------------

// An attention that splits the keys into two row sets and merges partial results, as ring
// attention does with the K/V it receives, and records which layers called it.
typedef struct {
    float out_b[MAXT * 64], lse_b[MAXT * 4];
    int calls[16], n_calls;
    int fail_layer;
} SplitAttn;

static int split_forward(void *ctx, int layer, float *out, float *lse, const float *q, const float *k, const float *v,
                         AttnRows rows, AttnShape s) {
    SplitAttn *a = ctx;
    a->calls[a->n_calls++] = layer;
    if (layer == a->fail_layer) return bs_fail("peer rank 3 went away");
    int h = rows.n / 2, kvw = s.n_kv_heads * s.head_dim;
    AttnRows k0 = {rows.pos, rows.seg, h}, k1 = {rows.pos + h, rows.seg + h, rows.n - h};
    attn_forward(out, lse, q, rows, k, v, k0, s);
    attn_forward(a->out_b, a->lse_b, q, rows, k + (size_t)h * kvw, v + (size_t)h * kvw, k1, s);
    attn_merge(out, lse, a->out_b, a->lse_b, rows.n, s);
    return 0;
}

static int split_backward(void *ctx, int layer, float *dq, float *dk, float *dv, const float *dout, const float *lse,
                          const float *delta, const float *q, const float *k, const float *v, AttnRows rows,
                          AttnShape s) {
    SplitAttn *a = ctx;
    a->calls[a->n_calls++] = 100 + layer;
    int h = rows.n / 2, kvw = s.n_kv_heads * s.head_dim;
    AttnRows k0 = {rows.pos, rows.seg, h}, k1 = {rows.pos + h, rows.seg + h, rows.n - h};
    attn_backward(dq, dk, dv, dout, lse, delta, q, rows, k, v, k0, s);
    size_t o = (size_t)h * kvw;
    attn_backward(dq, dk + o, dv + o, dout, lse, delta, q, rows, k + o, v + o, k1, s);
    return 0;
}

static void test_pluggable_attention(void **state) {
    (void)state;
    ModelConfig cfg = tiny();
    Llama m;
    assert_int_equal(llama_init(&m, &cfg, 64), 0);
    randomize_params(&m, 9);
    Rng rng;
    rng_seed(&rng, 10);
    int32_t d0[25], d1[15];
    for (int i = 0; i < 25; i++) d0[i] = (int32_t)rng_below(&rng, 256);
    for (int i = 0; i < 15; i++) d1[i] = (int32_t)rng_below(&rng, 256);
    Batch b = {0};
    batch_add_doc(&b, d0, 25, 300, 0, 7);
    batch_add_doc(&b, d1, 15, 0, 1, -1);
    MicroBatch mb = batch_view(&b);

    llama_zero_grad(&m);
    double loss_local;
    assert_int_equal(llama_forward_backward(&m, &mb, 1.0f, &loss_local, NULL), 0);
    float *g_local = malloc(m.n_params * sizeof(float));
    memcpy(g_local, m.grads, m.n_params * sizeof(float));

    static SplitAttn sa;
    memset(&sa, 0, sizeof sa);
    sa.fail_layer = -1;
    m.attn = (AttnOps){.forward = split_forward, .backward = split_backward, .ctx = &sa};
    llama_zero_grad(&m);
    double loss_split;
    assert_int_equal(llama_forward_backward(&m, &mb, 1.0f, &loss_split, NULL), 0);
    // every layer calls it once forward (in order) and once backward (in reverse)
    int want[4] = {0, 1, 101, 100};
    assert_int_equal(sa.n_calls, 4);
    assert_memory_equal(sa.calls, want, sizeof want);
    assert_close(loss_split, loss_local, 1e-5, 0);
    double gmax = max_abs(g_local, m.n_params);
    for (size_t i = 0; i < m.n_params; i++) assert_close(m.grads[i], g_local[i], 0, 1e-4 * gmax);

    // a failure inside the attention (an MPI error in the ring) comes back with the layer named
    sa.n_calls = 0;
    sa.fail_layer = 1;
    double loss;
    assert_int_equal(llama_forward(&m, &mb, &loss, NULL), -1);
    assert_non_null(strstr(bs_errmsg(), "layer 1: attention forward: peer rank 3 went away"));
    free(g_local);
    llama_free(&m);
}

// ---- initialization, layout, normalization ----------------------------------------------------------

static void test_layout_and_init(void **state) {
    (void)state;
    ModelConfig cfg = tiny();
    Llama m, m2;
    assert_int_equal(llama_init(&m, &cfg, 16), 0);
    assert_int_equal(llama_init(&m2, &cfg, 16), 0);
    // the tensors tile the flat buffer in order, and the count agrees with the catalogue's formula
    size_t off = 0;
    for (int i = 0; i < m.n_tensors; i++) {
        assert_int_equal(m.tensors[i].offset, off);
        off += m.tensors[i].numel;
    }
    assert_int_equal(off, m.n_params);
    assert_int_equal((int64_t)m.n_params, model_params_total(&cfg));
    assert_int_equal(m.n_tensors, 1 + 9 * cfg.n_layers + 2);  // tok_emb, 9 per layer, final_norm, lm_head
    const ParamTensor *wk = llama_find_tensor(&m, "layers.1.wk");
    assert_non_null(wk);
    assert_int_equal(wk->shape[0], cfg.n_kv_heads * cfg.head_dim);
    assert_int_equal(wk->shape[1], cfg.d_model);
    assert_true(m.w.layers[1].wk == m.params + wk->offset);
    assert_true(m.g.layers[1].wk == m.grads + wk->offset);
    // the arena is exactly what llama_activation_bytes reports, and grows linearly with max_T
    assert_int_equal(m.arena.cap, llama_activation_bytes(&cfg, 16));
    size_t per16 = llama_activation_bytes(&cfg, 32) - llama_activation_bytes(&cfg, 16);
    assert_int_equal(llama_activation_bytes(&cfg, 48) - llama_activation_bytes(&cfg, 32), per16);
    assert_null(llama_find_tensor(&m, "layers.9.wq"));
    assert_non_null(strstr(bs_errmsg(), "layers.9.wq"));

    llama_init_weights(&m, 42);
    llama_init_weights(&m2, 42);
    assert_memory_equal(m.params, m2.params, m.n_params * sizeof(float));
    llama_init_weights(&m2, 43);
    assert_true(memcmp(m.params, m2.params, m.n_params * sizeof(float)) != 0);
    // sample standard deviations: 0.02, residual projections 0.02 / sqrt(2 * n_layers); norms 1
    double resid = 0.02 / sqrt(2.0 * cfg.n_layers);
    for (int i = 0; i < m.n_tensors; i++) {
        const ParamTensor *t = &m.tensors[i];
        const float *p = m.params + t->offset;
        if (t->ndim == 1) {
            assert_int_equal(t->decay, 0);
            for (size_t j = 0; j < t->numel; j++) assert_true(p[j] == 1.0f);
            continue;
        }
        assert_int_equal(t->decay, 1);
        double s2 = 0, s = 0;
        for (size_t j = 0; j < t->numel; j++) s += p[j], s2 += (double)p[j] * p[j];
        double mean = s / t->numel, sd = sqrt(s2 / t->numel - mean * mean);
        int is_resid = strstr(t->name, ".wo") || strstr(t->name, ".w_down");
        // the smallest matrix has 2048 entries: the sample sd's relative standard error is
        // 1/sqrt(2n) <= 1.6% and the mean's is sd/sqrt(n) <= 2.2% of sd, so these bounds are >= 4 sigma
        assert_close(sd, is_resid ? resid : 0.02, 0.08, 0);
        assert_close(mean, 0, 0, 0.1 * 0.02);
    }
    // decay ranges follow the table
    DecayRange *r = malloc(sizeof(DecayRange) * (size_t)m.n_tensors);
    llama_decay_ranges(&m, r);
    for (int i = 0; i < m.n_tensors; i++) {
        assert_int_equal(r[i].begin, m.tensors[i].offset);
        assert_int_equal(r[i].end, m.tensors[i].offset + m.tensors[i].numel);
    }
    AdamW opt;
    AdamWConfig oc = adamw_defaults();
    assert_int_equal(adamw_init(&opt, &oc, 0, m.n_params, r, m.n_tensors), 0);
    adamw_free(&opt);
    free(r);
    llama_free(&m);
    llama_free(&m2);
}

// At init the logits are ~0, so every token's loss is ~ln(vocab). The loss is a sum; gradients
// scale linearly with loss_scale and accumulate over calls; the head's chunk size changes nothing.
static void test_loss_normalization_and_accumulation(void **state) {
    (void)state;
    ModelConfig cfg = tiny();
    Llama m;
    assert_int_equal(llama_init(&m, &cfg, 100), 0);
    llama_init_weights(&m, 11);
    Rng rng;
    rng_seed(&rng, 12);
    int32_t doc[100];
    for (int i = 0; i < 100; i++) doc[i] = (int32_t)rng_below(&rng, 256);
    Batch b = {0};
    batch_add_doc(&b, doc, 60, 0, 0, -1);
    batch_add_doc(&b, doc + 60, 40, 0, 1, -1);
    MicroBatch mb = batch_view(&b);
    double loss;
    int64_t nt;
    llama_zero_grad(&m);
    assert_int_equal(llama_forward_backward(&m, &mb, 1.0f, &loss, &nt), 0);
    assert_int_equal(nt, 98);
    assert_close(loss / nt, log(256.0), 0.01, 0);
    float *g1 = malloc(m.n_params * sizeof(float));
    memcpy(g1, m.grads, m.n_params * sizeof(float));
    double gmax = max_abs(g1, m.n_params);

    // token-level normalization: scale 1/98 gives the mean loss's gradient, exactly g1 / 98
    llama_zero_grad(&m);
    double loss2;
    assert_int_equal(llama_forward_backward(&m, &mb, 1.0f / 98, &loss2, NULL), 0);
    assert_close(loss2, loss, 1e-12, 0);  // the returned loss is never scaled
    for (size_t i = 0; i < m.n_params; i++) assert_close(m.grads[i], g1[i] / 98, 0, 1e-5 * gmax / 98);
    // a second call adds on top
    assert_int_equal(llama_forward_backward(&m, &mb, 1.0f / 98, &loss2, NULL), 0);
    for (size_t i = 0; i < m.n_params; i++) assert_close(m.grads[i], 2 * g1[i] / 98, 0, 1e-5 * gmax / 98);
    // the head in chunks of 7 rows instead of all 100 at once
    m.chunk = 7;
    llama_zero_grad(&m);
    assert_int_equal(llama_forward_backward(&m, &mb, 1.0f, &loss2, NULL), 0);
    assert_close(loss2, loss, 1e-6, 0);
    for (size_t i = 0; i < m.n_params; i++) assert_close(m.grads[i], g1[i], 0, 1e-5 * gmax);
    // an empty micro-batch is fine and contributes nothing
    MicroBatch empty = {.tokens = b.tokens, .targets = b.targets, .pos = b.pos, .seg = b.seg, .T = 0};
    assert_int_equal(llama_forward_backward(&m, &empty, 1.0f, &loss2, &nt), 0);
    assert_true(loss2 == 0 && nt == 0);
    free(g1);
    llama_free(&m);
}

static void test_refusals(void **state) {
    (void)state;
    Llama m;
    const ModelConfig *moe = model_find("mixtral-8x7b");
    if (!moe) {  // whatever MoE entry the catalogue has
        for (int i = 0; i < model_count(); i++)
            if (model_at(i)->n_experts > 1) moe = model_at(i);
    }
    assert_non_null(moe);
    assert_int_equal(llama_init(&m, moe, 16), -1);
    assert_non_null(strstr(bs_errmsg(), "mixture-of-experts"));
    ModelConfig bad = tiny();
    bad.n_kv_heads = 3;
    assert_int_equal(llama_init(&m, &bad, 16), -1);
    assert_non_null(strstr(bs_errmsg(), "n_kv_heads"));

    ModelConfig cfg = tiny();
    assert_int_equal(llama_init(&m, &cfg, 8), 0);
    llama_init_weights(&m, 1);
    int32_t toks[10] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10};
    Batch b = {0};
    batch_add_doc(&b, toks, 10, 0, 0, -1);
    MicroBatch mb = batch_view(&b);
    double loss;
    assert_int_equal(llama_forward(&m, &mb, &loss, NULL), -1);  // 10 > max_T 8
    assert_non_null(strstr(bs_errmsg(), "at most 8"));
    mb.T = 5;
    b.tokens[3] = 256;
    assert_int_equal(llama_forward_backward(&m, &mb, 1.0f, &loss, NULL), -1);
    assert_non_null(strstr(bs_errmsg(), "row 3: token 256"));
    b.tokens[3] = 4;
    b.targets[2] = -2;
    assert_int_equal(llama_forward_backward(&m, &mb, 1.0f, &loss, NULL), -1);
    assert_non_null(strstr(bs_errmsg(), "row 2: target -2"));
    b.targets[2] = 3;
    assert_int_equal(llama_forward_backward(&m, &mb, 1.0f, &loss, NULL), 0);
    llama_free(&m);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_whole_model_finite_differences),
        cmocka_unit_test(test_packing_equals_separate_documents),
        cmocka_unit_test(test_rope_chunk_matches_full_document),
        cmocka_unit_test(test_pluggable_attention),
        cmocka_unit_test(test_layout_and_init),
        cmocka_unit_test(test_loss_normalization_and_accumulation),
        cmocka_unit_test(test_refusals),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
