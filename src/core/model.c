// model.c: the model catalogue and parameter counts (see model.h, docs/cost-model.md).
//
// The six evaluation models take layers, heads, K/V groups and hidden size from the paper's
// evaluation setup (docs/architecture.md, "The paper: evaluation setup") and FFN size, vocabulary
// and RoPE base from their public families (LLaMA-1/2, Mixtral). The three small ones train on a
// CPU with a byte-level vocabulary.
#include "bytescale/model.h"

#include <stdio.h>
#include <string.h>

#include "bytescale/error.h"

// name, layers, heads, kv heads, d_model, head_dim, d_ff, vocab, experts, top_k, rope_theta, norm_eps
static const ModelConfig catalogue[] = {
    // LLaMA-1/2 7B: d_ff 11008, vocab 32000 (the paper's GQA with 8 groups replaces LLaMA's MHA)
    {"llama-7b", 32, 32, 8, 4096, 128, 11008, 32000, 1, 1, 10000.0, 1e-5},
    // LLaMA-1/2 13B: d_ff 13824, vocab 32000
    {"llama-13b", 40, 40, 8, 5120, 128, 13824, 32000, 1, 1, 10000.0, 1e-5},
    // LLaMA-1 "30B" (33B): d_ff 17920, vocab 32000. The paper's 56 heads x 8 groups are kept with
    // LLaMA's head_dim 128, so the attention width 7168 differs from d_model 6656 (6656 / 56 is not
    // an integer and LLaMA's own 52 heads do not split into 8 groups). docs/cost-model.md says why.
    {"llama-30b", 60, 56, 8, 6656, 128, 17920, 32000, 1, 1, 10000.0, 1e-5},
    // LLaMA-2 70B: d_ff 28672, vocab 32000 (already GQA with 8 groups)
    {"llama-70b", 80, 64, 8, 8192, 128, 28672, 32000, 1, 1, 10000.0, 1e-5},
    // Mixtral 8x7B: d_ff 14336 per expert, 8 experts top-2, vocab 32000, rope_theta 1e6
    {"mixtral-8x7b", 32, 32, 8, 4096, 128, 14336, 32000, 8, 2, 1000000.0, 1e-5},
    // Mixtral 8x22B: d_ff 16384 per expert, 8 experts top-2, vocab 32768, rope_theta 1e6
    {"mixtral-8x22b", 56, 48, 8, 6144, 128, 16384, 32768, 8, 2, 1000000.0, 1e-5},
    // CPU configurations, byte-level vocabulary
    {"tiny", 2, 4, 2, 64, 16, 192, 256, 1, 1, 10000.0, 1e-5},
    {"small", 4, 4, 2, 256, 64, 704, 256, 1, 1, 10000.0, 1e-5},
    {"base", 8, 8, 2, 512, 64, 1408, 256, 1, 1, 10000.0, 1e-5},
};

enum { N_MODELS = (int)(sizeof catalogue / sizeof catalogue[0]) };

int model_count(void) { return N_MODELS; }

const ModelConfig *model_at(int i) { return (i >= 0 && i < N_MODELS) ? &catalogue[i] : NULL; }

const ModelConfig *model_find(const char *name) {
    for (int i = 0; i < N_MODELS; i++)
        if (name && strcmp(catalogue[i].name, name) == 0) return &catalogue[i];
    char known[512] = "";
    size_t used = 0;
    for (int i = 0; i < N_MODELS; i++)
        used += (size_t)snprintf(known + used, sizeof known - used, "%s%s", i ? ", " : "", catalogue[i].name);
    bs_fail("unknown model \"%s\" (known: %s)", name ? name : "(null)", known);
    return NULL;
}

int model_check(const ModelConfig *m) {
    if (!m) return bs_fail("model: no configuration given");
    const char *n = m->name[0] ? m->name : "(unnamed)";
    if (memchr(m->name, '\0', sizeof m->name) == NULL) return bs_fail("model: name is not terminated");
    struct {
        const char *field;
        int value;
    } positive[] = {
        {"n_layers", m->n_layers}, {"n_heads", m->n_heads},       {"n_kv_heads", m->n_kv_heads},
        {"d_model", m->d_model},   {"head_dim", m->head_dim},     {"d_ff", m->d_ff},
        {"vocab_size", m->vocab_size}, {"n_experts", m->n_experts}, {"top_k", m->top_k},
    };
    for (size_t i = 0; i < sizeof positive / sizeof positive[0]; i++)
        if (positive[i].value <= 0)
            return bs_fail("model \"%s\": %s must be positive (got %d)", n, positive[i].field, positive[i].value);
    if (m->n_heads % m->n_kv_heads != 0)
        return bs_fail("model \"%s\": n_heads (%d) must be a multiple of n_kv_heads (%d)", n, m->n_heads,
                       m->n_kv_heads);
    if (m->head_dim % 2 != 0) return bs_fail("model \"%s\": head_dim (%d) must be even for RoPE", n, m->head_dim);
    if (m->top_k > m->n_experts)
        return bs_fail("model \"%s\": top_k (%d) must be at most n_experts (%d)", n, m->top_k, m->n_experts);
    if (m->n_experts == 1 && m->top_k != 1)
        return bs_fail("model \"%s\": a dense model (n_experts 1) needs top_k 1 (got %d)", n, m->top_k);
    // d_model may differ from n_heads * head_dim (llama-30b); the projections carry the difference.
    if (!(m->rope_theta > 1.0)) return bs_fail("model \"%s\": rope_theta must be > 1 (got %g)", n, m->rope_theta);
    if (!(m->norm_eps > 0.0 && m->norm_eps < 1.0))
        return bs_fail("model \"%s\": norm_eps must be in (0, 1) (got %g)", n, m->norm_eps);
    return 0;
}

// One decoder layer with experts_counted experts: two RMSNorm weights, Q/K/V/O projections (no
// biases), the MoE router when there is more than one expert, and the SwiGLU MLPs (gate, up, down).
static int64_t layer_params(const ModelConfig *m, int experts_counted) {
    int64_t d = m->d_model;
    int64_t d_attn = (int64_t)m->n_heads * m->head_dim;
    int64_t d_kv = (int64_t)m->n_kv_heads * m->head_dim;
    int64_t norms = 2 * d;
    int64_t attn = d * d_attn + 2 * d * d_kv + d_attn * d;
    int64_t router = m->n_experts > 1 ? d * m->n_experts : 0;
    int64_t mlp = (int64_t)experts_counted * 3 * d * m->d_ff;
    return norms + attn + router + mlp;
}

// Token embedding, final RMSNorm and an untied output head (as LLaMA and Mixtral have).
static int64_t outer_params(const ModelConfig *m) {
    int64_t d = m->d_model;
    return (int64_t)m->vocab_size * d + d + (int64_t)m->vocab_size * d;
}

int64_t model_params_per_layer(const ModelConfig *m) { return layer_params(m, m->n_experts); }

int64_t model_params_total(const ModelConfig *m) {
    return (int64_t)m->n_layers * layer_params(m, m->n_experts) + outer_params(m);
}

int64_t model_params_active(const ModelConfig *m) {
    return (int64_t)m->n_layers * layer_params(m, m->top_k) + outer_params(m);
}
