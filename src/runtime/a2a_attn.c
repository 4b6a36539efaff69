// a2a_attn.c: all-to-all (Ulysses) and hybrid attention over one plan item's ranks (a2a_attn.h).
#include "bytescale/a2a_attn.h"

#include <stdlib.h>
#include <string.h>

#include "bytescale/attention.h"
#include "bytescale/error.h"
#include "bytescale/microbatch.h"
#include "bytescale/timer.h"

void a2a_attn_init(A2aAttn *a, Comm *comm, AttnShape shape) {
    memset(a, 0, sizeof *a);
    a->comm = comm;
    a->shape = shape;
    ring_attn_init(&a->ring, comm, shape);
}

void a2a_attn_free(A2aAttn *a) {
    free(a->ranks);
    free(a->off);
    free(a->pos);
    free(a->seg);
    free(a->qh);
    free(a->kvh);
    free(a->nq);
    free(a->nk);
    free(a->buf);
    free(a->reqs);
    ring_attn_free(&a->ring);
    memset(a, 0, sizeof *a);
}

// ---- set-up -------------------------------------------------------------------------------------

static int grow_group(A2aAttn *a, int u) {
    if (u <= a->cap_u) return 0;
    int H = a->shape.n_heads;
    void **bufs[] = {(void **)&a->ranks, (void **)&a->off, (void **)&a->qh, (void **)&a->kvh,
                     (void **)&a->nq,    (void **)&a->nk,  (void **)&a->reqs};
    size_t sizes[] = {(size_t)u * sizeof(int32_t), (size_t)(u + 1) * sizeof(int64_t), (size_t)u * H * sizeof(int),
                      (size_t)u * H * sizeof(int), (size_t)u * sizeof(int), (size_t)u * sizeof(int),
                      (size_t)12 * u * sizeof(CommReq)};
    for (int i = 0; i < 7; i++) {
        void *b = bs_realloc(*bufs[i], sizes[i]);
        if (!b) return -1;
        *bufs[i] = b;
    }
    a->cap_u = u;
    return 0;
}

// Member d's query heads [d H / u, (d + 1) H / u) and the K/V heads they read: the distinct ones when
// the kernel's GQA rule (local query head i reads local K/V head i / (nq / nk)) maps them right,
// otherwise one K/V head per query head.
static void split_heads(A2aAttn *a) {
    int H = a->shape.n_heads, G = H / a->shape.n_kv_heads, u = a->u;
    for (int d = 0; d < u; d++) {
        int h0 = d * H / u, n = (d + 1) * H / u - h0, kv0 = h0 / G, nk = (h0 + n - 1) / G - kv0 + 1;
        int lined = n % nk == 0;
        for (int i = 0; lined && i < n; i++) lined = (h0 + i) / G - kv0 == i / (n / nk);
        a->nq[d] = n;
        a->nk[d] = lined ? nk : n;
        for (int i = 0; i < n; i++) {
            a->qh[d * H + i] = h0 + i;
            if (!lined) a->kvh[d * H + i] = (h0 + i) / G;
        }
        for (int i = 0; lined && i < nk; i++) a->kvh[d * H + i] = kv0 + i;
    }
}

// The float buffers, carved out of one arena: the group's rows on this member's heads, and the
// packed rows of one exchange (at most: every other member's heads of Q, K, V, dO, lse, delta).
static int carve_buffers(A2aAttn *a) {
    int64_t rows = a->off[a->u], mine = a->off[a->me + 1] - a->off[a->me], hd = a->shape.head_dim;
    int64_t H = a->shape.n_heads, kv_all = 0;
    for (int d = 0; d < a->u; d++) kv_all += a->nk[d];
    int64_t qn = rows * a->nq[a->me] * hd, kn = rows * a->nk[a->me] * hd, ln = rows * a->nq[a->me];
    int64_t xn = mine * (2 * H * hd + 2 * kv_all * hd + 2 * H);
    int64_t need = 4 * qn + 4 * kn + 2 * ln + 2 * xn;
    if (need > a->cap_buf) {
        float *b = bs_realloc(a->buf, (size_t)(need > 0 ? need : 1) * sizeof(float));
        if (!b) return bs_fail_ctx("all-to-all attention for %lld rows", (long long)rows);
        a->buf = b;
        a->cap_buf = need;
    }
    float *at = a->buf;
    float **qs[] = {&a->q, &a->out, &a->dout, &a->dq}, **ks[] = {&a->k, &a->v, &a->dk, &a->dv};
    for (int i = 0; i < 4; i++) *qs[i] = at, at += qn;
    for (int i = 0; i < 4; i++) *ks[i] = at, at += kn;
    a->lse = at, at += ln;
    a->delta = at, at += ln;
    a->send = at, at += xn;
    a->recv = at;
    return 0;
}

