// test_cli_train_all.c: every feature of the engine in one job, as ByteScale runs them together:
// `mpirun -np 9 bytescale train --tp 2 --pp 2 --servers 1 --offload-tier file --mem-budget B
// --policy elastic`, 2 HDP ranks of 2 stages of 2 tensor-parallel processes each, and a data server.
// Every sequence is longer than what 2 ranks hold without offloading, so every step runs rings whose
// members offload. Checked against independent runs:
// - the losses of one process (no rings, no tp, no stages, no offloading, local shards) within 1e-5;
// - every process's peak activation bytes within B, bytes moved to the tier on every process, tokens
//   fetched from the server, rings in every step;
// - kill -9 of a stage-1 process mid-run ends the job (no process left waiting) naming the rank,
//   and the newest checkpoint resumes the run exactly (bit for bit on the same layout).
// The server's kill -9 under 3D is test_cli_serve_3d's.
// ctest: long (9-process jobs of the `base` model)
// ctest: cost 120
// ctest: slow (each feature's own test runs under the sanitizers; nine sanitized processes of `base`
// on two cores would take the ASan pass past its budget)
#include "cli/cli_run.h"

#include <math.h>

#include <cJSON.h>

#include "bytescale/fileio.h"

#define DIR "test-tmp/cli_train_all"
// files of 600 .. 2,580 bytes cut at the 512-token context: 2 sequences of 512 tokens per step, so
// that each HDP rank's pipeline has 2 micro-batches, both in flight on stage 0 (4 sequences made the
// same rings at twice the time). The budget gives a capacity of about 220 tokens, so 2 ranks hold 440
// without offloading: every sequence rings over both HDP ranks and offloads (Eq. 3).
#define BUDGET (68ll << 20)
#define COMMON "--data " DIR "/data --model base --context 512 --tokens 1K --lr 3e-3 --warmup 1 --seed 7"
#define ALL                                                                                                       \
    "--tp 2 --pp 2 --servers 1 --offload-tier file --offload-dir " DIR " --mem-budget 68M --policy elastic"
// 2 steps: step 2's loss holds step 1's update, made from the gradients of the offloaded, pipelined,
// tensor-parallel backward over the rings; the kill comes in step 2 and the resume repeats it. Steps
// 3 and 4 checked the same again, at twice the test's time.
#define STEPS 2

static int setup(void **state) {
    (void)state;
    test_tmpdir("cli_train_all");
    cli_make_corpus(DIR, 12, 20, 6, 2600);
    return 0;
}

// Losses by step (1-based) from a metrics file; with `per_rank`, checks every process's entry of
// every step against the budget and the features: n processes, rings, tier bytes, fetched tokens.
static int read_losses(const char *path, double *loss, int cap, int per_rank) {
    char *text;
    size_t len;
    assert_int_equal(file_read_all(path, &text, &len), 0);
    int lines = 0;
    for (char *line = text; *line;) {
        char *nl = strchr(line, '\n');
        assert_non_null(nl);
        *nl = '\0';
        cJSON *o = cJSON_Parse(line);
        if (!o) fail_msg("%s: not JSON: %s", path, line);
        int step = (int)cJSON_GetObjectItemCaseSensitive(o, "step")->valuedouble;
        assert_true(step >= 1 && step <= cap);
        loss[step] = cJSON_GetObjectItemCaseSensitive(o, "loss")->valuedouble;
        const cJSON *ranks = cJSON_GetObjectItemCaseSensitive(o, "ranks"), *r;
        double fetched = 0;
        if (per_rank) {
            assert_int_equal(cJSON_GetArraySize(ranks), 8);
            cJSON_ArrayForEach(r, ranks) {
                double peak = cJSON_GetObjectItemCaseSensitive(r, "act_peak_bytes")->valuedouble;
                double moved = cJSON_GetObjectItemCaseSensitive(r, "offload_bytes")->valuedouble;
                int rings = (int)cJSON_GetObjectItemCaseSensitive(r, "rings")->valuedouble;
                if (!(peak > 0 && peak <= (double)BUDGET))
                    fail_msg("step %d: a process held %.0f activation bytes, budget %lld", step, peak, BUDGET);
                if (!(moved > 0)) fail_msg("step %d: a process moved nothing to the tier", step);
                if (rings < 1) fail_msg("step %d: a process ran no ring", step);
                fetched += cJSON_GetObjectItemCaseSensitive(r, "fetch_bytes")->valuedouble;
            }
            if (!(fetched > 0)) fail_msg("step %d: nothing came from the data server", step);
        }
        cJSON_Delete(o);
        lines++;
        line = nl + 1;
    }
    free(text);
    return lines;
}

