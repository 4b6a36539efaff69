// test_cli_serve_3d.c: data servers for 3D jobs (`train --tp T --pp P --servers N`, and the MPMD
// form `train --tp T --pp P ... : -np N bytescale serve`; docs/loader.md, "3D").
//
// - Every layout trains bit for bit as the same layout on local shards (losses, gradient norms and
//   every step's plan file): tp 2 x pp 2 (H = 1) in both job forms, pp 2 with 2 HDP rings and 2
//   servers, tp 2 x pp 2 x hdp 2, tp 2 alone, and pp 3 (a middle stage).
// - Who read what, checked against the step's own counts in the metrics (independent of the loader):
//   the first stage's processes read 4 bytes per token of the batch (HDP ranks summed), the last
//   stage's 4 per labelled token, a middle stage nothing; the same on local shards. Only tp rank 0
//   of the first and last stages received bytes from the servers (fetch_bytes), exactly what its tp
//   group reads: the network carried 1/T of the bytes the processes read.
// - Resume: a checkpoint of a tp 2 x pp 2 run with 2 servers continues with 1 server (MPMD)
//   exactly as the run without a break.
// - Faults in a tp 2 x pp 2 job: a misrouted request (the fetching process's error reaches the tp
//   members waiting for its rows) and a data server killed with SIGKILL each end the job with a
//   message naming the server; nothing hangs.
// ctest: long (MPI jobs of 3 to 9 processes)
#include "cli/cli_run.h"

#include <cJSON.h>

#include "bytescale/fileio.h"
#include "test_corpus.h"

#define SDIR "test-tmp/cli_serve_3d"
#define COMMON "--data " SDIR "/data --context 512 --capacity 512 --tokens 2K --lr 3e-3 --warmup 1 --policy balance"

enum { STEPS = 2, MAX_STEPS = 4, MAX_PROCS = 16 };

// One process's entry of a step's metrics.
typedef struct {
    int stage, tp, hdp;
    double load, fetch;  // load_bytes, fetch_bytes
} Proc;

typedef struct {
    double loss[MAX_STEPS + 1], grad_norm[MAX_STEPS + 1];
    double tokens[MAX_STEPS + 1], targets[MAX_STEPS + 1];  // the step's batch: tokens, labelled tokens
    Proc procs[MAX_STEPS + 1][MAX_PROCS];
    int n_procs, steps;
} Run;

static double num(const cJSON *o, const char *key) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    if (!cJSON_IsNumber(v)) fail_msg("metrics: no number \"%s\"", key);
    return v->valuedouble;
}

// Metrics file SDIR/<tag>.jsonl, which holds steps first .. last.
static void read_run(const char *tag, Run *r, int first, int last) {
    memset(r, 0, sizeof *r);
    char path[256], *text;
    size_t n;
    snprintf(path, sizeof path, SDIR "/%s.jsonl", tag);
    if (file_read_all(path, &text, &n) != 0) fail_msg("%s", bs_errmsg());
    for (char *line = text, *nl; (nl = strchr(line, '\n')); line = nl + 1) {
        *nl = '\0';
        cJSON *o = cJSON_Parse(line);
        if (!o) fail_msg("%s: not JSON: %s", path, line);
        int s = (int)num(o, "step");
        assert_true(s >= first && s <= last);
        r->loss[s] = num(o, "loss"), r->grad_norm[s] = num(o, "grad_norm");
        r->tokens[s] = num(o, "tokens"), r->targets[s] = num(o, "targets");
        const cJSON *rk;
        r->n_procs = 0;
        cJSON_ArrayForEach(rk, cJSON_GetObjectItemCaseSensitive(o, "ranks")) {
            assert_true(r->n_procs < MAX_PROCS);
            r->procs[s][r->n_procs++] = (Proc){(int)num(rk, "stage"), (int)num(rk, "tp_rank"), (int)num(rk, "hdp_rank"),
                                                num(rk, "load_bytes"), num(rk, "fetch_bytes")};
        }
        cJSON_Delete(o);
        r->steps++;
    }
    free(text);
    assert_int_equal(r->steps, last - first + 1);
}