static int take_layout(A2aAttn *a, const Plan *p, int32_t k, int g) {
    a->off[0] = 0;
    for (int d = 0; d < a->u; d++) a->off[d + 1] = a->off[d] + mb_member_rows(p, k, g * a->u + d);
    int64_t rows = a->off[a->u];
    if (rows > (1 << 30)) return bs_fail("an all-to-all group of %lld rows", (long long)rows);
    if (rows > a->cap_rows) {
        int32_t *pos = bs_realloc(a->pos, (size_t)rows * sizeof *pos);
        if (pos) a->pos = pos;
        int32_t *seg = pos ? bs_realloc(a->seg, (size_t)rows * sizeof *seg) : NULL;
        if (!seg) return bs_fail_ctx("all-to-all attention for %lld rows", (long long)rows);
        a->seg = seg;
        a->cap_rows = rows;
    }
    for (int d = 0; d < a->u; d++) mb_layout(p, k, g * a->u + d, a->pos + a->off[d], a->seg + a->off[d]);
    return 0;
}

int a2a_attn_prepare(A2aAttn *a, const Plan *p, int32_t k) {
    const Item *it = &p->items[k];
    ItemKind kind = plan_item_kind(p, k);
    int D = it->n_ranks, m = mb_member_index(p, k, a->comm->rank), H = a->shape.n_heads;
    int u = kind == ITEM_HYBRID ? it->ulysses : D;
    if ((kind != ITEM_A2A && kind != ITEM_HYBRID) || m < 0 || u < 2 || D % u != 0)
        return bs_fail("rank %d is not a member of an all-to-all group (%d ranks, groups of %d)", a->comm->rank, D, u);
    if (u > H)
        return bs_fail("an all-to-all group of %d members, but a TP shard has %d query heads (every member needs one)",
                       u, H);
    if (grow_group(a, u) != 0) return -1;
    int g = m / u;
    a->u = u;
    a->me = m % u;
    a->hybrid = kind == ITEM_HYBRID;
    for (int d = 0; d < u; d++) a->ranks[d] = p->ranks[it->rank_begin + g * u + d];
    if (take_layout(a, p, k, g) != 0) return -1;
    split_heads(a);
    if (carve_buffers(a) != 0) return -1;
    if (!a->hybrid) return 0;
    AttnShape mine = {.n_heads = a->nq[a->me], .n_kv_heads = a->nk[a->me], .head_dim = a->shape.head_dim};
    return ring_attn_prepare_groups(&a->ring, p, k, u, mine);
}

// ---- the exchanges ------------------------------------------------------------------------------

// One tensor an exchange moves: this member's rows with every head, and the group's rows with this
// member's heads.
typedef struct {
    float *local;  // (rows of this member, all heads, e)
    float *group;  // (rows of the group, heads of this member, e)
    int e;         // floats per head: head_dim, or 1 for lse / delta
    int kv;        // 0: query heads, 1: K/V heads
} Field;

static const int *heads_of(const A2aAttn *a, const Field *f, int d, int *n) {
    *n = f->kv ? a->nk[d] : a->nq[d];
    return (f->kv ? a->kvh : a->qh) + (size_t)d * a->shape.n_heads;
}

static int64_t member_rows(const A2aAttn *a, int d) { return a->off[d + 1] - a->off[d]; }

// (T, n_all, e) -> (T, n, e): the listed heads of every row.
static void take_heads(float *dst, const float *src, int64_t T, int n_all, int e, const int *heads, int n) {
    for (int64_t t = 0; t < T; t++)
        for (int i = 0; i < n; i++)
            memcpy(dst + (t * n + i) * e, src + (t * n_all + heads[i]) * e, (size_t)e * sizeof(float));
}

