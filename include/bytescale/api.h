// api.h: the flat API: the planner and the simulator behind opaque handles, plain numbers and arrays
// the caller owns. It is what the Python package (python/bytescale, ctypes) calls, and it suits any
// program that would rather not depend on the layout of Plan, CostModel or SimResult; C programs
// may mix it with the struct API freely (a Plan * from here is an ordinary finalized Plan).
//
// Conventions, as in the rest of the library: a function that fails returns -1 (or NULL) and leaves
// a message in bs_errmsg() naming the argument or the file ("ranks: 0 is out of range [1, 1048576]").
// The argument names in messages are the Python package's keyword names. Integer arguments are all
// int64_t, so that a binding passes one integer type and the range checks see the caller's real value
// (a narrower type would wrap first). Nothing prints or exits.
//
// The functions live in three layers: cost models, batches and plans in src/plan/plan_api.c (bs_plan),
// the simulator in src/sim/sim_api.c (bs_sim), the BLAS check in src/nn/blas_core.c (bs_nn).
// docs/python.md describes them through the Python API.
#ifndef BYTESCALE_API_H
#define BYTESCALE_API_H

#include <stddef.h>
#include <stdint.h>

#include "bytescale/cost.h"
#include "bytescale/export.h"
#include "bytescale/plan.h"

// The library's version, "MAJOR.MINOR.PATCH" (the project's version in CMakeLists.txt; the shared
// library's SONAME carries MAJOR).
BS_API const char *bs_version(void);

// The OPENBLAS_CORETYPE this machine should run, "SkylakeX" or "Haswell", when the OpenBLAS this
// library loaded fell back to kernels older than the CPU (a CPU model newer than its table: Debian 12's
// OpenBLAS on Intel's Emerald Rapids); NULL when OpenBLAS's own choice stands. OpenBLAS reads the
// variable only when it is loaded, so it is for the environment of processes yet to start
// (docs/training.md, "BLAS kernels").
BS_API const char *bs_blas_coretype(void);

// ---- catalogues --------------------------------------------------------------------------------
// The i-th policy, model and built-in hardware profile (0 <= i < count), NULL when out of range.
// *summary (may be NULL) receives the policy's one-line description.
BS_API int bs_policy_count(void);
BS_API const char *bs_policy_name(int i, const char **summary);
// Why `bytescale train` cannot run the i-th policy's plans; NULL when it runs them (or i is out of range).
BS_API const char *bs_policy_no_train(int i);
BS_API int bs_model_count(void);
BS_API const char *bs_model_name(int i);
BS_API int bs_hardware_count(void);
BS_API const char *bs_hardware_name(int i);

// ---- cost models -------------------------------------------------------------------------------
// Derived from a catalogue model and a hardware profile (a built-in name, or a profile JSON file as
// hw_resolve reads it) for `ranks` HDP ranks of tp x pp devices with capacity C, as `bytescale plan`
// derives it. Free with bs_cost_free.
BS_API CostModel *bs_cost_derive(const char *model, const char *hardware, int64_t tp, int64_t pp, int64_t ranks,
                                 int64_t capacity);
// Read from a cost-model file (`bytescale profile`, docs/profile.md).
BS_API CostModel *bs_cost_load(const char *path);
BS_API void bs_cost_free(CostModel *cm);

// ---- batches -------------------------------------------------------------------------------------
// Sample a batch from a length distribution (batch.h: "byted", "github", "uniform:LO:HI", ...) as
// `bytescale plan --dist` does: sequences until `tokens` are reached, then cut to `context` (0 = no
// cut). Writes at most cap lengths into lengths[] (may be NULL with cap 0) and returns how many the
// batch has, so a first call with cap 0 sizes the array; -1 + error.
BS_API int64_t bs_batch_sample(const char *dist, uint64_t seed, int64_t tokens, int64_t context, int64_t *lengths,
                               int64_t cap);

// ---- planning ------------------------------------------------------------------------------------
// Plan a batch of n sequences with the given lengths (ids 0 .. n-1 in this order, no token source)
// with a policy, exactly as `bytescale plan --lengths FILE` does: sequences longer than context are
// cut into context-long pieces that keep their id (context 0: nothing is cut, and the static mesh
// sizes its rings for the batch's longest sequence). The plan is finalized and validated. Free
// with bs_plan_free. Limits: ranks in [1, 2^20], pp in [1, 1024], capacity in [1, 2^24].
BS_API Plan *bs_plan_lengths(const int64_t *lengths, int64_t n, const char *policy, int64_t ranks, int64_t capacity,
                             int64_t context, int64_t pp, int offload, const CostModel *cm);
// Read a plan file (docs/plan-format.md); cm NULL keeps the file's estimates (plan_read_json_cm).
BS_API Plan *bs_plan_read(const char *path, const CostModel *cm);
// Write a plan file, atomically (plan_write_json).
BS_API int bs_plan_write(const Plan *p, const char *path);
BS_API void bs_plan_free(Plan *p);

// A plan's numbers. The caller passes sizeof(BsPlanInfo) as `size`: a binding built against another
// layout is refused instead of reading past the struct.
typedef struct {
    int64_t n_ranks, pp, capacity;
    int64_t n_seqs, n_tokens;  // the batch as planned (after cutting to the context)
    int64_t n_items, n_segs, n_refs;  // items; segments of all items; ring memberships (sum of item sizes)
    int64_t n_barriers, n_delayed;    // the peers' Plan.barriers and Plan.delayed (docs/peers.md); 0 for the rest
    double makespan, lower_bound, hdp_bound;  // seconds (plan.h)
    char policy[24];
} BsPlanInfo;
BS_API int bs_plan_info(const Plan *p, BsPlanInfo *out, size_t size);

