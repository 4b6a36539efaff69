// policy_elastic.c: elastic, bytescale's own policy: balance, with rings widened where ranks would
// idle (docs/planner.md, "elastic").
//
// balance caps a ring at ceil(s/C) ranks, HDP's rule and the paper's. When the cluster has more ranks
// than the batch has work, that cap sets the step: the longest sequences run on ceil(s/C) ranks while
// the others wait. And when each of a few rings is a large part of the step, a last wave of them can
// be left over at the end. Nothing forces the cap: on more ranks every member holds fewer than C
// tokens (no offloading needed), and the cost model says what a wider ring costs. Each member's share
// of the quadratic attention falls as 1/D, the K/V traffic per member stays about the same (a block
// of s/D tokens, D - 1 times) and the per-step latency grows with D: a ring's time falls with D down
// to a fastest width and rises after it, and its work, D x its time, grows with D.
//
// elastic:
//   1. a target step T. For each T a sequence slower than T gets the fewest ranks that bring it to T
//      (any count from ceil(s/C) up to all ranks, or s/2 so that every chunk of the 2D-chunk layout
//      keeps a token; rounded up to whole nodes where that still meets T; a short sequence, s <= C,
//      slower than T alone becomes a ring too), and the step is predicted (predict, below) from the
//      rings, the batch's work with the wider rings' traffic and per-step costs, and the longest
//      piece left to fill gaps. T is the target with the least predicted step over a geometric grid
//      from the slowest sequence's time (nothing widened: balance) down to the least T every
//      sequence can reach; of the targets within a hair of the least, the largest (the fewest ranks
//      added). None better than balance's prediction: the step is the batch's work, and the plan is
//      balance's. Where a bound on the work of any widening already says so (work_sets_step), the
//      grid is not searched at all.
//   2. the batch scheduled by balance's list scheduler with those widths (it may still take any width
//      from Eq. 3's fewest up to the one allowed, whichever finishes first on the ranks as they are).
//      A widened ring is timed as crossing nodes, here and in the scheduler: members are picked by
//      load, not by node. Rebalancing: where the schedule misses the prediction by more than
//      ELASTIC_MISS, the targets one grid step either side are scheduled too, and the search goes on
//      in the direction that won while the step shortens.
//   3. never longer than balance, even with the odds against it: elastic's plan timed as if every
//      ring crossed nodes must not be longer than balance's plan as the planner times it (which
//      makes the simulated step no longer either, see "never longer than balance" below). balance
//      follows HDP's rule, so its makespan is at least the HDP-aware bound, and with pp = 1 at least
//      the end of its latest ring (balance_rings_end: its ring phase replayed without the scheduler);
//      below both, balance's plan need not be made. Otherwise it is made, and the better kept (ties:
//      balance's).
//
// Cost: one scheduling run (two when the comparison is needed), O(n) to set up the model; where the
// batch's work sets balance's step (work_sets_step: many short sequences a rank) nothing more. Else
// a width search for every long sequence and every length of the short ones that a target can touch,
// and per target tried O(k log k) for the k long rings longer than an eighth of the step and the
// lengths of short sequences made rings (a run of one length is placed as a whole: rings_end), a
// width search for each of those, and O(1) per short sequence made a ring (the work's sum).
#include <math.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include "bytescale/error.h"
#include "core/fminmax.h"
#include "bytescale/keep.h"
#include "plan/policy_balance.h"
#include "plan/policy_elastic.h"
#include "plan/policy_util.h"

#define ELASTIC_GRID_STEP 0.9  // targets tried: the slowest sequence's time x 0.9^k, down to the least reachable
#define ELASTIC_GAIN 1e-3      // a predicted step this much shorter counts; within it the fewer ranks win
#define ELASTIC_FILL 8         // rings shorter than step / 8 are left to fill gaps, like short sequences
#define ELASTIC_MISS 0.02      // a schedule this much longer than predicted missed it: try the targets next to it
#define ELASTIC_ROUNDS 4       // at most this many rounds of that
#define ELASTIC_FAMILIES 16    // rings, all-to-all groups, and hybrids of each group size dividing the heads
#define ELASTIC_PP_TARGETS 16  // pp > 1: at most this many targets scheduled and replayed (search_replayed)

// A family of items whose time falls and then rises in k (one link level): rings of k ranks (u = 0),
// all-to-all groups of k ranks (a2a, k <= the heads), hybrids of k groups of u (u divides the heads).
typedef struct {
    int u;
    int a2a;
} Family;

// A sequence as the width model sees it; a short one stands for its whole run of one length.
typedef struct {
    int32_t seq;     // its index in the batch (a short one: that of its run's first)
    int32_t first;   // a short one: its run, BalanceBatch's short sequences first .. first + count - 1,
    int32_t count;   // all alike to the model (length, time, widths); a long one: 0 and 1
    int64_t len;
    int32_t d0;      // its width under HDP's rule: ceil(s/C) ranks (all ranks when fewer; 1: a short sequence)
    int32_t d_top;   // the widest ring it may be: min(R, s/2), at least d0
    double t0;       // its time on d0 ranks (alone in a pack, for a short one)
    double w0;       // the work it adds there: d0 x t0 (a short one: its time in a pack + its share of the pack's constant)
    int32_t d_fast;  // the fastest width in [d0, d_top] (0: not yet known)
    double t_fast;   // the time there
    int32_t fk[ELASTIC_FAMILIES];  // each family's fastest k past d0 (0: none in range), Model.fam
    double ft[ELASTIC_FAMILIES];   // its time there
} Seq;

