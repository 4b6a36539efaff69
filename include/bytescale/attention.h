// attention.h: packed causal attention, blockwise with an online softmax (fp32, CPU).
//
// A micro-batch is a packed token buffer: every token carries a global position (for RoPE and the
// mask) and a segment id (which subsequence it belongs to). Query row i sees key row j iff
//     kseg[j] == qseg[i]  &&  kpos[j] <= qpos[i]
// The kernel takes ANY set of query rows and ANY set of key/value rows and returns a partial result
// (output + log-sum-exp per row and head) that merges exactly with partial results over other key
// rows, which is what ring attention (docs/runtime.md) needs: it calls the kernel on (local queries,
// received K/V) pairs. In this tree the model calls it on one micro-batch (llama.h, AttnOps).
//
// Memory is O(rows): scores exist only one block at a time, never as an nq x nk matrix. Blocks
// the mask hides entirely are skipped. Backward recomputes the block probabilities from the saved
// log-sum-exp of the FINAL (fully merged) result.
//
// Layouts (row-major): q, out, dq:  (nq, n_heads, head_dim)
//                      k, v, dk, dv: (nk, n_kv_heads, head_dim)
//                      lse, delta:   (nq, n_heads)
// Query head h reads K/V head h / (n_heads / n_kv_heads) (grouped-query attention).
// Scores are scaled by 1/sqrt(head_dim).
#ifndef BYTESCALE_ATTENTION_H
#define BYTESCALE_ATTENTION_H

#include <stdint.h>

typedef struct {
    const int32_t *pos;  // (n,) global positions
    const int32_t *seg;  // (n,) segment ids
    int n;
} AttnRows;

typedef struct {
    int n_heads, n_kv_heads, head_dim;
} AttnShape;

// out, lse are overwritten with the partial result over the given keys. A (row, head) that sees
// no key gets out = 0 and lse = -INFINITY, which merges as "nothing".
void attn_forward(float *out, float *lse, const float *q, AttnRows qr, const float *k, const float *v, AttnRows kr,
                  AttnShape s);

// Fold a partial result (out_b, lse_b) into (out_a, lse_a), exactly as if a's keys and b's keys
// had been one set.
void attn_merge(float *out_a, float *lse_a, const float *out_b, const float *lse_b, int nq, AttnShape s);

// delta[i, h] = sum_d dout[i, h, d] * out[i, h, d]; computed once per backward from the final out.
void attn_backward_delta(float *delta, const float *dout, const float *out, int nq, AttnShape s);

// Accumulate (+=) the gradients of the loss through the keys kr into dq, dk, dv. out/lse/delta are
// those of the final merged result, so calling this once per (query part, key part) pair and
// summing gives the gradients of the whole attention.
void attn_backward(float *dq, float *dk, float *dv, const float *dout, const float *lse, const float *delta,
                   const float *q, AttnRows qr, const float *k, const float *v, AttnRows kr, AttnShape s);

// Exact count of visible (query, key) pairs between two row sets (for FLOP accounting and tests).
int64_t attn_visible_pairs(AttnRows qr, AttnRows kr);

#endif
