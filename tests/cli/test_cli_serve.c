// test_cli_serve.c: training through data servers (the remote data loader, docs/loader.md).
//
// - The same run trained from local shards and through 1 to 3 servers with 1 to 4 training ranks,
//   in both job forms (`train --servers N` and MPMD `train ... : serve ...`): the batches (every
//   step's plan file), the losses and the gradient norms are bit for bit the same, and each rank
//   read only about its share of the batch's tokens.
// - Text: servers of a directory of text files tokenize it themselves (through a tiny cache): the
//   same training as the prepared dataset of those files.
// - Resume: a checkpoint of a run with 2 servers continues with 1 server exactly as the run without
//   a break.
// - Faults: a server that cannot open its data, a request for a range a server does not hold, and a
//   server killed mid-run each end the job with a message naming the server; none hangs.
// ctest: long (MPI jobs with data servers, and their faults)
#include "cli/cli_run.h"

#include <math.h>

#include <cJSON.h>

#include "bytescale/fileio.h"
#include "test_corpus.h"

#define SDIR "test-tmp/cli_serve"
#define COMMON "--model tiny --context 1K --tokens 4K --lr 3e-3 --warmup 1 --policy balance"

enum { MAX_STEPS = 8 };

typedef struct {
    double loss[MAX_STEPS + 1], grad_norm[MAX_STEPS + 1];
    double load_bytes[MAX_STEPS + 1];  // the most any rank read
    int steps;
} Run;

static void read_run(const char *path, Run *r) {
    memset(r, 0, sizeof *r);
    char *text;
    size_t n;
    if (file_read_all(path, &text, &n) != 0) fail_msg("%s", bs_errmsg());
    for (char *line = text, *nl; (nl = strchr(line, '\n')); line = nl + 1) {
        *nl = '\0';
        cJSON *o = cJSON_Parse(line);
        if (!o) fail_msg("%s: not JSON: %s", path, line);
        int s = (int)cJSON_GetObjectItemCaseSensitive(o, "step")->valuedouble;
        assert_true(s >= 1 && s <= MAX_STEPS);
        r->loss[s] = cJSON_GetObjectItemCaseSensitive(o, "loss")->valuedouble;
        r->grad_norm[s] = cJSON_GetObjectItemCaseSensitive(o, "grad_norm")->valuedouble;
        const cJSON *rk;
        cJSON_ArrayForEach(rk, cJSON_GetObjectItemCaseSensitive(o, "ranks")) {
            const cJSON *b = cJSON_GetObjectItemCaseSensitive(rk, "load_bytes");
            assert_true(cJSON_IsNumber(b));
            r->load_bytes[s] = fmax(r->load_bytes[s], b->valuedouble);
        }
        cJSON_Delete(o);
        r->steps++;
    }
    free(text);
}

static void make_data(void) {
    test_tmpdir("cli_serve");
    char data[600];
    if (test_corpus_make(SDIR, 40, 50, 1500, 7, data, sizeof data) != 0) fail_msg("corpus: %s", bs_errmsg());
}

// Two plan files are the same bytes.
static int same_file(const char *a, const char *b) {
    char *x, *y;
    size_t nx, ny;
    if (file_read_all(a, &x, &nx) != 0) fail_msg("%s", bs_errmsg());
    if (file_read_all(b, &y, &ny) != 0) fail_msg("%s", bs_errmsg());
    int same = nx == ny && memcmp(x, y, nx) == 0;
    free(x), free(y);
    return same;
}

// `mpirun -np clients train ... : -np servers serve ...` (mpmd) or `-np clients+servers train
// --servers N` (servers 0: local shards, clients ranks).
static int run_job(int clients, int servers, int mpmd, const char *env, const char *extra, const char *tag) {
    const char *bin = getenv("BS_BINARY");
    char args[4096];
    int np = clients + (mpmd ? 0 : servers);
    char tail[1200] = "";
    if (servers > 0 && mpmd) snprintf(tail, sizeof tail, " : -np %d '%s' serve --data " SDIR "/data", servers, bin);
    else if (servers > 0) snprintf(tail, sizeof tail, " --servers %d", servers);
    snprintf(args, sizeof args,
             "train --data " SDIR "/data " COMMON " --metrics " SDIR "/%s.jsonl --save-plans " SDIR "/%s.plans %s%s",
             tag, tag, extra, tail);
    char dir[600];
    snprintf(dir, sizeof dir, SDIR "/%s.plans", tag);
    assert_int_equal(make_dirs(dir), 0);
    return cli_run_np(SDIR, np, env, args);
}