// n alike rings as predict places them; at: their place before sorting (ties keep it, as a stable
// sort would).
typedef struct {
    double t;
    int32_t d;
    int32_t n;
    int32_t at;
} Rigid;

typedef struct {
    const BalanceBatch *bb;
    const CostModel *cm;
    CostModel wide;   // cm costing every ring on the link between nodes: the scheduler picks a ring's
                      // members by load, not by node, so a widened ring is timed as crossing nodes
    int32_t R;
    Seq *lng;         // (n_lng,) the long sequences, t0 non-increasing
    int32_t n_lng;
    Seq *sht;         // (n_sht,) the short sequences that might become rings (those slower than floor_t) as
    int32_t n_sht;    //   runs of one length, t0 non-increasing: a batch of many short sequences has few
    int32_t n_sht_seqs;  // the sequences in those runs, BalanceBatch's first n_sht_seqs short ones
    double work;      // the batch's work with no ring widened
    double floor_t;   // no target below this: the slowest sequence at its fastest width
    double hi;        // the slowest sequence's time under HDP's rule: no target above this
    double lift;      // pp - 1: the stages an item's forward fills and its backward drains
    int floored;      // model_floor has run: floor_t, sht and the fastest widths are known
    int flags;        // ELASTIC_FULL_SEARCH, ELASTIC_RING_AT_A_TIME (policy_elastic.h): 0 but in tests
    Family fam[ELASTIC_FAMILIES];  // the kinds policy_item_choice chooses from, as families
    int n_fam;
    Rigid *rigid;     // (n_lng + n_sht + 1,) predict's rings
    RankGroup *groups;    // (min(R, n_lng + n_sht_seqs + 1) + 1,) predict's heap of rank groups: no more
                          // groups than ranks, nor than rings placed + 1
    int32_t *at_d;    // (n_lng + n_sht + 1,) work_at's width of each sequence slower than its target (the
    double *at_t;     //   long ones, then the short runs) and its time there: predict places those rings
} Model;

// A sequence alone on D ranks, no offloading: a ring or, where faster and the heads allow, an
// all-to-all group or a hybrid (policy_item_choice; the scheduler makes the same choice).
static double ring_time(const CostModel *cm, int64_t s, int D) { return policy_item_choice(cm, &s, 1, D, 0.0).t; }
static double plain_ring_time(const CostModel *cm, int64_t s, int D) { return cost_item_time(cm, &s, 1, D, 0.0); }

// ---- widths ----------------------------------------------------------------------------------------------

static int family_width(const Family *f, int k) { return f->u ? f->u * k : k; }

static double family_time(const CostModel *cm, const Family *f, int64_t s, int k) {
    if (f->a2a) return cost_a2a_item_time(cm, &s, 1, k, 0.0);
    return f->u ? cost_hybrid_item_time(cm, &s, 1, f->u, k, 0.0) : plain_ring_time(cm, s, k);
}

// The range of k whose widths lie in [lo, hi] (empty: *k_lo > *k_hi).
static void family_range(const Model *m, const Family *f, int lo, int hi, int *k_lo, int *k_hi) {
    if (f->a2a) {
        *k_lo = lo > 2 ? lo : 2;
        *k_hi = hi < m->cm->a2a_heads ? hi : m->cm->a2a_heads;
    } else if (f->u) {
        *k_lo = (lo + f->u - 1) / f->u > 2 ? (lo + f->u - 1) / f->u : 2;
        *k_hi = hi / f->u;
    } else {
        *k_lo = lo, *k_hi = hi;
    }
}

// The k in [lo, hi] with the least time (ternary search on the integers, then the last few by hand;
// ties: the fewer).
static int family_fastest(const CostModel *cm, const Family *f, int64_t s, int lo, int hi, double *t_out) {
    while (hi - lo > 2) {
        int m1 = lo + (hi - lo) / 3, m2 = hi - (hi - lo) / 3;
        if (family_time(cm, f, s, m1) <= family_time(cm, f, s, m2)) hi = m2;
        else lo = m1;
    }
    int best = lo;
    double tb = family_time(cm, f, s, lo);
    for (int k = lo + 1; k <= hi; k++) {
        double t = family_time(cm, f, s, k);
        if (t < tb) tb = t, best = k;
    }
    *t_out = tb;
    return best;
}

// The fastest width of a sequence past its own, found once (crossing nodes: one link level), in every
// family: rings, then where the heads are known all-to-all groups and hybrids (policy_item_choice's
// kinds; the scheduler chooses among them at the width it gets).
static void find_fastest(const Model *m, Seq *q) {
    if (q->d_fast > 0) return;
    q->d_fast = q->d0;
    q->t_fast = q->t0;
    for (int f = 0; f < m->n_fam; f++) {
        int k_lo, k_hi;
        q->fk[f] = 0;
        family_range(m, &m->fam[f], q->d0 + 1, q->d_top, &k_lo, &k_hi);
        if (k_lo > k_hi) continue;
        q->fk[f] = family_fastest(&m->wide, &m->fam[f], q->len, k_lo, k_hi, &q->ft[f]);
        if (q->ft[f] < q->t_fast) q->d_fast = family_width(&m->fam[f], q->fk[f]), q->t_fast = q->ft[f];
    }
}

