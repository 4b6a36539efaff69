// test_cli_train_mpi.c: `mpirun -np N bytescale train` end to end - HDP training with rings and packs
// on 2 ranks writes per-rank metrics and one trace with a track per rank; a checkpoint made on 2
// ranks resumes on 3 and continues the uninterrupted run; a rank that fails (an injected read error)
// or is killed ends the whole job within seconds with a message naming it, and the last checkpoint
// stays usable.
#include "cli/cli_run.h"

#include <math.h>
#include <signal.h>
#include <time.h>
#include <unistd.h>

#include <cJSON.h>

#include "bytescale/fileio.h"
#include "bytescale/timer.h"

#define DIR "test-tmp/cli_train_mpi"
#define COMMON "--data " DIR "/data --model tiny --context 512 --capacity 256 --tokens 1024 --lr 3e-3 --warmup 1"

// `mpirun -np N bytescale <args>` with `env` before it; output into cli_out / cli_err. Exit code.
static int mpi_run(int np, const char *env, const char *args) { return cli_run_np(DIR, np, env, args); }

// Files up to 2,000 bytes: with context 512 and capacity 256 the long ones train as 2-rank rings.
static void make_data(void) {
    test_tmpdir("cli_train_mpi");
    cli_make_corpus(DIR, 12, 3, 6, 2100);
}

// The losses of a metrics file, by step (1-based), and how many lines had a 2-entry "ranks" array
// and a ring in the plan.
static int read_losses(const char *path, double *loss, int cap, int n_ranks, int *with_rings) {
    char *text;
    size_t n;
    assert_int_equal(file_read_all(path, &text, &n), 0);
    int lines = 0;
    *with_rings = 0;
    for (char *line = text; *line;) {
        char *nl = strchr(line, '\n');
        assert_non_null(nl);
        *nl = '\0';
        cJSON *o = cJSON_Parse(line);
        if (!o) fail_msg("%s: not JSON: %s", path, line);
        int step = (int)cJSON_GetObjectItemCaseSensitive(o, "step")->valuedouble;
        assert_true(step >= 1 && step <= cap);
        loss[step] = cJSON_GetObjectItemCaseSensitive(o, "loss")->valuedouble;
        const cJSON *ranks = cJSON_GetObjectItemCaseSensitive(o, "ranks");
        assert_int_equal(cJSON_GetArraySize(ranks), n_ranks);
        const cJSON *r;
        cJSON_ArrayForEach(r, ranks) {
            const char *keys[] = {"compute", "comm", "wait", "tokens_per_s"};
            for (int k = 0; k < 4; k++) assert_true(cJSON_IsNumber(cJSON_GetObjectItemCaseSensitive(r, keys[k])));
            assert_true(cJSON_GetObjectItemCaseSensitive(r, "compute")->valuedouble > 0);
        }
        *with_rings += cJSON_GetObjectItemCaseSensitive(o, "plan_rings")->valuedouble > 0;
        cJSON_Delete(o);
        lines++;
        line = nl + 1;
    }
    free(text);
    return lines;
}

static void test_two_ranks_metrics_trace_resume_on_three(void **state) {
    (void)state;
    make_data();
    int rc = mpi_run(2, "", "train " COMMON " --steps 6 --metrics " DIR "/u.jsonl");
    if (rc != 0) fail_msg("uninterrupted run: exit %d: %s", rc, cli_err);
    rc = mpi_run(2, "", "train " COMMON " --steps 6 --ckpt-dir " DIR "/ck --ckpt-every 2 --ckpt-keep 0 --metrics " DIR
                        "/a.jsonl --trace " DIR "/a.json");
    if (rc != 0) fail_msg("2 ranks: exit %d: %s", rc, cli_err);
    assert_non_null(strstr(cli_out, "2 ranks"));
    double u[8] = {0}, a[8] = {0};
    int rings;
    assert_int_equal(read_losses(DIR "/u.jsonl", u, 7, 2, &rings), 6);
    assert_int_equal(read_losses(DIR "/a.jsonl", a, 7, 2, &rings), 6);
    assert_true(rings > 0);  // the long files ran as rings
    // checkpoints and the trace change nothing: same ranks, same batches, bit for bit
    for (int s = 1; s <= 6; s++) assert_true(a[s] == u[s]);

    // the trace: one JSON, a track per rank, ring blocks on both
    char *text;
    size_t n;
    assert_int_equal(file_read_all(DIR "/a.json", &text, &n), 0);
    cJSON *tr = cJSON_Parse(text);
    free(text);
    assert_non_null(tr);
    int blocks[2] = {0}, syncs[2] = {0};
    const cJSON *e;
    cJSON_ArrayForEach(e, cJSON_GetObjectItemCaseSensitive(tr, "traceEvents")) {
        const char *ph = cJSON_GetObjectItemCaseSensitive(e, "ph")->valuestring, *name;
        if (strcmp(ph, "X") != 0) continue;
        int tid = (int)cJSON_GetObjectItemCaseSensitive(e, "tid")->valuedouble;
        assert_true(tid == 0 || tid == 1);
        name = cJSON_GetObjectItemCaseSensitive(e, "name")->valuestring;
        blocks[tid] += strstr(name, "ring fwd block") != NULL;
        syncs[tid] += strstr(name, "reduce-scatter") != NULL;
    }
    cJSON_Delete(tr);
    assert_true(blocks[0] > 0 && blocks[1] > 0);
    assert_int_equal(syncs[0], 6);
    assert_int_equal(syncs[1], 6);

    // resume the 2-rank checkpoint on 3 ranks: the same model state, another plan
    rc = mpi_run(3, "", "train " COMMON " --steps 6 --metrics " DIR "/b.jsonl --resume " DIR "/ck/ckpt-000004.bin");
    if (rc != 0) fail_msg("resume on 3 ranks: exit %d: %s", rc, cli_err);
    assert_non_null(strstr(cli_out, "3 ranks"));
    // and on one process, which cannot form its rings: refused by the command line (exit 2), naming
    // the checkpoint's context and capacity (the resumed run keeps them, so only more ranks help)
    rc = mpi_run(0, "", "train --steps 6 --resume " DIR "/ck/ckpt-000004.bin");
    assert_int_equal(rc, 2);
    if (!strstr(cli_err, "the checkpoint's context 512 exceeds its capacity 256") ||
        !strstr(cli_err, "a resumed run keeps its checkpoint's settings"))
        fail_msg("resume on one process: %s", cli_err);
}

