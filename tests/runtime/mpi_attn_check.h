// mpi_attn_check.h: what the distributed attention tests share (mpi_ring_attn.c, mpi_a2a_attn.c):
// run one plan item's attention on its members for two layers of random q, k, v, dout, as a model
// does (forward 0, forward 1, backward 1, backward 0), and compare every member's out, lse, dq, dk,
// dv with the one-process kernel over all the item's rows.
#ifndef BYTESCALE_TEST_MPI_ATTN_CHECK_H
#define BYTESCALE_TEST_MPI_ATTN_CHECK_H

#include "runtime/mpi_util.h"

#include <stdint.h>

#include "bytescale/attention.h"
#include "bytescale/batch.h"
#include "bytescale/llama.h"
#include "bytescale/microbatch.h"
#include "bytescale/plan.h"
#include "bytescale/rng.h"

enum { N_LAYERS = 2, N_SEQS = 10, SEQ_MAX = 220 };

static void *xcalloc(size_t n, size_t size) {
    void *p = calloc(n ? n : 1, size);
    CHECK(p != NULL, "out of memory (%zu x %zu)", n, size);
    return p;
}

static float *floats(int64_t n) { return xcalloc((size_t)n, sizeof(float)); }

static void fill_normal(float *x, int64_t n, Rng *rng, float scale) {
    for (int64_t i = 0; i < n; i++) x[i] = scale * (float)rng_normal(rng);
}

static void shuffle(int32_t *a, int n, Rng *rng) {
    for (int i = n - 1; i > 0; i--) {
        int j = (int)rng_below(rng, (uint64_t)i + 1);
        int32_t t = a[i];
        a[i] = a[j], a[j] = t;
    }
}

// A random segment of length in [lo, hi] inside one of the batch's sequences (a sub-range when the
// sequence is longer, from a random start).
static Segment random_segment(const GlobalBatch *b, Rng *rng, int64_t lo, int64_t hi) {
    int64_t len = lo + (int64_t)rng_below(rng, (uint64_t)(hi - lo + 1));
    int32_t seq;
    do seq = (int32_t)rng_below(rng, (uint64_t)b->n);
    while (b->seqs[seq].len < len);
    int64_t start = (int64_t)rng_below(rng, (uint64_t)(b->seqs[seq].len - len + 1));
    return (Segment){.seq = seq, .start = start, .len = len};
}

// One layer's data over the item's rows in the canonical order (segment by segment, positions
// ascending), and the one-process reference result.
typedef struct {
    float *q, *k, *v, *dout;            // inputs (T, ...)
    float *out, *lse, *dq, *dk, *dv;    // reference (T, ...)
} Layer;

// One member's rows: its inputs gathered from the canonical rows, the ring's results, and the
// reference results gathered the same way.
typedef struct {
    float *q, *k, *v, *dout;
    float *out, *lse, *delta, *dq, *dk, *dv;
    float *ref_out, *ref_lse, *ref_dq, *ref_dk, *ref_dv;
} Mine;

static int n_checks;

static void check_lse(const float *a, const float *b, int64_t n, const char *what) {
    double worst = 0;
    for (int64_t i = 0; i < n; i++) {
        CHECK(!isnan(a[i]) && !isnan(b[i]), "%s: lse[%lld] is NaN (%g vs %g)", what, (long long)i, a[i], b[i]);
        if (isinf(a[i]) || isinf(b[i])) {
            CHECK(a[i] == b[i], "%s: lse[%lld] = %g, reference %g", what, (long long)i, a[i], b[i]);
            continue;
        }
        double d = fabs((double)a[i] - b[i]);
        if (d > worst) worst = d;
    }
    CHECK(worst <= 1e-4, "%s: lse differs by %g", what, worst);
}

static void check_rel(const float *a, const float *b, int64_t n, const char *what) {
    double e = rel_error_all(a, b, (size_t)n);  // collective: every rank calls it, n = 0 outside the ring
    CHECK(e <= 1e-5, "%s: relative error %g", what, e);
    n_checks++;
}

// The attention under test for item k of plan p, set up on a member of the item (ring attention,
// all-to-all); `after` (may be NULL) checks what it can once both layers ran.
typedef struct {
    AttnOps (*prepare)(void *ctx, const Plan *p, int32_t k, int me);
    void (*after)(void *ctx, const Plan *p, int32_t k);
    void *ctx;
} AttnUnderTest;