// A width that keeps node boundaries: a divisor of ranks_per_node below it, a multiple above. The
// scheduler gives rings that start together consecutive ranks (ties go to the lower rank), so rings
// of such widths stay inside nodes where they fit, and do not push the rings after them across
// node boundaries.
static int node_width(const CostModel *cm, int d) {
    int64_t rpn = cm->ranks_per_node;
    if (rpn <= 1 || d <= 1) return d;
    if (d < rpn) {
        while (rpn % d != 0) d++;
        return d;
    }
    int64_t up = (d + rpn - 1) / rpn * rpn;
    return up <= INT32_MAX ? (int)up : d;
}

// The fewest ranks in [d0, d_fast] on which the sequence takes at most T (t_fast <= T): bisection,
// the time falling over that range; then rounded up to keep node boundaries (node_width) where that
// is still within reach and within T.
static int width_for(const Model *m, const Seq *q, double T) {
    if (q->t0 <= T) return q->d0;
    int best = q->d_fast;  // t_fast <= T
    for (int f = 0; f < m->n_fam; f++) {  // each family's fewest k within T: its time falls up to fk
        const Family *fa = &m->fam[f];
        if (q->fk[f] == 0 || q->ft[f] > T) continue;
        int k_lo, k_hi;
        family_range(m, fa, q->d0 + 1, q->d_top, &k_lo, &k_hi);
        int lo = k_lo - 1, hi = q->fk[f];  // t(lo) > T (or out of range) >= t(hi)
        while (hi - lo > 1) {
            int mid = lo + (hi - lo) / 2;
            if (family_time(&m->wide, fa, q->len, mid) <= T) hi = mid;
            else lo = mid;
        }
        if (family_width(fa, hi) < best) best = family_width(fa, hi);
    }
    int hi = best;
    int d = node_width(m->cm, hi);
    return d <= q->d_top && ring_time(&m->wide, q->len, d) <= T ? d : hi;
}

// How many of q[0 .. n) (t0 non-increasing) take longer than T.
static int32_t slower_than(const Seq *q, int32_t n, double T) {
    int32_t lo = 0, hi = n;
    while (lo < hi) {
        int32_t mid = lo + (hi - lo) / 2;
        if (q[mid].t0 > T) lo = mid + 1;
        else hi = mid;
    }
    return lo;
}

// The short sequences in the first nr runs of m->sht.
static int32_t run_seqs(const Model *m, int32_t nr) { return nr < m->n_sht ? m->sht[nr].first : m->n_sht_seqs; }

// The batch's work when every sequence slower than T is brought to T (T >= floor_t). Short sequences
// of one length share one answer, added once for each of them (the sum as it was per sequence).
// Each one's width and time there are kept in at_d and at_t (long i at i, short run r at n_lng + r).
static double work_at(const Model *m, double T) {
    int32_t nl = slower_than(m->lng, m->n_lng, T), nr = slower_than(m->sht, m->n_sht, T);
    double w = m->work;
    for (int32_t i = 0; i < nl; i++) {
        int d = m->at_d[i] = width_for(m, &m->lng[i], T);
        m->at_t[i] = ring_time(&m->wide, m->lng[i].len, d);
        w += d * m->at_t[i] - m->lng[i].w0;
    }
    for (int32_t r = 0; r < nr; r++) {
        const Seq *q = &m->sht[r];
        int d = m->at_d[m->n_lng + r] = width_for(m, q, T);
        m->at_t[m->n_lng + r] = ring_time(&m->wide, q->len, d);
        double extra = d * m->at_t[m->n_lng + r] - q->w0;
        for (int32_t j = 0; j < q->count; j++) w += extra;
    }
    return w;
}

// ---- the model -------------------------------------------------------------------------------------------

static void model_free(Model *m) {
    bs_keep_free(m->lng);
    bs_keep_free(m->sht);
    bs_keep_free(m->rigid);
    bs_keep_free(m->groups);
    bs_keep_free(m->at_d);
    bs_keep_free(m->at_t);
    memset(m, 0, sizeof *m);
}

// predict's scratch for the long sequences and the first n short ones (in runs): rings, and the
// heap of rank groups, never more groups than ranks nor than rings placed + 1.
static int model_scratch(Model *m, int32_t n_short, int32_t runs) {
    int64_t rings = (int64_t)m->n_lng + n_short, n_groups = rings + 1 < m->R ? rings + 1 : m->R;
    bs_keep_free(m->rigid);
    bs_keep_free(m->groups);
    bs_keep_free(m->at_d);
    bs_keep_free(m->at_t);
    m->rigid = bs_keep_alloc(((size_t)m->n_lng + (m->flags & ELASTIC_RING_AT_A_TIME ? n_short : runs) + 1) * sizeof(Rigid));
    m->groups = bs_keep_alloc(((size_t)n_groups + 1) * sizeof(RankGroup));
    m->at_d = bs_keep_alloc(((size_t)m->n_lng + runs + 1) * sizeof(int32_t));
    m->at_t = bs_keep_alloc(((size_t)m->n_lng + runs + 1) * sizeof(double));
    return m->rigid && m->groups && m->at_d && m->at_t ? 0 : bs_fail_ctx("elastic: the width model");
}

