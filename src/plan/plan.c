// plan.c: building a plan, deriving its per-rank schedules and estimates (with pipelines: the
// simulator's 1F1B schedule replayed), the symmetric chunk layout, and the two bounds on the step's
// makespan (plan.h, docs/planner.md). The validator is in plan_check.c, the JSON form in plan_io.c.
#include "bytescale/plan.h"
#include "core/fminmax.h"

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bytescale/error.h"
#include "bytescale/keep.h"
#include "plan/policy_util.h"

int plan_init(Plan *p, const GlobalBatch *b, int32_t n_ranks, int64_t capacity, int32_t pp, const char *policy) {
    memset(p, 0, sizeof *p);
    if (n_ranks < 1) return bs_fail("plan: n_ranks must be >= 1 (got %d)", n_ranks);
    if (capacity < 1) return bs_fail("plan: capacity must be >= 1 token (got %lld)", (long long)capacity);
    if (pp < 1) return bs_fail("plan: pp must be >= 1 (got %d)", pp);
    if (b->n < 0 || b->n > INT32_MAX) return bs_fail("plan: %lld sequences is out of range", (long long)b->n);
    p->n_ranks = n_ranks;
    p->pp = pp;
    p->capacity = capacity;
    snprintf(p->policy, sizeof p->policy, "%s", policy ? policy : "");
    p->batch.seqs = bs_keep_alloc((size_t)(b->n > 0 ? b->n : 1) * sizeof(Sequence));
    if (!p->batch.seqs) return bs_fail_ctx("plan: copying the batch");
    if (b->n > 0) memcpy(p->batch.seqs, b->seqs, (size_t)b->n * sizeof(Sequence));
    p->batch.n = b->n;
    p->batch.n_tokens = b->n_tokens;
    return 0;
}

void plan_free(Plan *p) {
    bs_keep_free(p->batch.seqs);
    bs_keep_free(p->items);
    bs_keep_free(p->segs);
    bs_keep_free(p->ranks);
    bs_keep_free(p->rank_begin);
    bs_keep_free(p->rank_items);
    bs_keep_free(p->rank_busy);
    bs_keep_free(p->barriers);
    bs_keep_free(p->delayed);
    bs_keep_free(p->seg_owner);
    memset(p, 0, sizeof *p);
}

// Grow *arr (elements of size elem) so that it holds at least need elements.
static int grow(void **arr, int32_t *cap, int64_t need, size_t elem, const char *what) {
    if (need <= *cap) return 0;
    if (need > INT32_MAX) return bs_fail("plan: too many %s (%lld)", what, (long long)need);
    int64_t c = *cap ? *cap : 64;
    while (c < need) c *= 2;
    if (c > INT32_MAX) c = INT32_MAX;
    void *q = bs_keep_realloc(*arr, (size_t)c * elem);
    if (!q) return bs_fail_ctx("plan: growing %s", what);
    *arr = q;
    *cap = (int32_t)c;
    return 0;
}

int32_t plan_add_item(Plan *p, const Segment *segs, int n_segs, const int32_t *ranks, int n_ranks, double offload) {
    if (n_segs < 1 || !segs) return bs_fail("plan: item %d has no segments", p->n_items);
    if (n_ranks < 1 || !ranks) return bs_fail("plan: item %d has no ranks", p->n_items);
    if (grow((void **)&p->items, &p->cap_items, (int64_t)p->n_items + 1, sizeof(Item), "items") != 0 ||
        grow((void **)&p->segs, &p->cap_segs, (int64_t)p->n_segs + n_segs, sizeof(Segment), "segments") != 0 ||
        grow((void **)&p->ranks, &p->cap_refs, (int64_t)p->n_refs + n_ranks, sizeof(int32_t), "rank refs") != 0)
        return -1;
    Item *it = &p->items[p->n_items];
    memset(it, 0, sizeof *it);
    it->seg_begin = p->n_segs;
    it->n_segs = n_segs;
    it->rank_begin = p->n_refs;
    it->n_ranks = n_ranks;
    it->offload = (float)offload;
    for (int i = 0; i < n_segs; i++) it->tokens += segs[i].len;
    memcpy(p->segs + p->n_segs, segs, (size_t)n_segs * sizeof(Segment));
    if (p->seg_owner) {  // a plan with block items: this item's segments have no owner
        if (grow((void **)&p->seg_owner, &p->cap_owner, (int64_t)p->n_segs + n_segs, sizeof(int32_t), "owners") != 0)
            return -1;
        for (int i = 0; i < n_segs; i++) p->seg_owner[p->n_segs + i] = -1;
    }
    memcpy(p->ranks + p->n_refs, ranks, (size_t)n_ranks * sizeof(int32_t));
    p->n_segs += n_segs;
    p->n_refs += n_ranks;
    return p->n_items++;
}

