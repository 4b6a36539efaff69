// simulate.c: `bytescale simulate` - run plans on a modelled GPU cluster (docs/simulator.md).
#include <getopt.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bytescale/policy.h"
#include "bytescale/error.h"
#include "bytescale/json.h"
#include "bytescale/model.h"
#include "bytescale/plan.h"
#include "bytescale/scenario.h"
#include "bytescale/seeds.h"
#include "bytescale/sim.h"
#include "cli/cli.h"

enum { MAX_VARIANTS = SIM_SEEDS_MAX_VARIANTS };

static void usage(FILE *f) {
    char own[256], peers[256];  // from the table of policies (policy.c), the one list
    policy_names(own, sizeof own, POLICY_OWN);
    policy_names(peers, sizeof peers, POLICY_PEERS);
    fprintf(f,
            "usage: bytescale simulate [flags]\n"
            "\n"
            "Plan a global batch with each policy and simulate one training step on a modelled cluster:\n"
            "step time, tokens/s, MFU, per-rank busy / communication / wait, ring and offload traffic.\n"
            "The model, its assumptions and what it leaves out: docs/simulator.md.\n"
            "\n"
            "What to simulate (a preset; the other flags change it):\n"
            "  --scenario NAME     a preset, `list` prints them: the paper grid (7b-1024-byted-2m,\n"
            "                      70b-8192-github-512k, ...) and case-study (default 7b-1024-byted-2m)\n"
            "  --model NAME        llama-7b, llama-13b, llama-30b, llama-70b, mixtral-8x7b, mixtral-8x22b, ...\n"
            "  --hardware NAME|FILE\n"
            "                      a profile (h100-sxm, h100-measured, h800-sxm, cpu) or a profile JSON file (a path with\n"
            "                      a '/' or ending in .json)\n"
            "  --gpus N            devices in the cluster\n"
            "  --ranks N           HDP ranks instead: gpus = N x tp x pp\n"
            "  --tp N, --pp N      tensor / pipeline degree of every HDP rank (HDP ranks = gpus / (tp x pp))\n"
            "  --capacity N        C: tokens per HDP rank per micro-batch (suffixes K M: 8K)\n"
            "  --context N         longest sequence; the static mesh uses d_cp = context / C\n"
            "  --dist SPEC         length distribution: byted, github, uniform:LO:HI, lognormal:MU:SIGMA,\n"
            "                      fixed:LEN\n"
            "  --tokens N          tokens per global batch (default 32M)\n"
            "  --seed N            the first seed of the sampled batches (default 1)\n"
            "  --seeds N           sample N batches (seeds seed .. seed + N - 1), run every policy on each and\n"
            "                      report the mean with the min-max over them: tables, JSON, every point of\n"
            "                      a sweep and every cell of the grid (default 8, at most 1024; one batch\n"
            "                      alone moves the case study's speedup anywhere from 2.2x to 3.6x). The seeds\n"
            "                      are the steps of one run: under the table each policy's run tokens/s, its\n"
            "                      per-rank breakdown (busy max/mean, exposed comm, wait, the longest item)\n"
            "                      and the share of the run its first and flushing steps take\n"
            "  --policy LIST       comma-separated, the words of `bytescale plan`: bytescale's own\n"
            "                      (%s), the peers' schedulers\n"
            "                      (%s; docs/peers.md), own, peers, all;\n"
            "                      here own is also naive-nooff (naive without offloading). Default: own\n"
            "  --block-size B      blocks, blocks-all: tokens per block (default MagiAttention's: a micro-batch's\n"
            "                      tokens / (8 x its group's ranks); a larger B is capped to that)\n"
            "  --plan FILE         simulate this plan file (docs/plan-format.md) instead of planning; the\n"
            "                      cluster is --gpus or --ranks (default: the plan's ranks x tp x pp) with --tp\n"
            "  --cost FILE         cost model coefficients, JSON (docs/cost-model.md); default: derived from\n"
            "                      --model and --hardware. A profile of the whole model (bytescale profile) is\n"
            "                      cut to one stage of --pp and one TP rank of --tp, and its tp_bw / tp_lat and\n"
            "                      stage_bw / stage_lat price the TP all-reduces and the stage messages\n"
            "\n"
            "Outputs (a table on stdout by default):\n"
            "  --json              the set-up and every policy's results as JSON on stdout instead: mean,\n"
            "                      min, max over the seeds and every seed's own numbers\n"
            "  --trace FILE        Chrome-trace JSON of the step of the first seed (open in Perfetto); with\n"
            "                      several policies one file each, the policy's name before .json\n"
            "  --trace-ranks N     ranks a trace shows, evenly spaced (default 64)\n"
            "  --sweep KIND        contexts (256K, 512K, 1M, 2M) or gpus (x 1/4, 1/2, 1, 2): a table per\n"
            "                      point, <out>/<scenario>-<kind>.csv and a plot (.png, .svg, .gp)\n"
            "  --grid              the whole paper grid, each --policy: <out>/paper-grid.md, .csv, .png, .svg\n"
            "  --cells K/N         with --grid: only part K of N (the cells K-1, K-1+N, ... in `--scenario list`\n"
            "                      order), so N processes run the grid side by side; each cell's numbers are\n"
            "                      the whole grid's (scripts/peers_table.py reads several CSVs)\n"
            "  --out DIR           where sweeps and the grid write (default sim-out; docs/results for --grid)\n"
            "  --no-plot           write the CSV only (plots need gnuplot)\n"
            "  --strict            a step whose peak device memory exceeds the hardware's mem_bytes is an\n"
            "                      error (exit 1) rather than a warning\n"
            "  --help              this text\n"
            "\n"
            "Memory: every single run reports the peak memory per device (the largest over HDP ranks x\n"
            "stages, and over the seeds): parameters, gradients and optimizer state plus the activations\n"
            "the simulated 1F1B schedule holds at once, against mem_bytes of --hardware (unknown with --cost\n"
            "and no --hardware). A step that does not fit is a warning on stderr, an error with --strict.\n"
            "\n"
            "Exit status: 0 done, 1 a run failed or, with --strict, did not fit in memory (message on\n"
            "stderr), 2 bad flags. BS_QUIET=1 hides the progress line of sweeps and the grid.\n",
            own, peers);
}

