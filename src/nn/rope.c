// rope.c: rotary position embedding on global positions (see ops.h).
// Every token carries its position in the whole document, so a chunk of a long sequence held by
// one ring member is rotated exactly as the same rows of the full sequence would be.
#include <math.h>

#include "nn/ops.h"

void rope_tables(float *cos_t, float *sin_t, const int32_t *pos, int T, int head_dim, double theta) {
    int half = head_dim / 2;
    for (int i = 0; i < half; i++) {
        double freq = pow(theta, -2.0 * i / head_dim);
        for (int t = 0; t < T; t++) {
            // double: at position 1e6 a float angle would be off by ~0.03 rad
            double a = (double)pos[t] * freq;
            cos_t[(size_t)t * half + i] = (float)cos(a);
            sin_t[(size_t)t * half + i] = (float)sin(a);
        }
    }
}

// Rotate every pair (x0, x1) by the angle whose cosine is c and sine is s*sign.
static void rope_rotate(float *x, const float *cos_t, const float *sin_t, int T, int n_heads, int head_dim,
                        float sign) {
    int half = head_dim / 2;
    for (int t = 0; t < T; t++) {
        const float *c = cos_t + (size_t)t * half, *s = sin_t + (size_t)t * half;
        for (int h = 0; h < n_heads; h++) {
            float *v = x + ((size_t)t * n_heads + h) * head_dim;
            for (int i = 0; i < half; i++) {
                float x0 = v[2 * i], x1 = v[2 * i + 1], si = sign * s[i];
                v[2 * i] = x0 * c[i] - x1 * si;
                v[2 * i + 1] = x0 * si + x1 * c[i];
            }
        }
    }
}

void rope_forward(float *x, const float *cos_t, const float *sin_t, int T, int n_heads, int head_dim) {
    rope_rotate(x, cos_t, sin_t, T, n_heads, head_dim, 1.0f);
}

void rope_backward(float *dx, const float *cos_t, const float *sin_t, int T, int n_heads, int head_dim) {
    rope_rotate(dx, cos_t, sin_t, T, n_heads, head_dim, -1.0f);
}
