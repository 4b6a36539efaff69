// policy_util.h: pieces the policies share (internal to src/plan, not installed).
#ifndef BYTESCALE_POLICY_UTIL_H
#define BYTESCALE_POLICY_UTIL_H

#include <stddef.h>
#include <stdint.h>

#include "bytescale/policy.h"

// The largest capacity the planners accept: the best-fit packer keeps one list head per possible
// remaining capacity (4 bytes per token of C).
#define POLICY_MAX_CAPACITY (1ll << 24)

int policy_static(Plan *out, const GlobalBatch *b, const PlanConfig *cfg, const CostModel *cm);
int policy_naive(Plan *out, const GlobalBatch *b, const PlanConfig *cfg, const CostModel *cm);
int policy_naive_eq3min(Plan *out, const GlobalBatch *b, const PlanConfig *cfg, const CostModel *cm);
int policy_balance(Plan *out, const GlobalBatch *b, const PlanConfig *cfg, const CostModel *cm);
int policy_elastic(Plan *out, const GlobalBatch *b, const PlanConfig *cfg, const CostModel *cm);
int policy_megatron_hcp(Plan *out, const GlobalBatch *b, const PlanConfig *cfg, const CostModel *cm);
int policy_wlb(Plan *out, const GlobalBatch *b, const PlanConfig *cfg, const CostModel *cm);
int policy_flexsp(Plan *out, const GlobalBatch *b, const PlanConfig *cfg, const CostModel *cm);
int policy_blocks(Plan *out, const GlobalBatch *b, const PlanConfig *cfg, const CostModel *cm);
int policy_blocks_all(Plan *out, const GlobalBatch *b, const PlanConfig *cfg, const CostModel *cm);

// The static mesh's shape for a batch: d_cp = ceil(context / C) (context: cfg->context, or the
// batch's longest sequence), d_dp = n_ranks / d_cp. -1 + error when a sequence is longer than the
// context or d_cp > n_ranks (static, wlb).
int policy_mesh(const GlobalBatch *b, const PlanConfig *cfg, int64_t *d_cp, int32_t *d_dp);

// Algorithm 1's sharding: D[i] ranks and offload ratio r[i] for every sequence. s <= C: D = 1,
// r = 0 (a pack). s > C: with offloading, Eq. 3 (cost_min_ranks); without, ceil(s / C) and r = 0.
// -1 + error naming the sequence that fits nowhere and how many ranks it needs.
int policy_shard(const GlobalBatch *b, const PlanConfig *cfg, const CostModel *cm, int32_t *D, double *r);
// The same for sequence i alone (a caller that makes its own pass over the batch).
int policy_shard_one(const GlobalBatch *b, int64_t i, const PlanConfig *cfg, const CostModel *cm, int32_t *D,
                     double *r);

// Can D ranks hold a sequence of s tokens with capacity C, offloading? cost_offload_ratio, with *r
// rounded as the plan stores it (policy_offload_ratio). 1 and *r when it can, else 0.
int policy_offload_for(const CostModel *cm, int64_t s, int64_t C, int D, double *r);

// What an item of whole sequences on D ranks runs as, chosen by the cost model (balance, elastic):
// a ring, or, where the heads allow it, a Ulysses all-to-all group (a2a) or
// a ring of Ulysses groups (hybrid). t is its cost_item_time / cost_a2a_item_time on each member.
typedef struct {
    double t;
    int32_t a2a;      // 1: an all-to-all group of D (Item.a2a)
    int32_t ulysses;  // u >= 2: a hybrid of D / u groups of u (Item.ulysses); 0: not a hybrid
} ItemChoice;

// The fastest kind for segs on D ranks with offload ratio r (every kind offloads alike, paying the
// copies against its own layer times). A ring when D <= 1 (a pack), or when the head count of a TP
// shard is not known (cm->a2a_heads = 0, a loaded profile: a group's head split could not be
// checked); otherwise an
// all-to-all group when D <= cost_a2a_max and it is faster, or a hybrid of D / u groups of u where u
// divides both D and the query heads (an even head split; 2 <= u < D) and it is faster still. Ties
// go to the ring, then to the all-to-all group, then to the smaller u.
ItemChoice policy_item_choice(const CostModel *cm, const int64_t *segs, int n_segs, int D, double r);

