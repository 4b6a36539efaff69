// model.h: the model catalogue. Shapes only; weights live in src/nn.
//
// The six models of the ByteScale evaluation (docs/architecture.md, "The paper: evaluation setup")
// with the FFN sizes and vocabularies of their public families, plus tiny configurations that train
// on a CPU.
#ifndef BYTESCALE_MODEL_H
#define BYTESCALE_MODEL_H

#include <stdint.h>
#include "bytescale/export.h"

BS_API_BEGIN

typedef struct {
    char name[32];
    int n_layers;
    int n_heads;       // query heads
    int n_kv_heads;    // K/V heads (GQA groups); n_heads % n_kv_heads == 0
    int d_model;       // hidden size (residual stream); = n_heads * head_dim except llama-30b,
                       // whose attention is 56 x 128 = 7168 wide (docs/cost-model.md)
    int head_dim;
    int d_ff;          // SwiGLU inner size (per expert for MoE)
    int vocab_size;
    int n_experts;     // 1 for dense; MoE: experts per layer
    int top_k;         // 1 for dense; MoE: experts active per token
    double rope_theta;
    double norm_eps;   // RMSNorm epsilon
} ModelConfig;

int model_count(void);
const ModelConfig *model_at(int i);
// Look a model up by name ("llama-7b", "mixtral-8x7b", "tiny", ...). NULL + error listing the names.
const ModelConfig *model_find(const char *name);
// Check a configuration (from the catalogue or a file) for consistency. -1 + error naming the field.
int model_check(const ModelConfig *m);

// Parameter counts. total counts every expert; active counts top_k experts per token.
int64_t model_params_total(const ModelConfig *m);
int64_t model_params_active(const ModelConfig *m);
int64_t model_params_per_layer(const ModelConfig *m);  // one decoder layer, all experts

BS_API_END

#endif
