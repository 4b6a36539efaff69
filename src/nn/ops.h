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

// ---- matmul.c: linear layers through cblas_sgemm -------------------------------------------------
// out (T, OC) = x (T, C) @ w (OC, C)^T, or += when accumulate (a residual connection)
void matmul_forward(float *out, const float *x, const float *w, int T, int C, int OC, int accumulate);
// dx (T, C) = dout (T, OC) @ w (OC, C), or += when accumulate_dx; dx may be NULL.
// dw (OC, C) += dout^T @ x (T, C); dw may be NULL.
void matmul_backward(float *dx, float *dw, const float *dout, const float *x, const float *w, int T, int C, int OC,
                     int accumulate_dx);

// ---- embedding.c: token embedding --------------------------------------------------------------
// out (T, C) = table (V, C)[tokens (T,)]
void embedding_forward(float *out, const int32_t *tokens, const float *table, int T, int C);
// dtable (V, C) += dout (T, C) scattered to the rows of tokens
void embedding_backward(float *dtable, const float *dout, const int32_t *tokens, int T, int C);

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

#endif
