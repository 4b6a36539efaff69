// test_attention.c: the packed blockwise attention kernel against a naive double-precision reference,
// finite differences, and the split-and-merge property ring attention relies on.
#include "test_util.h"

#include <math.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include "bytescale/attention.h"
#include "bytescale/rng.h"
#include "nn/attention_tile.h"

// ---- row sets and test cases -------------------------------------------------------------------

typedef struct {
    int n;
    int32_t *pos;  // (n,)
    int32_t *seg;  // (n,)
} Rows;

static AttnRows view(Rows r) { return (AttnRows){r.pos, r.seg, r.n}; }

static Rows rows_alloc(int n) {
    Rows r = {n, malloc(sizeof(int32_t) * (n ? n : 1)), malloc(sizeof(int32_t) * (n ? n : 1))};
    assert_non_null(r.pos);
    assert_non_null(r.seg);
    return r;
}

static void rows_free(Rows *r) {
    free(r->pos);
    free(r->seg);
}

// A packed micro-batch of n tokens: segments of random length in [1, max_len], each starting at a
// random global position (the chunk of a longer document), segment ids increasing with random gaps.
static Rows pack_random(Rng *rng, int n, int max_len) {
    Rows r = rows_alloc(n);
    int seg = (int)rng_below(rng, 5);
    for (int i = 0; i < n;) {
        int len = 1 + (int)rng_below(rng, (uint64_t)max_len);
        int start = (int)rng_below(rng, 5000);
        for (int t = 0; t < len && i < n; t++, i++) r.pos[i] = start + t, r.seg[i] = seg;
        seg += 1 + (int)rng_below(rng, 3);
    }
    return r;
}

// The rows of r listed in idx (m of them), in that order.
static Rows rows_pick(Rows r, const int *idx, int m) {
    Rows o = rows_alloc(m);
    for (int i = 0; i < m; i++) o.pos[i] = r.pos[idx[i]], o.seg[i] = r.seg[idx[i]];
    return o;
}

static float *randn(Rng *rng, int64_t n, float scale) {
    float *x = malloc(sizeof(float) * (n ? n : 1));
    assert_non_null(x);
    for (int64_t i = 0; i < n; i++) x[i] = (float)rng_normal(rng) * scale;
    return x;
}

static float *zeros(int64_t n) {
    float *x = calloc(n ? n : 1, sizeof(float));
    assert_non_null(x);
    return x;
}

static double *dzeros(int64_t n) {
    double *x = calloc(n ? n : 1, sizeof(double));
    assert_non_null(x);
    return x;
}

// Copy rows idx[0..m) of src (rows of w floats) to dst, and the reverse (adding).
static void gather(float *dst, const float *src, const int *idx, int m, int w) {
    for (int i = 0; i < m; i++) memcpy(dst + (int64_t)i * w, src + (int64_t)idx[i] * w, sizeof(float) * w);
}

static void scatter_add(float *dst, const float *src, const int *idx, int m, int w) {
    for (int i = 0; i < m; i++)
        for (int e = 0; e < w; e++) dst[(int64_t)idx[i] * w + e] += src[(int64_t)i * w + e];
}

typedef struct {
    AttnShape s;
    Rows qr, kr;
    float *q;  // (nq, n_heads, head_dim)
    float *k;  // (nk, n_kv_heads, head_dim)
    float *v;  // (nk, n_kv_heads, head_dim)
} Case;

// q is scaled by qscale: large values make the softmax peaky, so the running max moves between blocks.
static Case case_make(Rng *rng, AttnShape s, Rows qr, Rows kr, float qscale) {
    Case c = {s, qr, kr, NULL, NULL, NULL};
    c.q = randn(rng, (int64_t)qr.n * s.n_heads * s.head_dim, qscale);
    c.k = randn(rng, (int64_t)kr.n * s.n_kv_heads * s.head_dim, 1.0f);
    c.v = randn(rng, (int64_t)kr.n * s.n_kv_heads * s.head_dim, 1.0f);
    return c;
}

static void case_free(Case *c) {
    rows_free(&c->qr);
    rows_free(&c->kr);
    free(c->q);
    free(c->k);
    free(c->v);
}

static int64_t q_size(const Case *c) { return (int64_t)c->qr.n * c->s.n_heads * c->s.head_dim; }
static int64_t kv_size(const Case *c) { return (int64_t)c->kr.n * c->s.n_kv_heads * c->s.head_dim; }

// ---- the naive reference, in double ------------------------------------------------------------

