// attention.c: packed causal attention, blockwise with an online softmax (attention.h).
//
// Work is cut into tiles: one K/V head g, the query heads that share it (stacked head-major, so one
// sgemm serves the whole GQA group) and a block of query rows, against blocks of ATTN_TILE_KEYS key
// rows. Per (query block, key block) the positions and segments decide one of three cases:
//   hidden   no pair can be visible (segment ranges disjoint, or every key after every query): skipped
//   full     one segment on both sides and every key at or before every query: no mask needed
//   partial  the mask is applied per element
// Scores are computed in base 2: the query tile is pre-scaled by log2(e) / sqrt(head_dim), so the
// softmax uses exp2 and the log-sum-exp is converted back to natural log only at the end.
//
// Limits (checked on every call; a violation prints the problem and aborts, since the functions
// return nothing): 1 <= head_dim <= ATTN_MAX_HEAD_DIM, n_kv_heads >= 1, n_heads % n_kv_heads == 0.
// Scratch is one fixed thread-local block (448 KB), so nothing is allocated per call and calls
// from different threads do not share buffers.
#include "bytescale/attention.h"

#include <cblas.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "attention_tile.h"

// Key rows per block, and at most how many stacked query rows (heads x query rows) one tile holds.
// Tiles of up to 256 x 128 keep the score tile (128 KB) and the K/V blocks in L2 and make the
// sgemm calls big enough that packing their operands costs little; docs/kernels.md has the
// measurements behind the choice. The scratch holds 3 (rows, head_dim) and 2 (rows, keys) arrays,
// so the rows of a tile shrink as head_dim grows (256 rows at head_dim 64, 112 at 256).
#define ATTN_TILE_KEYS 128
#define ATTN_MAX_TILE_ROWS 256
#define ATTN_MAX_HEAD_DIM 256
#define ATTN_SCRATCH_FLOATS (ATTN_MAX_TILE_ROWS * (3 * 64 + 2 * ATTN_TILE_KEYS))

#define LOG2E 1.4426950408889634f
#define LN2 0.6931471805599453f

// Carved per call from one block: q, acc, dout (rows, head_dim) and s, dp (rows, ATTN_TILE_KEYS).
typedef struct {
    float *q;     // (rows, head_dim) queries * log2(e)/sqrt(head_dim)
    float *acc;   // (rows, head_dim) forward: sum of p * v; backward: dq
    float *dout;  // (rows, head_dim) backward: upstream gradient
    float *s;     // (rows, ATTN_TILE_KEYS) scores, then probabilities
    float *dp;    // (rows, ATTN_TILE_KEYS) backward: dP, then dS
    float m[ATTN_MAX_TILE_ROWS];      // forward: running max (base 2)
    float l[ATTN_MAX_TILE_ROWS];      // forward: running sum of 2^(s - m)
    float alpha[ATTN_MAX_TILE_ROWS];  // forward: rescale factor of this step
    float bias[ATTN_MAX_TILE_ROWS];   // backward: -lse * log2(e)
    float delta[ATTN_MAX_TILE_ROWS];  // backward: sum dout * out
} AttnScratch;

static _Thread_local float scratch_block[ATTN_SCRATCH_FLOATS] __attribute__((aligned(64)));
static _Thread_local AttnScratch scratch;
#if ATTN_TILE_QK
// a key block packed for attn_tile_qk (ATTN_TILE_KEYS is a multiple of 16)
static _Thread_local float kpack[ATTN_TILE_KEYS * ATTN_MAX_HEAD_DIM] __attribute__((aligned(64)));
#endif

static int imin(int a, int b) { return a < b ? a : b; }

// The most stacked rows whose scratch fits, a multiple of 16 (and at least 16: head_dim <= 256).
static int tile_rows_for(int head_dim) {
    int rows = ATTN_SCRATCH_FLOATS / (3 * head_dim + 2 * ATTN_TILE_KEYS);
    rows = imin(rows, ATTN_MAX_TILE_ROWS) / 16 * 16;
    return rows;
}

static AttnScratch *scratch_carve(int rows, int head_dim) {
    AttnScratch *sc = &scratch;
    float *p = scratch_block;
    sc->q = p, p += rows * head_dim;
    sc->acc = p, p += rows * head_dim;
    sc->dout = p, p += rows * head_dim;
    sc->s = p, p += rows * ATTN_TILE_KEYS;
    sc->dp = p;
    return sc;
}

// ---- limits ------------------------------------------------------------------------------------

