// pipeline.h: one pipeline stage's share of a step: this HDP rank's plan items, forward and
// backward apart, in the 1F1B order the planner replays (docs/runtime.md, "Pipeline stages").
//
// Every stage of HDP rank h runs all of h's items (its layers of them). The order on stage s of a
// pipeline of pp stages is by key (plan_pipeline_slots): the forward of an item of slot q at
// 2 (q + s), its backward at 2 (q + pp) - 1, so stage s runs pp - 1 - s forwards ahead and then
// alternates one forward and one backward, and the last stage runs each backward right after its
// forward. Activations go to the next stage and their gradients back as point-to-point messages on
// the pipe group (their sizes follow the item: T x d_model floats). A ring's members are the same
// stage and TP index of the item's HDP ranks (the hdp group), so a ring runs on every stage, once
// in the forward and once in the backward.
//
// Up to k = pp - s micro-batches are between their forward and their backward on stage s at once
// (cost_pipe_in_flight), so the stage holds k sets of activations (llama_init_view): item i of the
// rank's list uses set i mod k, free again by then because its previous user, item i - k of slot q,
// has its backward (key 2 (q + pp) - 1) before this forward (slot >= q + k, key >= 2 (q + pp)).
// With offloading every set moves its tails through the model's copiers into its own set of the
// tier (offload.h), and each micro-batch is held to the process's budget shared by the k.
#ifndef BYTESCALE_PIPELINE_H
#define BYTESCALE_PIPELINE_H

#include "bytescale/executor.h"
#include "bytescale/parallel.h"

enum { PIPE_TAG_ACT = 201, PIPE_TAG_GRAD = 202 };

typedef struct {
    Executor *exec;        // its model (the stage's shard, activation set 0), ring, ZeRO-1 and trace
    Comm *pipe;            // stage s is rank s
    int stage, pp;
    Llama *views;          // (pp,) activation sets 1 .. k - 1 (made on first use); set 0 is the model
    int *made;             // (pp,) which views exist
    float **x_in;          // (pp,) per set: the activations received from the previous stage (T, d_model)
    int64_t *cap_in;       // (pp,) floats allocated
    float *dy;             // (T, d_model) the gradient received from the next stage
    int64_t cap_dy;
    CommReq *send;         // (pp,) per set: its output's send in flight
    int32_t *slot;         // (n_items of the plan,) pipeline slots
    int64_t cap_slot;
} Pipeline;

// What the stage did in one step, beyond ExecStats.
typedef struct {
    double p2p_wait;   // seconds blocked receiving activations or gradients from a neighbour
    double p2p_bytes;  // bytes this stage sent to its neighbours
    int32_t ops;       // forwards + backwards run
} PipeStats;

int pipeline_init(Pipeline *pl, Executor *e, const Parallel *par);
void pipeline_free(Pipeline *pl);
// Run this HDP rank's rows of plan p on this stage (executor_run's contract: gradients of
// loss_scale x the token losses added into the model's, *loss_sum = this stage's sum, nonzero on
// the last stage only). -1 + error naming the item and stage.
int pipeline_run(Pipeline *pl, const Plan *p, const StepRows *rows, float loss_scale, double *loss_sum, ExecStats *st,
                 PipeStats *ps);

#endif