// Probabilities of query row i, head h over every key (0 where hidden); returns the log-sum-exp
// (-inf when no key is visible). p: (nk,)
static double ref_probs(const Case *c, int i, int h, double *p) {
    int D = c->s.head_dim, g = h / (c->s.n_heads / c->s.n_kv_heads);
    const float *qi = c->q + ((int64_t)i * c->s.n_heads + h) * D;
    double mx = -INFINITY;
    for (int j = 0; j < c->kr.n; j++) {
        p[j] = -INFINITY;
        if (c->kr.seg[j] != c->qr.seg[i] || c->kr.pos[j] > c->qr.pos[i]) continue;
        const float *kj = c->k + ((int64_t)j * c->s.n_kv_heads + g) * D;
        double dot = 0;
        for (int e = 0; e < D; e++) dot += (double)qi[e] * kj[e];
        p[j] = dot / sqrt((double)D);
        mx = p[j] > mx ? p[j] : mx;
    }
    if (mx == -INFINITY) {
        for (int j = 0; j < c->kr.n; j++) p[j] = 0;
        return -INFINITY;
    }
    double sum = 0;
    for (int j = 0; j < c->kr.n; j++)
        if (p[j] != -INFINITY) sum += exp(p[j] - mx);
    double lse = mx + log(sum);
    for (int j = 0; j < c->kr.n; j++) p[j] = p[j] == -INFINITY ? 0 : exp(p[j] - lse);
    return lse;
}

// out: (nq, n_heads, head_dim), lse: (nq, n_heads)
static void ref_forward(const Case *c, double *out, double *lse) {
    int H = c->s.n_heads, D = c->s.head_dim, g_of = H / c->s.n_kv_heads;
    double *p = dzeros(c->kr.n);
    for (int i = 0; i < c->qr.n; i++)
        for (int h = 0; h < H; h++) {
            double *o = out + ((int64_t)i * H + h) * D;
            lse[(int64_t)i * H + h] = ref_probs(c, i, h, p);
            for (int e = 0; e < D; e++) o[e] = 0;
            for (int j = 0; j < c->kr.n; j++) {
                if (p[j] == 0) continue;
                const float *vj = c->v + ((int64_t)j * c->s.n_kv_heads + h / g_of) * D;
                for (int e = 0; e < D; e++) o[e] += p[j] * vj[e];
            }
        }
    free(p);
}

// The analytic gradient of sum(out * dout): dq (nq, H, D), dk and dv (nk, Hkv, D), overwritten.
static void ref_backward(const Case *c, const float *dout, double *dq, double *dk, double *dv) {
    int H = c->s.n_heads, Hkv = c->s.n_kv_heads, D = c->s.head_dim, g_of = H / Hkv;
    double scale = 1.0 / sqrt((double)D);
    memset(dq, 0, sizeof(double) * q_size(c));
    memset(dk, 0, sizeof(double) * kv_size(c));
    memset(dv, 0, sizeof(double) * kv_size(c));
    double *p = dzeros(c->kr.n), *dp = dzeros(c->kr.n);
    for (int i = 0; i < c->qr.n; i++)
        for (int h = 0; h < H; h++) {
            int g = h / g_of;
            const float *qi = c->q + ((int64_t)i * H + h) * D, *go = dout + ((int64_t)i * H + h) * D;
            ref_probs(c, i, h, p);
            double delta = 0;  // sum_j p_j dp_j
            for (int j = 0; j < c->kr.n; j++) {
                dp[j] = 0;
                if (p[j] == 0) continue;
                const float *vj = c->v + ((int64_t)j * Hkv + g) * D;
                for (int e = 0; e < D; e++) dp[j] += (double)go[e] * vj[e];
                delta += p[j] * dp[j];
            }
            for (int j = 0; j < c->kr.n; j++) {
                if (p[j] == 0) continue;
                double ds = p[j] * (dp[j] - delta) * scale;
                const float *kj = c->k + ((int64_t)j * Hkv + g) * D;
                double *dqi = dq + ((int64_t)i * H + h) * D, *dkj = dk + ((int64_t)j * Hkv + g) * D;
                double *dvj = dv + ((int64_t)j * Hkv + g) * D;
                for (int e = 0; e < D; e++) {
                    dqi[e] += ds * kj[e];
                    dkj[e] += ds * qi[e];
                    dvj[e] += p[j] * go[e];
                }
            }
        }
    free(p);
    free(dp);
}

// ---- comparisons -------------------------------------------------------------------------------

// Every got[i] within atol + rtol * |want[i]| of want[i]; -inf must match -inf exactly.
static void check_close(const char *what, const float *got, const double *want, int64_t n, double rtol,
                        double atol) {
    for (int64_t i = 0; i < n; i++) {
        if (isinf(want[i]) || isinf(got[i])) {
            if ((double)got[i] != want[i])
                fail_msg("%s[%lld]: got %.9g, want %.9g", what, (long long)i, got[i], want[i]);
            continue;
        }
        double d = fabs((double)got[i] - want[i]);
        if (!(d <= atol + rtol * fabs(want[i])))
            fail_msg("%s[%lld]: got %.9g, want %.9g (|diff| %.3g)", what, (long long)i, got[i], want[i], d);
    }
}

static void check_close_f(const char *what, const float *got, const float *want, int64_t n, double rtol,
                          double atol) {
    double *w = dzeros(n);
    for (int64_t i = 0; i < n; i++) w[i] = want[i];
    check_close(what, got, w, n, rtol, atol);
    free(w);
}

