// train_prefetch.c: the trainer's data pipeline (train_internal.h).
//
// While step s trains, a background thread reads this rank's rows of step s + 1 and, on rank 0,
// samples and plans step s + 2. At the start of step s + 1 the main thread joins it and broadcasts
// the plan of step s + 2 (MPI stays on the main thread: MPI_THREAD_FUNNELED), so what a step waits
// for is one small broadcast, not sampling, planning or reading.
#include <stdlib.h>
#include <string.h>

#include "bytescale/error.h"
#include "bytescale/policy.h"
#include "bytescale/timer.h"
#include "runtime/train_internal.h"

// ---- planning (rank 0) and the broadcast ------------------------------------------------------------

// The wire of one step: a header, the loading plan (with data servers: the batch's documents,
// ascending, and the server of each), then the packed plan (plan_wire.c).
typedef struct {
    int64_t targets;  // labelled tokens of the whole batch: the loss's denominator on every rank
    int64_t n_load;   // entries of the loading plan (0 without data servers)
} WireHead;

static int cmp_i64(const void *a, const void *b) {
    int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return (x > y) - (x < y);
}

// (train.h) Here, beside the planning that puts it in the broadcast: train.c counts a plan made
// elsewhere with it too, and uses this file, never the other way round.
int64_t train_count_targets(const DocIndex *ix, const GlobalBatch *b) {
    int64_t n = 0;
    for (int64_t i = 0; i < b->n; i++) {
        const Sequence *s = &b->seqs[i];
        if (s->id < 0 || s->id >= ix->n_docs)
            return bs_fail("batch sequence %lld: document %lld out of range [0, %lld)", (long long)i, (long long)s->id,
                           (long long)ix->n_docs);
        const DocEntry *d = &ix->docs[s->id];
        if (s->len < 1 || s->src < d->start || s->src + s->len > d->start + d->len)
            return bs_fail("batch sequence %lld: tokens [%lld, %lld) are not inside document %lld [%lld, %lld)",
                           (long long)i, (long long)s->src, (long long)(s->src + s->len), (long long)s->id,
                           (long long)d->start, (long long)(d->start + d->len));
        n += s->len - 1 + (s->src + s->len < d->start + d->len);
    }
    return n;
}

int train_plan_batch(Trainer *t, const GlobalBatch *b) {
    PlanConfig pc = {.n_ranks = t->hdp,
                     .capacity = t->capacity,
                     .context = t->cfg.context,
                     .pp = t->par.pp,
                     .offload = train_plans_offload(&t->cfg)};
    WireHead h = {.targets = train_count_targets(&t->data.index, b)};
    if (h.targets < 0) return -1;
    Plan p;
    if (policy_plan(&p, t->cfg.policy, b, &pc, &t->cost) != 0)
        return bs_fail_ctx("planning a batch of %lld tokens for %d ranks (capacity %lld, policy %s)",
                           (long long)b->n_tokens, t->hdp, (long long)t->capacity, t->cfg.policy);
    uint8_t *packed = NULL;
    size_t size = 0;
    int rc = plan_validate(&p, &t->cost);
    if (rc != 0) bs_fail_ctx("the %s plan is not valid", t->cfg.policy);
    if (rc == 0) rc = plan_pack(&p, &packed, &size);
    plan_free(&p);
    if (rc != 0) return -1;
    // the loading plan: every document of the batch once, with the server that holds it
    int64_t *docs = NULL;
    if (t->roles) {
        docs = bs_malloc(sizeof(int64_t) * (size_t)(b->n > 0 ? b->n : 1));
        if (!docs) rc = -1;
        for (int64_t i = 0; rc == 0 && i < b->n; i++) docs[i] = b->seqs[i].id;
        if (rc == 0) qsort(docs, (size_t)b->n, sizeof *docs, cmp_i64);
        for (int64_t i = 0; rc == 0 && i < b->n; i++)
            if (i == 0 || docs[i] != docs[i - 1]) docs[h.n_load++] = docs[i];
    }
    size_t load_bytes = (size_t)h.n_load * (sizeof(int64_t) + sizeof(int32_t));
    uint8_t *wire = rc == 0 ? bs_malloc(sizeof h + load_bytes + size) : NULL;
    if (wire) {
        memcpy(wire, &h, sizeof h);
        uint8_t *at = wire + sizeof h;
        if (h.n_load > 0) memcpy(at, docs, sizeof(int64_t) * (size_t)h.n_load);  // docs is NULL without servers
        at += sizeof(int64_t) * (size_t)h.n_load;
        for (int64_t i = 0; i < h.n_load; i++, at += sizeof(int32_t)) memcpy(at, &t->doc_server[docs[i]], sizeof(int32_t));
        memcpy(at, packed, size);
    }
    free(docs);
    free(packed);
    if (!wire) return -1;
    free(t->wire);
    t->wire = wire;
    t->wire_size = sizeof h + load_bytes + size;
    return 0;
}

