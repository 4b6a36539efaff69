// bench/plan.c: how fast the planners are and how good their plans are.
//
// Table 1: time and peak memory to plan a 32M-token global batch (2M context, C = 8K, LLaMA-7B on
// h800-sxm, TP 2, offloading on) for 512, 2,048 and 16,384 ranks, static, naive, balance and
// elastic, both datasets.
// Batch generation and planning are timed separately: median (min / max) of REPEATS runs, one core.
// Peak memory: each configuration runs once more in a fresh child process (fork), which resets its
// peak resident set (/proc/self/clear_refs, "5") after generating the batch and trimming the heap,
// then reads VmHWM after planning: the peak growth of resident memory while planning. Where the
// reset is not allowed it falls back to getrusage's ru_maxrss growth and says so.
//
// Table 2: at the paper's settings (512 ranks, C = 8K, 32M tokens) for github and byted at 256K,
// 512K, 1M and 2M context: each policy's estimated makespan / lower bound and its ring traffic, with
// offloading on and off. Target for balance: within 5% of the bound.
//
// Table 3, beyond Algorithm 2: balance and elastic at 512, 2,048, 16,384 and 131,072 ranks with 2K and
// 64K tokens per rank (the same settings otherwise): makespan over the bounds and planning time
// (median of several runs, and elastic's over balance's). Where a ring sets balance's step, elastic
// widens it; target for elastic: within 5% of the bound wherever the batch has enough work for
// every rank. `bench_plan scale` runs this table alone; `bench_plan scale 16384` only its rows of that
// many ranks (the planning-time targets: 32M tokens and 1G tokens on 16,384 ranks).
//
// Table 4: plan files of 1M and 10M sequences (uniform lengths 1-600, balance plans on 16,384 ranks):
// write and read time and the peak growth of resident memory while writing and while reading (each
// in a fresh child, as above), beside the plan's own size in memory and what parsing the same file
// into a cJSON tree takes (the reader before streaming; at 1M only, 10M would need some 10 GB).
// `bench_plan files` runs this table alone.
//
// Table 5, the peers (docs/peers.md): planning time of megatron-hcp, wlb, flexsp, blocks and blocks-all
// (MagiAttention's default block size) beside balance and
// elastic at 512 and 16,384 ranks, both datasets, 32M tokens, 2M and 256K context (flexsp's solver
// time included), median (min - max) of 5 runs. `bench_plan peers` runs this table alone.
//
// Table 6, many short sequences a rank (issue 42): the batch of lengths (i x 7919) % 4000 + 1, from
// 125K to 10M sequences on 512 to 16,384 ranks (the CLI's defaults otherwise: LLaMA-7B on h800-sxm,
// TP 2, C = 8K, 64K context, offloading on): balance and elastic, median wall clock of 5 runs (3 at
// 10M; thread CPU time in brackets, which another job on the machine disturbs less), the peak growth of resident memory while planning (a fresh child, as above) beside the
// plan's own arrays and the size of elastic's plan file. Here the batch's work sets the step, so
// elastic's plan is balance's; what it adds must stay small. `bench_plan short` runs this table alone.
#include <malloc.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "bytescale/batch.h"
#include "bytescale/error.h"
#include "bench_util.h"
#include "bytescale/fileio.h"
#include "bytescale/hw.h"
#include "bytescale/json.h"
#include "bytescale/model.h"
#include "bytescale/plan.h"
#include "bytescale/policy.h"
#include "bytescale/procmem.h"
#include "bytescale/progress.h"
#include "bytescale/timer.h"

#define REPEATS 11
#define TOKENS (32ll << 20)
#define CAPACITY 8192
static const char *POLICIES[] = {"static", "naive", "balance", "elastic"};
enum { N_POL = sizeof POLICIES / sizeof POLICIES[0] };
static const char *DISTS[] = {"byted", "github"};

static void cost_for(CostModel *cm, int ranks) {
    if (cost_derive(cm, model_find("llama-7b"), hw_find("h800-sxm"), 2, 1, ranks, CAPACITY) != 0) bs_die_errmsg();
}

// Start measuring the peak resident set: reset its high-water mark (VmHWM) and return the resident
// set now; where the reset is not allowed, ru_maxrss (*exact = 0: an underestimate when an earlier
// peak was higher).
static long peak_start(int *exact) {
    *exact = procmem_reset_peak();
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    return *exact ? procmem_status_kb("VmRSS:") : ru.ru_maxrss;
}