// Kernel forward and backward of one case against the reference; dq/dk/dv start from random
// values to check that attn_backward accumulates (+=) rather than overwrites.
static void check_case(Rng *rng, const Case *c) {
    int64_t nqh = (int64_t)c->qr.n * c->s.n_heads;
    float *out = zeros(q_size(c)), *lse = zeros(nqh), *delta = zeros(nqh);
    double *rout = dzeros(q_size(c)), *rlse = dzeros(nqh);
    attn_forward(out, lse, c->q, view(c->qr), c->k, c->v, view(c->kr), c->s);
    ref_forward(c, rout, rlse);
    check_close("out", out, rout, q_size(c), 1e-4, 2e-5);
    check_close("lse", lse, rlse, nqh, 1e-5, 2e-5);

    float *dout = randn(rng, q_size(c), 1.0f);
    float *dq0 = randn(rng, q_size(c), 1.0f), *dk0 = randn(rng, kv_size(c), 1.0f), *dv0 = randn(rng, kv_size(c), 1.0f);
    float *dq = zeros(q_size(c)), *dk = zeros(kv_size(c)), *dv = zeros(kv_size(c));
    memcpy(dq, dq0, sizeof(float) * q_size(c));
    memcpy(dk, dk0, sizeof(float) * kv_size(c));
    memcpy(dv, dv0, sizeof(float) * kv_size(c));
    attn_backward_delta(delta, dout, out, c->qr.n, c->s);
    attn_backward(dq, dk, dv, dout, lse, delta, c->q, view(c->qr), c->k, c->v, view(c->kr), c->s);
    double *rdq = dzeros(q_size(c)), *rdk = dzeros(kv_size(c)), *rdv = dzeros(kv_size(c));
    ref_backward(c, dout, rdq, rdk, rdv);
    for (int64_t i = 0; i < q_size(c); i++) rdq[i] += dq0[i];
    for (int64_t i = 0; i < kv_size(c); i++) rdk[i] += dk0[i], rdv[i] += dv0[i];
    check_close("dq", dq, rdq, q_size(c), 1e-4, 1e-4);
    check_close("dk", dk, rdk, kv_size(c), 1e-4, 1e-4);
    check_close("dv", dv, rdv, kv_size(c), 1e-4, 1e-4);

    free(out), free(lse), free(delta), free(rout), free(rlse), free(dout);
    free(dq0), free(dk0), free(dv0), free(dq), free(dk), free(dv), free(rdq), free(rdk), free(rdv);
}

// Query rows that see no key at all (brute force).
static int count_blind(Rows q, Rows k) {
    int n = 0;
    for (int i = 0; i < q.n; i++) {
        int seen = 0;
        for (int j = 0; j < k.n && !seen; j++) seen = k.seg[j] == q.seg[i] && k.pos[j] <= q.pos[i];
        n += !seen;
    }
    return n;
}

// ---- tests -------------------------------------------------------------------------------------

static void test_exp2_accuracy(void **state) {
    (void)state;
    // -126 .. 127 in steps that hit many fractional parts, and the special inputs
    int n = 0;
    float *x = zeros(30000);
    double *want = dzeros(30000);
    for (double t = -126.0; t < 127.0; t += 0.00931) x[n] = (float)t, want[n] = exp2((double)(float)t), n++;
    x[n] = -INFINITY, want[n++] = 0;
    x[n] = -127.0f, want[n++] = 0;
    x[n] = -500.0f, want[n++] = 0;
    x[n] = 0.0f, want[n++] = 1;
    x[n] = 1.0f, want[n++] = 2;
    attn_exp2_inplace(x, n);
    check_close("exp2", x, want, n, 4e-7, 0);
    free(x);
    free(want);
}

static void test_forward_backward_match_naive(void **state) {
    (void)state;
    Rng rng;
    rng_seed(&rng, 1);
    const int dims[] = {16, 64, 128}, ratios[] = {1, 2, 4};
    int blind = 0;
    for (int a = 0; a < 3; a++)
        for (int b = 0; b < 3; b++) {
            int D = dims[a], r = ratios[b], hkv = D == 128 ? 1 : 2;  // (sized for the naive reference under ASan)
            AttnShape s = {r * hkv, hkv, D};
            // many segments of 1..300 tokens; keys drop the first 0..2 tokens of every segment, so
            // some queries see no key at all (lse = -inf, out = 0)
            int n = 250 + (int)rng_below(&rng, 250);
            Rows qr = pack_random(&rng, n, 300);
            int *keep = malloc(sizeof(int) * n), nk = 0;
            for (int i = 0, drop = 0; i < n; i++) {
                if (i == 0 || qr.seg[i] != qr.seg[i - 1]) drop = (int)rng_below(&rng, 3);  // a new segment
                if (drop > 0) {
                    drop--;
                    continue;
                }
                keep[nk++] = i;
            }
            Rows kr = rows_pick(qr, keep, nk);
            free(keep);
            blind += count_blind(qr, kr);
            Case c = case_make(&rng, s, qr, kr, a == 1 ? 3.0f : 1.0f);
            check_case(&rng, &c);
            case_free(&c);
        }
    assert_true(blind > 0);  // the no-key case really was exercised
}

