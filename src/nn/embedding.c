// embedding.c: token embedding lookup and its scatter-add backward (see ops.h).
#include <string.h>

#include "nn/ops.h"

void embedding_forward(float *out, const int32_t *tokens, const float *table, int T, int C) {
    for (int t = 0; t < T; t++) memcpy(out + (size_t)t * C, table + (size_t)tokens[t] * C, (size_t)C * sizeof(float));
}

void embedding_backward(float *dtable, const float *dout, const int32_t *tokens, int T, int C) {
    // a token that occurs several times collects the sum of its rows' gradients
    for (int t = 0; t < T; t++) {
        float *row = dtable + (size_t)tokens[t] * C;
        const float *d = dout + (size_t)t * C;
        for (int c = 0; c < C; c++) row[c] += d[c];
    }
}

void embedding_forward_vocab(float *out, const int32_t *tokens, const float *table, int T, int C, int v_begin, int V) {
    for (int t = 0; t < T; t++) {
        int row = tokens[t] - v_begin;
        float *o = out + (size_t)t * C;
        if (row >= 0 && row < V)
            memcpy(o, table + (size_t)row * C, (size_t)C * sizeof(float));
        else
            memset(o, 0, (size_t)C * sizeof(float));  // another rank's row: it adds it in the SUM
    }
}

void embedding_backward_vocab(float *dtable, const float *dout, const int32_t *tokens, int T, int C, int v_begin,
                              int V) {
    for (int t = 0; t < T; t++) {
        int row = tokens[t] - v_begin;
        if (row < 0 || row >= V) continue;  // that row's gradient is the rank that holds it's
        float *r = dtable + (size_t)row * C;
        const float *d = dout + (size_t)t * C;
        for (int c = 0; c < C; c++) r[c] += d[c];
    }
}
