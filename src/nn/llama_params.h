// llama_params.h: what llama.c needs of llama_params.c (internal to src/nn).
#ifndef BYTESCALE_NN_LLAMA_PARAMS_H
#define BYTESCALE_NN_LLAMA_PARAMS_H

#include "bytescale/llama.h"

// The catalogue's consistency check, after refusing what this CPU model cannot run (MoE).
int llama_check_config(const ModelConfig *c);
// A shard's tensors in buffer order with its local shapes, allocated (NULL + error when out of
// memory); *n tensors, *n_params floats.
ParamTensor *llama_make_table(const ModelConfig *c, const LlamaShard *sh, int *n, size_t *n_params);
// The initial weights of shard sh (llama_init_weights) into params (the shard's n_params floats),
// without a model: a shard of any size can be drawn (bench/init.c). -1 + error when out of memory.
int llama_shard_init_weights(const ModelConfig *cfg, const LlamaShard *sh, float *params, uint64_t seed);

#endif
