// comm_mpi.c: the Comm of an MPI job (comm.h): MPI_COMM_WORLD, or the training ranks' own
// communicator when the job also runs data servers (comm_mpi_split_roles).
//
// Every MPI error is returned, not fatal: MPI_ERRORS_RETURN is set on the communicator, and the
// caller turns a failure into comm_abort with a message naming this rank. Message sizes above
// INT_MAX bytes are refused (MPI counts are int); ring chunks and gradient shards are far below.
#include <limits.h>
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bytescale/comm.h"
#include "bytescale/error.h"

_Static_assert(sizeof(MPI_Request) <= sizeof(uint64_t), "an MPI_Request must fit CommReq.handle");
_Static_assert(sizeof(MPI_Comm) <= sizeof(uint64_t), "an MPI_Comm must fit Comm.handle");

static MPI_Request req_get(const CommReq *r) {
    MPI_Request q;
    memcpy(&q, &r->handle, sizeof q);
    return q;
}

static void req_put(CommReq *r, MPI_Request q) {
    r->handle = 0;
    memcpy(&r->handle, &q, sizeof q);
    r->active = q != MPI_REQUEST_NULL;
}

static int mpi_fail(int err, const char *what) {
    char msg[MPI_MAX_ERROR_STRING];
    int len = 0;
    if (MPI_Error_string(err, msg, &len) != MPI_SUCCESS) snprintf(msg, sizeof msg, "MPI error %d", err);
    return bs_fail("%s: %s", what, msg);
}

static int check_bytes(size_t bytes, const char *what) {
    return bytes > INT_MAX ? bs_fail("%s: %zu bytes is more than one MPI message holds", what, bytes) : 0;
}

// The job's communicator: the world, or the training ranks' after a split.
static MPI_Comm g_comm = MPI_COMM_WORLD;

// The communicator a Comm's operations use: a group's own (comm_split_group), or the job's.
static MPI_Comm comm_of(const Comm *c) {
    if (!c->handle) return g_comm;
    MPI_Comm m;
    memcpy(&m, &c->handle, sizeof m);
    return m;
}

static int m_isend(Comm *c, const void *buf, size_t bytes, int dst, int tag, CommReq *req) {
    if (check_bytes(bytes, "send") != 0) return -1;
    MPI_Request q;
    int err = MPI_Isend(buf, (int)bytes, MPI_BYTE, dst, tag, comm_of(c), &q);
    if (err != MPI_SUCCESS) return mpi_fail(err, "MPI_Isend");
    req_put(req, q);
    return 0;
}

static int m_irecv(Comm *c, void *buf, size_t bytes, int src, int tag, CommReq *req) {
    if (check_bytes(bytes, "receive") != 0) return -1;
    MPI_Request q;
    int err = MPI_Irecv(buf, (int)bytes, MPI_BYTE, src, tag, comm_of(c), &q);
    if (err != MPI_SUCCESS) return mpi_fail(err, "MPI_Irecv");
    req_put(req, q);
    return 0;
}

static int m_test(Comm *c, CommReq *req, int *done) {
    (void)c;
    if (!req->active) {
        *done = 1;
        return 0;
    }
    MPI_Request q = req_get(req);
    int err = MPI_Test(&q, done, MPI_STATUS_IGNORE);
    if (err != MPI_SUCCESS) return mpi_fail(err, "MPI_Test");
    req_put(req, q);
    return 0;
}

static int m_wait(Comm *c, CommReq *req) {
    (void)c;
    if (!req->active) return 0;
    MPI_Request q = req_get(req);
    int err = MPI_Wait(&q, MPI_STATUS_IGNORE);
    if (err != MPI_SUCCESS) return mpi_fail(err, "MPI_Wait");
    req_put(req, q);
    return 0;
}

static int m_reduce_scatter(Comm *c, const float *send, float *recv, const int *counts) {
    int err = MPI_Reduce_scatter(send, recv, counts, MPI_FLOAT, MPI_SUM, comm_of(c));
    return err == MPI_SUCCESS ? 0 : mpi_fail(err, "MPI_Reduce_scatter (gradients)");
}

static int m_ireduce_scatter(Comm *c, const float *send, float *recv, const int *counts, CommReq *req) {
    MPI_Request q;
    int err = MPI_Ireduce_scatter(send, recv, counts, MPI_FLOAT, MPI_SUM, comm_of(c), &q);
    if (err != MPI_SUCCESS) return mpi_fail(err, "MPI_Ireduce_scatter (gradients)");
    req_put(req, q);
    return 0;
}

static int m_allgatherv(Comm *c, float *buf, const int *counts, const int *displs) {
    int err = MPI_Allgatherv(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, buf, counts, displs, MPI_FLOAT, comm_of(c));
    return err == MPI_SUCCESS ? 0 : mpi_fail(err, "MPI_Allgatherv (parameters)");
}

