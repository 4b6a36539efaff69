// plan.c: `bytescale plan`: plan one global batch with an HDP policy and say how good the plan is.
#include <getopt.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cJSON.h>

#include "bytescale/batch.h"
#include "bytescale/cost.h"
#include "bytescale/error.h"
#include "bytescale/hw.h"
#include "bytescale/model.h"
#include "bytescale/plan.h"
#include "bytescale/policy.h"
#include "bytescale/sim.h"
#include "bytescale/timer.h"
#include "cli/cli.h"

// Defaults: the paper's case study (docs/architecture.md, "The paper: evaluation setup"): LLaMA-7B,
// 1,024 GPUs, 2M context, the Byted dataset, 32M tokens; TP 2 gives 512 HDP ranks of C = 8K tokens
// each (the baseline's d_cp = 256).
enum { MAX_POLICIES = 16 };  // one comparison table: every policy of the table (policy.c) fits

typedef struct {
    int32_t ranks, tp, pp;
    int64_t gpus;  // --gpus, 0 when not given: the ranks are then --ranks
    int64_t capacity, context, tokens;
    uint64_t seed;
    int offload, json;
    int64_t block_size;
    const char *model, *hardware, *cost, *policy, *lengths, *dist, *out;
} PlanArgs;

static void usage(FILE *f) {
    char own[256], peers[256];  // from the table of policies (policy.c), the one list
    policy_names(own, sizeof own, POLICY_OWN);
    policy_names(peers, sizeof peers, POLICY_PEERS);
    fprintf(f,
            "usage: bytescale plan [flags]\n"
            "\n"
            "Plan one global batch with an HDP policy; print a summary (or --json), optionally write the plan.\n"
            "Sizes take K, M, G suffixes (binary: 8K = 8192).\n"
            "\n"
            "batch:\n"
            "  --dist SPEC          length distribution: github, byted, uniform:LO:HI, lognormal:MU:SIGMA,\n"
            "                       fixed:LEN (default byted)\n"
            "  --lengths FILE       lengths from a file instead: one per line, or a JSON array / {\"lengths\": [...]}\n"
            "  --tokens N           token budget of a generated batch (default 32M)\n"
            "  --context L          longest sequence; longer ones are cut into L-token pieces; the static\n"
            "                       mesh's CP degree is ceil(L / C) (default 2M)\n"
            "  --seed N             seed of a generated batch (default 1)\n"
            "cluster and cost model:\n"
            "  --ranks N            HDP ranks, each a TP x PP group of GPUs (default 512)\n"
            "  --gpus N             devices instead: ranks = N / (tp x pp)\n"
            "  --capacity C         tokens one rank holds in a micro-batch without offloading (default 8K)\n"
            "  --model NAME         llama-7b, llama-13b, llama-30b, llama-70b, mixtral-8x7b, ... (default llama-7b)\n"
            "  --hardware NAME|FILE\n"
            "                       a built-in profile (h100-sxm, h100-measured, h800-sxm, cpu) or a profile JSON file (a path\n"
            "                       with a '/' or ending in .json) (default h800-sxm)\n"
            "  --cost FILE          cost-model coefficients from a JSON file (docs/cost-model.md); overrides\n"
            "                       what --model / --hardware / --tp / --pp derive\n"
            "  --tp N               tensor-parallel degree inside a rank (default 2)\n"
            "  --pp N               pipeline stages per rank (default 1; > 1 plans with PP-Balance)\n"
            "policy:\n"
            "  --policy LIST        one policy, or several for a comparison table, comma-separated: bytescale's\n"
            "                       own (%s),\n"
            "                       the peers' schedulers (%s; docs/peers.md),\n"
            "                       or the words own, peers, all (default elastic: bytescale's best, README)\n"
            "  --block-size B       blocks, blocks-all: tokens per block (default MagiAttention's: a micro-batch's\n"
            "                       tokens / (8 x its group's ranks); a larger B is capped to that)\n"
            "  --offload            allow selective offloading (default)\n"
            "  --no-offload         never offload: a sequence of s > C tokens takes ceil(s / C) ranks\n"
            "output:\n"
            "  --out FILE           write the plan as JSON (docs/plan-format.md); needs a single policy\n"
            "  --json               print a machine-readable summary instead of the table\n"
            "  -h, --help           this text\n",
            own, peers);
}

