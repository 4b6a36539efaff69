// sim.h: timeline simulation of one training step of a plan on a modelled cluster
// (docs/simulator.md has the model, every assumption and its source, and what it leaves out).
//
// Resources: one per (HDP rank, pipeline stage), i.e. one TP group of devices. Every item of the
// plan becomes 2 * pp operations: a forward on stages 0 .. pp-1, then a backward on stages
// pp-1 .. 0. An operation on a ring item runs on the same stage of all its member ranks at once:
// it starts when every member's stage is free and its input is ready (the previous stage's
// forward, plus the activation hop between stages), and all members finish together (a ring
// steps in lock-step).
//
// Order. Every item gets a slot: 1 + the largest slot of the items before it (in the global
// order) that share a rank with it; slots grow along every rank's schedule and are the same on
// all members of a ring. Stage s of every rank runs its operations sorted by the key
//     forward of item i:  slot(i) + s          backward of item i:  slot(i) + pp - 1/2
// With consecutive slots this is exactly 1F1B (pp - 1 - s warm-up forwards on stage s, then
// alternating); without PP it is forward then backward, item after item. Because the key is
// global, all members of a ring meet the ring at the same point of their order and every
// dependency points to a smaller key, so the schedule can never deadlock.
//
// Cost of one operation of one member, with n = tokens / D on each of the D members, A the exact
// causal area of the item's segments, l = cm->n_layers layers on the stage, phi the forward
// (fwd_fraction) or backward (1 - fwd_fraction) share of the fwd+bwd coefficients:
//   per layer: linear   phi * (lin_token * n + layer_const)
//              attention D blocks of b = phi * (attn_pair * A / D^2 + attn_step), pipelined with D - 1 K/V
//                        transfers x (forward: kv_token * n bytes; backward: K/V and dK/dV,
//                        2 * kv_token * n bytes) over the ring's slowest hop:
//                        b + (D - 1) * max(b, x);  backward adds the last dK/dV hop home
//              offload  l - 2 layers copy r * Act(n) bytes out (forward) and back (backward),
//                        each copy overlapping one layer; the part longer than the layer is exposed
//              TP        with cm->tp > 1, cost_tp_layer_times(n): forward two all-reduces exposed,
//                        backward two, each less the weight gradient it overlaps (comm)
// Between stages: an operation's input is ready the previous stage's end plus one message of n
// tokens (cost_stage_transfer when cm->stage_bw > 0, else the cluster's link between the stages).
// After the last operation of a stage on every rank: the ZeRO-1 gradient sync of that stage
// (cluster_sync_time, or cm->grad_sync when no model is given), then cm->optimizer.
#ifndef BYTESCALE_SIM_H
#define BYTESCALE_SIM_H

#include <stdint.h>
#include <stdio.h>

#include "bytescale/cluster.h"
#include "bytescale/cost.h"
#include "bytescale/hw.h"
#include "bytescale/model.h"
#include "bytescale/plan.h"
#include "bytescale/export.h"

BS_API_BEGIN

typedef struct {
    const CostModel *cm;          // per-layer coefficients of one stage (cm->n_layers = layers / pp)
    const Cluster *cluster;       // placement and links; cluster->n_ranks and pp must match the plan
    const ModelConfig *model;     // optional (NULL): model FLOPs (MFU), gradient bytes, activation hop
    const HardwareProfile *hw;    // optional (NULL): peak FLOP/s (MFU) and element size
    double fwd_fraction;          // forward share of the fwd+bwd compute; 0 = 1/3 (backward = 2x forward)
} SimConfig;

// What one member of an operation spends, seconds (identical on all members of a ring).
typedef struct {
    double compute;        // busy: linear + attention blocks (+ nothing else)
    double comm;           // ring transfers not hidden behind attention blocks, + tp
    double tp;             // the TP all-reduces' exposed part (cost_tp_layer_times x layers), in comm
    double offload;        // offload copies not hidden behind a layer
    double ring_bytes;     // bytes each device of one member sends in this operation
    double offload_bytes;  // bytes each device of one member copies to / from host memory
} SimOpCost;

typedef struct {
    int32_t item;
    int16_t stage;
    int16_t bwd;        // 0 forward, 1 backward
    double ready;       // when its input was there (previous stage, activation hop)
    double start;       // when it started on all members
    SimOpCost cost;     // end = start + compute + comm + offload
} SimOp;

typedef struct {
    double min, median, max;
} SimSpread;

