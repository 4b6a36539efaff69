// test_ops.c: the model's kernels (matmul wrapper, embedding, RMSNorm, RoPE, SwiGLU, fused
// cross-entropy and the chunked head) against naive double references and central finite differences,
// and the vocabulary-parallel embedding and head against the plain ones.
//
// Finite differences: every op is checked through a scalar L = sum(out * R) with a fixed random R
// (or the op's own loss), evaluated in double from the fp32 outputs. With eps = 1e-3 the truncation
// error of a central difference is O(eps^2) ~ 1e-6 for these smooth functions; the rounding of the
// fp32 outputs (relative 6e-8 on each of the <= a few hundred O(1) terms of L) divided by 2 eps gives
// at most ~1e-4. Hence |analytic - numeric| <= 2e-3 + 1e-2 * |numeric| leaves a wide margin while a
// wrong formula (a missing term, a sign, a factor 2) misses it by orders of magnitude.
#include "test_util.h"

#include <math.h>

#include "bytescale/rng.h"
#include "nn/ops.h"

enum { MAXN = 4096 };

static void fill_normal(float *x, int n, Rng *r, double std) {
    for (int i = 0; i < n; i++) x[i] = (float)(std * rng_normal(r));
}

static double dot_d(const float *a, const float *b, int n) {
    double s = 0;
    for (int i = 0; i < n; i++) s += (double)a[i] * b[i];
    return s;
}

// Central difference of f at *p. The step is measured on the float actually stored.
typedef double (*LossFn)(void *ctx);
static double fd_grad(LossFn f, void *ctx, float *p, float eps) {
    float old = *p;
    float hi = old + eps, lo = old - eps;
    *p = hi;
    double lp = f(ctx);
    *p = lo;
    double lm = f(ctx);
    *p = old;
    return (lp - lm) / ((double)hi - (double)lo);
}

#define FD_EPS 1e-3f
#define assert_grad(analytic, numeric) assert_close(analytic, numeric, 1e-2, 2e-3)

// ---- matmul ----------------------------------------------------------------------------------------

typedef struct {
    float *x, *w, *out, *R;
    int T, C, OC;
} MatmulCase;

static double matmul_loss(void *ctx) {
    MatmulCase *c = ctx;
    matmul_forward(c->out, c->x, c->w, c->T, c->C, c->OC, 0);
    return dot_d(c->out, c->R, c->T * c->OC);
}

static void test_matmul_reference_and_gradients(void **state) {
    (void)state;
    Rng rng;
    rng_seed(&rng, 1);
    int T = 5, C = 7, OC = 6;
    static float x[MAXN], w[MAXN], out[MAXN], R[MAXN], dx[MAXN], dw[MAXN], base[MAXN];
    fill_normal(x, T * C, &rng, 1), fill_normal(w, OC * C, &rng, 1), fill_normal(R, T * OC, &rng, 1);
    // forward against a triple loop in double, then accumulate = 1 adds on top of what was there
    matmul_forward(out, x, w, T, C, OC, 0);
    for (int t = 0; t < T; t++)
        for (int o = 0; o < OC; o++) {
            double s = 0;
            for (int c = 0; c < C; c++) s += (double)x[t * C + c] * w[o * C + c];
            assert_close(out[t * OC + o], s, 1e-5, 1e-5);
        }
    memcpy(base, out, sizeof(float) * T * OC);
    matmul_forward(out, x, w, T, C, OC, 1);
    for (int i = 0; i < T * OC; i++) assert_close(out[i], 2 * base[i], 1e-6, 1e-6);

    // backward: dx overwritten (pre-filled with garbage), dw accumulated onto a known offset
    for (int i = 0; i < T * C; i++) dx[i] = 123.0f;
    for (int i = 0; i < OC * C; i++) dw[i] = 0.5f;
    matmul_backward(dx, dw, R, x, w, T, C, OC, 0);
    MatmulCase mc = {x, w, out, R, T, C, OC};
    for (int i = 0; i < T * C; i++) assert_grad(dx[i], fd_grad(matmul_loss, &mc, &x[i], FD_EPS));
    for (int i = 0; i < OC * C; i++) assert_grad(dw[i] - 0.5f, fd_grad(matmul_loss, &mc, &w[i], FD_EPS));
    // accumulate_dx = 1 adds the same gradient again
    memcpy(base, dx, sizeof(float) * T * C);
    matmul_backward(dx, NULL, R, x, w, T, C, OC, 1);
    for (int i = 0; i < T * C; i++) assert_close(dx[i], 2 * base[i], 1e-6, 1e-6);
}

