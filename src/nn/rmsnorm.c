// rmsnorm.c: RMSNorm, y = x * rstd * w with rstd = 1 / sqrt(mean(x^2) + eps) (see ops.h).
#include <math.h>

#include "nn/ops.h"

void rmsnorm_forward(float *out, float *rstd, const float *x, const float *w, int T, int C, float eps) {
    for (int t = 0; t < T; t++) {
        const float *xt = x + (size_t)t * C;
        float *ot = out + (size_t)t * C;
        double ss = 0;  // double: rows reach thousands of features
        for (int c = 0; c < C; c++) ss += (double)xt[c] * xt[c];
        float r = (float)(1.0 / sqrt(ss / C + eps));
        for (int c = 0; c < C; c++) ot[c] = xt[c] * r * w[c];
        rstd[t] = r;
    }
}

// With g = dout * w:  dx_j = r * (g_j - x_j * r^2 * mean_i(g_i * x_i)),  dw_j += dout_j * x_j * r.
// (r depends on every x_i: d r / d x_j = -r^3 x_j / C.)
void rmsnorm_backward(float *dx, float *dw, const float *dout, const float *x, const float *rstd, const float *w,
                      int T, int C) {
    for (int t = 0; t < T; t++) {
        const float *xt = x + (size_t)t * C, *dt = dout + (size_t)t * C;
        float *dxt = dx + (size_t)t * C;
        float r = rstd[t];
        double gx = 0;
        for (int c = 0; c < C; c++) gx += (double)dt[c] * w[c] * xt[c];
        float k = (float)(gx / C) * r * r;
        for (int c = 0; c < C; c++) {
            dxt[c] += r * (dt[c] * w[c] - xt[c] * k);
            dw[c] += dt[c] * xt[c] * r;
        }
    }
}
