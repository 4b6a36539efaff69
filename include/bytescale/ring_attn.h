// ring_attn.h: ring attention over one plan item's ranks (DESIGN: docs/runtime.md "Ring attention").
//
// Every member of a ring of D ranks holds its own rows of the item (microbatch.h: chunks m and
// 2D-1-m of every segment) with their global positions and segment ids. Per layer:
//   forward   D steps: attention of the local queries against the K/V block in hand, merged into
//             the result with the online softmax (attn_merge), while the block moves on to the next
//             member and the previous member's block arrives;
//   backward  the same K/V ring, plus a dK/dV ring: each block's partial key gradients travel with
//             it, every member adding its queries' share, and arrive home summed after D steps.
// Messages are non-blocking point-to-point on the one global communicator. Ranks run items in the
// plan's global order, so between two ranks only messages of the current item can be in flight:
// three fixed tags (K/V forward, K/V backward, dK/dV) tell them apart, far below the 32767 that
// MPI guarantees. Between blocks of query rows the kernel calls comm_test so that transfers move
// on while it computes (MPI progresses only inside MPI calls).
#ifndef BYTESCALE_RING_ATTN_H
#define BYTESCALE_RING_ATTN_H

#include <stdint.h>

#include "bytescale/comm.h"
#include "bytescale/llama.h"
#include "bytescale/plan.h"

enum { RING_TAG_FWD_KV = 101, RING_TAG_BWD_KV = 102, RING_TAG_BWD_DKV = 103 };

// Seconds and bytes, summed over every layer and item since the last ring_attn_stats_reset.
typedef struct {
    double compute;     // block compute (attn_forward / attn_backward / merge)
    double wait;        // blocked waiting for a message to arrive or leave
    double bytes_sent;  // K/V and dK/dV bytes this rank sent
    int64_t steps;      // ring steps run
} RingStats;

// A trace hook: called for every block computed and every wait, with start and end times
// (now_seconds). name is a static string. NULL = no tracing.
typedef void (*RingTraceFn)(void *ctx, const char *name, double t0, double t1);

typedef struct {
    Comm *comm;
    AttnShape shape;
    int D, me;            // ring size and this rank's index in the ring order
    int32_t ranks[2];     // previous and next member's global rank
    int64_t *off;         // (D + 1,) member j's rows are pos/seg[off[j] .. off[j+1])
    int32_t *pos, *seg;   // (rows of all members,) every member's layout, for the mask
    int64_t cap_rows;     // room in pos/seg
    int max_rows;         // the most rows any member holds
    // message buffers, each (max_rows, 2 * kv_dim): K rows then V rows of one member
    float *kv[2];         // the block in hand and the one arriving
    float *acc[2];        // backward: dK/dV partial being summed, and the one leaving
    float *inc;           // backward: the partial arriving from the previous member
    float *out_part;      // (max_rows, n_heads, head_dim) forward: one block's result before merging
    float *lse_part;      // (max_rows, n_heads)
    int64_t cap_buf;      // floats allocated in each kv/acc/inc buffer
    int64_t cap_q;        // floats allocated in out_part
    int slice_rows;       // query rows per kernel call between progress calls
    RingStats stats;
    RingTraceFn trace;
    void *trace_ctx;
} RingAttn;

void ring_attn_init(RingAttn *r, Comm *comm, AttnShape shape);
void ring_attn_free(RingAttn *r);
// Set up for item k of plan p, of which comm->rank is a member (D >= 2). Grows buffers if needed.
int ring_attn_prepare(RingAttn *r, const Plan *p, int32_t k);
// The ring across the Ulysses groups of a hybrid item (a2a_attn.h): the item's members in groups of
// u consecutive ones, a ring of n_ranks / u >= 2 parts, part g holding its members' rows back to back;
// this rank (member j of its group) rings with member j of the neighbouring groups, on the heads
// `shape` of its head shard. u = 1 with the model's shape is ring_attn_prepare.
int ring_attn_prepare_groups(RingAttn *r, const Plan *p, int32_t k, int u, AttnShape shape);
// The AttnOps a model uses for this item (collective: it runs even with no local rows).
AttnOps ring_attn_ops(RingAttn *r);

#endif
