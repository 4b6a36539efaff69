// policy_naive.c: ByteScale's Algorithm 1, naive HDP (docs/planner.md), in two readings.
//
// Sharding: every s <= C is best-fit packed, in arrival order, into bins of capacity C; every
// sequence s > C becomes a ring. How many ranks the ring gets is where the readings differ:
//   naive          as ByteScale deploys it: D anywhere in [Eq. 3's fewest ranks, ceil(s/C)], the
//                  D that finishes the ring earliest on the ranks it is given (ties: fewer ranks).
//                  Offloading shrinks a ring only where that does not make it finish later, and
//                  is required where the ranks run short. With offloading off: D = ceil(s/C),
//                  r = 0 (the ablation's "naive-nooff", dynamic communication alone).
//   naive-eq3min   the literal reading: D = Eq. 3's fewest ranks, r what that takes. Every member
//                  then does more of the quadratic attention work, while a ring at C tokens per
//                  rank already hides its traffic; kept as a named variant for the ablation.
// Assignment without balancing, what a data-parallel loader does: it balances TOKENS, not time.
// Items in the arrival order of their first sequence, each to the D ranks with the fewest tokens so
// far (ties: the lowest rank); the global order is the assignment order. Ranks' estimated busy
// times are tracked only to choose a ring's D.
#include <math.h>
#include <stdlib.h>

#include "bytescale/error.h"
#include "plan/policy_util.h"

// Ring size for a long sequence, naive's way: members[] holds the d_hi ranks with the fewest tokens
// (fewest first); the D in [d_lo, d_hi] whose ring on members[0..D) finishes earliest, counting from
// when the last of those is free (busy), with the least offload that D allows.
static int pick_ring(const CostModel *cm, int64_t len, int64_t C, int d_lo, int d_hi, const int32_t *members,
                     const double *busy, int *d, double *r, double *start, double *t) {
    double best = INFINITY, free_at = 0;
    *d = -1;
    for (int dd = 1; dd <= d_hi; dd++) {
        free_at = fmax(free_at, busy[members[dd - 1]]);
        double rd;
        if (dd < d_lo || !policy_offload_for(cm, len, C, dd, &rd)) continue;
        double td = cost_item_time(cm, &len, 1, dd, rd);
        if (free_at + td < best) {
            best = free_at + td;
            *d = dd, *r = rd, *start = free_at, *t = td;
        }
    }
    if (*d < 0) {
        char why[512];
        return bs_fail("a sequence of %lld tokens fits on no ring of %d to %d ranks: on %d, %s", (long long)len, d_lo,
                       d_hi, d_hi, cost_offload_why(cm, len, C, d_hi, why, sizeof why));
    }
    return 0;
}