// Backward dX on the shapes matmul.c computes itself (C a multiple of 16, OC <= 128: row counts not a
// multiple of its 6-row and 192-row blocks) and beside them (OC 129: OpenBLAS), against a double loop:
// overwritten when accumulate_dx = 0 (dx pre-filled with NaN), added onto what is there when 1.
static void test_matmul_dx_narrow_weights(void **state) {
    (void)state;
    const int shapes[][3] = {{13, 32, 5}, {200, 48, 128}, {1, 16, 1}, {7, 16, 129}, {385, 64, 64}};
    Rng rng;
    rng_seed(&rng, 5);
    for (int sh = 0; sh < 5; sh++) {
        int T = shapes[sh][0], C = shapes[sh][1], OC = shapes[sh][2];
        float *w = malloc(sizeof(float) * OC * C), *R = malloc(sizeof(float) * T * OC);
        float *dx = malloc(sizeof(float) * T * C);
        assert_non_null(w), assert_non_null(R), assert_non_null(dx);
        fill_normal(w, OC * C, &rng, 1), fill_normal(R, T * OC, &rng, 1);
        for (int acc = 0; acc < 2; acc++) {
            for (int i = 0; i < T * C; i++) dx[i] = acc ? 0.25f * (float)(i % 7) : NAN;
            matmul_backward(dx, NULL, R, NULL, w, T, C, OC, acc);
            for (int t = 0; t < T; t++)
                for (int c = 0; c < C; c++) {
                    double s = acc ? 0.25 * ((t * C + c) % 7) : 0;
                    for (int o = 0; o < OC; o++) s += (double)R[t * OC + o] * w[o * C + c];
                    assert_close(dx[t * C + c], s, 1e-5, 1e-5);
                }
        }
        free(w), free(R), free(dx);
    }
}

// ---- embedding -------------------------------------------------------------------------------------

typedef struct {
    float *table, *out, *R;
    const int32_t *tok;
    int T, C;
} EmbCase;

static double emb_loss(void *ctx) {
    EmbCase *c = ctx;
    embedding_forward(c->out, c->tok, c->table, c->T, c->C);
    return dot_d(c->out, c->R, c->T * c->C);
}

static void test_embedding_gradients(void **state) {
    (void)state;
    Rng rng;
    rng_seed(&rng, 2);
    int V = 9, C = 4, T = 8;
    const int32_t tok[8] = {3, 1, 3, 8, 0, 3, 1, 5};  // repeats: their gradients must add up
    static float table[MAXN], out[MAXN], R[MAXN], dtable[MAXN];
    fill_normal(table, V * C, &rng, 1), fill_normal(R, T * C, &rng, 1);
    embedding_forward(out, tok, table, T, C);
    for (int t = 0; t < T; t++) assert_memory_equal(out + t * C, table + tok[t] * C, sizeof(float) * C);
    memset(dtable, 0, sizeof dtable);
    embedding_backward(dtable, R, tok, T, C);
    EmbCase ec = {table, out, R, tok, T, C};
    for (int i = 0; i < V * C; i++) assert_grad(dtable[i], fd_grad(emb_loss, &ec, &table[i], FD_EPS));
}

// ---- RMSNorm ---------------------------------------------------------------------------------------

typedef struct {
    float *x, *w, *out, *rstd, *R;
    int T, C;
    float eps;
} NormCase;

static double norm_loss(void *ctx) {
    NormCase *c = ctx;
    rmsnorm_forward(c->out, c->rstd, c->x, c->w, c->T, c->C, c->eps);
    return dot_d(c->out, c->R, c->T * c->C);
}

