// policy_balance.h: balance's list scheduler, shared with elastic (internal to src/plan, not installed).
//
// The batch is prepared once (Eq. 3 sharding, the short sequences sorted longest first) and can then
// be scheduled any number of times: with balance's ring sizes (HDP's rule, D <= ceil(s/C)), or with
// wider rings where elastic asks for them (BalanceWidths). docs/planner.md has the whole story.
#ifndef BYTESCALE_POLICY_BALANCE_H
#define BYTESCALE_POLICY_BALANCE_H

#include <stdint.h>

#include "bytescale/policy.h"
#include "plan/policy_util.h"

typedef struct {
    const GlobalBatch *b;
    const PlanConfig *cfg;
    const CostModel *cm;
    double open_cost;   // what opening a micro-batch adds: one layer_const and attention floor per layer
    int32_t n_long;     // sequences longer than C: each one a ring of its own
    int32_t *long_seq;  // (n_long,) their indices, in batch order
    int64_t *long_len;  // (n_long,) their lengths (the batch's, read in order once)
    int32_t *d_min;     // (n_long,) Eq. 3's fewest ranks for long sequence k (policy_shard_one)
    double *r_min;      // (n_long,) the offload ratio at d_min
    ItemChoice *plain;  // (n_long,) its kind and time on ceil(s/C) ranks, where it fits without offloading:
                        // where every ring's choice starts (ring_key, the first width place_ring costs,
                        // elastic's model), costed once here; t < 0 where there are fewer ranks
    int32_t n_short;    // sequences of at most C tokens, longest first (ties: lower index first)
    int32_t *sidx;      // (n_short,) sequence index
    int64_t *slen;      // (n_short,) length, non-increasing
    double *scost;      // (n_short,) time it adds to a micro-batch (its item time less open_cost)
    const double *bounds;  // (2,) the batch's bounds (policy_bounds) when the caller knows them, else NULL:
                           // balance_best finalizes its plans with them (plan_finalize_bounds)
    // Each long sequence's choice at every width HDP's rule allows, d_min .. min(ceil(s/C), R): the
    // kind and offload ratio place_ring and balance_rings_end cost it at, filled the first time one
    // of them asks (elastic replays the ring phase and schedules again: the same widths each time).
    // NULL unless balance_keep_widths made them.
    int64_t *width_at;     // (n_long + 1,) where long sequence k's widths start in widths[]
    struct WidthChoice *widths;  // (width_at[n_long],)
} BalanceBatch;

// Shard (policy_shard) and sort. -1 + error for a sequence that fits on no ring of cfg->n_ranks.
int balance_prepare(BalanceBatch *bb, const GlobalBatch *b, const PlanConfig *cfg, const CostModel *cm);
void balance_batch_free(BalanceBatch *bb);
// Keep the choice at each width of each long sequence from its first costing on (width_at,
// widths): for a batch that is scheduled or replayed more than once (elastic). 0, or -1 + error.
int balance_keep_widths(BalanceBatch *bb);

// Rings wider than HDP's rule allows (elastic's). With none (NULL) a sequence of s > C tokens runs
// on D in [d_min, ceil(s/C)] ranks, as ByteScale's Algorithm 2 has it.
typedef struct {
    const int32_t *d_max;  // (n,) the widest ring each sequence may take; values below ceil(s/C) mean
                           // ceil(s/C), so 0 is "balance's rule"
    int32_t n_promoted;    // the first n_promoted short sequences (the longest) are not packed: each
                           // runs alone on 1 .. d_max ranks, scheduled with the rings
    const CostModel *wide; // times a ring wider than ceil(s/C) (NULL: the batch's cost model)
} BalanceWidths;

// One run of the list scheduler into out (named `name`, not finalized). pipeline: time the ranks as
// pipelines (pp > 1), else by their per-stage busy time alone.
int balance_schedule(Plan *out, const BalanceBatch *bb, const BalanceWidths *w, int pipeline, const char *name);

// The latest end of a ring in balance's own plan (no widths) when pp = 1, without scheduling it: the
// ring phase replayed on anonymous ranks. balance's makespan is never below it.
int balance_rings_end(const BalanceBatch *bb, double *end);

// A min-heap (by t) of groups of interchangeable ranks: n ranks free from time t. The ring phase
// without naming ranks, as balance_rings_end and elastic's prediction replay it.
typedef struct {
    double t;
    int64_t n;
} RankGroup;
void rank_groups_push(RankGroup *h, int32_t *n, RankGroup g);
RankGroup rank_groups_pop(RankGroup *h, int32_t *n);

// balance's plan for these widths: one run when pp = 1; with pp > 1 both pipeline models, keeping
// the plan whose replayed makespan is shorter. out is finalized (plan_finalize) either way.
int balance_best(Plan *out, const BalanceBatch *bb, const BalanceWidths *w, const char *name);

#endif