static void make_data(void) {
    test_tmpdir("cli_serve_3d");
    char data[600];
    if (test_corpus_make(SDIR, 30, 50, 1500, 11, data, sizeof data) != 0) fail_msg("corpus: %s", bs_errmsg());
}

// `train COMMON flags` as np training processes, with `servers` data servers: the last ranks
// (--servers) or a second program (mpmd); servers 0: local shards. Metrics and plans under tag.
static void run_steps(int np, int servers, int mpmd, const char *flags, int steps, const char *tag) {
    const char *bin = getenv("BS_BINARY");
    char args[4096], tail[1200] = "", dir[600];
    if (servers > 0 && mpmd) snprintf(tail, sizeof tail, " : -np %d '%s' serve --data " SDIR "/data", servers, bin);
    else if (servers > 0) snprintf(tail, sizeof tail, " --servers %d", servers);
    snprintf(dir, sizeof dir, SDIR "/%s.plans", tag);
    assert_int_equal(make_dirs(dir), 0);
    snprintf(args, sizeof args,
             "train " COMMON " %s --steps %d --metrics " SDIR "/%s.jsonl --save-plans " SDIR "/%s.plans%s", flags,
             steps, tag, tag, tail);
    int rc = cli_run_np(SDIR, np + (mpmd ? 0 : servers), "", args);
    if (rc != 0) fail_msg("%s: exit %d: %s", tag, rc, cli_err);
    if (servers > 0 && !strstr(cli_out, "data server")) fail_msg("%s: no servers line: %s", tag, cli_out);
}

static void run(int np, int servers, int mpmd, const char *flags, const char *tag) {
    run_steps(np, servers, mpmd, flags, STEPS, tag);
}

static int same_file(const char *a, const char *b) {
    char *x, *y;
    size_t nx, ny;
    if (file_read_all(a, &x, &nx) != 0) fail_msg("%s", bs_errmsg());
    if (file_read_all(b, &y, &ny) != 0) fail_msg("%s", bs_errmsg());
    int same = nx == ny && memcmp(x, y, nx) == 0;
    free(x), free(y);
    return same;
}

// What every process read and fetched in one step of a tp x pp run, against the batch's counts.
static void check_reads(const Run *r, int s, int tp, int pp, int servers, const char *tag) {
    double first = 0, last = 0, fetched = 0, read = 0;
    for (int i = 0; i < r->n_procs; i++) {
        const Proc *p = &r->procs[s][i];
        int needs = p->stage == 0 || p->stage == pp - 1;
        if (!needs && (p->load != 0 || p->fetch != 0))
            fail_msg("%s step %d: middle stage %d (tp %d, hdp %d) read %.0f bytes, fetched %.0f", tag, s, p->stage,
                     p->tp, p->hdp, p->load, p->fetch);
        // only tp rank 0 of a stage that needs tokens asks the servers, for exactly what its group reads
        double want_fetch = servers > 0 && needs && p->tp == 0 ? p->load : 0;
        if (p->fetch != want_fetch)
            fail_msg("%s step %d: stage %d tp %d hdp %d fetched %.0f bytes from the servers, want %.0f", tag, s,
                     p->stage, p->tp, p->hdp, p->fetch, want_fetch);
        // a tp group's members read the same rows: the same bytes as its rank 0
        for (int j = 0; j < r->n_procs; j++) {
            const Proc *q = &r->procs[s][j];
            if (q->stage == p->stage && q->hdp == p->hdp && q->load != p->load)
                fail_msg("%s step %d: tp ranks %d and %d of stage %d read %.0f and %.0f bytes", tag, s, p->tp, q->tp,
                         p->stage, p->load, q->load);
        }
        if (p->tp != 0) continue;
        if (p->stage == 0) first += p->load;
        if (p->stage == pp - 1) last += p->load;
        fetched += p->fetch;
        if (needs) read += tp * p->load;
    }
    // pp > 1: the first stage reads every token of the batch once (its inputs), the last stage one
    // token per labelled row (its targets); one process of both (pp = 1) reads each chunk and one
    // token past it, which no count in the metrics gives
    if (pp > 1 && (first != 4 * r->tokens[s] || last != 4 * r->targets[s]))
        fail_msg("%s step %d: the first stage read %.0f bytes for %.0f tokens, the last %.0f for %.0f labels", tag, s,
                 first, r->tokens[s], last, r->targets[s]);
    if (servers > 0 && fetched * tp != read)
        fail_msg("%s step %d: the servers sent %.0f bytes, the processes read %.0f with tp %d", tag, s, fetched, read, tp);
}

