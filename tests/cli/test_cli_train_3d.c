// test_cli_train_3d.c: `mpirun -np N bytescale train --tp T --pp P` end to end: the layout and the
// stages' layers printed at start; per-process metrics with stage, tp and HDP ranks; one trace with
// a track per process where the pipeline's waits show; a checkpoint of the 2 x 2 layout resumed on
// one process continues the run; the tp all-reduces overlapped or blocking (BS_TP_OVERLAP=0) give
// the same losses; wrong layouts refused with the numbers; a failing process ends the job naming
// its rank and stage.
#include "cli/cli_run.h"

#include <math.h>

#include <cJSON.h>

#include "bytescale/fileio.h"
#include "bytescale/model.h"

#define DIR "test-tmp/cli_train_3d"
#define COMMON "--data " DIR "/data --model tiny --context 256 --capacity 256 --tokens 1024 --lr 3e-3 --warmup 1"

static int mpi_run(int np, const char *env, const char *args) { return cli_run_np(DIR, np, env, args); }

static int setup(void **state) {
    (void)state;
    test_tmpdir("cli_train_3d");
    cli_make_corpus(DIR, 12, 3, 6, 2100);
    return 0;
}

// Of the rank lines read_metrics saw with tp > 1: how many, and in how many the tp all-reduces'
// total time exceeded the exposed time (something overlapped).
static int tp_ranks, tp_overlapped;

// Loss by step (1-based) from a metrics file; checks every line's ranks array: n entries, each with
// its place in the layout, every (stage, tp) of the layout present.
static int read_metrics(const char *path, double *loss, int cap, int n, int tp, int pp) {
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
        assert_int_equal(cJSON_GetArraySize(ranks), n);
        int seen[16] = {0};
        cJSON_ArrayForEach(r, ranks) {
            int s = (int)cJSON_GetObjectItemCaseSensitive(r, "stage")->valuedouble;
            int t = (int)cJSON_GetObjectItemCaseSensitive(r, "tp_rank")->valuedouble;
            assert_true(s >= 0 && s < pp && t >= 0 && t < tp);
            seen[s * tp + t]++;
            assert_true(cJSON_IsNumber(cJSON_GetObjectItemCaseSensitive(r, "p2p_wait")));
            assert_true(cJSON_IsNumber(cJSON_GetObjectItemCaseSensitive(r, "bubble")));
            if (tp > 1) {
                double exposed = cJSON_GetObjectItemCaseSensitive(r, "tp_seconds")->valuedouble;
                double total = cJSON_GetObjectItemCaseSensitive(r, "tp_total_seconds")->valuedouble;
                assert_true(exposed > 0 && total >= exposed);
                tp_overlapped += total > exposed, tp_ranks++;
            }
            if (pp > 1) assert_true(cJSON_GetObjectItemCaseSensitive(r, "p2p_bytes")->valuedouble > 0);
        }
        for (int i = 0; i < tp * pp; i++) assert_int_equal(seen[i], n / (tp * pp));
        cJSON_Delete(o);
        lines++;
        line = nl + 1;
    }
    free(text);
    return lines;
}

