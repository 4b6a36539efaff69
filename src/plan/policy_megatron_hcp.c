// policy_megatron_hcp.c: Megatron-LM's hybrid (dynamic) data x context parallel scheduler, as its
// public source does it (docs/peers.md, "megatron-hcp": the files and every choice we made).
//
// Every sequence gets a CP size: the next power of two of ceil(s / C) (C, Megatron's
// max_seqlen_per_dp_cp_rank, is our capacity), and a work estimate s^2 / cp. Sorted longest first,
// the sequences are scheduled in waves (Megatron: "groups"), one packed micro-batch per rank each:
//   1. cut the remaining sequences into as many buckets of about equal work as there are distinct
//      CP sizes among them (a bucket closes past 1.1 x its share);
//   2. repeatedly take the head of the first bucket that can go somewhere (a group of its CP size
//      exists, or enough ranks are free), and put it into the least-loaded group of that size that
//      still has room (tokens / cp <= C), or into a new group of free ranks when one is free and
//      the least-loaded group already has work;
//   3. once a smaller CP size than the wave's first has been placed, stop when every rank's work is
//      within 5% of the largest (with a rank still free that never holds);
//   4. trim: while the work spread is over 5% and no rank is idle, send the last sequence of the
//      most loaded group back to the queue if that narrows the spread;
//   5. fill: while ranks are idle, double the CP size of the (first) smallest group.
// A wave's groups become items: one packed ring (a pack for CP 1) per group on a contiguous block
// of ranks. Groups are laid out largest first from rank 0, so every block of 2^k ranks starts at a
// multiple of 2^k (aligned, as Megatron's power-of-two CP groups are). The remaining sequences make
// the next wave, after a barrier over all ranks: Megatron runs each wave as one micro-batch of a
// step on every rank, so no rank starts wave w+1 before all of wave w is done (Plan.barriers; the
// planner's makespan and the simulator both wait there).
#include <stdlib.h>
#include <string.h>

#include "bytescale/error.h"
#include "plan/policy_util.h"

#define MHCP_SPREAD 0.05   // Megatron's delta: the balance target of a wave
#define MHCP_BUCKET_OVER 1.1  // a bucket closes past 1.1 x its share of the work
#define MHCP_MAX_LOG 31

typedef struct {
    int32_t size;       // CP ranks: a power of two
    int32_t id;         // creation order within the wave (Megatron's group id: ties go to the lower)
    double work;        // sum of s^2 / size over its sequences (every member's estimate)
    double packed;      // sum of s / size: Megatron's per-rank token test
    int32_t last;       // its latest placement (index into Wave.placed), -1 none
    int32_t n_seqs;
    RingFill fill;      // per-member tokens under the 2D-chunk layout: the validator's capacity rule
} Group;

typedef struct {
    int32_t seq;        // index into the batch
    int32_t group;
    int32_t prev;       // the group's placement before this one, -1 none
    int32_t dropped;    // trimmed back to the queue
} Placement;

// A min-heap of group ids by (work, id), one per CP size: the least-loaded group of a size.
typedef struct {
    int32_t *g;
    int32_t n;
} GroupHeap;

typedef struct {
    Group *groups;
    int32_t n_groups;
    Placement *placed;
    int32_t n_placed;
    int64_t *extra;     // (n_ranks,) RingFill storage, carved per group as groups are made
    int64_t extra_used;
    int32_t free_ranks;
    int32_t n_of_size[MHCP_MAX_LOG + 1];
    GroupHeap heap[MHCP_MAX_LOG + 1];
    int32_t *pos;       // (n_ranks,) every group's place in its heap
    double max_work;
} Wave;

static int log2_of(int64_t pow2) {
    int k = 0;
    while (((int64_t)1 << k) < pow2) k++;
    return k;
}

// Megatron's dcp_gpus_needed: the next power of two of s / C, at least 1.
static int64_t cp_size(int64_t s, int64_t C) {
    int64_t need = s / C + (s % C != 0), cp = 1;
    while (cp < need) cp *= 2;
    return cp;
}

