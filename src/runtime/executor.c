// executor.c: this rank's plan items -> micro-batches -> gradients (executor.h).
#include "bytescale/executor.h"

#include <stdlib.h>
#include <string.h>

#include "bytescale/error.h"
#include "bytescale/timer.h"

// ---- reading a step's rows ----------------------------------------------------------------------

void step_rows_free(StepRows *r) {
    free(r->item);
    free(r->off);
    free(r->tokens);
    free(r->targets);
    free(r->pos);
    free(r->seg);
    free(r->scratch);
    memset(r, 0, sizeof *r);
}

static int reserve_rows(StepRows *r, int64_t items, int64_t rows, int64_t scratch) {
    if (items < 1) items = 1;  // off[0] exists even for a rank the plan leaves idle
    if (items > r->cap_items) {
        int32_t *item = bs_realloc(r->item, (size_t)items * sizeof *item);
        if (item) r->item = item;
        int64_t *off = item ? bs_realloc(r->off, (size_t)(items + 1) * sizeof *off) : NULL;
        if (!off) return -1;
        r->off = off;
        r->cap_items = items;
    }
    if (rows > r->cap_rows) {
        int32_t **bufs[] = {&r->tokens, &r->targets, &r->pos, &r->seg};
        for (int i = 0; i < 4; i++) {
            int32_t *b = bs_realloc(*bufs[i], (size_t)rows * sizeof(int32_t));
            if (!b) return -1;
            *bufs[i] = b;
        }
        r->cap_rows = rows;
    }
    if (scratch > r->cap_scratch) {
        uint32_t *s = bs_realloc(r->scratch, (size_t)scratch * sizeof *s);
        if (!s) return -1;
        r->scratch = s;
        r->cap_scratch = scratch;
    }
    return 0;
}

int step_rows_read(StepRows *r, const Plan *p, int rank, int need, const TokenSource *src) {
    if (rank < 0 || rank >= p->n_ranks) return bs_fail("rank %d is not in a plan for %d ranks", rank, p->n_ranks);
    int32_t first = p->rank_begin[rank], end = p->rank_begin[rank + 1];
    int64_t rows = 0, most = 0;
    for (int32_t i = first; i < end; i++) {
        int64_t n = mb_member_rows(p, p->rank_items[i], mb_member_index(p, p->rank_items[i], rank));
        rows += n;
        if (n > most) most = n;
    }
    if (reserve_rows(r, end - first, rows > 0 ? rows : 1, most + 1) != 0)
        return bs_fail_ctx("rank %d: room for %lld rows of %d items", rank, (long long)rows, end - first);
    r->n_items = end - first;
    r->n_targets = 0;
    r->off[0] = 0;
    for (int32_t i = 0; i < r->n_items; i++) {
        int32_t k = p->rank_items[first + i];
        int m = mb_member_index(p, k, rank);
        int64_t at = r->off[i], n_t;
        r->item[i] = k;
        r->off[i + 1] = at + mb_member_rows(p, k, m);
        mb_layout(p, k, m, r->pos + at, r->seg + at);
        if (mb_read(p, k, m, need, src, r->tokens + at, r->targets + at, r->scratch, &n_t) != 0)
            return bs_fail_ctx("rank %d", rank);
        r->n_targets += n_t;
    }
    return 0;
}

// ---- running the items ------------------------------------------------------------------------------

void executor_init(Executor *e, Comm *comm, Llama *llama) {
    memset(e, 0, sizeof *e);
    e->comm = comm;
    e->llama = llama;
    // a tp rank's ring carries its own heads only: K/V traffic is 1/tp per process
    AttnShape shard = {.n_heads = llama->n_heads, .n_kv_heads = llama->n_kv_heads, .head_dim = llama->cfg.head_dim};
    ring_attn_init(&e->ring, comm, shard);
    a2a_attn_init(&e->a2a, comm, shard);
}

void executor_free(Executor *e) {
    ring_attn_free(&e->ring);
    a2a_attn_free(&e->a2a);
    if (e->llama) e->llama->attn = attn_ops_local();
    memset(e, 0, sizeof *e);
}

void executor_grads_ready(void *ctx, size_t begin, size_t end) {
    Executor *e = ctx;
    zero1_start(e->zero, e->comm, e->llama->grads, begin, end);
}