enum { OPT_RANKS = 256, OPT_GPUS, OPT_CAPACITY, OPT_CONTEXT, OPT_MODEL, OPT_HARDWARE, OPT_COST, OPT_TP, OPT_PP,
       OPT_POLICY, OPT_LENGTHS, OPT_DIST, OPT_TOKENS, OPT_SEED, OPT_OFFLOAD, OPT_NO_OFFLOAD, OPT_OUT, OPT_BLOCK, OPT_JSON };

static const struct option OPTIONS[] = {
    {"ranks", required_argument, 0, OPT_RANKS},       {"gpus", required_argument, 0, OPT_GPUS},
    {"capacity", required_argument, 0, OPT_CAPACITY}, {"context", required_argument, 0, OPT_CONTEXT},
    {"model", required_argument, 0, OPT_MODEL},       {"hardware", required_argument, 0, OPT_HARDWARE},
    {"cost", required_argument, 0, OPT_COST},         {"tp", required_argument, 0, OPT_TP},
    {"pp", required_argument, 0, OPT_PP},             {"policy", required_argument, 0, OPT_POLICY},
    {"lengths", required_argument, 0, OPT_LENGTHS},   {"dist", required_argument, 0, OPT_DIST},
    {"tokens", required_argument, 0, OPT_TOKENS},     {"seed", required_argument, 0, OPT_SEED},
    {"offload", no_argument, 0, OPT_OFFLOAD},         {"no-offload", no_argument, 0, OPT_NO_OFFLOAD},
    {"out", required_argument, 0, OPT_OUT},           {"json", no_argument, 0, OPT_JSON},
    {"block-size", required_argument, 0, OPT_BLOCK}, {"help", no_argument, 0, 'h'},
    {0, 0, 0, 0},
};

// Bounds: HDP ranks as a plan file allows them (docs/plan-format.md), tp and pp as the simulator's.
#define MAX_RANKS (1 << 20)
#define MAX_DEGREE (1 << 10)
#define MAX_GPUS ((int64_t)MAX_RANKS * MAX_DEGREE * MAX_DEGREE)  // 2^40: ranks x tp x pp fits int64

// A positive integer flag within [1, max].
static int arg_positive(const char *flag, const char *text, int64_t max, int64_t *out) {
    if (arg_int64(flag, text, out) != 0) return -1;
    if (*out < 1 || *out > max) return bs_fail("%s: %s is out of range [1, %lld]", flag, text, (long long)max);
    return 0;
}

