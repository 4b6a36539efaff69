// mpi_util.h: what the MPI tests share. They are plain MPI programs: a failed CHECK prints the rank,
// the place and the reason and aborts the whole job, so a failing rank never leaves others waiting.
#ifndef BYTESCALE_TEST_MPI_UTIL_H
#define BYTESCALE_TEST_MPI_UTIL_H

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bytescale/comm.h"
#include "bytescale/error.h"

static Comm *mpi_comm;

#define CHECK(cond, ...)                                                                                   \
    do {                                                                                                   \
        if (!(cond)) {                                                                                     \
            fprintf(stderr, "rank %d: %s:%d: check failed: %s: ", mpi_comm ? mpi_comm->rank : -1, __FILE__, \
                    __LINE__, #cond);                                                                      \
            fprintf(stderr, __VA_ARGS__);                                                                  \
            fprintf(stderr, "\n");                                                                         \
            if (mpi_comm) comm_abort(mpi_comm, 1);                                                         \
            exit(1);                                                                                       \
        }                                                                                                  \
    } while (0)

#define CHECK_OK(call) CHECK((call) == 0, "%s", bs_errmsg())

static inline void mpi_test_init(int *argc, char ***argv) {
    if (comm_mpi_init(&mpi_comm, argc, argv) != 0) {
        fprintf(stderr, "MPI: %s\n", bs_errmsg());
        exit(1);
    }
}

// ||a - b|| / ||b|| over n floats, the sums of squares added over all ranks (each holds a part).
static inline double rel_error_all(const float *a, const float *b, size_t n) {
    double s[2] = {0, 0};
    for (size_t i = 0; i < n; i++) {
        double d = (double)a[i] - b[i];
        s[0] += d * d;
        s[1] += (double)b[i] * b[i];
    }
    CHECK_OK(comm_allreduce_sum(mpi_comm, s, 2));
    return s[1] > 0 ? sqrt(s[0] / s[1]) : sqrt(s[0]);
}

// A scratch directory every rank sees: rank 0 makes it under the build tree.
static inline const char *mpi_tmpdir(const char *name) {
    static char buf[512];
    snprintf(buf, sizeof buf, "test-tmp/%s-np%d", name, mpi_comm->size);
    if (mpi_comm->rank == 0) {
        char cmd[700];
        snprintf(cmd, sizeof cmd, "rm -rf '%s' && mkdir -p '%s'", buf, buf);
        CHECK(system(cmd) == 0, "cannot make %s", buf);
    }
    CHECK_OK(comm_barrier(mpi_comm));
    return buf;
}

static inline int mpi_test_done(const char *name, int passed) {
    if (mpi_comm->rank == 0) printf("%s on %d ranks: %d passed, 0 failed\n", name, mpi_comm->size, passed);
    comm_mpi_finalize();
    return 0;
}

#endif