static void test_self_attention_long_segments(void **state) {
    (void)state;
    // the model's case: query rows = key rows, one long segment crossing many blocks plus short ones
    Rng rng;
    rng_seed(&rng, 2);
    AttnShape s = {4, 2, 64};
    int n = 520;
    Rows qr = pack_random(&rng, n, 300);
    for (int i = 0; i < 330; i++) qr.pos[i] = 1234 + i, qr.seg[i] = -7;  // negative ids are fine too
    Rows kr = rows_alloc(n);
    memcpy(kr.pos, qr.pos, sizeof(int32_t) * n);
    memcpy(kr.seg, qr.seg, sizeof(int32_t) * n);
    Case c = case_make(&rng, s, qr, kr, 2.0f);
    check_case(&rng, &c);
    case_free(&c);
}

static void test_unusual_shapes(void **state) {
    (void)state;
    // head_dim 1 and 20 (no multiple of 8), the largest head_dim (smaller tiles), odd group sizes,
    // and a group of 260 query heads per K/V head (more than one tile holds: heads are chunked)
    const AttnShape shapes[] = {{1, 1, 1}, {5, 1, 20}, {6, 3, 8}, {2, 1, 256}, {260, 1, 4}};
    Rng rng;
    rng_seed(&rng, 10);
    for (int i = 0; i < 5; i++) {
        int n = shapes[i].n_heads > 100 ? 40 : 150 + (int)rng_below(&rng, 150);
        Rows qr = pack_random(&rng, n, 120);
        Rows kr = rows_alloc(n);
        memcpy(kr.pos, qr.pos, sizeof(int32_t) * n);
        memcpy(kr.seg, qr.seg, sizeof(int32_t) * n);
        Case c = case_make(&rng, shapes[i], qr, kr, 1.0f);
        check_case(&rng, &c);
        case_free(&c);
    }
}

static void test_shuffled_rows(void **state) {
    (void)state;
    // any set of rows in any order: the block classification must stay conservative
    Rng rng;
    rng_seed(&rng, 3);
    for (int trial = 0; trial < 3; trial++) {
        AttnShape s = {2 << trial, 2, 16 << trial};
        int n = 400;
        Rows base = pack_random(&rng, n, 150);
        int *perm = malloc(sizeof(int) * n);
        for (int i = 0; i < n; i++) perm[i] = i;
        for (int i = n - 1; i > 0; i--) {
            int j = (int)rng_below(&rng, (uint64_t)i + 1), t = perm[i];
            perm[i] = perm[j], perm[j] = t;
        }
        Rows qr = rows_pick(base, perm, n);
        // keys: a different shuffle of a random subset
        int m = n / 2 + (int)rng_below(&rng, (uint64_t)n / 2);
        for (int i = n - 1; i > 0; i--) {
            int j = (int)rng_below(&rng, (uint64_t)i + 1), t = perm[i];
            perm[i] = perm[j], perm[j] = t;
        }
        Rows kr = rows_pick(base, perm, m);
        free(perm);
        rows_free(&base);
        Case c = case_make(&rng, s, qr, kr, 1.0f);
        check_case(&rng, &c);
        case_free(&c);
    }
}

// sum(out * w) in double
static double loss_of(const Case *c, const float *w, float *out, float *lse) {
    attn_forward(out, lse, c->q, view(c->qr), c->k, c->v, view(c->kr), c->s);
    double L = 0;
    for (int64_t i = 0; i < q_size(c); i++) L += (double)out[i] * w[i];
    return L;
}

static void test_backward_finite_differences(void **state) {
    (void)state;
    Rng rng;
    rng_seed(&rng, 4);
    AttnShape s = {4, 2, 16};
    Rows qr = pack_random(&rng, 60, 25);
    Rows kr = rows_alloc(qr.n);
    memcpy(kr.pos, qr.pos, sizeof(int32_t) * qr.n);
    memcpy(kr.seg, qr.seg, sizeof(int32_t) * qr.n);
    Case c = case_make(&rng, s, qr, kr, 1.0f);
    int64_t nqh = (int64_t)qr.n * s.n_heads;
    float *w = randn(&rng, q_size(&c), 1.0f), *out = zeros(q_size(&c)), *lse = zeros(nqh), *delta = zeros(nqh);
    float *dq = zeros(q_size(&c)), *dk = zeros(kv_size(&c)), *dv = zeros(kv_size(&c));
    loss_of(&c, w, out, lse);
    attn_backward_delta(delta, w, out, qr.n, s);
    attn_backward(dq, dk, dv, w, lse, delta, c.q, view(c.qr), c.k, c.v, view(c.kr), s);
    // the reference's analytic gradient, itself checked by finite differences in double below
    double *rdq = dzeros(q_size(&c)), *rdk = dzeros(kv_size(&c)), *rdv = dzeros(kv_size(&c));
    ref_backward(&c, w, rdq, rdk, rdv);

    float *tensors[3] = {c.q, c.k, c.v};
    const float *grads[3] = {dq, dk, dv};
    const double *rgrads[3] = {rdq, rdk, rdv};
    int64_t sizes[3] = {q_size(&c), kv_size(&c), kv_size(&c)};
    double *rout = dzeros(q_size(&c)), *rlse = dzeros(nqh);
    for (int t = 0; t < 3; t++)
        for (int trial = 0; trial < 12; trial++) {
            int64_t idx = (int64_t)rng_below(&rng, (uint64_t)sizes[t]);
            float x0 = tensors[t][idx];
            // the float kernel: central difference with a step large enough to beat rounding
            float eps = 1e-2f;
            tensors[t][idx] = x0 + eps;
            double lp = loss_of(&c, w, out, lse);
            tensors[t][idx] = x0 - eps;
            double lm = loss_of(&c, w, out, lse);
            double fd = (lp - lm) / (2.0 * ((double)(x0 + eps) - x0));
            assert_close(grads[t][idx], fd, 1e-2, 2e-3);
            // the double reference: a much tighter check of the gradient formula itself
            double h = 1e-3, ref_lp = 0, ref_lm = 0;
            tensors[t][idx] = (float)(x0 + h);
            double hp = (double)tensors[t][idx] - x0;
            ref_forward(&c, rout, rlse);
            for (int64_t i = 0; i < q_size(&c); i++) ref_lp += rout[i] * w[i];
            tensors[t][idx] = (float)(x0 - h);
            double hm = x0 - (double)tensors[t][idx];
            ref_forward(&c, rout, rlse);
            for (int64_t i = 0; i < q_size(&c); i++) ref_lm += rout[i] * w[i];
            tensors[t][idx] = x0;
            assert_close(rgrads[t][idx], (ref_lp - ref_lm) / (hp + hm), 1e-3, 1e-4);
        }
    free(w), free(out), free(lse), free(delta), free(dq), free(dk), free(dv);
    free(rdq), free(rdk), free(rdv), free(rout), free(rlse);
    case_free(&c);
}