static void test_tp2_pp2_trains_traces_and_resumes_anywhere(void **state) {
    (void)state;
    int rc = mpi_run(4, "", "train " COMMON " --tp 2 --pp 2 --steps 4 --ckpt-dir " DIR "/ck --ckpt-every 2 --ckpt-keep 0 "
                            "--metrics " DIR "/a.jsonl --trace " DIR "/a.json");
    if (rc != 0) fail_msg("tp 2 pp 2: exit %d: %s", rc, cli_err);
    if (!strstr(cli_out, "4 processes = tp 2 x pp 2 x hdp 1") || !strstr(cli_out, "stage 0: layers 0..0 + embedding") ||
        !strstr(cli_out, "stage 1: layers 1..1 + head + loss"))
        fail_msg("the layout is not printed: %s", cli_out);
    // the start line: the whole model's parameters and rank 0's share (stage 0: the embedding and layer
    // 0, tp rank 0: half of every split tensor), counted here from tiny's shapes
    const ModelConfig *m = model_find("tiny");
    int D = m->d_model, Q = m->n_heads * m->head_dim / 2, KV = m->n_kv_heads * m->head_dim / 2, F = m->d_ff / 2;
    double share = (double)m->vocab_size / 2 * D + 2 * D + (double)(Q + 2 * KV) * D + (double)D * Q + 3.0 * F * D;
    char want[128];
    // (then the vocabulary, which follows the dataset: ", vocabulary 256: the dataset's byte tokenizer)")
    snprintf(want, sizeof want, "model tiny (%.2fM parameters, %.2fM on this process, vocabulary 256",
             (double)model_params_total(m) / 1e6, share / 1e6);
    if (!strstr(cli_out, want)) fail_msg("the start line does not say '%s': %s", want, cli_out);
    double a[6] = {0}, one[6] = {0};
    assert_int_equal(read_metrics(DIR "/a.jsonl", a, 5, 4, 2, 2), 4);

    // the trace: a track per process; forwards and backwards on all; stage 1 waits for activations
    char *text;
    size_t n;
    assert_int_equal(file_read_all(DIR "/a.json", &text, &n), 0);
    cJSON *tr = cJSON_Parse(text);
    free(text);
    assert_non_null(tr);
    int fwd[4] = {0}, bwd[4] = {0}, waits = 0;
    const cJSON *e;
    cJSON_ArrayForEach(e, cJSON_GetObjectItemCaseSensitive(tr, "traceEvents")) {
        if (strcmp(cJSON_GetObjectItemCaseSensitive(e, "ph")->valuestring, "X") != 0) continue;
        int tid = (int)cJSON_GetObjectItemCaseSensitive(e, "tid")->valuedouble;
        assert_true(tid >= 0 && tid < 4);
        const char *name = cJSON_GetObjectItemCaseSensitive(e, "name")->valuestring;
        fwd[tid] += strcmp(name, "pack fwd") == 0;
        bwd[tid] += strcmp(name, "pack bwd") == 0;
        waits += strncmp(name, "wait activations", 16) == 0 && tid >= 2;  // world ranks 2, 3: stage 1
    }
    cJSON_Delete(tr);
    for (int r = 0; r < 4; r++) {
        assert_true(fwd[r] > 0);
        assert_int_equal(fwd[r], bwd[r]);
    }
    assert_true(waits > 0);

    // the same run on one process: the same losses to fp32 rounding
    rc = mpi_run(0, "", "train " COMMON " --steps 4 --metrics " DIR "/one.jsonl");
    if (rc != 0) fail_msg("one process: exit %d: %s", rc, cli_err);
    assert_int_equal(read_metrics(DIR "/one.jsonl", one, 5, 1, 1, 1), 4);
    for (int s = 1; s <= 4; s++)
        if (fabs(a[s] - one[s]) > 1e-5 * one[s]) fail_msg("step %d: tp 2 pp 2 loss %.9g, one process %.9g", s, a[s], one[s]);

    // the 2 x 2 checkpoint of step 2 on one process, and on tp 1 pp 2: steps 3 and 4 continue the run
    rc = mpi_run(0, "", "train " COMMON " --steps 4 --metrics " DIR "/b.jsonl --resume " DIR "/ck/ckpt-000002.bin");
    if (rc != 0) fail_msg("resume on one process: exit %d: %s", rc, cli_err);
    double b[6] = {0};
    assert_int_equal(read_metrics(DIR "/b.jsonl", b, 5, 1, 1, 1), 2);  // steps 3 and 4
    rc = mpi_run(2, "", "train " COMMON " --pp 2 --steps 4 --metrics " DIR "/c.jsonl --resume " DIR "/ck/ckpt-000002.bin");
    if (rc != 0) fail_msg("resume on tp 1 pp 2: exit %d: %s", rc, cli_err);
    double c[6] = {0};
    assert_int_equal(read_metrics(DIR "/c.jsonl", c, 5, 2, 1, 2), 2);
    for (int s = 3; s <= 4; s++) {
        if (fabs(b[s] - a[s]) > 1e-5 * a[s]) fail_msg("step %d resumed on 1 process: %.9g, uninterrupted %.9g", s, b[s], a[s]);
        if (fabs(c[s] - a[s]) > 1e-5 * a[s]) fail_msg("step %d resumed on pp 2: %.9g, uninterrupted %.9g", s, c[s], a[s]);
    }
}