static void test_servers_give_the_same_training(void **state) {
    (void)state;
    make_data();
    // (clients, servers, MPMD form): every client count 1..4 and server count 1..3, both forms
    static const int cases[][3] = {{1, 1, 0}, {2, 3, 1}, {3, 2, 0}, {4, 1, 1}, {4, 3, 0}};
    int local_done[5] = {0};
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        int c = cases[k][0], s = cases[k][1], mpmd = cases[k][2];
        char local[32], remote[32];
        snprintf(local, sizeof local, "local%d", c);
        snprintf(remote, sizeof remote, "c%ds%d", c, s);
        if (!local_done[c]) {
            if (run_job(c, 0, 0, "", "--steps 3", local) != 0) fail_msg("%s: %s", local, cli_err);
            local_done[c] = 1;
        }
        if (run_job(c, s, mpmd, "", "--steps 3", remote) != 0) fail_msg("%s: %s", remote, cli_err);
        if (!strstr(cli_out, "data server")) fail_msg("%s: no servers line: %s", remote, cli_out);
        Run a, b;
        char pa[128], pb[128];
        snprintf(pa, sizeof pa, SDIR "/%s.jsonl", local);
        snprintf(pb, sizeof pb, SDIR "/%s.jsonl", remote);
        read_run(pa, &a);
        read_run(pb, &b);
        assert_int_equal(a.steps, 3);
        assert_int_equal(b.steps, 3);
        for (int st = 1; st <= 3; st++) {
            if (a.loss[st] != b.loss[st] || a.grad_norm[st] != b.grad_norm[st])
                fail_msg("%s step %d: loss %.9g / %.9g, grad norm %.9g / %.9g", remote, st, a.loss[st], b.loss[st],
                         a.grad_norm[st], b.grad_norm[st]);
            snprintf(pa, sizeof pa, SDIR "/%s.plans/plan-%06d.json", local, st);
            snprintf(pb, sizeof pb, SDIR "/%s.plans/plan-%06d.json", remote, st);
            if (!same_file(pa, pb)) fail_msg("%s step %d: another batch or plan than %s", remote, st, local);
            // each rank read its rows and a label token per chunk: about 1/c of the batch, never all
            // of it (4K tokens of 4 bytes) when there are several ranks
            assert_true(b.load_bytes[st] > 0);
            if (c > 1) assert_true(b.load_bytes[st] < 0.8 * 4096 * 4);
        }
    }
    // the trace shows every rank's reading of its rows
    if (run_job(2, 1, 0, "", "--steps 2 --trace " SDIR "/trace.json", "traced") != 0) fail_msg("traced: %s", cli_err);
    char *text;
    size_t n;
    if (file_read_all(SDIR "/trace.json", &text, &n) != 0) fail_msg("%s", bs_errmsg());
    int spans = 0;
    for (const char *at = text; (at = strstr(at, "\"load rows\"")); at++) spans++;
    free(text);
    assert_true(spans >= 2 * 2);  // both ranks, both steps
}

// Servers of a directory of text files tokenize it themselves (2 servers, a cache of 1 KiB, so
// almost every request is tokenized again): the same training as the prepared dataset of the same
// files, bit for bit, without a prepare step.
static void test_text_files_without_prepare(void **state) {
    (void)state;
    make_data();
    if (run_job(2, 0, 0, "", "--steps 3", "prepared") != 0) fail_msg("prepared: %s", cli_err);
    const char *bin = getenv("BS_BINARY");
    char args[4096];
    snprintf(args, sizeof args,
             "train --data " SDIR "/in " COMMON " --steps 3 --metrics " SDIR "/text.jsonl : -np 2 '%s' serve --data "
             SDIR "/in --cache 1K",
             bin);
    if (cli_run_np(SDIR, 2, "", args) != 0) fail_msg("text: %s", cli_err);
    Run a, b;
    read_run(SDIR "/prepared.jsonl", &a);
    read_run(SDIR "/text.jsonl", &b);
    assert_int_equal(b.steps, 3);
    for (int st = 1; st <= 3; st++)
        if (a.loss[st] != b.loss[st] || a.grad_norm[st] != b.grad_norm[st])
            fail_msg("step %d: loss %.9g prepared, %.9g from text", st, a.loss[st], b.loss[st]);
    // an unknown tokenizer and a directory without text are refused
    snprintf(args, sizeof args, "train --data " SDIR "/in " COMMON " --steps 1 : -np 1 '%s' serve --data " SDIR
             "/in --ext .rs", bin);
    assert_int_not_equal(cli_run_np(SDIR, 1, "", args), 0);
    if (!strstr(cli_err, "no text files ending in .rs")) fail_msg("unclear message: %s", cli_err);
}

