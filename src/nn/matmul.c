// matmul.c: the linear layers, row-major through OpenBLAS's cblas_sgemm (see ops.h), except one
// shape OpenBLAS serves badly: backward dX through a narrow weight (the K/V projections).
#include <cblas.h>
#include <stdlib.h>

#include "nn/ops.h"

#if defined(__AVX2__) && defined(__FMA__)
#include "nn/panel_kernel.h"

// dX = dout (T, K) @ w (K, C) with a short inner dimension K (OC <= 128): OpenBLAS packs all T rows
// of dout as one operand panel, which at K = 128 outgrows L2 and runs at ~50% of peak here (bench
// torch_kernels: 0.7x MKL's speed). This kernel keeps a block of dout rows in L2 and one panel of
// w (K x 16 columns, packed once per call) in L1, 6 rows x 16 columns of dX in registers.
enum { SMALLK_MAX = 128, SMALLK_ROWS = 192 };

static int smallk_fits(int C, int K) { return K <= SMALLK_MAX && C % 16 == 0; }

// dx (T, C) (+)= dout (T, K) @ w (K, C); 0 when it ran, -1 when the packing buffer could not be had.
static int smallk_dx(float *dx, const float *dout, const float *w, int T, int C, int K, int acc) {
    float *pack = malloc(sizeof(float) * (size_t)K * C);  // panels: pack[(q * K + k) * 16 + c] = w[k, 16 q + c]
    if (!pack) return -1;
    for (int q0 = 0; q0 < C; q0 += 16)
        for (int k = 0; k < K; k++)
            for (int c = 0; c < 16; c++) pack[((int64_t)q0 * K) + k * 16 + c] = w[(int64_t)k * C + q0 + c];
    for (int r0 = 0; r0 < T; r0 += SMALLK_ROWS) {
        int r1 = r0 + SMALLK_ROWS < T ? r0 + SMALLK_ROWS : T;
        for (int q0 = 0; q0 < C; q0 += 16)
            panel_rows(dx + (int64_t)r0 * C + q0, C, dout + (int64_t)r0 * K, K, r1 - r0, pack + (int64_t)q0 * K, K, acc,
                       NULL);
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
