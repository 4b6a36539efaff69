// matmul.c: the linear layers, row-major through OpenBLAS's cblas_sgemm (see ops.h).
#include <cblas.h>

#include "nn/ops.h"

void matmul_forward(float *out, const float *x, const float *w, int T, int C, int OC, int accumulate) {
    if (T <= 0 || OC <= 0) return;
    // out (T, OC) = x (T, C) @ w^T, w stored (OC, C)
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, T, OC, C, 1.0f, x, C, w, C, accumulate ? 1.0f : 0.0f, out,
                OC);
}

void matmul_backward(float *dx, float *dw, const float *dout, const float *x, const float *w, int T, int C, int OC,
                     int accumulate_dx) {
    if (T <= 0) return;
    if (dx) {
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