// The time of an item of a given kind (as policy_item_choice reports it): the cost model's
// function for that kind.
double policy_kind_time(const CostModel *cm, const int64_t *segs, int n_segs, int D, double r, int a2a, int ulysses);

// An offload ratio as the plan stores it (a float), never rounded below what Eq. 3 asked for.
double policy_offload_ratio(double r);

// Best-fit bin packing: each length goes into the open bin with the least remaining room that still
// holds it, or into a new bin. Bins are found by remaining room through a 64-ary bitmap over
// [0, capacity] with one stack of bins per room value: O(log64 C) per length.
typedef struct {
    int64_t capacity;
    int32_t *head;       // (capacity + 1,) a bin with that much room, -1 if none
    int32_t *below;      // (cap_bins,) the next bin on the same room stack
    int64_t *room;       // (cap_bins,) remaining room of each bin
    int32_t n_bins, cap_bins;
    uint64_t *bits[6];   // level 0: which room values have a bin; level k+1: which words of level k are non-zero
    int64_t n_words[6];
    int levels;
} BestFit;

int bestfit_init(BestFit *bf, int64_t capacity);
int32_t bestfit_add(BestFit *bf, int64_t len);  // the bin it went into, -1 + error (len > capacity, memory)
void bestfit_free(BestFit *bf);

// A min-heap of ranks keyed by a double (time or tokens); ties go to the lower rank. Every rank
// starts with key 0, and the ranks never popped yet are not in the heap: they are the range
// next_idle .. n_ranks - 1, served in rank order (their key 0 is the least there is, their order the
// tie order). With many more ranks than work most pops are then O(1), and the heap holds only the
// ranks in use. The heap is 4-ary with each key beside its rank (policy_util.c).
typedef struct {
    double key;
    int32_t rank;
} RankEntry;

typedef struct {
    double *key;        // (n_ranks,) key of each rank
    RankEntry *heap;    // (n_ranks,) the ranks pushed back, in heap order
    int32_t n_heap;
    int32_t next_idle;  // ranks next_idle .. n_ranks - 1 have never been popped
    int32_t n_ranks;
    int32_t n;          // ranks in it: n_heap + n_ranks - next_idle
} RankHeap;

int rankheap_init(RankHeap *h, int32_t n_ranks);  // every key 0
int32_t rankheap_pop(RankHeap *h);                // the rank with the least key
void rankheap_push(RankHeap *h, int32_t rank, double key);
// The least rank without taking it out, and then the same as rankheap_pop followed by
// rankheap_push of that rank with a new key, in one pass (its key changes in place): what a list
// scheduler does for every piece of work it hands out. No other heap operation in between.
int32_t rankheap_top(const RankHeap *h);
void rankheap_replace_top(RankHeap *h, double key);
void rankheap_free(RankHeap *h);

// The same queue as a tournament tree (balance's scheduler, which replaces the top for every short
// sequence it hands out): a leaf per rank and in every inner node the least (key, rank) below it, so
// changing a rank's key replays the one path from its leaf to the root (a push, up to the first node
// that already holds the new least). The path is known before any
// comparison is made (its loads overlap) and every step is a branch-free minimum, where a heap's
// sift-down branches on which child is least at every level. Ranks never popped are the idle range
// next_idle .. n_ranks - 1 as in RankHeap (a pop of one is O(1)); out of the tree a leaf holds
// RANKTREE_OUT, above every key. Pops are the same as RankHeap's: (key, rank) is a total order.
typedef struct {
    double *key;           // (n_ranks,) a rank's key when it was last popped (0 before): while it is in the
                           // tree its key is in its leaf only, so a replaced top writes one array less
    unsigned __int128 *node;  // (2 size,) node[size + r]: rank r's leaf; node[i]: the least of node[2i], node[2i+1]
    int32_t size;          // leaves: n_ranks rounded up to a power of two
    int32_t next_idle;     // ranks next_idle .. n_ranks - 1 have never been popped
    int32_t n_ranks;
    int32_t n;             // ranks in it: those in the tree + n_ranks - next_idle
} RankTree;