static int bad_usage(const char *fmt, const char *arg) { return cli_usage_error("simulate", fmt, arg); }

static int fail(void) {
    fprintf(stderr, "bytescale simulate: error: %s\n", bs_errmsg());
    return CLI_EXIT_FAILURE;
}

static void list_scenarios(void) {
    printf("%-26s %-14s %6s %3s %3s %8s %5s %7s %-8s\n", "name", "model", "gpus", "tp", "pp", "context", "C", "tokens",
           "dist");
    for (int i = 0; i < scenario_count(); i++) {
        Scenario s;
        if (scenario_get(i, &s) != 0) continue;
        char a[24], b[24], c[24];
        printf("%-26s %-14s %6d %3d %3d %8s %5s %7s %-8s\n", s.name, s.model, s.gpus, s.tp, s.pp,
               sim_tokens_text(a, sizeof a, s.context), sim_tokens_text(b, sizeof b, s.capacity),
               sim_tokens_text(c, sizeof c, s.tokens), s.dataset);
    }
}

// One variant into out, once (by label).
static int add_variant(const SimVariant *v, SimVariant *out, int *n) {
    for (int i = 0; i < *n; i++)
        if (!strcmp(out[i].label, v->label)) return 0;
    if (*n == MAX_VARIANTS) return bs_fail("--policy: at most %d policies", MAX_VARIANTS);
    out[(*n)++] = *v;
    return 0;
}

