// bench/peers.c: bytescale against the peers' schedulers on real corpora (docs/peers.md, "Real corpora").
//
//   bench_peers [--steps N] [NAME=LENGTHS ...]
//
// LENGTHS is a lengths file (one sequence length a line, batch_read_file), e.g. the sizes of the files
// of a source tree. Without any, the two of docs/peers.md are made at run time into /tmp by the
// commands in DEFAULTS (a tree this machine lacks is skipped), so `make bench` runs it bare and
// nothing generated lives in the repository. For every corpus, context
// 256K and 2M, 512 and 4,096 ranks: a run of N steps (default 50) of balance, elastic, megatron-hcp,
// wlb, flexsp, blocks and blocks-all, LLaMA-7B, TP 2, C = 8K, offloading on. 50 steps make the first and the flushing
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
static const char *POL[] = {"balance", "elastic", "megatron-hcp", "wlb", "flexsp", "blocks", "blocks-all"};
enum { N_POL = sizeof POL / sizeof POL[0], WLB = 3 };  // the first two are bytescale's, "best" is the faster
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

// What one simulated step gives the run: its tokens, its time, and what it delays into the next.
typedef struct {
    int valid;
    double tokens, time, tokens_per_s;
    GlobalBatch delayed;
} StepResult;

typedef struct {
    const ModelConfig *m;
    HardwareProfile h1;
    CostModel pcm, scm;  // the planner's (h800-sxm) and the simulator's (h100-sxm)
    Cluster cl;
} RunSetup;

// Plan and simulate one step: `carry` first, then the corpus.
static StepResult run_step(const RunSetup *s, const GlobalBatch *b, const GlobalBatch *carry, const char *pol, int R,
                           int64_t ctx, int flush) {
    GlobalBatch step;
    batch_init(&step, carry->n + b->n);
    for (int64_t i = 0; i < carry->n; i++) batch_push(&step, carry->seqs[i].id, carry->seqs[i].len, -1);
    for (int64_t i = 0; i < b->n; i++) batch_push(&step, b->seqs[i].id, b->seqs[i].len, -1);
    PlanConfig pc;
    memset(&pc, 0, sizeof pc);
    pc.n_ranks = R, pc.capacity = CAPACITY, pc.context = ctx, pc.pp = 1, pc.offload = 1;
    pc.flush = flush;
    pc.carried = carry->n;
    Plan p;
    if (policy_plan(&p, pol, &step, &pc, &s->pcm) != 0 || plan_finalize(&p, &s->scm) != 0) bs_die_errmsg();
    SimConfig cfg = {&s->scm, &s->cl, s->m, &s->h1, 0};
    SimResult r;
    if (sim_run(&r, &p, &cfg) != 0) bs_die_errmsg();
    StepResult out = {1, r.tokens, r.step_time, r.tokens_per_s, {0}};
    batch_init(&out.delayed, 1);
    for (int32_t d = 0; d < p.n_delayed; d++) {
        const Sequence *q = &p.batch.seqs[p.delayed[d]];
        batch_push(&out.delayed, q->id, q->len, -1);
    }
    sim_result_free(&r);
    plan_free(&p);
    batch_free(&step);
    return out;
}