static int m_allgather(Comm *c, const void *mine, void *all, size_t bytes) {
    if (check_bytes(bytes, "allgather") != 0) return -1;
    int err = MPI_Allgather(mine, (int)bytes, MPI_BYTE, all, (int)bytes, MPI_BYTE, comm_of(c));
    return err == MPI_SUCCESS ? 0 : mpi_fail(err, "MPI_Allgather");
}

static int m_bcast(Comm *c, void *buf, size_t bytes, int root) {
    if (check_bytes(bytes, "broadcast") != 0) return -1;
    int err = MPI_Bcast(buf, (int)bytes, MPI_BYTE, root, comm_of(c));
    return err == MPI_SUCCESS ? 0 : mpi_fail(err, "MPI_Bcast");
}

static int m_allreduce_sum(Comm *c, double *x, int n) {
    int err = MPI_Allreduce(MPI_IN_PLACE, x, n, MPI_DOUBLE, MPI_SUM, comm_of(c));
    return err == MPI_SUCCESS ? 0 : mpi_fail(err, "MPI_Allreduce");
}

static int m_allreduce_f32(Comm *c, float *x, size_t n, int op) {
    if (n > INT_MAX) return bs_fail("allreduce: %zu floats is more than one MPI call holds", n);
    int err = MPI_Allreduce(MPI_IN_PLACE, x, (int)n, MPI_FLOAT, op == COMM_MAX ? MPI_MAX : MPI_SUM, comm_of(c));
    return err == MPI_SUCCESS ? 0 : mpi_fail(err, "MPI_Allreduce (tensor parallel)");
}

static int m_iallreduce_f32(Comm *c, float *x, size_t n, int op, CommReq *req) {
    if (n > INT_MAX) return bs_fail("allreduce: %zu floats is more than one MPI call holds", n);
    MPI_Request q;
    int err = MPI_Iallreduce(MPI_IN_PLACE, x, (int)n, MPI_FLOAT, op == COMM_MAX ? MPI_MAX : MPI_SUM, comm_of(c), &q);
    if (err != MPI_SUCCESS) return mpi_fail(err, "MPI_Iallreduce (tensor parallel)");
    req_put(req, q);
    return 0;
}

static const CommOps MPI_OPS;

static int m_split(Comm *c, int color, int key, Comm **out) {
    *out = NULL;
    MPI_Comm g;
    int err = MPI_Comm_split(comm_of(c), color, key, &g);
    if (err != MPI_SUCCESS) return mpi_fail(err, "MPI_Comm_split (a group of the 3D layout)");
    Comm *n = calloc(1, sizeof *n);
    if (!n) {
        MPI_Comm_free(&g);
        return bs_fail("out of memory");
    }
    MPI_Comm_set_errhandler(g, MPI_ERRORS_RETURN);
    MPI_Comm_rank(g, &n->rank);
    MPI_Comm_size(g, &n->size);
    n->tag_ub = c->tag_ub;
    n->ops = &MPI_OPS;
    n->name = "mpi";
    memcpy(&n->handle, &g, sizeof g);
    *out = n;
    return 0;
}

static void m_free(Comm *c) {
    if (!c->handle) return;  // the job's own communicator lives as long as MPI
    MPI_Comm g = comm_of(c);
    MPI_Comm_free(&g);
    free(c);
}

static int m_barrier(Comm *c) {
    int err = MPI_Barrier(comm_of(c));
    return err == MPI_SUCCESS ? 0 : mpi_fail(err, "MPI_Barrier");
}

static void m_abort(Comm *c, int code) {
    (void)c;
    fflush(stdout);
    fflush(stderr);
    MPI_Abort(MPI_COMM_WORLD, code);  // the whole job, data servers included
    exit(code);  // MPI_Abort does not return; this is for the compiler
}

static const CommOps MPI_OPS = {
    .isend = m_isend,
    .irecv = m_irecv,
    .test = m_test,
    .wait = m_wait,
    .reduce_scatter = m_reduce_scatter,
    .ireduce_scatter = m_ireduce_scatter,
    .allgatherv = m_allgatherv,
    .allgather = m_allgather,
    .bcast = m_bcast,
    .allreduce_sum = m_allreduce_sum,
    .allreduce_f32 = m_allreduce_f32,
    .iallreduce_f32 = m_iallreduce_f32,
    .split = m_split,
    .free = m_free,
    .barrier = m_barrier,
    .abort = m_abort,
};

static Comm world = {.ops = &MPI_OPS, .name = "mpi"};
static int g_thread_level = MPI_THREAD_FUNNELED;
static MPI_Comm g_loader = MPI_COMM_NULL;

