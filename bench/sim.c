// bench/sim.c: how long it takes to simulate one training step, on the largest preset (16,384 GPUs,
// 512 HDP ranks of tp 8 x pp 4) and a mid-size one (1,024 GPUs), for every policy. The issue's
// target: one step of the largest scenario in a few seconds at most. Planning is timed apart.
//
// usage: bench_sim [repeats]   (default 9; the median is reported)
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bytescale/error.h"
#include "bytescale/policy.h"
#include "bytescale/scenario.h"
#include "bytescale/timer.h"

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static double median(double *v, int n) {
    qsort(v, (size_t)n, sizeof *v, cmp_double);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

int main(int argc, char **argv) {
    int repeats = argc > 1 ? atoi(argv[1]) : 9;
    if (repeats < 1 || repeats > 1000) bs_die("usage: bench_sim [repeats 1..1000]");
    const char *scenarios[] = {"8x22b-16384-byted-2m", "8x22b-16384-github-256k", "7b-1024-byted-2m"};
    printf("bench_sim: one simulated training step, median of %d runs (target: a few seconds at 16,384 GPUs)\n\n",
           repeats);
    printf("%-24s %-12s %6s %5s %6s %7s %9s %9s %9s  %s\n", "scenario", "policy", "gpus", "ranks", "items", "ops",
           "plan ms", "sim ms", "sim max", "target");
    double *t = malloc(sizeof(double) * (size_t)repeats), *tp = malloc(sizeof(double) * (size_t)repeats);
    if (!t || !tp) bs_die("out of memory");
    for (size_t i = 0; i < sizeof scenarios / sizeof scenarios[0]; i++) {
        Scenario sc;
        SimSetup s;
        if (scenario_find(scenarios[i], &sc) != 0 || sim_setup_init(&s, &sc, 1) != 0) bs_die_errmsg();
        SimConfig cfg = sim_setup_config(&s);
        for (int j = 0; j < sim_variant_count(); j++) {
            const SimVariant *v = sim_variant_at(j);
            PlanConfig pc;
            memset(&pc, 0, sizeof pc);
            pc.n_ranks = s.cluster.n_ranks;
            pc.capacity = sc.capacity;
            pc.context = sc.context;
            pc.pp = sc.pp;
            pc.offload = v->offload;
            Plan p;
            int n_ops = 0;
            double worst = 0;
            for (int k = 0; k < repeats; k++) {
                double t0 = now_seconds();
                if (policy_plan(&p, v->policy, &s.batch, &pc, &s.cm) != 0) bs_die_errmsg();
                double t1 = now_seconds();
                SimResult r;
                if (sim_run(&r, &p, &cfg) != 0) bs_die_errmsg();
                double t2 = now_seconds();
                tp[k] = t1 - t0;
                t[k] = t2 - t1;
                if (t[k] > worst) worst = t[k];
                n_ops = r.n_ops;
                sim_result_free(&r);
                if (k + 1 < repeats) plan_free(&p);
            }
            double sim_med = median(t, repeats);
            printf("%-24s %-12s %6d %5d %6d %7d %9.2f %9.2f %9.2f  %s\n", sc.name, v->label, sc.gpus,
                   s.cluster.n_ranks, p.n_items, n_ops, 1e3 * median(tp, repeats), 1e3 * sim_med, 1e3 * worst,
                   sim_med < 3.0 ? "ok (< 3 s)" : "SLOW (> 3 s)");
            plan_free(&p);
        }
        sim_setup_free(&s);
    }
    free(t);
    free(tp);
    return 0;
}