typedef struct {
    int32_t n_ranks, pp, n_res;   // resources: res = rank * pp + stage
    // the step
    double step_time;       // seconds, from the first operation to the end of the optimizer step
    double compute_end;     // the last operation's end (all stages), before gradient sync
    double sync_time;       // the gradient sync of the slowest stage
    double optimizer_time;  // cm->optimizer
    double tokens;          // tokens in the batch
    double tokens_per_s;
    double model_flops;     // 3 x forward FLOPs (exact attention area); 0 without a model
    double mfu;             // model_flops / (step_time * n_gpus * peak); 0 without model and hw
    double ring_bytes;      // bytes all devices sent in ring attention
    double offload_bytes;   // bytes all devices copied to and from host memory
    double exposed_comm;    // sum over resources of ring communication not hidden
    double exposed_offload; // sum over resources of offload copies not hidden
    double exposed_tp;      // sum over resources of TP all-reduce time not hidden (part of exposed_comm)
    double stage_msgs;      // sum over operations of their stage-to-stage message (activations forward,
                            // gradients backward): seconds between the previous stage's end and `ready`
    int32_t n_rings;        // items with D >= 2
    // per resource, seconds: busy + comm + wait = step_time on every resource
    double *busy;           // (n_res,) compute of operations + optimizer
    double *comm;           // (n_res,) exposed ring and offload time + gradient sync
    double *wait;           // (n_res,) waiting for ring members, inputs, other ranks
    double *offload;        // (n_res,) the exposed offload part of comm
    double *stage_sync_start; // (pp,) when stage s's gradient sync began
    double *stage_sync;     // (pp,) its duration
    SimSpread busy_spread, comm_spread, wait_spread;
    // the timeline
    SimOp *ops;             // (n_ops,) in the order they were simulated (a valid global order)
    int32_t n_ops;
    int32_t *res_begin;     // (n_res + 1,) resource k ran ops res_ops[res_begin[k] .. res_begin[k+1])
    int32_t *res_ops;       // in execution order
} SimResult;

// Simulate one step. The plan must be finalized (plan_finalize) for cluster->n_ranks ranks and
// cluster->pp stages. -1 + error on a mismatch.
int sim_run(SimResult *out, const Plan *p, const SimConfig *cfg);
void sim_result_free(SimResult *r);

// The cost of one operation (item, stage, forward/backward) of a finalized plan.
SimOpCost sim_op_cost(const SimConfig *cfg, const Plan *p, int32_t item, int stage, int bwd);

// Model FLOPs of the batch as the plan cuts it: 3 x (linear per token + attention per visible
// pair over every segment's exact causal area + LM head), all layers.
double sim_model_flops(const ModelConfig *m, const Plan *p);

// Chrome trace (JSON array of "X" events in microseconds, viewable in Perfetto): one process per
// HDP rank, one thread per stage, categories compute / comm / offload / wait / sync. At most
// max_ranks ranks are written, evenly spaced, the first and last included (1: the first alone; 0 = 64).
// Written atomically.
int sim_trace_write(const SimResult *r, const Plan *p, const char *path, int max_ranks);

// The step in numbers, one line per field, for a person.
void sim_result_print(FILE *f, const SimResult *r);

// ---- memory (memory.c; docs/simulator.md, "Memory") -------------------------------------------
// Peak device memory of a simulated step, bytes per device of every resource (HDP rank x stage):
// the static part (parameters, gradients, optimizer state: cost_memory's most loaded stage, the
// same on every stage) plus the activation peak of the resource's timeline: walking its operations
// in execution order, a forward adds what its item keeps on one member (cost_rank_act of n =
// tokens / D at the item's offload ratio, without the shared buffers), the item's backward frees
// it; the shared buffers (act_shared_*) count once per resource, sized for its largest micro-batch.
// With pp > 1, 1F1B keeps up to pp - s micro-batches in flight on stage s, and the walk holds them.

typedef struct {
    int32_t rank, stage;    // the resource with the largest peak (the first one, on a tie)
    double act_bytes;       // its activation peak
    double static_bytes;    // parameters, gradients and optimizer state (0 without cfg->model and cfg->hw)
    double peak_bytes;      // static_bytes + act_bytes
} SimMemPeak;

typedef struct {
    int32_t n_res, pp;      // res = rank * pp + stage, as in SimResult
    double static_bytes;    // per device, on every resource
    double *act_peak;       // (n_res,) activation peak of each resource, per device
    SimMemPeak peak;        // the largest over the resources
} SimMemory;

// r must be sim_run's result for p and cfg. -1 + error when it is not, or when cost_memory refuses
// the layout (e.g. tp does not divide the model's heads).
int sim_memory(SimMemory *out, const SimResult *r, const Plan *p, const SimConfig *cfg);
void sim_memory_free(SimMemory *m);
// The peak for a person, e.g. "31.2 GB at rank 0, stage 0 (static 13.6 GB + activations 17.6 GB),
// 39% of mem_bytes 80.0 GB: fits" ("... DOES NOT FIT"; mem_bytes <= 0: "..., mem_bytes unknown").
// Returns buf.
const char *sim_memory_text(char *buf, size_t n, const SimMemPeak *m, double mem_bytes);
// 1 when the peak exceeds a known mem_bytes (> 0); 0 when it fits or mem_bytes is unknown.
int sim_memory_exceeds(const SimMemPeak *m, double mem_bytes);
// 80e9 -> "80.0 GB", 512 -> "512 B": decimal units, for bytes in tables and messages. Returns buf.
const char *sim_bytes_text(char *buf, size_t n, double bytes);

BS_API_END

#endif
