// scenario.c: the named presets (the paper's grid and case study) and the policy variants.
#include "bytescale/scenario.h"

#include <stdio.h>
#include <string.h>

#include "bytescale/error.h"
#include "bytescale/policy.h"

// The paper's grid (docs/architecture.md, "The paper: evaluation setup").
// GPU counts are the paper's; TP / PP are ours:
//   7B   tp 2:        the case study fixes it: 1,024 GPUs, d_cp = 256 and 8 micro-batches of 2M per
//                     step (32M tokens) leave d_dp = 2, so tp = 1024 / (256 x 2) = 2.
//   13B  tp 4, 30B tp 8: the same 512 HDP ranks as 7B (TP grows with the model, inside a node).
//   70B  tp 8, pp 4:  the paper uses PP for 70B; 8 x 4 keeps a stage at 20 layers (14 GB / GPU).
//   8x7B tp 8, pp 2:  PP as the paper states; 512 HDP ranks.
//   8x22B tp 8, pp 4: 16,384 GPUs (the paper's later version) -> 512 HDP ranks.
// Every one fits an 80 GB device at C = 8K (cost_memory, docs/simulator.md).
typedef struct {
    const char *tag, *model;
    int gpus, tp, pp;
} GridModel;

static const GridModel grid_models[] = {
    {"7b", "llama-7b", 1024, 2, 1},          {"13b", "llama-13b", 2048, 4, 1},
    {"30b", "llama-30b", 4096, 8, 1},        {"70b", "llama-70b", 8192, 8, 4},
    {"8x7b", "mixtral-8x7b", 8192, 8, 2},    {"8x22b", "mixtral-8x22b", 16384, 8, 4},
};
static const char *const grid_datasets[] = {"byted", "github"};
static const struct {
    const char *tag;
    int64_t tokens;
} grid_contexts[] = {{"256k", 256 << 10}, {"512k", 512 << 10}, {"1m", 1 << 20}, {"2m", 2 << 20}};

enum {
    N_GRID_MODELS = (int)(sizeof grid_models / sizeof grid_models[0]),
    N_GRID_DATASETS = 2,
    N_GRID_CONTEXTS = 4,
    N_GRID = N_GRID_MODELS * N_GRID_DATASETS * N_GRID_CONTEXTS,
};

#define SIM_DEFAULT_HARDWARE "h100-sxm"  // the paper does not disclose its GPUs (docs/hardware.md)
#define SIM_CAPACITY (8 << 10)           // C = 8K tokens, the paper's running example
#define SIM_TOKENS (32 << 20)            // 32M tokens per global batch

int scenario_grid_count(void) { return N_GRID; }
int scenario_count(void) { return N_GRID + 1; }

static void fill(Scenario *s, const char *name, const GridModel *g, const char *dataset, int64_t context) {
    memset(s, 0, sizeof *s);
    snprintf(s->name, sizeof s->name, "%s", name);
    snprintf(s->model, sizeof s->model, "%s", g->model);
    snprintf(s->hardware, sizeof s->hardware, "%s", SIM_DEFAULT_HARDWARE);
    snprintf(s->dataset, sizeof s->dataset, "%s", dataset);
    s->gpus = g->gpus;
    s->tp = g->tp;
    s->pp = g->pp;
    s->capacity = SIM_CAPACITY;
    s->context = context;
    s->tokens = SIM_TOKENS;
}

int scenario_get(int i, Scenario *out) {
    if (i < 0 || i >= scenario_count()) return bs_fail("scenario %d out of range [0, %d)", i, scenario_count());
    if (i == N_GRID) {
        // LLaMA-7B, 2M, 1,024 GPUs, Byted; the static policy derives d_cp = 2M / 8K = 256 and
        // d_dp = 512 / 256 = 2, i.e. 32M / (2 x 2M) = 8 micro-batches per step
        fill(out, "case-study", &grid_models[0], "byted", 2 << 20);
        return 0;
    }
    // model-major, then dataset, then context: the order of the paper's figures
    int m = i / (N_GRID_DATASETS * N_GRID_CONTEXTS);
    int d = i / N_GRID_CONTEXTS % N_GRID_DATASETS;
    int c = i % N_GRID_CONTEXTS;
    char name[48];
    snprintf(name, sizeof name, "%s-%d-%s-%s", grid_models[m].tag, grid_models[m].gpus, grid_datasets[d],
             grid_contexts[c].tag);
    fill(out, name, &grid_models[m], grid_datasets[d], grid_contexts[c].tokens);
    return 0;
}

int scenario_find(const char *name, Scenario *out) {
    for (int i = 0; i < scenario_count(); i++) {
        if (scenario_get(i, out) != 0) return -1;
        if (name && strcmp(out->name, name) == 0) return 0;
    }
    return bs_fail("unknown scenario \"%s\": names look like 7b-1024-byted-2m or case-study "
                   "(`bytescale simulate --scenario list` lists all %d)",
                   name ? name : "(null)", scenario_count());
}

// ---- policy variants ---------------------------------------------------------------------------

static const SimVariant variants[] = {
    {"static", "static", 0, "the static DP x CP mesh, the baseline"},
    {"naive-nooff", "naive", 0, "HDP sharding + dynamic comm"},
    {"naive", "naive", 1, "+ selective offloading"},
    {"naive-eq3min", "naive-eq3min", 1, "naive, every ring on Eq. 3's fewest ranks"},
    {"balance", "balance", 1, "+ balance scheduler"},
    {"elastic", "elastic", 1, "+ rings past ceil(s/C) where ranks idle; beyond the paper"},
};
enum { N_VARIANTS = (int)(sizeof variants / sizeof variants[0]) };

int sim_variant_count(void) { return N_VARIANTS; }
const SimVariant *sim_variant_at(int i) { return i >= 0 && i < N_VARIANTS ? &variants[i] : NULL; }

int sim_variant_find(const char *label, SimVariant *out) {
    for (int i = 0; i < N_VARIANTS; i++)
        if (label && strcmp(variants[i].label, label) == 0) {
            *out = variants[i];
            return 0;
        }
    const Policy *pol = label ? policy_find(label) : NULL;
    if (!pol) {
        char known[256] = "";
        size_t used = 0;
        for (int i = 0; i < N_VARIANTS; i++)
            used += (size_t)snprintf(known + used, sizeof known - used, "%s%s", i ? ", " : "", variants[i].label);
        return bs_fail("unknown policy \"%s\" (known: %s, all, or any planner of `bytescale plan`)",
                       label ? label : "(null)", known);
    }
    memset(out, 0, sizeof *out);
    snprintf(out->label, sizeof out->label, "%s", pol->name);
    snprintf(out->policy, sizeof out->policy, "%s", pol->name);
    out->offload = 1;
    snprintf(out->summary, sizeof out->summary, "%s", pol->summary ? pol->summary : "");
    return 0;
}
