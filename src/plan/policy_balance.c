// policy_balance.c: ByteScale's Algorithm 2, balanced HDP (docs/planner.md has the full story).
//
// Sharding follows Algorithm 1 (policy_shard): packs of <= C tokens for the short sequences, a ring
// for every s > C. The assignment balances estimated TIME (the cost model) with a list scheduler
// over a queue of ranks (RankTree, a tournament tree) keyed by the time each rank is next free:
//   1. Rings, the longest first (the first buckets of the length-sorted batch): each takes the D
//      most-lagging ranks (least accumulated time) and starts when the last of them is free. That
//      start is recorded and the global order is by start time, so the members of every ring line
//      up: none has anything else to do first. Selective offloading: D may be anything from Eq. 3's
//      fewest ranks D_off(s) to ceil(s/C) (only ceil(s/C) without offloading); the ring takes the D
//      that finishes it earliest on the ranks as they are, offloading just enough for that D.
//   2. DP-Balance (pp == 1): the members that wait for a ring's start lag it; every such hole longer
//      than delta x the ring's start is filled with packs of the largest short sequences that fit
//      both its time and C tokens per pack, run before the ring.
//   3. The short sequences left, longest first, each to the most-lagging rank: appended to that
//      rank's open micro-batch while it holds <= C tokens, else a new micro-batch is opened. Ranks
//      end within about one short sequence's time of each other.
// PP-Balance (pp > 1): consecutive micro-batches of a pipeline should cost about the same (a change
// of level adds a pipeline bubble), so holes are not back-filled with small micro-batches (each
// pipeline's micro-batches then come in non-increasing cost) and no micro-batch mixes sequences
// from two of the n_buckets buckets of equal compute that the length-sorted batch is cut into.
// The ranks' times then include the pipeline's fill and drain (pipeline_wait): each rank is timed by
// its last stage, a micro-batch waits there (pp - 1) x the rise of its forward (the stages fill) or
// (pp - 1) x the fall of its backward (the larger backward drains first), and a ring starts when
// the last of its members' last stages is ready for it.
// With pp > 1 the scheduler runs twice, with and without that pipeline model, and keeps the plan
// whose replayed makespan (plan_finalize) is shorter (balance_best, at the end).
// The batch is prepared once (balance_prepare) and scheduled by balance_schedule, which elastic
// (policy_elastic.c) also runs with rings wider than ceil(s/C) (BalanceWidths, policy_balance.h).
// Cost: O((refs + shorts) log ranks) for the tree, O(n log n) for the ring sort and O(n + C) for the
// shorts' (a counting sort by length when C is small next to the batch, else O(n log n)).
#include "plan/policy_balance.h"
#include "core/fminmax.h"

#include <math.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include "bytescale/error.h"
#include "bytescale/keep.h"
#include "plan/policy_util.h"

#define BALANCE_DEFAULT_DELTA 0.001
#define BALANCE_DEFAULT_BUCKETS 16

typedef struct {
    int32_t rank;
    double from, to;  // the rank idles in [from, to) waiting for a ring
} Hole;

// A segment as the scheduler keeps it: every segment is a whole sequence, so its index and length
// say all; the length of a short one (<= C, which fits an int32) is kept beside the index and a
// ring's is its item's tokens, so that emitting the plan reads no sequence back from the batch at random.
typedef struct {
    int32_t seq;
    int32_t len;  // tokens; 0: a ring's sequence, the whole of its item (Made.tokens)
} MadeSeg;

// An item as the scheduler makes it: its segments and ranks in Balance's made_* arrays; a micro-batch
// of phase 3 keeps no segments there (seg_begin -1): its shorts are in the Placed list.
typedef struct {
    int32_t seg_begin, n_segs;
    int32_t rank_begin, n_ranks;
    float offload;
    int32_t a2a, ulysses;  // the kind policy_item_choice chose for a ring (Item.a2a, Item.ulysses)
    int64_t tokens;
} Made;

typedef struct {
    int32_t short_i;  // index among the shorts
    int32_t pack;     // the OpenPack.id of the micro-batch it joined
} Placed;

typedef struct {
    const GlobalBatch *b;
    const PlanConfig *cfg;
    const CostModel *cm;
    const CostModel *wide;  // times rings wider than ceil(s/C) (BalanceWidths.wide, else cm)
    // the items in the order they are made, re-emitted in start order at the end; every sequence is
    // one segment of one item, so there are at most n of each, and the ranks are counted beforehand
    Made *made;          // (n,)
    double *start;       // (n,) planned start of each
    int32_t n_made;
    MadeSeg *made_seg;   // (n,)
    int32_t n_made_segs;
    int32_t n_segs;      // segments of all items made (made_seg's and the placed shorts)
    Placed *placed;      // (n_short,) phase 3's shorts in the order handed out (assign_rest)
    int32_t n_placed;
    int32_t *pack_made;  // (n_short,) per micro-batch of phase 3, by OpenPack.id: its index in made
                         // (emit_plan turns it into where its next segment goes)
    int32_t n_packs;     // phase 3's micro-batches
    int32_t *made_ranks; // (cap_made_ranks,), grown when rings take more than counted
    int64_t n_made_ranks, cap_made_ranks;
    double open_cost;  // what opening a micro-batch adds: one layer_const and attention floor per layer
    double lift;       // pp - 1: the stages a forward fills and a backward drains before the last
    int floors;        // cost_fields_nonneg(cm): a ring's width may be passed over by its floor (place_ring)
    double *last_free; // (n_ranks,) when each rank's last stage is done with its micro-batches so far
    double *last_t;    // (n_ranks,) per-stage time of each rank's latest micro-batch (0: none yet)
    // short sequences that are packed, longest first (BalanceBatch's, less the promoted ones)
    int32_t n_short;
    const int32_t *sidx;   // (n_short,) sequence index
    const int64_t *slen;   // (n_short,) length, non-increasing
    const double *scost;   // (n_short,) time it adds to a micro-batch, non-increasing
    int32_t *sbucket;  // (n_short,) bucket of equal compute (pp > 1 only, else NULL)
    int32_t *unused;   // (n_short + 1,) union-find "next unused short at or after i"
    MadeSeg *pack;     // (min(n_short, C),) scratch: the sequences of one micro-batch (each >= 1 token)
} Balance;