// Every long sequence, in t0 order, and the batch's work; no width searched yet (model_floor), so
// that predict(hi), which widens nothing, can say first whether any target could pay (work_sets_step).
static int model_init(Model *m, const BalanceBatch *bb, int flags) {
    memset(m, 0, sizeof *m);
    m->flags = flags;
    const CostModel *cm = bb->cm;
    int64_t C = bb->cfg->capacity;
    m->bb = bb;
    m->cm = cm;
    m->wide = *cm;
    m->wide.ranks_per_node = 0;
    m->R = bb->cfg->n_ranks;
    m->lift = bb->cfg->pp - 1;
    m->fam[m->n_fam++] = (Family){0, 0};
    if (cm->a2a_heads > 0) {
        m->fam[m->n_fam++] = (Family){0, 1};
        for (int u = 2; u <= cm->a2a_heads && m->n_fam < ELASTIC_FAMILIES; u++)
            if (cm->a2a_heads % u == 0) m->fam[m->n_fam++] = (Family){u, 0};
    }
    // each long sequence's width and time first, then the Seqs written once, slowest first (ties by
    // index: a radix order of the times), not made in batch order and then permuted (200 bytes each)
    size_t nl = (size_t)(bb->n_long > 0 ? bb->n_long : 1);
    m->lng = bs_keep_alloc(nl * sizeof(Seq));
    double *t0 = bs_keep_alloc(nl * sizeof(double));
    int32_t *d0 = bs_keep_alloc(nl * sizeof(int32_t)), *order = bs_keep_alloc(nl * sizeof(int32_t));
    int rc = m->lng && t0 && d0 && order ? 0 : bs_fail_ctx("elastic: %d long sequences", bb->n_long);
    for (int32_t k = 0; rc == 0 && k < bb->n_long; k++) {
        int64_t s = bb->long_len[k], plain = s / C + (s % C != 0);
        // with fewer ranks than ceil(s/C) it runs on all of them, offloading (or else on Eq. 3's fewest)
        int d = plain < m->R ? (int)plain : m->R;
        double r = 0;
        if (d < plain && !policy_offload_for(cm, s, C, d, &r)) d = bb->d_min[k], r = bb->r_min[k];
        t0[k] = d == plain ? bb->plain[k].t : policy_item_choice(cm, &s, 1, d, r).t;
        d0[k] = d;
        m->work += t0[k] * d;
    }
    if (rc == 0) rc = policy_order_by_time_desc(t0, bb->long_seq, bb->n_long, order);
    for (int32_t j = 0; rc == 0 && j < bb->n_long; j++) {
        int32_t k = order[j], i = bb->long_seq[k], d = d0[k];
        int64_t s = bb->long_len[k], top = s / 2 < m->R ? s / 2 : m->R;
        m->lng[j] = (Seq){i, 0, 1, s, d, (int32_t)(top > d ? top : d), t0[k], t0[k] * d, 0, 0, {0}, {0}};
    }
    m->n_lng = rc == 0 ? bb->n_long : 0;
    bs_keep_free(t0);
    bs_keep_free(d0);
    bs_keep_free(order);
    if (rc != 0) {
        model_free(m);
        return -1;
    }
    for (int32_t k = 0; k < bb->n_short; k++) m->work += bb->scost[k] + bb->open_cost * (double)bb->slen[k] / (double)C;
    m->hi = m->n_lng > 0 ? m->lng[0].t0 : 0;
    if (bb->n_short > 0) m->hi = cost_fmax(m->hi, bb->scost[0] + bb->open_cost);
    if (model_scratch(m, 0, 0) != 0) {
        model_free(m);
        return -1;
    }
    return 0;
}

// The floor and the fastest widths: the long sequences, then the short ones only as far as one of
// them could be slower than floor_t. Once (m->floored).
static int model_floor(Model *m) {
    if (m->floored) return 0;
    m->floored = 1;
    const BalanceBatch *bb = m->bb;
    int64_t C = bb->cfg->capacity;
    // the floor: sequences in t0 order, stopping where t0 falls below what is already known (t_fast <= t0)
    for (int32_t i = 0; i < m->n_lng && m->lng[i].t0 > m->floor_t; i++) {
        find_fastest(m, &m->lng[i]);
        m->floor_t = cost_fmax(m->floor_t, m->lng[i].t_fast);
    }
    // the short sequences slower alone than that floor: a prefix of the length order, in runs of one
    // length (scost is the length's: a run is alike to the model)
    int32_t n = 0, runs = 0;
    for (; n < bb->n_short && bb->scost[n] + bb->open_cost > m->floor_t; n++) runs += n == 0 || bb->slen[n] != bb->slen[n - 1];
    m->sht = bs_keep_alloc((size_t)(runs > 0 ? runs : 1) * sizeof(Seq));
    if (!m->sht) return bs_fail_ctx("elastic: the width model");
    if (model_scratch(m, n, runs) != 0) return -1;
    for (int32_t k = 0; k < n; k++) {
        if (k > 0 && bb->slen[k] == bb->slen[k - 1]) {
            m->sht[m->n_sht - 1].count++;
            continue;
        }
        int64_t s = bb->slen[k], top = s / 2 < m->R ? s / 2 : m->R;
        double t = bb->scost[k] + bb->open_cost;
        double w = bb->scost[k] + bb->open_cost * (double)s / (double)C;
        m->sht[m->n_sht++] = (Seq){bb->sidx[k], k, 1, s, 1, (int32_t)(top > 1 ? top : 1), t, w, 0, 0, {0}, {0}};
    }
    m->n_sht_seqs = n;
    for (int32_t i = 0; i < m->n_sht && m->sht[i].t0 > m->floor_t; i++) {
        find_fastest(m, &m->sht[i]);
        m->floor_t = cost_fmax(m->floor_t, m->sht[i].t_fast);
    }
    // every sequence a target can touch (t0 > floor_t) knows its fastest width from here on
    for (int32_t i = 0; i < m->n_lng && m->lng[i].t0 > m->floor_t; i++) find_fastest(m, &m->lng[i]);
    for (int32_t i = 0; i < m->n_sht && m->sht[i].t0 > m->floor_t; i++)
        if (m->sht[i].d_fast == 0) find_fastest(m, &m->sht[i]);
    return 0;
}

