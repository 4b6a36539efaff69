// seeds.h: one scenario over several sampled batches (seeds), every policy variant planned and
// simulated on each, and the results as mean / min / max over the seeds (docs/simulator.md).
//
// Why: one sampled batch is one draw of a heavy-tailed length distribution. A single seed moves
// the case study's speedup of balance over static anywhere from 2.2x to 3.6x, because a batch
// with one more 2M-token sequence changes the critical path of every policy. The mean over a few
// seeds, with the spread next to it, is what a comparison can stand on.
//
// Seeds are seed, seed + 1, ..., seed + n - 1: --seed stays the first one, so `--seeds 1` is
// exactly the single run of that seed.
//
// The seeds are also consecutive steps of one run, for every policy alike: the sequences a policy's
// plan delays (Plan.delayed: wlb's outlier queue) go first into that policy's batch of the next seed,
// and the last seed's step flushes (PlanConfig.flush), so over the seeds every policy trains every
// sequence exactly once. A policy that delays nothing sees exactly the seeds' batches. The fair
// throughput of a run is SIM_M_TOKENS's mean over SIM_M_STEP_TIME's mean (total tokens over total
// time, sim_seed_stats_run_tokens_per_s); the mean of the per-step tokens/s is not, for a policy
// whose steps train different amounts.
#ifndef BYTESCALE_SEEDS_H
#define BYTESCALE_SEEDS_H

#include <stdint.h>
#include <stdio.h>

#include <cJSON.h>

#include "bytescale/progress.h"
#include "bytescale/scenario.h"

enum { SIM_SEEDS_DEFAULT = 8, SIM_SEEDS_MAX = 1024, SIM_SEEDS_MAX_VARIANTS = 16 };

typedef struct {
    double mean, min, max;
} SimStat;

// The numbers aggregated over seeds. Each has a JSON key, a CSV column stem (CSV columns are
// <stem>_mean, <stem>_min, <stem>_max; "" = not in the CSV) and the CSV unit scale: sim_metric_info.
typedef enum {
    SIM_M_STEP_TIME,        // seconds
    SIM_M_TOKENS_PER_S,
    SIM_M_SPEEDUP,          // tokens/s over static's on the same seed; NAN when static did not run
    SIM_M_MFU,
    SIM_M_BUSY_MEDIAN,      // per (rank, stage), seconds
    SIM_M_COMM_MEDIAN,
    SIM_M_WAIT_MEDIAN,
    SIM_M_WAIT_MAX,
    SIM_M_SYNC_TIME,
    SIM_M_RING_BYTES,       // all devices
    SIM_M_OFFLOAD_BYTES,
    SIM_M_ITEMS,
    SIM_M_RINGS,
    SIM_M_MAKESPAN_RATIO,   // planner makespan / lower bound (how close the planner is to the bound)
    SIM_M_MAKESPAN_HDP,     // planner makespan / HDP-aware bound (a sequence on at most ceil(s/C) ranks)
    SIM_M_TOKENS,           // tokens the step trained (the batch, plus sequences carried in, less those delayed)
    SIM_M_PLAN_SECONDS,     // wall time of the planner (not in the CSV: it is not a result)
    SIM_M_SIM_SECONDS,      // wall time of the simulation (idem)
    // why one policy beats another, from the per-(rank, stage) breakdown (after the others, so the
    // CSV's older columns keep their places):
    SIM_M_BUSY_IMBALANCE,   // largest busy time over the mean busy time: compute imbalance
    SIM_M_COMM_MEAN,        // exposed communication (ring, offload, TP, gradient sync), mean, seconds
    SIM_M_WAIT_MEAN,        // waiting for ring members, inputs, other ranks, mean, seconds
    SIM_M_LONGEST_ITEM,     // the longest item's estimated time, seconds: the longest sequence's spread
    SIM_N_METRICS
} SimMetric;

typedef struct {
    const char *json;   // key in the JSON "mean" / "min" / "max" objects
    const char *csv;    // CSV column stem; "" when the metric is not written to CSV
    double csv_scale;   // CSV value = value x csv_scale (bytes -> TB)
} SimMetricInfo;

const SimMetricInfo *sim_metric_info(SimMetric m);

// One variant over all seeds.
typedef struct {
    SimVariant variant;
    int ok;                         // it ran on every seed; else its stats are NAN and why says why
    char why[256];                  // the first failure, "seed N: <message>"
    double *values;                 // (n_seeds x SIM_N_METRICS): values[k * SIM_N_METRICS + m] of seed k
    SimStat stat[SIM_N_METRICS];    // over the seeds; NAN when !ok (speedup: when static is not ok)
    // the share of the run's simulated time taken by its first step and its last (flushing) step:
    // a run's throughput is its steady state when this is small (docs/simulator.md); 1 with one seed
    double first_flush_share;
} SimSeedStats;

typedef struct {
    Scenario sc;
    uint64_t seed;      // the first seed
    int n_seeds, n_v;
    char hardware[32];  // the profile's name (the scenario may name a file)
    int n_ranks;        // HDP ranks
    SimStat sequences;  // sequences per sampled batch
    SimSeedStats v[SIM_SEEDS_MAX_VARIANTS];
} SimSeedsResult;

// Called after every successful run (variant j on set-up s, whose seed is s->seed) with its outcome
// and plan, before both are freed: traces, per-seed JSON. Non-zero stops the whole run (-1); the
// hook sets the error.
typedef int (*SimSeedHook)(void *ctx, const SimSetup *s, int j, const SimOutcome *o, const Plan *p);

typedef struct {
    uint64_t seed;          // the first seed
    int n_seeds;            // 1 .. SIM_SEEDS_MAX
    const CostModel *cm;    // NULL: derived for every set-up; else it replaces the derived one (--cost)
    Progress *progress;     // NULL: none; else advanced by one per (seed, variant), counting in *done
    int64_t *done;
    SimSeedHook hook;       // NULL: none
    void *hook_ctx;
} SimSeedsConfig;

// Run every variant on every seed of scenario sc, freeing each seed's set-up and outcomes before the
// next. A variant that fails on a seed is not run on the later ones and is marked !ok (a mean over
// the seeds it happened to survive would not be comparable). -1 + error when a set-up fails (a
// shape that does not fit, a bad distribution) or the hook stops it; out is then freed.
int sim_seeds_run(SimSeedsResult *out, const Scenario *sc, const SimVariant *v, int n_v, const SimSeedsConfig *cfg);
void sim_seeds_free(SimSeedsResult *r);

// Total tokens over total simulated time over the seeds, a run's throughput (NAN when !ok).
double sim_seed_stats_run_tokens_per_s(const SimSeedStats *st);
// The largest first + flush share over the variants that ran (NAN when none did).
double sim_seeds_max_first_flush_share(const SimSeedsResult *r);

// mean / min / max of n values (n >= 1); any NAN gives NAN everywhere.
SimStat sim_stat_of(const double *x, int n, int stride);

// The set-up in one line, as sim_setup_describe, with the range of sequences and the seeds.
void sim_seeds_describe(FILE *f, const SimSeedsResult *r);
// The comparison table of the variants that ran: means, with [min-max] for tokens/s and the
// speedup over static, and a line saying so under it. One seed prints no brackets and no line.
void sim_seeds_table_print(FILE *f, const SimSeedsResult *r);
// {"policy", "planner", "offload", "mean": {...}, "min": {...}, "max": {...}} with the
// metrics' JSON keys (speedup_vs_static only when it is defined). NULL + error when out of memory.
cJSON *sim_seed_stats_json(const SimSeedStats *st);

#endif
