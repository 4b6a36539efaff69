// crossentropy.c: fused softmax cross-entropy and the output head in row chunks (see ops.h).
// Full logits for a long sequence with a 50K vocabulary would be gigabytes, so the head runs
// chunk rows at a time: logits of the chunk, loss and dlogits in place, then the two matmuls.
#include <math.h>

#include "nn/ops.h"

double crossentropy_rows(float *logits, const int32_t *targets, int n, int V, float scale, int want_grad,
                         int64_t *n_targets) {
    double loss = 0;
    for (int r = 0; r < n; r++) {
        float *l = logits + (size_t)r * V;
        int tgt = targets[r];
        if (tgt < 0) {
            // no next token known: no loss, and nothing flows back
            if (want_grad)
                for (int j = 0; j < V; j++) l[j] = 0.0f;
            continue;
        }
        float mx = l[0];
        for (int j = 1; j < V; j++) mx = l[j] > mx ? l[j] : mx;
        float lt = l[tgt];
        double sum = 0;
        for (int j = 0; j < V; j++) {
            l[j] = expf(l[j] - mx);
            sum += l[j];
        }
        loss += log(sum) + mx - lt;  // -log softmax(target)
        if (n_targets) (*n_targets)++;
        if (!want_grad) continue;
        float inv = (float)(1.0 / sum);
        for (int j = 0; j < V; j++) l[j] = scale * l[j] * inv;
        l[tgt] -= scale;
    }
    return loss;
}

double head_loss(float *dx, float *dw, const float *x, const float *w, const int32_t *targets, int T, int C, int V,
                 float scale, float *scratch, int chunk, int64_t *n_targets) {
    double loss = 0;
    for (int r0 = 0; r0 < T; r0 += chunk) {
        int n = T - r0 < chunk ? T - r0 : chunk;
        const float *xc = x + (size_t)r0 * C;
        // logits (n, V)
        matmul_forward(scratch, xc, w, n, C, V, 0);
        loss += crossentropy_rows(scratch, targets + r0, n, V, scale, dx != NULL, n_targets);
        // scratch now holds dlogits (n, V)
        if (dx) matmul_backward(dx + (size_t)r0 * C, dw, scratch, xc, w, n, C, V, 0);
    }
    return loss;
}
