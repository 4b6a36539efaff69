// llama_acts.h: the model's activation memory (llama_acts.c), internal to src/nn: the layout of a
// micro-batch's activations in the arena, what is resident, and the offload schedule. llama.c calls
// these around its layers; its math never sees them.
#ifndef BYTESCALE_NN_LLAMA_ACTS_H
#define BYTESCALE_NN_LLAMA_ACTS_H

#include "bytescale/llama.h"

// What a shard's activations are carved for: its local widths (the config's divided by tp) and the
// layers it holds. The public llama_activation_bytes / llama_resident_bytes are these for the whole
// model (llama_shard_full).
typedef struct {
    int d_model, head_dim;
    int n_heads, n_kv_heads, d_ff, vocab;  // this shard's
    int n_layers;                          // layers held: layer_end - layer_begin
    int last;                              // holds the head: lnf, rstdf and the logits scratch
    int tp;                                // > 1: the logits scratch has room for the row statistics
} ActDims;
ActDims acts_dims(const ModelConfig *cfg, const LlamaShard *sh);

// Rows per head + loss chunk for micro-batches of up to max_T tokens (about 2M logits of the
// shard's vocabulary at a time).
int acts_head_chunk(const ActDims *d, int max_T);
// llama_activation_bytes and llama_resident_bytes for one shard.
size_t acts_activation_bytes(const ActDims *d, int max_T);
size_t acts_resident_bytes(const ActDims *d, int T, double r);
// (Re)make the arena for micro-batches of up to max_T tokens. On failure the old one stays.
int acts_reserve(Llama *m, int max_T);

// One micro-batch: lay it out, check the budget, start the accounting. backward = 0 (forward only)
// never offloads. -1 + error before anything has run.
int acts_begin(Llama *m, const MicroBatch *mb, int backward);  // r: m->offload_ratio
// l is the global layer number; the schedule runs over the shard's layers (its last two stay resident).
// Forward: before layer l runs / after it ran (waits for the copy out of layer l-1, starts layer l's).
void acts_forward_layer(Llama *m, int l);
int acts_forward_done(Llama *m, int l);
// Backward: before layer l runs (waits for its bytes, starts reading layer l-1's) / after it ran
// (its block is spent and released).
int acts_backward_layer(Llama *m, int l);
int acts_backward_done(Llama *m, int l);
// The end of the micro-batch, rc its result: on failure no copy is left running. Returns rc.
int acts_end(Llama *m, int rc);

#endif