int executor_attention(Executor *e, const Plan *p, int32_t k, AttnOps *ops, const char **kind_name) {
    ItemKind kind = plan_item_kind(p, k);
    if (kind == ITEM_A2A || kind == ITEM_HYBRID) {
        *kind_name = kind == ITEM_A2A ? "a2a" : "hybrid";
        if (a2a_attn_prepare(&e->a2a, p, k) != 0) return -1;
        *ops = a2a_attn_ops(&e->a2a);
        return 0;
    }
    if (kind == ITEM_BLOCKS)
        return bs_fail("plan item %d is a block item (the block peer's): the engine runs packs, rings, all-to-all "
                       "and hybrid items",
                       k);
    *kind_name = p->items[k].n_ranks > 1 ? "ring" : "pack";
    if (p->items[k].n_ranks == 1) {
        *ops = attn_ops_local();
        return 0;
    }
    if (ring_attn_prepare(&e->ring, p, k) != 0) return -1;
    *ops = ring_attn_ops(&e->ring);
    return 0;
}

void executor_stats_reset(Executor *e) {
    e->ring.stats = (RingStats){0};
    e->a2a.ring.stats = (RingStats){0};
    e->a2a.stats = (A2aStats){0};
}

void executor_stats_add(const Executor *e, ExecStats *s) {
    const RingStats *r[2] = {&e->ring.stats, &e->a2a.ring.stats};
    for (int i = 0; i < 2; i++) {
        s->ring_compute += r[i]->compute;
        s->ring_wait += r[i]->wait;
        s->ring_bytes += r[i]->bytes_sent;
    }
    s->ring_compute += e->a2a.stats.compute;
    s->ring_wait += e->a2a.stats.wait;
    s->ring_bytes += e->a2a.stats.bytes_sent;
}

int executor_run(Executor *e, const Plan *p, const StepRows *rows, float loss_scale, double *loss_sum,
                 ExecStats *st) {
    Llama *m = e->llama;
    ExecStats s = {0};
    *loss_sum = 0;
    executor_stats_reset(e);
    ActStats act0 = m->act;
    m->act.peak = 0;
    double start = now_seconds();
    for (int32_t i = 0; i < rows->n_items; i++) {
        int32_t k = rows->item[i];
        const Item *it = &p->items[k];
        int64_t at = rows->off[i], T = rows->off[i + 1] - at;
        if (T > m->max_T && llama_reserve(m, (int)T) != 0) return bs_fail_ctx("plan item %d", k);
        const char *kind;
        if (executor_attention(e, p, k, &m->attn, &kind) != 0) return bs_fail_ctx("plan item %d", k);
        s.rings += it->n_ranks > 1;
        MicroBatch mb = {.tokens = rows->tokens + at,
                         .targets = rows->targets + at,
                         .pos = rows->pos + at,
                         .seg = rows->seg + at,
                         .T = (int)T};
        // the last item's backward finishes every gradient range: sync each as soon as it is final
        if (e->zero && i == rows->n_items - 1) {
            m->grad_ready = executor_grads_ready;
            m->grad_ready_ctx = e;
        }
        m->offload_ratio = it->offload;  // the plan's r for this micro-batch (the model's budget applies)
        double t0 = now_seconds(), item_loss;
        int rc = llama_forward_backward(m, &mb, loss_scale, &item_loss, NULL);
        m->attn = attn_ops_local();
        m->grad_ready = NULL;
        m->offload_ratio = 0;
        if (rc != 0)
            return bs_fail_ctx("plan item %d (%s of %d ranks, %lld tokens, offload ratio %g)", k, kind, it->n_ranks,
                               (long long)it->tokens, (double)it->offload);
        if (e->trace) e->trace(e->trace_ctx, kind, k, t0, now_seconds());
        *loss_sum += item_loss;
        s.items++;
        s.rows += T;
    }
    s.seconds = now_seconds() - start;
    executor_stats_add(e, &s);
    s.act_peak = (double)m->act.peak;
    s.offload_bytes = (double)(m->act.offloaded - act0.offloaded);
    s.offload_wait = m->act.wait - act0.wait;
    if (st) *st = s;
    return 0;
}

// ---- ZeRO-1 -------------------------------------------------------------------------------------------