// An item of n_segs segments (`tokens` in all) on these ranks, planned to start at `start`, whose
// segments are at made_seg[seg_begin ..), or come from the placed shorts (seg_begin -1). 0, or -1 + error.
static int record_item(Balance *bl, int32_t seg_begin, int n_segs, int64_t tokens, const int32_t *ranks, int n_ranks,
                       double offload, double start) {
    if (bl->n_made >= bl->b->n || bl->n_segs + n_segs > bl->b->n)
        return bs_fail("balance: more items or segments than sequences (%d items)", bl->n_made);
    if (bl->n_made_ranks + n_ranks > bl->cap_made_ranks) {
        int64_t c = 2 * bl->cap_made_ranks > bl->n_made_ranks + n_ranks ? 2 * bl->cap_made_ranks : bl->n_made_ranks + n_ranks;
        int32_t *r = bs_keep_realloc(bl->made_ranks, (size_t)c * sizeof(int32_t));
        if (!r) return bs_fail_ctx("balance: %lld rank references", (long long)c);
        bl->made_ranks = r;
        bl->cap_made_ranks = c;
    }
    bl->made[bl->n_made] = (Made){seg_begin, n_segs, (int32_t)bl->n_made_ranks, n_ranks, (float)offload, 0, 0, tokens};
    bl->start[bl->n_made++] = start;
    memcpy(bl->made_ranks + bl->n_made_ranks, ranks, (size_t)n_ranks * sizeof(int32_t));
    bl->n_segs += n_segs;
    bl->n_made_ranks += n_ranks;
    return 0;
}

// record_item with the segments given (a ring's, len 0: its whole sequence) and their tokens in all
// (the caller's count: a ring's length read back from the batch here missed the cache every time).
static int record(Balance *bl, const MadeSeg *segs, int n_segs, int64_t tokens, const int32_t *ranks, int n_ranks,
                  double offload, double start) {
    if (record_item(bl, bl->n_made_segs, n_segs, tokens, ranks, n_ranks, offload, start) != 0) return -1;
    memcpy(bl->made_seg + bl->n_made_segs, segs, (size_t)n_segs * sizeof(MadeSeg));
    bl->n_made_segs += n_segs;
    return 0;
}

// ---- pipelines (pp > 1) ---------------------------------------------------------------------------------
//
// With pp stages a rank is a pipeline and the simulator runs its micro-batches 1F1B (plan.c,
// pipeline_makespan): forward F = t/3 and backward B = 2t/3 on every stage for a micro-batch of
// per-stage time t. Timed on the rank's last stage, one pipeline of m equal micro-batches is
//     (pp - 1) F   fill: the first forward crosses the other stages
//   + m t          the last stage runs forward, backward, forward, ... back to back
//   + (pp - 1) B   drain: the last backward crosses the other stages
// = (m + pp - 1) t, the textbook 1F1B time. When the level changes from t_a to t_b the last stage
// waits again: a rise refills the stages with the larger forward, (pp - 1)(F_b - F_a); a fall waits
// for the larger backward to drain before the smaller forwards come through, (pp - 1)(B_a - B_b).
// Summed, a pipeline takes sum t_k + (pp - 1)(F_1 + B_m + the rises of F + the falls of B), which
// for the non-increasing order PP-Balance produces is sum t_k + (pp - 1) t_1. That is exact for
// equal micro-batches and errs high by up to about 12% otherwise (the pp - 1 micro-batches next to
// a big one partly run inside its fill and drain); the plan's makespan is the exact replay
// (plan_finalize), this is what the list scheduler balances. Both are 0 when pp = 1, where a
// rank's key is exactly its free time (then no division is made: a key plus 0 is that key, as plus
// the product's +-0 was).
static double pipeline_wait(const Balance *bl, double t, double last) {
    if (bl->lift == 0) return 0;
    return t > last ? bl->lift * (t - last) / 3 : bl->lift * 2 * (last - t) / 3;
}
static double pipeline_drain(const Balance *bl, double t) { return bl->lift == 0 ? 0 : bl->lift * 2 * t / 3; }

// A rank's key in the queue: when it would be done if nothing more came (its last stage, then the drain).
static double rank_key(const Balance *bl, int32_t r) { return bl->last_free[r] + pipeline_drain(bl, bl->last_t[r]); }

// ---- the shorts: sorted, with "largest unused that fits" queries -----------------------------------

static int32_t next_unused(Balance *bl, int32_t i) {
    int32_t *u = bl->unused;
    while (u[i] != i) {
        u[i] = u[u[i]];  // path halving
        i = u[i];
    }
    return i;
}

static void take(Balance *bl, int32_t i) { bl->unused[i] = i + 1; }

// The first index whose length is <= max_len and whose cost is <= max_cost (both non-increasing).
static int32_t first_fitting(const Balance *bl, int64_t max_len, double max_cost) {
    int32_t lo = 0, hi = bl->n_short;
    while (lo < hi) {
        int32_t mid = lo + (hi - lo) / 2;
        if (bl->slen[mid] <= max_len && bl->scost[mid] <= max_cost) hi = mid;
        else lo = mid + 1;
    }
    return lo;
}

static int by_len_desc(const void *a, const void *b, void *ctx) {
    const GlobalBatch *bt = ctx;
    int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    int64_t lx = bt->seqs[x].len, ly = bt->seqs[y].len;
    if (lx != ly) return lx > ly ? -1 : 1;
    return (x > y) - (x < y);
}

typedef struct {
    double t;       // estimated time on ceil(s / C) ranks, or on D(s) (offloading) when there are fewer
                    // ranks, or on d_max ranks when it may be wider (elastic)
    double work;    // t x those ranks: the ring's part of the batch's total work
    int64_t len;    // the sequence's tokens (kept here, as d_min and its row of the widths: the rings
                    // are placed in time order, and reading the batch's arrays by index there misses
                    // the cache every time)
    int64_t w_at;   // where its widths start in BalanceBatch.widths (d_min first), and
    int32_t w_n;    // how many there are; -1 and 0: no table (a promoted short, or none kept)
    int32_t d_min;  // its fewest ranks (BalanceBatch.d_min)
    int32_t seq;
    int32_t lk;     // its index among the long sequences (BalanceBatch.long_seq); -1: a promoted short
    int32_t d_max;  // the widest it may be: ceil(s / C), or more where elastic widens it
    int64_t plain;  // ceil(s / C), the width every ring's choice starts from
    ItemChoice pc;  // its kind and time there (BalanceBatch.plain's, kept here: the rings are met in
                    // time order, and a read of that array by long index missed the cache every time)
} Ring;

// The rings slowest first, ties by sequence index (a radix order: a third of qsort's time on 1G tokens).
static int sort_rings(Ring *rings, int32_t n) {
    return policy_sort_by_time_desc(rings, n, sizeof(Ring), offsetof(Ring, t), offsetof(Ring, seq));
}

// ---- phase 2: fill the holes before rings -----------------------------------------------------------

static int by_hole_len_desc(const void *a, const void *b) {
    const Hole *x = a, *y = b;
    double lx = x->to - x->from, ly = y->to - y->from;
    if (lx != ly) return lx > ly ? -1 : 1;
    return (x->rank > y->rank) - (x->rank < y->rank);
}

