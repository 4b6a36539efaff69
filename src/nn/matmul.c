// matmul.c: the linear layers, row-major through OpenBLAS's cblas_sgemm (see ops.h), except one
// shape OpenBLAS serves badly: backward dX through a narrow weight (the K/V projections).
#include <cblas.h>
#include <stdlib.h>

#include "nn/ops.h"

#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>

// dX = dout (T, K) @ w (K, C) with a short inner dimension K (OC <= 128): OpenBLAS packs all T rows
// of dout as one operand panel, which at K = 128 outgrows L2 and runs at ~50% of peak here (bench
// torch_kernels: 0.7x MKL's speed). This kernel keeps a block of dout rows in L2 and one panel of
// w (K x 16 columns, packed once per call) in L1, 6 rows x 16 columns of dX in registers.
enum { SMALLK_MAX = 128, SMALLK_ROWS = 192 };

static int smallk_fits(int C, int K) { return K <= SMALLK_MAX && C % 16 == 0; }

// nr (<= 6) rows x 16 columns: dx (+)= dout rows (nr, K) times one panel (K, 16).
static inline __attribute__((always_inline)) void smallk_micro(float *dx, int ldx, const float *a, int K,
                                                               const float *panel, int acc, int nr) {
    __m256 c[6][2];
    for (int r = 0; r < nr; r++) {
        c[r][0] = acc ? _mm256_loadu_ps(dx + (int64_t)r * ldx) : _mm256_setzero_ps();
        c[r][1] = acc ? _mm256_loadu_ps(dx + (int64_t)r * ldx + 8) : _mm256_setzero_ps();
    }
    for (int k = 0; k < K; k++) {
        __m256 b0 = _mm256_loadu_ps(panel + k * 16), b1 = _mm256_loadu_ps(panel + k * 16 + 8);
        for (int r = 0; r < nr; r++) {
            __m256 x = _mm256_broadcast_ss(a + (int64_t)r * K + k);
            c[r][0] = _mm256_fmadd_ps(x, b0, c[r][0]);
            c[r][1] = _mm256_fmadd_ps(x, b1, c[r][1]);
        }
    }
    for (int r = 0; r < nr; r++) {
        _mm256_storeu_ps(dx + (int64_t)r * ldx, c[r][0]);
        _mm256_storeu_ps(dx + (int64_t)r * ldx + 8, c[r][1]);
    }
}

// Rows [r0, r1) of dx against one packed panel (columns q0 .. q0+15).
static void smallk_rows(float *dx, const float *dout, const float *panel, int r0, int r1, int C, int K, int q0,
                        int acc) {
    int r = r0;
    for (; r + 6 <= r1; r += 6) smallk_micro(dx + (int64_t)r * C + q0, C, dout + (int64_t)r * K, K, panel, acc, 6);
    float *d = dx + (int64_t)r * C + q0;
    const float *a = dout + (int64_t)r * K;
    switch (r1 - r) {
    case 5: smallk_micro(d, C, a, K, panel, acc, 5); break;
    case 4: smallk_micro(d, C, a, K, panel, acc, 4); break;
    case 3: smallk_micro(d, C, a, K, panel, acc, 3); break;
    case 2: smallk_micro(d, C, a, K, panel, acc, 2); break;
    case 1: smallk_micro(d, C, a, K, panel, acc, 1); break;
    default: break;
    }
}

// dx (T, C) (+)= dout (T, K) @ w (K, C); 0 when it ran, -1 when the packing buffer could not be had.
static int smallk_dx(float *dx, const float *dout, const float *w, int T, int C, int K, int acc) {
    float *pack = malloc(sizeof(float) * (size_t)K * C);  // panels: pack[(q * K + k) * 16 + c] = w[k, 16 q + c]
    if (!pack) return -1;
    for (int q0 = 0; q0 < C; q0 += 16)
        for (int k = 0; k < K; k++)
            for (int c = 0; c < 16; c++) pack[((int64_t)q0 * K) + k * 16 + c] = w[(int64_t)k * C + q0 + c];
    for (int r0 = 0; r0 < T; r0 += SMALLK_ROWS) {
        int r1 = r0 + SMALLK_ROWS < T ? r0 + SMALLK_ROWS : T;
        for (int q0 = 0; q0 < C; q0 += 16) smallk_rows(dx, dout, pack + (int64_t)q0 * K, r0, r1, C, K, q0, acc);
    }
    free(pack);
    return 0;
}
#else
static int smallk_fits(int C, int K) { return (void)C, (void)K, 0; }
static int smallk_dx(float *dx, const float *dout, const float *w, int T, int C, int K, int acc) {
    return (void)dx, (void)dout, (void)w, (void)T, (void)C, (void)K, (void)acc, -1;
}
#endif

void matmul_forward(float *out, const float *x, const float *w, int T, int C, int OC, int accumulate) {
    if (T <= 0 || OC <= 0) return;
    // out (T, OC) = x (T, C) @ w^T, w stored (OC, C)
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, T, OC, C, 1.0f, x, C, w, C, accumulate ? 1.0f : 0.0f, out,
                OC);
}

void matmul_backward(float *dx, float *dw, const float *dout, const float *x, const float *w, int T, int C, int OC,
                     int accumulate_dx) {
    if (T <= 0) return;
    if (dx && !(smallk_fits(C, OC) && smallk_dx(dx, dout, w, T, C, OC, accumulate_dx) == 0)) {
        // dx (T, C) = dout (T, OC) @ w (OC, C)
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, T, C, OC, 1.0f, dout, OC, w, C,
                    accumulate_dx ? 1.0f : 0.0f, dx, C);
    }
    if (dw) {
        // dw (OC, C) += dout^T (OC, T) @ x (T, C)
        cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, OC, C, T, 1.0f, dout, OC, x, C, 1.0f, dw, C);
    }
}

void matmul_backward_dw_rows(float *dw, const float *dout, const float *x, int T, int C, int OC, int o0, int o1) {
    if (T <= 0 || o1 <= o0) return;
    // dw[o0:o1] (o1 - o0, C) += dout[:, o0:o1]^T (o1 - o0, T) @ x (T, C); dout's rows are OC apart
    cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, o1 - o0, C, T, 1.0f, dout + o0, OC, x, C, 1.0f,
                dw + (size_t)o0 * C, C);
}