// ---- the predicted step for a target -------------------------------------------------------------------
//
// The scheduler puts the rings first, longest first, each on the ranks free earliest, and then fills
// every gap with short work. Ranks are alike, so for the rings only their free times matter: a
// multiset of (time, count) groups in a min-heap. A ring of D ranks pops groups until it has D ranks,
// starts at the last one's time and pushes (start + t, D) back, with what it did not need of the
// last group: the ring phase without naming ranks. Rings shorter than step / ELASTIC_FILL are left to
// the fill, as the short sequences are. The predicted step: the latest of the last ring's end, the
// batch's work spread evenly over the ranks, and the longest piece of the fill (it runs whole).


static int by_rigid_desc(const void *a, const void *b) {
    const Rigid *x = a, *y = b;
    if (x->t != y->t) return (x->t < y->t) - (x->t > y->t);
    return (x->at > y->at) - (x->at < y->at);
}

// The latest end of the k rings of m->rigid (sorted) placed on the ranks free earliest. n alike rings
// are placed together: as many as the earliest group has room for side by side start at its time,
// which is where one after the other they would start (each takes ranks of that group, the ranks
// it leaves are free later); the rest one at a time. So a run of short rings costs its groups, not
// its sequences.
static double rings_end(Model *m, int32_t k) {
    int32_t n = 0;
    double last_end = 0;
    rank_groups_push(m->groups, &n, (RankGroup){0, m->R});
    for (int32_t j = 0; j < k; j++) {
        const Rigid *g = &m->rigid[j];
        for (int64_t left = g->n; left > 0;) {
            RankGroup top = rank_groups_pop(m->groups, &n);
            int64_t q = top.n / g->d < left ? top.n / g->d : left;  // rings that fit in it side by side
            if (q > 1 && (m->flags & ELASTIC_RING_AT_A_TIME)) q = 1;
            double start = top.t;
            if (q > 0) {
                if (top.n > q * g->d) rank_groups_push(m->groups, &n, (RankGroup){top.t, top.n - q * g->d});
            } else {  // one ring over this group and the next ones: it starts when the last is free
                q = 1;
                for (int64_t need = g->d - top.n; need > 0;) {
                    RankGroup h = rank_groups_pop(m->groups, &n);
                    int64_t take = h.n < need ? h.n : need;
                    need -= take;
                    start = h.t;
                    if (h.n > take) rank_groups_push(m->groups, &n, (RankGroup){h.t, h.n - take});
                }
            }
            rank_groups_push(m->groups, &n, (RankGroup){start + g->t, q * g->d});
            left -= q;
            // with pp stages a ring's forward first crosses the other stages and its backward drains
            // through them: (pp - 1) x its per-stage time on top (docs/planner.md, PP-Balance)
            last_end = cost_fmax(last_end, start + g->t + m->lift * g->t);
        }
    }
    return last_end;
}

static double predict(Model *m, double T) {
    double even = work_at(m, T) / m->R, fill = cost_fmax(T, even) / ELASTIC_FILL;
    int32_t k = 0, i = 0;
    // the sequences slower than T with work_at's widths, the rest on d0
    for (; i < m->n_lng && m->lng[i].t0 > fill; i++, k++) {
        const Seq *q = &m->lng[i];
        int d = q->t0 > T ? m->at_d[i] : q->d0;
        m->rigid[k] = (Rigid){d == q->d0 ? q->t0 : m->at_t[i], d, 1, k};
    }
    // the fill is as long as its longest piece: the first long sequence left to it, the first short
    // one not made a ring (short ones in the prepared order, not only those in m->sht)
    double piece = i < m->n_lng ? m->lng[i].t0 : 0;
    const BalanceBatch *bb = m->bb;
    int32_t r = 0;
    for (; r < m->n_sht && m->sht[r].t0 > T; r++) {  // short sequences made rings, a run at a time
        int d = m->at_d[m->n_lng + r];
        Rigid g = {m->at_t[m->n_lng + r], d, m->sht[r].count, k};
        if (m->flags & ELASTIC_RING_AT_A_TIME)  // (tests) each a ring of its own, as before runs
            for (int32_t j = 0; j < g.n; j++, k++) m->rigid[k] = (Rigid){g.t, g.d, 1, k};
        else
            m->rigid[k++] = g;
    }
    int32_t made = run_seqs(m, r);
    if (made < bb->n_short) piece = cost_fmax(piece, bb->scost[made] + bb->open_cost);
    qsort(m->rigid, (size_t)k, sizeof(Rigid), by_rigid_desc);
    return cost_fmax(rings_end(m, k), cost_fmax(even, piece) + m->lift * piece);
}