// The run through servers against the same layout on local shards: bit for bit, and who read what.
static void compare(const char *local, const char *remote, int tp, int pp, int servers) {
    Run a, b;
    read_run(local, &a, 1, STEPS);
    read_run(remote, &b, 1, STEPS);
    assert_int_equal(a.n_procs, b.n_procs);
    for (int s = 1; s <= STEPS; s++) {
        if (a.loss[s] != b.loss[s] || a.grad_norm[s] != b.grad_norm[s])
            fail_msg("%s step %d: loss %.9g / %.9g, grad norm %.9g / %.9g (local / servers)", remote, s, a.loss[s],
                     b.loss[s], a.grad_norm[s], b.grad_norm[s]);
        char pa[256], pb[256];
        snprintf(pa, sizeof pa, SDIR "/%s.plans/plan-%06d.json", local, s);
        snprintf(pb, sizeof pb, SDIR "/%s.plans/plan-%06d.json", remote, s);
        if (!same_file(pa, pb)) fail_msg("%s step %d: another batch or plan than %s", remote, s, local);
        check_reads(&a, s, tp, pp, 0, local);
        check_reads(&b, s, tp, pp, servers, remote);
        for (int i = 0; i < b.n_procs; i++)
            if (a.procs[s][i].load != b.procs[s][i].load)
                fail_msg("%s step %d: process %d read %.0f bytes, %.0f from local shards", remote, s, i,
                         b.procs[s][i].load, a.procs[s][i].load);
    }
}

static void test_layouts_train_as_on_local_shards(void **state) {
    (void)state;
    make_data();
    // tp 2 x pp 2, H = 1: both job forms
    run(4, 0, 0, "--model tiny --tp 2 --pp 2", "t2p2");
    run(4, 1, 0, "--model tiny --tp 2 --pp 2", "t2p2s1");
    if (!strstr(cli_out, "middle stages fetch nothing")) fail_msg("no 3D loader line: %s", cli_out);
    compare("t2p2", "t2p2s1", 2, 2, 1);
    run(4, 1, 1, "--model tiny --tp 2 --pp 2", "t2p2mpmd");
    compare("t2p2", "t2p2mpmd", 2, 2, 1);
    // pp 2 with 2 HDP rings, from 2 servers
    run(4, 0, 0, "--model tiny --pp 2", "p2h2");
    run(4, 2, 0, "--model tiny --pp 2", "p2h2s2");
    compare("p2h2", "p2h2s2", 1, 2, 2);
    // tp 2 x pp 2 x hdp 2: 9 processes
    run(8, 0, 0, "--model tiny --tp 2 --pp 2", "t2p2h2");
    run(8, 1, 0, "--model tiny --tp 2 --pp 2", "t2p2h2s1");
    compare("t2p2h2", "t2p2h2s1", 2, 2, 1);
    // tp 2 alone: rank 0 fetches each chunk and its last label for both
    run(2, 0, 0, "--model tiny --tp 2", "t2");
    run(2, 1, 1, "--model tiny --tp 2", "t2s1");
    compare("t2", "t2s1", 2, 1, 1);
    // pp 3 (the 4-layer model): the middle stage reads and fetches nothing
    run(3, 0, 0, "--model small --pp 3", "p3");
    run(3, 1, 1, "--model small --pp 3", "p3s1");
    compare("p3", "p3s1", 1, 3, 1);
}

