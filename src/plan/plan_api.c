// plan_api.c: the flat API over cost models, batches and plans (api.h): what the Python package
// calls. Each function checks its arguments with the Python keyword names in the messages, then
// does exactly what `bytescale plan` does with the same values, so a plan made here equals the
// command's plan (python/tests/test_plan.py holds them to that).
#include "bytescale/api.h"

#include <stdlib.h>
#include <string.h>

#include "bytescale/batch.h"
#include "bytescale/error.h"
#include "bytescale/hw.h"
#include "bytescale/model.h"
#include "bytescale/policy.h"

#ifndef BS_VERSION
#error "BS_VERSION is set by CMakeLists.txt from the project's version"
#endif

// The command's bounds (src/cli/plan.c, docs/plan-format.md): ranks as a plan file allows them,
// tp and pp as the simulator's, capacity as the planners', context and tokens as the command's.
#define API_MAX_RANKS (1 << 20)
#define API_MAX_DEGREE (1 << 10)
#define API_MAX_CAPACITY (1ll << 24)
#define API_MAX_TOKENS (1ll << 40)

const char *bs_version(void) { return BS_VERSION; }

// ---- catalogues ---------------------------------------------------------------------------------

int bs_policy_count(void) { return policy_count(); }

const char *bs_policy_name(int i, const char **summary) {
    const Policy *p = policy_at(i);
    if (summary) *summary = p ? p->summary : NULL;
    return p ? p->name : NULL;
}

const char *bs_policy_no_train(int i) {
    const Policy *p = policy_at(i);
    return p ? p->no_train : NULL;
}

int bs_model_count(void) { return model_count(); }

const char *bs_model_name(int i) {
    const ModelConfig *m = model_at(i);
    return m ? m->name : NULL;
}

int bs_hardware_count(void) { return hw_count(); }

const char *bs_hardware_name(int i) {
    const HardwareProfile *h = hw_at(i);
    return h ? h->name : NULL;
}

// ---- argument checks ------------------------------------------------------------------------------

static int check_range(const char *name, int64_t v, int64_t lo, int64_t hi) {
    if (v < lo || v > hi)
        return bs_fail("%s: %lld is out of range [%lld, %lld]", name, (long long)v, (long long)lo, (long long)hi);
    return 0;
}

static int check_text(const char *name, const char *v) {
    if (!v || !v[0]) return bs_fail("%s: no value given", name);
    return 0;
}

// ---- cost models ----------------------------------------------------------------------------------

CostModel *bs_cost_derive(const char *model, const char *hardware, int64_t tp, int64_t pp, int64_t ranks,
                          int64_t capacity) {
    if (check_text("model", model) || check_text("hardware", hardware) || check_range("tp", tp, 1, API_MAX_DEGREE) ||
        check_range("pp", pp, 1, API_MAX_DEGREE) || check_range("ranks", ranks, 1, API_MAX_RANKS) ||
        check_range("capacity", capacity, 1, API_MAX_CAPACITY))
        return NULL;
    const ModelConfig *m = model_find(model);
    if (!m) {
        bs_fail_ctx("model");
        return NULL;
    }
    HardwareProfile hw;
    if (hw_resolve(hardware, &hw) != 0) {
        bs_fail_ctx("hardware");
        return NULL;
    }
    CostModel *cm = bs_malloc(sizeof *cm);
    if (!cm) return NULL;
    if (cost_derive(cm, m, &hw, (int)tp, (int)pp, (int)ranks, capacity) != 0) {
        free(cm);
        return NULL;
    }
    return cm;
}

CostModel *bs_cost_load(const char *path) {
    if (check_text("cost", path)) return NULL;
    CostModel *cm = bs_malloc(sizeof *cm);
    if (!cm) return NULL;
    if (cost_load(cm, path) != 0) {
        free(cm);
        return NULL;
    }
    return cm;
}

void bs_cost_free(CostModel *cm) { free(cm); }

// ---- batches ----------------------------------------------------------------------------------------

