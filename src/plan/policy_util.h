// policy_util.h: pieces the policies share (internal to src/plan, not installed).
#ifndef BYTESCALE_POLICY_UTIL_H
#define BYTESCALE_POLICY_UTIL_H

#include <stdint.h>

#include "bytescale/policy.h"

// The largest capacity the planners accept: the best-fit packer keeps one list head per possible
// remaining capacity (4 bytes per token of C).
#define POLICY_MAX_CAPACITY (1ll << 24)

int policy_static(Plan *out, const GlobalBatch *b, const PlanConfig *cfg, const CostModel *cm);
int policy_naive(Plan *out, const GlobalBatch *b, const PlanConfig *cfg, const CostModel *cm);
int policy_naive_eq3min(Plan *out, const GlobalBatch *b, const PlanConfig *cfg, const CostModel *cm);
int policy_balance(Plan *out, const GlobalBatch *b, const PlanConfig *cfg, const CostModel *cm);

// Algorithm 1's sharding: D[i] ranks and offload ratio r[i] for every sequence. s <= C: D = 1,
// r = 0 (a pack). s > C: with offloading, Eq. 3 (cost_min_ranks); without, ceil(s / C) and r = 0.
// -1 + error naming the sequence that fits nowhere and how many ranks it needs.
int policy_shard(const GlobalBatch *b, const PlanConfig *cfg, const CostModel *cm, int32_t *D, double *r);

// Can D ranks hold a sequence of s tokens with capacity C, offloading? cost_offload_ratio, with *r
// rounded as the plan stores it (policy_offload_ratio). 1 and *r when it can, else 0.
int policy_offload_for(const CostModel *cm, int64_t s, int64_t C, int D, double *r);

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

// A binary min-heap of ranks keyed by a double (time or tokens); ties go to the lower rank.
typedef struct {
    double *key;     // (n,) key of each rank
    int32_t *heap;   // (n,) ranks in heap order
    int32_t n;
} RankHeap;

int rankheap_init(RankHeap *h, int32_t n_ranks);  // every key 0
int32_t rankheap_pop(RankHeap *h);                // the rank with the least key
void rankheap_push(RankHeap *h, int32_t rank, double key);
void rankheap_free(RankHeap *h);

// Sort ranks ascending (ring order of a freshly picked set of members).
void policy_sort_ranks(int32_t *ranks, int n);

#endif
