// pipeline.c: one stage's forwards and backwards in the planner's 1F1B order (pipeline.h).
//
// Why no wait can form a cycle (docs/runtime.md, "Pipeline stages"): give every operation the pair
// (key, stage') with stage' = s for a forward and pp - 1 - s for a backward. An operation waits only
// for (a) the same operation of the item on its ring peers (the same pair), (b) the forward of the
// item on the previous stage (key 2 (q + s - 1), smaller) or the backward on the next stage (the
// same key, smaller stage'), and (c) its tp group, which runs the same operations in the same
// order. Every process runs its operations in increasing pair order, and sends never block. Take
// the smallest pair not yet done anywhere: everything it waits for is smaller, so done, and every
// process that must join it has finished all its smaller operations, so it is running it: it
// completes. By induction every operation does.
#include "bytescale/pipeline.h"

#include <stdlib.h>
#include <string.h>

#include "bytescale/cost.h"
#include "bytescale/error.h"
#include "bytescale/timer.h"

int pipeline_init(Pipeline *pl, Executor *e, const Parallel *par) {
    memset(pl, 0, sizeof *pl);
    pl->exec = e;
    pl->pipe = par->pipe_comm;
    pl->stage = par->stage;
    pl->pp = par->pp;
    int pp = par->pp;
    pl->views = bs_calloc((size_t)pp, sizeof *pl->views);
    pl->made = bs_calloc((size_t)pp, sizeof *pl->made);
    pl->x_in = bs_calloc((size_t)pp, sizeof *pl->x_in);
    pl->cap_in = bs_calloc((size_t)pp, sizeof *pl->cap_in);
    pl->send = bs_calloc((size_t)pp, sizeof *pl->send);
    if (!pl->views || !pl->made || !pl->x_in || !pl->cap_in || !pl->send) {
        pipeline_free(pl);
        return bs_fail_ctx("pipeline stage %d", par->stage);
    }
    return 0;
}

void pipeline_free(Pipeline *pl) {
    for (int i = 0; pl->made && i < pl->pp; i++)
        if (pl->made[i]) llama_free(&pl->views[i]);
    for (int i = 0; pl->x_in && i < pl->pp; i++) free(pl->x_in[i]);
    free(pl->views);
    free(pl->made);
    free(pl->x_in);
    free(pl->cap_in);
    free(pl->send);
    free(pl->dy);
    free(pl->slot);
    memset(pl, 0, sizeof *pl);
}

static int grow(float **buf, int64_t *cap, int64_t n) {
    if (n <= *cap) return 0;
    float *b = bs_realloc(*buf, (size_t)n * sizeof(float));
    if (!b) return -1;
    *buf = b;
    *cap = n;
    return 0;
}

// Activation set v (0 = the model itself), with room for T rows. A view offloads as the model
// does, through the same copiers, into set v of the tier, within the same per-micro-batch budget
// (the process's budget shared by the micro-batches in flight, train.c).
static Llama *view_for(Pipeline *pl, int v, int64_t T) {
    Llama *owner = pl->exec->llama;
    if (v == 0) return T > owner->max_T && llama_reserve(owner, (int)T) != 0 ? NULL : owner;
    if (!pl->made[v]) {
        if (llama_init_view(&pl->views[v], owner, owner->max_T) != 0) return NULL;
        pl->made[v] = 1;
        pl->views[v].offload = owner->offload;
        pl->views[v].offload_set = v;
        pl->views[v].act_budget = owner->act_budget;
    }
    Llama *m = &pl->views[v];
    return T > m->max_T && llama_reserve(m, (int)T) != 0 ? NULL : m;
}

// The offload counters of every activation set, added (the sets share the copiers).
static ActStats sets_offload(const Pipeline *pl) {
    ActStats a = {.offloaded = pl->exec->llama->act.offloaded, .wait = pl->exec->llama->act.wait};
    for (int v = 1; v < pl->pp; v++)
        if (pl->made[v]) a.offloaded += pl->views[v].act.offloaded, a.wait += pl->views[v].act.wait;
    return a;
}