// ---- when the work sets the step ------------------------------------------------------------------------
//
// Every target's predicted step is at least the batch's work at that target spread over the ranks
// (predict's `even`). Widening never makes that work smaller than a bound known before any width is
// searched, so where the bound spread over the ranks already reaches balance's prediction (base), no
// target can predict a step ELASTIC_GAIN shorter: the plan is balance's, and the width model (the
// floor, every sequence's fastest width, per target a width search for every length) need not be
// built. That is the batch of many short sequences a rank, whose step is its work: the search over
// the grid there costs O(lengths x widths) per target, for nothing.
//
// The bound, with every cost-model field >= 0 (the premise of plan_lower_bound's average term):
// every kind of item (ring, all-to-all group, hybrid) on D >= 2 ranks gives each member at least 1/D
// of the sequence's compute (seq_work: attention and linear layers, the head), each layer's constant
// and at least one attention call's floor (attn_step) per layer, and the head's constant: together
// slot = l (layer_const + attn_step) + head_const; and its TP all-reduces, affine in the member's
// rows with a constant >= 0, come to at least those of the whole sequence on one rank. So on D ranks
// the sequence's work D t(D) >= seq_work + D slot (+ its TP time on one rank).
//   - A short sequence (s <= C) made a ring of D >= 2 (width_for: a sequence slower than T gets
//     more ranks than d0) replaces w0 = t(1) - open_cost (1 - s/C), its time alone less the part of
//     a micro-batch's constant it does not use; t(1) = seq_work + open_cost + head_const + its TP
//     time. Its extra work is >= (D - 1) slot + open_cost (1 - s/C) >= 0.
//   - A long one on D >= d0 + 1 ranks adds >= seq_work + (d0 + 1) slot - w0, which may be negative
//     (w0 may hold offload copies, or a node's faster link): counted where it is.
// Rounding: the sums run over at most 2^31 terms, so the float sums stay within about 1e-6 of
// the exact ones, relative to the work; ELASTIC_ROUNDING is ten times that.
#define ELASTIC_ROUNDING 1e-5

// 1: no target can predict a step ELASTIC_GAIN shorter than base (predict(m, m->hi)).
static int work_sets_step(const Model *m, double base) {
    const CostModel *cm = m->cm;
    if (!cost_fields_nonneg(cm)) return 0;
    double slot = cost_slot_const(cm), least = m->work;
    for (int32_t i = 0; i < m->n_lng; i++) {
        const Seq *q = &m->lng[i];
        double seq_work = cost_seq_work(cm, q->len);
        double extra = seq_work + (q->d0 + 1.0) * slot - q->w0;
        if (extra < 0) least += extra;
    }
    return least / m->R * (1 - ELASTIC_ROUNDING) >= base * (1 - ELASTIC_GAIN);
}

// ---- the target ------------------------------------------------------------------------------------------

// The target, or 0 when none predicts a step shorter than balance's; -1: out of memory. The search
// into *s, the grid's predictions into s->grid and s->pred.
static double find_target(Model *m, ElasticSearch *s) {
    memset(s, 0, sizeof *s);
    double base = predict(m, m->hi);  // nothing widened: no width searched, no floor needed
    s->base = base;
    if (!(m->flags & ELASTIC_FULL_SEARCH) && work_sets_step(m, base)) return s->work_sets_step = 1, 0;
    if (model_floor(m) != 0) return -1;
    if (!(m->floor_t < m->hi)) return 0;
    double *grid = s->grid, *pred = s->pred;
    int n = 0;
    for (double T = m->hi * ELASTIC_GRID_STEP; T > m->floor_t && n < ELASTIC_GRID_MAX - 1; T *= ELASTIC_GRID_STEP)
        grid[n++] = T;
    grid[n++] = m->floor_t;
    double best = base;
    for (int i = 0; i < n; i++) {
        pred[i] = predict(m, grid[i]);
        best = cost_fmin(best, pred[i]);
    }
    s->n = n;
    if (!(best < base * (1 - ELASTIC_GAIN))) return 0;
    for (int i = 0; i < n; i++)
        if (pred[i] <= best * (1 + ELASTIC_GAIN)) return s->T = grid[i];
    return 0;
}

// The widths for target T: every sequence slower than T gets the fewest ranks that bring it to T
// (d_max); the short ones among them (a prefix of the length order) become rings.
static void widths_at(const Model *m, double T, int32_t *d_max, BalanceWidths *w) {
    int32_t nl = slower_than(m->lng, m->n_lng, T), nr = slower_than(m->sht, m->n_sht, T);
    memset(d_max, 0, (size_t)(m->bb->b->n > 0 ? m->bb->b->n : 1) * sizeof(int32_t));
    for (int32_t i = 0; i < nl; i++) d_max[m->lng[i].seq] = width_for(m, &m->lng[i], T);
    for (int32_t r = 0; r < nr; r++) {
        int d = width_for(m, &m->sht[r], T);
        for (int32_t j = 0; j < m->sht[r].count; j++) d_max[m->bb->sidx[m->sht[r].first + j]] = d;
    }
    w->d_max = d_max;
    w->n_promoted = run_seqs(m, nr);
    w->wide = &m->wide;
}

