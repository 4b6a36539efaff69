// bench/plan.c: how fast the planners are and how good their plans are.
//
// Table 1: time and peak memory to plan a 32M-token global batch (2M context, C = 8K, LLaMA-7B on
// h800-sxm, TP 2, offloading on) for 512, 2,048 and 16,384 ranks, every policy, both datasets.
// Batch generation and planning are timed separately: median (min / max) of REPEATS runs, one core.
// Peak memory: each configuration runs once more in a fresh child process (fork), which resets its
// peak resident set (/proc/self/clear_refs, "5") after generating the batch and trimming the heap,
// then reads VmHWM after planning: the peak growth of resident memory while planning. Where the
// reset is not allowed it falls back to getrusage's ru_maxrss growth and says so.
//
// Table 2: at the paper's settings (512 ranks, C = 8K, 32M tokens) for github and byted at 256K,
// 512K, 1M and 2M context: each policy's estimated makespan / lower bound and its ring traffic, with
// offloading on and off. Target for balance: within 5% of the bound.
#include <malloc.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include "bytescale/batch.h"
#include "bytescale/error.h"
#include "bench_util.h"
#include "bytescale/hw.h"
#include "bytescale/model.h"
#include "bytescale/plan.h"
#include "bytescale/policy.h"
#include "bytescale/progress.h"
#include "bytescale/timer.h"

#define REPEATS 11
#define TOKENS (32ll << 20)
#define CAPACITY 8192
static const char *POLICIES[] = {"static", "naive", "balance"};
static const char *DISTS[] = {"byted", "github"};

static void cost_for(CostModel *cm, int ranks) {
    if (cost_derive(cm, model_find("llama-7b"), hw_find("h800-sxm"), 2, 1, ranks, CAPACITY) != 0) bs_die_errmsg();
}

// kB of a field of /proc/self/status, or -1.
static long status_kb(const char *field) {
    FILE *f = fopen("/proc/self/status", "r");
    if (!f) return -1;
    char line[256];
    long v = -1;
    size_t n = strlen(field);
    while (fgets(line, sizeof line, f))
        if (!strncmp(line, field, n) && line[n] == ':') v = atol(line + n + 1);
    fclose(f);
    return v;
}

// Peak resident growth (kB) while planning, measured in a child; *exact = 0 for the fallback.
static long plan_peak_kb(const char *dist, const char *policy, int ranks, int *exact) {
    int fd[2];
    if (pipe(fd) != 0) bs_die("pipe failed");
    pid_t pid = fork();
    if (pid < 0) bs_die("fork failed");
    if (pid == 0) {
        close(fd[0]);
        CostModel cm;
        cost_for(&cm, ranks);
        GlobalBatch b;
        if (batch_generate(&b, dist, 1, TOKENS, 2 << 20) != 0) _exit(1);
        malloc_trim(0);
        long result[2] = {0, 1};
        FILE *cr = fopen("/proc/self/clear_refs", "w");
        int reset = cr && fputs("5", cr) >= 0;
        if (cr && fclose(cr) != 0) reset = 0;
        struct rusage ru;
        getrusage(RUSAGE_SELF, &ru);
        long before = reset ? status_kb("VmRSS") : ru.ru_maxrss;
        PlanConfig cfg = {.n_ranks = ranks, .capacity = CAPACITY, .context = 2 << 20, .pp = 1, .offload = 1};
        Plan p;
        if (policy_plan(&p, policy, &b, &cfg, &cm) != 0) _exit(1);
        getrusage(RUSAGE_SELF, &ru);
        result[0] = (reset ? status_kb("VmHWM") : ru.ru_maxrss) - before;
        result[1] = reset;
        if (write(fd[1], result, sizeof result) != (ssize_t)sizeof result) _exit(1);
        _exit(0);
    }
    close(fd[1]);
    long result[2] = {-1, 0};
    ssize_t got = read(fd[0], result, sizeof result);
    close(fd[0]);
    int status;
    waitpid(pid, &status, 0);
    if (got != (ssize_t)sizeof result || !WIFEXITED(status) || WEXITSTATUS(status) != 0) return -1;
    *exact = (int)result[1];
    return result[0];
}

