// policy_wlb.c: WLB-LLM's workload-balanced packing on a static DP x CP mesh (docs/peers.md, "wlb":
// the paper's sections it follows and every choice we made).
//
// The mesh is the static baseline's: d_cp = ceil(context / C) ranks per CP group, d_dp groups.
//   1. Outlier delay. A document whose attention-aware work is more than a balanced micro-batch's
//      share (total work / micro-batches) is an outlier. Outliers wait in a queue until there are at
//      least as many as micro-batches, so that each micro-batch can take one; then the oldest
//      (first in the batch: the caller puts the documents an earlier step delayed first) are
//      released, one per micro-batch, and the rest wait. The plan lists the waiting ones
//      (Plan.delayed); the caller adds them to the next batch, and a last step with cfg->flush set
//      delays nothing, so a run trains every document exactly once.
//   2. Workload-aware variable-length packing. The documents to train, heaviest first, each go to
//      the micro-batch with the least work that still has room (every CP member at most C tokens
//      under the per-document chunk layout). Work is the cost model's attention-aware compute
//      l (attn_pair s(s+1)/2 + lin_token s), not tokens. The micro-batches are the fewest, in
//      multiples of d_dp, that hold the tokens (and more, d_dp at a time, until every document fits).
//   3. Per-document CP sharding. Every document of a micro-batch is cut into 2 d_cp chunks of its
//      own, member i taking chunks i and 2 d_cp - 1 - i: the plan's ring layout does exactly this
//      (plan_chunk), so every CP member gets an equal share of every document's causal work.
// Micro-batches go to the DP groups in rounds, heaviest first, each round's to the groups with the
// least work so far; the global order is round by round, as the static mesh's.
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "bytescale/error.h"
#include "plan/policy_util.h"

// The attention-aware work of a document (WLB-LLM's W_a + W_l, with our cost model's coefficients).
static double doc_work(const CostModel *cm, int64_t s) {
    return cm->n_layers * (cm->attn_pair * cost_causal_area(s) + cm->lin_token * (double)s);
}

// Pack the documents order[0 .. n) (heaviest first) into M micro-batches: mb[i] for each. 1 when all
// fit, 0 when one fits nowhere (the caller tries more micro-batches), -1 + error.
static int pack(const GlobalBatch *b, const int32_t *order, int32_t n, const double *work, int32_t M, int64_t d_cp,
                int64_t C, int32_t *mb, double *mb_work) {
    RankHeap h;
    RingFill *fill = bs_malloc((size_t)M * sizeof(RingFill));
    int64_t *extra = bs_calloc((size_t)M * (size_t)d_cp, sizeof(int64_t));
    int32_t *aside = bs_malloc((size_t)M * sizeof(int32_t));
    int rc = -1;
    if (!fill || !extra || !aside || rankheap_init(&h, M) != 0) {
        free(fill), free(extra), free(aside);
        return bs_fail_ctx("wlb");
    }
    for (int32_t m = 0; m < M; m++) {
        fill[m] = (RingFill){.D = d_cp, .extra = extra + (size_t)m * d_cp};
        mb_work[m] = 0;
    }
    rc = 1;
    for (int32_t i = 0; i < n && rc == 1; i++) {
        int64_t s = b->seqs[order[i]].len;
        int32_t n_aside = 0, m = -1;
        while (h.n > 0) {  // the least-loaded micro-batch with room
            int32_t x = rankheap_pop(&h);
            if (ring_fill_peek(&fill[x], s) <= C) {
                m = x;
                break;
            }
            aside[n_aside++] = x;
        }
        for (int32_t a = 0; a < n_aside; a++) rankheap_push(&h, aside[a], mb_work[aside[a]]);
        if (m < 0) {
            rc = 0;
            break;
        }
        ring_fill_add(&fill[m], s);
        mb_work[m] += work[order[i]];
        mb[order[i]] = m;
        rankheap_push(&h, m, mb_work[m]);
    }
    rankheap_free(&h);
    free(fill), free(extra), free(aside);
    return rc;
}

