// bench/peers.c: bytescale against the peers' schedulers on real corpora (docs/peers.md, "Real corpora").
//
//   bench_peers [--steps N] [NAME=LENGTHS ...]
//
// LENGTHS is a lengths file (one sequence length a line, batch_read_file), e.g. the sizes of the files
// of a source tree. Without any, the two of docs/peers.md are made at run time into /tmp by the
// commands in DEFAULTS (a tree this machine lacks is skipped), so `make bench` runs it bare and
// nothing generated lives in the repository. For every corpus, context
// 256K and 2M, 512 and 4,096 ranks: a run of N steps (default 50) of balance, elastic, megatron-hcp,
// wlb and flexsp, LLaMA-7B, TP 2, C = 8K, offloading on. 50 steps make the first and the flushing
// step 4% of a run whose steps are alike (the table's last column says what they take in each case).
//
// Why a run and not one step: wlb delays its outlier documents, and a step without its slowest
// documents looks faster per token than the step that later trains them. So every step is the whole
// corpus (cut to the context) after the sequences the previous step delayed, the last step flushes
// (PlanConfig.flush), and the figure is total tokens over total simulated time: every policy trains
// the same tokens. This is the loop sim_seeds_run runs for `bytescale simulate --grid`, over a file.
//
// Planned with the h800-sxm cost model (`bytescale plan`'s default) and simulated on h100-sxm
// (`bytescale simulate --plan`'s), as the single-step commands of docs/peers.md do: the first step
// of a run is exactly `bytescale plan --lengths ... --policy P` replayed by `bytescale simulate --plan`.
//
// Prints one table: bytescale's balance and elastic (the baseline) and, per peer, bytescale's best run
// tokens/s over the peer's (above 1 bytescale is faster), wlb's first step alone in parentheses, and
// the largest share of a run's simulated time that its first and flushing steps take over the
// case's policies; under it, each policy's largest share.
// Progress on stderr.
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench_util.h"
#include "bytescale/batch.h"
#include "bytescale/cluster.h"
#include "bytescale/cost.h"
#include "bytescale/error.h"
#include "bytescale/hw.h"
#include "bytescale/model.h"
#include "bytescale/policy.h"
#include "bytescale/progress.h"
#include "bytescale/sim.h"

#define CAPACITY 8192
#define TP 2
static const char *POL[] = {"balance", "elastic", "megatron-hcp", "wlb", "flexsp"};
enum { N_POL = sizeof POL / sizeof POL[0] };  // the first two are bytescale's, "best" is the faster
static const int RANKS[] = {512, 4096};
static const int64_t CTX[] = {256 << 10, 2 << 20};
enum { N_RANKS = 2, N_CTX = 2, MAX_CORPORA = 16 };

// The default corpora: every non-empty source file of Go's and Python's standard libraries, its size
// in bytes as its length (one byte = one token, as the byte tokenizer counts).
static const struct {
    const char *name, *cmd;
} DEFAULTS[] = {
    {"go", "find /usr/share/go-1.19/src -name '*.go' -type f -size +0 -printf '%s\\n'"},
    {"python", "find /usr/lib/python3* -name '*.py' -type f -size +0 -printf '%s\\n'"},
};
enum { N_DEFAULTS = sizeof DEFAULTS / sizeof DEFAULTS[0] };

typedef struct {
    double run;    // total tokens / total simulated time, tokens/s
    double first;  // the first step's tokens/s
    double edges;  // the first and the last (flushing) step's share of the run's simulated time
} RunResult;