// The batch scheduled with every sequence slower than T widened to it (balance_best, finalized).
static int widen_to(Plan *out, const BalanceBatch *bb, const Model *m, double T, int32_t *d_max) {
    BalanceWidths w;
    widths_at(m, T, d_max, &w);
    return balance_best(out, bb, &w, "elastic");
}

// ---- pp > 1: the targets by replay ------------------------------------------------------------------------
//
// With pipeline stages, predict misses what decides the step: a ring couples its members' 1F1B
// schedules at whatever depth each has reached, and a long ring holds the pipelines of all its
// members (docs/planner.md, "elastic under pipelines"). On LLaMA-70B at TP 8 x PP 4 the prediction
// stays within 1% over the whole grid of targets while the replayed makespan moves by 20%. The
// replay in plan_finalize is the simulator's schedule, so with pp > 1 elastic schedules and replays
// the grid's targets (at most ELASTIC_PP_TARGETS of them, geometrically spaced from the slowest
// sequence's time down to the least reachable) and keeps the shortest. out: the best widened plan;
// *T_out its target, 0 when none was shorter than `base` (then out is empty).
static int search_replayed(Plan *out, const BalanceBatch *bb, const Model *m, double base, int32_t *d_max,
                           double *T_out) {
    *T_out = 0;
    if (!(m->floor_t < m->hi)) return 0;
    double step = cost_fmin(ELASTIC_GRID_STEP, pow(m->floor_t / m->hi, 1.0 / ELASTIC_PP_TARGETS));
    double best = base * (1 - ELASTIC_GAIN);
    Plan cand;
    memset(&cand, 0, sizeof cand);
    for (int i = 1; i <= ELASTIC_PP_TARGETS; i++) {
        double T = cost_fmax(m->hi * pow(step, i), m->floor_t);
        if (widen_to(&cand, bb, m, T, d_max) != 0) return -1;
        if (cand.makespan < best) {
            Plan t = *out;
            *out = cand;
            cand = t;
            best = out->makespan;
            *T_out = T;
        }
        plan_free(&cand);
        if (T <= m->floor_t) break;
    }
    return 0;
}

// ---- never longer than balance ---------------------------------------------------------------------------
//
// The planner times a ring of D <= ranks_per_node ranks on the link inside a node (cost_item_time),
// but the scheduler picks members by load, not by node, and a ring whose members sit on two nodes
// runs on the slower link (the simulator charges it so). Both plans share that optimism, but not
// equally: widened rings move every ring after them to other ranks. So elastic keeps its plan only
// where it wins with the odds against it: its plan timed as if every ring crossed nodes (m->wide)
// against balance's as the planner times it. With pp = 1 the simulator runs each rank's items in the
// plan's order, each as soon as all its members are free, and times a ring between those two links,
// so the simulated step of elastic's plan is then no longer than balance's either.

// The makespan of plan p if every ring crossed nodes: pp = 1, plan_finalize's replay with the rings
// retimed; pp > 1, plan_finalize itself with the other cost model, then back.
static int makespan_across_nodes(Plan *p, const Model *m, double *out) {
    if (p->pp > 1) {
        if (plan_finalize_bounds(p, &m->wide, m->bb->bounds) != 0) return -1;  // only its makespan counts
        *out = p->makespan;
        return plan_finalize_bounds(p, m->cm, m->bb->bounds);
    }
    double *free_at = bs_keep_calloc((size_t)p->n_ranks, sizeof(double));
    int64_t *lens = bs_keep_alloc((size_t)(p->n_segs > 0 ? p->n_segs : 1) * sizeof(int64_t));
    if (!free_at || !lens) {
        bs_keep_free(free_at);
        bs_keep_free(lens);
        return bs_fail_ctx("elastic: replaying the plan");
    }
    *out = 0;
    for (int32_t k = 0; k < p->n_items; k++) {
        const Item *it = &p->items[k];
        const int32_t *rk = p->ranks + it->rank_begin;
        double t = it->est_time, start = 0;
        if (it->n_ranks > 1) {
            for (int32_t j = 0; j < it->n_segs; j++) lens[j] = p->segs[it->seg_begin + j].len;
            t = policy_kind_time(&m->wide, lens, it->n_segs, it->n_ranks, it->offload, it->a2a, it->ulysses);
        }
        for (int32_t j = 0; j < it->n_ranks; j++) start = cost_fmax(start, free_at[rk[j]]);
        for (int32_t j = 0; j < it->n_ranks; j++) free_at[rk[j]] = start + t;
        *out = cost_fmax(*out, start + t);
    }
    bs_keep_free(free_at);
    bs_keep_free(lens);
    return 0;
}

// ---- the policy ------------------------------------------------------------------------------------------