// Growth of the peak resident set since peak_start, kB.
static long peak_growth_kb(long before, int exact) {
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    return (exact ? procmem_status_kb("VmHWM:") : ru.ru_maxrss) - before;
}

// What a child measures: seconds and peak resident growth (kB) of one job; exact = 0 for the
// ru_maxrss fallback.
typedef struct {
    double seconds;
    long peak_kb;
    int exact;
} Measured;

// Run setup(ctx) and then run(ctx) in a fresh child, measuring run alone: the peak is reset after
// setup (and a heap trim). A failing child stops the benchmark.
static Measured measure_in_child(int (*setup)(void *), int (*run)(void *), void *ctx) {
    int fd[2];
    if (pipe(fd) != 0) bs_die("pipe failed");
    pid_t pid = fork();
    if (pid < 0) bs_die("fork failed");
    if (pid == 0) {
        close(fd[0]);
        if (setup && setup(ctx) != 0) _exit(1);
        malloc_trim(0);
        Measured m = {0, 0, 0};
        long before = peak_start(&m.exact);
        double t0 = now_seconds();
        if (run(ctx) != 0) {
            fprintf(stderr, "bench_plan: %s\n", bs_errmsg());
            _exit(1);
        }
        m.seconds = now_seconds() - t0;
        m.peak_kb = peak_growth_kb(before, m.exact);
        if (write(fd[1], &m, sizeof m) != (ssize_t)sizeof m) _exit(1);
        _exit(0);
    }
    close(fd[1]);
    Measured m = {-1, -1, 0};
    ssize_t got = read(fd[0], &m, sizeof m);
    close(fd[0]);
    int status;
    waitpid(pid, &status, 0);
    if (got != (ssize_t)sizeof m || !WIFEXITED(status) || WEXITSTATUS(status) != 0) bs_die("bench_plan: a child failed");
    return m;
}

// Planning one configuration, for measure_in_child: the batch is made in setup.
typedef struct {
    const char *dist, *policy;
    int ranks;
    CostModel cm;
    GlobalBatch b;
} PlanJob;

static int plan_job_setup(void *ctx) {
    PlanJob *j = ctx;
    cost_for(&j->cm, j->ranks);
    return batch_generate(&j->b, j->dist, 1, TOKENS, 2 << 20);
}

static int plan_job_run(void *ctx) {
    PlanJob *j = ctx;
    PlanConfig cfg = {.n_ranks = j->ranks, .capacity = CAPACITY, .context = 2 << 20, .pp = 1, .offload = 1};
    Plan p;
    return policy_plan(&p, j->policy, &j->b, &cfg, &j->cm);  // the child exits: nothing to free
}