// Item k's canonical rows: segment j's rows begin at base[j]; pos and seg give each row's position
// and segment. base (n_segs + 1), pos and seg (tokens) are the caller's to free.
static void item_rows(const Plan *p, int32_t k, int64_t **base, int32_t **pos, int32_t **seg) {
    const Item *it = &p->items[k];
    *base = xcalloc((size_t)it->n_segs + 1, sizeof **base);
    *pos = xcalloc((size_t)it->tokens, sizeof **pos);
    *seg = xcalloc((size_t)it->tokens, sizeof **seg);
    for (int32_t j = 0; j < it->n_segs; j++) {
        const Segment *sg = &p->segs[it->seg_begin + j];
        (*base)[j + 1] = (*base)[j] + sg->len;
        for (int64_t i = 0; i < sg->len; i++) {
            (*pos)[(*base)[j] + i] = (int32_t)(sg->start + i);
            (*seg)[(*base)[j] + i] = j;
        }
    }
    CHECK((*base)[it->n_segs] == it->tokens, "item %d: %lld rows, tokens %lld", k, (long long)(*base)[it->n_segs],
          (long long)it->tokens);
}

// Each member's rows as canonical rows (map[m][i], rows[m] of them); the members' layouts cover
// every canonical row exactly once (checked on every rank: no MPI).
static void member_maps(const Plan *p, int32_t k, const int64_t *base, int64_t ***map, int64_t **rows) {
    const Item *it = &p->items[k];
    int D = it->n_ranks;
    *map = xcalloc((size_t)D, sizeof **map);
    *rows = xcalloc((size_t)D, sizeof **rows);
    int *seen = xcalloc((size_t)it->tokens, sizeof *seen);
    for (int m = 0; m < D; m++) {
        int64_t r = (*rows)[m] = mb_member_rows(p, k, m);
        int32_t *mp = xcalloc((size_t)r, sizeof *mp), *ms = xcalloc((size_t)r, sizeof *ms);
        mb_layout(p, k, m, mp, ms);
        (*map)[m] = xcalloc((size_t)r, sizeof ***map);
        for (int64_t i = 0; i < r; i++) {
            CHECK(ms[i] >= 0 && ms[i] < it->n_segs, "item %d member %d row %lld: segment %d", k, m, (long long)i,
                  ms[i]);
            const Segment *sg = &p->segs[it->seg_begin + ms[i]];
            int64_t off = mp[i] - sg->start;
            CHECK(off >= 0 && off < sg->len, "item %d member %d row %lld: position %d outside segment %d", k, m,
                  (long long)i, mp[i], ms[i]);
            (*map)[m][i] = base[ms[i]] + off;
            seen[(*map)[m][i]]++;
        }
        free(mp), free(ms);
    }
    for (int64_t i = 0; i < it->tokens; i++)
        CHECK(seen[i] == 1, "item %d: row %lld held %d times", k, (long long)i, seen[i]);
    free(seen);
}

// Inputs of both layers, T rows: every rank draws them (the rng stays in step).
static void draw_layers(Layer *L, int64_t T, int64_t Q, int64_t KV, Rng *rng) {
    for (int l = 0; l < N_LAYERS; l++) {
        memset(&L[l], 0, sizeof L[l]);
        L[l].q = floats(T * Q), L[l].dout = floats(T * Q);
        L[l].k = floats(T * KV), L[l].v = floats(T * KV);
        fill_normal(L[l].q, T * Q, rng, 1.0f);
        fill_normal(L[l].k, T * KV, rng, 1.0f);
        fill_normal(L[l].v, T * KV, rng, 1.0f);
        fill_normal(L[l].dout, T * Q, rng, 1.0f);
    }
}

