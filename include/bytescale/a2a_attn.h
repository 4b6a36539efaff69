// a2a_attn.h: all-to-all (Ulysses) attention over one plan item's ranks, and the hybrid: a ring of
// Ulysses groups (DESIGN: docs/runtime.md "All-to-all and hybrid attention").
//
// Every member holds its own rows of the item (microbatch.h: chunks m and 2D-1-m of every segment,
// the same layout as a ring's) with every head of its TP shard. A Ulysses group of u members splits
// the H query heads of the shard evenly: member j computes heads [j H / u, (j + 1) H / u) (H / u
// each when u divides H, sizes differing by one otherwise; u <= H). Per layer:
//   forward   all-to-all: every member sends each other member that member's heads of Q, K, V for
//             its own rows, and receives its heads for every row of the group (scattered by heads,
//             gathered by sequence); attention of the group's rows on its heads; the output and its
//             log-sum-exp go back to the rows' owners by a second all-to-all;
//   backward  the same all-to-all of Q, K, V, the output's gradient, lse and delta; the attention's
//             backward on the member's heads; dQ, dK, dV back to the owners, where dK/dV of a K/V
//             head that several members received are summed.
// K/V heads follow their query heads (GQA, query head h reads K/V head h / (H / H_kv)): a member
// receives the K/V heads its query heads read; when u exceeds the shard's K/V heads, several members
// receive the same head (replicas) and their dK/dV are summed back at its owner. Where a member's
// heads do not line up with whole GQA groups (H = 12, H_kv = 4, u = 6: heads 2, 3 read K/V 0, 1), it
// receives one K/V head per query head, so that the attention kernel's GQA rule holds.
//
// A hybrid item (Item.ulysses = u) is a ring of r = n_ranks / u such groups: after the all-to-all
// each member holds its group's rows on its heads, and ring attention (ring_attn.h, the same code as
// a ring item's) runs across the groups between the members with the same index j, on those heads.
//
// Messages: non-blocking point-to-point on the one communicator the rings use (the HDP group), on
// fixed tags; no communicator is made per group. Ranks run items in the plan's global order, so
// between two ranks only messages of the current item are in flight, and within it every member
// posts each exchange's sends and receives in the same order (MPI keeps the order between one pair
// on one tag): the tags need only tell an item's exchanges apart.
#ifndef BYTESCALE_A2A_ATTN_H
#define BYTESCALE_A2A_ATTN_H

#include <stdint.h>

#include "bytescale/comm.h"
#include "bytescale/llama.h"
#include "bytescale/plan.h"
#include "bytescale/ring_attn.h"

enum { A2A_TAG_FWD = 111, A2A_TAG_OUT = 112, A2A_TAG_BWD = 113, A2A_TAG_GRAD = 114 };

// Seconds and bytes, summed over every layer and item since the last reset (the inner ring's are
// in ring.stats).
typedef struct {
    double compute;     // the attention kernels (a2a items; the ring's own for hybrids)
    double wait;        // blocked in the all-to-all exchanges (packing included)
    double bytes_sent;  // bytes this rank sent in the all-to-alls
} A2aStats;

typedef struct {
    Comm *comm;
    AttnShape shape;      // this TP shard's heads
    int u, me;            // group size and this rank's index in its group
    int hybrid;           // 1: a ring of groups runs between the group's all-to-alls
    int32_t *ranks;       // (u,) the group's members' ranks in comm
    int64_t *off;         // (u + 1,) member d's rows are the group's rows [off[d], off[d + 1])
    int32_t *pos, *seg;   // (group rows,) every member's layout, member after member
    int *qh;              // (u, H) query heads of member d: qh[d * H + i], i < nq[d]
    int *kvh;             // (u, H) K/V heads member d receives: kvh[d * H + i], i < nk[d]
    int *nq, *nk;         // (u,)
    // this member's heads of the group's rows (rows = off[u]), head_dim hd:
    float *q, *out, *dout, *dq;  // (rows, nq[me], hd)
    float *k, *v, *dk, *dv;      // (rows, nk[me], hd)
    float *lse, *delta;          // (rows, nq[me])
    float *send, *recv;          // packed rows in flight: this member's rows of every other member's heads
    float *buf;                  // the arena every float buffer above points into
    int64_t cap_buf, cap_rows;
    int cap_u;
    CommReq *reqs;        // (12 u,) one exchange's requests
    RingAttn ring;        // hybrid: the ring across groups on this member's heads
    A2aStats stats;
} A2aAttn;

void a2a_attn_init(A2aAttn *a, Comm *comm, AttnShape shape);
void a2a_attn_free(A2aAttn *a);
// Set up for item k of plan p (ITEM_A2A or ITEM_HYBRID), of which comm->rank is a member. Grows
// buffers if needed. -1 + error (the caller names the item) when the group has more members than
// the shard has query heads.
int a2a_attn_prepare(A2aAttn *a, const Plan *p, int32_t k);
// The AttnOps a model uses for this item (collective: it runs even with no local rows).
AttnOps a2a_attn_ops(A2aAttn *a);

#endif