static int fill_hole(Balance *bl, const Hole *h) {
    double at = h->from, pack_start = 0;
    int n_segs = 0;
    int64_t tokens = 0;
    for (;;) {
        double left = h->to - at;
        int32_t i = -1;
        if (n_segs > 0) {  // the open micro-batch: room in tokens and in time
            i = next_unused(bl, first_fitting(bl, bl->cfg->capacity - tokens, left));
            if (i >= bl->n_short) i = -1;
        }
        if (i < 0) {  // a new micro-batch: pays open_cost first
            int32_t j = next_unused(bl, first_fitting(bl, bl->cfg->capacity, left - bl->open_cost));
            if (j >= bl->n_short) break;
            if (n_segs > 0 && record(bl, bl->pack, n_segs, tokens, &h->rank, 1, 0.0, pack_start) != 0) return -1;
            n_segs = 0;
            tokens = 0;
            pack_start = at;
            at += bl->open_cost;
            i = j;
        }
        take(bl, i);
        bl->pack[n_segs++] = (MadeSeg){bl->sidx[i], (int32_t)bl->slen[i]};
        tokens += bl->slen[i];
        at += bl->scost[i];
    }
    if (n_segs > 0 && record(bl, bl->pack, n_segs, tokens, &h->rank, 1, 0.0, pack_start) != 0) return -1;
    return 0;
}

// ---- phase 3: the rest, longest first, to the most-lagging rank ----------------------------------------
//
// Every short goes to the rank on top of the queue, whose open micro-batch is a random one of R: the
// loop touches as little per rank as it can (OpenPack, 32 bytes) and writes down where each short went
// (bl->placed, in order) instead of linking it into its micro-batch; emit_plan writes each short
// straight into its item's segments from that list, in increasing short order as a list would give
// them. A micro-batch is recorded when it closes, as before, so the items and their order are the same.

typedef struct {
    double start;    // the rank's last stage free time when it was opened
    double end;      // start + its time so far (the pipeline's wait not included)
    int32_t tokens;  // <= C <= POLICY_MAX_CAPACITY
    int32_t n;       // shorts in it; 0: no open micro-batch
    int32_t id;      // its index in bl->pack_made
    int32_t bucket;
} OpenPack;

static int close_pack(Balance *bl, OpenPack *op, int32_t rank) {
    if (op->n == 0) return 0;
    double t = op->end - op->start, wait = pipeline_wait(bl, t, bl->last_t[rank]);
    bl->last_free[rank] = op->end + wait;
    bl->last_t[rank] = t;
    bl->pack_made[op->id] = bl->n_made;
    int rc = record_item(bl, -1, op->n, op->tokens, &rank, 1, 0.0, op->start + wait);
    op->n = 0;
    return rc;
}

static int assign_rest(Balance *bl, RankTree *queue) {
    int32_t R = bl->cfg->n_ranks, n_packs = 0;
    int pp_balance = bl->cfg->pp > 1;
    OpenPack *open = bs_keep_calloc((size_t)R, sizeof(OpenPack));
    if (!open) return bs_fail_ctx("balance");
    for (int32_t i = next_unused(bl, 0); i < bl->n_short; i = next_unused(bl, i)) {
        take(bl, i);
        int32_t r = ranktree_top(queue);
        OpenPack *op = &open[r];
        int fits = op->n > 0 && op->tokens + bl->slen[i] <= bl->cfg->capacity &&
                   (!pp_balance || op->bucket == bl->sbucket[i]);
        if (!fits) {
            if (close_pack(bl, op, r) != 0) goto fail;
            double f = bl->last_free[r];
            *op = (OpenPack){f, f + bl->open_cost, 0, 0, n_packs++, pp_balance ? bl->sbucket[i] : 0};
        }
        bl->placed[bl->n_placed++] = (Placed){i, op->id};
        op->n++;
        op->tokens += (int32_t)bl->slen[i];
        op->end += bl->scost[i];
        // the open micro-batch grows, and with it its wait behind the rank's previous one and its drain
        double t = op->end - op->start;
        ranktree_replace_top(queue, op->end + pipeline_wait(bl, t, bl->last_t[r]) + pipeline_drain(bl, t));
    }
    for (int32_t r = 0; r < R; r++)
        if (close_pack(bl, &open[r], r) != 0) goto fail;
    bl->n_packs = n_packs;
    bs_keep_free(open);
    return 0;
fail:
    bs_keep_free(open);
    return -1;
}

// ---- phase 1: rings ------------------------------------------------------------------------------------

// A long sequence at one width HDP's rule allows: the offload ratio that width needs
// (policy_offload_for) and the kind policy_item_choice picks there.
typedef struct WidthChoice {
    ItemChoice c;
    double r;
    int state;  // 0: not costed yet; 1: costed; -1: it fits on no ring of this width
} WidthChoice;

// The last width of long sequence k in the table: ceil(s/C), or every rank when there are fewer.
static int64_t width_top(const BalanceBatch *bb, int32_t k) {
    int64_t s = bb->long_len[k], C = bb->cfg->capacity, plain = s / C + (s % C != 0);
    return plain < bb->cfg->n_ranks ? plain : bb->cfg->n_ranks;
}

// Ring g on dd ranks: 0 where it fits on no ring that wide, else 1 with its kind and offload ratio;
// with the table kept (balance_keep_widths) costed the first time and read from it after (no table,
// a width outside it, or table = 0: costed here every time).
static int width_choice(const BalanceBatch *bb, const Ring *g, int table, int dd, ItemChoice *c, double *r) {
    WidthChoice scratch = {0}, *w = &scratch;
    int64_t len = g->len;
    if (g->lk >= 0 && dd == g->plain) {  // ceil(s/C): fits without offloading, costed once
        *c = g->pc;
        *r = 0.0;
        return 1;
    }
    if (table && g->w_at >= 0 && dd >= g->d_min && dd - g->d_min < g->w_n) w = &bb->widths[g->w_at + dd - g->d_min];
    if (w->state == 0) {
        w->state = policy_offload_for(bb->cm, len, bb->cfg->capacity, dd, &w->r) ? 1 : -1;
        if (w->state > 0) w->c = policy_item_choice(bb->cm, &len, 1, dd, w->r);
    }
    if (w->state < 0) return 0;
    *c = w->c;
    *r = w->r;
    return 1;
}

// The members' state over the first dd of them, least-loaded first: the latest last stage, and the
// lowest and highest levels (the wait is V-shaped in the previous level, so its largest value is at
// one of them).
typedef struct {
    double latest, low, high;
} Front;

static void front_add(const Balance *bl, Front *f, int32_t rank) {
    f->latest = cost_fmax(f->latest, bl->last_free[rank]);
    f->low = cost_fmin(f->low, bl->last_t[rank]);
    f->high = cost_fmax(f->high, bl->last_t[rank]);
}

// When a ring on the first dd members would end (INFINITY where it fits on no ring that wide), with
// the kind and offload ratio it takes there: the latest last stage, its largest wait, its time and
// its drain.
static double width_end(const Balance *bl, const BalanceBatch *bb, const Ring *g, int dd, int64_t plain, const Front *f,
                        ItemChoice *c, double *rd) {
    // the kind by the plan's cost model; a widened ring (elastic) timed as crossing nodes
    if (!width_choice(bb, g, dd <= plain, dd, c, rd)) return INFINITY;
    int64_t len = g->len;
    double td = dd > plain ? policy_kind_time(bl->wide, &len, 1, dd, *rd, c->a2a, c->ulysses) : c->t;
    double wait = cost_fmax(pipeline_wait(bl, td, f->low), pipeline_wait(bl, td, f->high));
    return f->latest + wait + td + pipeline_drain(bl, td);
}