// 0: parsed; 1: --help printed; -1: error recorded.
static int parse_args(int argc, char **argv, PlanArgs *a) {
    *a = (PlanArgs){.ranks = 512, .tp = 2, .pp = 1, .capacity = 8 << 10, .context = 2 << 20, .tokens = 32 << 20,
                    .seed = 1, .offload = 1, .model = "llama-7b", .hardware = "h800-sxm", .policy = "elastic",
                    .dist = "byted"};
    unsigned char given[OPT_JSON - OPT_RANKS + 1] = {0};  // given[OPT_x - OPT_RANKS]: on the command line
    int64_t v = 0;
    optind = 0;  // rescan from the start (glibc), whatever ran before
    opterr = 0;  // we print our own messages
    for (;;) {
        int c = getopt_long(argc, argv, ":h", OPTIONS, NULL);
        if (c == -1) break;
        const char *flag = argv[optind - 1];
        if (c >= OPT_RANKS && c <= OPT_JSON) given[c - OPT_RANKS] = 1;
        switch (c) {
        case OPT_RANKS: if (arg_positive("--ranks", optarg, MAX_RANKS, &v)) return -1; a->ranks = (int32_t)v; break;
        case OPT_GPUS: if (arg_positive("--gpus", optarg, MAX_GPUS, &a->gpus)) return -1; break;
        case OPT_CAPACITY: if (arg_positive("--capacity", optarg, 1ll << 24, &a->capacity)) return -1; break;
        case OPT_BLOCK: if (arg_positive("--block-size", optarg, 1ll << 40, &a->block_size)) return -1; break;
        case OPT_CONTEXT: if (arg_positive("--context", optarg, 1ll << 40, &a->context)) return -1; break;
        case OPT_TOKENS: if (arg_positive("--tokens", optarg, 1ll << 40, &a->tokens)) return -1; break;
        case OPT_TP: if (arg_positive("--tp", optarg, MAX_DEGREE, &v)) return -1; a->tp = (int32_t)v; break;
        case OPT_PP: if (arg_positive("--pp", optarg, MAX_DEGREE, &v)) return -1; a->pp = (int32_t)v; break;
        case OPT_SEED:
            if (arg_int64("--seed", optarg, &v)) return -1;
            a->seed = (uint64_t)v;
            break;
        case OPT_MODEL: a->model = optarg; break;
        case OPT_HARDWARE: a->hardware = optarg; break;
        case OPT_COST: a->cost = optarg; break;
        case OPT_POLICY: a->policy = optarg; break;
        case OPT_LENGTHS: a->lengths = optarg; break;
        case OPT_DIST: a->dist = optarg; break;
        case OPT_OFFLOAD: a->offload = 1; break;
        case OPT_NO_OFFLOAD: a->offload = 0; break;
        case OPT_OUT: a->out = optarg; break;
        case OPT_JSON: a->json = 1; break;
        case 'h': usage(stdout); return 1;
        case ':': return bs_fail("%s needs a value", flag);
        default:
            if (cli_retired_flag(flag)) return bs_fail("%s", cli_retired_flag(flag));
            return bs_fail("unknown flag '%s'", flag);
        }
    }
    if (optind < argc) return bs_fail("unexpected argument '%s'", argv[optind]);
    // --gpus counts devices: the HDP ranks are whole TP x PP groups of them
    if (given[OPT_RANKS - OPT_RANKS] && given[OPT_GPUS - OPT_RANKS])
        return bs_fail("give --ranks (HDP ranks) or --gpus (devices = ranks x tp x pp), not both");
    if (a->gpus) {
        int64_t group = (int64_t)a->tp * a->pp;
        char lay[64];
        if (a->gpus % group != 0)
            return bs_fail("--gpus %lld is not a multiple of %s", (long long)a->gpus,
                           cli_layout_flags(lay, sizeof lay, a->tp, a->pp));
        if (a->gpus / group > MAX_RANKS)
            return bs_fail("--gpus %lld / (tp x pp = %lld) = %lld HDP ranks, more than %d", (long long)a->gpus,
                           (long long)group, (long long)(a->gpus / group), MAX_RANKS);
        a->ranks = (int32_t)(a->gpus / group);
    }
    // A flag the other flags make pointless is an error, never silently dropped.
    const struct {
        int on;
        const char *mode, *why;
        int flags[5];  // OPT_ codes, 0-terminated
    } ignored[] = {
        {a->lengths != NULL, "--lengths", "the lengths come from the file", {OPT_DIST, OPT_TOKENS, OPT_SEED, 0}},
        {a->cost != NULL, "--cost", "the file holds the cost model they would derive", {OPT_MODEL, OPT_HARDWARE, 0}},
        // with --gpus, --tp still counts the ranks
        {a->cost != NULL && !a->gpus, "--cost", "the file holds the cost model it would derive", {OPT_TP, 0}},
        {!strcmp(a->policy, "static"), "--policy static", "the static mesh never offloads", {OPT_OFFLOAD, 0}},
    };
    for (size_t i = 0; i < sizeof ignored / sizeof ignored[0]; i++) {
        if (!ignored[i].on) continue;
        for (const int *f = ignored[i].flags; *f; f++) {
            if (!given[*f - OPT_RANKS]) continue;
            const char *name = "?";
            for (const struct option *o = OPTIONS; o->name; o++)
                if (o->val == *f) name = o->name;
            return bs_fail("--%s has no effect with %s (%s); leave it out", name, ignored[i].mode, ignored[i].why);
        }
    }
    const char *names[MAX_POLICIES];
    int n;
    if (policy_expand(a->policy, names, MAX_POLICIES, &n) != 0) return bs_fail_ctx("--policy");
    if (!a->cost && !model_find(a->model)) return bs_fail_ctx("--model");  // a name, not a file: usage
    if (a->out && n > 1) return bs_fail("--out writes one plan: '%s' names %d policies, pick one", a->policy, n);
    return 0;
}

