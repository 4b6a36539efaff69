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

int head_loss_vocab_parallel(double *loss, float *dx, float *dw, const float *x, const float *w,
                             const int32_t *targets, int T, int C, int V, int v_begin, float scale, float *scratch,
                             int chunk, int64_t *n_targets, const TpOps *tp) {
    *loss = 0;
    // after the logits of the largest chunk: the row max (rows,), then the exp-sum and the target
    // logit side by side (2 * rows), so one allreduce carries both
    int rows = chunk < T ? chunk : T;
    float *mx = scratch + (size_t)rows * V;
    for (int r0 = 0; r0 < T; r0 += chunk) {
        int n = T - r0 < chunk ? T - r0 : chunk;
        const float *xc = x + (size_t)r0 * C;
        const int32_t *tg = targets + r0;
        float *sum = mx + n, *lt = sum + n;
        // local logits (n, V) of this rank's vocabulary rows
        matmul_forward(scratch, xc, w, n, C, V, 0);
        for (int r = 0; r < n; r++) {
            const float *l = scratch + (size_t)r * V;
            float m = l[0];
            for (int j = 1; j < V; j++) m = l[j] > m ? l[j] : m;
            mx[r] = m;
        }
        if (tp->allreduce(tp->ctx, mx, (size_t)n, LLAMA_TP_MAX) != 0) return -1;
        for (int r = 0; r < n; r++) {
            float *l = scratch + (size_t)r * V;
            int local = tg[r] - v_begin;
            sum[r] = 0, lt[r] = 0;
            if (tg[r] < 0) continue;  // no loss: the row's statistics stay 0 on every rank
            if (local >= 0 && local < V) lt[r] = l[local];
            double s = 0;
            for (int j = 0; j < V; j++) {
                l[j] = expf(l[j] - mx[r]);
                s += l[j];
            }
            sum[r] = (float)s;
        }
        if (tp->allreduce(tp->ctx, sum, 2 * (size_t)n, LLAMA_TP_SUM) != 0) return -1;
        for (int r = 0; r < n; r++) {
            float *l = scratch + (size_t)r * V;
            int local = tg[r] - v_begin;
            if (tg[r] < 0) {
                if (dx)
                    for (int j = 0; j < V; j++) l[j] = 0.0f;  // nothing flows back
                continue;
            }
            *loss += log((double)sum[r]) + mx[r] - lt[r];  // -log softmax(target) over the whole vocabulary
            if (n_targets) (*n_targets)++;
            if (!dx) continue;
            float inv = (float)(1.0 / sum[r]);
            for (int j = 0; j < V; j++) l[j] = scale * l[j] * inv;
            if (local >= 0 && local < V) l[local] -= scale;
        }
        // scratch now holds this rank's columns of dlogits (n, V)
        if (dx) matmul_backward(dx + (size_t)r0 * C, dw, scratch, xc, w, n, C, V, 0);
    }
    // each rank's dx is the part through its vocabulary rows: the sum is the whole gradient
    if (dx && tp->allreduce(tp->ctx, dx, (size_t)T * C, LLAMA_TP_SUM) != 0) return -1;
    return 0;
}
