// policy_wlb.c: WLB-LLM's workload-balanced packing on a static DP x CP mesh, as the paper has it
// (docs/peers.md, "wlb": the paper's sections it follows and every choice we made).
//
// The mesh is the static baseline's: d_cp = ceil(context / C) ranks per CP group, d_dp groups. A
// micro-batch is one CP group's packed sequence of at most L = d_cp C tokens (the paper's context
// window), and a step has N micro-batches: the fewest, in multiples of d_dp, that hold the tokens of
// the step's own documents (the batch less the cfg->carried documents earlier steps delayed), so N
// never grows with the queue.
//   1. The multi-level outlier queue. A document longer than L/8 is an outlier of level 1 (up to
//      L/4), 2 (up to L/2) or 3 (up to L). A level releases its N oldest documents when it holds N
//      or more, one for every micro-batch, as often as it holds N; the rest wait. The policy keeps
//      no state: the caller puts the documents a step delays first into the next batch, in order,
//      so a level's documents in batch order are its queue, oldest first, and a level is a function
//      of the length.
//   2. Algorithm 1's packing. The documents to train (the step's own short ones, the released
//      outliers, and the short ones an earlier step could not fit), heaviest first, each go to the
//      micro-batch with the least work; when that one is full, to the one with the fewest tokens;
//      when that one is full too, the document waits for the next step (the paper's "remained"
//      documents). Work is the cost model's attention-aware compute l (attn_pair s(s+1)/2 +
//      lin_token s), not tokens. "Full": a CP member would hold more than C tokens (step 3).
//   3. Per-document CP sharding. Every document of a micro-batch is cut into 2 d_cp chunks of its
//      own, member i taking chunks i and 2 d_cp - 1 - i: the plan's ring layout does exactly this
//      (plan_chunk), so every CP member gets an equal share of every document's causal work.
// A step packs N micro-batches, or more (d_dp at a time) when the documents it trains need them. A
// last step with cfg->flush set delays nothing: its outliers all train, and a document that fits
// nowhere gets d_dp more micro-batches, so a run trains every document exactly once.
// Micro-batches go to the DP groups in rounds, heaviest first, each round's to the groups with the
// least work so far; the global order is round by round, as the static mesh's.
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "bytescale/error.h"
#include "plan/policy_util.h"

enum { WLB_LEVELS = 3 };

// The attention-aware work of a document (WLB-LLM's W_a + W_l, with our cost model's coefficients).
static double doc_work(const CostModel *cm, int64_t s) {
    return cm->n_layers * (cm->attn_pair * cost_causal_area(s) + cm->lin_token * (double)s);
}

// The outlier level of a document of s tokens in micro-batches of L tokens: 0 (not an outlier), or
// 1 .. WLB_LEVELS for s in (L/8, L/4], (L/4, L/2], (L/2, L].
static int wlb_level(int64_t s, int64_t L) {
    int level = 0;
    for (int64_t t = L / 8; level < WLB_LEVELS && s > t; t *= 2) level++;
    return level;
}

// The fewest micro-batches of L tokens that hold `tokens`, a multiple of d_dp (at least d_dp).
static int64_t wlb_micro_batches(int64_t tokens, int64_t L, int32_t d_dp) {
    int64_t m = (tokens + L - 1) / L;
    m = (m + d_dp - 1) / d_dp * d_dp;
    return m > 0 ? m : d_dp;
}

// The step's working arrays, one allocation each.
typedef struct {
    int32_t n;
    double *work;       // (n,) per document
    int32_t *delayed;   // (n,) 1: this step does not train it
    int32_t *order;     // (n,) the documents to train, heaviest first
    int32_t n_train;
    int32_t *mb;        // (n,) micro-batch of each trained document
    int32_t M;          // micro-batches
    double *mb_work;    // (M,)
    int64_t *mb_tokens; // (M,) what its fullest CP member holds (the tokens when d_cp = 1)
    RingFill *fill;     // (M,) what each CP member holds
    int64_t *extra;     // (M x d_cp,) the fills' storage
} Wlb;

static void wlb_free(Wlb *w) {
    free(w->work), free(w->delayed), free(w->order), free(w->mb);
    free(w->mb_work), free(w->mb_tokens), free(w->fill), free(w->extra);
    memset(w, 0, sizeof *w);
}

// 1. The queue: every level's documents in batch order (oldest first); each full N of them is released,
// the rest (fewer than N) wait. With the flush set nothing waits.
static void wlb_queue(Wlb *w, const GlobalBatch *b, int64_t L, int64_t N, int flush) {
    int64_t count[WLB_LEVELS + 1] = {0}, seen[WLB_LEVELS + 1] = {0};
    for (int32_t i = 0; i < w->n; i++) count[wlb_level(b->seqs[i].len, L)]++;
    for (int32_t i = 0; i < w->n; i++) {
        int lv = wlb_level(b->seqs[i].len, L);
        if (lv == 0 || flush) continue;
        int64_t released = count[lv] / N * N;  // the oldest `released` of the level go now
        w->delayed[i] = seen[lv]++ >= released;
    }
}