static int load_cost_model(const PlanArgs *a, CostModel *cm) {
    if (a->cost) return cost_load(cm, a->cost) != 0 ? bs_fail_ctx("--cost") : 0;
    const ModelConfig *m = model_find(a->model);
    if (!m) return bs_fail_ctx("--model");
    HardwareProfile hw;
    if (hw_resolve(a->hardware, &hw) != 0) return bs_fail_ctx("--hardware");
    return cost_derive(cm, m, &hw, a->tp, a->pp, a->ranks, a->capacity);
}

static int load_batch(const PlanArgs *a, GlobalBatch *b) {
    if (a->lengths) {
        if (batch_read_file(b, a->lengths) != 0) return bs_fail_ctx("--lengths");
        return batch_cut(b, a->context);
    }
    return batch_generate(b, a->dist, a->seed, a->tokens, a->context);
}

// ---- output -------------------------------------------------------------------------------------------

static void hist_label(char *buf, size_t n, int k) {
    if (k == 0) snprintf(buf, n, "1");
    else if (k == 1) snprintf(buf, n, "2");
    else if (k == PLAN_HIST_BINS - 1) snprintf(buf, n, ">%lld", 1ll << (k - 1));
    else snprintf(buf, n, "%lld-%lld", (1ll << (k - 1)) + 1, 1ll << k);
}

// makespan / bound; 1 for an empty batch (both 0)
static double ratio(double makespan, double bound) { return bound > 0 ? makespan / bound : 1.0; }

typedef struct {
    const char *policy;
    Plan plan;
    PlanStats st;
    double seconds;  // planning time
} Result;

// The items an offload ratio applies to (plan_stats' n_long: every item but a pack that keeps its
// activations), counted by kind, e.g. "3 rings, 2 all-to-all": a plan of a2a items has no rings
// (plan_stats' n_rings counts every item of several ranks).
static void long_item_kinds(const Plan *p, char *out, size_t size) {
    static const char *const names[] = {"rings", "all-to-all", "blocks", "hybrid", "single-rank offloaded"};
    int count[5] = {0};
    for (int32_t k = 0; k < p->n_items; k++) {
        const Item *it = &p->items[k];
        if (it->n_ranks == 1 && it->offload == 0) continue;  // a pack
        count[it->n_ranks == 1 ? 4 : (int)plan_item_kind(p, k)]++;
    }
    size_t used = 0;
    out[0] = '\0';
    for (int i = 0; i < 5; i++)
        if (count[i] > 0 && used < size)
            used += (size_t)snprintf(out + used, size - used, "%s%d %s", used ? ", " : "", count[i], names[i]);
}
static void print_summary(const PlanArgs *a, const GlobalBatch *b, const Result *r) {
    const Plan *p = &r->plan;
    const PlanStats *st = &r->st;
    printf("policy %s: %d ranks (pp %d), C = %lld tokens, offloading %s\n", r->policy, p->n_ranks, p->pp,
           (long long)p->capacity, a->offload ? "on" : "off");
    if (!strcmp(r->policy, "static") && b->n > 0) {
        int64_t d_cp = (a->context + a->capacity - 1) / a->capacity;
        printf("mesh: d_cp %lld x d_dp %lld; %lld leftover ranks idle\n", (long long)d_cp,
               (long long)(p->n_ranks / d_cp), (long long)(p->n_ranks % d_cp));
    }
    char kinds[160];
    long_item_kinds(p, kinds, sizeof kinds);
    printf("items: %d (%d packs%s%s)\n", p->n_items, st->n_packs, kinds[0] ? ", " : "", kinds);
    int top = 0, most = 1;
    for (int k = 0; k < PLAN_HIST_BINS; k++)
        if (st->ring_hist[k]) top = k, most = st->ring_hist[k] > most ? st->ring_hist[k] : most;
    printf("items by ring size (ranks):\n");
    for (int k = 0; k <= top && p->n_items > 0; k++) {
        char label[32], bar[48];
        hist_label(label, sizeof label, k);
        int w = (int)ceil(40.0 * st->ring_hist[k] / most);
        memset(bar, '#', (size_t)w);
        bar[w] = '\0';
        printf("  %11s  %-40s %d\n", label, bar, st->ring_hist[k]);
    }
    printf("busy time per rank: min %.4g s, median %.4g s, max %.4g s; %d ranks idle\n", st->busy_min,
           st->busy_median, st->busy_max, st->idle_ranks);
    // both bounds (docs/planner.md): the policy-independent one, and the one for plans that follow
    // HDP's rule (a sequence on at most ceil(s/C) ranks), which the 5% target is about
    printf("makespan %.4g s; lower bound %.4g s: makespan / bound = %.4f; HDP bound %.4g s: makespan / HDP bound = "
           "%.4f\n",
           p->makespan, p->lower_bound, ratio(p->makespan, p->lower_bound), p->hdp_bound,
           ratio(p->makespan, p->hdp_bound));
    if (p->makespan < p->hdp_bound) printf("(below the HDP bound: some rings are wider than ceil(s/C), past HDP's rule)\n");
    char bytes[32];
    sim_bytes_text(bytes, sizeof bytes, st->ring_bytes);
    printf("ring traffic: %s of K/V (forward + backward, per TP device)\n", bytes);
    if (st->n_long > 0) {
        printf("offload ratio over %d items (%s): min %.3f, mean %.3f, max %.3f (%d offload)\n", st->n_long, kinds,
               st->offload_min, st->offload_mean, st->offload_max, st->n_offload);
    }
    printf("planned in %.2f ms\n", r->seconds * 1e3);
}