// Receive n floats from pipe rank `from` into buf, blocking; the time goes to *wait.
static int recv_from(Pipeline *pl, float *buf, int64_t n, int from, int tag, double *wait) {
    CommReq r = {0};
    double t0 = now_seconds();
    int rc = comm_irecv(pl->pipe, buf, (size_t)n * sizeof(float), from, tag, &r);
    if (rc == 0) rc = comm_wait(pl->pipe, &r);
    double t1 = now_seconds();
    *wait += t1 - t0;
    Executor *e = pl->exec;
    if (e->trace && t1 - t0 > 1e-5) e->trace(e->trace_ctx, tag == PIPE_TAG_ACT ? "wait activations" : "wait gradients",
                                             -1, t0, t1);
    return rc;
}

// The attention of item k for this op (executor_attention: set up again, other items ran since its
// forward); *name: the op's trace name (a static string).
static int set_attention(Pipeline *pl, Llama *m, const Plan *p, int32_t k, ExecStats *s, int fwd, const char **name) {
    const char *kind;
    if (executor_attention(pl->exec, p, k, &m->attn, &kind) != 0) return -1;
    static const char *names[][2] = {{"pack bwd", "pack fwd"}, {"ring bwd", "ring fwd"}, {"a2a bwd", "a2a fwd"},
                                     {"hybrid bwd", "hybrid fwd"}};
    int i = !strcmp(kind, "pack") ? 0 : !strcmp(kind, "ring") ? 1 : !strcmp(kind, "a2a") ? 2 : 3;
    *name = names[i][fwd];
    s->rings += fwd && p->items[k].n_ranks > 1;
    return 0;
}

// A step's start: the sets' peaks from zero, every item's slot (its place in the 1F1B order).
static int start_step(Pipeline *pl, const Plan *p) {
    pl->exec->llama->act.peak = 0;
    for (int v = 1; v < pl->pp; v++)
        if (pl->made[v]) pl->views[v].act.peak = 0;
    if (p->n_items > pl->cap_slot) {
        int32_t *sl = bs_realloc(pl->slot, (size_t)p->n_items * sizeof *sl);
        if (!sl) return bs_fail_ctx("pipeline stage %d", pl->stage);
        pl->slot = sl;
        pl->cap_slot = p->n_items;
    }
    return plan_pipeline_slots(p, pl->slot);
}