static int naive_plan(Plan *out, const GlobalBatch *b, const PlanConfig *cfg, const CostModel *cm, int eq3min) {
    int64_t n = b->n;
    int32_t *D = bs_malloc((size_t)(n > 0 ? n : 1) * sizeof(int32_t));
    double *r = bs_malloc((size_t)(n > 0 ? n : 1) * sizeof(double));
    int32_t *bin_of = bs_malloc((size_t)(n > 0 ? n : 1) * sizeof(int32_t));
    int32_t *bin_begin = NULL, *bin_seqs = NULL, *ranks = NULL;
    Segment *segs = NULL;
    BestFit bf = {0};
    RankHeap heap = {0};
    double *busy = bs_calloc((size_t)cfg->n_ranks, sizeof(double));  // estimated time each rank is free
    int64_t *lens = bs_malloc((size_t)(n > 0 ? n : 1) * sizeof(int64_t));  // one item's segment lengths
    int rc = -1;
    if (!D || !r || !bin_of || !busy || !lens) goto fail_mem;
    if (policy_shard(b, cfg, cm, D, r) != 0) goto out;
    if (bestfit_init(&bf, cfg->capacity) != 0) goto out;
    for (int64_t i = 0; i < n; i++) {
        bin_of[i] = -1;
        if (b->seqs[i].len > cfg->capacity) continue;
        if ((bin_of[i] = bestfit_add(&bf, b->seqs[i].len)) < 0) goto out;
    }
    // the sequences of every bin, in arrival order (counting sort by bin)
    int32_t n_bins = bf.n_bins;
    bin_begin = bs_calloc((size_t)n_bins + 1, sizeof(int32_t));
    bin_seqs = bs_malloc((size_t)(n > 0 ? n : 1) * sizeof(int32_t));
    segs = bs_malloc((size_t)(n > 0 ? n : 1) * sizeof(Segment));
    ranks = bs_malloc((size_t)cfg->n_ranks * sizeof(int32_t));
    if (!bin_begin || !bin_seqs || !segs || !ranks) goto fail_mem;
    for (int64_t i = 0; i < n; i++)
        if (bin_of[i] >= 0) bin_begin[bin_of[i] + 1]++;
    for (int32_t k = 0; k < n_bins; k++) bin_begin[k + 1] += bin_begin[k];
    for (int64_t i = 0; i < n; i++)
        if (bin_of[i] >= 0) bin_seqs[bin_begin[bin_of[i]]++] = (int32_t)i;
    for (int32_t k = n_bins; k > 0; k--) bin_begin[k] = bin_begin[k - 1];  // undo the shift of the fill
    bin_begin[0] = 0;

    if (plan_init(out, b, cfg->n_ranks, cfg->capacity, cfg->pp, eq3min ? "naive-eq3min" : "naive") != 0) goto out;
    if (rankheap_init(&heap, cfg->n_ranks) != 0) goto out;
    // a bin is created by its first sequence, so visiting sequences in order and emitting a bin at
    // its first sequence gives the arrival order of first sequences
    for (int64_t i = 0; i < n; i++) {
        int n_segs = 0;
        if (bin_of[i] < 0) {
            segs[n_segs++] = (Segment){(int32_t)i, 0, b->seqs[i].len};
        } else {
            int32_t k = bin_of[i];
            if (bin_seqs[bin_begin[k]] != i) continue;  // not the bin's first sequence
            for (int32_t j = bin_begin[k]; j < bin_begin[k + 1]; j++)
                segs[n_segs++] = (Segment){bin_seqs[j], 0, b->seqs[bin_seqs[j]].len};
        }
        int64_t tokens = 0;
        for (int j = 0; j < n_segs; j++) tokens += segs[j].len;
        int d = D[i], d_hi = d;
        double ratio = r[i], start = 0, t = 0;
        if (bin_of[i] < 0 && !eq3min) {  // a ring: any D from Eq. 3's fewest to ceil(s / C)
            int64_t plain = tokens / cfg->capacity + (tokens % cfg->capacity != 0);
            d_hi = plain < cfg->n_ranks ? (int)plain : cfg->n_ranks;
            if (d_hi < d) d_hi = d;
        }
        for (int j = 0; j < d_hi; j++) ranks[j] = rankheap_pop(&heap);
        if (d_hi > d) {
            if (pick_ring(cm, tokens, cfg->capacity, d, d_hi, ranks, busy, &d, &ratio, &start, &t) != 0) goto out;
            for (int j = d; j < d_hi; j++) rankheap_push(&heap, ranks[j], heap.key[ranks[j]]);  // not taken
        } else {
            for (int j = 0; j < d; j++) start = fmax(start, busy[ranks[j]]);
            for (int j = 0; j < n_segs; j++) lens[j] = segs[j].len;
            t = cost_item_time(cm, lens, n_segs, d, ratio);
        }
        for (int j = 0; j < d; j++) {
            rankheap_push(&heap, ranks[j], heap.key[ranks[j]] + (double)tokens / d);
            busy[ranks[j]] = start + t;
        }
        policy_sort_ranks(ranks, d);
        if (plan_add_item(out, segs, n_segs, ranks, d, ratio) < 0) goto out;
    }
    rc = 0;
    goto out;
fail_mem:
    bs_fail_ctx("naive");
out:
    free(D);
    free(r);
    free(bin_of);
    free(bin_begin);
    free(bin_seqs);
    free(segs);
    free(ranks);
    free(busy);
    free(lens);
    bestfit_free(&bf);
    rankheap_free(&heap);
    return rc;
}

int policy_naive(Plan *out, const GlobalBatch *b, const PlanConfig *cfg, const CostModel *cm) {
    return naive_plan(out, b, cfg, cm, 0);
}

int policy_naive_eq3min(Plan *out, const GlobalBatch *b, const PlanConfig *cfg, const CostModel *cm) {
    return naive_plan(out, b, cfg, cm, 1);
}
