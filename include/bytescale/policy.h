// policy.h: every policy is a planner that turns a global batch into a plan.
//   static   Megatron-style static DP x CP mesh (the baseline)
//   naive    ByteScale Algorithm 1: data-aware sharding + offload ratios, no balancing
//   balance  ByteScale Algorithm 2: DP-Balance (PP-Balance when pp > 1)
//   elastic  bytescale's own: balance, with rings wider than ceil(s/C) where a ring sets the step
// and the peers' schedulers, in their published form (docs/peers.md):
//   megatron-hcp  Megatron-LM's hybrid DP x CP: power-of-two CP groups in waves with barriers
//   wlb           WLB-LLM: workload-aware packing on a static DP x CP mesh, outliers delayed
//   flexsp        FlexSP: heterogeneous Ulysses (all-to-all) groups, at most the heads of a TP shard, from a
//                 MILP (GLPK)
//   blocks        MagiAttention / FCP: sequences cut into blocks, min-heap dispatched over each CP group of
//                 the static mesh's d_cp ranks by causal area; each rank receives the K/V blocks it sees
//   blocks-all    the same with all ranks as one group
// A new policy is one new file in src/plan and one line in the table in policy.c.
#ifndef BYTESCALE_POLICY_H
#define BYTESCALE_POLICY_H

#include "bytescale/batch.h"
#include "bytescale/cost.h"
#include "bytescale/plan.h"
#include "bytescale/export.h"

BS_API_BEGIN

typedef struct {
    int32_t n_ranks;    // HDP ranks
    int64_t capacity;   // C tokens per rank per micro-batch
    int64_t context;    // longest sequence allowed (static: d_cp = ceil(context / C)); 0 = the batch's longest
    int32_t pp;         // pipeline stages (1 = none)
    int offload;        // allow selective offloading (naive, balance, elastic)
    double delta;       // balance, elastic: lag threshold as a fraction of the current max (0 = default)
    int n_buckets;      // balance, elastic: length buckets (0 = default)
    int flush;          // wlb: delay no document (the last step of a run empties the delay queue)
    int64_t carried;    // wlb: the batch's first `carried` sequences are ones earlier steps delayed (the
                        // queue); the rest are the step's own, which alone set its micro-batch count
    int64_t block_size; // blocks, blocks-all: tokens per block B (0 = MagiAttention's default, docs/peers.md)
} PlanConfig;

typedef int (*PolicyFn)(Plan *out, const GlobalBatch *b, const PlanConfig *cfg, const CostModel *cm);

typedef struct {
    const char *name;
    const char *summary;
    PolicyFn fn;
    int peer;    // 1: a peer's scheduler (docs/peers.md); 0: bytescale's own
    const char *no_train;  // why `bytescale train` cannot run its plans; NULL: it runs them
} Policy;

int policy_count(void);
const Policy *policy_at(int i);
const Policy *policy_find(const char *name);  // NULL + error listing the names

// The one vocabulary of policy lists (plan, simulate; docs/planner.md "Policy names"): a comma list of
// names and of the words `own` (bytescale's own policies), `peers` (the peers' schedulers) and `all`
// (both), in any mix; each policy once, in the order first named. Fills names[0 .. *n) with the
// table's names (at most max); -1 + an error naming the unknown word and the known ones.
int policy_expand(const char *list, const char **names, int max, int *n);
// The table's names of one group as "a, b, c": POLICY_OWN, POLICY_PEERS, POLICY_ALL or POLICY_TRAINS
// (what `train` runs). Returns buf.
enum { POLICY_OWN = 1, POLICY_PEERS = 2, POLICY_ALL = 3, POLICY_TRAINS = 4 };
const char *policy_names(char *buf, size_t size, int group);

// Run a policy and validate the result: the one entry point the CLI, simulator and runtime use.
int policy_plan(Plan *out, const char *name, const GlobalBatch *b, const PlanConfig *cfg, const CostModel *cm);

BS_API_END

#endif