static double seq_work(int64_t s, int64_t cp) { return (double)s * (double)s / (double)cp; }

static int heap_less(const Wave *w, int32_t a, int32_t b) {
    const Group *x = &w->groups[a], *y = &w->groups[b];
    return x->work < y->work || (x->work == y->work && x->id < y->id);
}

static void heap_swap(Wave *w, GroupHeap *h, int32_t i, int32_t j) {
    int32_t t = h->g[i];
    h->g[i] = h->g[j], h->g[j] = t;
    w->pos[h->g[i]] = i, w->pos[h->g[j]] = j;
}

// Restore the heap around position i (its group's work changed, or it was just put there).
static void heap_fix(Wave *w, GroupHeap *h, int32_t i) {
    while (i > 0 && heap_less(w, h->g[i], h->g[(i - 1) / 2])) heap_swap(w, h, i, (i - 1) / 2), i = (i - 1) / 2;
    for (;;) {
        int32_t l = 2 * i + 1, r = l + 1, m = i;
        if (l < h->n && heap_less(w, h->g[l], h->g[m])) m = l;
        if (r < h->n && heap_less(w, h->g[r], h->g[m])) m = r;
        if (m == i) break;
        heap_swap(w, h, i, m), i = m;
    }
}

static void heap_push(Wave *w, GroupHeap *h, int32_t g) {
    h->g[h->n] = g;
    w->pos[g] = h->n++;
    heap_fix(w, h, h->n - 1);
}

static int32_t heap_pop(Wave *w, GroupHeap *h) {
    int32_t top = h->g[0];
    heap_swap(w, h, 0, --h->n);
    if (h->n > 0) heap_fix(w, h, 0);
    return top;
}

// The least work of any rank: 0 while a rank is free, else the least-loaded group's.
static double min_work(const Wave *w) {
    if (w->free_ranks > 0) return 0;
    double m = -1;
    for (int k = 0; k <= MHCP_MAX_LOG; k++)
        if (w->heap[k].n > 0 && (m < 0 || w->groups[w->heap[k].g[0]].work < m)) m = w->groups[w->heap[k].g[0]].work;
    return m < 0 ? 0 : m;
}

// Does group g have room for a sequence of s tokens? Megatron's test (packed + s / size <= C) and
// ours: no member above C under the chunk layout (Megatron pads every sequence to a multiple of
// 2 cp, we do not).
static int group_fits(const Group *g, int64_t s, int64_t C) {
    return g->packed + (double)s / g->size <= (double)C && ring_fill_peek(&g->fill, s) <= C;
}

// The least-loaded group of size cp with room for s, or -1; the heap is left as it was.
static int32_t best_group(Wave *w, int k, int64_t s, int64_t C, int32_t *aside) {
    GroupHeap *h = &w->heap[k];
    int32_t n_aside = 0, best = -1;
    while (h->n > 0) {
        int32_t g = heap_pop(w, h);
        aside[n_aside++] = g;
        if (group_fits(&w->groups[g], s, C)) {
            best = g;
            break;
        }
    }
    for (int32_t i = 0; i < n_aside; i++) heap_push(w, h, aside[i]);
    return best;
}

static void place(Wave *w, int32_t g, int32_t seq, int64_t s) {
    Group *gr = &w->groups[g];
    gr->work += seq_work(s, gr->size);
    gr->packed += (double)s / gr->size;
    ring_fill_add(&gr->fill, s);
    w->placed[w->n_placed] = (Placement){seq, g, gr->last, 0};
    gr->last = w->n_placed++;
    gr->n_seqs++;
    heap_fix(w, &w->heap[log2_of(gr->size)], w->pos[g]);
    if (gr->work > w->max_work) w->max_work = gr->work;
}