int32_t plan_add_blocks_item(Plan *p, const Segment *segs, int n_segs, const int32_t *ranks, int n_ranks,
                             const int32_t *owners) {
    // the owners table starts with the first block item: -1 for every segment before it
    if (!p->seg_owner) {
        if (grow((void **)&p->seg_owner, &p->cap_owner, (int64_t)p->n_segs + 1, sizeof(int32_t), "owners") != 0)
            return -1;
        for (int32_t j = 0; j < p->n_segs; j++) p->seg_owner[j] = -1;
    }
    int32_t at = p->n_segs;
    int32_t k = plan_add_item(p, segs, n_segs, ranks, n_ranks, 0.0);
    if (k < 0) return -1;
    memcpy(p->seg_owner + at, owners, (size_t)n_segs * sizeof(int32_t));
    return k;
}

ItemKind plan_item_kind(const Plan *p, int32_t item) {
    const Item *it = &p->items[item];
    if (p->seg_owner && it->n_segs > 0 && p->seg_owner[it->seg_begin] >= 0) return ITEM_BLOCKS;
    if (it->ulysses > 0) return ITEM_HYBRID;
    return it->a2a ? ITEM_A2A : ITEM_RING;
}

int plan_add_barrier(Plan *p) {
    if (p->n_items == 0 || (p->n_barriers > 0 && p->barriers[p->n_barriers - 1] == p->n_items)) return 0;
    if (grow((void **)&p->barriers, &p->cap_barriers, (int64_t)p->n_barriers + 1, sizeof(int32_t), "barriers") != 0)
        return -1;
    p->barriers[p->n_barriers++] = p->n_items;
    return 0;
}

int plan_add_delayed(Plan *p, int32_t seq) {
    if (seq < 0 || seq >= p->batch.n || (p->n_delayed > 0 && seq <= p->delayed[p->n_delayed - 1]))
        return bs_fail("plan: delayed sequence %d out of range or out of order", seq);
    if (grow((void **)&p->delayed, &p->cap_delayed, (int64_t)p->n_delayed + 1, sizeof(int32_t), "delayed") != 0)
        return -1;
    p->delayed[p->n_delayed++] = seq;
    return 0;
}

// A rank's node in the planner's view: ranks_per_node consecutive ranks per node.
static int64_t planner_node(int32_t rank, const void *ctx) {
    int per = *(const int *)ctx;
    return per > 1 ? rank / per : rank;
}

// A block item's estimate: its slowest member (the group's fetches and reductions are collectives).
static int blocks_item_time(Plan *p, int32_t k, const CostModel *cm) {
    Item *it = &p->items[k];
    BlockLoad *ld = bs_keep_alloc((size_t)it->n_ranks * sizeof(BlockLoad));
    if (!ld) return bs_fail_ctx("plan_finalize");
    int per = cm->ranks_per_node;
    int rc = plan_blocks_loads(p, k, planner_node, &per, ld);
    it->est_time = 0;
    for (int32_t m = 0; rc == 0 && m < it->n_ranks; m++) it->est_time = cost_fmax(it->est_time, cost_blocks_member_time(cm, &ld[m]));
    bs_keep_free(ld);
    return rc;
}

// The estimated time of every item from the cost model.
static int finalize_times(Plan *p, const CostModel *cm) {
    int32_t max_segs = 1;
    for (int32_t k = 0; k < p->n_items; k++)
        if (p->items[k].n_segs > max_segs) max_segs = p->items[k].n_segs;
    int64_t *lens = bs_keep_alloc((size_t)max_segs * sizeof(int64_t));
    if (!lens) return bs_fail_ctx("plan_finalize");
    for (int32_t k = 0; k < p->n_items; k++) {
        Item *it = &p->items[k];
        for (int32_t j = 0; j < it->n_segs; j++) lens[j] = p->segs[it->seg_begin + j].len;
        if (plan_item_kind(p, k) == ITEM_BLOCKS) {
            if (blocks_item_time(p, k, cm) != 0) {
                bs_keep_free(lens);
                return -1;
            }
            continue;
        }
        if (it->ulysses > 0)  // a ring of n_ranks / ulysses groups (plan_validate: ulysses divides n_ranks)
            it->est_time = cost_hybrid_item_time(cm, lens, it->n_segs, it->ulysses, it->n_ranks / it->ulysses,
                                                 it->offload);
        else
            it->est_time = it->a2a ? cost_a2a_item_time(cm, lens, it->n_segs, it->n_ranks, it->offload)
                                   : cost_item_time(cm, lens, it->n_segs, it->n_ranks, it->offload);
    }
    bs_keep_free(lens);
    return 0;
}