static void print_table(const Result *rs, int n) {
    printf("%-12s %7s %6s %12s %12s %8s %12s %8s %28s %12s %8s %9s\n", "policy", "items", "rings", "makespan s",
           "bound s", "ratio", "HDP bound s", "ratio", "busy s min / median / max", "ring traffic", "offload",
           "plan ms");
    for (int i = 0; i < n; i++) {
        const Plan *p = &rs[i].plan;
        const PlanStats *st = &rs[i].st;
        char bytes[32], busy[64];
        sim_bytes_text(bytes, sizeof bytes, st->ring_bytes);
        snprintf(busy, sizeof busy, "%.4g / %.4g / %.4g", st->busy_min, st->busy_median, st->busy_max);
        printf("%-12s %7d %6d %12.4g %12.4g %8.4f %12.4g %8.4f %28s %12s %8d %9.2f\n", rs[i].policy, p->n_items,
               st->n_rings, p->makespan, p->lower_bound, ratio(p->makespan, p->lower_bound), p->hdp_bound,
               ratio(p->makespan, p->hdp_bound), busy, bytes, st->n_offload, rs[i].seconds * 1e3);
    }
}

static cJSON *result_json(const Result *r) {
    const Plan *p = &r->plan;
    const PlanStats *st = &r->st;
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "policy", r->policy);
    cJSON_AddNumberToObject(o, "items", p->n_items);
    cJSON_AddNumberToObject(o, "packs", st->n_packs);
    cJSON_AddNumberToObject(o, "rings", st->n_rings);
    cJSON *h = cJSON_AddArrayToObject(o, "ring_sizes");
    for (int k = 0; k < PLAN_HIST_BINS; k++) {
        if (!st->ring_hist[k]) continue;
        char label[32];
        hist_label(label, sizeof label, k);
        cJSON *e = cJSON_CreateObject();
        cJSON_AddStringToObject(e, "ranks", label);
        cJSON_AddNumberToObject(e, "items", st->ring_hist[k]);
        cJSON_AddItemToArray(h, e);
    }
    cJSON_AddNumberToObject(o, "busy_min", st->busy_min);
    cJSON_AddNumberToObject(o, "busy_median", st->busy_median);
    cJSON_AddNumberToObject(o, "busy_max", st->busy_max);
    cJSON_AddNumberToObject(o, "idle_ranks", st->idle_ranks);
    cJSON_AddNumberToObject(o, "makespan", p->makespan);
    cJSON_AddNumberToObject(o, "lower_bound", p->lower_bound);
    cJSON_AddNumberToObject(o, "ratio", ratio(p->makespan, p->lower_bound));
    cJSON_AddNumberToObject(o, "hdp_bound", p->hdp_bound);
    cJSON_AddNumberToObject(o, "ratio_hdp", ratio(p->makespan, p->hdp_bound));
    cJSON_AddNumberToObject(o, "ring_bytes", st->ring_bytes);
    cJSON_AddNumberToObject(o, "offload_items", st->n_offload);
    cJSON_AddNumberToObject(o, "offload_min", st->offload_min);
    cJSON_AddNumberToObject(o, "offload_mean", st->offload_mean);
    cJSON_AddNumberToObject(o, "offload_max", st->offload_max);
    cJSON_AddNumberToObject(o, "plan_seconds", r->seconds);
    return o;
}