enum { PLAN_ERR_BYTES = 1024 };

void train_bcast_plan_error(Trainer *t) {
    int64_t size = -1;
    char msg[PLAN_ERR_BYTES];
    snprintf(msg, sizeof msg, "%s", bs_errmsg());
    if (comm_bcast(t->comm, &size, sizeof size, 0) == 0) comm_bcast(t->comm, msg, sizeof msg, 0);
    bs_fail("%s", msg);
}

// A step's wire (train_plan_batch) into slot `slot`.
static int unpack_wire(Trainer *t, const uint8_t *buf, size_t size, int slot) {
    WireHead h;
    if (size < sizeof h) return bs_fail("a plan message of %zu bytes", size);
    memcpy(&h, buf, sizeof h);
    size_t load_bytes = (size_t)h.n_load * (sizeof(int64_t) + sizeof(int32_t));
    if (h.n_load < 0 || h.targets < 0 || load_bytes > size - sizeof h) return bs_fail("a malformed plan message");
    LoadPlan *lp = &t->load[slot];
    load_plan_free(lp);
    if (h.n_load > 0) {
        lp->docs = bs_malloc(sizeof(int64_t) * (size_t)h.n_load);
        lp->servers = bs_malloc(sizeof(int32_t) * (size_t)h.n_load);
        if (!lp->docs || !lp->servers) return -1;
        memcpy(lp->docs, buf + sizeof h, sizeof(int64_t) * (size_t)h.n_load);
        memcpy(lp->servers, buf + sizeof h + sizeof(int64_t) * (size_t)h.n_load, sizeof(int32_t) * (size_t)h.n_load);
        lp->n = h.n_load;
    }
    t->targets[slot] = h.targets;
    return plan_unpack(&t->plans[slot], buf + sizeof h + load_bytes, size - sizeof h - load_bytes);
}

int train_bcast_plan(Trainer *t, int64_t step, int slot) {
    int64_t size = t->rank == 0 ? (int64_t)t->wire_size : 0;
    if (comm_bcast(t->comm, &size, sizeof size, 0) != 0) return bs_fail_ctx("broadcasting plan %lld", (long long)step);
    if (size < 0) {  // rank 0 could not plan: everyone stops with its message
        char msg[PLAN_ERR_BYTES];
        if (comm_bcast(t->comm, msg, sizeof msg, 0) != 0) return -1;
        msg[sizeof msg - 1] = '\0';
        return bs_fail("rank 0 could not plan step %lld: %s", (long long)step, msg);
    }
    uint8_t *buf = t->rank == 0 ? t->wire : bs_malloc((size_t)(size > 0 ? size : 1));
    if (!buf) return -1;
    int rc = comm_bcast(t->comm, buf, (size_t)size, 0);
    if (rc == 0) rc = unpack_wire(t, buf, (size_t)size, slot);
    if (t->rank != 0) free(buf);
    if (rc != 0) return bs_fail_ctx("rank %d: the plan of step %lld", t->rank, (long long)step);
    Plan *out = &t->plans[slot];
    if (out->n_ranks != t->hdp || out->pp != t->par.pp) {
        int32_t n = out->n_ranks, pp = out->pp;
        plan_free(out);
        return bs_fail("the plan of step %lld is for %d HDP ranks with pp %d, the job has %d with pp %d", (long long)step,
                       n, pp, t->hdp, t->par.pp);
    }
    return 0;
}

// Rank 0: sample step s's batch and plan it into t->wire.
static int sample_and_plan(Trainer *t, int64_t s) {
    t->before[s % 4] = sampler_state(&t->sampler);
    if (sampler_next(&t->sampler, t->cfg.tokens, t->cfg.context, &t->batch) != 0)
        return bs_fail_ctx("sampling step %lld", (long long)s);
    t->sampled = s;
    if (train_plan_batch(t, &t->batch) != 0) return bs_fail_ctx("step %lld", (long long)s);
    t->wire_step = s;
    return 0;
}

SamplerState train_sampler_position(const Trainer *t) {
    // `planned` is the main thread's own: while the thread samples ahead, the position after step
    // t->step was saved when step t->step + 1 was sampled, and that entry is not written again
    return t->planned > t->step ? t->before[(t->step + 1) % 4] : sampler_state(&t->sampler);
}

// A test aid: BS_FAIL_RANK=R BS_FAIL_STEP=S makes rank R's reading of step S fail, so the tests can
// show that one failing rank ends the whole job with its message (docs/runtime.md, "Faults").
static int injected_fault(const Trainer *t, int64_t step) {
    const char *r = getenv("BS_FAIL_RANK"), *s = getenv("BS_FAIL_STEP");
    if (!r || !s || atoi(r) != t->rank || atoll(s) != step) return 0;
    return bs_fail("injected fault (BS_FAIL_RANK=%s BS_FAIL_STEP=%s): reading step %lld's tokens", r, s,
                   (long long)step);
}

