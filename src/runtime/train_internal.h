// train_internal.h: what the trainer's files share and nobody else needs (train.c, train_prefetch.c,
// train_ckpt.c, train_run.c).
#ifndef BYTESCALE_TRAIN_INTERNAL_H
#define BYTESCALE_TRAIN_INTERNAL_H

#include <string.h>

#include "bytescale/train.h"

// Whether the run's plans may offload (--offload-tier other than off). Here, not in train.c: the
// planning in train_prefetch.c asks it too, and train_prefetch.c must not need train.c.
static inline int train_plans_offload(const TrainConfig *c) { return strcmp(c->offload_tier, "off") != 0; }
// Rank 0: plan batch b with the run's policy for all ranks, validate it and pack it into t->wire.
int train_plan_batch(Trainer *t, const GlobalBatch *b);
// Rank 0's plan (t->wire) to every rank, unpacked into slot `slot` (t->plans, with the batch's
// labelled-token count in t->targets and, with data servers, the loading plan in t->load). Rank 0
// calls train_bcast_plan_error instead when it could not plan: then every rank fails with its message.
int train_bcast_plan(Trainer *t, int64_t step, int slot);
// This rank's rows of the plan in slot `slot` (step `step`, for messages), from its shards or the
// data servers; the bytes and seconds it took in t->load_bytes / t->load_seconds.
int train_read_rows(Trainer *t, int64_t step, int slot);
void train_bcast_plan_error(Trainer *t);
// With data servers: who fetches (docs/loader.md, "3D"). Sets this process's part in t->remote (its
// tp group's leader, or the members it hands its fetch to) and lists the world ranks of every
// process that asks the servers in *fetchers (*n_fetchers,), malloc'ed: tp rank 0 of every HDP
// rank of the first and the last stage. -1 + error.
int train_loader_roles(Trainer *t, int **fetchers, int *n_fetchers);
// Whether this process asks the data servers (and tells them when it is done).
int train_fetches(const Trainer *t);
// Make slot s % 2 hold step s's plan and this rank's rows, and start preparing step s + 1 in the
// background. -1 + error (on every rank when the plan failed; on this rank when its rows did).
int train_prefetch_ready(Trainer *t, int64_t s);
// Wait for the background thread (what it prepared stays). -1 + its error.
int train_prefetch_join(Trainer *t);
// Join and drop what was prepared, the sampler left where it is (a checkpoint just set it).
void train_prefetch_reset(Trainer *t);
// Join the background thread and drop what it prepared; rank 0 puts its sampler back to the
// position after step t->step (the batches it sampled ahead are sampled again later).
void train_prefetch_stop(Trainer *t);
// Rank 0: the sampler's position after step t->step, whatever was sampled ahead (checkpoints).
SamplerState train_sampler_position(const Trainer *t);

// Record this rank's timeline into tr (NULL: stop recording): items, ring blocks and waits, the
// gradient sync, the optimizer, checkpoints.
void train_trace_attach(Trainer *t, RtTrace *tr);

#endif
