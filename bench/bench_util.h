// bench_util.h: what the benchmarks share - medians, CPU time, and starting a benchmark under mpirun.
#ifndef BYTESCALE_BENCH_UTIL_H
#define BYTESCALE_BENCH_UTIL_H

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <sys/wait.h>
#include <unistd.h>

#include "bytescale/error.h"

static inline int bench_cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

// The median of v[0..n); sorts v.
static inline double bench_median(double *v, int n) {
    qsort(v, (size_t)n, sizeof *v, bench_cmp_double);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

// CPU seconds of a clock: CLOCK_THREAD_CPUTIME_ID (the calling thread) or CLOCK_PROCESS_CPUTIME_ID.
static inline double bench_cpu_seconds(clockid_t clock) {
    struct timespec ts;
    clock_gettime(clock, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

// A prepared dataset (`bytescale prepare`) at data (cap bytes): as given, or relative to the build
// directory's parent (the source tree, where data/go-byte lives) when data is relative; data is
// rewritten to the one found. -1 + error saying how to make one.
static inline int bench_find_data(char *data, size_t cap) {
    char index[4200];
    snprintf(index, sizeof index, "%s/index.bin", data);
    if (access(index, R_OK) == 0) return 0;
    char self[4096];
    ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
    if (data[0] != '/' && n > 0) {
        self[n] = '\0';
        char *slash = strrchr(self, '/');
        if (slash) *slash = '\0';
        char alt[8400];
        snprintf(alt, sizeof alt, "%s/../%s/index.bin", self, data);
        if (access(alt, R_OK) == 0 && strlen(alt) - strlen("/index.bin") < cap) {
            alt[strlen(alt) - strlen("/index.bin")] = '\0';
            memcpy(data, alt, strlen(alt) + 1);
            return 0;
        }
    }
    return bs_fail("no prepared dataset in %s (%s not found): make it with `build/bytescale prepare` (it writes "
                   "data/go-byte), or pass --data DIR",
                   data, index);
}

// Run this program as `mpirun -np <np> [--oversubscribe] --bind-to none|core <this program> <args>`
// and wait for it: for a benchmark that measures several job sizes, one job each. args ends with
// NULL. Returns the job's exit code (-1 when it could not start).
static inline int bench_run_self_under_mpirun(int np, int oversubscribe, char *const *args) {
    char self[4096], nps[16];
    ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
    if (n <= 0) return -1;
    self[n] = '\0';
    snprintf(nps, sizeof nps, "%d", np);
    setenv("BS_BENCH_RELAUNCHED", "1", 1);
    setenv("OPENBLAS_NUM_THREADS", "1", 1);
    if (geteuid() == 0) setenv("OMPI_ALLOW_RUN_AS_ROOT", "1", 0), setenv("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1", 0);
    char *av[64];
    int k = 0;
    av[k++] = "mpirun", av[k++] = "-np", av[k++] = nps;
    // more ranks than cores: no binding, and yield when idle (correct figures of bytes, not of time)
    if (oversubscribe) av[k++] = "--oversubscribe", av[k++] = "--bind-to", av[k++] = "none";
    else av[k++] = "--bind-to", av[k++] = "core";
    av[k++] = self;
    for (int i = 0; args[i] && k < 63; i++) av[k++] = args[i];
    av[k] = NULL;
    fflush(stdout);
    fflush(stderr);
    pid_t pid = fork();
    if (pid < 0) return -1;
    if (pid == 0) {
        execvp("mpirun", av);
        _exit(127);
    }
    int status;
    if (waitpid(pid, &status, 0) < 0) return -1;
    return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

// Not started by an MPI launcher: become `mpirun -np <ranks> --bind-to core <this program> <args>`,
// one BLAS thread per rank, as root with Open MPI's two consents (a caller's own choice kept).
// Does not return.
static inline _Noreturn void bench_relaunch_under_mpirun(const char *name, const char *ranks, int argc, char **argv) {
    if (getenv("BS_BENCH_RELAUNCHED"))  // mpirun ran us but set none of its variables: do not loop
        bs_die("%s: started through mpirun, but no MPI launcher's variables are set: is mpirun Open MPI?", name);
    char self[4096];
    ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
    if (n <= 0) bs_die("%s: cannot find its own path (/proc/self/exe); start it as mpirun -np %s --bind-to core %s", name,
                       ranks, name);
    self[n] = '\0';
    setenv("BS_BENCH_RELAUNCHED", "1", 1);
    // OpenBLAS sizes its thread pool when it loads, before main runs: one thread per rank
    setenv("OPENBLAS_NUM_THREADS", "1", 1);
    if (geteuid() == 0) {
        setenv("OMPI_ALLOW_RUN_AS_ROOT", "1", 0);
        setenv("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1", 0);
    }
    char **av = calloc((size_t)argc + 8, sizeof *av);
    if (!av) bs_die("out of memory");
    int k = 0;
    av[k++] = "mpirun", av[k++] = "-np", av[k++] = (char *)ranks, av[k++] = "--bind-to", av[k++] = "core";
    av[k++] = self;
    for (int i = 1; i < argc; i++) av[k++] = argv[i];
    fprintf(stderr, "%s: not started by an MPI launcher; running mpirun -np %s --bind-to core %s\n", name, ranks, self);
    fflush(stdout);
    fflush(stderr);
    execvp("mpirun", av);
    bs_die("%s: cannot run mpirun (%s): install Open MPI (apt-get install openmpi-bin), or start it under an MPI "
           "launcher yourself",
           name, strerror(errno));
}

#endif