static void attn_check(AttnShape s, int nq, int nk, const char *fn) {
    const char *why = NULL;
    if (s.head_dim < 1 || s.head_dim > ATTN_MAX_HEAD_DIM)
        why = "head_dim must be in [1, 256] (ATTN_MAX_HEAD_DIM in src/nn/attention.c)";
    else if (s.n_kv_heads < 1 || s.n_heads < 1 || s.n_heads % s.n_kv_heads != 0)
        why = "n_heads must be a positive multiple of n_kv_heads";
    else if (nq < 0 || nk < 0)
        why = "negative row count";
    if (!why) return;
    fprintf(stderr, "bytescale: %s: unsupported shape (n_heads %d, n_kv_heads %d, head_dim %d, nq %d, nk %d): %s\n",
            fn, s.n_heads, s.n_kv_heads, s.head_dim, nq, nk, why);
    abort();
}

// ---- the block mask ----------------------------------------------------------------------------

typedef struct {
    int32_t pos_min, pos_max, seg_min, seg_max;
} RowSpan;

static RowSpan rows_span(const int32_t *pos, const int32_t *seg, int n) {
    RowSpan r = {pos[0], pos[0], seg[0], seg[0]};
    for (int i = 1; i < n; i++) {
        r.pos_min = pos[i] < r.pos_min ? pos[i] : r.pos_min;
        r.pos_max = pos[i] > r.pos_max ? pos[i] : r.pos_max;
        r.seg_min = seg[i] < r.seg_min ? seg[i] : r.seg_min;
        r.seg_max = seg[i] > r.seg_max ? seg[i] : r.seg_max;
    }
    return r;
}

enum { BLOCK_HIDDEN, BLOCK_FULL, BLOCK_PARTIAL };

// Conservative: HIDDEN and FULL are only claimed when they hold for every pair in the block.
static int block_kind(RowSpan q, RowSpan k) {
    if (k.seg_max < q.seg_min || k.seg_min > q.seg_max || k.pos_min > q.pos_max) return BLOCK_HIDDEN;
    if (q.seg_min == q.seg_max && k.seg_min == k.seg_max && q.seg_min == k.seg_min && k.pos_max <= q.pos_min)
        return BLOCK_FULL;
    return BLOCK_PARTIAL;
}

// A partial block's keys narrowed to [lo, hi): keys outside it cannot be seen by any query of the
// block (segment outside the queries' range, or position after all of them). Packs of short
// segments touch few keys of each block, so this saves most of their masked work. Returns hi - lo.
static int keys_trim(AttnRows kr, int j0, int nbk, RowSpan q, int *lo, int *hi) {
    int a = j0, b = j0 + nbk;
    while (a < b && (kr.seg[a] < q.seg_min || kr.seg[a] > q.seg_max || kr.pos[a] > q.pos_max)) a++;
    while (b > a && (kr.seg[b - 1] < q.seg_min || kr.seg[b - 1] > q.seg_max || kr.pos[b - 1] > q.pos_max)) b--;
    *lo = a, *hi = b;
    return b - a;
}

// Next key block against query span qs from j0: its kind, and the keys [*lo, *hi) to compute.
static int key_block(AttnRows kr, int j0, RowSpan qs, int *lo, int *hi) {
    int nbk = imin(ATTN_TILE_KEYS, kr.n - j0);
    int kind = block_kind(qs, rows_span(kr.pos + j0, kr.seg + j0, nbk));
    *lo = j0, *hi = j0 + nbk;
    if (kind != BLOCK_PARTIAL) return kind;
    if (keys_trim(kr, j0, nbk, qs, lo, hi) == 0) return BLOCK_HIDDEN;
    return block_kind(qs, rows_span(kr.pos + *lo, kr.seg + *lo, *hi - *lo));  // the rest may need no mask
}

// ---- tiles -------------------------------------------------------------------------------------

// A tile: K/V head g, query heads h0 .. h0+hn-1 of its group, query rows q0 .. q0+nbq-1.
typedef struct {
    int g, h0, hn, q0, nbq;
} Tile;

// Gather the tile's rows of x (nq, n_heads, head_dim) into dst (hn * nbq, head_dim), times c.
static void tile_gather(float *dst, const float *x, Tile t, AttnShape s, float c) {
    int D = s.head_dim, r = s.n_heads / s.n_kv_heads;
    for (int hh = 0; hh < t.hn; hh++) {
        int h = t.g * r + t.h0 + hh;
        for (int i = 0; i < t.nbq; i++) {
            const float *src = x + ((int64_t)(t.q0 + i) * s.n_heads + h) * D;
            float *d = dst + (int64_t)(hh * t.nbq + i) * D;
            for (int e = 0; e < D; e++) d[e] = src[e] * c;
        }
    }
}

