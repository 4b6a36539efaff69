// executor.h: the HDP executor - this rank's plan items -> micro-batches -> gradients, and the
// ZeRO-1 gradient sync and optimizer shard (docs/runtime.md).
//
// Every policy's plan runs through the same code: a pack is a micro-batch with local attention, a
// ring is a micro-batch of this rank's chunks with ring attention over the item's ranks, an
// all-to-all (Ulysses) group or a hybrid (a ring of such groups) the same chunks with a2a_attn.h's
// attention. Items run
// in the plan's global order, any number of them per rank (uneven counts are normal).
#ifndef BYTESCALE_EXECUTOR_H
#define BYTESCALE_EXECUTOR_H

#include <stdint.h>

#include "bytescale/a2a_attn.h"
#include "bytescale/comm.h"
#include "bytescale/llama.h"
#include "bytescale/microbatch.h"
#include "bytescale/plan.h"
#include "bytescale/ring_attn.h"

// This rank's rows of one step, all items back to back, read before the step runs (so the reading
// can happen in the background while the previous step trains).
typedef struct {
    int32_t n_items;
    int32_t *item;        // (n_items,) plan item indices, increasing
    int64_t *off;         // (n_items + 1,) item i's rows are [off[i], off[i+1])
    int32_t *tokens;      // (rows,)
    int32_t *targets;     // (rows,) next token or -1
    int32_t *pos;         // (rows,) global position in the sequence
    int32_t *seg;         // (rows,) segment index within the item
    int64_t n_targets;    // rows with a label
    int64_t cap_items, cap_rows;
    uint32_t *scratch;    // (cap_scratch,) one chunk + 1 tokens while reading
    int64_t cap_scratch;
} StepRows;

void step_rows_free(StepRows *r);
// Read rank's rows of every item of p it is a member of: positions and segments, and what `need`
// asks for of the tokens (MB_BOTH, MB_TOKENS, MB_TARGETS or 0: mb_read). -1 + error naming item
// and document.
int step_rows_read(StepRows *r, const Plan *p, int rank, int need, const TokenSource *src);

// What this rank did in one executor run.
typedef struct {
    int32_t items;        // micro-batches run
    int32_t rings;        // of them, ring, all-to-all or hybrid members
    int64_t rows;         // tokens this rank held
    double seconds;       // wall time of all items
    double ring_compute;  // ring attention block compute, and all-to-all items' attention (part of seconds)
    double ring_wait;     // waiting for ring and all-to-all messages (part of seconds)
    double ring_bytes;    // K/V and dK/dV bytes sent, and all-to-all bytes
    double act_peak;      // most activation bytes resident during any item (the model's accounting)
    double offload_bytes; // activation bytes copied out to the offload tier (and back)
    double offload_wait;  // seconds the items waited for the tier's copies (part of seconds)
} ExecStats;

// A trace hook for items (name = "pack" / "ring", t0/t1 from now_seconds); NULL = none.
typedef void (*ExecTraceFn)(void *ctx, const char *name, int32_t item, double t0, double t1);

struct Zero1;

typedef struct {
    Comm *comm;
    Llama *llama;         // not owned; its attention is set per micro-batch
    RingAttn ring;
    A2aAttn a2a;          // all-to-all and hybrid items (its own inner ring: other heads than `ring`'s)
    struct Zero1 *zero;   // not owned; NULL = no gradient sync started during the backward
    ExecTraceFn trace;
    void *trace_ctx;
} Executor;

void executor_init(Executor *e, Comm *comm, Llama *llama);
void executor_free(Executor *e);
// Forward + backward of every item in rows (of plan p), adding the gradients of
// loss_scale * (sum of token losses) into the model's gradients; *loss_sum = that sum over this
// rank's rows. Each micro-batch carries its item's offload ratio to the model (used when the model
// has an offloader, llama.h); one whose resident activations would exceed the model's budget is
// refused before it runs. With e->zero set, the last item's backward starts the reduce-scatter of every
// gradient range as soon as it is final (zero1_start), overlapping it with the layers below. Grows the model's activations when a ring member holds more rows than it was made
// for. -1 + error naming the item.
int executor_run(Executor *e, const Plan *p, const StepRows *rows, float loss_scale, double *loss_sum,
                 ExecStats *st);
// The attention of item k of p for this rank: local for a pack, ring attention for a ring, the
// all-to-all for an a2a or hybrid item (set up for k: other items may have run since). The pipeline
// stage uses it too. *kind_name: "pack", "ring", "a2a" or "hybrid". -1 + error (a block item: the
// engine does not run the block peer's plans).
int executor_attention(Executor *e, const Plan *p, int32_t k, AttnOps *ops, const char **kind_name);
// Zero the ring and all-to-all counters; add them into s (ring_compute, ring_wait, ring_bytes).
void executor_stats_reset(Executor *e);
void executor_stats_add(const Executor *e, ExecStats *s);
// The GradReadyFn an executor (ctx) gives its model during the step's last backward: starts the
// ZeRO-1 reduce-scatter of each finished range (zero1_start). The pipeline stage uses it too.
void executor_grads_ready(void *ctx, size_t begin, size_t end);

// ---- ZeRO-1 -----------------------------------------------------------------------------------------
// The parameter vector is cut into comm->size contiguous shards (comm_split). Gradients are
// summed with a reduce-scatter that leaves each rank the sum of its shard; the optimizer updates
// only that shard; an all-gather brings every rank the whole updated vector.
// The reduce-scatter runs per bucket (the model's gradient ranges in the order the backward
// finishes them, llama_grad_bucket), each a non-blocking collective started as soon as its range
// is final, so all but the last buckets travel while the backward computes.
typedef struct Zero1 {
    int *counts, *displs;   // (size,) the shards
    size_t begin, end;      // this rank's shard
    float *grad;            // (end - begin,) the summed gradient of the shard
    int n_buckets;
    size_t (*bucket)[2];    // (n_buckets,) [begin, end) of the flat vector
    int *bcounts;           // (n_buckets, size) each rank's part of each bucket
    CommReq *reqs;          // (n_buckets,)
    int started;            // buckets started this step (they start in order)
    int failed;             // a start failed (the error is reported by zero1_reduce)
    char err[256];
} Zero1;

int zero1_init(Zero1 *z, const Comm *comm, const Llama *m);
void zero1_free(Zero1 *z);
// The next bucket's range [begin, end) of grads is final: start its reduce-scatter, and test the
// ones in flight so they progress.
void zero1_start(Zero1 *z, Comm *comm, const float *grads, size_t begin, size_t end);
// Start the buckets not started yet and wait for all: z->grad holds the shard's sum. Ready for
// the next step's zero1_start calls.
int zero1_reduce(Zero1 *z, Comm *comm, const float *grads);
// The global gradient norm squared: the shard's sum of squares summed over ranks.
int zero1_sumsq(Zero1 *z, Comm *comm, double *sumsq);
// The same over a 3D job: each shard's sum of squares summed over every process of world, each
// element of the whole model counted once (replicated tensors of m only on tp rank 0).
int zero1_sumsq_global(Zero1 *z, const Llama *m, Comm *world, double *sumsq);
int zero1_gather(Zero1 *z, Comm *comm, float *params);

#endif
