// plan.c: building a plan, deriving its per-rank schedules and estimates, the symmetric chunk
// layout, and the lower bound on the step's makespan (plan.h). The validator is in plan_check.c,
// the JSON form in plan_io.c.
#include "bytescale/plan.h"

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bytescale/error.h"

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
    p->batch.seqs = bs_malloc((size_t)(b->n > 0 ? b->n : 1) * sizeof(Sequence));
    if (!p->batch.seqs) return bs_fail_ctx("plan: copying the batch");
    if (b->n > 0) memcpy(p->batch.seqs, b->seqs, (size_t)b->n * sizeof(Sequence));
    p->batch.n = b->n;
    p->batch.n_tokens = b->n_tokens;
    return 0;
}

void plan_free(Plan *p) {
    free(p->batch.seqs);
    free(p->items);
    free(p->segs);
    free(p->ranks);
    free(p->rank_begin);
    free(p->rank_items);
    free(p->rank_busy);
    memset(p, 0, sizeof *p);
}

// Grow *arr (elements of size elem) so that it holds at least need elements.
static int grow(void **arr, int32_t *cap, int64_t need, size_t elem, const char *what) {
    if (need <= *cap) return 0;
    if (need > INT32_MAX) return bs_fail("plan: too many %s (%lld)", what, (long long)need);
    int64_t c = *cap ? *cap : 64;
    while (c < need) c *= 2;
    if (c > INT32_MAX) c = INT32_MAX;
    void *q = bs_realloc(*arr, (size_t)c * elem);
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
    memcpy(p->ranks + p->n_refs, ranks, (size_t)n_ranks * sizeof(int32_t));
    p->n_segs += n_segs;
    p->n_refs += n_ranks;
    return p->n_items++;
}

// The estimated time of every item from the cost model.
static int finalize_times(Plan *p, const CostModel *cm) {
    int32_t max_segs = 1;
    for (int32_t k = 0; k < p->n_items; k++)
        if (p->items[k].n_segs > max_segs) max_segs = p->items[k].n_segs;
    int64_t *lens = bs_malloc((size_t)max_segs * sizeof(int64_t));
    if (!lens) return bs_fail_ctx("plan_finalize");
    for (int32_t k = 0; k < p->n_items; k++) {
        Item *it = &p->items[k];
        for (int32_t j = 0; j < it->n_segs; j++) lens[j] = p->segs[it->seg_begin + j].len;
        it->est_time = cost_item_time(cm, lens, it->n_segs, it->n_ranks, it->offload);
    }
    free(lens);
    return 0;
}

