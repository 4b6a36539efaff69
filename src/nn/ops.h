// ops.h: the model's CPU kernels other than attention, one small file each, forward and backward
// side by side. fp32, row-major, no allocation: every buffer is the caller's.
//
// Conventions: T rows (tokens), C input features, OC output features. A weight matrix w is stored
// (OC, C) so a linear layer is out = x @ w^T. Backward functions ADD parameter gradients (dw += ...,
// so micro-batches accumulate) and OVERWRITE or ADD input gradients as each comment says.
#ifndef BYTESCALE_NN_OPS_H
#define BYTESCALE_NN_OPS_H

#include <stddef.h>
#include <stdint.h>

#include "bytescale/llama.h"  // TpOps: the vocabulary-parallel variants reduce over the tp group

// ---- matmul.c: linear layers through cblas_sgemm -------------------------------------------------
// out (T, OC) = x (T, C) @ w (OC, C)^T, or += when accumulate (a residual connection)
void matmul_forward(float *out, const float *x, const float *w, int T, int C, int OC, int accumulate);
// dx (T, C) = dout (T, OC) @ w (OC, C), or += when accumulate_dx; dx may be NULL.
// dw (OC, C) += dout^T @ x (T, C); dw may be NULL.
void matmul_backward(float *dx, float *dw, const float *dout, const float *x, const float *w, int T, int C, int OC,
                     int accumulate_dx);
// Rows [o0, o1) of matmul_backward's dw: dw (OC, C) += dout^T @ x on those rows only (dout's columns
// o0 .. o1). The tensor-parallel backward computes a weight gradient in such slices so that it can
// drive an all-reduce in flight between them (llama.c, column_backward).
void matmul_backward_dw_rows(float *dw, const float *dout, const float *x, int T, int C, int OC, int o0, int o1);

// ---- embedding.c: token embedding --------------------------------------------------------------
// out (T, C) = table (V, C)[tokens (T,)]
void embedding_forward(float *out, const int32_t *tokens, const float *table, int T, int C);
// dtable (V, C) += dout (T, C) scattered to the rows of tokens
void embedding_backward(float *dtable, const float *dout, const int32_t *tokens, int T, int C);
// Vocabulary-parallel: this tp rank holds rows [v_begin, v_begin + V) of the table, (V, C) here.
// out (T, C) = the row of every token in that range, 0 for the others: the tp group's SUM of out
// is the whole lookup (each token's row lives on exactly one rank).
void embedding_forward_vocab(float *out, const int32_t *tokens, const float *table, int T, int C, int v_begin, int V);
// dtable (V, C) += dout (T, C) scattered to the rows of the tokens in this rank's range; dout is
// the whole (replicated) gradient, and the other tokens' rows are other ranks'.
void embedding_backward_vocab(float *dtable, const float *dout, const int32_t *tokens, int T, int C, int v_begin,
                              int V);

// ---- rmsnorm.c: y = x / rms(x) * w ----------------------------------------------------------------
// out (T, C), rstd (T,) = 1 / sqrt(mean(x^2) + eps), kept for the backward
void rmsnorm_forward(float *out, float *rstd, const float *x, const float *w, int T, int C, float eps);
// dx (T, C) += (the residual stream's gradient already lives there); dw (C,) +=
void rmsnorm_backward(float *dx, float *dw, const float *dout, const float *x, const float *rstd, const float *w,
                      int T, int C);

// ---- rope.c: rotary position embedding on GLOBAL positions ------------------------------------------
// Pair (2i, 2i+1) of every head is rotated by angle pos * theta^(-2i / head_dim).
// cos_t, sin_t (T, head_dim / 2): computed once per micro-batch, in double (positions reach millions).
void rope_tables(float *cos_t, float *sin_t, const int32_t *pos, int T, int head_dim, double theta);
// x (T, n_heads, head_dim), rotated in place
void rope_forward(float *x, const float *cos_t, const float *sin_t, int T, int n_heads, int head_dim);
// dx (T, n_heads, head_dim), rotated back in place (the rotation's transpose is its inverse)
void rope_backward(float *dx, const float *cos_t, const float *sin_t, int T, int n_heads, int head_dim);

// ---- swiglu.c: h = silu(gate) * up ---------------------------------------------------------------
// h, gate, up (n,) elementwise (n = T * d_ff)
void swiglu_forward(float *h, const float *gate, const float *up, int64_t n);
// dgate, dup (n,) overwritten
void swiglu_backward(float *dgate, float *dup, const float *dh, const float *gate, const float *up, int64_t n);

// ---- crossentropy.c: fused softmax cross-entropy, and the output head in row chunks ---------------
// logits (n, V) turn into dlogits in place: one row at a time, max, exp-sum, loss, then
// scale * (softmax - onehot(target)). Rows with target < 0 give no loss and zero gradient.
// want_grad = 0 leaves logits as exponentials (scratch) and only returns the loss.
// Returns the summed loss (double); *n_targets (may be NULL) += rows with a target.
double crossentropy_rows(float *logits, const int32_t *targets, int n, int V, float scale, int want_grad,
                         int64_t *n_targets);
// The output head and the loss over T rows, chunk rows at a time so only (chunk, V) logits exist:
//   logits = x (T, C) @ w (V, C)^T;  loss = sum over targets of cross-entropy
// With dx != NULL: dx (T, C) = dlogits @ w (overwritten) and dw (V, C) += dlogits^T @ x.
// scratch (chunk, V). Returns the summed loss; *n_targets (may be NULL) += rows with a target.
double head_loss(float *dx, float *dw, const float *x, const float *w, const int32_t *targets, int T, int C, int V,
                 float scale, float *scratch, int chunk, int64_t *n_targets);
// The same with the head split by vocabulary rows over the tp group (Megatron's vocabulary-parallel
// cross-entropy): w (V, C) is rows [v_begin, v_begin + V) of the whole head, x (T, C) is replicated.
// Per chunk the local logits (n, V), the row max over the group (allreduce MAX of n floats), then
// the exp-sum and the target's logit (0 on the ranks that do not hold it) summed over the group (one
// allreduce SUM of 2n floats): loss = log(sum) + max - target logit, the same on every rank, and
// dlogits = scale * (softmax - onehot) on the local columns. dw (V, C) += dlogits^T @ x is local;
// dx (T, C) = dlogits @ w is this rank's part, summed over the group once after the last chunk (one
// allreduce SUM of T*C floats), so dx ends up replicated. scratch: (rows, V) + 3 * rows floats,
// rows = min(chunk, T).
// *loss = the summed loss; *n_targets (may be NULL) += rows with a target. -1 when a collective fails.
int head_loss_vocab_parallel(double *loss, float *dx, float *dw, const float *x, const float *w,
                             const int32_t *targets, int T, int C, int V, int v_begin, float scale, float *scratch,
                             int chunk, int64_t *n_targets, const TpOps *tp);

#endif