// The policy vocabulary of `bytescale plan` (policy_expand), where the word own is the simulator's
// variants of bytescale's own (naive-nooff among them): "static,balance", "own,flexsp", "all" ->
// variants, each once, in the order named.
static int parse_policies(const char *list, SimVariant *out, int *n) {
    *n = 0;
    char buf[512];
    if (snprintf(buf, sizeof buf, "%s", list) >= (int)sizeof buf) return bs_fail("--policy: the list is too long");
    for (char *save = NULL, *tok = strtok_r(buf, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
        int own = !strcmp(tok, "own") || !strcmp(tok, "all"), peers = !strcmp(tok, "peers") || !strcmp(tok, "all");
        for (int i = 0; own && i < sim_variant_count(); i++)
            if (add_variant(sim_variant_at(i), out, n) != 0) return -1;
        const char *names[MAX_VARIANTS];
        int k = 0;
        if (peers && policy_expand("peers", names, MAX_VARIANTS, &k) != 0) return bs_fail_ctx("--policy");
        for (int i = 0; i < k; i++) {
            SimVariant v;
            if (sim_variant_find(names[i], &v) != 0 || add_variant(&v, out, n) != 0) return bs_fail_ctx("--policy");
        }
        if (own || peers) continue;
        SimVariant v;
        if (sim_variant_find(tok, &v) != 0 || add_variant(&v, out, n) != 0) return bs_fail_ctx("--policy");
    }
    if (*n == 0) return bs_fail("--policy: no policy in '%s'", list);
    return 0;
}

// FILE.json -> FILE-<label>.json when several traces are written
static void trace_path(char *buf, size_t n, const char *path, const char *label, int several) {
    if (!several) {
        snprintf(buf, n, "%s", path);
        return;
    }
    const char *dot = strrchr(path, '.');
    const char *slash = strrchr(path, '/');
    if (dot && (!slash || dot > slash)) snprintf(buf, n, "%.*s-%s%s", (int)(dot - path), path, label, dot);
    else snprintf(buf, n, "%s-%s", path, label);
}

// Bounds of the numeric flags. Beyond them the model means nothing and the products the simulator
// forms (GPUs = ranks x tp x pp, tokens per rank, sequences per batch) would overflow or allocate
// absurdly; the cluster's own bounds are in cluster.h.
#define MAX_CAPACITY (1ll << 24)  // tokens per rank per micro-batch, as `bytescale plan`
#define MAX_TOKENS (1ll << 40)    // tokens per global batch (and the longest context)
#define MAX_TRACE_RANKS (1 << 20)

// A flag's integer value within [min, max].
static int int64_flag(const char *flag, const char *text, int64_t *out, int64_t min, int64_t max) {
    if (arg_int64(flag, text, out) != 0) return -1;
    if (*out < min || *out > max)
        return bs_fail("%s: '%s' is out of range [%lld, %lld]", flag, text, (long long)min, (long long)max);
    return 0;
}

static int int_flag(const char *flag, const char *text, int *out, int max) {
    int64_t v = 0;  // set by int64_flag on success (GCC cannot see that bs_fail returns -1)
    if (int64_flag(flag, text, &v, 1, max) != 0) return -1;
    *out = (int)v;
    return 0;
}

// A text flag's value (NULL: not given) into a scenario field. -1 + error when it would not fit.
static int set_text(char *dst, size_t cap, const char *flag, const char *value, int *changed) {
    if (!value) return 0;
    if (strlen(value) >= cap) return bs_fail("%s: the value is too long (at most %zu bytes)", flag, cap - 1);
    memcpy(dst, value, strlen(value) + 1);
    *changed = 1;
    return 0;
}

// --cells K/N: the grid's part K of N (cells K-1, K-1+N, ...). 0, or -1 + error.
static int cells_flag(const char *a, int *part, int *parts) {
    int k, n, used = 0, cells = scenario_grid_count();
    if (sscanf(a, "%d/%d%n", &k, &n, &used) != 2 || a[used] != '\0')
        return bs_fail("--cells: '%s' is not K/N (part K of N, e.g. 1/2)", a);
    if (n < 1 || n > cells || k < 1 || k > n)
        return bs_fail("--cells: '%s' needs 1 <= K <= N <= %d (the grid's cells)", a, cells);
    *part = k, *parts = n;
    return 0;
}

// The flags: getopt_long values from F_FIRST, so Flags.given is indexed by value - F_FIRST.
enum { F_FIRST = 256, F_SCENARIO = F_FIRST, F_MODEL, F_HW, F_GPUS, F_RANKS, F_TP, F_PP, F_CAP, F_CTX, F_DIST, F_TOKENS,
       F_SEED, F_SEEDS, F_POLICY, F_PLAN, F_COST, F_TRACE, F_TRACE_RANKS, F_SWEEP, F_GRID, F_OUT, F_NOPLOT, F_JSON,
       F_STRICT, F_BLOCK, F_CELLS, F_HELP };
static const struct option opts[] = {
    {"scenario", required_argument, 0, F_SCENARIO}, {"model", required_argument, 0, F_MODEL},
    {"hardware", required_argument, 0, F_HW},       {"gpus", required_argument, 0, F_GPUS},
    {"ranks", required_argument, 0, F_RANKS},       {"tp", required_argument, 0, F_TP},
    {"pp", required_argument, 0, F_PP},             {"capacity", required_argument, 0, F_CAP},
    {"context", required_argument, 0, F_CTX},       {"dist", required_argument, 0, F_DIST},
    {"block-size", required_argument, 0, F_BLOCK},
    {"tokens", required_argument, 0, F_TOKENS},     {"seed", required_argument, 0, F_SEED},
    {"seeds", required_argument, 0, F_SEEDS},
    {"policy", required_argument, 0, F_POLICY},     {"plan", required_argument, 0, F_PLAN},
    {"cost", required_argument, 0, F_COST},         {"trace", required_argument, 0, F_TRACE},
    {"trace-ranks", required_argument, 0, F_TRACE_RANKS}, {"sweep", required_argument, 0, F_SWEEP},
    {"grid", no_argument, 0, F_GRID},               {"out", required_argument, 0, F_OUT},
    {"no-plot", no_argument, 0, F_NOPLOT},          {"json", no_argument, 0, F_JSON},
    {"strict", no_argument, 0, F_STRICT},           {"help", no_argument, 0, F_HELP},
    {"cells", required_argument, 0, F_CELLS},
    {0, 0, 0, 0},
};

typedef struct {
    const char *scenario, *model, *hardware, *dist, *policy, *plan, *cost, *trace, *sweep, *out;
    int gpus, ranks, tp, pp, trace_ranks, json, grid, no_plot, seeds, strict, part, parts, help;
    int64_t capacity, context, tokens, seed, block_size;
    int set_gpus, set_ranks, set_tp, set_pp, set_capacity, set_context, set_tokens;
    unsigned char given[32];  // given[F_x - F_FIRST]: the flag was on the command line
} Flags;

// ---- memory: the peak per device against the hardware's mem_bytes (docs/simulator.md, "Memory") ----

// The device memory the check compares with, 0 when it is not known: a cost file (--cost) describes
// a measured machine, and without --hardware the preset's profile only stands in for its links,
// element size and peak FLOP/s, not for that machine's memory.
static double known_mem_bytes(const Flags *fl, const HardwareProfile *hw) {
    return fl->cost && !fl->hardware ? 0.0 : hw->mem_bytes;
}

// The memory peak of one simulated step (sim_memory's largest resource).
static int step_memory(SimMemPeak *out, const SimResult *r, const Plan *p, const SimConfig *cfg) {
    SimMemory mem;
    if (sim_memory(&mem, r, p, cfg) != 0) return -1;
    *out = mem.peak;
    sim_memory_free(&mem);
    return 0;
}

// A step that does not fit: a warning on stderr naming the peak, where it is, mem_bytes and what to
// change; with --strict the same message as an error, and -1 (the caller exits 1). `what` names the
// run ("policy balance", "plan.json"); `where` (may be "") adds to the location ("seed 3").
static int memory_verdict(const Flags *fl, const char *what, const char *where, const SimMemPeak *m,
                          double mem_bytes, const char *hw_name) {
    if (!sim_memory_exceeds(m, mem_bytes)) return 0;
    char peak[24], stat[24], act[24], mem[24];
    sim_bytes_text(peak, sizeof peak, m->peak_bytes);
    sim_bytes_text(stat, sizeof stat, m->static_bytes);
    sim_bytes_text(act, sizeof act, m->act_bytes);
    sim_bytes_text(mem, sizeof mem, mem_bytes);
    // what helps depends on which part is too large: activations shrink with the capacity and
    // offloading, the parameters, gradients and optimizer state only with more devices per copy; a
    // plan file fixes the capacity, the offload ratios and pp, so those need a new plan
    const char *advice;
    if (m->static_bytes > mem_bytes)
        advice = fl->plan ? "the parameters, gradients and optimizer state alone exceed it: raise --tp, or make the "
                            "plan again with more --pp (bytescale plan)"
                          : "the parameters, gradients and optimizer state alone exceed it: split the model over "
                            "more devices (--tp, --pp)";
    else
        advice = fl->plan ? "make the plan again (bytescale plan) with a smaller --capacity, with offloading or with "
                            "more --pp, or raise --tp"
                          : "plan with a smaller capacity (--capacity) or with offloading (naive, balance, elastic), "
                            "or split the model over more devices (--tp, --pp)";
    fprintf(stderr,
            "bytescale simulate: %s: %s: the peak memory per device, %s at rank %d, stage %d%s%s (static %s + "
            "activations %s), exceeds mem_bytes %s of %s; %s\n",
            fl->strict ? "error" : "warning", what, peak, m->rank, m->stage, where[0] ? ", " : "", where, stat, act,
            mem, hw_name, advice);
    return fl->strict ? -1 : 0;
}

// Simulate a plan file on the cluster the flags describe.
static int simulate_plan_file(const Flags *fl, const Scenario *sc) {
    Plan p;
    if (plan_read_json(&p, fl->plan) != 0) return fail();
    int tp = sc->tp, pp = p.pp;
    if (fl->set_pp && fl->pp != p.pp) {
        plan_free(&p);
        return bad_usage("--pp does not match the plan's pipeline stages (%s)", fl->plan);
    }
    // ranks x tp x pp (--ranks, else the plan's), formed in 64 bits: a file may hold any n_ranks and pp
    int64_t ranks = fl->set_ranks ? fl->ranks : p.n_ranks;
    int64_t gpus64 = fl->set_gpus ? fl->gpus : ranks * tp * pp;
    if (gpus64 > CLUSTER_MAX_GPUS) {
        bs_fail("%s: %lld HDP ranks x tp %d x pp %d = %lld GPUs, more than the %d the simulator models",
                fl->set_ranks ? "--ranks" : fl->plan, (long long)ranks, tp, pp, (long long)gpus64, CLUSTER_MAX_GPUS);
        plan_free(&p);
        return fail();
    }
    int gpus = (int)gpus64;
    SimSetup s;
    memset(&s, 0, sizeof s);
    s.sc = *sc;
    snprintf(s.sc.name, sizeof s.sc.name, "plan file");
    const ModelConfig *m = model_find(sc->model);
    int rc = -1, fits = 0;
    if (!m) goto done;
    s.model = *m;
    if (hw_resolve(sc->hardware, &s.hw) != 0) goto done;
    if (cluster_init(&s.cluster, &s.hw, gpus, tp, pp) != 0) goto done;
    if (fl->cost ? cost_load(&s.cm, fl->cost) != 0
                 : cost_derive(&s.cm, &s.model, &s.hw, tp, pp, s.cluster.n_ranks, p.capacity) != 0)
        goto done;
    // a profile of one process running the whole model (`bytescale profile`), as `train --tp --pp` plans
    if (fl->cost && s.cm.n_layers == s.model.n_layers) cost_shard(&s.cm, &s.model, tp, pp);
    if (fl->cost && s.cm.derived_3d && (tp > 1 || pp > 1))
        fprintf(stderr, "bytescale simulate: note: --cost %s has no %s (a profile from before they were measured): "
                "taken from ring_bw_intra %g bytes/s and ring_lat_intra %g s\n",
                fl->cost, cost_derived_3d_fields(&s.cm), s.cm.ring_bw_intra, s.cm.ring_lat_intra);
    if (plan_finalize(&p, &s.cm) != 0 || plan_validate(&p, &s.cm) != 0) {
        bs_fail_ctx("%s", fl->plan);
        goto done;
    }
    SimOutcome o;
    memset(&o, 0, sizeof o);
    snprintf(o.variant.label, sizeof o.variant.label, "%s", p.policy[0] ? p.policy : "plan");
    snprintf(o.variant.policy, sizeof o.variant.policy, "%s", o.variant.label);
    o.planner_makespan = p.makespan;
    o.lower_bound = p.lower_bound;
    o.hdp_bound = p.hdp_bound;
    o.n_items = p.n_items;
    SimConfig cfg = sim_setup_config(&s);
    if (sim_run(&o.res, &p, &cfg) != 0) goto done;
    if (fl->trace && sim_trace_write(&o.res, &p, fl->trace, fl->trace_ranks) != 0) {
        sim_outcome_free(&o);
        goto done;
    }
    SimMemPeak mem;
    double mem_bytes = known_mem_bytes(fl, &s.hw);
    if (step_memory(&mem, &o.res, &p, &cfg) != 0) {
        sim_outcome_free(&o);
        goto done;
    }
    if (fl->json) {
        cJSON *j = sim_outcome_json(&o);
        if (j) cJSON_AddItemToObject(j, "memory", sim_memory_json(&mem, mem_bytes));
        char *text = j ? cJSON_Print(j) : NULL;
        int printed = text != NULL;
        if (printed) printf("%s\n", text);
        free(text);
        cJSON_Delete(j);
        if (!printed) {
            bs_fail("out of memory printing JSON");
            sim_outcome_free(&o);
            goto done;
        }
    } else {
        printf("%s: %d items on %d HDP ranks (%d GPUs, tp %d, pp %d, %s, %s)\n", fl->plan, p.n_items, p.n_ranks, gpus,
               tp, pp, s.model.name, s.hw.name);
        sim_result_print(stdout, &o.res);
        char line[320];
        printf("memory           peak per device %s\n", sim_memory_text(line, sizeof line, &mem, mem_bytes));
        printf("planner: makespan %.4f s, lower bound %.4f s, HDP-aware bound %.4f s\n", p.makespan, p.lower_bound,
               p.hdp_bound);
        if (fl->trace) printf("trace: %s\n", fl->trace);
    }
    fflush(stdout);  // the report before a warning or error about it
    sim_outcome_free(&o);
    rc = 0;
    fits = memory_verdict(fl, fl->plan, "", &mem, mem_bytes, s.hw.name);
done:
    plan_free(&p);
    if (rc != 0) return fail();
    return fits == 0 ? 0 : 1;  // the verdict said why
}

// --trace FILE for one policy's step: FILE, or FILE-<policy>.json when several policies run.
static int write_trace(const Flags *fl, const char *label, int several, const SimResult *r, const Plan *p) {
    char path[4200];
    trace_path(path, sizeof path, fl->trace, label, several);
    if (sim_trace_write(r, p, path, fl->trace_ranks) != 0) return -1;
    if (!fl->json) fprintf(stderr, "trace of %s: %s\n", label, path);
    return 0;
}

// Under a table of policies: each one's memory peak (seed: the seed it came from, or NULL).
static void print_memory_lines(const char *over, const SimVariant *v, const SimMemPeak *m, const uint64_t *seed,
                               int n, double mem_bytes) {
    printf("memory: peak per device, the largest over HDP ranks x stages%s\n", over);
    for (int j = 0; j < n; j++) {
        char line[320];
        printf("  %-12s %s", v[j].label, sim_memory_text(line, sizeof line, &m[j], mem_bytes));
        if (seed) printf(" (seed %llu)", (unsigned long long)seed[j]);
        printf("\n");
    }
}

// Every policy's verdict (each one that does not fit is named); -1 under --strict when any did not.
static int memory_verdicts(const Flags *fl, const SimVariant *v, const SimMemPeak *m, const uint64_t *seed, int n,
                           double mem_bytes, const char *hw_name) {
    fflush(stdout);  // the report before a warning or error about it
    int rc = 0;
    for (int j = 0; j < n; j++) {
        char what[64], where[48] = "";
        snprintf(what, sizeof what, "policy %s", v[j].label);
        if (seed) snprintf(where, sizeof where, "seed %llu", (unsigned long long)seed[j]);
        if (memory_verdict(fl, what, where, &m[j], mem_bytes, hw_name) != 0) rc = -1;
    }
    return rc;
}

// A --cost file for a planned scenario: the file's coefficients, and the 3D terms a file cannot hold
// (the TP group's and the stage message's bytes per token) from the scenario's model, hardware and
// layout, as cost_derive sets them.
static int load_cost(CostModel *cm, const char *path, const Scenario *sc) {
    if (cost_load(cm, path) != 0) return -1;
    const ModelConfig *m = model_find(sc->model);
    HardwareProfile hw;
    if (!m || hw_resolve(sc->hardware, &hw) != 0) return -1;
    cost_layout_3d(cm, m, sc->tp, sc->pp, hw.elem_bytes, 1);
    return 0;
}

// One seed as a table: the report's single-run table (sim_table_print), so that --seeds 1 shows just
// what one run shows, whatever columns that table grows.
static int simulate_one_seed(const Flags *fl, const Scenario *sc, const SimVariant *v, int n_v) {
    SimSetup s;
    if (sim_setup_init(&s, sc, (uint64_t)fl->seed) != 0 || (fl->cost && load_cost(&s.cm, fl->cost, sc) != 0)) {
        sim_setup_free(&s);
        return fail();
    }
    SimOutcome o[MAX_VARIANTS];
    SimMemPeak mem[MAX_VARIANTS];
    SimConfig cfg = sim_setup_config(&s);
    int n_done = 0, rc = 0;
    for (int j = 0; j < n_v && rc == 0; j++) {
        Plan p;
        if (sim_setup_run(&s, &v[j], &o[j], &p) != 0) {
            rc = -1;
            break;
        }
        n_done++;
        if (fl->trace && write_trace(fl, v[j].label, n_v > 1, &o[j].res, &p) != 0) rc = -1;
        if (rc == 0 && step_memory(&mem[j], &o[j].res, &p, &cfg) != 0) rc = -1;
        plan_free(&p);
    }
    double mem_bytes = known_mem_bytes(fl, &s.hw);
    if (rc == 0) {
        sim_setup_describe(stdout, &s);
        sim_table_print(stdout, o, n_done);
        print_memory_lines("", v, mem, NULL, n_done, mem_bytes);
    }
    int fits = rc == 0 ? memory_verdicts(fl, v, mem, NULL, n_done, mem_bytes, s.hw.name) : 0;
    for (int j = 0; j < n_done; j++) sim_outcome_free(&o[j]);
    sim_setup_free(&s);
    if (rc != 0) return fail();
    return fits == 0 ? 0 : 1;  // the verdict said why
}

// What the seeds runner hands back per run: the first seed's traces and, for --json, every run's
// numbers (the runner frees the outcome right after).
typedef struct {
    const Flags *fl;
    int n_v;
    cJSON *setup;                   // the first seed's set-up
    cJSON *per_seed[MAX_VARIANTS];  // per policy, one object per seed
    double mem_bytes;               // the device's memory, 0 when not known (known_mem_bytes)
    char hw_name[32];
    SimMemPeak mem[MAX_VARIANTS];   // per policy, the largest memory peak over the seeds
    uint64_t mem_seed[MAX_VARIANTS];  // and the seed it came from
    int has_mem[MAX_VARIANTS];
} SeedsOut;

static int on_run(void *ctx, const SimSetup *s, int j, const SimOutcome *o, const Plan *p) {
    SeedsOut *so = ctx;
    const Flags *fl = so->fl;
    int first = s->seed == (uint64_t)fl->seed;
    if (first && fl->trace && write_trace(fl, o->variant.label, so->n_v > 1, &o->res, p) != 0) return -1;
    // the memory peak of this step; the policy's worst over the seeds is what the report shows
    SimConfig cfg = sim_setup_config(s);
    SimMemPeak mem;
    double mem_bytes = known_mem_bytes(fl, &s->hw);
    if (step_memory(&mem, &o->res, p, &cfg) != 0) return -1;
    if (first) {
        so->mem_bytes = mem_bytes;
        snprintf(so->hw_name, sizeof so->hw_name, "%s", s->hw.name);
    }
    if (!so->has_mem[j] || mem.peak_bytes > so->mem[j].peak_bytes)
        so->mem[j] = mem, so->mem_seed[j] = s->seed, so->has_mem[j] = 1;
    if (!fl->json) return 0;
    if (first && !so->setup && !(so->setup = sim_setup_json(s))) return -1;
    if (!so->per_seed[j] && !(so->per_seed[j] = cJSON_CreateArray())) return bs_fail("out of memory building JSON");
    cJSON *r = sim_outcome_json(o);
    if (!r) return -1;
    cJSON_AddNumberToObject(r, "seed", (double)s->seed);
    cJSON_AddNumberToObject(r, "sequences", (double)s->batch.n);
    // the run's queue (wlb): sequences carried in from earlier steps (first in the batch) and delayed
    cJSON_AddNumberToObject(r, "carried", (double)s->carried);
    cJSON_AddNumberToObject(r, "delayed", (double)p->n_delayed);
    cJSON_AddItemToObject(r, "memory", sim_memory_json(&mem, mem_bytes));
    cJSON_AddItemToArray(so->per_seed[j], r);
    return 0;
}

// {"setup": the first seed's, "seeds": [...], "results": [{policy, mean, min, max, per_seed: [...]}]}
static int print_seeds_json(SeedsOut *so, const SimSeedsResult *r) {
    cJSON *root = cJSON_CreateObject();
    if (!root) return bs_fail("out of memory building JSON");
    cJSON_AddItemToObject(root, "setup", so->setup);
    so->setup = NULL;
    cJSON *seeds = cJSON_AddArrayToObject(root, "seeds"), *results = cJSON_AddArrayToObject(root, "results");
    for (int k = 0; k < r->n_seeds; k++)
        cJSON_AddItemToArray(seeds, cJSON_CreateNumber((double)(r->seed + (uint64_t)k)));
    for (int j = 0; j < r->n_v; j++) {
        cJSON *o = sim_seed_stats_json(&r->v[j]);
        if (!o) {
            cJSON_Delete(root);
            return -1;
        }
        // each seed's speedup over static on that seed: the values the mean is taken over
        int k = 0;
        for (cJSON *run = so->per_seed[j] ? so->per_seed[j]->child : NULL; run; run = run->next, k++) {
            double x = r->v[j].values[(size_t)k * SIM_N_METRICS + SIM_M_SPEEDUP];
            if (!isnan(x)) cJSON_AddNumberToObject(run, "speedup_vs_static", x);
        }
        // the largest memory peak over the seeds, and the seed it came from
        cJSON *mem = sim_memory_json(&so->mem[j], so->mem_bytes);
        if (mem) cJSON_AddNumberToObject(mem, "seed", (double)so->mem_seed[j]);
        cJSON_AddItemToObject(o, "memory", mem);
        cJSON_AddItemToObject(o, "per_seed", so->per_seed[j]);
        so->per_seed[j] = NULL;
        cJSON_AddItemToArray(results, o);
    }
    char *text = cJSON_Print(root);
    cJSON_Delete(root);
    if (!text) return bs_fail("out of memory printing JSON");
    printf("%s\n", text);
    free(text);
    return 0;
}

// Every policy on every seed: the mean with min-max, as a table or JSON.
static int simulate_seeds(const Flags *fl, const Scenario *sc, const SimVariant *v, int n_v) {
    CostModel cm;  // the same coefficients for every seed: the batch does not change them
    if (fl->cost && load_cost(&cm, fl->cost, sc) != 0) return fail();
    SeedsOut so;
    memset(&so, 0, sizeof so);
    so.fl = fl;
    so.n_v = n_v;
    SimSeedsConfig cfg = {(uint64_t)fl->seed, fl->seeds, fl->cost ? &cm : NULL, NULL, NULL, on_run, &so};
    SimSeedsResult r;
    int rc = sim_seeds_run(&r, sc, v, n_v, &cfg);
    for (int j = 0; rc == 0 && j < n_v; j++)
        if (!r.v[j].ok) rc = bs_fail("%s", r.v[j].why);  // a single run compares all it was asked for
    // every policy ran on every seed (else rc != 0), so each has its memory peak
    if (rc == 0 && fl->json) rc = print_seeds_json(&so, &r);
    else if (rc == 0) {
        sim_seeds_describe(stdout, &r);
        sim_seeds_table_print(stdout, &r);
        print_memory_lines(fl->seeds > 1 ? " and the seeds" : "", v, so.mem, fl->seeds > 1 ? so.mem_seed : NULL,
                           n_v, so.mem_bytes);
    }
    int fits = rc == 0 ? memory_verdicts(fl, v, so.mem, fl->seeds > 1 ? so.mem_seed : NULL, n_v, so.mem_bytes,
                                         so.hw_name)
                       : 0;
    sim_seeds_free(&r);
    cJSON_Delete(so.setup);
    for (int j = 0; j < n_v; j++) cJSON_Delete(so.per_seed[j]);
    if (rc != 0) return fail();
    return fits == 0 ? 0 : 1;  // the verdict said why
}

static int simulate_scenario(const Flags *fl, const Scenario *sc, const SimVariant *v, int n_v) {
    if (fl->seeds == 1 && !fl->json) return simulate_one_seed(fl, sc, v, n_v);
    return simulate_seeds(fl, sc, v, n_v);
}

// argv into fl, from the defaults. 0 (fl->help: --help was given, nothing after it read), or the
// usage error's exit status.
static int read_flags(Flags *fl, int argc, char **argv) {
    memset(fl, 0, sizeof *fl);
    fl->policy = "own";
    fl->seed = 1;
    fl->seeds = SIM_SEEDS_DEFAULT;
    fl->trace_ranks = 64;
    fl->part = fl->parts = 1;
    opterr = 0;
    optind = 1;
    for (;;) {
        int c = getopt_long(argc, argv, ":h", opts, NULL);
        if (c == -1) break;
        const char *a = optarg;
        int bad = 0;
        if (c >= F_FIRST && c - F_FIRST < (int)sizeof fl->given) fl->given[c - F_FIRST] = 1;
        switch (c) {
        case 'h':
        case F_HELP: fl->help = 1; return 0;
        case F_SCENARIO: fl->scenario = a; break;
        case F_MODEL: fl->model = a; break;
        case F_HW: fl->hardware = a; break;
        case F_GPUS: bad = int_flag("--gpus", a, &fl->gpus, CLUSTER_MAX_GPUS), fl->set_gpus = 1; break;
        case F_RANKS: bad = int_flag("--ranks", a, &fl->ranks, CLUSTER_MAX_GPUS), fl->set_ranks = 1; break;
        case F_TP: bad = int_flag("--tp", a, &fl->tp, CLUSTER_MAX_DEGREE), fl->set_tp = 1; break;
        case F_PP: bad = int_flag("--pp", a, &fl->pp, CLUSTER_MAX_DEGREE), fl->set_pp = 1; break;
        case F_CAP: bad = int64_flag("--capacity", a, &fl->capacity, 1, MAX_CAPACITY), fl->set_capacity = 1; break;
        case F_BLOCK: bad = int64_flag("--block-size", a, &fl->block_size, 1, MAX_TOKENS); break;
        case F_CTX: bad = int64_flag("--context", a, &fl->context, 1, MAX_TOKENS), fl->set_context = 1; break;
        case F_DIST: fl->dist = a; break;
        case F_TOKENS: bad = int64_flag("--tokens", a, &fl->tokens, 1, MAX_TOKENS), fl->set_tokens = 1; break;
        case F_SEED: bad = int64_flag("--seed", a, &fl->seed, 0, INT64_MAX); break;
        case F_SEEDS: bad = int_flag("--seeds", a, &fl->seeds, SIM_SEEDS_MAX); break;
        case F_POLICY: fl->policy = a; break;
        case F_PLAN: fl->plan = a; break;
        case F_COST: fl->cost = a; break;
        case F_TRACE: fl->trace = a; break;
        case F_TRACE_RANKS: bad = int_flag("--trace-ranks", a, &fl->trace_ranks, MAX_TRACE_RANKS); break;
        case F_SWEEP: fl->sweep = a; break;
        case F_GRID: fl->grid = 1; break;
        case F_OUT: fl->out = a; break;
        case F_NOPLOT: fl->no_plot = 1; break;
        case F_JSON: fl->json = 1; break;
        case F_STRICT: fl->strict = 1; break;
        case F_CELLS: bad = cells_flag(a, &fl->part, &fl->parts); break;
        case ':': return bad_usage("%s needs a value", argv[optind - 1]);
        default:
            if (cli_retired_flag(argv[optind - 1])) return bad_usage("%s", cli_retired_flag(argv[optind - 1]));
            return bad_usage("unknown flag '%s'", argv[optind - 1]);
        }
        if (bad) return bad_usage("%s", bs_errmsg());
    }
    if (optind < argc) return bad_usage("unexpected argument '%s'", argv[optind]);
    if (fl->set_ranks && fl->set_gpus)
        return bad_usage("give --ranks (HDP ranks) or --gpus (devices = ranks x tp x pp), not both%s", "");
    return 0;
}

static int listing(const Flags *fl) { return fl->scenario && !strcmp(fl->scenario, "list"); }

// A flag the chosen mode would not use is an error, never silently dropped: each entry is a mode,
// the flags it ignores and why. 0, or the usage error's exit status.
static int refuse_ignored_flags(const Flags *fl) {
    int list = listing(fl);
    const struct {
        int on;
        const char *mode, *why;
        int flags[16];  // F_ codes, 0-terminated
    } ignored[] = {
        {list, "--scenario list", "it only lists the presets",
         {F_MODEL, F_HW, F_GPUS, F_RANKS, F_TP, F_PP, F_CAP, F_CTX, F_DIST, F_TOKENS, F_SEED, F_POLICY, F_PLAN,
          F_COST, F_TRACE, 0}},
        {list, "--scenario list", "it only lists the presets",
         {F_TRACE_RANKS, F_SWEEP, F_GRID, F_OUT, F_NOPLOT, F_JSON, F_SEEDS, F_STRICT, F_BLOCK, 0}},
        {fl->plan != NULL, "--plan", "the plan file fixes the batch, the capacity and the schedule",
         {F_CAP, F_CTX, F_DIST, F_TOKENS, F_SEED, F_SEEDS, F_POLICY, F_OUT, F_NOPLOT, F_BLOCK, 0}},
        {fl->grid, "--grid",
         "the grid runs the paper's presets (only --hardware, --policy, --seed and --seeds change it)",
         {F_SCENARIO, F_MODEL, F_GPUS, F_RANKS, F_TP, F_PP, F_CAP, F_CTX, F_DIST, F_TOKENS, F_TRACE_RANKS, F_BLOCK, 0}},
        {fl->grid, "--grid", "the memory check is for single runs", {F_STRICT, 0}},
        {fl->sweep && !strcmp(fl->sweep, "contexts"), "--sweep contexts", "the sweep sets the context of each point",
         {F_CTX, F_TRACE_RANKS, 0}},
        {fl->sweep && !strcmp(fl->sweep, "gpus"), "--sweep gpus", "a sweep writes no trace", {F_TRACE_RANKS, 0}},
        {fl->sweep != NULL, "--sweep", "the memory check is for single runs", {F_STRICT, 0}},
        {!fl->grid && !fl->sweep, "a single run", "only sweeps and the grid write files there", {F_OUT, F_NOPLOT, 0}},
        {!fl->grid, "a run without --grid", "only the grid has cells", {F_CELLS, 0}},
        {!fl->trace, "a run without --trace", "it only applies to a trace", {F_TRACE_RANKS, 0}},
    };
    for (size_t i = 0; i < sizeof ignored / sizeof ignored[0]; i++) {
        if (!ignored[i].on) continue;
        for (const int *f = ignored[i].flags; *f; f++) {
            if (!fl->given[*f - F_FIRST]) continue;
            const char *name = "?";
            for (const struct option *o = opts; o->name; o++)
                if (o->val == *f) name = o->name;
            return cli_usage_error("simulate", "--%s has no effect with %s (%s); leave it out", name, ignored[i].mode,
                                   ignored[i].why);
        }
    }
    return 0;
}

// One mode at a time (a single run, --sweep, --grid or --plan), and the outputs each has. 0, or
// the usage error's exit status.
static int check_mode(const Flags *fl) {
    if (fl->sweep && strcmp(fl->sweep, "contexts") != 0 && strcmp(fl->sweep, "gpus") != 0)
        return bad_usage("--sweep: '%s' is not contexts or gpus", fl->sweep);
    if ((fl->grid != 0) + (fl->sweep != NULL) + (fl->plan != NULL) > 1)  // name the two (or three) given
        return cli_usage_error("simulate", "%s%s%s%s%s exclude each other: give one", fl->grid ? "--grid" : "",
                               fl->grid && fl->sweep ? ", " : "", fl->sweep ? "--sweep" : "",
                               (fl->grid || fl->sweep) && fl->plan ? " and " : "", fl->plan ? "--plan" : "");
    if (fl->json && (fl->grid || fl->sweep))
        return bad_usage("--json is for single runs (sweeps and the grid write CSV)%s", "");
    if (fl->trace && (fl->grid || fl->sweep)) return bad_usage("--trace is for single runs%s", "");
    if (fl->cost && (fl->grid || fl->sweep))
        return bad_usage("--cost is for single runs (sweeps and the grid derive the cost model per point)%s", "");
    return 0;
}

// The whole paper grid (or --cells' part of it), with the exact command for the top of paper-grid.md.
static int run_grid(const Flags *fl, const SimVariant *v, int n_v, int argc, char **argv) {
    char cmd[2048] = "./build/bytescale simulate";
    for (int i = 1; i < argc; i++) {
        size_t used = strlen(cmd);
        snprintf(cmd + used, sizeof cmd - used, " %s", argv[i]);
    }
    const char *out = fl->out ? fl->out : "docs/results";
    if (sim_grid_run(v, n_v, (uint64_t)fl->seed, fl->seeds, fl->hardware, fl->part, fl->parts, out, cmd, !fl->no_plot,
                     stdout) != 0)
        return fail();
    return 0;
}

// The base scenario (--scenario, else the case study), then every flag given on top of it; a
// changed preset is named "<preset>-custom" ("custom" without --scenario). 0, or the usage error's
// exit status.
static int build_scenario(Scenario *sc, const Flags *fl) {
    if (scenario_find(fl->scenario ? fl->scenario : "7b-1024-byted-2m", sc) != 0) return bad_usage("%s", bs_errmsg());
    int changed = 0;
    // a value too long for its field would be cut silently into another name or path
    if (set_text(sc->model, sizeof sc->model, "--model", fl->model, &changed) != 0 ||
        set_text(sc->hardware, sizeof sc->hardware, "--hardware", fl->hardware, &changed) != 0 ||
        set_text(sc->dataset, sizeof sc->dataset, "--dist", fl->dist, &changed) != 0)
        return bad_usage("%s", bs_errmsg());
    if (fl->model && !model_find(fl->model)) return cli_usage_error("simulate", "--model: %s", bs_errmsg());
    if (fl->set_gpus) sc->gpus = fl->gpus, changed = 1;
    if (fl->set_tp) sc->tp = fl->tp, changed = 1;
    if (fl->set_pp) sc->pp = fl->pp, changed = 1;
    // --ranks counts whole TP x PP groups: gpus = ranks x tp x pp with the final tp and pp (flags or the
    // preset's), in 64 bits (2^22 x 2^10 x 2^10 fits). A plan file has its own pp: simulate_plan_file.
    if (fl->set_ranks && !fl->plan) {
        int64_t gpus = (int64_t)fl->ranks * sc->tp * sc->pp;
        if (gpus > CLUSTER_MAX_GPUS) {
            bs_fail("--ranks %d x tp %d x pp %d = %lld GPUs, more than the %d the simulator models", fl->ranks, sc->tp,
                    sc->pp, (long long)gpus, CLUSTER_MAX_GPUS);
            return bad_usage("%s", bs_errmsg());
        }
        sc->gpus = (int)gpus, changed = 1;
    }
    if (fl->set_capacity) sc->capacity = fl->capacity, changed = 1;
    if (fl->set_context) sc->context = fl->context, changed = 1;
    if (fl->block_size) sc->block_size = fl->block_size, changed = 1;
    if (fl->set_tokens) sc->tokens = fl->tokens, changed = 1;
    if (changed && fl->scenario) {
        char name[48];
        snprintf(name, sizeof name, "%s", sc->name);
        snprintf(sc->name, sizeof sc->name, "%.40s-custom", name);  // a preset with changes
    } else if (changed) {
        snprintf(sc->name, sizeof sc->name, "custom");
    }
    if (!fl->plan && !fl->sweep && sc->tp > 0 && sc->pp > 0 && sc->gpus % (sc->tp * sc->pp) != 0) {
        char lay[64], gpus[96];
        if (fl->set_gpus || fl->set_ranks) snprintf(gpus, sizeof gpus, "--gpus %d", sc->gpus);
        else snprintf(gpus, sizeof gpus, "scenario %s's %d GPUs", fl->scenario ? fl->scenario : sc->name, sc->gpus);
        return cli_usage_error("simulate", "%s is not a multiple of %s", gpus,
                               cli_layout_flags(lay, sizeof lay, sc->tp, sc->pp));
    }
    return 0;
}

static int run_sweep(const Flags *fl, const Scenario *sc, const SimVariant *v, int n_v) {
    SimSweep kind = !strcmp(fl->sweep, "contexts") ? SIM_SWEEP_CONTEXTS : SIM_SWEEP_GPUS;
    const char *out = fl->out ? fl->out : "sim-out";
    if (sim_sweep_run(sc, kind, v, n_v, (uint64_t)fl->seed, fl->seeds, out, !fl->no_plot, stdout) != 0) return fail();
    return 0;
}

int cmd_simulate(int argc, char **argv) {
    Flags fl;
    int rc = read_flags(&fl, argc, argv);
    if (rc != 0) return rc;
    if (fl.help) {
        usage(stdout);
        return 0;
    }
    if ((rc = refuse_ignored_flags(&fl)) != 0) return rc;
    if (listing(&fl)) {
        list_scenarios();
        return 0;
    }
    if ((rc = check_mode(&fl)) != 0) return rc;
    SimVariant v[MAX_VARIANTS];
    int n_v;
    if (parse_policies(fl.policy, v, &n_v) != 0) return bad_usage("%s", bs_errmsg());
    if (fl.grid) return run_grid(&fl, v, n_v, argc, argv);
    Scenario sc;
    if ((rc = build_scenario(&sc, &fl)) != 0) return rc;
    if (fl.plan) return simulate_plan_file(&fl, &sc);
    if (fl.sweep) return run_sweep(&fl, &sc, v, n_v);
    return simulate_scenario(&fl, &sc, v, n_v);
}