int64_t bs_batch_sample(const char *dist, uint64_t seed, int64_t tokens, int64_t context, int64_t *lengths,
                        int64_t cap) {
    if (check_text("dist", dist) || check_range("tokens", tokens, 1, API_MAX_TOKENS) ||
        check_range("context", context, 0, API_MAX_TOKENS) || check_range("cap", cap, 0, INT64_MAX))
        return -1;
    if (cap > 0 && !lengths) return bs_fail("bs_batch_sample: no array for %lld lengths", (long long)cap);
    GlobalBatch b;
    if (batch_generate(&b, dist, seed, tokens, context) != 0) return bs_fail_ctx("dist");
    for (int64_t i = 0; i < b.n && i < cap; i++) lengths[i] = b.seqs[i].len;
    int64_t n = b.n;
    batch_free(&b);
    return n;
}

// ---- planning --------------------------------------------------------------------------------------

static Plan *plan_new(void) {
    Plan *p = bs_calloc(1, sizeof *p);
    return p;
}

Plan *bs_plan_lengths(const int64_t *lengths, int64_t n, const char *policy, int64_t ranks, int64_t capacity,
                      int64_t context, int64_t pp, int offload, const CostModel *cm) {
    if (check_text("policy", policy) || check_range("ranks", ranks, 1, API_MAX_RANKS) ||
        check_range("capacity", capacity, 1, API_MAX_CAPACITY) || check_range("context", context, 0, API_MAX_TOKENS) ||
        check_range("pp", pp, 1, API_MAX_DEGREE) || check_range("lengths", n, 0, INT64_MAX))
        return NULL;
    if (!cm) {
        bs_fail("planning needs a cost model");
        return NULL;
    }
    if (n > 0 && !lengths) {
        bs_fail("lengths: no array for %lld sequences", (long long)n);
        return NULL;
    }
    if (!policy_find(policy)) {
        bs_fail_ctx("policy");
        return NULL;
    }
    GlobalBatch b;
    if (batch_init(&b, n) != 0) {
        bs_fail_ctx("lengths");
        return NULL;
    }
    for (int64_t i = 0; i < n; i++) {
        if (lengths[i] < 1) {
            bs_fail("lengths[%lld] is %lld: every length must be >= 1", (long long)i, (long long)lengths[i]);
            batch_free(&b);
            return NULL;
        }
        // ids in order, no token source: what a lengths file gives `bytescale plan --lengths`
        if (batch_push(&b, i, lengths[i], -1) != 0) {
            bs_fail_ctx("lengths");
            batch_free(&b);
            return NULL;
        }
    }
    Plan *p = NULL;
    if (batch_cut(&b, context) != 0) {
        bs_fail_ctx("context");
        goto done;
    }
    PlanConfig cfg = {.n_ranks = (int32_t)ranks, .capacity = capacity, .context = context, .pp = (int32_t)pp,
                      .offload = offload != 0};
    p = plan_new();
    if (p && policy_plan(p, policy, &b, &cfg, cm) != 0) {
        free(p);  // policy_plan frees what it made on failure
        p = NULL;
    }
done:
    batch_free(&b);  // the plan holds its own copy
    return p;
}

Plan *bs_plan_read(const char *path, const CostModel *cm) {
    if (check_text("path", path)) return NULL;
    Plan *p = plan_new();
    if (!p) return NULL;
    if (plan_read_json_cm(p, path, cm) != 0) {
        free(p);  // a failed read leaves nothing allocated in *p
        return NULL;
    }
    return p;
}

int bs_plan_write(const Plan *p, const char *path) {
    if (!p) return bs_fail("bs_plan_write: no plan");
    if (check_text("path", path)) return -1;
    return plan_write_json(p, path);
}

void bs_plan_free(Plan *p) {
    if (!p) return;
    plan_free(p);
    free(p);
}

// ---- what a plan holds ---------------------------------------------------------------------------------

// Every accessor needs a finalized plan (all of this API's plans are).
static int check_plan(const Plan *p, const char *fn) {
    if (!p) return bs_fail("%s: no plan", fn);
    if (!p->rank_begin || !p->rank_items || !p->rank_busy) return bs_fail("%s: the plan is not finalized", fn);
    return 0;
}

// The size check of the structs a binding mirrors.
static int check_size(const char *fn, const char *type, size_t theirs, size_t ours) {
    if (theirs == ours) return 0;
    return bs_fail("%s: the caller's %s has %zu bytes, this library's %zu: the binding and the library are from "
                   "different versions",
                   fn, type, theirs, ours);
}

