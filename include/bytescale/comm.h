// comm.h: the few collective and point-to-point operations the HDP runtime needs, behind one interface.
//
// Two implementations: comm_local (one rank, this process; the single-process trainer) and comm_mpi
// (MPI_COMM_WORLD of an `mpirun` job, or its training ranks when data servers share the job). The trainer, the executor and ring attention call only
// these functions, so the one-process run is the N = 1 case of the distributed code path, not a
// second variant. Every ring and every all-to-all group uses the one global communicator: no
// communicator is created per group (docs/runtime.md says why).
//
// Errors: every function returns 0, or -1 with an error message (error.h). comm_abort ends the
// whole job; a rank that cannot continue calls it so that no other rank waits for it forever.
#ifndef BYTESCALE_COMM_H
#define BYTESCALE_COMM_H

#include <stddef.h>
#include <stdint.h>

// A non-blocking send or receive in flight. Zero-initialized = none.
typedef struct {
    uint64_t handle;  // the implementation's request (MPI_Request fits)
    int active;
} CommReq;

typedef struct Comm Comm;

typedef struct {
    int (*isend)(Comm *c, const void *buf, size_t bytes, int dst, int tag, CommReq *req);
    int (*irecv)(Comm *c, void *buf, size_t bytes, int src, int tag, CommReq *req);
    int (*test)(Comm *c, CommReq *req, int *done);
    int (*wait)(Comm *c, CommReq *req);
    int (*reduce_scatter)(Comm *c, const float *send, float *recv, const int *counts);
    int (*ireduce_scatter)(Comm *c, const float *send, float *recv, const int *counts, CommReq *req);
    int (*allgatherv)(Comm *c, float *buf, const int *counts, const int *displs);
    int (*allgather)(Comm *c, const void *mine, void *all, size_t bytes);
    int (*bcast)(Comm *c, void *buf, size_t bytes, int root);
    int (*allreduce_sum)(Comm *c, double *x, int n);
    int (*allreduce_f32)(Comm *c, float *x, size_t n, int op);
    int (*iallreduce_f32)(Comm *c, float *x, size_t n, int op, CommReq *req);
    int (*split)(Comm *c, int color, int key, Comm **out);
    void (*free)(Comm *c);
    int (*barrier)(Comm *c);
    void (*abort)(Comm *c, int code);
} CommOps;

struct Comm {
    int rank, size;
    int tag_ub;             // largest tag the implementation accepts (MPI_TAG_UB; >= 32767)
    const CommOps *ops;
    const char *name;       // "local" or "mpi"
    uint64_t handle;        // the implementation's communicator (an MPI_Comm of a group); 0 = the job's
};

// Reductions of comm_allreduce_f32.
enum { COMM_SUM = 0, COMM_MAX = 1 };

// One rank: collectives are copies, point-to-point to another rank is an error.
Comm *comm_local(void);

// MPI: MPI_Init_thread on first use (MULTIPLE where the library gives it: the prefetch thread fetches
// from data servers; FUNNELED is enough without them). -1 + error when MPI cannot start.
// comm_mpi_finalize ends it, on success only (an error ends the job with comm_abort): every process
// of the job meets in a barrier first, so that none is inside MPI_Finalize while another can still
// abort (Open MPI 4.1's mpirun can hang or crash when that happens).
int comm_mpi_init(Comm **out, int *argc, char ***argv);
int comm_mpi_finalize(void);
// Whether this process was started by an MPI launcher (mpirun/mpiexec set these variables).
int comm_launched_by_mpi(void);

// ---- roles of one job (the remote data loader, loader.h) ------------------------------------------
// A job may run training ranks (clients) and data servers side by side, as one MPMD mpirun
// (`bytescale train ... : bytescale serve ...`) or one command whose last ranks serve
// (`train --servers N`). Every process says its role; the first client also schedules.
enum { COMM_ROLE_CLIENT = 0, COMM_ROLE_SERVER = 1, COMM_MAX_SERVERS = 64 };
typedef struct {
    int world_rank, world_size;
    int n_clients, n_servers;
    int index;                      // this process's index among those of its role
    int scheduler;                  // world rank of the first client
    int servers[COMM_MAX_SERVERS];  // world ranks of the servers, in order
    int thread_multiple;            // the library runs MPI calls from any thread
} CommRoles;
// Collective over the whole job, once, right after comm_mpi_init on c: learn every process's role.
// With servers in the job, c becomes the clients' (or the servers') own communicator: its rank and
// size are then among them. Also makes the loader's communicator (a duplicate of the world).
int comm_mpi_split_roles(Comm *c, int role, CommRoles *out);
// The loader's communicator: a pointer to an MPI_Comm (MPI_COMM_NULL before the split). For
// loader.c only, which speaks MPI itself.
void *comm_mpi_loader_handle(void);