static int32_t new_group(Wave *w, int64_t cp) {
    int32_t g = w->n_groups++;
    Group *gr = &w->groups[g];
    memset(gr, 0, sizeof *gr);
    gr->size = (int32_t)cp;
    gr->id = g;
    gr->last = -1;
    gr->fill = (RingFill){.D = cp, .extra = w->extra + w->extra_used};
    w->extra_used += cp;
    ring_fill_clear(&gr->fill);
    w->free_ranks -= (int32_t)cp;
    w->n_of_size[log2_of(cp)]++;
    heap_push(w, &w->heap[log2_of(cp)], g);
    return g;
}

// Megatron's dcp_make_buckets_equal: cut q[0 .. n) (longest first) into as many buckets as there
// are distinct CP sizes, each about an equal share of the work. bucket_end[j] is where bucket j ends.
static int32_t make_buckets(const GlobalBatch *b, const int32_t *q, int32_t n, int64_t C, int32_t *bucket_end) {
    int distinct = 0;
    unsigned long long seen = 0;
    double total = 0;
    for (int32_t i = 0; i < n; i++) {
        int64_t cp = cp_size(b->seqs[q[i]].len, C);
        int k = log2_of(cp);
        if (!(seen >> k & 1)) seen |= 1ull << k, distinct++;
        total += seq_work(b->seqs[q[i]].len, cp);
    }
    double target = total / distinct, cur = 0;
    int32_t n_buckets = 0, remaining_k = distinct, cur_n = 0;
    for (int32_t i = 0; i < n; i++) {
        int64_t s = b->seqs[q[i]].len;
        double wk = seq_work(s, cp_size(s, C));
        // the source's second test counts closed buckets twice (remaining_k falls as they close); kept
        if (cur_n > 0 && (cur + wk > target * MHCP_BUCKET_OVER || n - i <= remaining_k - n_buckets)) {
            bucket_end[n_buckets++] = i;
            cur = 0, cur_n = 0;
            remaining_k--;
        }
        cur += wk;
        cur_n++;
    }
    if (cur_n > 0) bucket_end[n_buckets++] = n;
    return n_buckets;
}

// Lay a wave's groups out, largest first from rank 0, and append one item per group.
static int emit_wave(Plan *out, const GlobalBatch *b, Wave *w, int32_t *order, Segment *segs, int32_t *ranks) {
    // groups by size, descending, creation order among equals (insertion sort: few groups per size
    // class interleave, and this runs once per wave)
    for (int32_t i = 0; i < w->n_groups; i++) order[i] = i;
    for (int32_t i = 1; i < w->n_groups; i++) {
        int32_t g = order[i], j = i;
        while (j > 0 && w->groups[order[j - 1]].size < w->groups[g].size) order[j] = order[j - 1], j--;
        order[j] = g;
    }
    int32_t at = 0;
    for (int32_t i = 0; i < w->n_groups; i++) {
        const Group *g = &w->groups[order[i]];
        int32_t n = 0;
        for (int32_t x = g->last; x >= 0; x = w->placed[x].prev)
            if (!w->placed[x].dropped) n++;
        int32_t j = n;
        for (int32_t x = g->last; x >= 0; x = w->placed[x].prev)  // placement order
            if (!w->placed[x].dropped) {
                int32_t q = w->placed[x].seq;
                segs[--j] = (Segment){q, 0, b->seqs[q].len};
            }
        for (int32_t r = 0; r < g->size; r++) ranks[r] = at + r;
        at += g->size;
        if (n > 0 && plan_add_item(out, segs, n, ranks, g->size, 0.0) < 0) return -1;
    }
    return 0;
}