// (T, n, e) back into the listed heads of (T, n_all, e): set, or added (replicated K/V heads'
// gradients sum at their owner; a head may be listed twice).
static void put_heads(float *dst, const float *src, int64_t T, int n_all, int e, const int *heads, int n, int add) {
    for (int64_t t = 0; t < T; t++)
        for (int i = 0; i < n; i++) {
            float *o = dst + (t * n_all + heads[i]) * e;
            const float *s = src + (t * n + i) * e;
            for (int c = 0; c < e; c++) o[c] = add ? o[c] + s[c] : s[c];
        }
}

static int wait_all(A2aAttn *a, int n, double t0) {
    for (int i = 0; i < n; i++)
        if (comm_wait(a->comm, &a->reqs[i]) != 0) return -1;
    a->stats.wait += now_seconds() - t0;
    return 0;
}

static int n_all_of(const A2aAttn *a, const Field *f) { return f->kv ? a->shape.n_kv_heads : a->shape.n_heads; }

// Scattered by heads, gathered by rows: member d receives its heads of every member's rows, member
// s's at group rows off[s]. Each pair's messages go in field order on one tag, received in that order.
static int scatter(A2aAttn *a, const Field *f, int nf, int tag) {
    double t0 = now_seconds();
    int me = a->me, nr = 0, n;
    int64_t T = member_rows(a, me);
    for (int s = 0; s < a->u; s++)
        for (int i = 0; i < nf && s != me; i++) {
            heads_of(a, &f[i], me, &n);
            size_t bytes = (size_t)(member_rows(a, s) * n * f[i].e) * sizeof(float);
            if (comm_irecv(a->comm, f[i].group + a->off[s] * n * f[i].e, bytes, a->ranks[s], tag, &a->reqs[nr++]) != 0)
                return -1;
        }
    float *at = a->send;
    for (int d = 0; d < a->u; d++)
        for (int i = 0; i < nf; i++) {
            const int *h = heads_of(a, &f[i], d, &n);
            float *dst = d == me ? f[i].group + a->off[me] * n * f[i].e : at;
            take_heads(dst, f[i].local, T, n_all_of(a, &f[i]), f[i].e, h, n);
            if (d == me) continue;
            size_t bytes = (size_t)(T * n * f[i].e) * sizeof(float);
            if (comm_isend(a->comm, at, bytes, a->ranks[d], tag, &a->reqs[nr++]) != 0) return -1;
            a->stats.bytes_sent += (double)bytes;
            at += T * n * f[i].e;
        }
    return wait_all(a, nr, t0);
}

// The way back: member d's rows of the group buffers go home to d, which puts (or adds) the heads of
// each sender into its own rows.
static int gather(A2aAttn *a, const Field *f, int nf, int tag, int add) {
    double t0 = now_seconds();
    int me = a->me, nr = 0, n;
    int64_t T = member_rows(a, me);
    float *at = a->recv;
    for (int s = 0; s < a->u; s++)
        for (int i = 0; i < nf && s != me; i++) {
            heads_of(a, &f[i], s, &n);
            size_t bytes = (size_t)(T * n * f[i].e) * sizeof(float);
            if (comm_irecv(a->comm, at, bytes, a->ranks[s], tag, &a->reqs[nr++]) != 0) return -1;
            at += T * n * f[i].e;
        }
    for (int d = 0; d < a->u; d++)
        for (int i = 0; i < nf && d != me; i++) {
            heads_of(a, &f[i], me, &n);
            size_t bytes = (size_t)(member_rows(a, d) * n * f[i].e) * sizeof(float);
            if (comm_isend(a->comm, f[i].group + a->off[d] * n * f[i].e, bytes, a->ranks[d], tag, &a->reqs[nr++]) != 0)
                return -1;
            a->stats.bytes_sent += (double)bytes;
        }
    for (int i = 0; i < nf; i++) {  // this member's own rows, while the others travel
        const int *h = heads_of(a, &f[i], me, &n);
        put_heads(f[i].local, f[i].group + a->off[me] * n * f[i].e, T, n_all_of(a, &f[i]), f[i].e, h, n, add);
    }
    if (wait_all(a, nr, t0) != 0) return -1;
    at = a->recv;
    for (int s = 0; s < a->u; s++)
        for (int i = 0; i < nf && s != me; i++) {
            const int *h = heads_of(a, &f[i], s, &n);
            put_heads(f[i].local, at, T, n_all_of(a, &f[i]), f[i].e, h, n, add);
            at += T * n * f[i].e;
        }
    return 0;
}