// ---- the makespan with pipeline parallelism ----------------------------------------------------------
//
// With pp > 1 stages an HDP rank is a pipeline, and a plan runs as the simulator runs it (sim.c,
// docs/simulator.md): every item is a forward on stages 0 .. pp-1 and a backward on pp-1 .. 0, one
// resource per (rank, stage), a ring's operation starting on all its members at once when the
// stage is free on every member and its input is ready. The order on each stage is by key:
//     slot(i) = 1 + the largest slot of the earlier items (global order) that share a rank with i
//     forward of item i on stage s:  key 2 (slot + s)      backward:  key 2 (slot + pp) - 1
// which is 1F1B for a pipeline's consecutive items (pp - 1 - s warm-up forwards on stage s, then one
// forward / one backward). Every stage runs l layers of an item, so its forward takes est_time / 3
// and its backward 2 est_time / 3 (the cost model's backward = 2x forward).
//
// No closed formula reproduces this schedule. For one pipeline of m equal items of per-stage time
// t it is the textbook (m + pp - 1) t, i.e. sum of t + (pp - 1) x (forward of the first item, the
// fill, + backward of the last, the drain). With unequal items the last stage idles at every level
// change (a big item's backward must drain through the other stages before the next items' forwards
// reach the last stage; a big item after small ones must first fill them), by an amount that
// depends on the pp - 1 items around it, and rings couple the pipelines of their members. So the
// planner replays the schedule itself, with its own per-stage times: no activation hops between
// stages and the planner's link for every ring, the two things only the simulator knows.
//
// Keys are walked in increasing order without sorting: key 2j holds the forwards of the items of
// slot j - s on stage s, key 2j + 1 the backwards of the items of slot j + 1 - pp (last stage
// first). Two operations with one key never share a resource (equal slots never share a rank), so
// within a key any order gives the same times. O(pp (slots + pp) + pp x refs) time, O(items + pp x
// ranks in use) memory.
// slot[k] for every item; last[r] = the slot of rank r's latest item (-1: the rank runs nothing).
// At a barrier (Plan.barriers) every rank's slots jump past the keys of all earlier items (the
// backward of the largest slot so far, top, has key 2 (top + pp) - 1), so every operation of a wave
// comes after every operation of the waves before it in the walk by keys.
static void slots_fill(const Plan *p, int32_t *slot, int32_t *last) {
    for (int32_t r = 0; r < p->n_ranks; r++) last[r] = -1;
    int32_t top = -1, w = 0;
    for (int32_t k = 0; k < p->n_items; k++) {
        if (w < p->n_barriers && p->barriers[w] == k) {
            for (int32_t r = 0; r < p->n_ranks; r++) last[r] = top + p->pp - 1;
            w++;
        }
        const Item *it = &p->items[k];
        const int32_t *rk = p->ranks + it->rank_begin;
        int32_t s = 0;
        for (int32_t j = 0; j < it->n_ranks; j++)
            if (last[rk[j]] + 1 > s) s = last[rk[j]] + 1;
        for (int32_t j = 0; j < it->n_ranks; j++) last[rk[j]] = s;
        slot[k] = s;
        if (s > top) top = s;
    }
}

// The wave of every item: how many barriers come at or before it.
static void waves_fill(const Plan *p, int32_t *wave) {
    int32_t w = 0;
    for (int32_t k = 0; k < p->n_items; k++) {
        while (w < p->n_barriers && p->barriers[w] <= k) w++;
        wave[k] = w;
    }
}

int plan_pipeline_slots(const Plan *p, int32_t *slot) {
    int32_t *last = bs_keep_alloc((size_t)(p->n_ranks > 0 ? p->n_ranks : 1) * sizeof(int32_t));
    if (!last) return bs_fail_ctx("plan_pipeline_slots");
    slots_fill(p, slot, last);
    bs_keep_free(last);
    return 0;
}

