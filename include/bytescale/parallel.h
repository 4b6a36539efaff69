// parallel.h: the 3D layout of a training job: tensor parallelism (TP) x HDP x pipeline stages (PP)
// (docs/runtime.md, "3D layout").
//
// A job of N = T x P x H processes: P pipeline stages, each with H HDP ranks, each a group of T
// tensor-parallel processes. TP is innermost, PP outermost:
//     world rank w = (stage x H + hdp) x T + tp
// so a TP group is T consecutive world ranks (mpirun places consecutive ranks on one node, and TP's
// all-reduces per layer need the fastest link), and one stage's H x T processes are contiguous.
// The plan speaks of H HDP ranks; every stage and every TP rank of HDP rank h runs h's items.
//
// Three kinds of groups, each a communicator made once at start (never one per ring or per step):
//   tp    the T processes of one (stage, hdp): the layers' all-reduces;
//   hdp   the H processes of one (stage, tp): rings (plan rank h = rank h in it), ZeRO-1 over the
//         ranks that hold the same parameters, the gradient sync;
//   pipe  the P processes of one (hdp, tp): activations forward and their gradients back between
//         neighbouring stages (rank s in it = stage s).
#ifndef BYTESCALE_PARALLEL_H
#define BYTESCALE_PARALLEL_H

#include "bytescale/comm.h"
#include "bytescale/cost.h"
#include "bytescale/llama.h"

typedef struct {
    int tp, pp, hdp;               // T, P, H
    int world, rank;               // N = T x P x H, this process's world rank
    int stage, hdp_rank, tp_rank;  // this process's coordinates
    int layer_begin, layer_end;    // this stage's layers
    int *stage_begin;              // (pp + 1,) stage s runs layers [stage_begin[s], stage_begin[s + 1])
    Comm *world_comm;              // not owned
    Comm *tp_comm, *hdp_comm, *pipe_comm;  // owned (comm_free), made by parallel_open
} Parallel;

// The coordinates of world rank `rank` of n processes with tp x pp: -1 + an error with the numbers
// when tp, pp < 1 or tp x pp does not divide n. Groups are not made (parallel_open does).
int parallel_layout(Parallel *p, int n, int rank, int tp, int pp);
// World rank of (stage, hdp, tp).
int parallel_world_rank(const Parallel *p, int stage, int hdp, int tp);
// The layout on comm (collective: every process calls it) and its three groups; layers split over
// the stages by pipeline_split_layers with the cost model cm (NULL: layers evenly).
int parallel_open(Parallel *p, Comm *comm, int tp, int pp, const ModelConfig *mc, const CostModel *cm,
                  int64_t capacity);
void parallel_close(Parallel *p);
// This process's part of the model, and that of (stage, tp) (the same on every HDP rank).
LlamaShard parallel_shard(const Parallel *p);
LlamaShard parallel_shard_of(const Parallel *p, int stage, int tp);
// The whole model's floats in the one layout every checkpoint holds (llama_shard_full), from every
// part: collective over the world; each (stage, tp)'s HDP rank 0 gives its local vector (the
// params, or an optimizer moment gathered over its HDP group) and world rank 0 puts them together
// into full (n_full floats; others may pass NULL). One process: a copy.
int parallel_gather_full(const Parallel *p, const ModelConfig *mc, const float *local, float *full);
// This shard's floats out of a whole model's vector (full, in the full layout) into local.
int parallel_take_local(const ModelConfig *mc, const LlamaShard *sh, const float *full, float *local);
// Floats in the whole model's flat layout.
size_t parallel_full_params(const ModelConfig *mc);
// One line saying which world ranks form the groups (printed at start).
void parallel_describe(const Parallel *p, char *buf, size_t size);

// The stages' layers: stage s runs [begin[s], begin[s + 1]), begin has pp + 1 entries. Balanced by
// the cost model at `tokens` tokens per micro-batch: the first stage also runs the embedding and the
// last the head and the loss (cm->head_*, in layer equivalents), and the layers go one at a time to
// the stage with the least time so far, so that the slowest stage is as fast as it can be. Every
// stage gets >= 1 layer: -1 + error when pp > n_layers. begin NULL: only that check.
int pipeline_split_layers(int n_layers, int pp, const CostModel *cm, int64_t tokens, int *begin);

#endif