// One run of `steps` steps of policy `pol` over corpus `b` (already cut to `ctx`).
static RunResult run_policy(const GlobalBatch *b, const char *pol, int R, int64_t ctx, int steps) {
    const ModelConfig *m = model_find("llama-7b");
    HardwareProfile h8, h1;
    if (!m || hw_resolve("h800-sxm", &h8) != 0 || hw_resolve("h100-sxm", &h1) != 0) bs_die_errmsg();
    CostModel pcm, scm;  // the planner's and the simulator's
    Cluster cl;
    if (cost_derive(&pcm, m, &h8, TP, 1, R, CAPACITY) != 0 || cost_derive(&scm, m, &h1, TP, 1, R, CAPACITY) != 0 ||
        cluster_init(&cl, &h1, R * TP, TP, 1) != 0)
        bs_die_errmsg();
    GlobalBatch carry;  // what the previous step delayed: it goes first into this one
    batch_init(&carry, 1);
    double tokens = 0, time = 0, edges = 0;
    RunResult res = {0, 0, 0};
    for (int t = 0; t < steps; t++) {
        GlobalBatch step;
        batch_init(&step, carry.n + b->n);
        for (int64_t i = 0; i < carry.n; i++) batch_push(&step, carry.seqs[i].id, carry.seqs[i].len, -1);
        for (int64_t i = 0; i < b->n; i++) batch_push(&step, b->seqs[i].id, b->seqs[i].len, -1);
        PlanConfig pc;
        memset(&pc, 0, sizeof pc);
        pc.n_ranks = R, pc.capacity = CAPACITY, pc.context = ctx, pc.pp = 1, pc.offload = 1;
        pc.flush = t == steps - 1;
        pc.carried = carry.n;
        Plan p;
        if (policy_plan(&p, pol, &step, &pc, &pcm) != 0 || plan_finalize(&p, &scm) != 0) bs_die_errmsg();
        SimConfig cfg = {&scm, &cl, m, &h1, 0};
        SimResult r;
        if (sim_run(&r, &p, &cfg) != 0) bs_die_errmsg();
        tokens += r.tokens, time += r.step_time;
        if (t == 0) res.first = r.tokens_per_s;
        if (t == 0 || t == steps - 1) edges += r.step_time;
        batch_free(&carry);
        batch_init(&carry, 1);
        for (int32_t d = 0; d < p.n_delayed; d++) {
            const Sequence *q = &p.batch.seqs[p.delayed[d]];
            batch_push(&carry, q->id, q->len, -1);
        }
        sim_result_free(&r);
        plan_free(&p);
        batch_free(&step);
    }
    batch_free(&carry);
    res.run = tokens / time;
    res.edges = edges / time;
    return res;
}

