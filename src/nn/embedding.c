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