static int pipeline_makespan(Plan *p, double *out) {
    int32_t n = p->n_items, R = p->n_ranks, pp = p->pp;
    int32_t *slot = bs_keep_alloc((size_t)(n > 0 ? n : 1) * sizeof(int32_t));
    int32_t *by_slot = bs_keep_alloc((size_t)(n > 0 ? n : 1) * sizeof(int32_t));
    // slots stay below n, plus pp - 1 skipped at every barrier (slots_fill)
    size_t n_slots = (size_t)n + (size_t)(pp - 1) * (size_t)p->n_barriers + 1;
    int32_t *slot_begin = bs_keep_calloc(n_slots + 1, sizeof(int32_t));
    int32_t *fill = bs_keep_alloc(n_slots * sizeof(int32_t));
    int32_t *last = bs_keep_alloc((size_t)R * sizeof(int32_t));   // per rank: its latest item's slot
    int32_t *dense = bs_keep_alloc((size_t)R * sizeof(int32_t));  // per rank: its row in free_at, -1 idle
    double *f_end = bs_keep_alloc((size_t)(n > 0 ? n : 1) * sizeof(double));
    double *b_end = bs_keep_alloc((size_t)(n > 0 ? n : 1) * sizeof(double));
    int32_t *wave = bs_keep_alloc((size_t)(n > 0 ? n : 1) * sizeof(int32_t));
    double *free_at = NULL;
    int rc = -1;
    if (!slot || !by_slot || !slot_begin || !fill || !last || !dense || !f_end || !b_end || !wave) goto out;
    waves_fill(p, wave);
    // slots, and the ranks that run anything (only those get a row of pp free times)
    int32_t max_slot = -1, used = 0;
    slots_fill(p, slot, last);
    for (int32_t k = 0; k < n; k++) {
        slot_begin[slot[k] + 1]++;
        if (slot[k] > max_slot) max_slot = slot[k];
    }
    for (int32_t r = 0; r < R; r++) dense[r] = last[r] >= 0 ? used++ : -1;
    free_at = bs_keep_calloc((size_t)(used > 0 ? used : 1) * (size_t)pp, sizeof(double));
    if (!free_at) goto out;
    // items by slot (counting sort, global order within a slot)
    for (int32_t q = 0; q <= max_slot; q++) slot_begin[q + 1] += slot_begin[q];
    memcpy(fill, slot_begin, (size_t)(max_slot + 1) * sizeof(int32_t));
    for (int32_t k = 0; k < n; k++) by_slot[fill[slot[k]]++] = k;

    // a barrier: the first operation of a wave starts no earlier than the last end so far (all of the
    // earlier waves' operations have smaller keys, slots_fill)
    double makespan = 0, floor_t = 0, all_end = 0;
    int32_t cur_wave = 0;
    for (int64_t j = 0; j <= (int64_t)max_slot + pp; j++) {
        for (int32_t s = 0; s < pp; s++) {  // key 2j: forwards
            int64_t q = j - s;
            if (q < 0 || q > max_slot) continue;
            for (int32_t x = slot_begin[q]; x < slot_begin[q + 1]; x++) {
                int32_t k = by_slot[x];
                const Item *it = &p->items[k];
                const int32_t *rk = p->ranks + it->rank_begin;
                if (wave[k] > cur_wave) cur_wave = wave[k], floor_t = all_end;
                double start = s == 0 ? floor_t : f_end[k];
                for (int32_t m = 0; m < it->n_ranks; m++) start = cost_fmax(start, free_at[(size_t)dense[rk[m]] * pp + s]);
                double end = start + it->est_time / 3;
                all_end = cost_fmax(all_end, end);
                for (int32_t m = 0; m < it->n_ranks; m++) free_at[(size_t)dense[rk[m]] * pp + s] = end;
                f_end[k] = end;
            }
        }
        int64_t q = j + 1 - pp;  // key 2j + 1: backwards
        if (q < 0 || q > max_slot) continue;
        for (int32_t x = slot_begin[q]; x < slot_begin[q + 1]; x++) {
            int32_t k = by_slot[x];
            const Item *it = &p->items[k];
            const int32_t *rk = p->ranks + it->rank_begin;
            for (int32_t s = pp - 1; s >= 0; s--) {
                double start = s == pp - 1 ? f_end[k] : b_end[k];
                for (int32_t m = 0; m < it->n_ranks; m++) start = cost_fmax(start, free_at[(size_t)dense[rk[m]] * pp + s]);
                double end = start + it->est_time * 2 / 3;
                for (int32_t m = 0; m < it->n_ranks; m++) free_at[(size_t)dense[rk[m]] * pp + s] = end;
                b_end[k] = end;
            }
            if (b_end[k] > makespan) makespan = b_end[k];
            all_end = cost_fmax(all_end, makespan);
        }
    }
    *out = makespan;
    rc = 0;
out:
    if (rc != 0) bs_fail_ctx("plan_finalize: the pipeline schedule");
    bs_keep_free(slot);
    bs_keep_free(by_slot);
    bs_keep_free(slot_begin);
    bs_keep_free(fill);
    bs_keep_free(last);
    bs_keep_free(dense);
    bs_keep_free(f_end);
    bs_keep_free(b_end);
    bs_keep_free(wave);
    bs_keep_free(free_at);
    return rc;
}