static void test_rmsnorm_reference_and_gradients(void **state) {
    (void)state;
    Rng rng;
    rng_seed(&rng, 3);
    int T = 4, C = 16;
    float eps = 1e-5f;
    static float x[MAXN], w[MAXN], out[MAXN], rstd[MAXN], R[MAXN], dx[MAXN], dw[MAXN];
    fill_normal(x, T * C, &rng, 1.5), fill_normal(R, T * C, &rng, 1);
    for (int c = 0; c < C; c++) w[c] = (float)(1 + 0.3 * rng_normal(&rng));
    rmsnorm_forward(out, rstd, x, w, T, C, eps);
    for (int t = 0; t < T; t++) {
        double ms = 0;
        for (int c = 0; c < C; c++) ms += (double)x[t * C + c] * x[t * C + c] / C;
        for (int c = 0; c < C; c++) assert_close(out[t * C + c], x[t * C + c] / sqrt(ms + eps) * w[c], 1e-5, 1e-6);
    }
    // backward adds into dx: start from a known offset and take it off again
    for (int i = 0; i < T * C; i++) dx[i] = 1.0f;
    memset(dw, 0, sizeof dw);
    rmsnorm_backward(dx, dw, R, x, rstd, w, T, C);
    NormCase nc = {x, w, out, rstd, R, T, C, eps};
    for (int i = 0; i < T * C; i++) assert_grad(dx[i] - 1.0f, fd_grad(norm_loss, &nc, &x[i], FD_EPS));
    for (int c = 0; c < C; c++) assert_grad(dw[c], fd_grad(norm_loss, &nc, &w[c], FD_EPS));
}

// ---- RoPE ------------------------------------------------------------------------------------------

typedef struct {
    float *x, *out, *cs, *sn, *R;
    int T, H, hd;
} RopeCase;

static double rope_loss(void *ctx) {
    RopeCase *c = ctx;
    memcpy(c->out, c->x, sizeof(float) * c->T * c->H * c->hd);
    rope_forward(c->out, c->cs, c->sn, c->T, c->H, c->hd);
    return dot_d(c->out, c->R, c->T * c->H * c->hd);
}

static void test_rope_reference_and_gradients(void **state) {
    (void)state;
    Rng rng;
    rng_seed(&rng, 4);
    int T = 6, H = 3, hd = 8, n = T * H * hd;
    double theta = 10000;
    // global positions as a ring member's chunk has them: large and not starting at 0
    int32_t pos[6] = {0, 1, 777, 65536, 1000000, 2097151};
    static float x[MAXN], out[MAXN], cs[MAXN], sn[MAXN], R[MAXN], dx[MAXN];
    fill_normal(x, n, &rng, 1), fill_normal(R, n, &rng, 1);
    rope_tables(cs, sn, pos, T, hd, theta);
    memcpy(out, x, sizeof(float) * n);
    rope_forward(out, cs, sn, T, H, hd);
    // reference: rotate each pair by pos * theta^(-2i/hd), all in double
    for (int t = 0; t < T; t++)
        for (int h = 0; h < H; h++)
            for (int i = 0; i < hd / 2; i++) {
                double a = pos[t] * pow(theta, -2.0 * i / hd);
                const float *v = x + (t * H + h) * hd + 2 * i;
                const float *o = out + (t * H + h) * hd + 2 * i;
                assert_close(o[0], v[0] * cos(a) - v[1] * sin(a), 0, 1e-5);
                assert_close(o[1], v[0] * sin(a) + v[1] * cos(a), 0, 1e-5);
            }
    // backward is the inverse rotation: rope_backward(rope_forward(x)) == x
    rope_backward(out, cs, sn, T, H, hd);
    for (int i = 0; i < n; i++) assert_close(out[i], x[i], 0, 1e-5);
    memcpy(dx, R, sizeof(float) * n);
    rope_backward(dx, cs, sn, T, H, hd);
    RopeCase rc = {x, out, cs, sn, R, T, H, hd};
    for (int i = 0; i < n; i++) assert_grad(dx[i], fd_grad(rope_loss, &rc, &x[i], FD_EPS));
}

