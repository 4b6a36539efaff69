// cli_run.h: run the built `bytescale` (its path is in $BS_BINARY, which ctest sets) and capture what
// it prints, for the end-to-end tests of the commands.
#ifndef BYTESCALE_TEST_CLI_RUN_H
#define BYTESCALE_TEST_CLI_RUN_H

#include <signal.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "bytescale/fileio.h"
#include "test_util.h"

static char cli_out[1 << 18], cli_err[1 << 16];  // the last run's stdout and stderr

static inline void cli_slurp(const char *path, char *buf, size_t cap) {
    buf[0] = '\0';
    FILE *f = fopen(path, "rb");
    if (!f) return;
    size_t n = fread(buf, 1, cap - 1, f);
    buf[n] = '\0';
    fclose(f);
}

// Before the mpirun of a 2-rank job a test kills a rank of: Open MPI's own placement for it (each
// rank bound to a core, waits spinning) instead of the suite's (CMakeLists.txt: no binding, waits
// yield). With the suite's, mpirun (Open MPI 4.1) hung now and then in its PMIx finalize after the
// ranks had died, in 9 of 35 runs of test_cli_train_kill on one core (none of 17 with its own).
#define CLI_MPIRUN_OWN_PLACEMENT "env -u OMPI_MCA_mpi_yield_when_idle -u OMPI_MCA_hwloc_base_binding_policy "

// Run `<env> bytescale <args>` with one BLAS thread, with BS_QUIET=1 when `quiet` (no progress line,
// no one-time notes) or as a person starts it; with np > 0 as an MPI job of np ranks
// (`mpirun -np <np> --oversubscribe`: more ranks than cores is fine for correctness). stdout and
// stderr pass through files in dir (an existing scratch directory) into cli_out / cli_err. Returns
// the exit code.
static inline int cli_run_job(const char *dir, int np, int quiet, const char *env, const char *args) {
    const char *bin = getenv("BS_BINARY");
    if (!bin) fail_msg("BS_BINARY is not set (run through ctest)");
    char cmd[8192], launcher[64] = "", out_path[600], err_path[600];
    if (np > 0) snprintf(launcher, sizeof launcher, "mpirun -np %d --oversubscribe ", np);
    snprintf(out_path, sizeof out_path, "%s/stdout", dir);
    snprintf(err_path, sizeof err_path, "%s/stderr", dir);
    snprintf(cmd, sizeof cmd, "%s%s OPENBLAS_NUM_THREADS=1 %s'%s' %s >%s 2>%s", env, quiet ? " BS_QUIET=1" : "",
             launcher, bin, args, out_path, err_path);
    int st = system(cmd);
    cli_slurp(out_path, cli_out, sizeof cli_out);
    cli_slurp(err_path, cli_err, sizeof cli_err);
    assert_true(WIFEXITED(st));
    return WEXITSTATUS(st);
}

// cli_run_job, quietly: what the tests start unless they look at the notes.
static inline int cli_run_np(const char *dir, int np, const char *env, const char *args) {
    return cli_run_job(dir, np, 1, env, args);
}
static inline int cli_run(const char *dir, const char *env, const char *args) { return cli_run_np(dir, 0, env, args); }

// A small Go-like corpus in <dir>/in, prepared into <dir>/data: n files f<i>.go of lines0 + step * i
// lines "if err != nil { return err }", each file at most cap - 1 bytes (the longer ones cut).
static inline void cli_make_corpus(const char *dir, int n, int lines0, int step, size_t cap) {
    char in[600], path[700], args[2048];
    snprintf(in, sizeof in, "%s/in", dir);
    assert_int_equal(make_dirs(in), 0);
    char *text = malloc(cap);
    assert_non_null(text);
    for (int f = 0; f < n; f++) {
        text[0] = '\0';
        for (int r = 0; r < lines0 + step * f; r++) strncat(text, "if err != nil { return err }\n", cap - strlen(text) - 1);
        snprintf(path, sizeof path, "%s/f%d.go", in, f);
        assert_int_equal(file_write_atomic(path, text, strlen(text)), 0);
    }
    free(text);
    snprintf(args, sizeof args, "prepare --input %s --out %s/data", in, dir);
    if (cli_run(dir, "", args) != 0) fail_msg("prepare: %s", cli_err);
}