int bs_plan_info(const Plan *p, BsPlanInfo *out, size_t size) {
    if (check_size("bs_plan_info", "BsPlanInfo", size, sizeof *out) || check_plan(p, "bs_plan_info")) return -1;
    memset(out, 0, sizeof *out);
    out->n_ranks = p->n_ranks, out->pp = p->pp, out->capacity = p->capacity;
    out->n_seqs = p->batch.n, out->n_tokens = p->batch.n_tokens;
    out->n_items = p->n_items, out->n_segs = p->n_segs, out->n_refs = p->n_refs;
    out->n_barriers = p->n_barriers, out->n_delayed = p->n_delayed;
    out->makespan = p->makespan, out->lower_bound = p->lower_bound, out->hdp_bound = p->hdp_bound;
    memcpy(out->policy, p->policy, sizeof out->policy);
    out->policy[sizeof out->policy - 1] = '\0';
    return 0;
}

int bs_plan_stats(const Plan *p, const CostModel *cm, BsPlanStats *out, size_t size) {
    if (check_size("bs_plan_stats", "BsPlanStats", size, sizeof *out) || check_plan(p, "bs_plan_stats")) return -1;
    PlanStats st;
    if (plan_stats(p, cm, &st) != 0) return -1;
    memset(out, 0, sizeof *out);
    out->n_packs = st.n_packs, out->n_rings = st.n_rings, out->idle_ranks = st.idle_ranks;
    out->n_long = st.n_long, out->n_offload = st.n_offload;
    out->busy_min = st.busy_min, out->busy_median = st.busy_median, out->busy_max = st.busy_max;
    out->ring_bytes = st.ring_bytes;
    out->offload_min = st.offload_min, out->offload_mean = st.offload_mean, out->offload_max = st.offload_max;
    return 0;
}

int bs_plan_sequences(const Plan *p, int64_t *id, int64_t *len, int64_t *src) {
    if (check_plan(p, "bs_plan_sequences")) return -1;
    for (int64_t i = 0; i < p->batch.n; i++) {
        const Sequence *s = &p->batch.seqs[i];
        if (id) id[i] = s->id;
        if (len) len[i] = s->len;
        if (src) src[i] = s->src;
    }
    return 0;
}

int bs_plan_items(const Plan *p, int32_t *seg_begin, int32_t *n_segs, int32_t *rank_begin, int32_t *n_ranks,
                  double *offload, int64_t *tokens, double *est_time) {
    if (check_plan(p, "bs_plan_items")) return -1;
    for (int32_t k = 0; k < p->n_items; k++) {
        const Item *it = &p->items[k];
        if (seg_begin) seg_begin[k] = it->seg_begin;
        if (n_segs) n_segs[k] = it->n_segs;
        if (rank_begin) rank_begin[k] = it->rank_begin;
        if (n_ranks) n_ranks[k] = it->n_ranks;
        if (offload) offload[k] = it->offload;  // float -> double is exact: the file's value
        if (tokens) tokens[k] = it->tokens;
        if (est_time) est_time[k] = it->est_time;
    }
    return 0;
}

int bs_plan_segments(const Plan *p, int32_t *seq, int64_t *start, int64_t *len) {
    if (check_plan(p, "bs_plan_segments")) return -1;
    for (int32_t j = 0; j < p->n_segs; j++) {
        if (seq) seq[j] = p->segs[j].seq;
        if (start) start[j] = p->segs[j].start;
        if (len) len[j] = p->segs[j].len;
    }
    return 0;
}

int bs_plan_members(const Plan *p, int32_t *ranks) {
    if (check_plan(p, "bs_plan_members")) return -1;
    if (ranks && p->n_refs > 0) memcpy(ranks, p->ranks, (size_t)p->n_refs * sizeof *ranks);
    return 0;
}

int bs_plan_schedules(const Plan *p, int32_t *rank_begin, int32_t *rank_items, double *rank_busy) {
    if (check_plan(p, "bs_plan_schedules")) return -1;
    if (rank_begin) memcpy(rank_begin, p->rank_begin, ((size_t)p->n_ranks + 1) * sizeof *rank_begin);
    if (rank_items && p->n_refs > 0) memcpy(rank_items, p->rank_items, (size_t)p->n_refs * sizeof *rank_items);
    if (rank_busy) memcpy(rank_busy, p->rank_busy, (size_t)p->n_ranks * sizeof *rank_busy);
    return 0;
}

int bs_plan_owners(const Plan *p, int32_t *owners) {
    if (check_plan(p, "bs_plan_owners")) return -1;
    for (int32_t j = 0; owners && j < p->n_segs; j++) owners[j] = p->seg_owner ? p->seg_owner[j] : -1;
    return 0;
}