int comm_mpi_init(Comm **out, int *argc, char ***argv) {
    int inited = 0;
    MPI_Initialized(&inited);
    if (!inited) {
        int provided = 0;
        // MULTIPLE when the library has it: a remote data loader fetches from its prefetch thread
        // (loader.h) while the main thread runs rings; without it the trainer needs FUNNELED only
        if (MPI_Init_thread(argc, argv, MPI_THREAD_MULTIPLE, &provided) != MPI_SUCCESS)
            return bs_fail("MPI_Init_thread failed");
        if (provided < MPI_THREAD_FUNNELED)
            return bs_fail("the MPI library gives thread level %d; the prefetch thread needs MPI_THREAD_FUNNELED",
                           provided);
        g_thread_level = provided;
    }
    MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
    MPI_Comm_rank(MPI_COMM_WORLD, &world.rank);
    MPI_Comm_size(MPI_COMM_WORLD, &world.size);
    void *ub = NULL;
    int flag = 0;
    MPI_Comm_get_attr(MPI_COMM_WORLD, MPI_TAG_UB, &ub, &flag);
    world.tag_ub = flag && ub ? *(int *)ub : 32767;
    *out = &world;
    return 0;
}

int comm_mpi_split_roles(Comm *c, int role, CommRoles *out) {
    if (c != &world || g_comm != MPI_COMM_WORLD) return bs_fail("comm_mpi_split_roles: call it once, on the world");
    memset(out, 0, sizeof *out);
    int *roles = malloc(sizeof(int) * (size_t)world.size);
    if (!roles) return bs_fail("out of memory");
    int err = MPI_Allgather(&role, 1, MPI_INT, roles, 1, MPI_INT, MPI_COMM_WORLD);
    if (err != MPI_SUCCESS) {
        free(roles);
        return mpi_fail(err, "MPI_Allgather (roles)");
    }
    out->world_rank = world.rank;
    out->world_size = world.size;
    for (int r = 0; r < world.size; r++) {
        if (roles[r] == COMM_ROLE_SERVER && out->n_servers < COMM_MAX_SERVERS) out->servers[out->n_servers] = r;
        out->n_servers += roles[r] == COMM_ROLE_SERVER;
        out->n_clients += roles[r] == COMM_ROLE_CLIENT;
        if (roles[r] == COMM_ROLE_CLIENT && out->n_clients == 1) out->scheduler = r;
        if (r == world.rank) out->index = roles[r] == COMM_ROLE_SERVER ? out->n_servers - 1 : out->n_clients - 1;
    }
    free(roles);
    if (out->n_servers > COMM_MAX_SERVERS)
        return bs_fail("%d data servers: at most %d", out->n_servers, COMM_MAX_SERVERS);
    if (out->n_clients < 1) return bs_fail("the job has data servers but no training ranks");
    // the loader's own communicator: its tags never meet a ring's
    err = MPI_Comm_dup(MPI_COMM_WORLD, &g_loader);
    if (err == MPI_SUCCESS && out->n_servers > 0) {
        MPI_Comm mine;
        err = MPI_Comm_split(MPI_COMM_WORLD, role, world.rank, &mine);
        if (err == MPI_SUCCESS) {
            MPI_Comm_set_errhandler(mine, MPI_ERRORS_RETURN);
            g_comm = mine;
            MPI_Comm_rank(mine, &world.rank);
            MPI_Comm_size(mine, &world.size);
        }
    }
    if (err != MPI_SUCCESS) return mpi_fail(err, "splitting the job into training ranks and data servers");
    MPI_Comm_set_errhandler(g_loader, MPI_ERRORS_RETURN);
    out->thread_multiple = g_thread_level >= MPI_THREAD_MULTIPLE;
    return 0;
}

void *comm_mpi_loader_handle(void) { return &g_loader; }

int comm_mpi_finalize(void) {
    int inited = 0, finalized = 0;
    MPI_Initialized(&inited);
    MPI_Finalized(&finalized);
    if (!inited || finalized) return 0;
    // Past this barrier no process of the job fails any more: an abort before it finds the others
    // waiting here, never inside MPI_Finalize, which Open MPI 4.1's mpirun does not survive reliably
    // (under load it hangs or crashes in its own shutdown when one process aborts while another
    // finalizes: docs/runtime.md, Faults).
    if (MPI_Barrier(MPI_COMM_WORLD) != MPI_SUCCESS) return bs_fail("the barrier before MPI_Finalize failed");
    if (MPI_Finalize() != MPI_SUCCESS) return bs_fail("MPI_Finalize failed");
    return 0;
}

int comm_launched_by_mpi(void) {
    static const char *vars[] = {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_RANK", "MPI_LOCALNRANKS"};
    for (size_t i = 0; i < sizeof vars / sizeof vars[0]; i++)
        if (getenv(vars[i])) return 1;
    return 0;
}