// A checkpoint of a tp 2 x pp 2 run with 2 servers (step 2 of 4), resumed with 1 server in the MPMD
// form, continues exactly as the run without a break: every process's rows come back the same after
// the trainer dropped what it had fetched ahead.
static void test_3d_resume_with_another_server_count(void **state) {
    (void)state;
    make_data();
    // the run without a break writes the checkpoint the resumed run starts from
    run_steps(4, 2, 0, "--model tiny --tp 2 --pp 2 --ckpt-every 2 --ckpt-keep 0 --ckpt-dir " SDIR "/ck", 4, "whole");
    run_steps(4, 1, 1, "--model tiny --tp 2 --pp 2 --resume " SDIR "/ck/ckpt-000002.bin", 4, "second");
    Run w, r;
    read_run("whole", &w, 1, 4);
    read_run("second", &r, 3, 4);
    for (int st = 3; st <= 4; st++)
        if (w.loss[st] != r.loss[st] || w.grad_norm[st] != r.grad_norm[st])
            fail_msg("step %d: loss %.9g without a break, %.9g resumed", st, w.loss[st], r.loss[st]);
}

// A request for a range a server does not hold (BS_LOADER_MISROUTE=1 sends every request to the
// next server) in a tp 2 x pp 2 job: the fetching process's error reaches the tp members that wait
// for its rows, and the job ends with the server's message; nothing hangs.
static void test_misrouted_request_ends_a_3d_job(void **state) {
    (void)state;
    make_data();
    int rc = cli_run_np(SDIR, 6, "BS_LOADER_MISROUTE=1", "train " COMMON " --model tiny --tp 2 --pp 2 --steps 2 --servers 2");
    assert_int_not_equal(rc, 0);
    if (!strstr(cli_err, "holds documents [") || !strstr(cli_err, "is not one of them"))
        fail_msg("unclear message: %s", cli_err);
}

// The server of a running tp 2 x pp 2 job (world rank 4, after the 4 training processes) is killed:
// the job ends, no process waits forever, and mpirun's message names the process.
static void test_killed_server_ends_a_3d_job(void **state) {
    (void)state;
    make_data();
    const char *bin = getenv("BS_BINARY");
    char cmd[4096];
    snprintf(cmd, sizeof cmd,
             "BS_QUIET=1 OPENBLAS_NUM_THREADS=1 exec mpirun -np 4 --oversubscribe '%s' train " COMMON
             " --model tiny --tp 2 --pp 2 --steps 400 --metrics " SDIR "/killed.jsonl : -np 1 '%s' serve --data " SDIR
             "/data >" SDIR "/k.out 2>" SDIR "/k.err",
             bin, bin);
    int st;
    if (cli_kill_child_mid_run(cmd, SDIR "/killed.jsonl", " serve ", &st) != 0) fail_msg("%s", cli_err);
    assert_true(!WIFEXITED(st) || WEXITSTATUS(st) != 0);
    cli_slurp(SDIR "/k.err", cli_err, sizeof cli_err);
    if (!strstr(cli_err, "rank 4") || !strstr(cli_err, "signal 9")) fail_msg("unclear message: %s", cli_err);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_layouts_train_as_on_local_shards),
        cmocka_unit_test(test_3d_resume_with_another_server_count),
        cmocka_unit_test(test_misrouted_request_ends_a_3d_job),
        cmocka_unit_test(test_killed_server_ends_a_3d_job),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