int bs_plan_peers(const Plan *p, int32_t *barriers, int32_t *delayed, int32_t *a2a) {
    if (check_plan(p, "bs_plan_peers")) return -1;
    if (barriers && p->n_barriers > 0) memcpy(barriers, p->barriers, (size_t)p->n_barriers * sizeof *barriers);
    if (delayed && p->n_delayed > 0) memcpy(delayed, p->delayed, (size_t)p->n_delayed * sizeof *delayed);
    for (int32_t k = 0; a2a && k < p->n_items; k++) a2a[k] = p->items[k].a2a;
    return 0;
}

int bs_plan_ulysses(const Plan *p, int32_t *ulysses) {
    if (check_plan(p, "bs_plan_ulysses")) return -1;
    for (int32_t k = 0; ulysses && k < p->n_items; k++) ulysses[k] = p->items[k].ulysses;
    return 0;
}

// ---- chunk ranges -----------------------------------------------------------------------------------------

typedef struct {
    int32_t *rank_of, *item, *seq;
    int64_t *start, *len;
    int64_t cap, n;  // room in the arrays; ranges found so far (written while n < cap)
} ChunkOut;

static void chunk_put(ChunkOut *o, int32_t rank, int32_t item, int32_t seq, int64_t start, int64_t len) {
    if (len <= 0) return;  // a segment shorter than 2D leaves some members an empty chunk
    if (o->n < o->cap) {
        if (o->rank_of) o->rank_of[o->n] = rank;
        if (o->item) o->item[o->n] = item;
        if (o->seq) o->seq[o->n] = seq;
        if (o->start) o->start[o->n] = start;
        if (o->len) o->len[o->n] = len;
    }
    o->n++;
}

// Rank r's ranges: its items in the global order (its schedule), each segment's part for its member position.
static void rank_chunks(const Plan *p, int32_t r, ChunkOut *o) {
    for (int32_t q = p->rank_begin[r]; q < p->rank_begin[r + 1]; q++) {
        int32_t k = p->rank_items[q];
        const Item *it = &p->items[k];
        int D = it->n_ranks, pos = 0;
        while (pos < D && p->ranks[it->rank_begin + pos] != r) pos++;
        int blocks = plan_item_kind(p, k) == ITEM_BLOCKS;
        for (int32_t j = 0; j < it->n_segs; j++) {
            const Segment *sg = &p->segs[it->seg_begin + j];
            if (blocks) {  // a block item: the member holds the blocks it owns, whole
                if (p->seg_owner[it->seg_begin + j] == pos) chunk_put(o, r, k, sg->seq, sg->start, sg->len);
                continue;
            }
            if (D == 1) {
                chunk_put(o, r, k, sg->seq, sg->start, sg->len);
                continue;
            }
            int64_t a0, n0, a1, n1;  // chunks pos and 2D-1-pos, relative to the segment
            plan_chunk(sg->len, D, pos, &a0, &n0);
            plan_chunk(sg->len, D, 2 * D - 1 - pos, &a1, &n1);
            if (a0 + n0 == a1) {  // the middle member's two chunks touch: one range
                chunk_put(o, r, k, sg->seq, sg->start + a0, n0 + n1);
            } else {
                chunk_put(o, r, k, sg->seq, sg->start + a0, n0);
                chunk_put(o, r, k, sg->seq, sg->start + a1, n1);
            }
        }
    }
}

int64_t bs_plan_chunks(const Plan *p, int64_t rank, int32_t *rank_of, int32_t *item, int32_t *seq, int64_t *start,
                       int64_t *len, int64_t cap) {
    if (check_plan(p, "bs_plan_chunks")) return -1;
    if (rank < -1 || rank >= p->n_ranks)
        return bs_fail("rank: %lld is out of range [0, %d) (or -1 for every rank)", (long long)rank, p->n_ranks);
    if (cap < 0) return bs_fail("bs_plan_chunks: cap %lld is negative", (long long)cap);
    if (cap > 0 && !(rank_of || item || seq || start || len)) cap = 0;
    ChunkOut o = {rank_of, item, seq, start, len, cap, 0};
    if (rank >= 0) rank_chunks(p, (int32_t)rank, &o);
    else
        for (int32_t r = 0; r < p->n_ranks; r++) rank_chunks(p, r, &o);
    return o.n;
}