// ---- forward and backward -----------------------------------------------------------------------

static int check_rows(const A2aAttn *a, AttnRows rows) {
    int64_t mine = member_rows(a, a->me);
    if (rows.n != mine)
        return bs_fail("all-to-all attention: %d local rows, the plan gives this rank %lld", rows.n, (long long)mine);
    return 0;
}

static AttnShape my_shape(const A2aAttn *a) {
    return (AttnShape){.n_heads = a->nq[a->me], .n_kv_heads = a->nk[a->me], .head_dim = a->shape.head_dim};
}

static int a2a_forward(void *ctx, int layer, float *out, float *lse, const float *q, const float *k, const float *v,
                       AttnRows rows, AttnShape s) {
    A2aAttn *a = ctx;
    int hd = s.head_dim;
    if (check_rows(a, rows) != 0) return -1;
    // the inputs are only read: local is not written by a scatter
    Field in[3] = {{(float *)q, a->q, hd, 0}, {(float *)k, a->k, hd, 1}, {(float *)v, a->v, hd, 1}};
    if (scatter(a, in, 3, A2A_TAG_FWD) != 0) return -1;
    AttnRows g = {.pos = a->pos, .seg = a->seg, .n = (int)a->off[a->u]};
    double t0 = now_seconds();
    if (a->hybrid) {
        if (ring_attn_ops(&a->ring).forward(&a->ring, layer, a->out, a->lse, a->q, a->k, a->v, g, my_shape(a)) != 0)
            return -1;
    } else if (g.n > 0) {
        attn_forward(a->out, a->lse, a->q, g, a->k, a->v, g, my_shape(a));
        a->stats.compute += now_seconds() - t0;
    }
    Field back[2] = {{out, a->out, hd, 0}, {lse, a->lse, 1, 0}};
    return gather(a, back, 2, A2A_TAG_OUT, 0);
}

static int a2a_backward(void *ctx, int layer, float *dq, float *dk, float *dv, const float *dout, const float *lse,
                        const float *delta, const float *q, const float *k, const float *v, AttnRows rows,
                        AttnShape s) {
    A2aAttn *a = ctx;
    int hd = s.head_dim;
    if (check_rows(a, rows) != 0) return -1;
    Field in[6] = {{(float *)q, a->q, hd, 0},       {(float *)k, a->k, hd, 1},     {(float *)v, a->v, hd, 1},
                   {(float *)dout, a->dout, hd, 0}, {(float *)lse, a->lse, 1, 0}, {(float *)delta, a->delta, 1, 0}};
    if (scatter(a, in, 6, A2A_TAG_BWD) != 0) return -1;
    AttnRows g = {.pos = a->pos, .seg = a->seg, .n = (int)a->off[a->u]};
    AttnShape sh = my_shape(a);
    int64_t qn = (int64_t)g.n * sh.n_heads * hd, kn = (int64_t)g.n * sh.n_kv_heads * hd;
    memset(a->dq, 0, (size_t)qn * sizeof(float));
    memset(a->dk, 0, (size_t)kn * sizeof(float));
    memset(a->dv, 0, (size_t)kn * sizeof(float));
    double t0 = now_seconds();
    if (a->hybrid) {
        if (ring_attn_ops(&a->ring).backward(&a->ring, layer, a->dq, a->dk, a->dv, a->dout, a->lse, a->delta, a->q,
                                             a->k, a->v, g, sh) != 0)
            return -1;
    } else if (g.n > 0) {
        attn_backward(a->dq, a->dk, a->dv, a->dout, a->lse, a->delta, a->q, g, a->k, a->v, g, sh);
        a->stats.compute += now_seconds() - t0;
    }
    Field back[3] = {{dq, a->dq, hd, 0}, {dk, a->dk, hd, 1}, {dv, a->dv, hd, 1}};
    return gather(a, back, 3, A2A_TAG_GRAD, 1);
}

AttnOps a2a_attn_ops(A2aAttn *a) {
    return (AttnOps){.forward = a2a_forward, .backward = a2a_backward, .ctx = a, .collective = 1};
}
