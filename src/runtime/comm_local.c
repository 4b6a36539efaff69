// comm_local.c: the one-rank Comm (comm.h). Collectives over one rank are copies; there is no other
// rank to talk to, so point-to-point is an error (a plan for one rank never holds a ring).
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bytescale/comm.h"
#include "bytescale/error.h"

static int local_p2p(Comm *c, int peer) {
    (void)c;
    return bs_fail("one-process run: no rank %d to exchange ring messages with (a ring needs >= 2 ranks: mpirun)",
                   peer);
}

static int local_isend(Comm *c, const void *buf, size_t bytes, int dst, int tag, CommReq *req) {
    (void)buf, (void)bytes, (void)tag, (void)req;
    return local_p2p(c, dst);
}

static int local_irecv(Comm *c, void *buf, size_t bytes, int src, int tag, CommReq *req) {
    (void)buf, (void)bytes, (void)tag, (void)req;
    return local_p2p(c, src);
}

static int local_test(Comm *c, CommReq *req, int *done) {
    (void)c;
    req->active = 0;
    *done = 1;
    return 0;
}

static int local_wait(Comm *c, CommReq *req) {
    (void)c;
    req->active = 0;
    return 0;
}

static int local_reduce_scatter(Comm *c, const float *send, float *recv, const int *counts) {
    (void)c;
    if (send != recv) memmove(recv, send, (size_t)counts[0] * sizeof(float));
    return 0;
}

static int local_ireduce_scatter(Comm *c, const float *send, float *recv, const int *counts, CommReq *req) {
    req->active = 0;
    return local_reduce_scatter(c, send, recv, counts);
}

static int local_allgatherv(Comm *c, float *buf, const int *counts, const int *displs) {
    (void)c, (void)buf, (void)counts, (void)displs;
    return 0;
}

static int local_allgather(Comm *c, const void *mine, void *all, size_t bytes) {
    (void)c;
    if (mine != all) memmove(all, mine, bytes);
    return 0;
}

static int local_bcast(Comm *c, void *buf, size_t bytes, int root) {
    (void)c, (void)buf, (void)bytes;
    return root == 0 ? 0 : bs_fail("broadcast from rank %d in a one-rank run", root);
}

static int local_allreduce_sum(Comm *c, double *x, int n) {
    (void)c, (void)x, (void)n;
    return 0;
}

static int local_allreduce_f32(Comm *c, float *x, size_t n, int op) {
    (void)c, (void)x, (void)n, (void)op;
    return 0;
}

static int local_iallreduce_f32(Comm *c, float *x, size_t n, int op, CommReq *req) {
    req->active = 0;
    return local_allreduce_f32(c, x, n, op);
}

static int local_split(Comm *c, int color, int key, Comm **out) {
    (void)color, (void)key;
    *out = c;  // the one rank is its own group
    return 0;
}

static void local_free(Comm *c) { (void)c; }

static int local_barrier(Comm *c) {
    (void)c;
    return 0;
}

static void local_abort(Comm *c, int code) {
    (void)c;
    fflush(stdout);
    exit(code);
}

static const CommOps LOCAL_OPS = {
    .isend = local_isend,
    .irecv = local_irecv,
    .test = local_test,
    .wait = local_wait,
    .reduce_scatter = local_reduce_scatter,
    .ireduce_scatter = local_ireduce_scatter,
    .allgatherv = local_allgatherv,
    .allgather = local_allgather,
    .bcast = local_bcast,
    .allreduce_sum = local_allreduce_sum,
    .allreduce_f32 = local_allreduce_f32,
    .iallreduce_f32 = local_iallreduce_f32,
    .split = local_split,
    .free = local_free,
    .barrier = local_barrier,
    .abort = local_abort,
};

Comm *comm_local(void) {
    static Comm one = {.rank = 0, .size = 1, .tag_ub = 32767, .ops = &LOCAL_OPS, .name = "local"};
    return &one;
}

void comm_split(int64_t n, int size, int *counts, int *displs) {
    int64_t base = n / size, extra = n % size, at = 0;
    for (int r = 0; r < size; r++) {
        counts[r] = (int)(base + (r < extra));
        displs[r] = (int)at;
        at += counts[r];
    }
}
