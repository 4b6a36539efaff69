// parallel.c: the 3D layout of a job and its groups (parallel.h, docs/runtime.md "3D layout").
#include "bytescale/parallel.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bytescale/error.h"

int parallel_layout(Parallel *p, int n, int rank, int tp, int pp) {
    memset(p, 0, sizeof *p);
    if (tp < 1 || pp < 1) return bs_fail("--tp %d --pp %d: both must be >= 1", tp, pp);
    if (n % (tp * pp) != 0)
        return bs_fail("%d processes do not divide into --tp %d x --pp %d = %d: run N = tp x pp x H processes "
                       "(H HDP ranks), e.g. mpirun -np %d",
                       n, tp, pp, tp * pp, tp * pp * (n / (tp * pp) > 0 ? n / (tp * pp) : 1));
    p->tp = tp, p->pp = pp, p->hdp = n / (tp * pp);
    p->world = n, p->rank = rank;
    p->tp_rank = rank % tp;
    p->hdp_rank = rank / tp % p->hdp;
    p->stage = rank / (tp * p->hdp);
    return 0;
}

int parallel_world_rank(const Parallel *p, int stage, int hdp, int tp) { return (stage * p->hdp + hdp) * p->tp + tp; }

// Greedy by least time: every stage starts with one layer (and its end's extra work), then each
// further layer goes to the stage that is quickest so far. All layers cost the same, so this
// minimises the slowest stage; ties go to the earlier stage, so the extra layers of an even split
// sit before the head.
int pipeline_split_layers(int n_layers, int pp, const CostModel *cm, int64_t tokens, int *begin) {
    if (pp < 1 || pp > n_layers)
        return bs_fail("--pp %d: a model of %d layers has at most %d pipeline stages (every stage needs a layer)", pp,
                       n_layers, n_layers);
    if (!begin) return 0;  // only the check
    double layer = cm ? cost_layer_time(cm, tokens) : 1.0, head = cm ? cost_head_time(cm, (double)tokens) : 0.0;
    if (!(layer > 0)) layer = 1.0, head = 0.0;  // no usable model: layers evenly
    int count[256];
    double time[256];
    if (pp > 256) return bs_fail("--pp %d: at most 256 stages", pp);
    for (int s = 0; s < pp; s++) {
        count[s] = 1;
        time[s] = layer + (s == pp - 1 ? head : 0.0);
    }
    for (int l = pp; l < n_layers; l++) {
        int best = 0;
        for (int s = 1; s < pp; s++)
            if (time[s] < time[best] - 1e-12 * time[best]) best = s;
        count[best]++;
        time[best] += layer;
    }
    begin[0] = 0;
    for (int s = 0; s < pp; s++) begin[s + 1] = begin[s] + count[s];
    return 0;
}

int parallel_open(Parallel *p, Comm *comm, int tp, int pp, const ModelConfig *mc, const CostModel *cm,
                  int64_t capacity) {
    if (parallel_layout(p, comm->size, comm->rank, tp, pp) != 0) return -1;
    p->world_comm = comm;
    p->stage_begin = bs_malloc((size_t)(pp + 1) * sizeof(int));
    if (!p->stage_begin) return -1;
    if (pipeline_split_layers(mc->n_layers, pp, cm, capacity, p->stage_begin) != 0) {
        parallel_close(p);
        return -1;
    }
    p->layer_begin = p->stage_begin[p->stage];
    p->layer_end = p->stage_begin[p->stage + 1];
    LlamaShard sh = parallel_shard(p);
    if (llama_shard_check(mc, &sh) != 0) {
        parallel_close(p);
        return -1;
    }
    // every process makes all three splits in the same order (they are collective over comm)
    int rc = comm_split_group(comm, p->stage * p->hdp + p->hdp_rank, p->tp_rank, &p->tp_comm);
    if (rc == 0) rc = comm_split_group(comm, p->stage * p->tp + p->tp_rank, p->hdp_rank, &p->hdp_comm);
    if (rc == 0) rc = comm_split_group(comm, p->hdp_rank * p->tp + p->tp_rank, p->stage, &p->pipe_comm);
    if (rc != 0) {
        parallel_close(p);
        return bs_fail_ctx("the groups of the 3D layout");
    }
    return 0;
}