// The reference: attention of the whole item (all T rows, one process), computed on rank 0 alone and
// broadcast: every member computing the same T rows cost D times the reference on cores the D ranks
// share, for the same numbers.
static void reference_layers(Layer *L, int64_t T, int32_t *pos, int32_t *seg, AttnShape s) {
    int64_t Q = (int64_t)s.n_heads * s.head_dim, KV = (int64_t)s.n_kv_heads * s.head_dim, H = s.n_heads;
    AttnRows all = {.pos = pos, .seg = seg, .n = (int)T};
    float *delta = floats(T * H);
    for (int l = 0; l < N_LAYERS; l++) {
        Layer *y = &L[l];
        y->out = floats(T * Q), y->lse = floats(T * H), y->dq = floats(T * Q);
        y->dk = floats(T * KV), y->dv = floats(T * KV);
        if (mpi_comm->rank == 0) {
            attn_forward(y->out, y->lse, y->q, all, y->k, y->v, all, s);
            attn_backward_delta(delta, y->dout, y->out, (int)T, s);
            attn_backward(y->dq, y->dk, y->dv, y->dout, y->lse, delta, y->q, all, y->k, y->v, all, s);
        }
        CHECK_OK(comm_bcast(mpi_comm, y->out, (size_t)(T * Q) * sizeof(float), 0));
        CHECK_OK(comm_bcast(mpi_comm, y->lse, (size_t)(T * H) * sizeof(float), 0));
        CHECK_OK(comm_bcast(mpi_comm, y->dq, (size_t)(T * Q) * sizeof(float), 0));
        CHECK_OK(comm_bcast(mpi_comm, y->dk, (size_t)(T * KV) * sizeof(float), 0));
        CHECK_OK(comm_bcast(mpi_comm, y->dv, (size_t)(T * KV) * sizeof(float), 0));
    }
    free(delta);
}

// On a member: its n rows (map) of the inputs and of the reference copied out, its outputs poisoned
// (the attention under test must overwrite out and lse entirely).
static void mine_rows(const Layer *L, Mine *M, const int64_t *map, int64_t n, AttnShape s) {
    int64_t Q = (int64_t)s.n_heads * s.head_dim, KV = (int64_t)s.n_kv_heads * s.head_dim, H = s.n_heads;
    for (int l = 0; l < N_LAYERS; l++) {
        const Layer *y = &L[l];
        Mine *x = &M[l];
        x->q = floats(n * Q), x->dout = floats(n * Q), x->k = floats(n * KV), x->v = floats(n * KV);
        x->out = floats(n * Q), x->lse = floats(n * H), x->delta = floats(n * H), x->dq = floats(n * Q);
        x->dk = floats(n * KV), x->dv = floats(n * KV);
        x->ref_out = floats(n * Q), x->ref_lse = floats(n * H), x->ref_dq = floats(n * Q);
        x->ref_dk = floats(n * KV), x->ref_dv = floats(n * KV);
        for (int64_t i = 0; i < n; i++) {
            int64_t g = map[i];
            memcpy(x->q + i * Q, y->q + g * Q, (size_t)Q * sizeof(float));
            memcpy(x->dout + i * Q, y->dout + g * Q, (size_t)Q * sizeof(float));
            memcpy(x->k + i * KV, y->k + g * KV, (size_t)KV * sizeof(float));
            memcpy(x->v + i * KV, y->v + g * KV, (size_t)KV * sizeof(float));
            memcpy(x->ref_out + i * Q, y->out + g * Q, (size_t)Q * sizeof(float));
            memcpy(x->ref_lse + i * H, y->lse + g * H, (size_t)H * sizeof(float));
            memcpy(x->ref_dq + i * Q, y->dq + g * Q, (size_t)Q * sizeof(float));
            memcpy(x->ref_dk + i * KV, y->dk + g * KV, (size_t)KV * sizeof(float));
            memcpy(x->ref_dv + i * KV, y->dv + g * KV, (size_t)KV * sizeof(float));
        }
        for (int64_t i = 0; i < n * Q; i++) x->out[i] = 1e30f;
        for (int64_t i = 0; i < n * H; i++) x->lse[i] = 1e30f;
    }
}

