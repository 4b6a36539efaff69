// cluster.c: device placement and link costs of the modelled cluster (see cluster.h).
#include "bytescale/cluster.h"

#include <string.h>

#include "bytescale/error.h"

int cluster_init(Cluster *c, const HardwareProfile *hw, int n_gpus, int tp, int pp) {
    memset(c, 0, sizeof *c);
    if (n_gpus < 1 || n_gpus > CLUSTER_MAX_GPUS)
        return bs_fail("cluster: --gpus must be in [1, %d] (got %d)", CLUSTER_MAX_GPUS, n_gpus);
    if (tp < 1 || pp < 1 || tp > CLUSTER_MAX_DEGREE || pp > CLUSTER_MAX_DEGREE)
        return bs_fail("cluster: tp and pp must be in [1, %d] (got tp %d, pp %d)", CLUSTER_MAX_DEGREE, tp, pp);
    int g = hw->gpus_per_node;
    if (g < 1) return bs_fail("cluster: hardware '%s' has %d GPUs per node", hw->name, g);
    if (tp > g || g % tp != 0)
        return bs_fail("cluster: tp %d must divide the %d GPUs of a node (TP stays inside a node)", tp, g);
    // tp * pp <= 2^20 with the bounds above: no overflow
    if (n_gpus % (tp * pp) != 0)
        return bs_fail("cluster: %d GPUs are not a multiple of tp x pp = %d x %d", n_gpus, tp, pp);
    if (!(hw->intra_bw > 0 && hw->inter_bw > 0 && hw->intra_lat >= 0 && hw->inter_lat >= 0))
        return bs_fail("cluster: hardware '%s' needs positive link bandwidths and latencies >= 0", hw->name);
    c->n_gpus = n_gpus;
    c->gpus_per_node = g;
    c->tp = tp;
    c->pp = pp;
    c->n_ranks = n_gpus / (tp * pp);
    c->intra_bw = hw->intra_bw;
    c->intra_lat = hw->intra_lat;
    c->inter_bw = hw->inter_bw;
    c->inter_lat = hw->inter_lat;
    return 0;
}

int64_t cluster_device(const Cluster *c, int rank, int stage) {
    return (int64_t)rank * c->tp * c->pp + (int64_t)stage * c->tp;
}

int64_t cluster_node(const Cluster *c, int rank, int stage) {
    return cluster_device(c, rank, stage) / c->gpus_per_node;
}

static double link_time(const Cluster *c, int same_node, double bytes) {
    return same_node ? bytes / c->intra_bw + c->intra_lat : bytes / c->inter_bw + c->inter_lat;
}

double cluster_msg_time(const Cluster *c, int rank_a, int stage_a, int rank_b, int stage_b, double bytes) {
    int same = cluster_node(c, rank_a, stage_a) == cluster_node(c, rank_b, stage_b);
    return link_time(c, same, bytes);
}

double cluster_ring_hop_time(const Cluster *c, const int32_t *ranks, int n, int stage, double bytes) {
    if (n < 2) return 0;
    int crosses = 0;
    for (int i = 0; i < n && !crosses; i++) {
        int j = i + 1 == n ? 0 : i + 1;
        crosses = cluster_node(c, ranks[i], stage) != cluster_node(c, ranks[j], stage);
    }
    return link_time(c, !crosses, bytes);
}

double cluster_sync_time(const Cluster *c, int stage, double bytes) {
    int n = c->n_ranks;
    if (n < 2) return 0;
    // the ring 0 -> 1 -> ... -> n-1 -> 0: it stays on one node only if its two ends share a node
    // (ranks are laid out in order, so the first and last stage-s devices span all the others)
    int same = cluster_node(c, 0, stage) == cluster_node(c, n - 1, stage);
    double step = link_time(c, same, bytes / n);
    return 2.0 * (n - 1) * step;
}