// ---- split and merge ---------------------------------------------------------------------------

// part_of[i] in [0, parts) for every row of a pack, by one of four layouts:
// 0: every row to a random part; 1: contiguous cuts at random places; 2: the symmetric 2D-chunk
// layout (each segment run cut into 2*parts chunks, part i holds chunks i and 2*parts-1-i);
// 3: everything in one part except a few random rows.
static void split_rows(Rng *rng, Rows r, int parts, int layout, int *part_of) {
    if (layout == 0) {
        for (int i = 0; i < r.n; i++) part_of[i] = (int)rng_below(rng, (uint64_t)parts);
    } else if (layout == 1) {
        int cuts[8];
        for (int p = 0; p < parts - 1; p++) cuts[p] = (int)rng_below(rng, (uint64_t)r.n + 1);
        for (int i = 0; i < r.n; i++) {
            part_of[i] = 0;
            for (int p = 0; p < parts - 1; p++) part_of[i] += i >= cuts[p];
        }
    } else if (layout == 2) {
        for (int i0 = 0; i0 < r.n;) {
            int i1 = i0 + 1;
            while (i1 < r.n && r.seg[i1] == r.seg[i0]) i1++;
            int len = i1 - i0, nch = 2 * parts;
            for (int i = i0; i < i1; i++) {
                int ch = (int)((int64_t)(i - i0) * nch / len);  // chunk sizes differ by at most one
                part_of[i] = ch < parts ? ch : nch - 1 - ch;
            }
            i0 = i1;
        }
    } else {
        for (int i = 0; i < r.n; i++)
            part_of[i] = rng_below(rng, 10) == 0 ? 1 + (int)rng_below(rng, (uint64_t)parts - 1) : 0;
    }
}

// Rows of part p: their indices (returns how many).
static int part_rows(const int *part_of, int n, int p, int *idx) {
    int m = 0;
    for (int i = 0; i < n; i++)
        if (part_of[i] == p) idx[m++] = i;
    return m;
}

static void test_split_keys_and_merge(void **state) {
    (void)state;
    Rng rng;
    rng_seed(&rng, 5);
    for (int trial = 0; trial < 12; trial++) {
        int r = 1 << (trial % 3), hkv = 1 + trial % 2, D = trial % 4 == 0 ? 128 : 32;
        AttnShape s = {r * hkv, hkv, D};
        int n = 300 + (int)rng_below(&rng, 500);
        Rows qr = pack_random(&rng, n, 300);
        Rows kr = rows_alloc(n);
        memcpy(kr.pos, qr.pos, sizeof(int32_t) * n);
        memcpy(kr.seg, qr.seg, sizeof(int32_t) * n);
        Case c = case_make(&rng, s, qr, kr, 2.0f);
        int64_t nqh = (int64_t)n * s.n_heads, kvw = (int64_t)s.n_kv_heads * D;
        float *out = zeros(q_size(&c)), *lse = zeros(nqh);
        attn_forward(out, lse, c.q, view(c.qr), c.k, c.v, view(c.kr), s);

        int parts = 2 + (int)rng_below(&rng, 4), layout = trial % 4;
        int *part_of = malloc(sizeof(int) * n), *idx = malloc(sizeof(int) * n);
        split_rows(&rng, c.kr, parts, layout, part_of);
        float *mout = zeros(q_size(&c)), *mlse = zeros(nqh), *pout = zeros(q_size(&c)), *plse = zeros(nqh);
        float *pk = zeros(kv_size(&c)), *pv = zeros(kv_size(&c));
        // merge the parts in a random order, starting from "nothing seen"
        for (int64_t i = 0; i < nqh; i++) mlse[i] = -INFINITY;
        int first = (int)rng_below(&rng, (uint64_t)parts);
        for (int pp = 0; pp < parts; pp++) {
            int p = (first + pp) % parts, m = part_rows(part_of, n, p, idx);
            Rows pr = rows_pick(c.kr, idx, m);
            gather(pk, c.k, idx, m, (int)kvw);
            gather(pv, c.v, idx, m, (int)kvw);
            attn_forward(pout, plse, c.q, view(c.qr), pk, pv, view(pr), s);
            attn_merge(mout, mlse, pout, plse, n, s);
            rows_free(&pr);
        }
        check_close_f("merged out", mout, out, q_size(&c), 1e-4, 2e-5);
        check_close_f("merged lse", mlse, lse, nqh, 1e-5, 2e-5);
        free(out), free(lse), free(part_of), free(idx), free(mout), free(mlse), free(pout), free(plse);
        free(pk), free(pv);
        case_free(&c);
    }
}

