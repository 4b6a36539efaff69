// plan.h: the plan, the one data structure every part of bytescale shares (docs/architecture.md).
//
// A plan assigns a global batch to n_ranks HDP ranks as a list of items:
//   - a pack: whole sequences (segments) on one rank, total length <= capacity;
//   - a ring: subsequences split over D >= 2 ranks with the symmetric 2D-chunk layout (rank i of
//     the ring holds chunks i and 2D-1-i of every segment), with an offload ratio.
// Items are stored in the global order: item k is the k-th in that order, and every rank runs its
// items in increasing k. A rank then only ever waits for the members of its current ring and no
// two ranks can wait on each other in a cycle, so no barriers are needed. (A plan may still ask for
// them: the peers' schedulers of docs/peers.md run in waves separated by barriers, and an item may
// be a Ulysses all-to-all group or a block item (plan_item_kind) instead of a ring; bytescale's own
// policies use none of these.)
// The per-rank schedules (rank_begin / rank_items) are derived from the items by plan_finalize.
#ifndef BYTESCALE_PLAN_H
#define BYTESCALE_PLAN_H

#include <stddef.h>
#include <stdint.h>

#include "bytescale/batch.h"
#include "bytescale/cost.h"
#include "bytescale/export.h"

BS_API_BEGIN

typedef struct {
    int32_t seq;    // index into the plan's batch
    int64_t start;  // first token of the subsequence within the sequence
    int64_t len;    // tokens
} Segment;

typedef struct {
    int32_t seg_begin, n_segs;    // plan->segs[seg_begin .. seg_begin + n_segs)
    int32_t rank_begin, n_ranks;  // plan->ranks[rank_begin .. + n_ranks): ring order; 1 = a pack
    float offload;                // offload ratio r in [0, 1]
    int32_t a2a;                  // 1: a Ulysses all-to-all group (flexsp, docs/peers.md) instead of a
                                  // ring: same tokens per member, all-to-all traffic; 0: ring or pack
    int32_t ulysses;              // a hybrid item (ITEM_HYBRID): a ring of n_ranks / ulysses Ulysses groups of
                                  // `ulysses` consecutive members each (2 <= ulysses < n_ranks, dividing it);
                                  // 0: not a hybrid. Every member holds the 2D-chunk layout's rows (plan_chunk
                                  // with D = n_ranks), so group g holds group chunks g and 2r-1-g of a ring of r
    int64_t tokens;               // sum of segment lengths (tokens per rank = tokens / n_ranks)
    double est_time;              // cost_item_time of this item, seconds per member rank
} Item;

typedef struct {
    int32_t n_ranks;   // HDP ranks (each a TP x PP group of devices)
    int32_t pp;        // pipeline stages per HDP rank (1 = no PP)
    int64_t capacity;  // C: tokens a rank holds in one micro-batch without offloading
    char policy[24];   // which planner made it

    GlobalBatch batch;  // owned copy of the sequences

    Item *items;       // (n_items,) in global order
    int32_t n_items, cap_items;
    Segment *segs;     // (n_segs,)
    int32_t n_segs, cap_segs;
    int32_t *ranks;    // (n_refs,) ring members of every item
    int32_t n_refs, cap_refs;

    // derived by plan_finalize
    int32_t *rank_begin;   // (n_ranks + 1,) rank r runs rank_items[rank_begin[r] .. rank_begin[r+1])
    int32_t *rank_items;   // (n_refs,) item indices, increasing per rank
    double *rank_busy;     // (n_ranks,) sum of est_time of the rank's items (one stage's busy time)
    double makespan;       // estimated step compute time: pp = 1, items started in global order as
                           // soon as all their members are free; pp > 1, the simulator's pipeline
                           // schedule (1F1B by slot keys, docs/planner.md) with forward est_time / 3
                           // and backward 2 est_time / 3 on every stage, fill and drain included
    double lower_bound;    // plan_lower_bound_pp of the batch (0 without a cost model)
    double hdp_bound;      // plan_hdp_bound of the batch (0 without a cost model)

    // Added with the peers' policies (docs/peers.md); empty for bytescale's own. Both bounds and the
    // simulator's token count leave the delayed sequences out.
    int32_t *barriers;     // (n_barriers,) increasing item indices in (0, n_items): no item from
                           // barriers[w] on starts before every earlier item has ended on all its
                           // ranks (megatron-hcp's waves: a wave ends for everyone with its slowest rank)
    int32_t n_barriers, cap_barriers;
    int32_t *delayed;      // (n_delayed,) increasing sequence indices this step does not train (wlb's
                           // delay queue): they are in no item; the caller puts them into a later batch
    int32_t n_delayed, cap_delayed;
    int32_t *seg_owner;    // (n_segs,) or NULL (no block item: every plan but the block peer's): for a
                           // segment of a block item (ITEM_BLOCKS), the member (index into its item's
                           // ranks) that owns the block; -1 for the segments of every other item
    int32_t cap_owner;
} Plan;