// Both bounds, of the sequences this step trains (delayed ones are left out).
static int finalize_bounds(Plan *p, const CostModel *cm) {
    GlobalBatch b = p->batch;
    if (p->n_delayed > 0) {
        b.seqs = bs_keep_alloc((size_t)p->batch.n * sizeof(Sequence));
        if (!b.seqs) return bs_fail_ctx("plan_finalize");
        b.n = b.n_tokens = 0;
        for (int64_t i = 0, d = 0; i < p->batch.n; i++) {
            if (d < p->n_delayed && p->delayed[d] == i) {
                d++;
                continue;
            }
            b.seqs[b.n++] = p->batch.seqs[i];
            b.n_tokens += p->batch.seqs[i].len;
        }
    }
    plan_bounds(&b, cm, p->n_ranks, p->capacity, p->pp, &p->lower_bound, &p->hdp_bound);
    if (p->n_delayed > 0) bs_keep_free(b.seqs);
    return 0;
}

int plan_finalize(Plan *p, const CostModel *cm) { return plan_finalize_bounds(p, cm, NULL); }

int plan_finalize_bounds(Plan *p, const CostModel *cm, const double *bounds) {
    bs_keep_free(p->rank_begin);
    bs_keep_free(p->rank_items);
    bs_keep_free(p->rank_busy);
    p->rank_begin = p->rank_items = NULL;
    p->rank_busy = NULL;
    // the derivation indexes by rank and segment, so those must be in range (plan_validate checks
    // everything else)
    int64_t refs = 0;
    for (int32_t k = 0; k < p->n_items; k++) {
        const Item *it = &p->items[k];
        if (it->n_ranks < 1 || it->rank_begin < 0 || (int64_t)it->rank_begin + it->n_ranks > p->n_refs)
            return bs_fail("item %d: rank list [%d, +%d) outside the %d rank refs", k, it->rank_begin, it->n_ranks,
                           p->n_refs);
        if (it->n_segs < 1 || it->seg_begin < 0 || (int64_t)it->seg_begin + it->n_segs > p->n_segs)
            return bs_fail("item %d: segment list [%d, +%d) outside the %d segments", k, it->seg_begin,
                           it->n_segs, p->n_segs);
        for (int32_t j = 0; j < it->n_ranks; j++) {
            int32_t r = p->ranks[it->rank_begin + j];
            if (r < 0 || r >= p->n_ranks)
                return bs_fail("item %d: rank %d out of range [0, %d)", k, r, p->n_ranks);
        }
        refs += it->n_ranks;
    }
    if (cm && finalize_times(p, cm) != 0) return -1;

    p->rank_begin = bs_keep_calloc((size_t)p->n_ranks + 1, sizeof(int32_t));
    p->rank_items = bs_keep_alloc((size_t)(refs > 0 ? refs : 1) * sizeof(int32_t));
    p->rank_busy = bs_keep_calloc((size_t)p->n_ranks, sizeof(double));
    double *free_at = bs_keep_calloc((size_t)p->n_ranks, sizeof(double));
    int32_t *fill = bs_keep_alloc((size_t)p->n_ranks * sizeof(int32_t));
    if (!p->rank_begin || !p->rank_items || !p->rank_busy || !free_at || !fill) {
        bs_keep_free(free_at);
        bs_keep_free(fill);
        return bs_fail_ctx("plan_finalize");
    }
    // counting sort of (item, member) pairs by rank; items are visited in global order, so every
    // rank's list comes out increasing
    for (int32_t k = 0; k < p->n_items; k++)
        for (int32_t j = 0; j < p->items[k].n_ranks; j++) p->rank_begin[p->ranks[p->items[k].rank_begin + j] + 1]++;
    for (int32_t r = 0; r < p->n_ranks; r++) p->rank_begin[r + 1] += p->rank_begin[r];
    memcpy(fill, p->rank_begin, (size_t)p->n_ranks * sizeof(int32_t));
    // the makespan: every item starts when the last of its members is free (global order), and an
    // item after a barrier when every earlier item has ended
    double makespan = 0, floor_t = 0;
    for (int32_t k = 0, w = 0; k < p->n_items; k++) {
        const Item *it = &p->items[k];
        const int32_t *rk = p->ranks + it->rank_begin;
        if (w < p->n_barriers && p->barriers[w] == k) floor_t = makespan, w++;
        double start = floor_t;
        for (int32_t j = 0; j < it->n_ranks; j++) {
            p->rank_items[fill[rk[j]]++] = k;
            if (free_at[rk[j]] > start) start = free_at[rk[j]];
        }
        double end = start + it->est_time;
        for (int32_t j = 0; j < it->n_ranks; j++) {
            free_at[rk[j]] = end;
            p->rank_busy[rk[j]] += it->est_time;
        }
        if (end > makespan) makespan = end;
    }
    bs_keep_free(fill);
    bs_keep_free(free_at);
    // with pipelines the items of a rank overlap on its stages, and fill and drain come on top
    if (p->pp > 1 && pipeline_makespan(p, &makespan) != 0) return -1;
    p->makespan = makespan;
    if (cm && bounds) {  // the batch's bounds, known to the caller
        p->lower_bound = bounds[0];
        p->hdp_bound = bounds[1];
        return 0;
    }
    if (cm) return finalize_bounds(p, cm);
    return 0;
}