// Ring attention's whole pattern: query parts x key parts, forward merged over key parts, backward
// called once per (query part, key part) with the final lse/delta and summed.
static void test_split_queries_and_keys_backward(void **state) {
    (void)state;
    Rng rng;
    rng_seed(&rng, 6);
    for (int trial = 0; trial < 8; trial++) {
        int r = 1 << (trial % 3), hkv = 1 + (trial / 3) % 2, D = trial % 2 ? 64 : 16;
        AttnShape s = {r * hkv, hkv, D};
        int n = 250 + (int)rng_below(&rng, 400);
        Rows qr = pack_random(&rng, n, 300);
        Rows kr = rows_alloc(n);
        memcpy(kr.pos, qr.pos, sizeof(int32_t) * n);
        memcpy(kr.seg, qr.seg, sizeof(int32_t) * n);
        Case c = case_make(&rng, s, qr, kr, 1.5f);
        int H = s.n_heads;
        int64_t nqh = (int64_t)n * H, qw = (int64_t)H * D, kvw = (int64_t)s.n_kv_heads * D;

        // the whole thing in one call
        float *out = zeros(q_size(&c)), *lse = zeros(nqh), *delta = zeros(nqh), *dout = randn(&rng, q_size(&c), 1.0f);
        float *dq = zeros(q_size(&c)), *dk = zeros(kv_size(&c)), *dv = zeros(kv_size(&c));
        attn_forward(out, lse, c.q, view(c.qr), c.k, c.v, view(c.kr), s);
        attn_backward_delta(delta, dout, out, n, s);
        attn_backward(dq, dk, dv, dout, lse, delta, c.q, view(c.qr), c.k, c.v, view(c.kr), s);

        // the same rows split over `parts` ranks (symmetric chunks on even trials, random otherwise)
        int parts = 2 + (int)rng_below(&rng, 3), layout = trial % 2 ? 0 : 2;
        int *part_of = malloc(sizeof(int) * n), *qi = malloc(sizeof(int) * n), *ki = malloc(sizeof(int) * n);
        split_rows(&rng, c.qr, parts, layout, part_of);
        float *sout = zeros(q_size(&c)), *slse = zeros(nqh);
        float *sdq = zeros(q_size(&c)), *sdk = zeros(kv_size(&c)), *sdv = zeros(kv_size(&c));
        float *pq = zeros(q_size(&c)), *pdo = zeros(q_size(&c)), *po = zeros(q_size(&c)), *pl = zeros(nqh);
        float *to = zeros(q_size(&c)), *tl = zeros(nqh), *pd = zeros(nqh);
        float *pk = zeros(kv_size(&c)), *pv = zeros(kv_size(&c));
        float *pdq = zeros(q_size(&c)), *pdk = zeros(kv_size(&c)), *pdv = zeros(kv_size(&c));
        for (int a = 0; a < parts; a++) {
            int mq = part_rows(part_of, n, a, qi);
            Rows qa = rows_pick(c.qr, qi, mq);
            gather(pq, c.q, qi, mq, (int)qw);
            // forward: merge over key parts, starting with the local one as a ring would
            for (int bb = 0; bb < parts; bb++) {
                int b = (a + bb) % parts, mk = part_rows(part_of, n, b, ki);
                Rows kb = rows_pick(c.kr, ki, mk);
                gather(pk, c.k, ki, mk, (int)kvw);
                gather(pv, c.v, ki, mk, (int)kvw);
                if (bb == 0) {
                    attn_forward(po, pl, pq, view(qa), pk, pv, view(kb), s);
                } else {
                    attn_forward(to, tl, pq, view(qa), pk, pv, view(kb), s);
                    attn_merge(po, pl, to, tl, mq, s);
                }
                rows_free(&kb);
            }
            for (int i = 0; i < mq; i++) {
                memcpy(sout + qi[i] * qw, po + i * qw, sizeof(float) * qw);
                memcpy(slse + (int64_t)qi[i] * H, pl + (int64_t)i * H, sizeof(float) * H);
            }
            // backward: delta from the final local out, then one call per key part
            gather(pdo, dout, qi, mq, (int)qw);
            attn_backward_delta(pd, pdo, po, mq, s);
            memset(pdq, 0, sizeof(float) * q_size(&c));
            for (int b = 0; b < parts; b++) {
                int mk = part_rows(part_of, n, b, ki);
                Rows kb = rows_pick(c.kr, ki, mk);
                gather(pk, c.k, ki, mk, (int)kvw);
                gather(pv, c.v, ki, mk, (int)kvw);
                memset(pdk, 0, sizeof(float) * kv_size(&c));
                memset(pdv, 0, sizeof(float) * kv_size(&c));
                attn_backward(pdq, pdk, pdv, pdo, pl, pd, pq, view(qa), pk, pv, view(kb), s);
                scatter_add(sdk, pdk, ki, mk, (int)kvw);
                scatter_add(sdv, pdv, ki, mk, (int)kvw);
                rows_free(&kb);
            }
            scatter_add(sdq, pdq, qi, mq, (int)qw);
            rows_free(&qa);
        }
        check_close_f("split out", sout, out, q_size(&c), 1e-4, 2e-5);
        check_close_f("split lse", slse, lse, nqh, 1e-5, 2e-5);
        check_close_f("split dq", sdq, dq, q_size(&c), 1e-4, 5e-5);
        check_close_f("split dk", sdk, dk, kv_size(&c), 1e-4, 5e-5);
        check_close_f("split dv", sdv, dv, kv_size(&c), 1e-4, 5e-5);

        free(out), free(lse), free(delta), free(dout), free(dq), free(dk), free(dv);
        free(part_of), free(qi), free(ki), free(sout), free(slse), free(sdq), free(sdk), free(sdv);
        free(pq), free(pdo), free(po), free(pl), free(to), free(tl), free(pd), free(pk), free(pv);
        free(pdq), free(pdk), free(pdv);
        case_free(&c);
    }
}