// What an item is. A block item (the block peer, docs/peers.md) is a CP group's whole micro-batch:
// its segments are blocks of its sequences, each owned by one member (Plan.seg_owner), and every
// member receives from their owners the K/V blocks its query blocks see (plan_blocks_loads); no ring.
typedef enum { ITEM_RING = 0, ITEM_A2A = 1, ITEM_BLOCKS = 2, ITEM_HYBRID = 3 } ItemKind;  // ITEM_RING: a ring or a pack
ItemKind plan_item_kind(const Plan *p, int32_t item);

int plan_init(Plan *p, const GlobalBatch *b, int32_t n_ranks, int64_t capacity, int32_t pp, const char *policy);
void plan_free(Plan *p);
// Append an item at the end of the global order. Returns its index, or -1 + error.
int32_t plan_add_item(Plan *p, const Segment *segs, int n_segs, const int32_t *ranks, int n_ranks, double offload);
// Append a block item: segment i (a block) is owned by member owners[i] of ranks. -1 + error.
int32_t plan_add_blocks_item(Plan *p, const Segment *segs, int n_segs, const int32_t *ranks, int n_ranks,
                             const int32_t *owners);
// What each member of block item `item` computes and receives (cost.h BlockLoad), derived from the
// owners: a member's query block sees the blocks of its sequence at or before it; those another member
// owns it receives (K/V forward, again backward) and sends their dK/dV back to the owner.
// node_of(rank, ctx) names a rank's node (NULL: every rank its own). loads: (n_ranks,).
// O(blocks log blocks + members log members). -1 + error.
int plan_blocks_loads(const Plan *p, int32_t item, int64_t (*node_of)(int32_t rank, const void *ctx),
                      const void *ctx, BlockLoad *loads);
// plan_validate's rules for block item `item`: owners in range, each member's tokens <= capacity, whole
// sequences (each one's blocks cover it once), no offload. -1 + error naming the item.
int plan_blocks_check(const Plan *p, int32_t item);
// A barrier before the next item plan_add_item appends (a second one at the same place is ignored).
int plan_add_barrier(Plan *p);
// Mark sequence `seq` as delayed to a later step (indices must come increasing). -1 + error.
int plan_add_delayed(Plan *p, int32_t seq);
// Derive per-rank schedules, estimated times (cost model), busy times, makespan and both bounds
// (cm = NULL: the items' est_time stand, the bounds are left as they are).
int plan_finalize(Plan *p, const CostModel *cm);

// The pipeline slot of every item (slot has n_items entries): 1 + the largest slot of the earlier
// items (global order) that share a rank with it, 0 for an item that shares none. With pp stages,
// stage s runs the forward of an item of slot q at key 2 (q + s) and its backward at key
// 2 (q + pp) - 1, in increasing key: the 1F1B schedule the makespan replays and the runtime's
// pipeline executes (docs/planner.md, "The makespan with pipelines"). -1 + error on no memory.
int plan_pipeline_slots(const Plan *p, int32_t *slot);

// Check everything the executor relies on: every token of the batch exactly once (none of a delayed
// sequence); barriers increasing inside the item list; segments inside
// their sequences; rank sets distinct and in range; packs within capacity; every ring member holds
// at most capacity tokens under the 2D-chunk layout (more only with offload r > 0, then Eq. 3);
// offload in [0, 1]; per-rank schedules increasing in the global order. -1 + error naming the first problem (item, rank, sequence).
int plan_validate(const Plan *p, const CostModel *cm);

