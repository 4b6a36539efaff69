// ring_attn.c: ring attention over one plan item's ranks (ring_attn.h).
#include "bytescale/ring_attn.h"

#include <stdlib.h>
#include <string.h>

#include "bytescale/attention.h"
#include "bytescale/error.h"
#include "bytescale/microbatch.h"
#include "bytescale/timer.h"

// Query rows per kernel call: small enough that MPI's progress engine is called often while a block
// computes, large enough that a call is a full tile of the kernel (ATTN_MAX_TILE_ROWS).
enum { RING_SLICE_ROWS = 256 };

void ring_attn_init(RingAttn *r, Comm *comm, AttnShape shape) {
    memset(r, 0, sizeof *r);
    r->comm = comm;
    r->shape = shape;
    r->slice_rows = RING_SLICE_ROWS;
}

void ring_attn_free(RingAttn *r) {
    free(r->off);
    free(r->pos);
    free(r->seg);
    for (int i = 0; i < 2; i++) {
        free(r->kv[i]);
        free(r->acc[i]);
    }
    free(r->inc);
    free(r->out_part);
    free(r->lse_part);
    memset(r, 0, sizeof *r);
}

static int grow_floats(float **p, int64_t n) {
    float *q = bs_realloc(*p, (size_t)(n > 0 ? n : 1) * sizeof(float));
    if (!q) return -1;
    *p = q;
    return 0;
}

// Parts of the ring: part g is the members g*u .. g*u+u-1 of item k (u = 1: each member is a part;
// a hybrid item: a Ulysses group), its rows those members' rows back to back.
static int64_t part_rows(const Plan *p, int32_t k, int u, int g) {
    int64_t n = 0;
    for (int j = 0; j < u; j++) n += mb_member_rows(p, k, g * u + j);
    return n;
}

int ring_attn_prepare_groups(RingAttn *r, const Plan *p, int32_t k, int u, AttnShape shape) {
    const Item *it = &p->items[k];
    int m = mb_member_index(p, k, r->comm->rank);
    if (u < 1 || it->n_ranks % u != 0 || m < 0 || it->n_ranks / u < 2)
        return bs_fail("plan item %d: rank %d is not a member of a ring (%d ranks in groups of %d)", k, r->comm->rank,
                       it->n_ranks, u);
    int D = it->n_ranks / u, me = m / u, j = m % u;
    int64_t *off = bs_realloc(r->off, (size_t)(D + 1) * sizeof *off);
    if (!off) return -1;
    r->off = off;
    r->shape = shape;
    r->D = D;
    r->me = me;
    // member j of a group rings with member j of the neighbouring groups: the same heads
    r->ranks[0] = p->ranks[it->rank_begin + ((me + D - 1) % D) * u + j];
    r->ranks[1] = p->ranks[it->rank_begin + ((me + 1) % D) * u + j];
    off[0] = 0;
    int64_t most = 0;
    for (int g = 0; g < D; g++) {
        int64_t n = part_rows(p, k, u, g);
        off[g + 1] = off[g] + n;
        if (n > most) most = n;
    }
    if (most > (1 << 30)) return bs_fail("plan item %d: a ring member holds %lld rows", k, (long long)most);
    r->max_rows = (int)most;
    if (off[D] > r->cap_rows) {
        int32_t *pos = bs_realloc(r->pos, (size_t)off[D] * sizeof *pos);
        if (pos) r->pos = pos;
        int32_t *seg = pos ? bs_realloc(r->seg, (size_t)off[D] * sizeof *seg) : NULL;
        if (!seg) return bs_fail_ctx("ring attention for %lld rows", (long long)off[D]);
        r->seg = seg;
        r->cap_rows = off[D];
    }
    for (int g = 0; g < D; g++)
        for (int i = 0, at = (int)off[g]; i < u; i++) {
            mb_layout(p, k, g * u + i, r->pos + at, r->seg + at);
            at += (int)mb_member_rows(p, k, g * u + i);
        }

    int64_t kv = (int64_t)r->shape.n_kv_heads * r->shape.head_dim, need = most * 2 * kv;
    if (need > r->cap_buf) {
        for (int i = 0; i < 2; i++)
            if (grow_floats(&r->kv[i], need) != 0 || grow_floats(&r->acc[i], need) != 0) return -1;
        if (grow_floats(&r->inc, need) != 0) return -1;
        r->cap_buf = need;
    }
    int64_t mine = off[me + 1] - off[me], q = (int64_t)r->shape.n_heads * r->shape.head_dim;
    if (mine * q > r->cap_q) {
        if (grow_floats(&r->out_part, mine * q) != 0 || grow_floats(&r->lse_part, mine * r->shape.n_heads) != 0)
            return -1;
        r->cap_q = mine * q;
    }
    return 0;
}