int pipeline_run(Pipeline *pl, const Plan *p, const StepRows *rows, float loss_scale, double *loss_sum, ExecStats *st,
                 PipeStats *ps) {
    Executor *e = pl->exec;
    Llama *owner = e->llama;
    int S = pl->stage, pp = pl->pp, first = S == 0, last = S == pp - 1, D = owner->cfg.d_model;
    int sets = cost_pipe_in_flight(pp, S, 0);
    ExecStats s = {0};
    PipeStats q = {0};
    *loss_sum = 0;
    executor_stats_reset(e);
    ActStats act0 = sets_offload(pl);
    if (start_step(pl, p) != 0) return -1;
    double start = now_seconds();
    int32_t n = rows->n_items, fi = 0, bi = 0;
    while (bi < n) {
        // the next operation by key: forward of item fi, or backward of item bi (fi > bi always
        // holds when a backward is due: an item's forward key is below its backward key)
        int fwd = fi < n && 2 * ((int64_t)pl->slot[rows->item[fi]] + S) < 2 * ((int64_t)pl->slot[rows->item[bi]] + pp) - 1;
        int32_t i = fwd ? fi : bi, k = rows->item[i];
        const Item *it = &p->items[k];
        int64_t at = rows->off[i], T = rows->off[i + 1] - at;
        int v = i % sets;  // the sets the stage's micro-batches in flight need (pipeline.h)
        MicroBatch mb = {.tokens = rows->tokens + at,
                         .targets = rows->targets + at,
                         .pos = rows->pos + at,
                         .seg = rows->seg + at,
                         .T = (int)T};
        // this set's last send (its previous item's gradient, or this item's activations) is done
        // before the set is written again
        if (comm_wait(pl->pipe, &pl->send[v]) != 0) return bs_fail_ctx("pipeline stage %d: a send", S);
        Llama *m = view_for(pl, v, T);
        if (!m) return bs_fail_ctx("pipeline stage %d: activations for plan item %d (%lld rows)", S, k, (long long)T);
        const char *op;
        if (set_attention(pl, m, p, k, &s, fwd, &op) != 0)
            return bs_fail_ctx("pipeline stage %d, plan item %d", S, k);
        int rc = 0;
        if (fwd) {
            const float *x_in = NULL;
            if (!first) {
                if (grow(&pl->x_in[v], &pl->cap_in[v], T * D > 0 ? T * D : 1) != 0) return -1;
                rc = recv_from(pl, pl->x_in[v], T * D, S - 1, PIPE_TAG_ACT, &q.p2p_wait);
                x_in = pl->x_in[v];
            }
            float *x_out = NULL;
            double item_loss = 0;
            double c0 = now_seconds();
            m->offload_ratio = it->offload;  // the plan's r: its tails go out now and come back in its backward
            if (rc == 0) rc = llama_stage_forward(m, &mb, x_in, loss_scale, &item_loss, NULL, &x_out);
            if (rc == 0 && e->trace) e->trace(e->trace_ctx, op, k, c0, now_seconds());
            if (rc == 0 && !last) {
                rc = comm_isend(pl->pipe, x_out, (size_t)(T * D) * sizeof(float), S + 1, PIPE_TAG_ACT, &pl->send[v]);
                q.p2p_bytes += (double)(T * D) * sizeof(float);
            }
            *loss_sum += item_loss;
            fi++;
        } else {
            if (!last) {
                if (grow(&pl->dy, &pl->cap_dy, T * D > 0 ? T * D : 1) != 0) return -1;
                rc = recv_from(pl, pl->dy, T * D, S + 1, PIPE_TAG_GRAD, &q.p2p_wait);
            }
            // the last backward of the step finishes every gradient range: sync each as it is final
            if (e->zero && i == n - 1) {
                m->grad_ready = executor_grads_ready;
                m->grad_ready_ctx = e;
            }
            float *dx_in = NULL;
            double c0 = now_seconds();
            if (rc == 0) rc = llama_stage_backward(m, &mb, last ? NULL : pl->dy, &dx_in);
            m->grad_ready = NULL;
            if (rc == 0 && e->trace) e->trace(e->trace_ctx, op, k, c0, now_seconds());
            if (rc == 0 && !first) {
                rc = comm_isend(pl->pipe, dx_in, (size_t)(T * D) * sizeof(float), S - 1, PIPE_TAG_GRAD, &pl->send[v]);
                q.p2p_bytes += (double)(T * D) * sizeof(float);
            }
            s.items++;
            s.rows += T;
            bi++;
        }
        m->attn = attn_ops_local();
        if (rc != 0)
            return bs_fail_ctx("pipeline stage %d: %s of plan item %d (%d ranks, %lld tokens)", S, op, k, it->n_ranks,
                               (long long)it->tokens);
        q.ops++;
    }
    for (int v = 0; v < pp; v++)
        if (comm_wait(pl->pipe, &pl->send[v]) != 0) return bs_fail_ctx("pipeline stage %d: a send", S);
    s.seconds = now_seconds() - start;
    executor_stats_add(e, &s);
    s.ring_wait += q.p2p_wait;
    ActStats act1 = sets_offload(pl);
    s.offload_bytes = (double)(act1.offloaded - act0.offloaded);
    s.offload_wait = act1.wait - act0.wait;
    // the sets are resident side by side: their peaks added bound what the stage held at once
    s.act_peak = (double)owner->act.peak;
    for (int v = 1; v < pp; v++)
        if (pl->made[v]) s.act_peak += (double)pl->views[v].act.peak;
    if (st) *st = s;
    if (ps) *ps = q;
    return 0;
}