void plan_chunk(int64_t len, int D, int j, int64_t *start, int64_t *n) {
    // 2D chunks: the first len % 2D of them one token longer
    int64_t parts = 2 * (int64_t)D, base = len / parts, rem = len % parts;
    *n = base + (j < rem ? 1 : 0);
    *start = (int64_t)j * base + (j < rem ? j : rem);
}

// One sequence alone on D ranks at its fastest kind, without offload copies: a ring, or, where the
// head count of a TP shard is known, an all-to-all (Ulysses) group of D within it (cost_a2a_max) or
// a hybrid of D / u groups of u, u dividing D and the heads: the kinds bytescale's policies choose
// from (policy_item_choice). hdp_bound times every long sequence by it. lower_bound keeps timing the
// longest on rings, as it did before these kinds (every plan file carries it, and the peers' files
// stay as they were): it bounds plans of packs and rings, and an all-to-all or hybrid item may beat
// it (docs/planner.md, "The bounds"). A hand-made cost model without heads (a2a_heads = 0) keeps
// the ring-only hdp_bound; a plan of all-to-all groups on it, which only flexsp makes, is not bounded.
double plan_fastest_item(const CostModel *cm, int64_t s, int D) {
    ItemTerms terms;  // what every kind shares, computed once
    cost_item_terms(cm, &s, 1, D, &terms);
    double t = cost_ring_terms_time(cm, &terms, 0.0);
    int heads = cm->a2a_heads;
    if (D < 2 || heads <= 0) return t;
    if (D <= heads) t = cost_fmin(t, cost_a2a_terms_time(cm, &terms, 0.0));
    for (int g = cost_gcd(D, heads), u = cost_hybrid_next(1, g, D); u > 0; u = cost_hybrid_next(u, g, D))
        t = cost_fmin(t, cost_hybrid_terms_time(cm, &terms, u, 0.0));
    return t;
}