int ring_attn_prepare(RingAttn *r, const Plan *p, int32_t k) { return ring_attn_prepare_groups(r, p, k, 1, r->shape); }

// ---- helpers ------------------------------------------------------------------------------------

static AttnRows member_rows(const RingAttn *r, int j) {
    return (AttnRows){.pos = r->pos + r->off[j], .seg = r->seg + r->off[j], .n = (int)(r->off[j + 1] - r->off[j])};
}

static int64_t block_floats(const RingAttn *r, int j) {
    return (r->off[j + 1] - r->off[j]) * 2 * (int64_t)r->shape.n_kv_heads * r->shape.head_dim;
}

// Test every active request once: the transfers move on inside the MPI library.
static int progress(RingAttn *r, CommReq *reqs, int n) {
    for (int i = 0; i < n; i++) {
        int done;
        if (reqs[i].active && comm_test(r->comm, &reqs[i], &done) != 0) return -1;
    }
    return 0;
}

static int wait_all(RingAttn *r, CommReq *reqs, int n) {
    double t0 = now_seconds();
    for (int i = 0; i < n; i++)
        if (comm_wait(r->comm, &reqs[i]) != 0) return -1;
    double t1 = now_seconds();
    r->stats.wait += t1 - t0;
    if (r->trace && t1 - t0 > 1e-6) r->trace(r->trace_ctx, "ring wait", t0, t1);
    return 0;
}

static void pack_kv(float *dst, const float *k, const float *v, int64_t n_floats) {
    memcpy(dst, k, (size_t)n_floats * sizeof(float));
    memcpy(dst + n_floats, v, (size_t)n_floats * sizeof(float));
}

static int send_block(RingAttn *r, const float *buf, int j, int tag, CommReq *req) {
    r->stats.bytes_sent += (double)block_floats(r, j) * sizeof(float);
    return comm_isend(r->comm, buf, (size_t)block_floats(r, j) * sizeof(float), r->ranks[1], tag, req);
}

static int recv_block(RingAttn *r, float *buf, int j, int tag, CommReq *req) {
    return comm_irecv(r->comm, buf, (size_t)block_floats(r, j) * sizeof(float), r->ranks[0], tag, req);
}

// A layer's start: its rows must be the ones the plan gives this member; its own K/V go in hand.
static int begin_layer(RingAttn *r, AttnRows rows, const float *k, const float *v, AttnRows *mine) {
    *mine = member_rows(r, r->me);
    if (rows.n != mine->n)
        return bs_fail("ring attention: %d local rows, the plan gives this rank %d", rows.n, mine->n);
    pack_kv(r->kv[0], k, v, (int64_t)mine->n * r->shape.n_kv_heads * r->shape.head_dim);
    return 0;
}

// Step t of D: the next block arrives into the spare buffer while the block in hand (member j's,
// in kv[cur]) is computed and passed on. The last step has nothing left to pass.
static int post_kv_step(RingAttn *r, int t, int cur, int tag, CommReq reqs[2]) {
    int D = r->D, j = (r->me - t + D) % D, jn = (r->me - t - 1 + 2 * D) % D;
    if (t == D - 1) return 0;
    if (recv_block(r, r->kv[1 - cur], jn, tag, &reqs[0]) != 0) return -1;
    return send_block(r, r->kv[cur], j, tag, &reqs[1]);
}

// ---- forward ------------------------------------------------------------------------------------

static int ring_forward(void *ctx, int layer, float *out, float *lse, const float *q, const float *k, const float *v,
                        AttnRows rows, AttnShape s) {
    (void)layer;
    RingAttn *r = ctx;
    int D = r->D, me = r->me, H = s.n_heads;
    int64_t Q = (int64_t)s.n_heads * s.head_dim, KV = (int64_t)s.n_kv_heads * s.head_dim;
    AttnRows mine;
    if (begin_layer(r, rows, k, v, &mine) != 0) return -1;
    int cur = 0;
    for (int t = 0; t < D; t++) {
        int j = (me - t + D) % D;
        CommReq reqs[2] = {{0}};
        if (post_kv_step(r, t, cur, RING_TAG_FWD_KV, reqs) != 0) return -1;
        AttnRows kr = member_rows(r, j);
        const float *kb = r->kv[cur], *vb = r->kv[cur] + (int64_t)kr.n * KV;
        double t0 = now_seconds();
        for (int qs = 0; qs < mine.n && kr.n > 0; qs += r->slice_rows) {
            int nq = mine.n - qs < r->slice_rows ? mine.n - qs : r->slice_rows;
            AttnRows qr = {.pos = mine.pos + qs, .seg = mine.seg + qs, .n = nq};
            if (t == 0) {
                attn_forward(out + qs * Q, lse + (int64_t)qs * H, q + qs * Q, qr, kb, vb, kr, s);
            } else {
                attn_forward(r->out_part, r->lse_part, q + qs * Q, qr, kb, vb, kr, s);
                attn_merge(out + qs * Q, lse + (int64_t)qs * H, r->out_part, r->lse_part, nq, s);
            }
            if (progress(r, reqs, 2) != 0) return -1;
        }
        double t1 = now_seconds();
        r->stats.compute += t1 - t0;
        if (r->trace) r->trace(r->trace_ctx, "ring fwd block", t0, t1);
        if (wait_all(r, reqs, 2) != 0) return -1;
        r->stats.steps++;
        cur = 1 - cur;
    }
    return 0;
}