// ---- the calls ------------------------------------------------------------------------------------
// Point-to-point, non-blocking: buf must stay untouched until the request completes (wait/test).
// Messages between one pair of ranks on one tag arrive in the order they were sent.
static inline int comm_isend(Comm *c, const void *buf, size_t bytes, int dst, int tag, CommReq *req) {
    return c->ops->isend(c, buf, bytes, dst, tag, req);
}
static inline int comm_irecv(Comm *c, void *buf, size_t bytes, int src, int tag, CommReq *req) {
    return c->ops->irecv(c, buf, bytes, src, tag, req);
}
// *done = 1 when req has completed (it is then inactive). Calling it also drives the library's
// progress engine, so a transfer moves on while the caller computes between calls.
static inline int comm_test(Comm *c, CommReq *req, int *done) { return c->ops->test(c, req, done); }
// Block until req completes; an inactive req returns at once.
static inline int comm_wait(Comm *c, CommReq *req) { return c->ops->wait(c, req); }

// Sum send (sum of counts floats, the same on every rank) over all ranks; rank r receives the
// sum's block r (counts[r] floats, blocks back to back in rank order) in recv. counts may differ
// per rank (the ZeRO-1 shards of a parameter count that does not divide by the rank count).
static inline int comm_reduce_scatter(Comm *c, const float *send, float *recv, const int *counts) {
    return c->ops->reduce_scatter(c, send, recv, counts);
}
// The same, non-blocking: send and recv stay untouched until req completes (comm_test / comm_wait).
static inline int comm_ireduce_scatter(Comm *c, const float *send, float *recv, const int *counts, CommReq *req) {
    return c->ops->ireduce_scatter(c, send, recv, counts, req);
}
// In place: rank r contributes buf[displs[r] .. + counts[r]); afterwards every rank holds all blocks.
static inline int comm_allgatherv(Comm *c, float *buf, const int *counts, const int *displs) {
    return c->ops->allgatherv(c, buf, counts, displs);
}
// Every rank's `bytes` bytes of mine, in rank order, into all (size * bytes).
static inline int comm_allgather(Comm *c, const void *mine, void *all, size_t bytes) {
    return c->ops->allgather(c, mine, all, bytes);
}
static inline int comm_bcast(Comm *c, void *buf, size_t bytes, int root) { return c->ops->bcast(c, buf, bytes, root); }
// x[0..n) summed over all ranks, in place.
static inline int comm_allreduce_sum(Comm *c, double *x, int n) { return c->ops->allreduce_sum(c, x, n); }
// x[0..n) reduced over all ranks (COMM_SUM or COMM_MAX), in place: the tensor-parallel collectives.
static inline int comm_allreduce_f32(Comm *c, float *x, size_t n, int op) { return c->ops->allreduce_f32(c, x, n, op); }
// The same, non-blocking: x stays untouched (neither read nor written) until req completes
// (comm_test / comm_wait). comm_test between slices of other work drives it on (MPI progresses
// non-blocking collectives mostly inside MPI calls). One rank: nothing to do, req completes at once.
static inline int comm_iallreduce_f32(Comm *c, float *x, size_t n, int op, CommReq *req) {
    return c->ops->iallreduce_f32(c, x, n, op, req);
}
// Collective over c: a communicator of the ranks that pass the same color, ranked by key (then by
// rank in c). Made once at start for the fixed groups of a 3D layout (parallel.h), never per ring
// or per step. One rank: *out is a one-rank Comm. Free with comm_free.
static inline int comm_split_group(Comm *c, int color, int key, Comm **out) { return c->ops->split(c, color, key, out); }
// Free a communicator made by comm_split_group (NULL is fine; the job's own is never freed).
static inline void comm_free(Comm *c) {
    if (c) c->ops->free(c);
}
// Only for start-up and tests: training steps never need one (the plan's global order keeps rings
// in step, docs/runtime.md).
static inline int comm_barrier(Comm *c) { return c->ops->barrier(c); }
// End every rank of the job with this exit code. Does not return.
static inline void comm_abort(Comm *c, int code) { c->ops->abort(c, code); }

// Split n items into c->size contiguous blocks whose sizes differ by at most one (the first
// n % size blocks are one longer): counts[r], displs[r] of rank r. Used for the ZeRO-1 shards.
void comm_split(int64_t n, int size, int *counts, int *displs);

#endif