// A run with 2 servers checkpoints at step 2; resumed from there with 1 server (in the MPMD form)
// it continues exactly as the run without a break.
static void test_resume_with_another_server_count(void **state) {
    (void)state;
    make_data();
    // the run without a break writes the checkpoint the resumed run starts from (the schedule spans
    // the first run's --steps: both go to 4 steps)
    char extra[512];
    snprintf(extra, sizeof extra, "--steps 4 --ckpt-every 2 --ckpt-keep 0 --ckpt-dir " SDIR "/ck");
    if (run_job(2, 2, 0, "", extra, "whole") != 0) fail_msg("whole: %s", cli_err);
    snprintf(extra, sizeof extra, "--steps 4 --resume " SDIR "/ck/ckpt-000002.bin");
    if (run_job(2, 1, 1, "", extra, "second") != 0) fail_msg("second: %s", cli_err);
    Run w, r;
    read_run(SDIR "/whole.jsonl", &w);
    read_run(SDIR "/second.jsonl", &r);
    for (int st = 3; st <= 4; st++)
        if (w.loss[st] != r.loss[st]) fail_msg("step %d: %.9g without a break, %.9g resumed", st, w.loss[st], r.loss[st]);
}

static void test_server_faults_end_the_job(void **state) {
    (void)state;
    make_data();
    const char *bin = getenv("BS_BINARY");
    char args[4096];
    // a server that cannot open its data: the scheduler ends the job with the server's reason
    snprintf(args, sizeof args, "train --data " SDIR "/data " COMMON " --steps 2 : -np 1 '%s' serve --data " SDIR "/nothing",
             bin);
    int rc = cli_run_np(SDIR, 2, "", args);
    assert_int_not_equal(rc, 0);
    if (!strstr(cli_err, "data server 0 (world rank 2) cannot open its data") || !strstr(cli_err, SDIR "/nothing"))
        fail_msg("unclear message: %s", cli_err);
    // a file (here the dataset's index) is neither a dataset nor a text directory: refused, saying
    // what --data must be (it was served as a one-document text corpus, and the job trained on it)
    snprintf(args, sizeof args, "train --data " SDIR "/data " COMMON " --steps 2 : -np 1 '%s' serve --data " SDIR
             "/data/index.bin", bin);
    rc = cli_run_np(SDIR, 2, "", args);
    assert_int_not_equal(rc, 0);
    if (!strstr(cli_err, "data server 0 (world rank 2) cannot open its data") ||
        !strstr(cli_err, SDIR "/data/index.bin is a file, not a directory") ||
        !strstr(cli_err, "a prepared dataset's directory"))
        fail_msg("unclear message: %s", cli_err);
    // a request for a range the server does not hold is answered with an error, never with tokens
    rc = run_job(2, 2, 0, "BS_LOADER_MISROUTE=1", "--steps 2", "misroute");
    assert_int_not_equal(rc, 0);
    if (!strstr(cli_err, "holds documents [") || !strstr(cli_err, "is not one of them"))
        fail_msg("unclear message: %s", cli_err);
    // `serve` alone is not a job
    rc = cli_run(SDIR, "", "serve --data " SDIR "/data");
    assert_int_equal(rc, 2);
    if (!strstr(cli_err, "a data server is a rank of an MPI job")) fail_msg("unclear message: %s", cli_err);
    rc = cli_run(SDIR, "", "train --data " SDIR "/data " COMMON " --servers 1");
    assert_int_equal(rc, 2);
}

// The server process of a running MPMD job is killed: the job ends (no rank waits forever) with a
// non-zero exit and mpirun's message naming the process.
static void test_killed_server_ends_the_job(void **state) {
    (void)state;
    make_data();
    const char *bin = getenv("BS_BINARY");
    char cmd[4096];
    snprintf(cmd, sizeof cmd,
             "BS_QUIET=1 OPENBLAS_NUM_THREADS=1 exec mpirun -np 2 --oversubscribe '%s' train --data " SDIR
             "/data " COMMON " --steps 400 --metrics " SDIR "/killed.jsonl : -np 1 '%s' serve --data " SDIR
             "/data >" SDIR "/k.out 2>" SDIR "/k.err",
             bin, bin);
    int st;
    if (cli_kill_child_mid_run(cmd, SDIR "/killed.jsonl", " serve ", &st) != 0) fail_msg("%s", cli_err);
    assert_true(!WIFEXITED(st) || WEXITSTATUS(st) != 0);
    cli_slurp(SDIR "/k.err", cli_err, sizeof cli_err);
    if (!strstr(cli_err, "rank 2") && !strstr(cli_err, "signal 9")) fail_msg("unclear message: %s", cli_err);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_servers_give_the_same_training),
        cmocka_unit_test(test_text_files_without_prepare),
        cmocka_unit_test(test_resume_with_another_server_count),
        cmocka_unit_test(test_server_faults_end_the_job),
        cmocka_unit_test(test_killed_server_ends_the_job),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