// ---- who reads what (docs/loader.md, "3D") ----------------------------------------------------------

// What this process reads of its rows: the first stage embeds the tokens, the last stage's loss
// needs the targets, a middle stage reads nothing (its positions and segments come from the plan).
static int rows_need(const Parallel *p) {
    return (p->stage == 0 ? MB_TOKENS : 0) | (p->stage == p->pp - 1 ? MB_TARGETS : 0);
}

// Whether the process at (stage, tp) asks the data servers: tp rank 0 of a stage that needs tokens.
// Its tp group needs the same rows: fetching them once and handing them over the group's link (one
// node, the fastest link) moves 1/T of the bytes over the network and the servers answer 1/T as many
// requests; each member fetching would move T times the bytes for the same rows.
static int asks_servers(const Parallel *p, int stage, int tp) { return tp == 0 && (stage == 0 || stage == p->pp - 1); }

int train_fetches(const Trainer *t) { return t->roles && asks_servers(&t->par, t->par.stage, t->par.tp_rank); }

int train_loader_roles(Trainer *t, int **fetchers, int *n_fetchers) {
    const Parallel *p = &t->par;
    RemoteSource *rs = &t->remote;
    rs->roles = t->roles;
    rs->leader = -1;
    // the fetching processes' world ranks (the scheduler's list for the servers), stage by stage
    *n_fetchers = 0;
    *fetchers = bs_malloc(sizeof(int) * 2 * (size_t)p->hdp);
    if (!*fetchers) return -1;
    for (int s = 0; s < p->pp; s++)
        for (int h = 0; h < p->hdp && asks_servers(p, s, 0); h++)
            (*fetchers)[(*n_fetchers)++] = loader_world_rank(t->roles, parallel_world_rank(p, s, h, 0));
    if (p->tp < 2 || !rows_need(p)) return 0;
    // this process's tp group: rank 0 hands its fetch to the others, which take it from rank 0
    if (p->tp_rank > 0) {
        rs->leader = loader_world_rank(t->roles, parallel_world_rank(p, p->stage, p->hdp_rank, 0));
        return 0;
    }
    rs->members = bs_malloc(sizeof(int) * (size_t)(p->tp - 1));
    if (!rs->members) return -1;
    for (int r = 1; r < p->tp; r++)
        rs->members[rs->n_members++] = loader_world_rank(t->roles, parallel_world_rank(p, p->stage, p->hdp_rank, r));
    return 0;
}

// Counts what a TokenSource delivers: the bytes a rank read for its rows, from shards or servers.
typedef struct {
    const TokenSource *inner;
    double bytes;
} Counted;

static int counted_read(void *ctx, int64_t doc, int64_t src, int64_t n, uint32_t *out, int64_t *got) {
    Counted *c = ctx;
    int rc = c->inner->read(c->inner->ctx, doc, src, n, out, got);
    if (rc == 0) c->bytes += (double)*got * sizeof(uint32_t);
    return rc;
}

int train_read_rows(Trainer *t, int64_t step, int slot) {
    if (injected_fault(t, step) != 0) return -1;
    double t0 = now_seconds();
    t->load_start[slot] = t0;
    int rc = 0, need = rows_need(&t->par);
    TokenSource inner = t->tokens;
    t->fetch_bytes[slot] = 0;
    // note the ranges, fetch them (from the servers in one request each, or from the tp group's
    // rank 0), then read; a middle stage reads nothing and fetches nothing
    if (t->roles && need) {
        t->remote.plan = &t->load[slot];
        TokenSource rec = loader_recorder(&t->remote);
        rc = step_rows_read(&t->rows[slot], &t->plans[slot], t->hdp_rank, need, &rec);
        if (rc == 0) rc = loader_fetch(&t->remote);
        t->fetch_bytes[slot] = t->remote.fetched;
        inner = loader_replayer(&t->remote);
    }
    Counted c = {&inner, 0};
    TokenSource src = {.read = counted_read, .ctx = &c};
    if (rc == 0) rc = step_rows_read(&t->rows[slot], &t->plans[slot], t->hdp_rank, need, &src);
    t->load_seconds[slot] = now_seconds() - t0;
    t->load_bytes[slot] = c.bytes;
    return rc;
}

// ---- the background thread -------------------------------------------------------------------------