// ---- the mask: skipping and counting -----------------------------------------------------------

static int64_t brute_pairs(AttnRows qr, AttnRows kr) {
    int64_t n = 0;
    for (int i = 0; i < qr.n; i++)
        for (int j = 0; j < kr.n; j++) n += kr.seg[j] == qr.seg[i] && kr.pos[j] <= qr.pos[i];
    return n;
}

static void test_mostly_masked_pack(void **state) {
    (void)state;
    // 1500 tokens of segments of 1..40 tokens: nearly every (query block, key block) is hidden
    Rng rng;
    rng_seed(&rng, 7);
    AttnShape s = {2, 1, 32};
    int n = 1500;
    Rows qr = pack_random(&rng, n, 40);
    Rows kr = rows_alloc(n);
    memcpy(kr.pos, qr.pos, sizeof(int32_t) * n);
    memcpy(kr.seg, qr.seg, sizeof(int32_t) * n);
    Case c = case_make(&rng, s, qr, kr, 1.0f);
    int64_t vis = brute_pairs(view(qr), view(kr));
    assert_int_equal(attn_visible_pairs(view(qr), view(kr)), vis);
    assert_true(vis < (int64_t)n * n / 50);  // the pack really is mostly masked
    check_case(&rng, &c);

    // the same keys interleaved (stride 16) so every key block spans the whole pack and nothing can
    // be skipped: the results must agree with the skipping run
    int *perm = malloc(sizeof(int) * n), m = 0;
    for (int start = 0; start < 16; start++)
        for (int j = start; j < n; j += 16) perm[m++] = j;
    Rows kr2 = rows_pick(kr, perm, n);
    int64_t kvw = (int64_t)s.n_kv_heads * s.head_dim, nqh = (int64_t)n * s.n_heads;
    float *k2 = zeros(kv_size(&c)), *v2 = zeros(kv_size(&c));
    gather(k2, c.k, perm, n, (int)kvw);
    gather(v2, c.v, perm, n, (int)kvw);
    assert_int_equal(attn_visible_pairs(view(qr), view(kr2)), vis);
    float *out = zeros(q_size(&c)), *lse = zeros(nqh), *out2 = zeros(q_size(&c)), *lse2 = zeros(nqh);
    attn_forward(out, lse, c.q, view(qr), c.k, c.v, view(kr), s);
    attn_forward(out2, lse2, c.q, view(qr), k2, v2, view(kr2), s);
    check_close_f("skipped vs unskipped out", out, out2, q_size(&c), 1e-5, 1e-6);
    check_close_f("skipped vs unskipped lse", lse, lse2, nqh, 1e-6, 1e-6);
    float *dout = randn(&rng, q_size(&c), 1.0f), *delta = zeros(nqh);
    float *dq = zeros(q_size(&c)), *dk = zeros(kv_size(&c)), *dv = zeros(kv_size(&c));
    float *dq2 = zeros(q_size(&c)), *dk2 = zeros(kv_size(&c)), *dv2 = zeros(kv_size(&c));
    float *dk2u = zeros(kv_size(&c)), *dv2u = zeros(kv_size(&c));
    attn_backward_delta(delta, dout, out, n, s);
    attn_backward(dq, dk, dv, dout, lse, delta, c.q, view(qr), c.k, c.v, view(kr), s);
    attn_backward(dq2, dk2, dv2, dout, lse, delta, c.q, view(qr), k2, v2, view(kr2), s);
    scatter_add(dk2u, dk2, perm, n, (int)kvw);  // back to the original key order
    scatter_add(dv2u, dv2, perm, n, (int)kvw);
    check_close_f("skipped vs unskipped dq", dq, dq2, q_size(&c), 1e-5, 1e-5);
    check_close_f("skipped vs unskipped dk", dk, dk2u, kv_size(&c), 1e-5, 1e-5);
    check_close_f("skipped vs unskipped dv", dv, dv2u, kv_size(&c), 1e-5, 1e-5);
    free(perm), free(k2), free(v2), free(out), free(lse), free(out2), free(lse2), free(dout), free(delta);
    free(dq), free(dk), free(dv), free(dq2), free(dk2), free(dv2), free(dk2u), free(dv2u);
    rows_free(&kr2);
    case_free(&c);
}