// The documents to train, heaviest first (ties in batch order). -1 + error when out of memory.
static int wlb_order(Wlb *w) {
    int32_t n = 0;
    double top = 0;
    for (int32_t i = 0; i < w->n; i++)
        if (!w->delayed[i]) w->order[n++] = i, top = fmax(top, w->work[i]);
    w->n_train = n;
    if (n == 0) return 0;
    double *key = bs_malloc((size_t)n * sizeof(double));
    int32_t *tmp = bs_malloc((size_t)n * sizeof(int32_t));
    int rc = key && tmp ? 0 : -1;
    for (int32_t k = 0; rc == 0 && k < n; k++) key[k] = top - w->work[w->order[k]];  // keys >= 0: heaviest first
    if (rc == 0) rc = policy_order_by_time(key, n, tmp);
    for (int32_t k = 0; rc == 0 && k < n; k++) tmp[k] = w->order[tmp[k]];
    if (rc == 0) memcpy(w->order, tmp, (size_t)n * sizeof(int32_t));
    free(key), free(tmp);
    return rc;
}

// Make room for M micro-batches of d_cp members, all empty. -1 + error when out of memory.
static int wlb_reset(Wlb *w, int32_t M, int64_t d_cp) {
    if (M > w->M) {
        free(w->mb_work), free(w->mb_tokens), free(w->fill), free(w->extra);
        w->mb_work = bs_malloc((size_t)M * sizeof(double));
        w->mb_tokens = bs_malloc((size_t)M * sizeof(int64_t));
        w->fill = bs_malloc((size_t)M * sizeof(RingFill));
        w->extra = bs_malloc((size_t)M * (size_t)d_cp * sizeof(int64_t));
        if (!w->mb_work || !w->mb_tokens || !w->fill || !w->extra) return -1;
    }
    w->M = M;
    for (int32_t m = 0; m < M; m++) {
        w->fill[m] = (RingFill){.D = d_cp, .extra = w->extra + (size_t)m * (size_t)d_cp};
        ring_fill_clear(&w->fill[m]);
        w->mb_work[m] = 0, w->mb_tokens[m] = 0;
    }
    return 0;
}

// 2. Algorithm 1 over w->M micro-batches: each document to the least-work micro-batch, else the one
// with the fewest tokens (ties: the lower index), else it remains: delayed when `can_delay`, else
// packing stops. 1 when done, 0 when a document fits nowhere and cannot be delayed.
static int wlb_pack(Wlb *w, const GlobalBatch *b, int64_t C, int can_delay) {
    for (int32_t k = 0; k < w->n_train; k++) {
        int32_t i = w->order[k], lw = 0, lt = 0;
        int64_t s = b->seqs[i].len;
        for (int32_t m = 1; m < w->M; m++) {
            if (w->mb_work[m] < w->mb_work[lw]) lw = m;
            if (w->mb_tokens[m] < w->mb_tokens[lt]) lt = m;
        }
        int32_t m = ring_fill_peek(&w->fill[lw], s) <= C ? lw : ring_fill_peek(&w->fill[lt], s) <= C ? lt : -1;
        if (m < 0) {
            if (!can_delay) return 0;
            w->delayed[i] = 1, w->mb[i] = -1;  // the paper's "remained": first into the next step
            continue;
        }
        w->mb_tokens[m] = ring_fill_add(&w->fill[m], s);
        w->mb_work[m] += w->work[i];
        w->mb[i] = m;
    }
    return 1;
}