// s (rows, nbk; stride ATTN_TILE_KEYS) = a (rows, D) b^T, b (nbk, D) with row stride ldb.
static void scores(float *s, const float *a, int rows, const float *b, int64_t ldb, int nbk, int D) {
#if ATTN_TILE_QK
    attn_tile_qk(s, ATTN_TILE_KEYS, a, D, rows, b, ldb, nbk, D, kpack);
#else
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, rows, nbk, D, 1.0f, a, D, b, (int)ldb, 0.0f, s,
                ATTN_TILE_KEYS);
#endif
}

static void forward_tile(AttnScratch *sc, float *out, float *lse, const float *q, AttnRows qr, const float *k,
                         const float *v, AttnRows kr, AttnShape s, Tile t) {
    int D = s.head_dim, r = s.n_heads / s.n_kv_heads, rows = t.hn * t.nbq;
    int64_t ldkv = (int64_t)s.n_kv_heads * D;
    tile_gather(sc->q, q, t, s, LOG2E / sqrtf((float)D));
    memset(sc->acc, 0, sizeof(float) * rows * D);
    for (int i = 0; i < rows; i++) sc->m[i] = -INFINITY, sc->l[i] = 0.0f;
    RowSpan qs = rows_span(qr.pos + t.q0, qr.seg + t.q0, t.nbq);

    for (int j0 = 0; j0 < kr.n; j0 += ATTN_TILE_KEYS) {
        int lo, hi, kind = key_block(kr, j0, qs, &lo, &hi), nbk = hi - lo;
        if (kind == BLOCK_HIDDEN) continue;
        const float *kb = k + lo * ldkv + (int64_t)t.g * D;  // (nbk, head_dim), row stride ldkv
        const float *vb = v + lo * ldkv + (int64_t)t.g * D;
        // S = Q K^T   (rows, nbk)
        scores(sc->s, sc->q, rows, kb, ldkv, nbk, D);
        if (kind == BLOCK_PARTIAL)
            attn_tile_mask(sc->s, t.hn, t.nbq, nbk, ATTN_TILE_KEYS, qr.pos + t.q0, qr.seg + t.q0, kr.pos + lo,
                           kr.seg + lo);
        attn_tile_softmax_step(sc->s, rows, nbk, ATTN_TILE_KEYS, sc->m, sc->l, sc->alpha);
#if ATTN_TILE_QK
        if (D % 16 == 0) {  // acc = acc * alpha + P V in one pass, P read in place
            attn_tile_pv(sc->acc, sc->alpha, sc->s, ATTN_TILE_KEYS, rows, vb, ldkv, nbk, D, kpack);
            continue;
        }
#endif
        for (int i = 0; i < rows; i++) {
            if (sc->alpha[i] == 1.0f) continue;
            float a = sc->alpha[i], *o = sc->acc + (int64_t)i * D;
            for (int e = 0; e < D; e++) o[e] *= a;
        }
        // acc += P V   (rows, head_dim)
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, rows, D, nbk, 1.0f, sc->s, ATTN_TILE_KEYS, vb,
                    (int)ldkv, 1.0f, sc->acc, D);
    }

    for (int hh = 0; hh < t.hn; hh++) {
        int h = t.g * r + t.h0 + hh;
        for (int i = 0; i < t.nbq; i++) {
            int row = hh * t.nbq + i;
            int64_t at = (int64_t)(t.q0 + i) * s.n_heads + h;
            float *o = out + at * D;
            const float *a = sc->acc + (int64_t)row * D;
            if (sc->l[row] > 0.0f) {
                float inv = 1.0f / sc->l[row];
                for (int e = 0; e < D; e++) o[e] = a[e] * inv;
                lse[at] = (sc->m[row] + log2f(sc->l[row])) * LN2;
            } else {
                memset(o, 0, sizeof(float) * D);
                lse[at] = -INFINITY;
            }
        }
    }
}