// What `bytescale plan` prints about a plan (plan_stats; the ring-size histogram left out). ring_bytes
// needs the cost model (cm NULL: 0). size = sizeof(BsPlanStats), as above.
typedef struct {
    int64_t n_packs, n_rings, idle_ranks, n_long, n_offload;
    double busy_min, busy_median, busy_max, ring_bytes, offload_min, offload_mean, offload_max;
} BsPlanStats;
BS_API int bs_plan_stats(const Plan *p, const CostModel *cm, BsPlanStats *out, size_t size);

// The plan's arrays, copied into arrays the caller allocated with the sizes bs_plan_info gives
// (n_seqs, n_items, n_segs, n_refs, n_ranks). Any pointer may be NULL to skip that array.
BS_API int bs_plan_sequences(const Plan *p, int64_t *id, int64_t *len, int64_t *src);
// Item k holds segments seg_begin[k] .. + n_segs[k] and ring members members[rank_begin[k] .. + n_ranks[k]),
// in ring order.
BS_API int bs_plan_items(const Plan *p, int32_t *seg_begin, int32_t *n_segs, int32_t *rank_begin, int32_t *n_ranks,
                         double *offload, int64_t *tokens, double *est_time);
BS_API int bs_plan_segments(const Plan *p, int32_t *seq, int64_t *start, int64_t *len);
BS_API int bs_plan_members(const Plan *p, int32_t *ranks);
// Per-rank schedules: rank r runs items rank_items[rank_begin[r] .. rank_begin[r+1]) in this order
// (the global order); rank_begin has n_ranks + 1 entries, rank_items n_refs, rank_busy n_ranks.
BS_API int bs_plan_schedules(const Plan *p, int32_t *rank_begin, int32_t *rank_items, double *rank_busy);
// The peers' plan fields (docs/peers.md, plan.h): barriers (n_barriers item indices where a wave
// starts, megatron-hcp), delayed (n_delayed sequence indices this step does not train, wlb) and a2a
// (n_items: 1 where the item is a Ulysses all-to-all group, flexsp; else 0).
BS_API int bs_plan_peers(const Plan *p, int32_t *barriers, int32_t *delayed, int32_t *a2a);
// The hybrid items' Ulysses group sizes (plan.h Item.ulysses): ulysses (n_items) is u >= 2 where item k
// is a ring of n_ranks[k] / u Ulysses groups of u consecutive members (in its ring order), else 0.
BS_API int bs_plan_ulysses(const Plan *p, int32_t *ulysses);
// The block peer's owners (docs/peers.md "blocks"): owners (n_segs) is, for a segment of a block item,
// the member (index into its item's ranks) that owns it; -1 for every other segment.
BS_API int bs_plan_owners(const Plan *p, int32_t *owners);

// The token ranges rank `rank` holds, in the order it runs them: for each of its items in the global
// order, for each segment of the item, the member's part of the segment: the whole segment on one
// rank; on a ring of D ranks, member i's chunks i and 2D-1-i of the symmetric 2D-chunk layout
// (plan_chunk), as one range when they touch (i = D-1), empty chunks left out; in a block item
// (blocks), the blocks the member owns. Range j is tokens
// [start[j], start[j] + len[j]) of the batch's sequence seq[j] (an index into the plan's sequences),
// in item item[j]. rank = -1: every rank's ranges, rank 0 first; rank_of[j] says whose (may be
// NULL). Writes at most cap ranges and returns how many there are (a first call with cap 0 and NULL
// arrays sizes them); -1 + error.
BS_API int64_t bs_plan_chunks(const Plan *p, int64_t rank, int32_t *rank_of, int32_t *item, int32_t *seq,
                              int64_t *start, int64_t *len, int64_t cap);

// ---- simulation (src/sim/sim_api.c) ---------------------------------------------------------------
// One step of a plan on a modelled cluster, as `bytescale simulate --plan FILE`: `gpus` devices (0:
// the plan's ranks x tp x pp) of the hardware profile, tp devices per pipeline stage, the plan's pp;
// the cost model cm, or NULL to derive it from model and hardware for the plan's capacity. The
// simulator works on its own copy of the plan (finalized with that cost model); p is not changed.
typedef struct BsSim BsSim;
BS_API BsSim *bs_simulate(const Plan *p, const char *model, const char *hardware, int64_t tp, int64_t gpus,
                          const CostModel *cm);
BS_API void bs_sim_free(BsSim *s);

// The step in numbers (sim.h SimResult); size = sizeof(BsSimInfo), as for BsPlanInfo.
typedef struct {
    int64_t n_gpus, n_ranks, pp, n_res, n_rings, n_ops;
    double step_time, compute_end, sync_time, optimizer_time;  // seconds
    double tokens, tokens_per_s, model_flops, mfu;
    double ring_bytes, offload_bytes, exposed_comm, exposed_offload;
} BsSimInfo;
BS_API int bs_sim_info(const BsSim *s, BsSimInfo *out, size_t size);
// Per resource (res = rank * pp + stage, n_res of each), seconds: busy + comm + wait = step_time;
// offload is the part of comm that is offload copies. Any pointer may be NULL.
BS_API int bs_sim_resources(const BsSim *s, double *busy, double *comm, double *wait, double *offload);
// A Chrome trace of the step (sim_trace_write): max_ranks ranks shown, 0 = 64.
BS_API int bs_sim_trace(const BsSim *s, const char *path, int64_t max_ranks);

#endif