// The micro-batches heaviest first; round k gives the next d_dp of them to the groups, the heaviest to
// the group with the least work so far. Each non-empty micro-batch is one item on its group's ranks.
static int wlb_deal(Plan *out, const Wlb *w, const GlobalBatch *b, int64_t d_cp, int32_t d_dp) {
    int32_t M = w->M;
    int32_t *first = bs_calloc((size_t)M + 1, sizeof(int32_t)), *seqs = bs_malloc((size_t)w->n * sizeof(int32_t));
    int32_t *fillp = bs_malloc((size_t)M * sizeof(int32_t)), *mb_order = bs_malloc((size_t)M * sizeof(int32_t));
    int32_t *gorder = bs_malloc((size_t)d_dp * sizeof(int32_t)), *ranks = bs_malloc((size_t)d_cp * sizeof(int32_t));
    double *group_work = bs_calloc((size_t)d_dp, sizeof(double)), *key = bs_malloc((size_t)M * sizeof(double));
    Segment *segs = bs_malloc((size_t)w->n * sizeof(Segment));
    int rc = first && seqs && fillp && mb_order && gorder && ranks && group_work && key && segs ? 0 : -1;
    // the micro-batches' documents, in packing order
    for (int32_t k = 0; rc == 0 && k < w->n_train; k++)
        if (w->mb[w->order[k]] >= 0) first[w->mb[w->order[k]] + 1]++;
    for (int32_t m = 0; rc == 0 && m < M; m++) first[m + 1] += first[m], fillp[m] = first[m];
    for (int32_t k = 0; rc == 0 && k < w->n_train; k++)
        if (w->mb[w->order[k]] >= 0) seqs[fillp[w->mb[w->order[k]]]++] = w->order[k];
    double top = 0;
    for (int32_t m = 0; rc == 0 && m < M; m++) top = fmax(top, w->mb_work[m]);
    for (int32_t m = 0; rc == 0 && m < M; m++) key[m] = top - w->mb_work[m];
    if (rc == 0) rc = policy_order_by_time(key, M, mb_order);
    for (int32_t k = 0; rc == 0 && k * d_dp < M; k++) {
        for (int32_t g = 0; g < d_dp; g++) gorder[g] = g;
        for (int32_t g = 1; g < d_dp; g++) {  // groups by work so far, ascending (insertion sort)
            int32_t x = gorder[g], j = g;
            while (j > 0 && group_work[gorder[j - 1]] > group_work[x]) gorder[j] = gorder[j - 1], j--;
            gorder[j] = x;
        }
        for (int32_t g = 0; rc == 0 && g < d_dp && k * d_dp + g < M; g++) {
            int32_t m = mb_order[k * d_dp + g], grp = gorder[g];
            int n_segs = 0;
            for (int32_t x = first[m]; x < first[m + 1]; x++) segs[n_segs++] = (Segment){seqs[x], 0, b->seqs[seqs[x]].len};
            if (n_segs == 0) continue;  // an empty micro-batch runs nothing
            for (int32_t j = 0; j < d_cp; j++) ranks[j] = grp * (int32_t)d_cp + j;
            if (plan_add_item(out, segs, n_segs, ranks, (int)d_cp, 0.0) < 0) rc = -1;
            group_work[grp] += w->mb_work[m];
        }
    }
    free(first), free(seqs), free(fillp), free(mb_order), free(gorder), free(ranks), free(group_work), free(key), free(segs);
    return rc;
}

int policy_wlb(Plan *out, const GlobalBatch *b, const PlanConfig *cfg, const CostModel *cm) {
    int64_t C = cfg->capacity, d_cp;
    int32_t d_dp;
    if (cfg->carried < 0 || cfg->carried > b->n)
        return bs_fail("wlb: %lld carried documents in a batch of %lld", (long long)cfg->carried, (long long)b->n);
    if (policy_mesh(b, cfg, &d_cp, &d_dp) != 0) return -1;
    if (plan_init(out, b, cfg->n_ranks, C, cfg->pp, "wlb") != 0) return -1;
    if (b->n == 0) return 0;
    int64_t L = d_cp * C, own = 0, train_tokens = 0;
    Wlb w = {.n = (int32_t)b->n};
    w.work = bs_malloc((size_t)w.n * sizeof(double));
    w.delayed = bs_calloc((size_t)w.n, sizeof(int32_t));
    w.order = bs_malloc((size_t)w.n * sizeof(int32_t));
    w.mb = bs_malloc((size_t)w.n * sizeof(int32_t));
    if (!w.work || !w.delayed || !w.order || !w.mb) goto fail;
    for (int32_t i = 0; i < w.n; i++) {
        w.work[i] = doc_work(cm, b->seqs[i].len);
        if (i >= cfg->carried) own += b->seqs[i].len;
    }
    // N: the step's own documents' micro-batches, the release size of every level
    int64_t N = wlb_micro_batches(own, L, d_dp);
    wlb_queue(&w, b, L, N, cfg->flush);
    if (wlb_order(&w) != 0) goto fail;
    for (int32_t k = 0; k < w.n_train; k++) train_tokens += b->seqs[w.order[k]].len;
    // N micro-batches, or as many more as the documents to train need (d_dp at a time)
    int64_t M = wlb_micro_batches(train_tokens, L, d_dp);
    if (M < N) M = N;
    for (;; M += d_dp) {
        if (M > INT32_MAX / 2) {
            bs_fail("%lld micro-batches", (long long)M);
            goto fail;
        }
        if (wlb_reset(&w, (int32_t)M, d_cp) != 0) goto fail;
        if (wlb_pack(&w, b, C, !cfg->flush)) break;  // flushed: a document that fits nowhere gets d_dp more
    }
    for (int32_t i = 0; i < w.n; i++)  // in batch order: the oldest first into the next step
        if (w.delayed[i] && plan_add_delayed(out, i) != 0) goto fail;
    if (wlb_deal(out, &w, b, d_cp, d_dp) != 0) goto fail;
    wlb_free(&w);
    return 0;
fail:
    wlb_free(&w);
    return bs_fail_ctx("wlb");
}
