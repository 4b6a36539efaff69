// mpi_train_util.h: what the MPI trainer tests share (mpi_train.c, mpi_parallel.c): the corpus every
// rank reads and the small, fast training settings they start from.
#ifndef BYTESCALE_TEST_MPI_TRAIN_UTIL_H
#define BYTESCALE_TEST_MPI_TRAIN_UTIL_H

#include "mpi_util.h"
#include "test_corpus.h"

#include "bytescale/parallel.h"
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

// The shared settings (mpi_train_util.h) with a model and a 3D layout.
static inline TrainConfig mpi_config_3d(const char *data, const char *model, const char *policy, int64_t tokens,
                                        int64_t context, int64_t C, int tp, int pp) {
    TrainConfig c = mpi_train_config(data, policy, tokens, context, C);
    snprintf(c.model, sizeof c.model, "%s", model);
    c.tp = tp;
    c.pp = pp;
    return c;
}

// The whole model's vector on world rank 0 from every process's ZeRO-1 shard x (zero.begin ..
// zero.end of its part): gathered over the HDP group, then put together. NULL on other ranks.
static inline float *gather_shards(Trainer *t, const float *x) {
    size_t n_local = t->llama.n_params;
    float *local = malloc((n_local > 0 ? n_local : 1) * sizeof(float));
    CHECK(local, "out of memory");
    memcpy(local + t->zero.begin, x, (t->zero.end - t->zero.begin) * sizeof(float));
    CHECK_OK(comm_allgatherv(t->par.hdp_comm, local, t->zero.counts, t->zero.displs));
    float *full = NULL;
    if (t->rank == 0) {
        full = malloc(parallel_full_params(&t->model) * sizeof(float));
        CHECK(full, "out of memory");
    }
    CHECK_OK(parallel_gather_full(&t->par, &t->model, local, full));
    free(local);
    return full;
}

// The largest per-tensor relative error ||a - b|| / ||b|| over the whole model's tensors (b's
// layout: the reference trainer's full model); *worst names that tensor.
static inline double max_tensor_error(const Llama *ref, const float *a, const float *b, const char **worst) {
    double most = 0;
    *worst = "";
    for (int i = 0; i < ref->n_tensors; i++) {
        const ParamTensor *pt = &ref->tensors[i];
        double d = 0, n = 0;
        for (size_t j = pt->offset; j < pt->offset + pt->numel; j++) {
            double x = (double)a[j] - b[j];
            d += x * x;
            n += (double)b[j] * b[j];
        }
        double e = n > 0 ? sqrt(d / n) : sqrt(d);
        if (e > most) most = e, *worst = pt->name;
    }
    return most;
}

#endif
