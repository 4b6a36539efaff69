// bench/sim.c: how long it takes to simulate one training step, on the largest preset (16,384 GPUs,
// 512 HDP ranks of tp 8 x pp 4) and a mid-size one (1,024 GPUs), for every policy. The issue's
// target: one step of the largest scenario in a few seconds at most. Planning is timed apart.
//
// usage: bench_sim [repeats]   (default 9; the median is reported)
#include <stdio.h>
#include <stdlib.h>

#include "bytescale/error.h"
#include "bytescale/scenario.h"
#include "bench_util.h"

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
        for (int j = 0; j < sim_variant_count(); j++) {
            const SimVariant *v = sim_variant_at(j);
            int n_items = 0, n_ops = 0;
            double worst = 0;
            for (int k = 0; k < repeats; k++) {
                SimOutcome o;  // the runner times the planner and the simulation apart
                if (sim_setup_run(&s, v, &o, NULL) != 0) bs_die_errmsg();
                tp[k] = o.plan_seconds;
                t[k] = o.sim_seconds;
                if (t[k] > worst) worst = t[k];
                n_items = o.n_items;
                n_ops = o.res.n_ops;
                sim_outcome_free(&o);
            }
            double sim_med = bench_median(t, repeats);
            printf("%-24s %-12s %6d %5d %6d %7d %9.2f %9.2f %9.2f  %s\n", sc.name, v->label, sc.gpus,
                   s.cluster.n_ranks, n_items, n_ops, 1e3 * bench_median(tp, repeats), 1e3 * sim_med, 1e3 * worst,
                   sim_med < 3.0 ? "ok (< 3 s)" : "SLOW (> 3 s)");
        }
        sim_setup_free(&s);
    }
    free(t);
    free(tp);
    return 0;
}
