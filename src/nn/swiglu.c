// swiglu.c: the SwiGLU gate of the MLP, h = silu(gate) * up with silu(g) = g * sigmoid(g) (see ops.h).
#include <math.h>

#include "nn/ops.h"

void swiglu_forward(float *h, const float *gate, const float *up, int64_t n) {
    for (int64_t i = 0; i < n; i++) {
        float g = gate[i];
        h[i] = g / (1.0f + expf(-g)) * up[i];
    }
}

// d silu / d g = s + g * s * (1 - s) with s = sigmoid(g)
void swiglu_backward(float *dgate, float *dup, const float *dh, const float *gate, const float *up, int64_t n) {
    for (int64_t i = 0; i < n; i++) {
        float g = gate[i], s = 1.0f / (1.0f + expf(-g)), d = dh[i];
        dgate[i] = d * up[i] * (s + g * s * (1.0f - s));
        dup[i] = d * g * s;
    }
}