// Run and require exit code `code` and the text in_stderr in what it printed to stderr.
static inline void cli_expect(const char *dir, const char *args, int code, const char *in_stderr) {
    int rc = cli_run(dir, "", args);
    if (rc != code || !strstr(cli_err, in_stderr))
        fail_msg("bytescale %s: exit %d (want %d), stderr: %s (want '%s')", args, rc, code, cli_err, in_stderr);
}

// The processes a started job (mpirun) runs as its children - its ranks - into pids (room for cap).
static inline int cli_children(pid_t parent, int *pids, int cap) {
    char cmd[64], line[32];
    snprintf(cmd, sizeof cmd, "pgrep -P %d", (int)parent);
    FILE *p = popen(cmd, "r");
    int n = 0;
    while (p && n < cap && fgets(line, sizeof line, p)) pids[n++] = atoi(line);
    if (p) pclose(p);
    return n;
}

// Wait up to `seconds` for pid to end (its status into *st). 0 when it did; otherwise it is
// killed, reaped, and -1 is returned: the caller reports the hang.
static inline int cli_wait_or_kill(pid_t pid, double seconds, int *st) {
    struct timespec t0, now;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    for (;;) {
        if (waitpid(pid, st, WNOHANG) != 0) return 0;
        clock_gettime(CLOCK_MONOTONIC, &now);
        if ((double)(now.tv_sec - t0.tv_sec) + 1e-9 * (double)(now.tv_nsec - t0.tv_nsec) > seconds) break;
        usleep(20000);
    }
    kill(pid, SIGKILL);
    waitpid(pid, st, 0);
    return -1;
}

// Whether process pid is the one to kill: its command line holds `victim_cmd` when that is given,
// else its world rank (Open MPI's OMPI_COMM_WORLD_RANK in its environment) is `victim_rank`.
static inline int cli_is_victim(int pid, const char *victim_cmd, int victim_rank) {
    char path[64], buf[1 << 15];
    snprintf(path, sizeof path, "/proc/%d/%s", pid, victim_cmd ? "cmdline" : "environ");
    FILE *f = fopen(path, "rb");
    size_t got = f ? fread(buf, 1, sizeof buf - 1, f) : 0;
    if (f) fclose(f);
    buf[got] = '\0';
    if (victim_cmd) {
        for (size_t j = 0; j < got; j++)
            if (buf[j] == '\0') buf[j] = ' ';
        return strstr(buf, victim_cmd) != NULL;
    }
    for (size_t i = 0; i < got; i += strlen(buf + i) + 1)
        if (strncmp(buf + i, "OMPI_COMM_WORLD_RANK=", 21) == 0) return atoi(buf + i + 21) == victim_rank;
    return 0;
}

// Start `sh -c cmd` (an mpirun job), wait until the file `started` exists (its first step is done),
// SIGKILL the job's process whose command line holds `victim_cmd` (or, with victim_cmd NULL, the
// process of world rank `victim_rank`), and wait for the job to end: 0 with its status in *st. -1
// with the reason in cli_err when the job never got going or hung after the kill (it is killed
// then). The waits are bounded but generous, for a loaded machine.
static inline int cli_kill_mid_run(const char *cmd, const char *started, const char *victim_cmd, int victim_rank,
                                   int *st) {
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        execl("/bin/sh", "sh", "-c", cmd, (char *)NULL);
        _exit(127);
    }
    int child = -1;
    for (int i = 0; i < 6000 && child < 0; i++) {
        usleep(50000);
        if (access(started, F_OK) != 0) continue;
        // the ranks are mpirun's children; mpirun is ours, or the shell's when it did not exec it
        int pids[64], n = cli_children(pid, pids, 32);
        for (int k = 0, m = n; k < m && n < 64; k++) n += cli_children(pids[k], pids + n, 64 - n);
        for (int k = 0; k < n && child < 0; k++)
            if (cli_is_victim(pids[k], victim_cmd, victim_rank)) child = pids[k];
    }
    if (child < 0) {
        kill(pid, SIGKILL);
        waitpid(pid, NULL, 0);
        snprintf(cli_err, sizeof cli_err, "the job never got going");
        return -1;
    }
    kill(child, SIGKILL);
    if (cli_wait_or_kill(pid, 300, st) != 0) {
        snprintf(cli_err, sizeof cli_err, "the job hung after its process '%s' (rank %d) was killed",
                 victim_cmd ? victim_cmd : "", victim_rank);
        return -1;
    }
    return 0;
}

static inline int cli_kill_child_mid_run(const char *cmd, const char *started, const char *victim, int *st) {
    return cli_kill_mid_run(cmd, started, victim, -1, st);
}

#endif