static void *prefetch_main(void *arg) {
    Prefetch *pf = arg;
    Trainer *t = pf->t;
    int64_t r = pf->read_step;
    pf->rc = 0;
    if (r && train_read_rows(t, r, (int)(r % 2)) != 0) {
        pf->rc = -1;
        snprintf(pf->err, sizeof pf->err, "reading step %lld's tokens: %s", (long long)r, bs_errmsg());
        return NULL;
    }
    if (r) t->rows_of[r % 2] = r;
    // a planning failure is not this thread's to report: rank 0 broadcasts it with the plan
    if (pf->plan_step && sample_and_plan(t, pf->plan_step) != 0) {
        t->wire_step = -pf->plan_step;
        snprintf(pf->err, sizeof pf->err, "%s", bs_errmsg());
    }
    return NULL;
}

int train_prefetch_join(Trainer *t) {
    if (!t->thread_live) return 0;
    pthread_join(t->thread, NULL);
    t->thread_live = 0;
    return t->pf.rc == 0 ? 0 : bs_fail("%s", t->pf.err);
}

void train_prefetch_reset(Trainer *t) {
    train_prefetch_join(t);
    for (int i = 0; i < 2; i++) {
        if (t->plan_of[i]) plan_free(&t->plans[i]);
        t->plan_of[i] = t->rows_of[i] = 0;
    }
    t->sampled = t->planned = t->step;
    t->wire_step = 0;
}

void train_prefetch_stop(Trainer *t) {
    train_prefetch_join(t);
    if (t->rank == 0 && t->sampled > t->step) {
        SamplerState at = t->before[(t->step + 1) % 4];
        sampler_restore(&t->sampler, &at);
    }
    train_prefetch_reset(t);
}

// Broadcast step s's plan into its slot; rank 0 plans it first unless the thread already did.
static int plan_step(Trainer *t, int64_t s) {
    Plan *slot = &t->plans[s % 2];
    if (t->plan_of[s % 2]) plan_free(slot);
    t->plan_of[s % 2] = 0;
    if (t->rank == 0) {
        int failed = t->wire_step == -s;
        if (failed) bs_fail("%s", t->pf.err);
        if (!failed && t->wire_step != s && sample_and_plan(t, s) != 0) failed = 1;
        if (failed) {
            train_bcast_plan_error(t);
            return -1;
        }
    }
    if (train_bcast_plan(t, s, (int)(s % 2)) != 0) return -1;
    t->plan_of[s % 2] = s;
    if (s > t->planned) t->planned = s;
    return 0;
}

int train_prefetch_ready(Trainer *t, int64_t s) {
    if (train_prefetch_join(t) != 0) return -1;
    if (t->plan_of[s % 2] != s && plan_step(t, s) != 0) return -1;
    if (t->rows_of[s % 2] != s) {
        if (train_read_rows(t, s, (int)(s % 2)) != 0) return -1;
        t->rows_of[s % 2] = s;
    }
    // the reading of this step's rows (in the background thread, during the step before: the trace
    // is the main thread's, so it is recorded now, with the times it had)
    if (t->trace)
        rtrace_add(t->trace, "load rows", "data", t->load_start[s % 2], t->load_start[s % 2] + t->load_seconds[s % 2],
                   s);
    // the next step: already prepared when this step is being retried (a refused update)
    if (s + 1 > t->cfg.steps || t->plan_of[(s + 1) % 2] == s + 1) return 0;
    if (plan_step(t, s + 1) != 0) return -1;
    t->pf = (Prefetch){.t = t, .read_step = s + 1, .plan_step = t->rank == 0 && s + 2 <= t->cfg.steps ? s + 2 : 0};
    if (pthread_create(&t->thread, NULL, prefetch_main, &t->pf) != 0) {
        // no thread: do the work now, in order
        prefetch_main(&t->pf);
        return t->pf.rc == 0 ? 0 : bs_fail("%s", t->pf.err);
    }
    t->thread_live = 1;
    return 0;
}

// ---- the trace hooks --------------------------------------------------------------------------------

static void trace_item(void *ctx, const char *name, int32_t item, double t0, double t1) {
    // a stage's waits for its neighbours ("wait activations", "wait gradients") are the bubbles
    rtrace_add(ctx, name, strncmp(name, "wait", 4) == 0 ? "wait" : "compute", t0, t1, item);
}

static void trace_ring(void *ctx, const char *name, double t0, double t1) {
    rtrace_add(ctx, name, name[5] == 'w' ? "wait" : "compute", t0, t1, -1);  // "ring wait" vs "ring fwd block"
}

void train_trace_attach(Trainer *t, RtTrace *tr) {
    t->trace = tr;
    t->exec.trace = tr ? trace_item : NULL;
    t->exec.trace_ctx = tr;
    t->exec.ring.trace = tr ? trace_ring : NULL;
    t->exec.ring.trace_ctx = tr;
    t->exec.a2a.ring.trace = tr ? trace_ring : NULL;  // a hybrid's ring across its groups
    t->exec.a2a.ring.trace_ctx = tr;
}