static void backward_tile(AttnScratch *sc, float *dq, float *dk, float *dv, const float *dout, const float *lse,
                          const float *delta, const float *q, AttnRows qr, const float *k, const float *v,
                          AttnRows kr, AttnShape s, Tile t) {
    int D = s.head_dim, r = s.n_heads / s.n_kv_heads, rows = t.hn * t.nbq;
    int64_t ldkv = (int64_t)s.n_kv_heads * D;
    float scale = 1.0f / sqrtf((float)D);
    tile_gather(sc->q, q, t, s, scale * LOG2E);
    tile_gather(sc->dout, dout, t, s, 1.0f);
    memset(sc->acc, 0, sizeof(float) * rows * D);
    for (int hh = 0; hh < t.hn; hh++) {
        int h = t.g * r + t.h0 + hh;
        for (int i = 0; i < t.nbq; i++) {
            int64_t at = (int64_t)(t.q0 + i) * s.n_heads + h;
            float ls = lse[at];
            // a row that saw no key at all has lse = -inf and gets probability 0 everywhere
            sc->bias[hh * t.nbq + i] = ls == -INFINITY ? -INFINITY : -ls * LOG2E;
            sc->delta[hh * t.nbq + i] = delta[at];
        }
    }
    RowSpan qs = rows_span(qr.pos + t.q0, qr.seg + t.q0, t.nbq);

    for (int j0 = 0; j0 < kr.n; j0 += ATTN_TILE_KEYS) {
        int lo, hi, kind = key_block(kr, j0, qs, &lo, &hi), nbk = hi - lo;
        if (kind == BLOCK_HIDDEN) continue;
        int64_t off = lo * ldkv + (int64_t)t.g * D;  // (nbk, head_dim) blocks of k, v, dk, dv, row stride ldkv
        // P = 2^(Q K^T - lse)   (rows, nbk), recomputed
        scores(sc->s, sc->q, rows, k + off, ldkv, nbk, D);
        if (kind == BLOCK_PARTIAL)
            attn_tile_mask(sc->s, t.hn, t.nbq, nbk, ATTN_TILE_KEYS, qr.pos + t.q0, qr.seg + t.q0, kr.pos + lo,
                           kr.seg + lo);
        attn_tile_exp2_bias(sc->s, rows, nbk, ATTN_TILE_KEYS, sc->bias);
        // dV += P^T dO   (nbk, head_dim)
        cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, nbk, D, rows, 1.0f, sc->s, ATTN_TILE_KEYS, sc->dout, D,
                    1.0f, dv + off, (int)ldkv);
        // dP = dO V^T   (rows, nbk), then dS = P o (dP - delta)
        scores(sc->dp, sc->dout, rows, v + off, ldkv, nbk, D);
        attn_tile_dsoftmax(sc->dp, sc->s, rows, nbk, ATTN_TILE_KEYS, sc->delta);
        // dQ += dS K / sqrt(head_dim)   (rows, head_dim)
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, rows, D, nbk, scale, sc->dp, ATTN_TILE_KEYS, k + off,
                    (int)ldkv, 1.0f, sc->acc, D);
        // dK += dS^T Q / sqrt(head_dim)   (nbk, head_dim); sc->q holds Q * log2(e) / sqrt(head_dim)
        cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, nbk, D, rows, LN2, sc->dp, ATTN_TILE_KEYS, sc->q, D,
                    1.0f, dk + off, (int)ldkv);
    }

    for (int hh = 0; hh < t.hn; hh++) {
        int h = t.g * r + t.h0 + hh;
        for (int i = 0; i < t.nbq; i++) {
            float *d = dq + ((int64_t)(t.q0 + i) * s.n_heads + h) * D;
            const float *a = sc->acc + (int64_t)(hh * t.nbq + i) * D;
            for (int e = 0; e < D; e++) d[e] += a[e];
        }
    }
}

// Tiles: for each K/V head, the heads of its group in chunks (all of them unless the group is
// larger than a tile), and blocks of query rows, so that every tile stacks about `rows` rows.
typedef struct {
    int rows;   // stacked rows per tile, for this head_dim
    int chunk;  // query heads per tile
    int bq;     // query rows per tile
} TilePlan;

static TilePlan tile_plan(AttnShape s) {
    int r = s.n_heads / s.n_kv_heads, rows = tile_rows_for(s.head_dim), chunk = imin(r, rows);
    return (TilePlan){rows, chunk, rows / chunk};
}

// Query rows of the block starting at q0: bq, or fewer so that the block ends where a run of
// consecutive positions in one segment does (if one ends in its last three quarters). Then a pack
// of short segments gets blocks of whole segments, whose keys (trimmed to the same segments) form
// a square around the diagonal, and the two chunks a ring member holds are not mixed in a block.
static int query_block(AttnRows qr, int q0, int bq) {
    int end = q0 + bq;
    if (end >= qr.n) return qr.n - q0;
    for (int b = end; b > q0 + bq / 4; b--)
        if (qr.seg[b] != qr.seg[b - 1] || qr.pos[b] != qr.pos[b - 1] + 1) return b - q0;
    return bq;
}

