// panel_kernel.h: the one register-blocked product the engine's own kernels share (internal to
// src/nn; AVX2 + FMA builds only): rows of a times one packed panel of 16 columns. With AVX-512 a
// panel row is one register: 12 rows a block, twice the FMA width (a core with full-width AVX-512
// runs the 256-bit kernel at half its peak). Every lane does the same FMAs in the same order in
// either kernel, so the results are the same bit for bit.
//
//   c (rows, 16) = (acc ? c x scale : 0) + a (rows, n) @ panel (n, 16)
//
// panel is packed by the caller, 16 floats per inner index (panel[k * 16 + j]); a's rows are lda
// apart, c's ldc; scale (one factor per row) may be NULL: then c is taken as it is. Users: dX through
// a narrow weight (matmul.c), attention's score products and its rescale + P V (attention_tile.c).
#ifndef BYTESCALE_PANEL_KERNEL_H
#define BYTESCALE_PANEL_KERNEL_H

#include <immintrin.h>
#include <stdint.h>

// nr (<= 6) rows x 16 columns in 12 accumulators, each a value broadcast against the panel's two
// halves. Always inlined with a constant nr, so the accumulators stay in registers.
static inline __attribute__((always_inline)) void panel_micro(float *c, int64_t ldc, const float *a, int64_t lda,
                                                              const float *panel, int n, int acc,
                                                              const float *scale, int nr) {
    __m256 v[6][2];
    for (int r = 0; r < nr; r++) {
        v[r][0] = acc ? _mm256_loadu_ps(c + r * ldc) : _mm256_setzero_ps();
        v[r][1] = acc ? _mm256_loadu_ps(c + r * ldc + 8) : _mm256_setzero_ps();
        if (acc && scale) {
            __m256 s = _mm256_broadcast_ss(scale + r);
            v[r][0] = _mm256_mul_ps(v[r][0], s);
            v[r][1] = _mm256_mul_ps(v[r][1], s);
        }
    }
    for (int k = 0; k < n; k++) {
        __m256 b0 = _mm256_loadu_ps(panel + k * 16), b1 = _mm256_loadu_ps(panel + k * 16 + 8);
        for (int r = 0; r < nr; r++) {
            __m256 x = _mm256_broadcast_ss(a + r * lda + k);
            v[r][0] = _mm256_fmadd_ps(x, b0, v[r][0]);
            v[r][1] = _mm256_fmadd_ps(x, b1, v[r][1]);
        }
    }
    for (int r = 0; r < nr; r++) {
        _mm256_storeu_ps(c + r * ldc, v[r][0]);
        _mm256_storeu_ps(c + r * ldc + 8, v[r][1]);
    }
}

#if defined(__AVX512F__)
// nr (<= 12) rows x 16 columns in nr accumulators, each a value broadcast against the whole panel row.
static inline __attribute__((always_inline)) void panel_micro512(float *c, int64_t ldc, const float *a, int64_t lda,
                                                                 const float *panel, int n, int acc,
                                                                 const float *scale, int nr) {
    __m512 v[12];
    for (int r = 0; r < nr; r++) {
        v[r] = acc ? _mm512_loadu_ps(c + r * ldc) : _mm512_setzero_ps();
        if (acc && scale) v[r] = _mm512_mul_ps(v[r], _mm512_set1_ps(scale[r]));
    }
    for (int k = 0; k < n; k++) {
        __m512 b = _mm512_loadu_ps(panel + k * 16);
        for (int r = 0; r < nr; r++) v[r] = _mm512_fmadd_ps(_mm512_set1_ps(a[r * lda + k]), b, v[r]);
    }
    for (int r = 0; r < nr; r++) _mm512_storeu_ps(c + r * ldc, v[r]);
}

#define PANEL_MICRO panel_micro512
#define PANEL_BLOCK 12
#else
#define PANEL_MICRO panel_micro
#define PANEL_BLOCK 6
#endif

// Every row of c against the panel: blocks of PANEL_BLOCK, then one of 6 where that many are left,
// then the rest at its own constant nr.
static inline void panel_rows(float *c, int64_t ldc, const float *a, int64_t lda, int rows, const float *panel, int n,
                              int acc, const float *scale) {
    int r = 0;
    for (; r + PANEL_BLOCK <= rows; r += PANEL_BLOCK)
        PANEL_MICRO(c + r * ldc, ldc, a + r * lda, lda, panel, n, acc, scale ? scale + r : NULL, PANEL_BLOCK);
    if (PANEL_BLOCK > 6 && r + 6 <= rows) {
        PANEL_MICRO(c + r * ldc, ldc, a + r * lda, lda, panel, n, acc, scale ? scale + r : NULL, 6);
        r += 6;
    }
    float *cr = c + r * ldc;
    const float *ar = a + r * lda, *sr = scale ? scale + r : NULL;
    switch (rows - r) {
    case 5: PANEL_MICRO(cr, ldc, ar, lda, panel, n, acc, sr, 5); break;
    case 4: PANEL_MICRO(cr, ldc, ar, lda, panel, n, acc, sr, 4); break;
    case 3: PANEL_MICRO(cr, ldc, ar, lda, panel, n, acc, sr, 3); break;
    case 2: PANEL_MICRO(cr, ldc, ar, lda, panel, n, acc, sr, 2); break;
    case 1: PANEL_MICRO(cr, ldc, ar, lda, panel, n, acc, sr, 1); break;
    default: break;
    }
}

#endif