int policy_wlb(Plan *out, const GlobalBatch *b, const PlanConfig *cfg, const CostModel *cm) {
    int64_t C = cfg->capacity, d_cp;
    int32_t d_dp;
    if (policy_mesh(b, cfg, &d_cp, &d_dp) != 0) return -1;
    if (plan_init(out, b, cfg->n_ranks, C, cfg->pp, "wlb") != 0) return -1;
    if (b->n == 0) return 0;
    int32_t n = (int32_t)b->n;
    double *work = bs_malloc((size_t)n * sizeof(double));
    int32_t *order = bs_malloc((size_t)n * sizeof(int32_t));
    int32_t *train = bs_malloc((size_t)n * sizeof(int32_t));
    int32_t *mb = bs_malloc((size_t)n * sizeof(int32_t));
    int32_t *delayed = bs_calloc((size_t)n, sizeof(int32_t));
    int32_t *mb_order = NULL, *mb_first = NULL, *mb_seqs = NULL, *ranks = NULL;
    double *mb_work = NULL, *group_work = NULL;
    Segment *segs = bs_malloc((size_t)n * sizeof(Segment));
    int rc = -1;
    if (!work || !order || !train || !mb || !delayed || !segs) {
        bs_fail_ctx("wlb");
        goto out;
    }
    double total = 0;
    int64_t tokens = 0;
    for (int32_t i = 0; i < n; i++) work[i] = doc_work(cm, b->seqs[i].len), total += work[i], tokens += b->seqs[i].len;
    // the fewest micro-batches that can hold the batch, a multiple of d_dp
    int64_t per_mb = d_cp * C;
    int64_t M0 = (tokens + per_mb - 1) / per_mb;
    M0 = (M0 + d_dp - 1) / d_dp * d_dp;
    if (M0 > INT32_MAX / 2) {
        bs_fail("wlb: %lld micro-batches", (long long)M0);
        goto out;
    }
    // 1. the delay queue: outliers in batch order; released when they can fill every micro-batch
    if (!cfg->flush) {
        double share = total / (double)M0;
        int32_t n_out = 0;
        for (int32_t i = 0; i < n; i++) n_out += work[i] > share;
        int64_t released = 0;
        for (int32_t i = 0; i < n; i++) {
            if (!(work[i] > share)) continue;
            if (n_out >= M0 && released < M0) {
                released++;
                continue;
            }
            delayed[i] = 1;
        }
    }
    int32_t n_train = 0;
    for (int32_t i = 0; i < n; i++) {
        if (delayed[i]) {
            if (plan_add_delayed(out, i) != 0) goto out;
        } else {
            train[n_train++] = i;
        }
    }
    // 2. heaviest first (ties in batch order), each into the least-loaded micro-batch with room
    {
        double *key = bs_malloc((size_t)(n_train > 0 ? n_train : 1) * sizeof(double));
        int32_t *tmp = bs_malloc((size_t)(n_train > 0 ? n_train : 1) * sizeof(int32_t));
        int ok = key && tmp;
        for (int32_t i = 0; ok && i < n_train; i++) key[i] = -work[train[i]] + 0.0;
        // policy_order_by_time wants keys >= 0: sort by (largest - work)
        double top = 0;
        for (int32_t i = 0; ok && i < n_train; i++) top = fmax(top, work[train[i]]);
        for (int32_t i = 0; ok && i < n_train; i++) key[i] = top - work[train[i]];
        if (ok && policy_order_by_time(key, n_train, tmp) != 0) ok = 0;
        for (int32_t i = 0; ok && i < n_train; i++) order[i] = train[tmp[i]];
        free(key);
        free(tmp);
        if (!ok) {
            bs_fail_ctx("wlb");
            goto out;
        }
    }
    int32_t M = (int32_t)(M0 > 0 ? M0 : d_dp);
    mb_work = bs_malloc((size_t)M * sizeof(double));
    if (!mb_work) goto out;
    for (;;) {
        int r = pack(b, order, n_train, work, M, d_cp, C, mb, mb_work);
        if (r < 0) goto out;
        if (r == 1) break;
        M += d_dp;  // a document fit nowhere: d_dp more micro-batches
        double *q = bs_realloc(mb_work, (size_t)M * sizeof(double));
        if (!q) goto out;
        mb_work = q;
    }
    // the micro-batches' documents, in packing order
    mb_first = bs_calloc((size_t)M + 1, sizeof(int32_t));
    mb_seqs = bs_malloc((size_t)(n_train > 0 ? n_train : 1) * sizeof(int32_t));
    mb_order = bs_malloc((size_t)M * sizeof(int32_t));
    group_work = bs_calloc((size_t)d_dp, sizeof(double));
    ranks = bs_malloc((size_t)d_cp * sizeof(int32_t));
    int32_t *fillp = bs_malloc((size_t)M * sizeof(int32_t)), *gorder = bs_malloc((size_t)d_dp * sizeof(int32_t));
    if (!mb_first || !mb_seqs || !mb_order || !group_work || !ranks || !fillp || !gorder) {
        free(fillp), free(gorder);
        bs_fail_ctx("wlb");
        goto out;
    }
    for (int32_t i = 0; i < n_train; i++) mb_first[mb[order[i]] + 1]++;
    for (int32_t m = 0; m < M; m++) mb_first[m + 1] += mb_first[m];
    memcpy(fillp, mb_first, (size_t)M * sizeof(int32_t));
    for (int32_t i = 0; i < n_train; i++) mb_seqs[fillp[mb[order[i]]]++] = order[i];
    // micro-batches heaviest first; round k gives the next d_dp of them to the groups, the heaviest to
    // the group with the least work so far
    {
        double top = 0;
        for (int32_t m = 0; m < M; m++) top = fmax(top, mb_work[m]);
        double *key = bs_malloc((size_t)M * sizeof(double));
        if (!key) {
            free(fillp), free(gorder);
            goto out;
        }
        for (int32_t m = 0; m < M; m++) key[m] = top - mb_work[m];
        int r = policy_order_by_time(key, M, mb_order);
        free(key);
        if (r != 0) {
            free(fillp), free(gorder);
            goto out;
        }
    }
    for (int32_t k = 0; k * d_dp < M; k++) {
        for (int32_t g = 0; g < d_dp; g++) gorder[g] = g;
        for (int32_t g = 1; g < d_dp; g++) {  // groups by work so far, ascending (insertion sort)
            int32_t x = gorder[g], j = g;
            while (j > 0 && group_work[gorder[j - 1]] > group_work[x]) gorder[j] = gorder[j - 1], j--;
            gorder[j] = x;
        }
        for (int32_t g = 0; g < d_dp && k * d_dp + g < M; g++) {
            int32_t m = mb_order[k * d_dp + g], grp = gorder[g];
            int n_segs = 0;
            for (int32_t x = mb_first[m]; x < mb_first[m + 1]; x++)
                segs[n_segs++] = (Segment){mb_seqs[x], 0, b->seqs[mb_seqs[x]].len};
            if (n_segs == 0) continue;  // an empty micro-batch runs nothing
            for (int32_t j = 0; j < d_cp; j++) ranks[j] = grp * (int32_t)d_cp + j;
            if (plan_add_item(out, segs, n_segs, ranks, (int)d_cp, 0.0) < 0) {
                free(fillp), free(gorder);
                goto out;
            }
            group_work[grp] += mb_work[m];
        }
    }
    free(fillp), free(gorder);
    rc = 0;
out:
    free(work), free(order), free(train), free(mb), free(delayed), free(segs);
    free(mb_order), free(mb_first), free(mb_seqs), free(ranks), free(mb_work), free(group_work);
    return rc;
}