// The attention under test on member me's n rows, as a model runs it: forward 0, forward 1,
// backward 1, backward 0.
static void run_ops(const AttnUnderTest *x_ops, const Plan *p, int32_t k, int me, Mine *M, int64_t n, AttnShape s) {
    AttnOps ops = x_ops->prepare(x_ops->ctx, p, k, me);
    int32_t *lp = xcalloc((size_t)n, sizeof *lp), *ls = xcalloc((size_t)n, sizeof *ls);
    mb_layout(p, k, me, lp, ls);
    AttnRows mine = {.pos = lp, .seg = ls, .n = (int)n};
    CHECK(ops.collective == 1, "distributed attention ops must be collective");
    for (int l = 0; l < N_LAYERS; l++) {
        Mine *x = &M[l];
        CHECK_OK(ops.forward(ops.ctx, l, x->out, x->lse, x->q, x->k, x->v, mine, s));
    }
    for (int l = N_LAYERS - 1; l >= 0; l--) {
        Mine *x = &M[l];
        attn_backward_delta(x->delta, x->dout, x->out, (int)n, s);
        CHECK_OK(ops.backward(ops.ctx, l, x->dq, x->dk, x->dv, x->dout, x->lse, x->delta, x->q, x->k, x->v, mine, s));
    }
    if (x_ops->after) x_ops->after(x_ops->ctx, p, k);
    free(lp), free(ls);
}

// Every rank checks (the comparisons are collective; n = 0 outside the item): out, lse, dq, dk, dv
// of both layers against the reference rows.
static void check_layers(const Mine *M, int me, int64_t n, AttnShape s, const char *tag, int32_t k, int D,
                         int64_t T) {
    int64_t Q = (int64_t)s.n_heads * s.head_dim, KV = (int64_t)s.n_kv_heads * s.head_dim, H = s.n_heads;
    for (int l = 0; l < N_LAYERS; l++) {
        const Mine *x = &M[l];
        char what[160];
        snprintf(what, sizeof what, "%s item %d (D %d, %lld rows, member %d of %lld rows) layer %d", tag, k, D,
                 (long long)T, me, (long long)n, l);
        if (me >= 0) check_lse(x->lse, x->ref_lse, n * H, what);
        n_checks++;
        char w2[200];
        snprintf(w2, sizeof w2, "%s out", what);
        check_rel(x->out, x->ref_out, n * Q, w2);
        snprintf(w2, sizeof w2, "%s dq", what);
        check_rel(x->dq, x->ref_dq, n * Q, w2);
        snprintf(w2, sizeof w2, "%s dk", what);
        check_rel(x->dk, x->ref_dk, n * KV, w2);
        snprintf(w2, sizeof w2, "%s dv", what);
        check_rel(x->dv, x->ref_dv, n * KV, w2);
    }
}

static void free_layers(Layer *L, Mine *M) {
    for (int l = 0; l < N_LAYERS; l++) {
        Layer *y = &L[l];
        free(y->q), free(y->k), free(y->v), free(y->dout), free(y->out), free(y->lse), free(y->dq), free(y->dk),
            free(y->dv);
        Mine *x = &M[l];
        free(x->q), free(x->k), free(x->v), free(x->dout), free(x->out), free(x->lse), free(x->delta), free(x->dq),
            free(x->dk), free(x->dv), free(x->ref_out), free(x->ref_lse), free(x->ref_dq), free(x->ref_dk),
            free(x->ref_dv);
    }
}

// Run and check item k of plan p with the attention x. rng is shared: every rank draws the same numbers.
static void run_item(const AttnUnderTest *x_ops, const Plan *p, int32_t k, AttnShape s, Rng *rng, const char *tag) {
    const Item *it = &p->items[k];
    int64_t T = it->tokens, Q = (int64_t)s.n_heads * s.head_dim, KV = (int64_t)s.n_kv_heads * s.head_dim;
    int64_t *base, **map, *rows;
    int32_t *pos, *seg;
    item_rows(p, k, &base, &pos, &seg);
    member_maps(p, k, base, &map, &rows);
    Layer L[N_LAYERS];
    draw_layers(L, T, Q, KV, rng);

    int me = mb_member_index(p, k, mpi_comm->rank);
    int64_t n = me >= 0 ? rows[me] : 0;
    Mine M[N_LAYERS];
    memset(M, 0, sizeof M);
    reference_layers(L, T, pos, seg, s);  // collective
    if (me >= 0) {
        mine_rows(L, M, map[me], n, s);
        run_ops(x_ops, p, k, me, M, n, s);
    }
    check_layers(M, me, n, s, tag, k, it->n_ranks, T);

    free_layers(L, M);
    for (int m = 0; m < it->n_ranks; m++) free(map[m]);
    free(map), free(rows), free(base), free(pos), free(seg);
}

#endif