// pp > 1: balance's plan, and the widened plan the replay search finds, kept only where it is shorter
// with every ring across nodes (as step 3 below).
static int elastic_pipelined(Plan *out, const BalanceBatch *bb, const Model *m, int32_t *d_max) {
    Plan bal;
    memset(&bal, 0, sizeof bal);
    double T, across = 0;
    if (balance_best(&bal, bb, NULL, "elastic") != 0) return -1;
    if (search_replayed(out, bb, m, bal.makespan, d_max, &T) != 0 ||
        (T > 0 && makespan_across_nodes(out, m, &across) != 0)) {
        plan_free(out);
        plan_free(&bal);
        return -1;
    }
    if (T <= 0 || across >= bal.makespan) {  // ties: balance's, the fewer ranks
        plan_free(out);
        *out = bal;
        return 0;
    }
    plan_free(&bal);
    return 0;
}

int policy_elastic(Plan *out, const GlobalBatch *b, const PlanConfig *cfg, const CostModel *cm) {
    BalanceBatch bb;
    Model m;
    Plan bal, cand;
    int32_t *d_max = NULL;
    memset(out, 0, sizeof *out);
    memset(&bal, 0, sizeof bal);
    memset(&cand, 0, sizeof cand);
    memset(&m, 0, sizeof m);
    if (balance_prepare(&bb, b, cfg, cm) != 0) return -1;
    double bounds[2];  // every plan made here is of this batch: its bounds once, not at every finalize
    policy_bounds(b, cfg, cm, bounds);
    bb.bounds = bounds;
    int rc = -1;
    if (model_init(&m, &bb, 0) != 0) goto out;
    if (cfg->pp > 1) {  // the targets by replay (search_replayed)
        // the rings are replayed and scheduled many times here: each width of each costed once.
        // Not with pp = 1, where the ring phase runs two or three times: a table row read at
        // random (a cache miss) costs about what costing the width again does (1G tokens: the
        // same plans, 0.9x the time on byted without it)
        if (balance_keep_widths(&bb) != 0 || model_floor(&m) != 0) goto out;
        d_max = bs_keep_alloc((size_t)(b->n > 0 ? b->n : 1) * sizeof(int32_t));
        rc = d_max ? elastic_pipelined(out, &bb, &m, d_max) : bs_fail_ctx("elastic");
        goto out;
    }
    // 1. the target; none: the step is the batch's work, not a ring's, and the plan is balance's
    ElasticSearch search;
    double T = find_target(&m, &search);
    if (T < 0) goto out;
    if (T == 0) {
        rc = balance_best(out, &bb, NULL, "elastic");
        goto out;
    }
    // 2. the batch with rings widened to it; where the schedule misses the prediction, the targets
    // next to it, one step of the grid further each round while that shortens the step
    d_max = bs_keep_alloc((size_t)(b->n > 0 ? b->n : 1) * sizeof(int32_t));
    if (!d_max) {
        bs_fail_ctx("elastic");
        goto out;
    }
    if (widen_to(out, &bb, &m, T, d_max) != 0) goto out;
    int missed = out->makespan > predict(&m, T) * (1 + ELASTIC_MISS);
    int dir = 0;  // the side that won: +1 a larger target (fewer ranks), -1 a smaller one, 0 none yet
    for (int round = 0; missed && round < ELASTIC_ROUNDS; round++) {
        int sides[2] = {dir ? dir : 1, dir ? 0 : -1}, won = 0;  // first both sides, then the winner's
        for (int k = 0; k < 2 && sides[k] != 0 && !won; k++) {
            double next = sides[k] > 0 ? T / ELASTIC_GRID_STEP : T * ELASTIC_GRID_STEP;
            if (next > m.hi || next < m.floor_t) continue;
            if (widen_to(&cand, &bb, &m, next, d_max) != 0) goto out;
            if (cand.makespan < out->makespan) {
                Plan t = *out;
                *out = cand;
                cand = t;
                T = next;
                dir = sides[k];
                won = 1;
            }
            plan_free(&cand);
        }
        if (!won) break;
    }
    // 3. never longer than balance, even with every ring of elastic's plan across nodes: below what
    // balance's plan is known to take it need not be made
    double across = 0, balance_at_least = out->hdp_bound, rings_end = 0;
    if (makespan_across_nodes(out, &m, &across) != 0) goto out;
    if (cfg->pp == 1 && across > balance_at_least) {  // the bound did not settle it: balance's rings
        if (balance_rings_end(&bb, &rings_end) != 0) goto out;
        balance_at_least = cost_fmax(balance_at_least, rings_end);
    }
    if (across > balance_at_least) {
        if (balance_best(&bal, &bb, NULL, "elastic") != 0) goto out;
        if (bal.makespan <= across) {  // ties: balance's, the fewer ranks
            Plan t = *out;
            *out = bal;
            bal = t;
        }
    }
    rc = 0;
out:
    if (rc != 0) plan_free(out);
    plan_free(&bal);
    plan_free(&cand);
    bs_keep_free(d_max);
    model_free(&m);
    balance_batch_free(&bb);
    return rc;
}

int elastic_search(ElasticSearch *out, const GlobalBatch *b, const PlanConfig *cfg, const CostModel *cm, int flags) {
    BalanceBatch bb;
    Model m;
    memset(out, 0, sizeof *out);
    if (cfg->pp != 1) return bs_fail("elastic_search: pp = 1 only (pp %d)", cfg->pp);
    if (balance_prepare(&bb, b, cfg, cm) != 0) return -1;
    int rc = model_init(&m, &bb, flags);
    if (rc == 0) rc = find_target(&m, out) < 0 ? -1 : 0;
    model_free(&m);
    balance_batch_free(&bb);
    return rc;
}
