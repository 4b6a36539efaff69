// llama_params.h: what llama.c needs of llama_params.c (internal to src/nn).
#ifndef BYTESCALE_NN_LLAMA_PARAMS_H
#define BYTESCALE_NN_LLAMA_PARAMS_H

#include "bytescale/llama.h"

// The catalogue's consistency check, after refusing what this CPU model cannot run (MoE).
int llama_check_config(const ModelConfig *c);
// A shard's tensors in buffer order with its local shapes, allocated (NULL + error when out of
// memory); *n tensors, *n_params floats.
ParamTensor *llama_make_table(const ModelConfig *c, const LlamaShard *sh, int *n, size_t *n_params);

#endif