// Selective offloading: Eq. 3's fewest ranks D_off(s) cut ring traffic, but a ring on few ranks
// takes long. So a ring may use any D in [D_off(s), ceil(s/C)] (just D = ceil(s/C) without
// offloading), offloading just enough for that D, and takes the D that finishes it earliest on
// the currently least-loaded ranks: the D-th least-loaded rank's free time + the ring's time on D
// ranks (pp > 1: the latest last stage among the D, its largest wait, and the ring's drain); ties go
// to fewer ranks. With every rank free this is ceil(s/C) (no offload); offloading wins when only a
// few ranks are free soon. Elastic may allow more, up to d_max ranks (no offloading is needed past
// ceil(s/C): every member holds fewer than C tokens); its widths are chosen where the ring's time
// still falls with D, so past ceil(s/C) only the widest D of each run of members that are free at
// the same time (and, pp > 1, at the same levels) can finish first, and only those are costed.
// Costing a width is the work here, and most cannot win: ceil(s/C) is costed first, and a width up to
// it whose latest member plus the ring's floor there (cost_item_floor, every term of an end >= 0)
// already passes that end is not costed. The floor is scaled down by 1e-9 against the rounding of
// either side, so the width chosen is the very one costing every width finds.
// Pops d_hi ranks into members (least-loaded first); the caller takes the first *d and pushes the
// rest back.
static int place_ring(const Balance *bl, const BalanceBatch *bb, const Ring *g, RankTree *queue, int32_t *members, int *d,
                      int *d_hi, ItemChoice *t, double *r) {
    const CostModel *cm = bl->cm;
    int64_t C = bl->cfg->capacity, len = g->len;
    int d_lo = g->d_min;
    int64_t plain = g->plain, top = plain > g->d_max ? plain : g->d_max;
    *d_hi = top < queue->n ? (int)top : queue->n;
    if (d_lo > *d_hi) d_lo = *d_hi;
    for (int j = 0; j < *d_hi; j++) members[j] = ranktree_pop(queue);
    // the first width costed, ceil(s/C) (or all there are): the end every other must beat
    int probe = plain < *d_hi ? (int)plain : *d_hi;
    double known = INFINITY, probe_end = INFINITY, probe_r = 0;
    ItemChoice probe_c = {0, 0, 0};
    if (bl->floors && probe >= d_lo) {
        Front f = {0, INFINITY, 0};
        for (int j = 0; j < probe; j++) front_add(bl, &f, members[j]);
        known = probe_end = width_end(bl, bb, g, probe, plain, &f, &probe_c, &probe_r);
    }
    Front f = {0, INFINITY, 0};
    for (int j = 0; j < d_lo - 1; j++) front_add(bl, &f, members[j]);
    double best = INFINITY;
    *d = -1;
    for (int dd = d_lo; dd <= *d_hi; dd++) {
        front_add(bl, &f, members[dd - 1]);
        if (dd > plain && dd < *d_hi) {  // a wider ring with the same start and wait is faster
            int32_t next = members[dd];
            int same_wait = bl->lift == 0 || (bl->last_t[next] >= f.low && bl->last_t[next] <= f.high);
            if (bl->last_free[next] <= f.latest && same_wait) continue;
        }
        double rd, end;
        ItemChoice c;
        if (dd == probe && known < INFINITY) {
            end = probe_end, c = probe_c, rd = probe_r;
        } else {
            if (dd <= plain && f.latest + cost_item_floor(cm, len, dd) * (1 - 1e-9) > known) continue;  // cannot win
            end = width_end(bl, bb, g, dd, plain, &f, &c, &rd);
        }
        if (end < best) {
            best = end;
            *d = dd;
            *t = c;
            *r = rd;
        }
    }
    if (*d < 0) {
        char why[512];
        return bs_fail("a sequence of %lld tokens fits on no ring of %d to %d ranks: on %d, %s", (long long)len, d_lo,
                       *d_hi, *d_hi, cost_offload_why(cm, len, C, *d_hi, why, sizeof why));
    }
    return 0;
}

// ---- the prepared batch ----------------------------------------------------------------------------------

// What a short sequence of s tokens adds to a micro-batch: its item time less open_cost (a pack's
// time is additive).
static double short_cost(const BalanceBatch *bb, int64_t s) {
    return cost_item_time(bb->cm, &s, 1, 1, 0.0) - bb->open_cost;
}

// The n_short short sequences longest first, ties by index, into sidx with their lengths (slen) and
// costs (scost), one cost per length. With `start` (split_batch's counts by length) a counting sort
// straight from the batch (stable, so ties stay in index order), where every length's run of slen
// and scost is known from the counts and written in order, and only sidx is scattered; without,
// split_batch listed them in sidx and a comparison sort orders them.
static void sort_shorts(BalanceBatch *bb, int32_t *start) {
    const GlobalBatch *b = bb->b;
    int64_t C = bb->cfg->capacity;
    int32_t n = bb->n_short;
    if (!start) {
        qsort_r(bb->sidx, (size_t)n, sizeof(int32_t), by_len_desc, (void *)b);
        for (int32_t i = 0; i < n; i++) {
            int64_t len = b->seqs[bb->sidx[i]].len;
            bb->slen[i] = len;
            bb->scost[i] = i > 0 && len == bb->slen[i - 1] ? bb->scost[i - 1] : short_cost(bb, len);
        }
        return;
    }
    // bucket C - len holds the sequences of length len, so the buckets in order are longest first
    for (int64_t v = 0; v <= C; v++) start[v + 1] += start[v];
    for (int64_t v = 0; v < C; v++) {
        if (start[v + 1] == start[v]) continue;
        int64_t len = C - v;
        double cost = short_cost(bb, len);
        for (int32_t i = start[v]; i < start[v + 1]; i++) bb->slen[i] = len, bb->scost[i] = cost;
    }
    for (int64_t i = 0; i < b->n; i++) {
        int64_t len = b->seqs[i].len;
        if (len <= C) bb->sidx[start[C - len]++] = (int32_t)i;
    }
}