// What makes RoPE a relative encoding: <rope(q, p1), rope(k, p2)> depends only on p1 - p2. So a
// chunk attending with global positions scores exactly as inside the full document.
static void test_rope_scores_depend_on_distance_only(void **state) {
    (void)state;
    Rng rng;
    rng_seed(&rng, 5);
    int hd = 64;
    float q[64], k[64];
    fill_normal(q, hd, &rng, 1), fill_normal(k, hd, &rng, 1);
    for (int trial = 0; trial < 50; trial++) {
        int32_t p1 = (int32_t)rng_below(&rng, 4096), d = (int32_t)rng_below(&rng, 4096);
        int32_t shift = (int32_t)rng_below(&rng, 4096);
        int32_t pos[4] = {p1 + d, p1, p1 + d + shift, p1 + shift};
        float cs[4 * 32], sn[4 * 32], rot[4][64];
        rope_tables(cs, sn, pos, 4, hd, 10000.0);
        for (int r = 0; r < 4; r++) {
            memcpy(rot[r], r % 2 == 0 ? q : k, sizeof q);
            rope_forward(rot[r], cs + r * 32, sn + r * 32, 1, 1, hd);
        }
        assert_close(dot_d(rot[0], rot[1], hd), dot_d(rot[2], rot[3], hd), 0, 1e-3);
    }
}

// ---- SwiGLU ----------------------------------------------------------------------------------------

typedef struct {
    float *gate, *up, *h, *R;
    int n;
} SwigluCase;

static double swiglu_loss(void *ctx) {
    SwigluCase *c = ctx;
    swiglu_forward(c->h, c->gate, c->up, c->n);
    return dot_d(c->h, c->R, c->n);
}

static void test_swiglu_reference_and_gradients(void **state) {
    (void)state;
    Rng rng;
    rng_seed(&rng, 6);
    int n = 200;
    static float gate[MAXN], up[MAXN], h[MAXN], R[MAXN], dg[MAXN], du[MAXN];
    fill_normal(gate, n, &rng, 3), fill_normal(up, n, &rng, 1), fill_normal(R, n, &rng, 1);
    swiglu_forward(h, gate, up, n);
    for (int i = 0; i < n; i++) assert_close(h[i], gate[i] / (1 + exp(-(double)gate[i])) * up[i], 1e-5, 1e-6);
    swiglu_backward(dg, du, R, gate, up, n);
    SwigluCase sc = {gate, up, h, R, n};
    for (int i = 0; i < n; i++) {
        assert_grad(dg[i], fd_grad(swiglu_loss, &sc, &gate[i], FD_EPS));
        assert_grad(du[i], fd_grad(swiglu_loss, &sc, &up[i], FD_EPS));
    }
}

// ---- fused cross-entropy and the chunked head ------------------------------------------------------

// -log softmax(logits)[target] in double, the textbook way
static double naive_ce(const float *logits, int V, int target) {
    double mx = logits[0], s = 0;
    for (int j = 1; j < V; j++) mx = logits[j] > mx ? logits[j] : mx;
    for (int j = 0; j < V; j++) s += exp((double)logits[j] - mx);
    return mx + log(s) - logits[target];
}

static void test_crossentropy_rows_reference(void **state) {
    (void)state;
    Rng rng;
    rng_seed(&rng, 7);
    int n = 6, V = 50;
    int32_t tgt[6] = {3, -1, 49, 0, -1, 17};
    static float logits[MAXN], work[MAXN];
    fill_normal(logits, n * V, &rng, 4);
    logits[2 * V + 49] = 60.0f;  // a large logit: the max subtraction must keep exp finite
    memcpy(work, logits, sizeof(float) * n * V);
    int64_t nt = 0;
    float scale = 0.25f;
    double loss = crossentropy_rows(work, tgt, n, V, scale, 1, &nt);
    double ref = 0;
    for (int r = 0; r < n; r++)
        if (tgt[r] >= 0) ref += naive_ce(logits + r * V, V, tgt[r]);
    assert_int_equal(nt, 4);
    assert_close(loss, ref, 1e-6, 1e-6);
    // dlogits = scale * d(loss)/d(logits), checked by finite differences of the naive loss (double);
    // rows without a target must get exactly zero
    for (int r = 0; r < n; r++)
        for (int j = 0; j < V; j++) {
            float *l = &logits[r * V + j], old = *l;
            double num = 0;
            if (tgt[r] >= 0) {
                *l = old + FD_EPS;
                double lp = naive_ce(logits + r * V, V, tgt[r]);
                *l = old - FD_EPS;
                double lm = naive_ce(logits + r * V, V, tgt[r]);
                *l = old;
                num = (lp - lm) / (2.0 * FD_EPS);
                assert_close(work[r * V + j], scale * num, 1e-3, 1e-6);
            } else {
                assert_true(work[r * V + j] == 0.0f);
            }
        }
    // forward-only returns the same loss
    memcpy(work, logits, sizeof(float) * n * V);
    assert_close(crossentropy_rows(work, tgt, n, V, scale, 0, NULL), ref, 1e-6, 1e-6);
}