// ---- backward -----------------------------------------------------------------------------------

static int ring_backward(void *ctx, int layer, float *dq, float *dk, float *dv, const float *dout, const float *lse,
                         const float *delta, const float *q, const float *k, const float *v, AttnRows rows,
                         AttnShape s) {
    (void)layer;
    RingAttn *r = ctx;
    int D = r->D, me = r->me, H = s.n_heads;
    int64_t Q = (int64_t)s.n_heads * s.head_dim, KV = (int64_t)s.n_kv_heads * s.head_dim;
    AttnRows mine;
    if (begin_layer(r, rows, k, v, &mine) != 0) return -1;
    int cur = 0;
    CommReq sent = {0};  // the dK/dV partial that left last step (its buffer is reused the step after)
    for (int t = 0; t < D; t++) {
        int j = (me - t + D) % D;
        CommReq reqs[4] = {{0}};
        if (post_kv_step(r, t, cur, RING_TAG_BWD_KV, reqs) != 0) return -1;
        // block j's partial dK/dV from the members before this one arrives while this one computes
        if (t > 0 && recv_block(r, r->inc, j, RING_TAG_BWD_DKV, &reqs[2]) != 0) return -1;
        reqs[3] = sent;
        AttnRows kr = member_rows(r, j);
        const float *kb = r->kv[cur], *vb = r->kv[cur] + (int64_t)kr.n * KV;
        float *acc = r->acc[t % 2];
        int64_t nb = block_floats(r, j);
        memset(acc, 0, (size_t)nb * sizeof(float));
        double t0 = now_seconds();
        for (int qs = 0; qs < mine.n && kr.n > 0; qs += r->slice_rows) {
            int nq = mine.n - qs < r->slice_rows ? mine.n - qs : r->slice_rows;
            AttnRows qr = {.pos = mine.pos + qs, .seg = mine.seg + qs, .n = nq};
            attn_backward(dq + qs * Q, acc, acc + (int64_t)kr.n * KV, dout + qs * Q, lse + (int64_t)qs * H,
                          delta + (int64_t)qs * H, q + qs * Q, qr, kb, vb, kr, s);
            if (progress(r, reqs, 4) != 0) return -1;
        }
        double t1 = now_seconds();
        r->stats.compute += t1 - t0;
        if (r->trace) r->trace(r->trace_ctx, "ring bwd block", t0, t1);
        if (wait_all(r, reqs + 2, 2) != 0) return -1;  // the incoming partial, and last step's send
        if (t > 0)
            for (int64_t i = 0; i < nb; i++) acc[i] += r->inc[i];
        // on to the next member; at t = D-1 block j is the next member's own: its sum goes home
        if (send_block(r, acc, j, RING_TAG_BWD_DKV, &sent) != 0) return -1;
        if (wait_all(r, reqs, 2) != 0) return -1;
        r->stats.steps++;
        cur = 1 - cur;
    }
    // this rank's own block comes home from the previous member with every member's share
    CommReq home = {0};
    if (recv_block(r, r->inc, me, RING_TAG_BWD_DKV, &home) != 0) return -1;
    CommReq last[2] = {home, sent};
    if (wait_all(r, last, 2) != 0) return -1;
    int64_t n = (int64_t)mine.n * KV;
    for (int64_t i = 0; i < n; i++) {
        dk[i] += r->inc[i];
        dv[i] += r->inc[n + i];
    }
    return 0;
}

AttnOps ring_attn_ops(RingAttn *r) {
    return (AttnOps){.forward = ring_forward, .backward = ring_backward, .ctx = r, .collective = 1};
}