// One pass over the batch: each long sequence with its sharding (Eq. 3), and the short ones counted
// by length into start[C - len + 1] for sort_shorts, or listed in sidx where start is NULL. 0, or
// -1 + error for a sequence that fits on no ring (policy_shard's).
static int split_batch(BalanceBatch *bb, int32_t *start) {
    const GlobalBatch *b = bb->b;
    int64_t C = bb->cfg->capacity;
    for (int64_t i = 0; i < b->n; i++) {
        int64_t len = b->seqs[i].len;
        if (len <= C) {
            if (start) start[C - len + 1]++;
            else bb->sidx[bb->n_short] = (int32_t)i;
            bb->n_short++;
            continue;
        }
        int32_t k = bb->n_long++;
        bb->long_seq[k] = (int32_t)i;
        bb->long_len[k] = len;
        if (policy_shard_one(b, i, bb->cfg, bb->cm, &bb->d_min[k], &bb->r_min[k]) != 0) return -1;
        int64_t plain = len / C + (len % C != 0);
        bb->plain[k] = plain <= bb->cfg->n_ranks ? policy_item_choice(bb->cm, &len, 1, (int)plain, 0.0)
                                                 : (ItemChoice){-1, 0, 0};
    }
    return 0;
}

int balance_prepare(BalanceBatch *bb, const GlobalBatch *b, const PlanConfig *cfg, const CostModel *cm) {
    memset(bb, 0, sizeof *bb);
    bb->b = b;
    bb->cfg = cfg;
    bb->cm = cm;
    bb->open_cost = cm->n_layers * (cm->layer_const + cm->attn_step);
    size_t nn = (size_t)(b->n > 0 ? b->n : 1);
    bb->d_min = bs_keep_alloc(nn * sizeof(int32_t));
    bb->r_min = bs_keep_alloc(nn * sizeof(double));
    bb->long_seq = bs_keep_alloc(nn * sizeof(int32_t));
    bb->long_len = bs_keep_alloc(nn * sizeof(int64_t));
    bb->sidx = bs_keep_alloc(nn * sizeof(int32_t));
    bb->slen = bs_keep_alloc(nn * sizeof(int64_t));
    bb->scost = bs_keep_alloc(nn * sizeof(double));
    bb->plain = bs_keep_alloc(nn * sizeof(ItemChoice));
    // counting by length when the capacity is small next to the batch (either sort gives this order)
    int64_t C = cfg->capacity;
    int counting = C <= (1 << 16) || C <= b->n;
    int32_t *start = counting ? bs_keep_calloc((size_t)C + 2, sizeof(int32_t)) : NULL;
    if (!bb->d_min || !bb->r_min || !bb->long_seq || !bb->long_len || !bb->sidx || !bb->slen || !bb->scost || !bb->plain ||
        (counting && !start)) {
        bs_keep_free(start);
        balance_batch_free(bb);
        return bs_fail_ctx("balance: a batch of %lld sequences", (long long)b->n);
    }
    int rc = split_batch(bb, start);
    if (rc == 0) sort_shorts(bb, start);
    bs_keep_free(start);
    if (rc != 0) {
        balance_batch_free(bb);
        return -1;
    }
    return 0;
}

int balance_keep_widths(BalanceBatch *bb) {
    bb->width_at = bs_keep_alloc(((size_t)bb->n_long + 1) * sizeof(int64_t));
    if (!bb->width_at) return bs_fail_ctx("balance: %d long sequences", bb->n_long);
    bb->width_at[0] = 0;
    for (int32_t k = 0; k < bb->n_long; k++) {
        int64_t n = width_top(bb, k) - bb->d_min[k] + 1;
        bb->width_at[k + 1] = bb->width_at[k] + (n > 0 ? n : 0);
    }
    int64_t n = bb->width_at[bb->n_long];
    bb->widths = bs_keep_calloc((size_t)(n > 0 ? n : 1), sizeof(WidthChoice));
    if (!bb->widths) return bs_fail_ctx("balance: the widths of %d long sequences", bb->n_long);
    return 0;
}

void balance_batch_free(BalanceBatch *bb) {
    bs_keep_free(bb->d_min);
    bs_keep_free(bb->r_min);
    bs_keep_free(bb->plain);
    bs_keep_free(bb->long_seq);
    bs_keep_free(bb->long_len);
    bs_keep_free(bb->sidx);
    bs_keep_free(bb->slen);
    bs_keep_free(bb->scost);
    bs_keep_free(bb->width_at);
    bs_keep_free(bb->widths);
    memset(bb, 0, sizeof *bb);
}

// ---- one run of the scheduler ------------------------------------------------------------------------------

// A ring's place in the longest-first order: its time on ceil(s / C) ranks (no offload), where
// every ring's choice starts, or on Eq. 3's fewest when there are fewer ranks than that; a ring
// that may be wider (elastic) is timed on its widest.
static Ring ring_key(const BalanceBatch *bb, const BalanceWidths *w, int32_t i, int32_t lk, int64_t s) {
    int64_t C = bb->cfg->capacity, plain = s / C + (s % C != 0);
    int32_t R = bb->cfg->n_ranks, dm = w && w->d_max ? w->d_max[i] : 0;
    int32_t d_min = lk >= 0 ? bb->d_min[lk] : 1;  // a promoted short one: a pack's 1 rank, no offload
    double r_min = lk >= 0 ? bb->r_min[lk] : 0.0;
    int64_t at = bb->widths && lk >= 0 ? bb->width_at[lk] : -1;  // its row of the widths table
    int32_t n = at >= 0 ? (int32_t)(bb->width_at[lk + 1] - at) : 0;
    ItemChoice pc = lk >= 0 ? bb->plain[lk] : (ItemChoice){0, 0, 0};  // a promoted one's is not read
    if (dm > R) dm = R;
    if (dm > plain) {
        double t = policy_item_choice(w->wide ? w->wide : bb->cm, &s, 1, dm, 0.0).t;
        return (Ring){.t = t, .work = t * dm, .len = s, .w_at = at, .w_n = n, .d_min = d_min, .seq = i, .lk = lk,
                      .d_max = dm, .plain = plain, .pc = pc};
    }
    int d = plain < R ? (int)plain : d_min;
    double r = d == d_min ? r_min : 0.0;
    double t = lk >= 0 && d == plain && r == 0.0 ? pc.t : policy_item_choice(bb->cm, &s, 1, d, r).t;
    return (Ring){.t = t, .work = t * d, .len = s, .w_at = at, .w_n = n, .d_min = d_min, .seq = i, .lk = lk,
                  .d_max = (int32_t)(plain < R ? plain : R), .plain = plain, .pc = pc};
}

// One run's ring phase: the rings longest first, and the holes they leave on members that wait.
typedef struct {
    Ring *rings;       // (n_rings,) the long sequences, then the promoted shorts; longest first once keyed
    int32_t n_rings;
    int32_t *members;  // (n_ranks,) scratch: one ring's ranks, least loaded first
    Hole *holes;       // (n_holes,) grown as rings leave members idle (pp = 1 only)
    int64_t n_holes, cap_holes;
    double total;      // the batch's estimated work (rings and short packs): what the buckets split
} RingPhase;

