// scenario.h: named simulation set-ups and the runner that plans a global batch with each policy
// variant and simulates the step (docs/simulator.md).
//
// Presets: the paper's grid (docs/architecture.md, "The paper: evaluation setup"): six models on
// their GPU counts, both datasets, contexts 256K to 2M, 32M tokens per step, named
// "<model>-<gpus>-<dataset>-<context>", e.g. "7b-1024-byted-2m"; and "case-study" (LLaMA-7B, 2M,
// 1,024 GPUs, Byted: the static baseline gets d_cp = 256 and 8 micro-batches per step). TP and PP
// degrees are ours (the paper gives none but "TP inside a node, PP for 70B and the MoE models");
// the table in scenario.c says why each.
#ifndef BYTESCALE_SCENARIO_H
#define BYTESCALE_SCENARIO_H

#include <stdint.h>
#include <stdio.h>

#include <cJSON.h>

#include "bytescale/batch.h"
#include "bytescale/cluster.h"
#include "bytescale/cost.h"
#include "bytescale/hw.h"
#include "bytescale/model.h"
#include "bytescale/plan.h"
#include "bytescale/sim.h"
#include "bytescale/export.h"

BS_API_BEGIN

typedef struct {
    char name[48];
    char model[32];       // model_find name
    char hardware[256];   // a profile name or a profile JSON file, as hw_resolve reads it
    int gpus, tp, pp;
    int64_t capacity;     // C: tokens per HDP rank per micro-batch
    int64_t context;      // longest sequence; the static baseline's d_cp = ceil(context / C)
    int64_t tokens;       // tokens per global batch
    char dataset[64];     // length distribution (batch.h: "byted", "github", "uniform:LO:HI", ...)
    int64_t block_size;   // the block peer's B (PlanConfig.block_size; 0 = its default)
} Scenario;

int scenario_count(void);
// The i-th preset (0 <= i < scenario_count()); -1 + error when out of range.
int scenario_get(int i, Scenario *out);
// A preset by name; -1 + error saying how names look and that `--scenario list` lists them.
int scenario_find(const char *name, Scenario *out);
// The paper's grid is presets 0 .. scenario_grid_count() - 1.
int scenario_grid_count(void);

// A policy as the comparison runs it: the planner and whether it may offload. The paper's
// ablation is the first four: static; naive without offloading (data-aware sharding + dynamic
// communication); naive (+ selective offloading); balance (+ the balance scheduler). naive-eq3min
// (Eq. 3 read literally) and elastic (bytescale's own, beyond the paper) come with them.
typedef struct {
    char label[32];     // "static", "naive-nooff", "naive", "balance", or another policy's name
    char policy[24];    // policy_find name
    int offload;
    char summary[64];
} SimVariant;

int sim_variant_count(void);
const SimVariant *sim_variant_at(int i);
// A label from the table, or any registered policy's name (run with offloading on).
int sim_variant_find(const char *label, SimVariant *out);

// 8192 -> "8K", 2097152 -> "2M", 1000 -> "1000": token counts for tables, titles and names. Returns buf.
const char *sim_tokens_text(char *buf, size_t n, int64_t tokens);

// A scenario made concrete: model, hardware, cluster, cost model and the sampled global batch.
typedef struct {
    Scenario sc;
    uint64_t seed;
    ModelConfig model;
    HardwareProfile hw;
    Cluster cluster;
    CostModel cm;
    GlobalBatch batch;
    int flush;  // the last step of a run: PlanConfig.flush (wlb delays nothing); sim_seeds_run sets it
    int64_t carried;  // the batch's first sequences that earlier steps delayed: PlanConfig.carried
} SimSetup;

// -1 + error naming the scenario and what did not fit (unknown model, shape, distribution).
int sim_setup_init(SimSetup *s, const Scenario *sc, uint64_t seed);
void sim_setup_free(SimSetup *s);
// The simulator's configuration for this set-up (pointers into *s).
SimConfig sim_setup_config(const SimSetup *s);

typedef struct {
    SimVariant variant;
    double plan_seconds;     // wall time of the planner
    double sim_seconds;      // wall time of the simulation
    double planner_makespan; // the planner's own estimate of the compute phase
    double lower_bound;      // the plan's lower_bound (plan_lower_bound_pp)
    double hdp_bound;        // the plan's hdp_bound (plan_hdp_bound)
    int32_t n_items;
    SimResult res;
} SimOutcome;

// Plan the set-up's batch with one variant and simulate it. plan_out (may be NULL) receives the
// plan (plan_free it). -1 + error naming the variant.
int sim_setup_run(const SimSetup *s, const SimVariant *v, SimOutcome *out, Plan *plan_out);
void sim_outcome_free(SimOutcome *o);

// A comparison table, one row per outcome; "vs static" is the speedup in tokens/s over the row
// labelled "static" when there is one.
void sim_table_print(FILE *f, const SimOutcome *o, int n);
// One line naming the set-up: model, GPUs, tp / pp, HDP ranks, C, context, dataset, tokens, seed.
void sim_setup_describe(FILE *f, const SimSetup *s);
// JSON forms for --json (the caller cJSON_Delete's them); NULL + error when out of memory.
cJSON *sim_setup_json(const SimSetup *s);
cJSON *sim_outcome_json(const SimOutcome *o);
// {"peak_bytes", "static_bytes", "activation_bytes", "rank", "stage", "mem_bytes", "fits"} of a step's
// memory peak (sim.h, sim_memory); mem_bytes <= 0 (not known) gives null for mem_bytes and fits.
cJSON *sim_memory_json(const SimMemPeak *m, double mem_bytes);

// ---- sweeps, the paper grid, plots ---------------------------------------------------------------

typedef enum { SIM_SWEEP_CONTEXTS, SIM_SWEEP_GPUS } SimSweep;

// Run every variant at each point of a sweep around `base`: contexts 256K, 512K, 1M, 2M, or
// GPUs x 1/4, 1/2, 1, 2 (points whose shape does not fit are reported and skipped), each point over
// the seeds seed .. seed + n_seeds - 1 (seeds.h). Prints a table per point to `log` (may be NULL),
// writes <dir>/<stem>.csv (stem: "<base>-contexts" or "<base>-gpus"; every metric as mean, min and
// max over the seeds) and, when plot is set, <dir>/<stem>.png and .svg through gnuplot (the mean
// with min-max bars).
int sim_sweep_run(const Scenario *base, SimSweep kind, const SimVariant *v, int n_v, uint64_t seed, int n_seeds,
                  const char *dir, int plot, FILE *log);

// The whole paper grid (presets 0 .. scenario_grid_count() - 1) with every variant, every cell over
// the seeds seed .. seed + n_seeds - 1: writes <dir>/paper-grid.md (tokens/s per policy, speedups of
// naive and balance over static, mean and [min-max] per cell, with `command` at the top as the way
// to regenerate it), <dir>/paper-grid.csv and, when plot is set, <dir>/paper-grid.png / .svg.
// `hardware` (NULL: the presets') replaces every preset's. part / parts (1 / 1: every cell) runs only
// the cells i with i mod parts = part - 1, so that parts processes run the grid in parallel; each
// cell's numbers are those of the whole grid's run (the cells share nothing).
int sim_grid_run(const SimVariant *v, int n_v, uint64_t seed, int n_seeds, const char *hardware, int part, int parts,
                 const char *dir, const char *command, int plot, FILE *log);

// Run gnuplot on a script. -1 + a clear error when gnuplot is not installed or fails.
int sim_gnuplot(const char *script_path);

BS_API_END

#endif