static void table_speed(void) {
    static const int RANKS[] = {512, 2048, 16384};
    printf("## Planning time and memory: 32M tokens, 2M context, C = 8K, LLaMA-7B, offloading on\n\n");
    printf("median (min - max) of %d runs on one core; target: planning well under 100 ms\n\n", REPEATS);
    printf("| dataset | ranks | policy  | generate ms | plan ms                 | target ms | peak MB | items  |\n");
    printf("|---------|-------|---------|-------------|-------------------------|-----------|---------|--------|\n");
    Progress pr;
    progress_start(&pr, "bench plan: speed", 2 * 3 * 3);
    int done = 0, all_exact = 1;
    for (int d = 0; d < 2; d++)
        for (int ri = 0; ri < 3; ri++) {
            CostModel cm;
            cost_for(&cm, RANKS[ri]);
            for (int k = 0; k < 3; k++) {
                double gen[REPEATS], plan[REPEATS];
                int32_t items = 0;
                for (int rep = 0; rep < REPEATS; rep++) {
                    GlobalBatch b;
                    double t0 = now_seconds();
                    if (batch_generate(&b, DISTS[d], 1, TOKENS, 2 << 20) != 0) bs_die_errmsg();
                    double t1 = now_seconds();
                    PlanConfig cfg = {.n_ranks = RANKS[ri], .capacity = CAPACITY, .context = 2 << 20, .pp = 1,
                                      .offload = 1};
                    Plan p;
                    if (policy_plan(&p, POLICIES[k], &b, &cfg, &cm) != 0) bs_die_errmsg();
                    double t2 = now_seconds();
                    gen[rep] = (t1 - t0) * 1e3;
                    plan[rep] = (t2 - t1) * 1e3;
                    items = p.n_items;
                    plan_free(&p);
                    batch_free(&b);
                }
                int exact = 1;
                long peak = plan_peak_kb(DISTS[d], POLICIES[k], RANKS[ri], &exact);
                all_exact &= exact;
                double gmed = bench_median(gen, REPEATS), pmed = bench_median(plan, REPEATS);
                char pcol[64];
                snprintf(pcol, sizeof pcol, "%.2f (%.2f - %.2f)", pmed, plan[0], plan[REPEATS - 1]);
                printf("| %-7s | %5d | %-7s | %11.2f | %-23s | %9d | %7.1f | %6d |\n", DISTS[d], RANKS[ri],
                       POLICIES[k], gmed, pcol, 100, peak >= 0 ? peak / 1024.0 : -1.0, items);
                fflush(stdout);
                progress_update(&pr, ++done, NULL);
            }
        }
    progress_finish(&pr, done, NULL);
    printf("\npeak MB: %s\n\n",
           all_exact ? "growth of the peak resident set while planning (VmHWM, reset after generating the batch)"
                     : "growth of getrusage ru_maxrss while planning (the VmHWM reset was not allowed here; an "
                       "underestimate when generation peaked higher)");
}

static void table_quality(void) {
    static const int64_t CTX[] = {256 << 10, 512 << 10, 1 << 20, 2 << 20};
    static const char *CTX_NAME[] = {"256K", "512K", "1M", "2M"};
    printf("## Makespan / lower bound at the paper's settings: 512 ranks, 32M tokens, C = 8K, LLaMA-7B\n\n");
    printf("target for balance: within 5%% of the bound (ratio <= 1.05)\n\n");
    printf("| dataset | context | policy  | ratio, offload on | ratio, offload off | ring TB, on | ring TB, off |\n");
    printf("|---------|---------|---------|-------------------|--------------------|-------------|--------------|\n");
    CostModel cm;
    cost_for(&cm, 512);
    Progress pr;
    progress_start(&pr, "bench plan: quality", 2 * 4);
    int done = 0;
    for (int d = 1; d >= 0; d--)  // github first, as the issue lists them
        for (int c = 0; c < 4; c++) {
            GlobalBatch b;
            if (batch_generate(&b, DISTS[d], 1, TOKENS, CTX[c]) != 0) bs_die_errmsg();
            for (int k = 0; k < 3; k++) {
                double ratio[2], tb[2];
                for (int off = 1; off >= 0; off--) {
                    PlanConfig cfg = {.n_ranks = 512, .capacity = CAPACITY, .context = CTX[c], .pp = 1, .offload = off};
                    Plan p;
                    PlanStats st;
                    if (policy_plan(&p, POLICIES[k], &b, &cfg, &cm) != 0 || plan_stats(&p, &cm, &st) != 0)
                        bs_die_errmsg();
                    ratio[!off] = p.makespan / p.lower_bound;
                    tb[!off] = st.ring_bytes / 1e12;
                    plan_free(&p);
                }
                printf("| %-7s | %-7s | %-7s | %17.4f | %18.4f | %11.1f | %12.1f |\n", DISTS[d], CTX_NAME[c],
                       POLICIES[k], ratio[0], ratio[1], tb[0], tb[1]);
                fflush(stdout);
            }
            batch_free(&b);
            progress_update(&pr, ++done, NULL);
        }
    progress_finish(&pr, done, NULL);
    printf("\nring TB: K/V bytes all rings move in one step (forward + backward, all layers, per TP device), 1e12 "
           "bytes\n");
}

int main(void) {
    printf("# bench_plan: the HDP planners (bytescale plan)\n\n");
    table_speed();
    table_quality();
    return 0;
}