static void test_resumed_on_three_continues(void **state) {
    (void)state;
    // (b.jsonl holds steps 5-6 resumed on 3 ranks from the 2-rank checkpoint; u.jsonl the uninterrupted run)
    double u[8] = {0};
    int rings;
    read_losses(DIR "/u.jsonl", u, 7, 2, &rings);
    char *text;
    size_t n;
    assert_int_equal(file_read_all(DIR "/b.jsonl", &text, &n), 0);
    int checked = 0;
    for (char *line = text; *line;) {
        char *nl = strchr(line, '\n');
        *nl = '\0';
        cJSON *o = cJSON_Parse(line);
        int step = (int)cJSON_GetObjectItemCaseSensitive(o, "step")->valuedouble;
        double loss = cJSON_GetObjectItemCaseSensitive(o, "loss")->valuedouble;
        if (step >= 5) {
            assert_int_equal(cJSON_GetArraySize(cJSON_GetObjectItemCaseSensitive(o, "ranks")), 3);
            if (fabs(loss - u[step]) > 1e-4 * u[step])
                fail_msg("step %d resumed on 3 ranks: loss %.9g, uninterrupted on 2: %.9g", step, loss, u[step]);
            checked++;
        }
        cJSON_Delete(o);
        line = nl + 1;
    }
    free(text);
    assert_int_equal(checked, 2);
}

// One rank's read fails at step 3: the job ends with the rank and the cause, never waiting for the
// failed rank; the step-2 checkpoint resumes. (No wall-clock assertion: on a loaded machine the
// job is slow, not wrong. A hang is what must not happen: `timeout` ends a job still running after
// 5 minutes, exit 124.)
static void test_failing_rank_ends_the_job(void **state) {
    (void)state;
    int rc = mpi_run(2, "BS_FAIL_RANK=1 BS_FAIL_STEP=4 timeout 300 env",
                     "train " COMMON " --steps 8 --ckpt-dir " DIR "/ck2 --ckpt-every 2");
    if (rc == 124) fail_msg("the job still ran 5 minutes after a rank failed: a hang");
    assert_int_not_equal(rc, 0);
    if (!strstr(cli_err, "rank 1 of 2") || !strstr(cli_err, "injected fault"))
        fail_msg("the message does not name the rank and cause: %s", cli_err);
    rc = mpi_run(2, "", "train " COMMON " --steps 3 --resume " DIR "/ck2/ckpt-000002.bin");
    if (rc != 0) fail_msg("resume after the failure: exit %d: %s", rc, cli_err);
}

// kill -9 one rank mid-run: mpirun ends the job (no rank hangs), and says which rank died.
static void test_killed_rank_ends_the_job(void **state) {
    (void)state;
    const char *bin = getenv("BS_BINARY");
    char cmd[4096];
    snprintf(cmd, sizeof cmd,
             "BS_QUIET=1 OPENBLAS_NUM_THREADS=1 exec " CLI_MPIRUN_OWN_PLACEMENT "mpirun -np 2 --oversubscribe '%s' train " COMMON
             " --steps 100000 --metrics " DIR "/k.jsonl >" DIR "/kout 2>" DIR "/kerr",
             bin);
    unlink(DIR "/k.jsonl");
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        execl("/bin/sh", "sh", "-c", cmd, (char *)NULL);
        _exit(127);
    }
    // wait for the first finished step (a bounded wait, generous for a loaded machine)
    for (int i = 0; i < 3000; i++) {
        FILE *f = fopen(DIR "/k.jsonl", "r");
        int ch = f ? fgetc(f) : EOF;
        if (f) fclose(f);
        if (ch == '{') break;
        usleep(100000);
    }
    // the ranks are mpirun's children: kill the second one
    int ranks[4], n = cli_children(pid, ranks, 4);
    if (n < 2) {
        kill(pid, SIGKILL);
        fail_msg("found %d rank processes under mpirun %d", n, (int)pid);
    }
    kill(ranks[1], SIGKILL);
    double t0 = now_seconds();
    int st = 0;
    // mpirun ends the job at once on a quiet machine (about a second); a loaded one may take longer,
    // so only a job still running after 5 minutes is a hang (no wall-clock assertion beyond that)
    if (cli_wait_or_kill(pid, 300, &st) != 0) fail_msg("the job still ran 5 minutes after a rank was killed: a hang");
    double took = now_seconds() - t0;
    cli_slurp(DIR "/kerr", cli_err, sizeof cli_err);
    assert_true(!WIFEXITED(st) || WEXITSTATUS(st) != 0);
    if (!strstr(cli_err, "signal 9") && !strstr(cli_err, "Killed")) fail_msg("no word of the killed rank: %s", cli_err);
    print_message("killed rank: the job ended %.1f s later\n", took);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_two_ranks_metrics_trace_resume_on_three),
        cmocka_unit_test(test_resumed_on_three_continues),
        cmocka_unit_test(test_failing_rank_ends_the_job),
        cmocka_unit_test(test_killed_rank_ends_the_job),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