static void test_visible_pairs_brute_force(void **state) {
    (void)state;
    Rng rng;
    rng_seed(&rng, 8);
    for (int trial = 0; trial < 40; trial++) {
        int n = 1 + (int)rng_below(&rng, 900);
        Rows a = pack_random(&rng, n, 1 + (int)rng_below(&rng, 300));
        Rows b = pack_random(&rng, 1 + (int)rng_below(&rng, 900), 300);
        // reuse a's segments for some of b's rows so the sets overlap in interesting ways
        for (int j = 0; j < b.n; j++)
            if (rng_below(&rng, 2)) {
                int i = (int)rng_below(&rng, (uint64_t)n);
                b.seg[j] = a.seg[i], b.pos[j] = a.pos[i] + (int)rng_below(&rng, 41) - 20;
            }
        if (trial % 4 == 0) {  // a sorted causal case: b = a
            rows_free(&b);
            b = rows_alloc(n);
            memcpy(b.pos, a.pos, sizeof(int32_t) * n);
            memcpy(b.seg, a.seg, sizeof(int32_t) * n);
        }
        assert_int_equal(attn_visible_pairs(view(a), view(b)), brute_pairs(view(a), view(b)));
        rows_free(&a);
        rows_free(&b);
    }
    // one causal segment: exactly n (n + 1) / 2
    Rows one = rows_alloc(1000);
    for (int i = 0; i < 1000; i++) one.pos[i] = 77 + i, one.seg[i] = 3;
    assert_int_equal(attn_visible_pairs(view(one), view(one)), 1000 * 1001 / 2);
    rows_free(&one);
}

static void test_merge_with_nothing(void **state) {
    (void)state;
    // merging a partial result that saw no key changes nothing; merging into "nothing" copies
    Rng rng;
    rng_seed(&rng, 9);
    AttnShape s = {2, 1, 8};
    int nq = 5;
    float *a = randn(&rng, nq * 16, 1.0f), *la = randn(&rng, nq * 2, 1.0f);
    float *b = zeros(nq * 16), *lb = zeros(nq * 2);
    float *a0 = zeros(nq * 16), *la0 = zeros(nq * 2);
    memcpy(a0, a, sizeof(float) * nq * 16);
    memcpy(la0, la, sizeof(float) * nq * 2);
    for (int i = 0; i < nq * 2; i++) lb[i] = -INFINITY;
    attn_merge(a, la, b, lb, nq, s);
    assert_memory_equal(a, a0, sizeof(float) * nq * 16);
    assert_memory_equal(la, la0, sizeof(float) * nq * 2);
    attn_merge(b, lb, a0, la0, nq, s);
    assert_memory_equal(b, a0, sizeof(float) * nq * 16);
    assert_memory_equal(lb, la0, sizeof(float) * nq * 2);
    // two equal halves: lse grows by log 2, out stays
    attn_merge(a, la, a0, la0, nq, s);
    check_close_f("merge out", a, a0, nq * 16, 1e-6, 1e-7);
    for (int i = 0; i < nq * 2; i++) assert_close(la[i], la0[i] + log(2.0), 1e-6, 1e-6);
    free(a), free(la), free(b), free(lb), free(a0), free(la0);
}

static void test_unsupported_head_dim_aborts(void **state) {
    (void)state;
    // the functions return nothing, so a shape beyond the limits must stop the program loudly
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        if (!freopen("/dev/null", "w", stderr)) _exit(2);
        float x[1024] = {0};
        int32_t pos[1] = {0}, seg[1] = {0};
        AttnRows r = {pos, seg, 1};
        attn_forward(x, x, x, r, x, x, r, (AttnShape){1, 1, 257});
        _exit(0);
    }
    int status = 0;
    assert_int_equal(waitpid(pid, &status, 0), pid);
    assert_true(WIFSIGNALED(status) && WTERMSIG(status) == SIGABRT);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_exp2_accuracy),
        cmocka_unit_test(test_forward_backward_match_naive),
        cmocka_unit_test(test_self_attention_long_segments),
        cmocka_unit_test(test_unusual_shapes),
        cmocka_unit_test(test_shuffled_rows),
        cmocka_unit_test(test_backward_finite_differences),
        cmocka_unit_test(test_split_keys_and_merge),
        cmocka_unit_test(test_split_queries_and_keys_backward),
        cmocka_unit_test(test_mostly_masked_pack),
        cmocka_unit_test(test_visible_pairs_brute_force),
        cmocka_unit_test(test_merge_with_nothing),
        cmocka_unit_test(test_unsupported_head_dim_aborts),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