// A ring's time grows with D past its fastest width: per layer every member makes D attention calls
// (attn_step each), and it passes D - 1 K/V blocks of s/D tokens forward, D - 1 twice that backward
// and one more home, each block the link's latency plus its bytes over the link's bandwidth (what of
// it compute hides, a block's attention takes instead: fmax in cost_item_time). That floor grows with
// D wherever the ring's link is the one between nodes (past ranks_per_node), and every other term of
// the cost model is >= 0 where every field is (cost_fields_nonneg). So the search for the longest sequence's
// fastest ring stops at the first such D whose floor is above the best time found: no wider ring can
// reach it. The floor is scaled down by 1e-9 against the rounding of either side, so the minimum
// found is the very one a search over every width finds.
static double ring_floor(const CostModel *cm, int64_t s, int D) {
    if (cm->ranks_per_node > 1 && cm->ring_bw_intra > 0 && D <= cm->ranks_per_node) return 0;  // inside a node
    double bytes = cm->ring_bw > 0 ? cm->kv_token * (double)s / D / cm->ring_bw : 0;  // one block's transfer
    double xfer = (3.0 * D - 2) * bytes + (2.0 * D - 1) * cm->ring_lat;
    return cm->n_layers * cost_fmax(xfer, D * cm->attn_step) * (1 - 1e-9);
}

// What one pass over the batch sums for both bounds (the same cost model, so each sequence's work
// is computed once for both): every sequence's work and the longest one (plan_lower_bound_pp), and
// with hdp set HDP's terms (plan_hdp_bound): the short sequences' work, tokens and longest, and each
// long one's work at its cheapest ring size and its time at its fastest (docs/planner.md).
typedef struct {
    double work;  // every sequence's compute once
    int64_t longest;
    double hdp_work, hdp_single;  // the short ones' compute and the long ones' cheapest D x time; the slowest fastest
    int64_t short_tokens, longest_short;
} BoundSums;

// A sequence of s > C tokens under HDP's rule: a ring of its own on D in [D_off(s), min(ceil(s/C), R)]
// ranks (Eq. 3's fewest with offloading up to the ranks it needs). Offload copies only add time, so
// r = 0. Its work (D x its time on each of D ranks, ring steps and per-layer constants included) at
// the cheapest D into *w, its indivisible time (the fastest D) into *t; 0 where it fits nowhere (the
// policies report it).
static int hdp_long(const CostModel *cm, int64_t s, int32_t n_ranks, int64_t capacity, double *w, double *t) {
    int64_t need = s / capacity + (s % capacity != 0);
    int d_hi = need < n_ranks ? (int)need : n_ranks;
    double r;
    int d_lo = cost_min_ranks(cm, s, capacity, 1, d_hi, &r);
    if (d_lo < 1) return 0;
    *w = *t = INFINITY;
    for (int D = d_lo; D <= d_hi; D++) {
        double td = plan_fastest_item(cm, s, D);
        if (td < *t) *t = td;
        if (D * td < *w) *w = D * td;
    }
    return 1;
}

static BoundSums bound_sums(const GlobalBatch *b, const CostModel *cm, int32_t n_ranks, int64_t capacity, int hdp) {
    BoundSums u = {0};
    for (int64_t i = 0; i < b->n; i++) {
        int64_t s = b->seqs[i].len;
        double work = cost_seq_work(cm, s);
        u.work += work;
        if (s > u.longest) u.longest = s;
        if (!hdp) continue;
        double w, t;
        if (s <= capacity) {  // a pack: its compute, and the per-layer constants counted by the caller
            u.hdp_work += work;
            u.short_tokens += s;
            if (s > u.longest_short) u.longest_short = s;
        } else if (hdp_long(cm, s, n_ranks, capacity, &w, &t)) {
            u.hdp_work += w;
            if (t > u.hdp_single) u.hdp_single = t;
        }
    }
    return u;
}

