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

// Every sequence's CP group (the next power of two of ceil(s / C)) must fit the largest aligned
// power-of-two block of the ranks. 0, or -1 + error naming the first that does not.
static int check_groups_fit(const GlobalBatch *b, int64_t C, int32_t R) {
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
    return 0;
}

// The scheduler's queues and scratch, besides the wave.
typedef struct {
    int32_t *q;           // (n,) the queue, this wave
    int32_t *next;        // (n,) the leftovers: the next wave's queue
    int32_t *bucket_end;  // (MHCP_MAX_LOG + 2,) where each bucket of q ends
    int32_t *bucket_at;   // (the same,) each bucket's head
    int32_t *order;       // (R,) scratch of emit_wave
    int32_t *aside;       // (R,) scratch of best_group
    int32_t *ranks;       // (R,) scratch: one item's ranks
    Segment *segs;        // (n,) scratch: one item's segments
    double *key;          // (n,) the lengths, to sort by
} Queues;

// 0, or -1 + error; queues_free frees whatever was allocated.
static int queues_alloc(Queues *qs, Wave *w, int32_t n, int32_t R) {
    qs->q = bs_malloc((size_t)n * sizeof(int32_t));
    qs->next = bs_malloc((size_t)n * sizeof(int32_t));
    qs->bucket_end = bs_malloc((size_t)(MHCP_MAX_LOG + 2) * sizeof(int32_t));
    qs->bucket_at = bs_malloc((size_t)(MHCP_MAX_LOG + 2) * sizeof(int32_t));
    qs->order = bs_malloc((size_t)R * sizeof(int32_t));
    qs->aside = bs_malloc((size_t)R * sizeof(int32_t));
    qs->ranks = bs_malloc((size_t)R * sizeof(int32_t));
    qs->segs = bs_malloc((size_t)n * sizeof(Segment));
    qs->key = bs_malloc((size_t)n * sizeof(double));
    *w = (Wave){.groups = bs_malloc((size_t)R * sizeof(Group)), .placed = bs_malloc((size_t)n * sizeof(Placement)),
                .extra = bs_malloc((size_t)R * sizeof(int64_t)), .pos = bs_malloc((size_t)R * sizeof(int32_t))};
    int ok = qs->q && qs->next && qs->bucket_end && qs->bucket_at && qs->order && qs->aside && qs->ranks && qs->segs &&
             qs->key && w->groups && w->placed && w->extra && w->pos;
    for (int k = 0; ok && k <= MHCP_MAX_LOG; k++) ok = (w->heap[k].g = bs_malloc((size_t)R * sizeof(int32_t))) != NULL;
    return ok ? 0 : bs_fail_ctx("megatron-hcp");
}

static void queues_free(Queues *qs, Wave *w) {
    for (int k = 0; k <= MHCP_MAX_LOG; k++) free(w->heap[k].g);
    free(w->groups);
    free(w->placed);
    free(w->extra);
    free(w->pos);
    free(qs->q);
    free(qs->next);
    free(qs->bucket_end);
    free(qs->bucket_at);
    free(qs->order);
    free(qs->aside);
    free(qs->ranks);
    free(qs->segs);
    free(qs->key);
}

// The first queue: longest first, ties in batch order (policy_order_by_time sorts ascending, so its
// order is read backwards and each run of equal lengths turned back into batch order).
static int queue_longest_first(Queues *qs, const GlobalBatch *b, int32_t n) {
    int32_t *q = qs->q;
    for (int32_t i = 0; i < n; i++) qs->key[i] = (double)b->seqs[i].len;
    if (policy_order_by_time(qs->key, n, qs->next) != 0) return -1;
    for (int32_t i = 0; i < n; i++) q[i] = qs->next[n - 1 - i];
    for (int32_t i = 0; i < n;) {  // equal lengths back into batch order
        int32_t j = i;
        while (j < n && b->seqs[q[j]].len == b->seqs[q[i]].len) j++;
        for (int32_t a = i, z = j - 1; a < z; a++, z--) {
            int32_t t = q[a];
            q[a] = q[z], q[z] = t;
        }
        i = j;
    }
    return 0;
}

// A new wave: every rank free, no group.
static void wave_reset(Wave *w, int32_t R) {
    w->n_groups = w->n_placed = 0;
    w->extra_used = 0;
    w->free_ranks = R;
    w->max_work = 0;
    memset(w->n_of_size, 0, sizeof w->n_of_size);
    for (int k = 0; k <= MHCP_MAX_LOG; k++) w->heap[k].n = 0;
}