static void print_json(const PlanArgs *a, const GlobalBatch *b, const Result *rs, int n) {
    cJSON *root = cJSON_CreateObject();
    cJSON *bo = cJSON_AddObjectToObject(root, "batch");
    cJSON_AddStringToObject(bo, "source", a->lengths ? a->lengths : a->dist);
    cJSON_AddNumberToObject(bo, "sequences", (double)b->n);
    cJSON_AddNumberToObject(bo, "tokens", (double)b->n_tokens);
    cJSON_AddNumberToObject(bo, "context", (double)a->context);
    cJSON_AddNumberToObject(root, "ranks", a->ranks);
    cJSON_AddNumberToObject(root, "pp", a->pp);
    cJSON_AddNumberToObject(root, "capacity", (double)a->capacity);
    cJSON_AddBoolToObject(root, "offload", a->offload);
    cJSON *plans = cJSON_AddArrayToObject(root, "plans");
    for (int i = 0; i < n; i++) cJSON_AddItemToArray(plans, result_json(&rs[i]));
    char *text = cJSON_Print(root);
    if (text) puts(text);
    free(text);
    cJSON_Delete(root);
}

int cmd_plan(int argc, char **argv) {
    PlanArgs a;
    int rc = parse_args(argc, argv, &a);
    if (rc == 1) return 0;
    if (rc != 0) {
        return cli_usage_error("plan", "%s", bs_errmsg());
    }
    CostModel cm;
    if (load_cost_model(&a, &cm) != 0) cli_die("plan", "%s", bs_errmsg());
    GlobalBatch b;
    if (load_batch(&a, &b) != 0) cli_die("plan", "%s", bs_errmsg());
    if (!a.json) {
        int64_t longest = 0;
        for (int64_t i = 0; i < b.n; i++) longest = b.seqs[i].len > longest ? b.seqs[i].len : longest;
        printf("batch: %s, %lld tokens in %lld sequences (longest %lld), context %lld\n",
               a.lengths ? a.lengths : a.dist, (long long)b.n_tokens, (long long)b.n, (long long)longest,
               (long long)a.context);
        if (a.cost) printf("cost model: %s\n", a.cost);
        else printf("cost model: %s on %s, tp %d, pp %d\n", a.model, a.hardware, a.tp, a.pp);
    }
    fflush(stdout);  // the batch line comes before any planning error
    PlanConfig cfg = {.n_ranks = a.ranks, .capacity = a.capacity, .context = a.context, .pp = a.pp,
                      .offload = a.offload, .block_size = a.block_size};
    const char *names[MAX_POLICIES];
    int n;
    if (policy_expand(a.policy, names, MAX_POLICIES, &n) != 0) cli_die("plan", "--policy: %s", bs_errmsg());
    int all = n > 1;  // a comparison table
    Result rs[MAX_POLICIES];
    for (int i = 0; i < n; i++) {
        rs[i].policy = names[i];
        double t0 = now_seconds();
        if (policy_plan(&rs[i].plan, rs[i].policy, &b, &cfg, &cm) != 0) cli_die("plan", "%s", bs_errmsg());
        rs[i].seconds = now_seconds() - t0;
        if (plan_stats(&rs[i].plan, &cm, &rs[i].st) != 0) cli_die("plan", "%s", bs_errmsg());
    }
    if (a.json) print_json(&a, &b, rs, n);
    else if (all) print_table(rs, n);
    else print_summary(&a, &b, &rs[0]);
    if (a.out) {
        if (plan_write_json(&rs[0].plan, a.out) != 0) cli_die("plan", "%s", bs_errmsg());
        if (!a.json) printf("plan written to %s\n", a.out);
    }
    for (int i = 0; i < n; i++) plan_free(&rs[i].plan);
    batch_free(&b);
    return 0;
}