// One run of `steps` steps of policy `pol` over corpus `b` (already cut to `ctx`). Every step is the same
// corpus, and planning and simulating are deterministic: a step that carries nothing in is the same step
// as any earlier one that carried nothing in with the same flush flag, so its result is reused (the
// figures are those of planning every step; it saves 48 of 50 plans of every policy that delays nothing).
static RunResult run_policy(const GlobalBatch *b, const char *pol, int R, int64_t ctx, int steps) {
    RunSetup s;
    s.m = model_find("llama-7b");
    HardwareProfile h8;
    if (!s.m || hw_resolve("h800-sxm", &h8) != 0 || hw_resolve("h100-sxm", &s.h1) != 0) bs_die_errmsg();
    if (cost_derive(&s.pcm, s.m, &h8, TP, 1, R, CAPACITY) != 0 || cost_derive(&s.scm, s.m, &s.h1, TP, 1, R, CAPACITY) != 0 ||
        cluster_init(&s.cl, &s.h1, R * TP, TP, 1) != 0)
        bs_die_errmsg();
    StepResult fresh[2] = {{0}, {0}};  // the step that carried nothing in, by flush flag
    GlobalBatch carry;  // what the previous step delayed: it goes first into this one
    batch_init(&carry, 1);
    double tokens = 0, time = 0, edges = 0;
    RunResult res = {0, 0, 0};
    for (int t = 0; t < steps; t++) {
        const int flush = t == steps - 1;
        int kept = carry.n == 0 && fresh[flush].valid;  // r is fresh[flush]: its delayed stay with it
        StepResult r = kept ? fresh[flush] : run_step(&s, b, &carry, pol, R, ctx, flush);
        if (!kept && carry.n == 0) fresh[flush] = r, kept = 1;
        tokens += r.tokens, time += r.time;
        if (t == 0) res.first = r.tokens_per_s;
        if (t == 0 || flush) edges += r.time;
        batch_free(&carry);
        batch_init(&carry, r.delayed.n + 1);
        for (int64_t i = 0; i < r.delayed.n; i++) batch_push(&carry, r.delayed.seqs[i].id, r.delayed.seqs[i].len, -1);
        if (!kept) batch_free(&r.delayed);
    }
    for (int k = 0; k < 2; k++)
        if (fresh[k].valid) batch_free(&fresh[k].delayed);
    batch_free(&carry);
    res.run = tokens / time;
    res.edges = edges / time;
    return res;
}

// Make the default corpora's lengths files (DEFAULTS) into /tmp; returns how many this machine has.
static int default_corpora(const char **names, const char **files) {
    static char paths[N_DEFAULTS][64];
    int nc = 0;
    for (int d = 0; d < N_DEFAULTS; d++) {
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
    return nc;
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
    if (nc == 0) nc = default_corpora(names, files);
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
    printf("| corpus | sequences | tokens | context | ranks | balance tok/s | elastic tok/s |");
    for (int k = 2; k < N_POL; k++) printf(" best / %s%s |", POL[k], k == WLB ? " (first step)" : "");
    printf(" first+flush |\n|---|---|---|---|---|---|---|");
    for (int k = 2; k < N_POL; k++) printf("---|");
    printf("---|\n");
    fflush(stdout);
    double logs[N_POL + 1] = {0};  // log(best / peer) per peer; [N_POL]: wlb's first step
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
                printf("| %s | %lld | %.3g | %s | %d | %.3g | %.3g |", names[c], (long long)b.n, total,
                       x ? "2M" : "256K", RANKS[ri], r[0].run, r[1].run);
                for (int k = 2; k < N_POL; k++) {
                    logs[k] += log(best / r[k].run);
                    printf(" %.2f", best / r[k].run);
                    if (k == WLB) printf(" (%.2f)", best_first / r[k].first);
                    printf(" |");
                }
                logs[N_POL] += log(best_first / r[WLB].first);
                n_cases++;
                printf(" %.1f%% |\n", 100 * edges);
                fflush(stdout);
            }
            batch_free(&b);
        }
    progress_finish(&pr, done, NULL);
    printf("| geometric mean | | | | | | |");
    for (int k = 2; k < N_POL; k++) {
        printf(" %.2f", exp(logs[k] / n_cases));
        if (k == WLB) printf(" (%.2f)", exp(logs[N_POL] / n_cases));
        printf(" |");
    }
    printf(" |\n\nfirst+flush share of a run, the largest over the cases:");
    for (int k = 0; k < N_POL; k++) printf("%s %s %.1f%%", k ? "," : "", POL[k], 100 * most[k]);
    printf("\n\n");
    return 0;
}