// Steps 1-3: the queue q[0 .. n_q) cut into buckets, their heads placed until the wave is full or
// balanced. Returns the first bucket not yet emptied (qs->bucket_at says how far each got).
static int32_t fill_wave(Wave *w, Queues *qs, const GlobalBatch *b, int32_t n_q, int64_t C, int32_t *n_buckets_out) {
    const int32_t *q = qs->q;
    int32_t *bucket_end = qs->bucket_end, *bucket_at = qs->bucket_at;
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
            if (w->n_of_size[log2_of(cp)] > 0 || w->free_ranks >= cp) j = x;
        }
        if (j < 0) break;
        int32_t seq = q[bucket_at[j]];
        int64_t s = b->seqs[seq].len, cp = cp_size(s, C);
        if (first_cp == 0) first_cp = cp;
        int32_t g = best_group(w, log2_of(cp), s, C, qs->aside);
        // a new group of free ranks starts with no work: it wins unless the best group has none either
        if (w->free_ranks >= cp && (g < 0 || w->groups[g].work > 0)) g = new_group(w, cp);
        if (g < 0) break;  // no group of its size has room and no ranks are free: the wave is full
        place(w, g, seq, s);
        bucket_at[j]++;
        while (first_bucket < n_buckets && bucket_at[first_bucket] == bucket_end[first_bucket]) first_bucket++;
        if (cp < first_cp) check_balance = 1;
        if (check_balance && first_bucket < n_buckets && w->max_work - min_work(w) <= MHCP_SPREAD * w->max_work)
            break;
    }
    *n_buckets_out = n_buckets;
    return first_bucket;
}

// Step 4 (Megatron's trim_overload), only while no rank is idle: the most loaded group's last
// sequence goes back to the queue (next[*n_next]) while that narrows the work spread.
static void trim_overload(Wave *w, const GlobalBatch *b, int32_t *next, int32_t *n_next) {
    for (;;) {
        double lo = min_work(w), hi = 0;
        int32_t top = -1;
        for (int32_t g = 0; g < w->n_groups; g++)
            if (top < 0 || w->groups[g].work > hi) hi = w->groups[g].work, top = g;
        if (top < 0 || hi - lo <= MHCP_SPREAD * hi || lo == 0) break;
        Group *gr = &w->groups[top];
        if (gr->n_seqs <= 1) break;
        Placement *pl = &w->placed[gr->last];
        double wk = seq_work(b->seqs[pl->seq].len, gr->size);
        // the spread after taking it away: the group's work falls, the others stay
        double lo2 = gr->work - wk, hi2 = 0;
        for (int32_t g = 0; g < w->n_groups; g++) {
            double x = g == top ? gr->work - wk : w->groups[g].work;
            if (x > hi2) hi2 = x;
            if (x < lo2) lo2 = x;
        }
        if (!(hi2 - lo2 < hi - lo)) break;
        pl->dropped = 1;
        next[(*n_next)++] = pl->seq;
        gr->work -= wk;
        gr->n_seqs--;
        gr->last = pl->prev;
        // (its RingFill and packed are not taken back: nothing more goes into this wave)
        heap_fix(w, &w->heap[log2_of(gr->size)], w->pos[top]);
    }
}

// Step 5 (Megatron's fill_empty_gpus): while ranks are idle, double the first smallest group.
static void fill_idle_ranks(Wave *w) {
    while (w->free_ranks > 0) {
        int32_t g = -1;
        for (int32_t x = 0; x < w->n_groups; x++)
            if (g < 0 || w->groups[x].size < w->groups[g].size) g = x;
        if (g < 0 || w->groups[g].size > w->free_ranks) break;  // not enough idle ranks to double any group
        w->free_ranks -= w->groups[g].size;
        w->groups[g].size *= 2;
    }
}

// One wave from the queue qs->q[0 .. n_q): its items (after a barrier when items came before) and the
// next queue in qs->next. Returns the next queue's length, or -1 + error.
static int32_t plan_wave(Plan *out, Wave *w, Queues *qs, const GlobalBatch *b, int32_t n_q, int64_t C, int32_t R) {
    wave_reset(w, R);
    int32_t n_buckets;
    int32_t first_bucket = fill_wave(w, qs, b, n_q, C, &n_buckets);
    // the leftovers, in bucket order, then what trimming sends back
    int32_t n_next = 0;
    for (int32_t j = first_bucket; j < n_buckets; j++)
        for (int32_t x = qs->bucket_at[j]; x < qs->bucket_end[j]; x++) qs->next[n_next++] = qs->q[x];
    trim_overload(w, b, qs->next, &n_next);
    fill_idle_ranks(w);
    if (out->n_items > 0 && plan_add_barrier(out) != 0) return -1;
    if (emit_wave(out, b, w, qs->order, qs->segs, qs->ranks) != 0) return -1;
    return n_next;
}

int policy_megatron_hcp(Plan *out, const GlobalBatch *b, const PlanConfig *cfg, const CostModel *cm) {
    (void)cm;  // Megatron balances s^2 / cp, not our cost model
    int64_t C = cfg->capacity;
    int32_t R = cfg->n_ranks;
    if (plan_init(out, b, R, C, cfg->pp, "megatron-hcp") != 0) return -1;
    if (b->n == 0) return 0;
    if (check_groups_fit(b, C, R) != 0) return -1;
    int32_t n = (int32_t)b->n;
    Queues qs = {0};
    Wave w;
    int rc = -1;
    if (queues_alloc(&qs, &w, n, R) != 0 || queue_longest_first(&qs, b, n) != 0) goto out;
    // waves until the queue is empty, each wave's leftovers the next one's queue
    for (int32_t n_q = n; n_q > 0;) {
        int32_t n_next = plan_wave(out, &w, &qs, b, n_q, C, R);
        if (n_next < 0) goto out;
        memcpy(qs.q, qs.next, (size_t)n_next * sizeof(int32_t));
        n_q = n_next;
    }
    rc = 0;
out:
    queues_free(&qs, &w);
    return rc;
}