int main(int argc, char **argv) {
    int steps = 50, nc = 0;
    const char *names[MAX_CORPORA], *files[MAX_CORPORA];
    char buf[MAX_CORPORA][64];
    for (int i = 1; i < argc; i++) {
        const char *eq = strchr(argv[i], '=');
        if (!strcmp(argv[i], "--steps") && i + 1 < argc) {
            steps = atoi(argv[++i]);
        } else if (eq && eq != argv[i] && eq - argv[i] < 64 && nc < MAX_CORPORA) {
            snprintf(buf[nc], sizeof buf[nc], "%.*s", (int)(eq - argv[i]), argv[i]);
            names[nc] = buf[nc], files[nc++] = eq + 1;
        } else {
            nc = -1;
            break;
        }
    }
    if (nc < 0 || steps < 1)
        bs_die("usage: bench_peers [--steps N] [NAME=LENGTHS ...]  (lengths files: docs/peers.md)");
    static char paths[N_DEFAULTS][64];
    const int defaults = nc == 0;
    for (int d = 0; defaults && d < N_DEFAULTS; d++) {
        // made afresh every run: the file says what this machine's tree holds now. find's status is
        // not the test (an unreadable directory fails it); an empty file is.
        snprintf(paths[d], sizeof paths[d], "/tmp/bytescale-peers-%s.txt", DEFAULTS[d].name);
        char cmd[256];
        snprintf(cmd, sizeof cmd, "%s > %s 2>/dev/null", DEFAULTS[d].cmd, paths[d]);
        fprintf(stderr, "bench peers: %s\n", cmd);
        int rc = system(cmd);
        FILE *f = rc == -1 ? NULL : fopen(paths[d], "r");
        int empty = !f || fgetc(f) == EOF;
        if (f) fclose(f);
        if (empty) {
            fprintf(stderr, "bench peers: no %s sources here, skipped\n", DEFAULTS[d].name);
            remove(paths[d]);
            continue;
        }
        names[nc] = DEFAULTS[d].name, files[nc++] = paths[d];
    }
    if (nc == 0) {
        printf("# bench_peers: no corpus (none of the default source trees is here; give NAME=LENGTHS)\n\n");
        return 0;
    }

    printf("# bench_peers: bytescale vs the peers' schedulers on real corpora\n\n");
    printf("LLaMA-7B, TP %d, C = 8K, offloading on; planned with h800-sxm, simulated on h100-sxm. A run of %d "
           "steps, each the whole corpus after what the previous step delayed, the last flushing; tok/s = total "
           "tokens / total simulated time. best = the faster of balance and elastic; best / peer > 1: bytescale is "
           "faster. wlb's first step alone in parentheses. first+flush: the largest share of a run's simulated time "
           "taken by its first and its flushing step, over the case's policies.\n\n",
           TP, steps);
    printf("| corpus | sequences | tokens | context | ranks | balance tok/s | elastic tok/s | best / megatron-hcp | "
           "best / wlb (first step) | best / flexsp | first+flush |\n|---|---|---|---|---|---|---|---|---|---|---|\n");
    fflush(stdout);
    double logs[4] = {0, 0, 0, 0};  // megatron-hcp, wlb, wlb first step, flexsp
    int n_cases = 0;
    double most[N_POL] = {0};  // each policy's largest first+flush share
    Progress pr;
    progress_start(&pr, "bench peers", (int64_t)nc * N_CTX * N_RANKS * N_POL);
    int64_t done = 0;
    for (int c = 0; c < nc; c++)
        for (int x = 0; x < N_CTX; x++) {
            GlobalBatch b;
            if (batch_read_file(&b, files[c]) != 0 || batch_cut(&b, CTX[x]) != 0) bs_die_errmsg();
            double total = 0;
            for (int64_t i = 0; i < b.n; i++) total += (double)b.seqs[i].len;
            for (int ri = 0; ri < N_RANKS; ri++) {
                RunResult r[N_POL];
                for (int k = 0; k < N_POL; k++) {
                    char note[96];
                    snprintf(note, sizeof note, "%s %s R %d %s", names[c], x ? "2M" : "256K", RANKS[ri], POL[k]);
                    progress_update(&pr, done, note);
                    r[k] = run_policy(&b, POL[k], RANKS[ri], CTX[x], steps);
                    done++;
                }
                double best = fmax(r[0].run, r[1].run), best_first = fmax(r[0].first, r[1].first), edges = 0;
                for (int k = 0; k < N_POL; k++) most[k] = fmax(most[k], r[k].edges), edges = fmax(edges, r[k].edges);
                double q[4] = {best / r[2].run, best / r[3].run, best_first / r[3].first, best / r[4].run};
                for (int j = 0; j < 4; j++) logs[j] += log(q[j]);
                n_cases++;
                printf("| %s | %lld | %.3g | %s | %d | %.3g | %.3g | %.2f | %.2f (%.2f) | %.2f | %.1f%% |\n", names[c],
                       (long long)b.n, total, x ? "2M" : "256K", RANKS[ri], r[0].run, r[1].run, q[0], q[1], q[2],
                       q[3], 100 * edges);
                fflush(stdout);
            }
            batch_free(&b);
        }
    progress_finish(&pr, done, NULL);
    printf("| geometric mean | | | | | | | %.2f | %.2f (%.2f) | %.2f | |\n\n", exp(logs[0] / n_cases),
           exp(logs[1] / n_cases), exp(logs[2] / n_cases), exp(logs[3] / n_cases));
    printf("first+flush share of a run, the largest over the cases:");
    for (int k = 0; k < N_POL; k++) printf("%s %s %.1f%%", k ? "," : "", POL[k], 100 * most[k]);
    printf("\n\n");
    return 0;
}
