// policy_static.c: the baseline, Megatron-style static DP x CP mesh (docs/planner.md).
//
// d_cp = ceil(context / C) ranks per CP group, d_dp = n_ranks / d_cp groups (leftover ranks idle).
// Sequences are packed in arrival order into micro-batches (one that does not fit starts the next
// micro-batch); every micro-batch is a ring over its group's d_cp ranks with every sequence split
// symmetrically (d_cp == 1: a pack). "Fits" means every ring member holds at most C tokens under the
// 2D-chunk layout, which is stricter than C * d_cp tokens in all: short sequences put their extra
// tokens on the low members (plan_validate checks the same). Micro-batches go to groups as Megatron's
// data-parallel split does: contiguous blocks of equal count, and when the count does not divide,
// the first (M mod d_dp) groups take one more. Global order: round k of every group, then round k+1.
// The static mesh never offloads.
#include <stdlib.h>
#include <string.h>

#include "bytescale/error.h"
#include "plan/policy_util.h"

int policy_static(Plan *out, const GlobalBatch *b, const PlanConfig *cfg, const CostModel *cm) {
    (void)cm;
    int64_t C = cfg->capacity, d_cp;
    int32_t d_dp;
    if (policy_mesh(b, cfg, &d_cp, &d_dp) != 0) return -1;
    if (plan_init(out, b, cfg->n_ranks, C, cfg->pp, "static") != 0) return -1;
    if (b->n == 0) return 0;

    // micro-batches: mb_first[m] .. mb_first[m+1] are the sequences of micro-batch m
    int32_t *mb_first = bs_malloc((size_t)(b->n + 1) * sizeof(int32_t));
    Segment *segs = bs_malloc((size_t)b->n * sizeof(Segment));
    int32_t *ranks = bs_malloc((size_t)d_cp * sizeof(int32_t));
    RingFill fill = {.D = d_cp, .extra = bs_malloc((size_t)d_cp * sizeof(int64_t))};
    int rc = -1;
    if (!mb_first || !segs || !ranks || !fill.extra) {
        bs_fail_ctx("static");
        goto out;
    }
    int32_t M = 0;
    for (int32_t i = 0; i < b->n; i++) {
        if (M > 0 && ring_fill_add(&fill, b->seqs[i].len) <= C) continue;
        // next fit: the sequence starts a micro-batch. An empty ring always takes it: no member then
        // holds more than ceil(len / d_cp) <= ceil(context / d_cp) <= C tokens.
        mb_first[M++] = i;
        ring_fill_clear(&fill);
        ring_fill_add(&fill, b->seqs[i].len);
    }
    mb_first[M] = (int32_t)b->n;

    // group g runs micro-batches [g*base + min(g, extra), + count_g)
    int32_t base = M / d_dp, extra = M % d_dp, rounds = base + (extra > 0);
    for (int32_t k = 0; k < rounds; k++) {
        for (int32_t g = 0; g < d_dp; g++) {
            int32_t count = base + (g < extra);
            if (k >= count) continue;
            int32_t m = g * base + (g < extra ? g : extra) + k;
            int n_segs = 0;
            for (int32_t i = mb_first[m]; i < mb_first[m + 1]; i++) segs[n_segs++] = (Segment){i, 0, b->seqs[i].len};
            for (int32_t j = 0; j < d_cp; j++) ranks[j] = g * (int32_t)d_cp + j;
            if (plan_add_item(out, segs, n_segs, ranks, (int)d_cp, 0.0) < 0) goto out;
        }
    }
    rc = 0;
out:
    free(mb_first);
    free(segs);
    free(ranks);
    free(fill.extra);
    return rc;
}