typedef struct {
    float *x, *w, *scratch;
    const int32_t *tgt;
    int T, C, V, chunk;
} HeadCase;

static double head_fd_loss(void *ctx) {
    HeadCase *c = ctx;
    return head_loss(NULL, NULL, c->x, c->w, c->tgt, c->T, c->C, c->V, 1.0f, c->scratch, c->chunk, NULL);
}

static void test_head_loss_chunks_reference_and_gradients(void **state) {
    (void)state;
    Rng rng;
    rng_seed(&rng, 8);
    int T = 11, C = 8, V = 30;
    int32_t tgt[11] = {1, 5, -1, 29, 0, 7, 7, -1, 12, 3, 22};
    static float x[MAXN], w[MAXN], scratch[MAXN], logits[64];
    static float dx[MAXN], dw[MAXN], dx1[MAXN], dw1[MAXN];
    fill_normal(x, T * C, &rng, 1), fill_normal(w, V * C, &rng, 0.7);
    // reference loss: logits in double, row by row
    double ref = 0;
    for (int t = 0; t < T; t++) {
        if (tgt[t] < 0) continue;
        for (int v = 0; v < V; v++) logits[v] = (float)dot_d(x + t * C, w + v * C, C);
        ref += naive_ce(logits, V, tgt[t]);
    }
    // every chunk size gives the same loss and gradients (chunk 1: one row at a time)
    int chunks[] = {1, 3, 4, 11};
    for (int ci = 0; ci < 4; ci++) {
        int chunk = chunks[ci];
        memset(dw, 0, sizeof dw);
        int64_t nt = 0;
        double loss = head_loss(dx, dw, x, w, tgt, T, C, V, 1.0f, scratch, chunk, &nt);
        assert_int_equal(nt, 9);
        assert_close(loss, ref, 1e-5, 1e-5);
        if (ci == 0) {
            memcpy(dx1, dx, sizeof dx);
            memcpy(dw1, dw, sizeof dw);
            HeadCase hc = {x, w, scratch, tgt, T, C, V, 4};
            for (int i = 0; i < T * C; i++) assert_grad(dx[i], fd_grad(head_fd_loss, &hc, &x[i], FD_EPS));
            for (int i = 0; i < V * C; i++) assert_grad(dw[i], fd_grad(head_fd_loss, &hc, &w[i], FD_EPS));
        } else {
            for (int i = 0; i < T * C; i++) assert_close(dx[i], dx1[i], 1e-5, 1e-6);
            for (int i = 0; i < V * C; i++) assert_close(dw[i], dw1[i], 1e-5, 1e-6);
        }
    }
    // rows without a target pass no gradient back
    for (int c = 0; c < C; c++) assert_true(dx1[2 * C + c] == 0.0f && dx1[7 * C + c] == 0.0f);
}

// ---- the vocabulary-parallel variants -----------------------------------------------------------------

// A tp group of one: the allreduce leaves its operand as it is and counts the calls.
static int alone_allreduce(void *ctx, float *x, size_t n, int op) {
    (void)x, (void)n, (void)op;
    (*(int *)ctx)++;
    return 0;
}