int policy_megatron_hcp(Plan *out, const GlobalBatch *b, const PlanConfig *cfg, const CostModel *cm) {
    (void)cm;  // Megatron balances s^2 / cp, not our cost model
    int64_t C = cfg->capacity;
    int32_t R = cfg->n_ranks;
    if (plan_init(out, b, R, C, cfg->pp, "megatron-hcp") != 0) return -1;
    if (b->n == 0) return 0;
    int64_t block = 1;  // the largest aligned power-of-two block the ranks hold
    while (block * 2 <= R) block *= 2;
    for (int64_t i = 0; i < b->n; i++) {
        int64_t cp = cp_size(b->seqs[i].len, C);
        if (cp > block)
            return bs_fail("sequence %lld (id %lld) of %lld tokens needs a CP group of %lld ranks (the next power "
                           "of two of ceil(s / %lld)); the largest power-of-two group of %d ranks is %lld",
                           (long long)i, (long long)b->seqs[i].id, (long long)b->seqs[i].len, (long long)cp,
                           (long long)C, R, (long long)block);
    }
    int32_t n = (int32_t)b->n;
    int32_t *q = bs_malloc((size_t)n * sizeof(int32_t));        // the queue, this wave
    int32_t *next = bs_malloc((size_t)n * sizeof(int32_t));     // the leftovers: the next wave's queue
    int32_t *bucket_end = bs_malloc((size_t)(MHCP_MAX_LOG + 2) * sizeof(int32_t));
    int32_t *bucket_at = bs_malloc((size_t)(MHCP_MAX_LOG + 2) * sizeof(int32_t));
    int32_t *order = bs_malloc((size_t)R * sizeof(int32_t));
    int32_t *aside = bs_malloc((size_t)R * sizeof(int32_t));
    int32_t *ranks = bs_malloc((size_t)R * sizeof(int32_t));
    Segment *segs = bs_malloc((size_t)n * sizeof(Segment));
    double *key = bs_malloc((size_t)n * sizeof(double));
    Wave w = {.groups = bs_malloc((size_t)R * sizeof(Group)), .placed = bs_malloc((size_t)n * sizeof(Placement)),
              .extra = bs_malloc((size_t)R * sizeof(int64_t)), .pos = bs_malloc((size_t)R * sizeof(int32_t))};
    int ok = q && next && bucket_end && bucket_at && order && aside && ranks && segs && key && w.groups && w.placed &&
             w.extra && w.pos;
    for (int k = 0; ok && k <= MHCP_MAX_LOG; k++) ok = (w.heap[k].g = bs_malloc((size_t)R * sizeof(int32_t))) != NULL;
    int rc = -1;
    if (!ok) {
        bs_fail_ctx("megatron-hcp");
        goto out;
    }
    // longest first, ties in batch order (policy_order_by_time sorts ascending: by -s via n - rank)
    for (int32_t i = 0; i < n; i++) key[i] = (double)b->seqs[i].len;
    if (policy_order_by_time(key, n, next) != 0) goto out;
    for (int32_t i = 0; i < n; i++) q[i] = next[n - 1 - i];
    for (int32_t i = 0; i < n;) {  // equal lengths back into batch order
        int32_t j = i;
        while (j < n && b->seqs[q[j]].len == b->seqs[q[i]].len) j++;
        for (int32_t a = i, z = j - 1; a < z; a++, z--) {
            int32_t t = q[a];
            q[a] = q[z], q[z] = t;
        }
        i = j;
    }
    int32_t n_q = n;
    while (n_q > 0) {
        // a new wave: every rank free
        w.n_groups = w.n_placed = 0;
        w.extra_used = 0;
        w.free_ranks = R;
        w.max_work = 0;
        memset(w.n_of_size, 0, sizeof w.n_of_size);
        for (int k = 0; k <= MHCP_MAX_LOG; k++) w.heap[k].n = 0;
        int32_t n_buckets = make_buckets(b, q, n_q, C, bucket_end);
        for (int32_t j = 0; j < n_buckets; j++) bucket_at[j] = j ? bucket_end[j - 1] : 0;
        int32_t first_bucket = 0;  // buckets before it are empty (Megatron drops leading empty ones)
        int64_t first_cp = 0;
        int check_balance = 0;
        for (;;) {
            // the first bucket whose head can go somewhere
            int32_t j = -1;
            for (int32_t x = first_bucket; x < n_buckets && j < 0; x++) {
                if (bucket_at[x] == bucket_end[x]) continue;
                int64_t cp = cp_size(b->seqs[q[bucket_at[x]]].len, C);
                if (w.n_of_size[log2_of(cp)] > 0 || w.free_ranks >= cp) j = x;
            }
            if (j < 0) break;
            int32_t seq = q[bucket_at[j]];
            int64_t s = b->seqs[seq].len, cp = cp_size(s, C);
            if (first_cp == 0) first_cp = cp;
            int32_t g = best_group(&w, log2_of(cp), s, C, aside);
            // a new group of free ranks starts with no work: it wins unless the best group has none either
            if (w.free_ranks >= cp && (g < 0 || w.groups[g].work > 0)) g = new_group(&w, cp);
            if (g < 0) break;  // no group of its size has room and no ranks are free: the wave is full
            place(&w, g, seq, s);
            bucket_at[j]++;
            while (first_bucket < n_buckets && bucket_at[first_bucket] == bucket_end[first_bucket]) first_bucket++;
            if (cp < first_cp) check_balance = 1;
            if (check_balance && first_bucket < n_buckets && w.max_work - min_work(&w) <= MHCP_SPREAD * w.max_work)
                break;
        }
        // the leftovers, in bucket order, then what trimming sends back
        int32_t n_next = 0;
        for (int32_t j = first_bucket; j < n_buckets; j++)
            for (int32_t x = bucket_at[j]; x < bucket_end[j]; x++) next[n_next++] = q[x];
        // trimming (Megatron's trim_overload): only while no rank is idle
        for (;;) {
            double lo = min_work(&w), hi = 0;
            int32_t top = -1;
            for (int32_t g = 0; g < w.n_groups; g++)
                if (top < 0 || w.groups[g].work > hi) hi = w.groups[g].work, top = g;
            if (top < 0 || hi - lo <= MHCP_SPREAD * hi || lo == 0) break;
            Group *gr = &w.groups[top];
            if (gr->n_seqs <= 1) break;
            Placement *pl = &w.placed[gr->last];
            double wk = seq_work(b->seqs[pl->seq].len, gr->size);
            // the spread after taking it away: the group's work falls, the others stay
            double lo2 = gr->work - wk, hi2 = 0;
            for (int32_t g = 0; g < w.n_groups; g++) {
                double x = g == top ? gr->work - wk : w.groups[g].work;
                if (x > hi2) hi2 = x;
                if (x < lo2) lo2 = x;
            }
            if (!(hi2 - lo2 < hi - lo)) break;
            pl->dropped = 1;
            next[n_next++] = pl->seq;
            gr->work -= wk;
            gr->n_seqs--;
            gr->last = pl->prev;
            // (its RingFill and packed are not taken back: nothing more goes into this wave)
            heap_fix(&w, &w.heap[log2_of(gr->size)], w.pos[top]);
        }
        // filling (Megatron's fill_empty_gpus): while ranks are idle, double the first smallest group
        while (w.free_ranks > 0) {
            int32_t g = -1;
            for (int32_t x = 0; x < w.n_groups; x++)
                if (g < 0 || w.groups[x].size < w.groups[g].size) g = x;
            if (g < 0 || w.groups[g].size > w.free_ranks) break;  // not enough idle ranks to double any group
            w.free_ranks -= w.groups[g].size;
            w.groups[g].size *= 2;
        }
        if (out->n_items > 0 && plan_add_barrier(out) != 0) goto out;
        if (emit_wave(out, b, &w, order, segs, ranks) != 0) goto out;
        memcpy(q, next, (size_t)n_next * sizeof(int32_t));
        n_q = n_next;
    }
    rc = 0;
out:
    for (int k = 0; k <= MHCP_MAX_LOG; k++) free(w.heap[k].g);
    free(w.groups);
    free(w.placed);
    free(w.extra);
    free(w.pos);
    free(q);
    free(next);
    free(bucket_end);
    free(bucket_at);
    free(order);
    free(aside);
    free(ranks);
    free(segs);
    free(key);
    return rc;
}