// The symmetric 2D-chunk layout: chunk j (0 <= j < 2D) of a subsequence of len tokens is
// [*start, *start + *n) relative to the subsequence; sizes differ by at most one token.
void plan_chunk(int64_t len, int D, int j, int64_t *start, int64_t *n);

// A bound no plan can beat: max(total work / ranks, the largest indivisible work), seconds, for
// ranks of one pipeline stage (pp = 1). docs/planner.md, "The bounds".
double plan_lower_bound(const GlobalBatch *b, const CostModel *cm, int32_t n_ranks, int64_t capacity);
// The same with pp stages per rank: the indivisible work runs through all pp stages forward and back
// (pp x its per-stage time) and every busy rank pays at least (pp - 1) x l x layer_const of fill and
// drain. pp = 1 gives plan_lower_bound exactly.
double plan_lower_bound_pp(const GlobalBatch *b, const CostModel *cm, int32_t n_ranks, int64_t capacity,
                           int32_t pp);
// The HDP-aware bound: as plan_lower_bound_pp, for plans that follow HDP's rule that a sequence of s
// tokens runs on at most ceil(s / C) ranks (packs of whole sequences of <= C tokens, one ring per
// longer sequence): a long sequence's work is its ring time on such a ring (D x per-rank time,
// ring and per-layer overheads included) and the indivisible time is the slowest sequence at its
// fastest admissible ring size. Never below plan_lower_bound_pp; the 5% target applies to it.
double plan_hdp_bound(const GlobalBatch *b, const CostModel *cm, int32_t n_ranks, int64_t capacity, int32_t pp);
// Both in one pass over the batch, each sequence's work computed once for both: *lower =
// plan_lower_bound_pp and *hdp = plan_hdp_bound, bit for bit (either may be NULL).
void plan_bounds(const GlobalBatch *b, const CostModel *cm, int32_t n_ranks, int64_t capacity, int32_t pp,
                 double *lower, double *hdp);
// One sequence of s tokens alone on D ranks at its fastest kind without offloading: a ring, or where
// the head count of a TP shard is known (cm->a2a_heads) an all-to-all group (D <= the heads) or a
// hybrid of D / u groups of u (u dividing D and the heads). Both bounds time the longest by it.
double plan_fastest_item(const CostModel *cm, int64_t s, int D);

// The compact binary form the planning rank broadcasts (plan_wire.c). plan_pack allocates *buf
// (free it); plan_unpack makes a finalized, validated plan or refuses a damaged message (-1 + error).
int plan_pack(const Plan *p, uint8_t **buf, size_t *size);
int plan_unpack(Plan *p, const uint8_t *buf, size_t size);

// Plan files (docs/plan-format.md).
int plan_write_json(const Plan *p, const char *path);
int plan_read_json(Plan *p, const char *path);
// Read, finalize and validate with a cost model: est_time, makespan and lower_bound are recomputed
// and rings that offload are checked against Eq. 3. plan_read_json is this with cm = NULL: the
// file's est_time and lower_bound are kept and the cost-dependent checks are skipped.
int plan_read_json_cm(Plan *p, const char *path, const CostModel *cm);

// What a person wants to know about a finalized plan (the `bytescale plan` summary).
enum { PLAN_HIST_BINS = 16 };
typedef struct {
    int32_t n_packs;        // items on one rank that do not offload
    int32_t n_rings;        // items on >= 2 ranks
    int32_t ring_hist[PLAN_HIST_BINS];  // items by ring size: [0] 1, [1] 2, [2] 3-4, [3] 5-8, ... [k] 2^(k-1)+1 .. 2^k
    int32_t idle_ranks;     // ranks that run no item
    double busy_min, busy_median, busy_max;  // rank_busy over all ranks, seconds
    double ring_bytes;      // K/V bytes all rings move in one step: forward K/V, backward K/V + dK/dV, all
                            // layers of all pp stages, one device of each TP group (cm->kv_token is per device);
                            // an all-to-all group (Item.a2a) counts its Q, K, V and output as the simulator does
    int32_t n_long;         // rings and single-rank items that offload: where an offload ratio applies
    int32_t n_offload;      // of those, items with offload > 0
    double offload_min, offload_mean, offload_max;  // offload ratio over the n_long items (0 if none)
} PlanStats;
int plan_stats(const Plan *p, const CostModel *cm, PlanStats *out);

BS_API_END

#endif