void parallel_close(Parallel *p) {
    // one process: every group is the local Comm itself, which comm_free leaves alone
    comm_free(p->tp_comm);
    comm_free(p->hdp_comm);
    comm_free(p->pipe_comm);
    p->tp_comm = p->hdp_comm = p->pipe_comm = NULL;
    free(p->stage_begin);
    p->stage_begin = NULL;
}

LlamaShard parallel_shard(const Parallel *p) { return parallel_shard_of(p, p->stage, p->tp_rank); }

LlamaShard parallel_shard_of(const Parallel *p, int stage, int tp) {
    return (LlamaShard){.tp = p->tp,
                        .tp_rank = tp,
                        .layer_begin = p->stage_begin[stage],
                        .layer_end = p->stage_begin[stage + 1],
                        .first = stage == 0,
                        .last = stage == p->pp - 1};
}

// ---- the whole model from its parts ---------------------------------------------------------------------

enum { PAR_TAG_GATHER = 301 };

// Put a shard's local floats where its runs say (to_full) or take them from there.
static int place(const ModelConfig *mc, const LlamaShard *sh, float *local, float *full, int to_full) {
    ParamRun *runs = NULL;
    size_t n = 0;
    if (llama_shard_runs(mc, sh, &runs, &n) != 0) return -1;
    for (size_t i = 0; i < n; i++) {
        float *l = local + runs[i].local, *f = full + runs[i].full;
        if (to_full)
            memcpy(f, l, runs[i].len * sizeof(float));
        else
            memcpy(l, f, runs[i].len * sizeof(float));
    }
    free(runs);
    return 0;
}

int parallel_take_local(const ModelConfig *mc, const LlamaShard *sh, const float *full, float *local) {
    return place(mc, sh, local, (float *)full, 0);
}

// Floats in a shard's local buffer (the sum of its runs).
static size_t shard_floats(const ModelConfig *mc, const LlamaShard *sh) {
    ParamRun *runs = NULL;
    size_t n = 0, total = 0;
    if (llama_shard_runs(mc, sh, &runs, &n) != 0) return 0;
    for (size_t i = 0; i < n; i++) total += runs[i].len;
    free(runs);
    return total;
}

size_t parallel_full_params(const ModelConfig *mc) {
    LlamaShard full = llama_shard_full(mc);
    return shard_floats(mc, &full);
}

int parallel_gather_full(const Parallel *p, const ModelConfig *mc, const float *local, float *full) {
    Comm *w = p->world_comm;
    LlamaShard mine = parallel_shard(p);
    if (p->rank != 0) {
        if (p->hdp_rank != 0) return 0;  // the same floats as its HDP rank 0's
        CommReq r = {0};
        size_t n = shard_floats(mc, &mine);
        if (comm_isend(w, local, n * sizeof(float), 0, PAR_TAG_GATHER, &r) != 0 || comm_wait(w, &r) != 0)
            return bs_fail_ctx("stage %d, tp rank %d: sending its parameters to rank 0", p->stage, p->tp_rank);
        return 0;
    }
    if (place(mc, &mine, (float *)local, full, 1) != 0) return -1;
    float *buf = NULL;
    int rc = 0;
    for (int s = 0; rc == 0 && s < p->pp; s++)
        for (int t = 0; rc == 0 && t < p->tp; t++) {
            if (s == 0 && t == 0) continue;
            LlamaShard sh = parallel_shard_of(p, s, t);
            size_t n = shard_floats(mc, &sh);
            float *b = bs_realloc(buf, (n > 0 ? n : 1) * sizeof(float));
            if (!b) {
                rc = -1;
                break;
            }
            buf = b;
            CommReq r = {0};
            rc = comm_irecv(w, buf, n * sizeof(float), parallel_world_rank(p, s, 0, t), PAR_TAG_GATHER, &r);
            if (rc == 0) rc = comm_wait(w, &r);
            if (rc == 0) rc = place(mc, &sh, buf, full, 1);
            if (rc != 0) bs_fail_ctx("the parameters of stage %d, tp rank %d", s, t);
        }
    free(buf);
    return rc;
}

void parallel_describe(const Parallel *p, char *buf, size_t size) {
    snprintf(buf, size,
             "layout: %d processes = tp %d x pp %d x hdp %d; world rank = (stage x %d + hdp) x %d + tp: a TP group "
             "is %d consecutive ranks, stage s is ranks [%d s, %d s + %d)",
             p->world, p->tp, p->pp, p->hdp, p->hdp, p->tp, p->tp, p->hdp * p->tp, p->hdp * p->tp, p->hdp * p->tp);
}
