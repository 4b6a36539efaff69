// attention_tile.h: the elementwise parts of blockwise attention, one score tile at a time
// (private to src/nn/attention*.c).
//
// A tile holds `rows` stacked query rows x `cols` keys with row stride ld. The stacked rows are
// (head, query) pairs, head-major: tile row hh * nq + i belongs to query row i of the block, so all
// heads that share a K/V head go through one matmul. Scores are kept in base 2 (the query was
// pre-multiplied by log2(e) / sqrt(head_dim)), so every exponential is an exp2.
// With AVX2 + FMA these run 8 lanes at a time (attention_tile.c); otherwise plain C.
#ifndef BYTESCALE_ATTENTION_TILE_H
#define BYTESCALE_ATTENTION_TILE_H

#include <stdint.h>

// 2^x for n values, in place: relative error ~2e-7; x < -126.5 (and -inf) gives exactly 0 (the
// results there would be below 2^-126, far under anything a softmax keeps).
void attn_exp2_inplace(float *x, int n);

// Set s[row, j] = -inf where query i (of the row) may not see key j:
// kseg[j] != qseg[i] || kpos[j] > qpos[i].     s: (n_heads_stacked * nq, cols) with stride ld
void attn_tile_mask(float *s, int n_heads_stacked, int nq, int cols, int ld, const int32_t *qpos,
                    const int32_t *qseg, const int32_t *kpos, const int32_t *kseg);

// One online-softmax step over a tile of base-2 scores s (rows, cols).
// Per row: m_new = max(m, max_j s); s <- 2^(s - m_new); l <- l * 2^(m - m_new) + sum_j s;
// alpha[row] = 2^(m - m_new) (the factor the caller applies to its output accumulator); m <- m_new.
// A row whose scores are all -inf and whose m is -inf stays at m = -inf, l = 0, s = 0, alpha = 1.
void attn_tile_softmax_step(float *s, int rows, int cols, int ld, float *m, float *l, float *alpha);

// s <- 2^(s + bias[row]) for every row: probabilities recomputed from a saved log-sum-exp
// (bias = -lse * log2 e; bias = -inf makes a row all zero).
void attn_tile_exp2_bias(float *s, int rows, int cols, int ld, const float *bias);

// dp <- p * (dp - delta[row]): the softmax backward, dS = P o (dP - delta).
void attn_tile_dsoftmax(float *dp, const float *p, int rows, int cols, int ld, const float *delta);

// s (rows, cols; row stride ld) = a (rows, d; row stride lda) b^T, b (cols, d; row stride ldb): the
// score product Q K^T (and the backward's dO V^T) without a BLAS call. OpenBLAS packs both operands
// and zeroes a beta = 0 output on every call; here b is packed once into kpack (panels of 16 keys,
// at least round16(cols) * d floats) and a is read in place, and s is written, not accumulated.
// Columns up to round16(cols) are written (zeros where b has no row): ld must allow it.
// Defined (ATTN_TILE_QK 1) with AVX2 + FMA only; callers use cblas_sgemm otherwise.
#if defined(__AVX2__) && defined(__FMA__)
#define ATTN_TILE_QK 1
void attn_tile_qk(float *s, int ld, const float *a, int lda, int rows, const float *b, int64_t ldb, int cols, int d,
                  float *kpack);
// acc (rows, d; row stride d) <- acc * alpha[row] + p v, p (rows, cols; row stride ldp), v (cols, d;
// row stride ldv): the forward's rescale and P V in one pass, v packed into vpack (cols * d floats).
// d must be a multiple of 16.
void attn_tile_pv(float *acc, const float *alpha, const float *p, int ldp, int rows, const float *v, int64_t ldv,
                  int cols, int d, float *vpack);
#else
#define ATTN_TILE_QK 0
#endif

#endif