// tp 2 on 2 processes with the backward's all-reduces overlapped (the default) and blocking
// (BS_TP_OVERLAP=0): the same losses, bit for bit; every rank's total all-reduce time above the
// exposed one when overlapped, the same figure when blocking.
static void test_tp_overlap_or_blocking(void **state) {
    (void)state;
    double a[4] = {0}, b[4] = {0};
    const char *env[2] = {"", "BS_TP_OVERLAP=0"}, *out[2] = {DIR "/ov.jsonl", DIR "/bl.jsonl"};
    double *loss[2] = {a, b};
    for (int k = 0; k < 2; k++) {
        char args[512];
        snprintf(args, sizeof args, "train " COMMON " --tp 2 --steps 3 --metrics %s", out[k]);
        int rc = mpi_run(2, env[k], args);
        if (rc != 0) fail_msg("tp 2 %s: exit %d: %s", k ? "blocking" : "overlapped", rc, cli_err);
        tp_ranks = tp_overlapped = 0;
        assert_int_equal(read_metrics(out[k], loss[k], 3, 2, 2, 1), 3);
        assert_int_equal(tp_ranks, 6);
        assert_int_equal(tp_overlapped, k ? 0 : 6);
    }
    assert_memory_equal(a, b, sizeof a);
}

// Each wrong layout is refused before anything runs, with the numbers that make it wrong: a usage
// error (exit 2, README.md "Exit codes and errors").
static void test_wrong_layouts_are_refused(void **state) {
    (void)state;
    struct {
        int np;
        const char *flags, *want;
    } cases[] = {
        {3, "--tp 2", "error: rank 0 of 3: --tp 2 needs a multiple of 2 processes, and this job has 3"},
        {3, "--pp 3", "--pp 3: model tiny has 2 layers, so at most 2 stages"},
        {3, "--tp 3", "--tp 3: tensor parallelism 3 does not divide n_heads 4"},
        {2, "--tp 0", "--tp must be in [1, 4096]"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char args[512];
        snprintf(args, sizeof args, "train " COMMON " --steps 1 %s", cases[i].flags);
        int rc = mpi_run(cases[i].np, "", args);
        if (rc != 2 || !strstr(cli_err, cases[i].want))
            fail_msg("-np %d %s: exit %d, expected an error with \"%s\": %s", cases[i].np, cases[i].flags, rc,
                     cases[i].want, cli_err);
    }
    // a budget no micro-batch fits is the run's refusal (exit 1), naming the stage's share
    int rc = mpi_run(2, "", "train " COMMON " --steps 1 --pp 2 --offload-tier memory --mem-budget 1M");
    if (rc != 1 || !strstr(cli_err, "per micro-batch: stage 0 of 2 holds 2 at once"))
        fail_msg("--pp 2 --mem-budget 1M: exit %d: %s", rc, cli_err);
}

// A process of stage 1 fails reading its rows: the job ends, naming its rank, stage and the cause.
static void test_failing_stage_ends_the_job(void **state) {
    (void)state;
    int rc = mpi_run(4, "BS_FAIL_RANK=3 BS_FAIL_STEP=2", "train " COMMON " --tp 2 --pp 2 --steps 4");
    assert_int_not_equal(rc, 0);
    if (!strstr(cli_err, "rank 3 of 4") || !strstr(cli_err, "stage 1 of 2") || !strstr(cli_err, "injected fault"))
        fail_msg("the message does not name the rank, the stage and the cause: %s", cli_err);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_tp2_pp2_trains_traces_and_resumes_anywhere),
        cmocka_unit_test(test_tp_overlap_or_blocking),
        cmocka_unit_test(test_wrong_layouts_are_refused),
        cmocka_unit_test(test_failing_stage_ends_the_job),
    };
    return cmocka_run_group_tests(tests, setup, NULL);
}