// The embedding cut into vocabulary ranges: the ranks' outputs add up to the lookup, and their
// gradients are the plain backward's rows, each on the rank that holds it. The head and loss with a
// group of one are the plain head_loss (the exp-sum goes through float once: 1e-6 relative), with
// 2 collectives per chunk and one for dx, and the scratch is exactly min(chunk, T) rows of V + 3
// floats (malloc'd to size, so the sanitizer build sees any overrun).
static void test_vocab_parallel_variants(void **state) {
    (void)state;
    Rng rng;
    rng_seed(&rng, 9);
    int V = 9, C = 4, T = 8;
    const int32_t tok[8] = {3, 1, 3, 8, 0, 3, 1, 5};
    static float table[MAXN], out[MAXN], part[MAXN], R[MAXN], dtable[MAXN], dpart[MAXN];
    fill_normal(table, V * C, &rng, 1), fill_normal(R, T * C, &rng, 1);
    embedding_forward(out, tok, table, T, C);
    memset(dtable, 0, sizeof dtable);
    embedding_backward(dtable, R, tok, T, C);
    const int cut[4] = {0, 2, 6, 9};  // three ranks of unequal ranges: the kernels do not care
    static float sum[MAXN];
    memset(sum, 0, sizeof sum);
    for (int r = 0; r < 3; r++) {
        int vb = cut[r], vn = cut[r + 1] - cut[r];
        embedding_forward_vocab(part, tok, table + vb * C, T, C, vb, vn);
        for (int i = 0; i < T * C; i++) sum[i] += part[i];
        memset(dpart, 0, sizeof dpart);
        embedding_backward_vocab(dpart, R, tok, T, C, vb, vn);
        assert_memory_equal(dpart, dtable + vb * C, sizeof(float) * (size_t)(vn * C));
    }
    assert_memory_equal(sum, out, sizeof(float) * (size_t)(T * C));

    int HT = 11, HV = 30;
    int32_t tgt[11] = {1, 5, -1, 29, 0, 7, 7, -1, 12, 3, 22};
    static float x[MAXN], w[MAXN], scratch[MAXN], dx[MAXN], dw[MAXN], dx1[MAXN], dw1[MAXN];
    fill_normal(x, HT * C, &rng, 1), fill_normal(w, HV * C, &rng, 0.7);
    int chunks[] = {1, 4, 11, 64};
    for (int ci = 0; ci < 4; ci++) {
        int chunk = chunks[ci], rows = chunk < HT ? chunk : HT, calls = 0;
        memset(dw, 0, sizeof dw), memset(dw1, 0, sizeof dw1);
        int64_t nt = 0, nt1 = 0;
        double ref = head_loss(dx1, dw1, x, w, tgt, HT, C, HV, 0.5f, scratch, chunk, &nt1), loss;
        float *scr = malloc(sizeof(float) * (size_t)(rows * (HV + 3)));
        TpOps one = {.allreduce = alone_allreduce, .ctx = &calls};
        int rc = head_loss_vocab_parallel(&loss, dx, dw, x, w, tgt, HT, C, HV, 0, 0.5f, scr, chunk, &nt, &one);
        assert_int_equal(rc, 0);
        assert_int_equal(calls, 2 * ((HT + chunk - 1) / chunk) + 1);
        assert_int_equal(nt, nt1);
        assert_close(loss, ref, 1e-6, 0);
        for (int i = 0; i < HT * C; i++) assert_close(dx[i], dx1[i], 1e-5, 1e-6);
        for (int i = 0; i < HV * C; i++) assert_close(dw[i], dw1[i], 1e-5, 1e-6);
        // forward only: the same loss, dx untouched
        double l2;
        rc = head_loss_vocab_parallel(&l2, NULL, NULL, x, w, tgt, HT, C, HV, 0, 1.0f, scr, chunk, NULL, &one);
        assert_int_equal(rc, 0);
        assert_close(l2, ref, 1e-6, 0);
        free(scr);
    }
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_matmul_reference_and_gradients),
        cmocka_unit_test(test_matmul_dx_narrow_weights),
        cmocka_unit_test(test_embedding_gradients),
        cmocka_unit_test(test_rmsnorm_reference_and_gradients),
        cmocka_unit_test(test_rope_reference_and_gradients),
        cmocka_unit_test(test_rope_scores_depend_on_distance_only),
        cmocka_unit_test(test_swiglu_reference_and_gradients),
        cmocka_unit_test(test_crossentropy_rows_reference),
        cmocka_unit_test(test_head_loss_chunks_reference_and_gradients),
        cmocka_unit_test(test_vocab_parallel_variants),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