void attn_forward(float *out, float *lse, const float *q, AttnRows qr, const float *k, const float *v, AttnRows kr,
                  AttnShape s) {
    attn_check(s, qr.n, kr.n, "attn_forward");
    int r = s.n_heads / s.n_kv_heads;
    TilePlan p = tile_plan(s);
    AttnScratch *sc = scratch_carve(p.rows, s.head_dim);
    for (int g = 0; g < s.n_kv_heads; g++)
        for (int h0 = 0; h0 < r; h0 += p.chunk)
            for (int q0 = 0, nbq; q0 < qr.n; q0 += nbq) {
                nbq = query_block(qr, q0, p.bq);
                Tile t = {g, h0, imin(p.chunk, r - h0), q0, nbq};
                forward_tile(sc, out, lse, q, qr, k, v, kr, s, t);
            }
}

void attn_backward(float *dq, float *dk, float *dv, const float *dout, const float *lse, const float *delta,
                   const float *q, AttnRows qr, const float *k, const float *v, AttnRows kr, AttnShape s) {
    attn_check(s, qr.n, kr.n, "attn_backward");
    int r = s.n_heads / s.n_kv_heads;
    TilePlan p = tile_plan(s);
    AttnScratch *sc = scratch_carve(p.rows, s.head_dim);
    for (int g = 0; g < s.n_kv_heads; g++)
        for (int h0 = 0; h0 < r; h0 += p.chunk)
            for (int q0 = 0, nbq; q0 < qr.n; q0 += nbq) {
                nbq = query_block(qr, q0, p.bq);
                Tile t = {g, h0, imin(p.chunk, r - h0), q0, nbq};
                backward_tile(sc, dq, dk, dv, dout, lse, delta, q, qr, k, v, kr, s, t);
            }
}

void attn_backward_delta(float *delta, const float *dout, const float *out, int nq, AttnShape s) {
    attn_check(s, nq, 0, "attn_backward_delta");
    int D = s.head_dim;
    for (int64_t at = 0; at < (int64_t)nq * s.n_heads; at++) {
        const float *a = dout + at * D, *b = out + at * D;
        float acc = 0.0f;
        for (int e = 0; e < D; e++) acc += a[e] * b[e];
        delta[at] = acc;
    }
}

void attn_merge(float *out_a, float *lse_a, const float *out_b, const float *lse_b, int nq, AttnShape s) {
    attn_check(s, nq, 0, "attn_merge");
    int D = s.head_dim;
    for (int64_t at = 0; at < (int64_t)nq * s.n_heads; at++) {
        float la = lse_a[at], lb = lse_b[at];
        if (lb == -INFINITY) continue;  // b saw nothing: a stands
        float *oa = out_a + at * D;
        const float *ob = out_b + at * D;
        if (la == -INFINITY) {  // a saw nothing: b replaces it
            memcpy(oa, ob, sizeof(float) * D);
            lse_a[at] = lb;
            continue;
        }
        // weights of each side in the union: exp(lse_x - lse), computed relative to the larger one
        float mx = la > lb ? la : lb;
        float wa = expf(la - mx), wb = expf(lb - mx), sum = wa + wb;
        wa /= sum, wb /= sum;
        for (int e = 0; e < D; e++) oa[e] = oa[e] * wa + ob[e] * wb;
        lse_a[at] = mx + logf(sum);
    }
}

int64_t attn_visible_pairs(AttnRows qr, AttnRows kr) {
    // the kernel's own block classification; only partial blocks are counted pair by pair
    int64_t count = 0;
    for (int i0 = 0; i0 < qr.n; i0 += ATTN_MAX_TILE_ROWS) {
        int nbq = imin(ATTN_MAX_TILE_ROWS, qr.n - i0);
        RowSpan qs = rows_span(qr.pos + i0, qr.seg + i0, nbq);
        for (int j0 = 0; j0 < kr.n; j0 += ATTN_TILE_KEYS) {
            int lo, hi, kind = key_block(kr, j0, qs, &lo, &hi);
            if (kind == BLOCK_HIDDEN) continue;
            if (kind == BLOCK_FULL) {
                count += (int64_t)nbq * (hi - lo);
                continue;
            }
            for (int i = i0; i < i0 + nbq; i++)
                for (int j = lo; j < hi; j++) count += kr.seg[j] == qr.seg[i] && kr.pos[j] <= qr.pos[i];
        }
    }
    return count;
}