int ranktree_init(RankTree *t, int32_t n_ranks);  // every key 0
int32_t ranktree_pop(RankTree *t);
void ranktree_push(RankTree *t, int32_t rank, double key);
int32_t ranktree_top(const RankTree *t);
void ranktree_replace_top(RankTree *t, double key);  // rankheap_replace_top's contract
void ranktree_free(RankTree *t);

// plan_finalize, with the batch's two bounds given (bounds[0] plan_lower_bound_pp, bounds[1]
// plan_hdp_bound of the plan's batch, ranks, capacity and pp) instead of computed, or computed when
// bounds is NULL: they depend on the batch alone, and a policy that finalizes several plans of one
// batch (balance with pp > 1, elastic) computes them once (policy_bounds). In plan.c.
int plan_finalize_bounds(Plan *p, const CostModel *cm, const double *bounds);

// bounds[0] and bounds[1] as plan_finalize would compute them for a plan of this batch and config
// (no delayed sequences).
void policy_bounds(const GlobalBatch *b, const PlanConfig *cfg, const CostModel *cm, double bounds[2]);

// Make room in a plan for what a policy knows it will add, so that plan_add_item (which grows the
// arrays by doubling, copying them each time) does not grow them again: at least `items` items,
// `segs` segments and `refs` rank references in all. -1 + error when out of memory.
int policy_plan_reserve(Plan *p, int64_t items, int64_t segs, int64_t refs);

// order[0 .. n) = 0 .. n-1 sorted by key, ascending, ties in index order; keys >= 0 (times). An LSD
// radix sort over the keys' bits (non-negative doubles order as their bit patterns), O(n) per byte
// that differs. -1 + error when out of memory.
int policy_order_by_time(const double *key, int32_t n, int32_t *order);

// order[0 .. n) = 0 .. n-1 sorted by key, descending, ties by tie ascending (tie[i] >= 0, distinct:
// a sequence's index), as a comparator on (key desc, tie asc) would; keys >= 0. -1 + error when out
// of memory.
int policy_order_by_time_desc(const double *key, const int32_t *tie, int32_t n, int32_t *order);

// Sort n items of `size` bytes in place by the double at byte time_at, descending, ties by the
// int32_t at tie_at, ascending (distinct): policy_order_by_time_desc and a gather, for structs a
// comparison sort would move whole at every step. -1 + error when out of memory.
int policy_sort_by_time_desc(void *items, int32_t n, size_t size, size_t time_at, size_t tie_at);

// Sort ranks ascending (ring order of a freshly picked set of members).
void policy_sort_ranks(int32_t *ranks, int n);

// What each member of a ring micro-batch of D ranks holds under the 2D-chunk layout (plan_chunk),
// as sequences are added: the validator's per-member capacity rule, kept incrementally (static, wlb,
// megatron-hcp). A sequence of len tokens gives member i of D: 2 (len / 2D), plus one if chunk i is
// among the first rem = len mod 2D chunks (i < rem), plus one if chunk 2D-1-i is (i >= 2D - rem).
// The common part goes to base; only members [0, min(rem, D)) gain more, so adding a sequence touches
// at most min(len, D) members, and the fullest member afterwards is the old fullest or a touched one.
// No count overflows: each is at most the batch's tokens.
typedef struct {
    int64_t D;
    int64_t base;    // tokens every member holds
    int64_t most;    // the largest extra[i]
    int64_t *extra;  // (D,) member i holds base + extra[i]; the caller allocates it
} RingFill;

void ring_fill_clear(RingFill *f);
// Add a sequence of len tokens; returns what the fullest member then holds.
int64_t ring_fill_add(RingFill *f, int64_t len);
// What the fullest member would hold with a sequence of len tokens more; nothing changes.
int64_t ring_fill_peek(const RingFill *f, int64_t len);

#endif