// The arrays sized by the batch, the ranks and C (the made_* ones wait for key_rings, which counts
// their rank references). 0, or -1 + error; schedule_free frees whatever was allocated.
static int schedule_alloc(Balance *bl, RingPhase *rp) {
    const PlanConfig *cfg = bl->cfg;
    int32_t R = cfg->n_ranks;
    size_t ns = (size_t)(bl->n_short > 0 ? bl->n_short : 1);
    rp->rings = bs_keep_alloc((size_t)(rp->n_rings > 0 ? rp->n_rings : 1) * sizeof(Ring));
    int pp_balance = cfg->pp > 1;  // PP-Balance: no micro-batch mixes two buckets
    if (pp_balance) bl->sbucket = bs_keep_alloc(ns * sizeof(int32_t));
    bl->unused = bs_keep_alloc((ns + 1) * sizeof(int32_t));
    size_t most_segs = bl->n_short < cfg->capacity ? ns : (size_t)cfg->capacity;
    bl->pack = bs_keep_alloc(most_segs * sizeof(MadeSeg));
    bl->placed = bs_keep_alloc(ns * sizeof(Placed));
    bl->pack_made = bs_keep_alloc(ns * sizeof(int32_t));
    rp->members = bs_keep_alloc((size_t)R * sizeof(int32_t));
    bl->last_free = bs_keep_calloc((size_t)R, sizeof(double));
    bl->last_t = bs_keep_calloc((size_t)R, sizeof(double));
    if (!rp->rings || (pp_balance && !bl->sbucket) || !bl->unused || !bl->pack || !bl->placed || !bl->pack_made ||
        !rp->members ||
        !bl->last_free || !bl->last_t)
        return bs_fail_ctx("balance");
    return 0;
}

// The rings with their estimated time (the long sequences, then any promoted shorts), sorted longest
// first; the made_* arrays; every short unused; rp->total, the batch's work. 0, or -1 + error.
static int key_rings(Balance *bl, RingPhase *rp, const BalanceBatch *bb, const BalanceWidths *w, int32_t n_promoted) {
    const GlobalBatch *b = bb->b;
    int32_t R = bl->cfg->n_ranks;
    double total = 0;
    int64_t refs = bl->n_short;  // at most: a rank for every short sequence, the widest allowed for every ring
                                 // (room for that up front, within reason: more grows)
    for (int32_t k = 0; k < bb->n_long; k++) {
        rp->rings[k] = ring_key(bb, w, bb->long_seq[k], k, bb->long_len[k]);
        total += rp->rings[k].work;
        refs += rp->rings[k].d_max;
    }
    for (int32_t k = 0; k < n_promoted; k++) {
        rp->rings[bb->n_long + k] = ring_key(bb, w, bb->sidx[k], -1, bb->slen[k]);
        total += rp->rings[bb->n_long + k].work;
        refs += rp->rings[bb->n_long + k].d_max;
    }
    // every sequence is one segment of one item
    size_t nn = (size_t)(b->n > 0 ? b->n : 1);
    bl->made = bs_keep_alloc(nn * sizeof(Made));
    bl->start = bs_keep_alloc(nn * sizeof(double));
    bl->made_seg = bs_keep_alloc(nn * sizeof(MadeSeg));
    if (refs > (int64_t)b->n + 4 * (int64_t)R) refs = (int64_t)b->n + 4 * (int64_t)R;
    bl->made_ranks = bs_keep_alloc((size_t)(refs > 0 ? refs : 1) * sizeof(int32_t));
    bl->cap_made_ranks = refs > 0 ? refs : 1;
    if (!bl->made || !bl->start || !bl->made_seg || !bl->made_ranks) return bs_fail_ctx("balance");
    if (sort_rings(rp->rings, rp->n_rings) != 0) return -1;
    for (int32_t i = 0; i < bl->n_short; i++) {
        total += bl->scost[i] + bl->open_cost * (double)bl->slen[i] / (double)bl->cfg->capacity;
        bl->unused[i] = i;
    }
    bl->unused[bl->n_short] = bl->n_short;
    rp->total = total;
    return 0;
}

// PP-Balance's buckets of about equal compute over the length-sorted batch (the rings first: they
// are the longest), so that no micro-batch mixes two and the stages see even work.
static void assign_buckets(Balance *bl, const RingPhase *rp, int n_buckets) {
    if (bl->cfg->pp <= 1) return;
    double acc = 0;
    for (int32_t k = 0; k < rp->n_rings; k++) acc += rp->rings[k].work;
    for (int32_t i = 0; i < bl->n_short; i++) {
        int32_t bk = rp->total > 0 ? (int32_t)(acc / rp->total * n_buckets) : 0;
        bl->sbucket[i] = bk < n_buckets ? bk : n_buckets - 1;
        acc += bl->scost[i] + bl->open_cost * (double)bl->slen[i] / (double)bl->cfg->capacity;
    }
}

// A member that waits for a ring from `from` to `to`: a hole phase 2 fills. 0, or -1 + error.
static int add_hole(RingPhase *rp, Hole h) {
    if (rp->n_holes == rp->cap_holes) {
        int64_t c = rp->cap_holes ? 2 * rp->cap_holes : 1024;
        Hole *hs = bs_keep_realloc(rp->holes, (size_t)c * sizeof(Hole));
        if (!hs) return bs_fail_ctx("balance");
        rp->holes = hs;
        rp->cap_holes = c;
    }
    rp->holes[rp->n_holes++] = h;
    return 0;
}

// Phase 1: the rings, longest first, on the most-lagging ranks, lined up at the last member's free
// time; a member that would wait longer than delta of that start leaves a hole (pp = 1).
static int place_rings(Balance *bl, RingPhase *rp, RankTree *queue, const BalanceBatch *bb, double delta) {
    const PlanConfig *cfg = bl->cfg;
    int32_t *members = rp->members;
    for (int32_t k = 0; k < rp->n_rings; k++) {
        int32_t s = rp->rings[k].seq;
        int d, d_hi;
        double rr = 0;
        ItemChoice kind = {0, 0, 0};
        if (place_ring(bl, bb, &rp->rings[k], queue, members, &d, &d_hi, &kind, &rr) != 0)
            return -1;
        double t = kind.t;
        // in step on every member: it starts when the last of their last stages is ready for it
        // (pp = 1: the last member's free time; members come out least-loaded first)
        double start = 0;
        for (int32_t j = 0; j < d; j++)
            start = cost_fmax(start, bl->last_free[members[j]] + pipeline_wait(bl, t, bl->last_t[members[j]]));
        for (int32_t j = 0; j < d; j++) {
            double f = queue->key[members[j]];
            if (cfg->pp == 1 && start - f > delta * start && add_hole(rp, (Hole){members[j], f, start}) != 0) return -1;
            bl->last_free[members[j]] = start + t;
            bl->last_t[members[j]] = t;
            ranktree_push(queue, members[j], rank_key(bl, members[j]));
        }
        for (int32_t j = d; j < d_hi; j++) ranktree_push(queue, members[j], queue->key[members[j]]);  // not taken
        policy_sort_ranks(members, d);
        if (record(bl, &(MadeSeg){s, 0}, 1, rp->rings[k].len, members, d, rr, start) != 0) return -1;
        bl->made[bl->n_made - 1].a2a = kind.a2a;
        bl->made[bl->n_made - 1].ulysses = kind.ulysses;
    }
    return 0;
}