int plan_finalize(Plan *p, const CostModel *cm) {
    free(p->rank_begin);
    free(p->rank_items);
    free(p->rank_busy);
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

    p->rank_begin = bs_calloc((size_t)p->n_ranks + 1, sizeof(int32_t));
    p->rank_items = bs_malloc((size_t)(refs > 0 ? refs : 1) * sizeof(int32_t));
    p->rank_busy = bs_calloc((size_t)p->n_ranks, sizeof(double));
    double *free_at = bs_calloc((size_t)p->n_ranks, sizeof(double));
    int32_t *fill = bs_malloc((size_t)p->n_ranks * sizeof(int32_t));
    if (!p->rank_begin || !p->rank_items || !p->rank_busy || !free_at || !fill) {
        free(free_at);
        free(fill);
        return bs_fail_ctx("plan_finalize");
    }
    // counting sort of (item, member) pairs by rank; items are visited in global order, so every
    // rank's list comes out increasing
    for (int32_t k = 0; k < p->n_items; k++)
        for (int32_t j = 0; j < p->items[k].n_ranks; j++) p->rank_begin[p->ranks[p->items[k].rank_begin + j] + 1]++;
    for (int32_t r = 0; r < p->n_ranks; r++) p->rank_begin[r + 1] += p->rank_begin[r];
    memcpy(fill, p->rank_begin, (size_t)p->n_ranks * sizeof(int32_t));
    // the makespan: every item starts when the last of its members is free (global order)
    double makespan = 0;
    for (int32_t k = 0; k < p->n_items; k++) {
        const Item *it = &p->items[k];
        const int32_t *rk = p->ranks + it->rank_begin;
        double start = 0;
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
    free(fill);
    free(free_at);
    p->makespan = makespan;
    if (cm) p->lower_bound = plan_lower_bound(&p->batch, cm, p->n_ranks, p->capacity);
    return 0;
}

void plan_chunk(int64_t len, int D, int j, int64_t *start, int64_t *n) {
    // 2D chunks: the first len % 2D of them one token longer
    int64_t parts = 2 * (int64_t)D, base = len / parts, rem = len % parts;
    *n = base + (j < rem ? 1 : 0);
    *start = (int64_t)j * base + (j < rem ? j : rem);
}

// Work of one sequence with no ring and no per-micro-batch constant: all layers, fwd + bwd.
static double seq_work(const CostModel *cm, int64_t s) {
    return cm->n_layers * (cm->attn_pair * cost_causal_area(s) + cm->lin_token * (double)s);
}

// The most tokens any valid item can put on one of its ranks: C without offloading; with offload
// ratio r the validator admits (2 + (1-r)(l-2)) Act(T/D) <= l Act(C) (Eq. 3, per rank), which at
// r = 1 allows T/D up to (l Act(C) / 2 - act_const) / act_token when l > 2 (else C).
static double max_tokens_per_slot(const CostModel *cm, int64_t capacity) {
    double best = (double)capacity;
    if (cm->n_layers > 2 && cm->act_token > 0) {
        double t = (cm->n_layers * cost_layer_act(cm, capacity) / 2.0 - cm->act_const) / cm->act_token;
        if (t > best) best = t;
    }
    return best;
}

double plan_lower_bound(const GlobalBatch *b, const CostModel *cm, int32_t n_ranks, int64_t capacity) {
    if (b->n <= 0 || n_ranks < 1) return 0;
    // 1. average work: every sequence's compute once, plus one layer_const per layer for every
    //    (item, member) slot; no slot holds more than max_tokens_per_slot tokens
    double work = 0;
    int64_t longest = 0;
    for (int64_t i = 0; i < b->n; i++) {
        work += seq_work(cm, b->seqs[i].len);
        if (b->seqs[i].len > longest) longest = b->seqs[i].len;
    }
    double slots = ceil((double)b->n_tokens / max_tokens_per_slot(cm, capacity) - 1e-9);
    if (slots < 1) slots = 1;
    double avg = (work + slots * cm->n_layers * cm->layer_const) / n_ranks;
    // 2. the longest sequence (the costliest: the work of a whole sequence grows with its length
    //    at every ring size) must run as one item on some D ranks: at best the fastest ring size
    //    that can hold it, without offload copies
    //    (every D is tried up to 65,536 ranks past the fewest; beyond, any ring still takes at
    //    least its share W(s)/D + l * layer_const >= W(s)/R + l * layer_const, which stands in)
    double r;
    int d_lo = cost_min_ranks(cm, longest, capacity, 1, n_ranks, &r);
    double single = 0;
    if (d_lo >= 1) {
        single = INFINITY;
        int d_hi = n_ranks - d_lo > 65535 ? d_lo + 65535 : n_ranks;
        for (int D = d_lo; D <= d_hi; D++) {
            double t = cost_item_time(cm, &longest, 1, D, 0.0);
            if (t < single) single = t;
        }
        double share = seq_work(cm, longest) / n_ranks + cm->n_layers * cm->layer_const;
        if (d_hi < n_ranks && share < single) single = share;
    }
    // (a sequence that fits nowhere leaves only the first term: the policies report that error)
    return avg > single ? avg : single;
}