int zero1_init(Zero1 *z, const Comm *comm, const Llama *m) {
    memset(z, 0, sizeof *z);
    size_t n_params = m->n_params;
    int N = comm->size;
    if (n_params > (size_t)2147483647 * (size_t)N)
        return bs_fail("ZeRO-1: %zu parameters over %d ranks is more than an MPI count per shard", n_params, N);
    z->n_buckets = llama_grad_buckets(m);
    z->counts = bs_malloc((size_t)N * sizeof(int));
    z->displs = bs_malloc((size_t)N * sizeof(int));
    z->bucket = bs_malloc((size_t)z->n_buckets * sizeof *z->bucket);
    z->bcounts = bs_malloc((size_t)z->n_buckets * (size_t)N * sizeof(int));
    z->reqs = bs_calloc((size_t)z->n_buckets, sizeof *z->reqs);
    if (!z->counts || !z->displs || !z->bucket || !z->bcounts || !z->reqs) {
        zero1_free(z);
        return -1;
    }
    comm_split((int64_t)n_params, N, z->counts, z->displs);
    z->begin = (size_t)z->displs[comm->rank];
    z->end = z->begin + (size_t)z->counts[comm->rank];
    // each rank's part of a bucket is the bucket's overlap with the rank's shard
    for (int b = 0; b < z->n_buckets; b++) {
        llama_grad_bucket(m, b, &z->bucket[b][0], &z->bucket[b][1]);
        for (int r = 0; r < N; r++) {
            size_t lo = (size_t)z->displs[r], hi = lo + (size_t)z->counts[r];
            size_t a = z->bucket[b][0] > lo ? z->bucket[b][0] : lo, c = z->bucket[b][1] < hi ? z->bucket[b][1] : hi;
            z->bcounts[(size_t)b * N + r] = c > a ? (int)(c - a) : 0;
        }
    }
    z->grad = bs_calloc(z->end > z->begin ? z->end - z->begin : 1, sizeof(float));
    if (!z->grad) {
        zero1_free(z);
        return -1;
    }
    return 0;
}

void zero1_free(Zero1 *z) {
    free(z->counts);
    free(z->displs);
    free(z->grad);
    free(z->bucket);
    free(z->bcounts);
    free(z->reqs);
    memset(z, 0, sizeof *z);
}

void zero1_start(Zero1 *z, Comm *comm, const float *grads, size_t begin, size_t end) {
    int b = z->started;
    if (z->failed) return;
    if (b >= z->n_buckets || z->bucket[b][0] != begin || z->bucket[b][1] != end) {
        z->failed = 1;
        snprintf(z->err, sizeof z->err, "gradient range [%zu, %zu) finished out of order (expected bucket %d)", begin,
                 end, b);
        return;
    }
    // this rank's part of the bucket lands at its place in the shard
    size_t at = begin > z->begin ? begin : z->begin;
    float *recv = z->grad + (at < z->end ? at - z->begin : 0);
    if (comm_ireduce_scatter(comm, grads + begin, recv, z->bcounts + (size_t)b * comm->size, &z->reqs[b]) != 0) {
        z->failed = 1;
        snprintf(z->err, sizeof z->err, "%s", bs_errmsg());
        return;
    }
    z->started++;
    for (int i = 0; i < z->started; i++) {  // drive the collectives in flight
        int done;
        if (z->reqs[i].active) comm_test(comm, &z->reqs[i], &done);
    }
}

int zero1_reduce(Zero1 *z, Comm *comm, const float *grads) {
    while (!z->failed && z->started < z->n_buckets)
        zero1_start(z, comm, grads, z->bucket[z->started][0], z->bucket[z->started][1]);
    for (int b = 0; b < z->n_buckets; b++)
        if (comm_wait(comm, &z->reqs[b]) != 0 && !z->failed) {
            z->failed = 1;
            snprintf(z->err, sizeof z->err, "%s", bs_errmsg());
        }
    z->started = 0;
    if (z->failed) {
        z->failed = 0;
        return bs_fail("gradient reduce-scatter: %s", z->err);
    }
    return 0;
}

int zero1_sumsq(Zero1 *z, Comm *comm, double *sumsq) {
    double s = grad_sumsq(z->grad, z->end - z->begin);
    if (comm_allreduce_sum(comm, &s, 1) != 0) return -1;
    *sumsq = s;
    return 0;
}

int zero1_sumsq_global(Zero1 *z, const Llama *m, Comm *world, double *sumsq) {
    // this shard's sum of squares, replicated tensors (norm gains) counted on tp rank 0 only
    double s = 0;
    for (int i = 0; i < m->n_tensors; i++) {
        const ParamTensor *pt = &m->tensors[i];
        if (pt->split == LLAMA_REPLICATED && m->shard.tp_rank != 0) continue;
        size_t a = pt->offset > z->begin ? pt->offset : z->begin, b = pt->offset + pt->numel;
        if (b > z->end) b = z->end;
        if (b > a) s += grad_sumsq(z->grad + (a - z->begin), b - a);
    }
    if (comm_allreduce_sum(world, &s, 1) != 0) return -1;
    *sumsq = s;
    return 0;
}

int zero1_gather(Zero1 *z, Comm *comm, float *params) { return comm_allgatherv(comm, params, z->counts, z->displs); }