// Phase 2, DP-Balance: the lagging members of rings get short work before the ring starts, the
// longest holes first.
static int fill_holes(Balance *bl, RingPhase *rp) {
    if (rp->n_holes > 0) qsort(rp->holes, (size_t)rp->n_holes, sizeof(Hole), by_hole_len_desc);
    for (int64_t h = 0; h < rp->n_holes; h++)
        if (fill_hole(bl, &rp->holes[h]) != 0) return -1;
    return 0;
}

// The plan, in the global order: by planned start, so every rank meets its items in time order and
// the members of a ring all reach it at its start. Each item is laid out in that order, then every
// segment written once into its place: the recorded ones item by item, phase 3's shorts from the
// placed list (the items come out at random in start order, and so each one's segments are written
// together instead of each short's read back at random). 0, or -1 + error (out may be half made).
static int emit_plan(Plan *out, Balance *bl, const char *name) {
    const GlobalBatch *b = bl->b;
    const PlanConfig *cfg = bl->cfg;
    int32_t m = bl->n_made;
    size_t mm = (size_t)(m > 0 ? m : 1);
    int32_t *sorted = bs_keep_alloc(mm * sizeof(int32_t)), *seg_at = bs_keep_alloc(mm * sizeof(int32_t));
    int rc = -1;
    if (!sorted || !seg_at) {
        bs_fail_ctx("balance");
        goto out;
    }
    if (policy_order_by_time(bl->start, m, sorted) != 0) goto out;
    if (plan_init(out, b, cfg->n_ranks, cfg->capacity, cfg->pp, name) != 0 ||
        policy_plan_reserve(out, m, bl->n_segs, bl->n_made_ranks) != 0)
        goto out;
    int32_t n_segs = 0, n_refs = 0;
    for (int32_t k = 0; k < m; k++) {  // the items, each with its ranks (what plan_add_item makes)
        const Made *it = &bl->made[sorted[k]];
        out->items[k] = (Item){.seg_begin = n_segs, .n_segs = it->n_segs, .rank_begin = n_refs, .n_ranks = it->n_ranks,
                    .offload = it->offload, .a2a = it->a2a, .ulysses = it->ulysses, .tokens = it->tokens};
        memcpy(out->ranks + n_refs, bl->made_ranks + it->rank_begin, (size_t)it->n_ranks * sizeof(int32_t));
        seg_at[sorted[k]] = n_segs;
        n_segs += it->n_segs;
        n_refs += it->n_ranks;
    }
    for (int32_t i = 0; i < m; i++) {  // the recorded segments
        const Made *it = &bl->made[i];
        for (int32_t j = 0; it->seg_begin >= 0 && j < it->n_segs; j++) {
            MadeSeg q = bl->made_seg[it->seg_begin + j];
            out->segs[seg_at[i] + j] = (Segment){q.seq, 0, q.len > 0 ? q.len : it->tokens};  // len 0: a ring, all of it
        }
    }
    // phase 3's shorts, each micro-batch's in order: where each micro-batch's segments go first (one
    // random read per short less in the loop that follows)
    for (int32_t j = 0; j < bl->n_packs; j++) bl->pack_made[j] = seg_at[bl->pack_made[j]];
    for (int32_t k = 0; k < bl->n_placed; k++) {
        Placed q = bl->placed[k];
        out->segs[bl->pack_made[q.pack]++] = (Segment){bl->sidx[q.short_i], 0, bl->slen[q.short_i]};
    }
    out->n_items = m;
    out->n_segs = n_segs;
    out->n_refs = n_refs;
    rc = 0;
out:
    bs_keep_free(sorted);
    bs_keep_free(seg_at);
    return rc;
}

static void schedule_free(Balance *bl, RingPhase *rp, RankTree *queue) {
    bs_keep_free(rp->rings);
    bs_keep_free(rp->holes);
    bs_keep_free(rp->members);
    bs_keep_free(bl->start);
    bs_keep_free(bl->sbucket);
    bs_keep_free(bl->unused);
    bs_keep_free(bl->pack);
    bs_keep_free(bl->placed);
    bs_keep_free(bl->pack_made);
    bs_keep_free(bl->last_free);
    bs_keep_free(bl->last_t);
    bs_keep_free(bl->made);
    bs_keep_free(bl->made_seg);
    bs_keep_free(bl->made_ranks);
    ranktree_free(queue);
}

int balance_schedule(Plan *out, const BalanceBatch *bb, const BalanceWidths *w, int pipeline, const char *name) {
    const PlanConfig *cfg = bb->cfg;
    const CostModel *cm = bb->cm;
    double delta = cfg->delta > 0 ? cfg->delta : BALANCE_DEFAULT_DELTA;
    int n_buckets = cfg->n_buckets > 0 ? cfg->n_buckets : BALANCE_DEFAULT_BUCKETS;
    int32_t n_promoted = w ? w->n_promoted : 0;
    memset(out, 0, sizeof *out);
    if (n_promoted < 0 || n_promoted > bb->n_short || (n_promoted > 0 && !w->d_max))
        return bs_fail("balance: %d promoted short sequences (of %d, d_max %s)", n_promoted, bb->n_short,
                       w && w->d_max ? "given" : "missing");
    // the shorts that are packed: the batch's, less the promoted ones (the longest), which ring
    Balance bl = {.b = bb->b, .cfg = cfg, .cm = cm, .wide = w && w->wide ? w->wide : cm, .open_cost = bb->open_cost,
                  .lift = pipeline ? cfg->pp - 1 : 0, .floors = cost_fields_nonneg(cm)};
    bl.n_short = bb->n_short - n_promoted;
    bl.sidx = bb->sidx + n_promoted;
    bl.slen = bb->slen + n_promoted;
    bl.scost = bb->scost + n_promoted;
    RingPhase rp = {.n_rings = bb->n_long + n_promoted};
    RankTree queue = {0};
    int rc = schedule_alloc(&bl, &rp);
    if (rc == 0) rc = key_rings(&bl, &rp, bb, w, n_promoted);
    if (rc == 0) assign_buckets(&bl, &rp, n_buckets);
    if (rc == 0) rc = ranktree_init(&queue, cfg->n_ranks);
    if (rc == 0) rc = place_rings(&bl, &rp, &queue, bb, delta);  // 1. the rings
    if (rc == 0) rc = fill_holes(&bl, &rp);                      // 2. short work before them
    if (rc == 0) rc = assign_rest(&bl, &queue);                  // 3. the rest, longest first, to the most-lagging rank
    if (rc == 0) rc = emit_plan(out, &bl, name);
    if (rc != 0) plan_free(out);
    schedule_free(&bl, &rp, &queue);
    return rc != 0 ? -1 : 0;
}