static void table_speed(void) {
    static const int RANKS[] = {512, 2048, 16384};
    printf("## Planning time and memory: 32M tokens, 2M context, C = 8K, LLaMA-7B, offloading on\n\n");
    printf("median (min - max) of %d runs on one core; target: planning well under 100 ms\n\n", REPEATS);
    printf("| dataset | ranks | policy  | generate ms | plan ms                 | target ms | peak MB | items  |\n");
    printf("|---------|-------|---------|-------------|-------------------------|-----------|---------|--------|\n");
    Progress pr;
    progress_start(&pr, "bench plan: speed", 2 * 3 * N_POL);
    int done = 0, all_exact = 1;
    for (int d = 0; d < 2; d++)
        for (int ri = 0; ri < 3; ri++) {
            CostModel cm;
            cost_for(&cm, RANKS[ri]);
            for (int k = 0; k < N_POL; k++) {
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
                PlanJob job = {.dist = DISTS[d], .policy = POLICIES[k], .ranks = RANKS[ri]};
                Measured pm = measure_in_child(plan_job_setup, plan_job_run, &job);
                long peak = pm.peak_kb;
                all_exact &= pm.exact;
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
    printf("## Makespan / bounds at the paper's settings: 512 ranks, 32M tokens, C = 8K, LLaMA-7B\n\n");
    printf("lower: the policy-independent lower bound; HDP: the HDP-aware bound (a sequence on at most ceil(s/C) "
           "ranks), which static's mesh and elastic's wider rings do not obey. Target for balance: within 5%% of "
           "the HDP bound (ratio <= 1.05)\n\n");
    printf("| dataset | context | policy  | lower, offload on | lower, offload off | HDP, offload on "
           "| HDP, offload off | ring TB, on | ring TB, off |\n");
    printf("|---------|---------|---------|-------------------|--------------------|-----------------"
           "|------------------|-------------|--------------|\n");
    CostModel cm;
    cost_for(&cm, 512);
    Progress pr;
    progress_start(&pr, "bench plan: quality", 2 * 4);
    int done = 0;
    for (int d = 1; d >= 0; d--)  // github first, as the issue lists them
        for (int c = 0; c < 4; c++) {
            GlobalBatch b;
            if (batch_generate(&b, DISTS[d], 1, TOKENS, CTX[c]) != 0) bs_die_errmsg();
            for (int k = 0; k < N_POL; k++) {
                double ratio[2], ratio_hdp[2], tb[2];
                for (int off = 1; off >= 0; off--) {
                    PlanConfig cfg = {.n_ranks = 512, .capacity = CAPACITY, .context = CTX[c], .pp = 1, .offload = off};
                    Plan p;
                    PlanStats st;
                    if (policy_plan(&p, POLICIES[k], &b, &cfg, &cm) != 0 || plan_stats(&p, &cm, &st) != 0)
                        bs_die_errmsg();
                    ratio[!off] = p.makespan / p.lower_bound;
                    ratio_hdp[!off] = p.makespan / p.hdp_bound;
                    tb[!off] = st.ring_bytes / 1e12;
                    plan_free(&p);
                }
                printf("| %-7s | %-7s | %-7s | %17.4f | %18.4f | %15.4f | %16.4f | %11.1f | %12.1f |\n", DISTS[d],
                       CTX_NAME[c], POLICIES[k], ratio[0], ratio[1], ratio_hdp[0], ratio_hdp[1], tb[0], tb[1]);
                fflush(stdout);
            }
            batch_free(&b);
            progress_update(&pr, ++done, NULL);
        }
    progress_finish(&pr, done, NULL);
    printf("\nring TB: K/V bytes all rings move in one step (forward + backward, all layers, per TP device), 1e12 "
           "bytes\n");
}

// ---- beyond Algorithm 2: balance and elastic at scale ---------------------------------------------------

// The longest sequence's fastest item over every width up to all ranks: *ring on rings, the return
// value over every kind (ring, all-to-all group, hybrid: plan_fastest_item), which no plan beats.
// plan_lower_bound times the longest on rings only, over 65,536 widths past Eq. 3's fewest (a smaller
// stand-in beyond, so from 131,072 ranks on it can be far below the ring's time).
static double longest_fastest(const GlobalBatch *b, const CostModel *cm, int32_t R, double *ring) {
    int64_t longest = 0;
    for (int64_t i = 0; i < b->n; i++) longest = b->seqs[i].len > longest ? b->seqs[i].len : longest;
    double best = INFINITY;
    *ring = INFINITY;
    for (int D = 1; D <= R && D <= longest; D++) {
        best = fmin(best, plan_fastest_item(cm, longest, D));
        *ring = fmin(*ring, cost_item_time(cm, &longest, 1, D, 0.0));
    }
    return best;
}

// The batch's work over R ranks (pp = 1): plan_lower_bound's first term (docs/planner.md).
static double work_bound(const GlobalBatch *b, const CostModel *cm, int32_t R, int64_t C) {
    double work = 0;
    for (int64_t i = 0; i < b->n; i++) {
        double s = (double)b->seqs[i].len;
        work += cm->n_layers * (cm->attn_pair * s * (s + 1) / 2 + cm->lin_token * s) + cm->head_token * s;
    }
    double slots = fmax(1.0, ceil((double)b->n_tokens / cost_max_offload_tokens(cm, C) - 1e-9));
    return (work + slots * (cm->n_layers * (cm->layer_const + cm->attn_step) + cm->head_const)) / R;
}

static int32_t idle_ranks(const Plan *p) {
    int32_t n = 0;
    for (int32_t r = 0; r < p->n_ranks; r++) n += p->rank_begin[r] == p->rank_begin[r + 1];
    return n;
}

static void table_scale(int only_ranks) {
    static const int RANKS[] = {512, 2048, 16384, 131072};
    static const int64_t PER_RANK[] = {2 << 10, 64 << 10};
    enum { N_RANKS = 4 };
    printf("## Beyond Algorithm 2: balance and elastic, 2K and 64K tokens per rank, 2M context, C = 8K, LLaMA-7B, "
           "offloading on\n\n");
    printf("lower: the lower bound of plans of packs and rings (plan_lower_bound); bound: the batch's work spread "
           "over the ranks, or the longest sequence at its fastest kind (ring, all-to-all group or hybrid) over every "
           "width up to all ranks where its rings set `lower` (the lower bound's search stops 65,536 widths past "
           "Eq. 3's fewest, and it times rings only); set by: what sets that bound, the batch's work or the longest "
           "sequence (then the batch has less work than ranks). Target for elastic: within 5%% of the bound where the work sets it. Planning time: median of "
           "%d runs (3 above 1G tokens) on one core, wall clock (thread CPU time in brackets)\n\n",
           REPEATS);
    printf("| dataset | ranks   | tokens/rank | sequences | set by  | idle ranks, balance | idle ranks, elastic "
           "| balance / lower | elastic / lower | balance / bound | elastic / bound | balance ms      "
           "| elastic ms      | elastic / balance time |\n");
    printf("|---------|---------|-------------|-----------|---------|---------------------|---------------------"
           "|-----------------|-----------------|-----------------|-----------------|-----------------"
           "|-----------------|------------------------|\n");
    Progress pr;
    progress_start(&pr, "bench plan: scale", 2 * 2 * N_RANKS);
    int done = 0;
    for (int d = 1; d >= 0; d--)  // github first, as the issue lists them
        for (int k = 0; k < 2; k++)
            for (int ri = 0; ri < N_RANKS; ri++) {
                int R = RANKS[ri];
                if (only_ranks > 0 && R != only_ranks) {
                    progress_update(&pr, ++done, NULL);
                    continue;
                }
                int64_t tokens = (int64_t)R * PER_RANK[k];
                int reps = tokens > (1ll << 30) ? 3 : REPEATS;  // 1G tokens (16,384 ranks x 64K) gets all: the goal is its median
                CostModel cm;
                cost_for(&cm, R);
                GlobalBatch b;
                if (batch_generate(&b, DISTS[d], 1, tokens, 2 << 20) != 0) bs_die_errmsg();
                PlanConfig cfg = {.n_ranks = R, .capacity = CAPACITY, .context = 2 << 20, .pp = 1, .offload = 1};
                double wall[2][REPEATS], cpu[2][REPEATS];
                Plan p[2];
                for (int rep = 0; rep < reps; rep++)
                    for (int j = 0; j < 2; j++) {  // balance, elastic, alternating
                        double w0 = now_seconds(), c0 = bench_cpu_seconds(CLOCK_THREAD_CPUTIME_ID);
                        Plan q;
                        if (policy_plan(&q, j ? "elastic" : "balance", &b, &cfg, &cm) != 0) bs_die_errmsg();
                        wall[j][rep] = (now_seconds() - w0) * 1e3;
                        cpu[j][rep] = (bench_cpu_seconds(CLOCK_THREAD_CPUTIME_ID) - c0) * 1e3;
                        if (rep == 0) p[j] = q;
                        else plan_free(&q);
                    }
                // the bound: the work, or the longest at its fastest kind where its rings set lower_bound
                double ring, fastest = longest_fastest(&b, &cm, R, &ring), lower = p[0].lower_bound;
                double bound = ring >= lower * (1 - 1e-12) ? fmax(fastest, work_bound(&b, &cm, R, CAPACITY)) : lower;
                double longest = fmax(fastest, ring >= lower * (1 - 1e-12) ? ring : 0);
                double wmed[2], cmed[2];
                char col[2][48];
                for (int j = 0; j < 2; j++) {
                    wmed[j] = bench_median(wall[j], reps);
                    cmed[j] = bench_median(cpu[j], reps);
                    snprintf(col[j], sizeof col[j], "%.1f (%.1f)", wmed[j], cmed[j]);
                }
                printf("| %-7s | %7d | %9lldK | %9lld | %-7s | %19d | %19d | %15.3f | %15.3f | %15.3f | %15.3f | %-15s "
                       "| %-15s | %15.2f (%.2f) |\n",
                       DISTS[d], R, (long long)(PER_RANK[k] >> 10), (long long)b.n, longest >= bound * (1 - 1e-12) ? "longest" : "work",
                       idle_ranks(&p[0]), idle_ranks(&p[1]), p[0].makespan / lower, p[1].makespan / lower,
                       p[0].makespan / bound, p[1].makespan / bound, col[0], col[1], wmed[1] / wmed[0], cmed[1] / cmed[0]);
                fflush(stdout);
                plan_free(&p[0]);
                plan_free(&p[1]);
                batch_free(&b);
                progress_update(&pr, ++done, NULL);
            }
    progress_finish(&pr, done, NULL);
    printf("\n");
}

// ---- plan files --------------------------------------------------------------------------------------

// Writing or reading one plan file, for measure_in_child.
typedef struct {
    const Plan *p;
    const char *path;
} FileJob;

static int job_write(void *ctx) {
    FileJob *j = ctx;
    return plan_write_json(j->p, j->path);
}
static int job_read(void *ctx) {
    FileJob *j = ctx;
    Plan q;
    if (plan_read_json(&q, j->path) != 0) return -1;
    plan_free(&q);
    return 0;
}
static int job_tree(void *ctx) {  // the reader before streaming: the whole file as a cJSON tree
    FileJob *j = ctx;
    cJSON *root;
    if (json_read_file(j->path, &root) != 0) return -1;
    cJSON_Delete(root);
    return 0;
}

// Bytes of the plan's own arrays: what any reader must allocate.
static double plan_bytes(const Plan *p) {
    return (double)p->batch.n * sizeof(Sequence) + (double)p->n_items * sizeof(Item) +
           (double)p->n_segs * sizeof(Segment) + (double)p->n_refs * 2 * sizeof(int32_t) +
           (double)p->n_ranks * (sizeof(int32_t) + sizeof(double));
}

static void table_files(const char *dir) {
    static const int64_t SEQS[] = {1000000, 10000000};
    double plan_s[2];
    printf("## Plan files: write and read, streamed (uniform lengths 1-600, balance plans on 16,384 ranks, C = 8K)\n\n");
    printf("| sequences | items   | plan s | file MB | plan in memory MB | write s | write MB/s | write peak MB | read s | "
           "read MB/s | read peak MB | cJSON tree: read peak MB |\n");
    printf("|-----------|---------|--------|---------|-------------------|---------|------------|---------------|--------|"
           "-----------|--------------|--------------------------|\n");
    if (make_dirs(dir) != 0) bs_die_errmsg();
    char path[4200];
    snprintf(path, sizeof path, "%s/plan.json", dir);
    Progress pr;
    progress_start(&pr, "bench plan: files", 2);
    for (int i = 0; i < 2; i++) {
        CostModel cm;
        cost_for(&cm, 16384);
        GlobalBatch b;
        // uniform 1..600 averages 300.5 tokens: this budget gives about SEQS[i] sequences
        if (batch_generate(&b, "uniform:1:600", 1, (int64_t)(SEQS[i] * 300.5), 2 << 20) != 0) bs_die_errmsg();
        PlanConfig cfg = {.n_ranks = 16384, .capacity = CAPACITY, .context = 2 << 20, .pp = 1, .offload = 0};
        Plan p;
        double t0 = now_seconds();
        if (policy_plan(&p, "balance", &b, &cfg, &cm) != 0) bs_die_errmsg();
        plan_s[i] = now_seconds() - t0;
        batch_free(&b);
        FileJob job = {&p, path};
        Measured w = measure_in_child(NULL, job_write, &job);
        struct stat st;
        if (stat(path, &st) != 0) bs_die("%s: not written", path);
        double mb = (double)st.st_size / 1e6;
        Measured r = measure_in_child(NULL, job_read, &job);
        Measured t = {0, -1, 0};
        if (i == 0) t = measure_in_child(NULL, job_tree, &job);
        char tree[32] = "(not run)";
        if (t.peak_kb >= 0) snprintf(tree, sizeof tree, "%.0f", t.peak_kb / 1024.0);
        printf("| %9lld | %7d | %6.2f | %7.0f | %17.0f | %7.2f | %10.0f | %13.0f | %6.2f | %9.0f | %12.0f | %24s |\n",
               (long long)p.batch.n, p.n_items, plan_s[i], mb, plan_bytes(&p) / (1 << 20), w.seconds,
               mb / w.seconds, w.peak_kb / 1024.0, r.seconds, mb / r.seconds, r.peak_kb / 1024.0, tree);
        fflush(stdout);
        plan_free(&p);
        unlink(path);
        progress_update(&pr, i + 1, NULL);
    }
    progress_finish(&pr, 2, NULL);
    printf("\nMB: 10^6 bytes for files and speeds, 2^20 for memory. peak: growth of the resident set's high-water "
           "mark (VmHWM) in a fresh child, reset before the job. Write peak stays near zero: the file is printed "
           "from the plan as it stands. Read peak is the plan being built (its arrays grow by doubling) plus one "
           "64 KiB piece of text.\n\n");
}

static void table_peers(void) {
    static const char *POL[] = {"balance", "elastic", "megatron-hcp", "wlb", "flexsp", "blocks", "blocks-all"};
    static const int RANKS[] = {512, 16384};
    static const int64_t CTX[] = {256 << 10, 2 << 20};
    enum { N = sizeof POL / sizeof POL[0], RUNS = 5 };
    printf("## The peers' planning time: 32M tokens, C = 8K, LLaMA-7B, offloading on\n\n");
    printf("plan ms, median (min - max) of %d runs on one core\n\n", RUNS);
    printf("| dataset | context | ranks  |");
    for (int k = 0; k < N; k++) printf(" %s |", POL[k]);
    printf("\n|---|---|---|");
    for (int k = 0; k < N; k++) printf("---|");
    printf("\n");
    for (int d = 0; d < 2; d++)
        for (int c = 0; c < 2; c++)
            for (int ri = 0; ri < 2; ri++) {
                CostModel cm;
                cost_for(&cm, RANKS[ri]);
                GlobalBatch b;
                if (batch_generate(&b, DISTS[d], 1, TOKENS, CTX[c]) != 0) bs_die_errmsg();
                printf("| %s | %s | %d |", DISTS[d], c ? "2M" : "256K", RANKS[ri]);
                for (int k = 0; k < N; k++) {
                    double t[RUNS];
                    int ok = 1;
                    for (int rep = 0; rep < RUNS && ok; rep++) {
                        PlanConfig cfg = {.n_ranks = RANKS[ri], .capacity = CAPACITY, .context = CTX[c], .pp = 1,
                                          .offload = 1};
                        Plan p;
                        double t0 = now_seconds();
                        ok = policy_plan(&p, POL[k], &b, &cfg, &cm) == 0;
                        t[rep] = (now_seconds() - t0) * 1e3;
                        if (ok) plan_free(&p);
                    }
                    if (!ok) {
                        printf(" fails: %s |", bs_errmsg());
                        continue;
                    }
                    qsort(t, RUNS, sizeof t[0], bench_cmp_double);
                    printf(" %.3g (%.3g - %.3g) |", t[RUNS / 2], t[0], t[RUNS - 1]);
                }
                printf("\n");
                fflush(stdout);
                batch_free(&b);
            }
    printf("\n");
}

// ---- many short sequences a rank ------------------------------------------------------------------------

// The batch of issue 42: n lengths (i x 7919) % 4000 + 1 for i = 1 .. n, as its awk line prints them.
static int short_batch(GlobalBatch *b, int64_t n) {
    if (batch_init(b, n) != 0) return -1;
    for (int64_t i = 1; i <= n; i++)
        if (batch_push(b, i - 1, (i * 7919) % 4000 + 1, -1) != 0) return -1;
    return 0;
}

#define SHORT_CONTEXT (64 << 10)

// Planning one row of the table, for measure_in_child.
typedef struct {
    const char *policy;
    int64_t n;
    int ranks;
    CostModel cm;
    GlobalBatch b;
} ShortJob;

static int short_setup(void *ctx) {
    ShortJob *j = ctx;
    cost_for(&j->cm, j->ranks);
    return short_batch(&j->b, j->n);
}

static int short_run(void *ctx) {
    ShortJob *j = ctx;
    PlanConfig cfg = {.n_ranks = j->ranks, .capacity = CAPACITY, .context = SHORT_CONTEXT, .pp = 1, .offload = 1};
    Plan p;
    return policy_plan(&p, j->policy, &j->b, &cfg, &j->cm);  // the child exits: nothing to free
}

static void table_short(const char *dir) {
    static const int64_t SEQS[] = {125000, 250000, 500000, 1000000, 1000000, 10000000, 10000000};
    static const int RANKS[] = {512, 512, 512, 512, 4096, 512, 16384};
    enum { N_ROWS = sizeof SEQS / sizeof SEQS[0], RUNS = 5 };
    printf("## Many short sequences a rank: lengths (i x 7919) %% 4000 + 1, 64K context, C = 8K, LLaMA-7B, "
           "offloading on\n\n");
    printf("plan ms: median wall clock of %d runs (3 at 10M) on one core, balance and elastic alternating, thread "
           "CPU time in brackets. peak: growth of the resident set's high-water mark while planning, in a fresh child; plan: the plan's own "
           "arrays; file: elastic's plan file. MB: 2^20 bytes for memory, 10^6 for files\n\n", RUNS);
    printf("| sequences | ranks  | sequences/rank | balance ms    | elastic ms    | elastic / balance  | balance peak MB | "
           "elastic peak MB | plan MB | file MB | elastic peak / file |\n");
    printf("|-----------|--------|----------------|---------------|---------------|--------------------|-----------------|"
           "-----------------|---------|---------|---------------------|\n");
    if (make_dirs(dir) != 0) bs_die_errmsg();
    char path[4200];
    snprintf(path, sizeof path, "%s/short.json", dir);
    Progress pr;
    progress_start(&pr, "bench plan: short", N_ROWS);
    for (int r = 0; r < N_ROWS; r++) {
        int runs = SEQS[r] >= 10000000 ? 3 : RUNS;
        ShortJob job = {.n = SEQS[r], .ranks = RANKS[r]};
        if (short_setup(&job) != 0) bs_die_errmsg();
        PlanConfig cfg = {.n_ranks = RANKS[r], .capacity = CAPACITY, .context = SHORT_CONTEXT, .pp = 1, .offload = 1};
        double ms[2][RUNS], cpu[2][RUNS];
        Plan kept;
        for (int rep = 0; rep < runs; rep++)
            for (int j = 0; j < 2; j++) {  // balance, elastic
                Plan q;
                double t0 = now_seconds(), c0 = bench_cpu_seconds(CLOCK_THREAD_CPUTIME_ID);
                if (policy_plan(&q, j ? "elastic" : "balance", &job.b, &cfg, &job.cm) != 0) bs_die_errmsg();
                ms[j][rep] = (now_seconds() - t0) * 1e3;
                cpu[j][rep] = (bench_cpu_seconds(CLOCK_THREAD_CPUTIME_ID) - c0) * 1e3;
                if (rep == 0 && j == 1) kept = q;
                else plan_free(&q);
            }
        batch_free(&job.b);
        if (plan_write_json(&kept, path) != 0) bs_die_errmsg();
        struct stat st;
        if (stat(path, &st) != 0) bs_die("%s: not written", path);
        unlink(path);
        double plan_mb = plan_bytes(&kept) / (1 << 20), file_mb = (double)st.st_size / 1e6;
        plan_free(&kept);
        Measured peak[2];
        char col[2][48];
        double wmed[2], cmed[2];
        for (int j = 0; j < 2; j++) {
            job.policy = j ? "elastic" : "balance";
            peak[j] = measure_in_child(short_setup, short_run, &job);
            wmed[j] = bench_median(ms[j], runs);
            cmed[j] = bench_median(cpu[j], runs);
            snprintf(col[j], sizeof col[j], "%.0f (%.0f)", wmed[j], cmed[j]);
        }
        printf("| %9lld | %6d | %14lld | %-13s | %-13s | %11.2f (%.2f) | %15.0f | %15.0f | %7.0f | %7.0f | %19.2f |\n",
               (long long)SEQS[r], RANKS[r], (long long)(SEQS[r] / RANKS[r]), col[0], col[1], wmed[1] / wmed[0],
               cmed[1] / cmed[0], peak[0].peak_kb / 1024.0, peak[1].peak_kb / 1024.0, plan_mb, file_mb,
               peak[1].peak_kb * 1024.0 / 1e6 / file_mb);
        fflush(stdout);
        progress_update(&pr, r + 1, NULL);
    }
    progress_finish(&pr, N_ROWS, NULL);
    printf("\n");
}

// A digest (CRC-32) of everything a plan says, field by field (no struct padding): its items, segments, ring
// members, schedule and bounds. Two builds that print the same digest made the same plan.
static uint32_t plan_digest(const Plan *p) {
    uint32_t h = 0;
    for (int32_t i = 0; i < p->n_items; i++) {
        const Item *it = &p->items[i];
        int32_t v[6] = {it->seg_begin, it->n_segs, it->rank_begin, it->n_ranks, it->a2a, it->ulysses};
        h = checksum_crc32(h, v, sizeof v);
        h = checksum_crc32(h, &it->offload, sizeof it->offload);
        h = checksum_crc32(h, &it->tokens, sizeof it->tokens);
        h = checksum_crc32(h, &it->est_time, sizeof it->est_time);
    }
    for (int32_t i = 0; i < p->n_segs; i++) {
        h = checksum_crc32(h, &p->segs[i].seq, sizeof p->segs[i].seq);
        h = checksum_crc32(h, &p->segs[i].start, sizeof p->segs[i].start);
        h = checksum_crc32(h, &p->segs[i].len, sizeof p->segs[i].len);
    }
    h = checksum_crc32(h, p->ranks, sizeof(int32_t) * (size_t)p->n_refs);
    h = checksum_crc32(h, p->rank_begin, sizeof(int32_t) * ((size_t)p->n_ranks + 1));
    h = checksum_crc32(h, p->rank_items, sizeof(int32_t) * (size_t)p->n_refs);
    h = checksum_crc32(h, p->rank_busy, sizeof(double) * (size_t)p->n_ranks);
    double d[3] = {p->makespan, p->lower_bound, p->hdp_bound};
    return checksum_crc32(h, d, sizeof d);
}

// One plan of the scale table's 64K-tokens-per-rank batch, for a profiler (valgrind --tool=callgrind,
// perf record): the batch is made first, so a profile of policy_plan is the planning alone. Its
// digest says whether a change to a planner kept its plans (plan_digest).
// TIMES > 1 plans it that many times, each plan freed before the next as a trainer does, and prints the
// median: a profile of that is of the planning a trainer repeats, its first plan's page faults diluted.
static void plan_once(const char *dist, const char *policy, int ranks, int times) {
    CostModel cm;
    cost_for(&cm, ranks);
    GlobalBatch b;
    if (batch_generate(&b, dist, 1, (int64_t)ranks * (64 << 10), 2 << 20) != 0) bs_die_errmsg();
    PlanConfig cfg = {.n_ranks = ranks, .capacity = CAPACITY, .context = 2 << 20, .pp = 1, .offload = 1};
    Plan p;
    double ms[64];
    if (times < 1 || times > 64) bs_die("bench_plan once: TIMES %d (1 to 64)", times);
    for (int k = 0; k < times; k++) {
        double t0 = now_seconds();
        if (policy_plan(&p, policy, &b, &cfg, &cm) != 0) bs_die_errmsg();
        ms[k] = (now_seconds() - t0) * 1e3;
        if (k + 1 < times) plan_free(&p);
    }
    printf("%s %s, %d ranks, %lld sequences: %d items, makespan %.6g s, planned in %.1f ms (median of %d), "
           "plan digest %08x\n",
           dist, policy, ranks, (long long)b.n, p.n_items, p.makespan, bench_median(ms, times), times,
           (unsigned)plan_digest(&p));
    plan_free(&p);
    batch_free(&b);
}

int main(int argc, char **argv) {
    printf("# bench_plan: the HDP planners (bytescale plan)\n\n");
    if (argc > 1 && !strcmp(argv[1], "peers")) {
        table_peers();
        return 0;
    }
    const char *dir = getenv("BS_BENCH_DIR") ? getenv("BS_BENCH_DIR") : "bench-out";
    if (argc > 1 && !strcmp(argv[1], "files")) {
        table_files(dir);
        return 0;
    }
    if (argc > 1 && !strcmp(argv[1], "scale")) {
        table_scale(argc > 2 ? atoi(argv[2]) : 0);
        return 0;
    }
    if (argc > 3 && !strcmp(argv[1], "once")) {
        plan_once(argv[2], argv[3], argc > 4 ? atoi(argv[4]) : 16384, argc > 5 ? atoi(argv[5]) : 1);
        return 0;
    }
    if (argc > 1 && !strcmp(argv[1], "short")) {
        table_short(dir);
        return 0;
    }
    if (argc > 1) bs_die("usage: bench_plan [files | scale [RANKS] | short | peers | once DIST POLICY [RANKS [TIMES]]]");
    table_speed();
    table_quality();
    table_scale(0);
    table_short(dir);
    table_files(dir);
    return 0;
}
