// policy_naive.c: ByteScale's Algorithm 1, naive HDP (docs/planner.md).
//
// Sharding: every sequence s > C becomes a ring over D(s) ranks with offload ratio r(s) (Eq. 3,
// policy_shard); every s <= C is best-fit packed, in arrival order, into bins of capacity C.
// Assignment without balancing, what a data-parallel loader does: it balances TOKENS, not time.
// Items in the arrival order of their first sequence, each to the D ranks with the fewest tokens so
// far (ties: the lowest rank); the global order is the assignment order.
#include <stdlib.h>

#include "bytescale/error.h"
#include "plan/policy_util.h"

int policy_naive(Plan *out, const GlobalBatch *b, const PlanConfig *cfg, const CostModel *cm) {
    int64_t n = b->n;
    int32_t *D = bs_malloc((size_t)(n > 0 ? n : 1) * sizeof(int32_t));
    double *r = bs_malloc((size_t)(n > 0 ? n : 1) * sizeof(double));
    int32_t *bin_of = bs_malloc((size_t)(n > 0 ? n : 1) * sizeof(int32_t));
    int32_t *bin_begin = NULL, *bin_seqs = NULL, *ranks = NULL;
    Segment *segs = NULL;
    BestFit bf = {0};
    RankHeap heap = {0};
    int rc = -1;
    if (!D || !r || !bin_of) goto fail_mem;
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

    if (plan_init(out, b, cfg->n_ranks, cfg->capacity, cfg->pp, "naive") != 0) goto out;
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
        int d = D[i];
        for (int j = 0; j < d; j++) ranks[j] = rankheap_pop(&heap);
        for (int j = 0; j < d; j++) rankheap_push(&heap, ranks[j], heap.key[ranks[j]] + (double)tokens / d);
        policy_sort_ranks(ranks, d);
        if (plan_add_item(out, segs, n_segs, ranks, d, r[i]) < 0) goto out;
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
    bestfit_free(&bf);
    rankheap_free(&heap);
    return rc;
}