// ---- balance's rings without the scheduler -------------------------------------------------------------
//
// With pp = 1 a ring starts when its last member is free and phases 2 and 3 only fill time before a
// ring starts or after a rank is free, so the ring phase alone fixes when every ring of balance's
// plan starts and ends; plan_finalize's schedule of a pp = 1 plan is the planned one. The ring phase
// needs only the ranks' free times, not which rank is which: a multiset of (time, count) groups in a
// min-heap, from which a ring takes the ranks free earliest. This replays phase 1 with the very
// arithmetic of place_ring, in O(rings log rings + the widths costed), without the rank queue.

void rank_groups_push(RankGroup *h, int32_t *n, RankGroup g) {
    int32_t i = (*n)++;
    while (i > 0 && h[(i - 1) / 2].t > g.t) {
        h[i] = h[(i - 1) / 2];
        i = (i - 1) / 2;
    }
    h[i] = g;
}

RankGroup rank_groups_pop(RankGroup *h, int32_t *n) {
    RankGroup top = h[0], last = h[--*n];
    int32_t i = 0;
    for (;;) {
        int32_t c = 2 * i + 1;
        if (c >= *n) break;
        if (c + 1 < *n && h[c + 1].t < h[c].t) c++;
        if (!(h[c].t < last.t)) break;
        h[i] = h[c];
        i = c;
    }
    if (*n > 0) h[i] = last;
    return top;
}

int balance_rings_end(const BalanceBatch *bb, double *end) {
    const CostModel *cm = bb->cm;
    int64_t C = bb->cfg->capacity;
    int32_t R = bb->cfg->n_ranks, n = bb->n_long, n_heap = 0, n_took;
    int floors = cost_fields_nonneg(cm);
    size_t nn = (size_t)(n > 0 ? n : 1);
    Ring *rings = bs_keep_alloc(nn * sizeof(Ring));
    RankGroup *heap = bs_keep_alloc((nn + 2) * sizeof(RankGroup)), *took = bs_keep_alloc((nn + 2) * sizeof(RankGroup));
    int rc = -1;
    *end = 0;
    if (!rings || !heap || !took) {
        bs_fail_ctx("balance: replaying the rings");
        goto out;
    }
    for (int32_t k = 0; k < n; k++) rings[k] = ring_key(bb, NULL, bb->long_seq[k], k, bb->long_len[k]);
    if (sort_rings(rings, n) != 0) goto out;
    rank_groups_push(heap, &n_heap, (RankGroup){0, R});
    for (int32_t k = 0; k < n; k++) {
        int64_t len = rings[k].len;
        int d_hi = rings[k].d_max, d_lo = rings[k].d_min;
        if (d_lo > d_hi) d_lo = d_hi;
        // the d_hi ranks free earliest, as groups in time order
        n_took = 0;
        for (int64_t have = 0; have < d_hi;) {
            took[n_took] = rank_groups_pop(heap, &n_heap);
            have += took[n_took++].n;
        }
        // place_ring's choice: the widest costed first, and a width whose floor cannot beat it not costed
        double best = INFINITY, t = 0, known = INFINITY, rd;
        ItemChoice c, widest = {INFINITY, 0, 0};
        int d = -1;
        if (floors && width_choice(bb, &rings[k], 1, d_hi, &widest, &rd)) known = took[n_took - 1].t + widest.t;
        int32_t g = 0;
        int64_t upto = took[0].n;  // ranks in groups 0 .. g
        for (int dd = d_lo; dd <= d_hi; dd++) {
            while (upto < dd) upto += took[++g].n;
            if (dd == d_hi && known < INFINITY) c = widest;
            else if (dd < d_hi && took[g].t + cost_item_floor(cm, len, dd) * (1 - 1e-9) > known) continue;
            else if (!width_choice(bb, &rings[k], 1, dd, &c, &rd)) continue;
            double td = c.t;
            if (took[g].t + td < best) {
                best = took[g].t + td;
                d = dd;
                t = td;
            }
        }
        if (d < 0) {
            char why[512];
            bs_fail("a sequence of %lld tokens fits on no ring of %d to %d ranks: on %d, %s", (long long)len, d_lo, d_hi,
                    d_hi, cost_offload_why(cm, len, C, d_hi, why, sizeof why));
            goto out;
        }
        // the ring takes the first d of them and starts when the last of those is free
        int64_t left = d;
        double start = 0;
        for (int32_t j = 0; j < n_took; j++) {
            int64_t take = took[j].n < left ? took[j].n : left;
            if (take > 0) start = took[j].t;
            left -= take;
            if (took[j].n > take) rank_groups_push(heap, &n_heap, (RankGroup){took[j].t, took[j].n - take});
        }
        rank_groups_push(heap, &n_heap, (RankGroup){start + t, d});
        *end = cost_fmax(*end, start + t);
    }
    rc = 0;
out:
    bs_keep_free(rings);
    bs_keep_free(heap);
    bs_keep_free(took);
    return rc;
}

// PP-Balance's pipeline model (pipeline_wait) is exact for one pipeline of equal micro-batches but
// not for rings that couple pipelines at different points of their 1F1B schedules, where it can
// mislead the list scheduler. The replay in plan_finalize is the simulator's schedule and costs
// milliseconds, so with pp > 1 the scheduler runs twice, with the pipeline model and with plain
// per-stage busy times (what pp = 1 uses), and the plan whose replayed makespan is shorter is kept.
int balance_best(Plan *out, const BalanceBatch *bb, const BalanceWidths *w, const char *name) {
    if (bb->cfg->pp == 1) {
        if (balance_schedule(out, bb, w, 0, name) != 0) return -1;
        if (plan_finalize_bounds(out, bb->cm, bb->bounds) == 0) return 0;
        plan_free(out);
        return -1;
    }
    Plan plain;
    memset(&plain, 0, sizeof plain);
    if (balance_schedule(out, bb, w, 1, name) != 0) return -1;
    if (balance_schedule(&plain, bb, w, 0, name) != 0 || plan_finalize_bounds(out, bb->cm, bb->bounds) != 0 ||
        plan_finalize_bounds(&plain, bb->cm, bb->bounds) != 0) {
        plan_free(out);
        plan_free(&plain);
        return -1;
    }
    if (plain.makespan < out->makespan) {
        Plan t = *out;
        *out = plain;
        plain = t;
    }
    plan_free(&plain);
    return 0;
}

int policy_balance(Plan *out, const GlobalBatch *b, const PlanConfig *cfg, const CostModel *cm) {
    BalanceBatch bb;
    if (balance_prepare(&bb, b, cfg, cm) != 0) return -1;
    double bounds[2];  // pp > 1: two plans finalized here, the batch's bounds computed once for both
    if (cfg->pp > 1) {
        policy_bounds(b, cfg, cm, bounds);
        bb.bounds = bounds;
    }
    // pp = 1: one run, finalized by the caller (policy_plan)
    int rc = cfg->pp == 1 ? balance_schedule(out, &bb, NULL, 0, "balance") : balance_best(out, &bb, NULL, "balance");
    balance_batch_free(&bb);
    return rc;
}