// The two parts of the policy-independent bound for one stage: *avg, the average work per rank,
// and *single, the longest sequence's fastest time on any ring it fits (docs/planner.md).
static void bound_parts(const BoundSums *u, const CostModel *cm, int64_t n_tokens, int32_t n_ranks, int64_t capacity,
                        double *avg, double *single) {
    // 1. average work: every sequence's compute once, plus cost_slot_const for every (item, member) slot;
    //    no slot holds more than cost_max_offload_tokens tokens
    int64_t longest = u->longest;
    double slots = ceil((double)n_tokens / cost_max_offload_tokens(cm, capacity) - 1e-9);
    if (slots < 1) slots = 1;
    *avg = (u->work + slots * cost_slot_const(cm)) / n_ranks;
    // 2. the longest sequence (the costliest: the work of a whole sequence grows with its length
    //    at every ring size) must run as one item on some D ranks: at best the fastest ring size
    //    that can hold it, without offload copies
    //    (every D is tried up to 65,536 ranks past the fewest; beyond, any ring still takes at
    //    least its share W(s)/D + l * layer_const >= W(s)/R + l * layer_const, which stands in)
    //    (and only until a ring's floor passes the best: ring_floor)
    double r;
    int d_lo = cost_min_ranks(cm, longest, capacity, 1, n_ranks, &r);
    *single = 0;
    if (d_lo >= 1) {
        *single = INFINITY;
        int d_hi = n_ranks - d_lo > 65535 ? d_lo + 65535 : n_ranks, prune = cost_fields_nonneg(cm);
        for (int D = d_lo; D <= d_hi; D++) {
            if (prune && ring_floor(cm, longest, D) > *single) break;
            double t = cost_item_time(cm, &longest, 1, D, 0.0);  // rings only: see plan_fastest_item
            if (t < *single) *single = t;
        }
        double share = cost_seq_work(cm, longest) / n_ranks + cost_slot_const(cm);
        if (d_hi < n_ranks && share < *single) *single = share;
    }
    // (a sequence that fits nowhere leaves only the first term: the policies report that error)
}

// Both bounds with pp stages per rank. The indivisible item runs forward through all pp stages and
// back (pp x its per-stage time: (pp - 1) x of it is its own fill and drain). On the last stage of
// any rank the busy time comes after the fill of its first item (pp - 1 forwards) and before the
// drain of its last (pp - 1 backwards); each of those is at least a third resp. two thirds of
// l * layer_const, so the busiest rank needs avg + (pp - 1) l layer_const.
static double with_pipeline(const CostModel *cm, double avg, double single, int32_t pp) {
    double a = avg + (pp - 1) * cm->n_layers * cm->layer_const;
    double s = pp * single;
    return a > s ? a : s;
}

// The head runs on the last pipeline stage only, while an item's estimate (cost_item_time) charges
// it on every stage: with pp > 1 the bounds leave it out, so they stay below any schedule.
static CostModel without_head(const CostModel *cm, int32_t pp) {
    CostModel c = *cm;
    if (pp > 1) c.head_token = c.head_const = 0;
    return c;
}

double plan_lower_bound(const GlobalBatch *b, const CostModel *cm, int32_t n_ranks, int64_t capacity) {
    return plan_lower_bound_pp(b, cm, n_ranks, capacity, 1);
}

double plan_lower_bound_pp(const GlobalBatch *b, const CostModel *cm, int32_t n_ranks, int64_t capacity, int32_t pp) {
    double lower;
    plan_bounds(b, cm, n_ranks, capacity, pp, &lower, NULL);
    return lower;
}

double plan_hdp_bound(const GlobalBatch *b, const CostModel *cm, int32_t n_ranks, int64_t capacity, int32_t pp) {
    double hdp;
    plan_bounds(b, cm, n_ranks, capacity, pp, NULL, &hdp);
    return hdp;
}

void plan_bounds(const GlobalBatch *b, const CostModel *cm_in, int32_t n_ranks, int64_t capacity, int32_t pp,
                 double *lower, double *hdp) {
    if (lower) *lower = 0;
    if (hdp) *hdp = 0;
    if (b->n <= 0 || n_ranks < 1) return;
    CostModel c = without_head(cm_in, pp);
    const CostModel *cm = &c;
    if (pp < 1) pp = 1;
    BoundSums u = bound_sums(b, cm, n_ranks, capacity, hdp != NULL);
    if (lower) {
        double avg, single;
        bound_parts(&u, cm, b->n_tokens, n_ranks, capacity, &avg, &single);
        *lower = with_pipeline(cm, avg, single, pp);
    }
    if (!hdp) return;
    // Under HDP's rule a sequence of s <= C tokens is packed whole on one rank, and a longer one is
    // a ring of its own (hdp_long). Packs hold at most C tokens, and each pays l * layer_const; the
    // longest short sequence alone in a pack is its indivisible time.
    double work = u.hdp_work, single = u.hdp_single;
    if (u.short_tokens > 0) {
        work += (double)((u.short_tokens + capacity - 1) / capacity) * cost_slot_const(cm);
        double t = cost_item_time(cm, &u.longest_short, 1, 1, 0.0);
        if (t > single) single = t;
    }
    *hdp = with_pipeline(cm, work / n_ranks, single, pp);
}
