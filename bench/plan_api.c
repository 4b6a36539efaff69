// bench/plan_api.c: planning time through the flat API (api.h), the C side of the Python binding's
// overhead (bench/python_plan.py runs this and the same calls from Python, and prints both).
//
//   bench_plan_api [--repeats N] [--dist byted|github] [--ranks R] [--policy P]
//
// The batch: 32M tokens sampled from the distribution (seed 1), cut to a 2M context; LLaMA-7B on
// h800-sxm, TP 2, C = 8K, offloading on: docs/planner.md's setting. Timed, median (min - max) of N
// runs, wall clock and the thread's CPU time:
//   policy_plan      the planner alone (struct API)
//   bs_plan_lengths  what one bytescale.plan() call runs in C: the cost model derived, the batch built
//                    from the lengths array, planned, validated, and the plan's numbers (bs_plan_info)
// The last line is the same figures as JSON, for the Python script.
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "bench_util.h"
#include "bytescale/api.h"
#include "bytescale/batch.h"
#include "bytescale/error.h"
#include "bytescale/hw.h"
#include "bytescale/model.h"
#include "bytescale/policy.h"

#define TOKENS (32ll << 20)
#define CONTEXT (2ll << 20)
#define CAPACITY 8192

typedef struct {
    double med, min, max;
} Spread;

// The wall clock, with only the public API and libc: this program also builds against the installed
// shared library (cc bench/plan_api.c -Ibench $(pkg-config --cflags --libs bytescale)).
static double wall_seconds(void) { return bench_cpu_seconds(CLOCK_MONOTONIC); }

static Spread spread(double *v, int n) {
    Spread s = {0, v[0], v[0]};
    for (int i = 0; i < n; i++) s.min = v[i] < s.min ? v[i] : s.min, s.max = v[i] > s.max ? v[i] : s.max;
    s.med = bench_median(v, n);
    return s;
}

int main(int argc, char **argv) {
    int repeats = 21, ranks = 16384;
    const char *dist = "byted", *policy = "balance";
    for (int i = 1; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "--repeats")) repeats = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--dist")) dist = argv[i + 1];
        else if (!strcmp(argv[i], "--ranks")) ranks = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--policy")) policy = argv[i + 1];
        else bs_die("usage: bench_plan_api [--repeats N] [--dist SPEC] [--ranks R] [--policy P]");
    }
    if (repeats < 1 || repeats > 1000 || ranks < 1) bs_die("bench_plan_api: --repeats in [1, 1000], --ranks >= 1");

    int64_t n = bs_batch_sample(dist, 1, TOKENS, CONTEXT, NULL, 0);
    int64_t *lengths = n >= 0 ? malloc((size_t)(n ? n : 1) * sizeof *lengths) : NULL;
    if (!lengths || bs_batch_sample(dist, 1, TOKENS, CONTEXT, lengths, n) != n) bs_die_errmsg();
    GlobalBatch b;
    if (batch_init(&b, n) != 0) bs_die_errmsg();
    for (int64_t i = 0; i < n; i++)
        if (batch_push(&b, i, lengths[i], -1) != 0) bs_die_errmsg();
    CostModel cm;
    if (cost_derive(&cm, model_find("llama-7b"), hw_find("h800-sxm"), 2, 1, ranks, CAPACITY) != 0) bs_die_errmsg();
    PlanConfig cfg = {.n_ranks = ranks, .capacity = CAPACITY, .context = CONTEXT, .pp = 1, .offload = 1};

    double *wall = calloc((size_t)repeats * 4, sizeof *wall), *cpu = wall + repeats;
    double *wall2 = cpu + repeats, *cpu2 = wall2 + repeats;
    if (!wall) bs_die("out of memory");
    int32_t items = 0;
    for (int r = 0; r < repeats; r++) {
        // the planner alone
        Plan p;
        double t0 = wall_seconds(), c0 = bench_cpu_seconds(CLOCK_THREAD_CPUTIME_ID);
        if (policy_plan(&p, policy, &b, &cfg, &cm) != 0) bs_die_errmsg();
        wall[r] = wall_seconds() - t0, cpu[r] = bench_cpu_seconds(CLOCK_THREAD_CPUTIME_ID) - c0;
        items = p.n_items;
        plan_free(&p);
        // what bytescale.plan(lengths, ...) runs in C
        t0 = wall_seconds(), c0 = bench_cpu_seconds(CLOCK_THREAD_CPUTIME_ID);
        CostModel *c = bs_cost_derive("llama-7b", "h800-sxm", 2, 1, ranks, CAPACITY);
        Plan *q = c ? bs_plan_lengths(lengths, n, policy, ranks, CAPACITY, CONTEXT, 1, 1, c) : NULL;
        BsPlanInfo info;
        if (!q || bs_plan_info(q, &info, sizeof info) != 0) bs_die_errmsg();
        wall2[r] = wall_seconds() - t0, cpu2[r] = bench_cpu_seconds(CLOCK_THREAD_CPUTIME_ID) - c0;
        bs_plan_free(q);
        bs_cost_free(c);
    }
    Spread w = spread(wall, repeats), c = spread(cpu, repeats), w2 = spread(wall2, repeats), c2 = spread(cpu2, repeats);
    printf("%s, %lld sequences, %lld tokens, %d ranks, C = %d, %s: %d items; median (min - max) of %d runs\n", dist,
           (long long)n, (long long)b.n_tokens, ranks, CAPACITY, policy, items, repeats);
    printf("  policy_plan      wall %.2f ms (%.2f - %.2f), CPU %.2f ms (%.2f - %.2f)\n", 1e3 * w.med, 1e3 * w.min,
           1e3 * w.max, 1e3 * c.med, 1e3 * c.min, 1e3 * c.max);
    printf("  bs_plan_lengths  wall %.2f ms (%.2f - %.2f), CPU %.2f ms (%.2f - %.2f)\n", 1e3 * w2.med, 1e3 * w2.min,
           1e3 * w2.max, 1e3 * c2.med, 1e3 * c2.min, 1e3 * c2.max);
    printf("{\"sequences\": %lld, \"items\": %d, \"repeats\": %d, \"policy_plan_wall\": %.9g, \"policy_plan_cpu\": %.9g, "
           "\"plan_lengths_wall\": %.9g, \"plan_lengths_cpu\": %.9g}\n",
           (long long)n, items, repeats, w.med, c.med, w2.med, c2.med);
    free(wall);
    free(lengths);
    batch_free(&b);
    return 0;
}
