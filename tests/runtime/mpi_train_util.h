// mpi_train_util.h: what the MPI trainer tests share (mpi_train.c, mpi_parallel.c): the corpus every
// rank reads and the small, fast training settings they start from.
#ifndef BYTESCALE_TEST_MPI_TRAIN_UTIL_H
#define BYTESCALE_TEST_MPI_TRAIN_UTIL_H

#include "mpi_util.h"
#include "test_corpus.h"

#include "bytescale/train.h"

// Rank 0 makes the corpus; every rank reads it.
static inline void mpi_make_dataset(const char *dir, int n, int lo, int hi, uint64_t seed, char *out, size_t cap) {
    if (mpi_comm->rank == 0) CHECK_OK(test_corpus_make(dir, n, lo, hi, seed, out, cap));
    else snprintf(out, cap, "%s/data", dir);
    CHECK_OK(comm_barrier(mpi_comm));
}

// The tiny model, 4 steps of a quick schedule, seed 5, quiet; the batch and capacity as given.
static inline TrainConfig mpi_train_config(const char *data, const char *policy, int64_t tokens, int64_t context,
                                           int64_t C) {
    TrainConfig c = train_defaults();
    snprintf(c.model, sizeof c.model, "tiny");
    snprintf(c.data, sizeof c.data, "%s", data);
    snprintf(c.policy, sizeof c.policy, "%s", policy);
    c.tokens = tokens;
    c.context = context;
    c.capacity = C;
    c.lr = 3e-3;
    c.min_lr = 3e-4;
    c.warmup = 1;
    c.steps = 4;
    c.seed = 5;
    c.quiet = 1;
    return c;
}

#endif
