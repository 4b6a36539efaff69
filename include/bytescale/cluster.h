// cluster.h: the modelled GPU cluster: where every HDP rank's devices sit and what a message
// between two of them costs (docs/simulator.md).
//
// Placement. Nodes hold G = gpus_per_node devices; device d lives on node d / G. HDP rank r is a
// whole TP x PP group: it occupies devices [r*tp*pp, (r+1)*tp*pp), and its pipeline stage s the
// tp consecutive devices starting at r*tp*pp + s*tp. tp divides G, so a TP group never straddles
// a node (TP stays inside a node, as in the paper).
//
// Links. Between stage s of rank a and stage s of rank b, device t of one TP group talks to device
// t of the other, every device on its own link, so a message costs bytes_per_device / bw + lat
// with NVLink numbers when both groups are on one node and RDMA numbers otherwise. Every device
// has its own NIC (hw.h: inter_bw is per device) and we assume a non-blocking fabric: concurrent
// messages between distinct device pairs do not slow each other down.
#ifndef BYTESCALE_CLUSTER_H
#define BYTESCALE_CLUSTER_H

#include <stdint.h>

#include "bytescale/hw.h"
#include "bytescale/export.h"

BS_API_BEGIN

typedef struct {
    int n_gpus;          // devices in the cluster
    int gpus_per_node;   // G
    int tp, pp;          // tensor / pipeline degree of every HDP rank
    int n_ranks;         // HDP ranks = n_gpus / (tp * pp)
    double intra_bw;     // bytes/s per device per direction inside a node
    double intra_lat;    // seconds per message inside a node
    double inter_bw;     // bytes/s per device per direction across nodes
    double inter_lat;    // seconds per message across nodes
} Cluster;

// The largest cluster we model: 4M devices (256 x the paper's 16,384), tp and pp at most 1,024
// each. The simulator allocates per (rank, stage) and per device pair, so these bounds keep every
// product of them inside an int and every allocation reasonable.
#define CLUSTER_MAX_GPUS (1 << 22)
#define CLUSTER_MAX_DEGREE (1 << 10)

// Take G and the links from a hardware profile. -1 + error when the shape does not fit
// (n_gpus not a multiple of tp * pp, tp not dividing G, sizes outside [1, the limits above]).
int cluster_init(Cluster *c, const HardwareProfile *hw, int n_gpus, int tp, int pp);

// First device of stage `stage` of HDP rank `rank`, and its node.
int64_t cluster_device(const Cluster *c, int rank, int stage);
int64_t cluster_node(const Cluster *c, int rank, int stage);

// One message of `bytes` (per device) from stage s of rank a to stage t of rank b.
double cluster_msg_time(const Cluster *c, int rank_a, int stage_a, int rank_b, int stage_b, double bytes);

// The slowest hop of a ring: members ranks[0..n) in ring order (ranks[i] sends to ranks[i+1],
// the last to the first), all at pipeline stage `stage`, each sending `bytes` per device.
// A ring steps in lock-step, so its step takes as long as its slowest hop. n < 2: 0.
double cluster_ring_hop_time(const Cluster *c, const int32_t *ranks, int n, int stage, double bytes);

// ZeRO-1 gradient sync of stage `stage` over all HDP ranks with the ring algorithm:
// reduce-scatter then all-gather, 2 (N - 1) steps of bytes / N each over the slowest hop of
// the ring 0 -> 1 -> ... -> N-1 -> 0. `bytes` = gradient bytes per device. N = 1: 0.
double cluster_sync_time(const Cluster *c, int stage, double bytes);

BS_API_END

#endif