static void test_everything_in_one_job(void **state) {
    (void)state;
    double one[STEPS + 1] = {0}, all[STEPS + 1] = {0};
    int rc = cli_run(DIR, "", "train " COMMON " --steps 2 --metrics " DIR "/one.jsonl");
    if (rc != 0) fail_msg("one process: exit %d: %s", rc, cli_err);
    assert_int_equal(read_losses(DIR "/one.jsonl", one, STEPS, 0), STEPS);

    // (no checkpoints: the killed run below writes them, with every feature on, and resumes from one)
    rc = cli_run_np(DIR, 9, "", "train " COMMON " " ALL " --steps 2 --metrics " DIR "/all.jsonl");
    if (rc != 0) fail_msg("everything: exit %d: %s", rc, cli_err);
    if (!strstr(cli_out, "8 processes = tp 2 x pp 2 x hdp 2") || !strstr(cli_out, "1 data server"))
        fail_msg("the layout or the server is not named: %s", cli_out);
    assert_int_equal(read_losses(DIR "/all.jsonl", all, STEPS, 1), STEPS);
    for (int s = 1; s <= STEPS; s++)
        if (!(fabs(all[s] - one[s]) <= 1e-5 * fabs(one[s])))
            fail_msg("step %d: loss %.9g, one process %.9g", s, all[s], one[s]);
}

// kill -9 of world rank 5 (stage 1, HDP rank 0, tp rank 1) after the first checkpoint: the job
// ends naming the rank; the newest checkpoint, resumed on the same layout, gives the uninterrupted
// run's losses bit for bit (that run is test_everything_in_one_job's).
static void test_killed_stage_ends_the_job_and_resumes_exactly(void **state) {
    (void)state;
    double all[STEPS + 1] = {0}, resumed[STEPS + 1] = {0};
    assert_int_equal(read_losses(DIR "/all.jsonl", all, STEPS, 1), STEPS);
    const char *bin = getenv("BS_BINARY");
    assert_non_null(bin);
    char cmd[4096];
    snprintf(cmd, sizeof cmd,
             "BS_QUIET=1 OPENBLAS_NUM_THREADS=1 mpirun -np 9 --oversubscribe '%s' train " COMMON " " ALL
             " --steps 2 --ckpt-dir " DIR "/kk --ckpt-every 1 --ckpt-keep 0 --metrics " DIR "/killed.jsonl > " DIR
             "/k.out 2> " DIR "/k.err",
             bin);
    int st = 0;
    if (cli_kill_mid_run(cmd, DIR "/kk/ckpt-000001.bin", NULL, 5, &st) != 0) fail_msg("%s", cli_err);
    assert_true(!WIFEXITED(st) || WEXITSTATUS(st) != 0);
    cli_slurp(DIR "/k.err", cli_err, sizeof cli_err);
    if (!strstr(cli_err, "rank 5") || !strstr(cli_err, "signal 9")) fail_msg("unclear message: %s", cli_err);

    // the newest checkpoint the killed run left
    int newest = 0;
    for (int s = 1; s <= STEPS; s++) {
        char p[256];
        snprintf(p, sizeof p, DIR "/kk/ckpt-%06d.bin", s);
        if (access(p, F_OK) == 0) newest = s;
    }
    assert_true(newest >= 1);
    if (newest >= STEPS) return;  // the kill came late: nothing left to compare
    char args[1024];
    snprintf(args, sizeof args,
             "train " ALL " --resume " DIR "/kk/ckpt-%06d.bin --steps %d --metrics " DIR "/resumed.jsonl", newest, STEPS);
    int rc = cli_run_np(DIR, 9, "", args);
    if (rc != 0) fail_msg("resume: exit %d: %s", rc, cli_err);
    read_losses(DIR "/resumed.jsonl", resumed, STEPS, 1);
    for (int s = newest + 1; s <= STEPS; s++)
        if (resumed[s] != all[s]) fail_msg("step %d: resumed loss %.9g, uninterrupted %.9g", s, resumed[s], all[s]);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_everything_in_one_job),
        cmocka_unit_test(test_killed_stage_ends_the_job_and_resumes_exactly),
    };
    return cmocka_run_group_tests(tests, setup, NULL);
}
