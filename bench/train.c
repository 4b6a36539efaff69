// bench/train.c: real HDP training on this machine, static vs naive vs balance, and how close the
// simulator comes to it.
//
// One run trains the same model three times, once per policy, over MPI ranks of one core and one
// OpenBLAS thread each. The seed is the same for every policy, so every policy trains on the same
// global batches (checked: the table says so) from the same initial weights; only the plans differ.
// The three trainers live side by side and take their steps in turn (step 1 of each, step 2 of each,
// ..., the order rotating), so a change in the machine's load falls on all three alike; each step
// also records how much of a core every rank got (CPU / wall seconds), which says when the machine
// was shared and the times are not to be trusted.
// Defaults: model tiny, the Go corpus (data/go-byte, `bytescale prepare`), 64K tokens per step,
// context 16K, capacity C = 8K, so a file longer than 8K tokens is a ring over 2 ranks (and the static
// mesh is d_cp = ceil(16K / 8K) = 2: every micro-batch is a 2-rank ring). Each policy runs 1 warm-up
// step (it plans its first batch while the clock runs and warms the caches; not counted) and then
// --steps measured steps; every figure is the median over the measured steps.
//
// Table 1, measured: tokens/s and its ratio to static; each rank's wait (blocked on ring messages
// and at the gradient sync for the slowest rank) as a fraction of the step; the gradient sync time
// left exposed after the last rank arrived (StepStats.sync_exposed); the time the step waited for
// its plan and tokens (the prefetch was late). Targets beside balance: ahead of static, and every
// rank waiting under 5% of the step.
// Table 2, simulated: the exact plans the trainer ran (rank 0 keeps each measured step's plan in
// its packed wire form and simulates them all after training, so the simulator never competes with
// the ranks for a core) on the `cpu` hardware profile (docs/hardware.md), median simulated step
// time beside the measured one and the relative difference.
//
// usage: bench_train [--quick] [--model NAME] [--tokens N] [--context N] [--capacity N] [--steps N]
//                    [--data DIR] [--seed N]
// Run alone (or by `make bench`) it starts itself as `mpirun -np 2 --bind-to core bench_train ...`;
// under an MPI launcher it uses the ranks it was given. Tables go to stdout (rank 0), progress to
// stderr. --quick is a smoke run: context 4K, C 2K, 8K tokens, 2 steps.
#include <cblas.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "bytescale/cluster.h"
#include "bytescale/comm.h"
#include "bytescale/cost.h"
#include "bytescale/error.h"
#include "bytescale/hw.h"
#include "bytescale/model.h"
#include "bytescale/plan.h"
#include "bytescale/sim.h"
#include "bytescale/timer.h"
#include "bytescale/train.h"
#include "bench_util.h"
#include "nn/blas_core.h"

#define N_POLICIES 3
static const char *POLICIES[N_POLICIES] = {"static", "naive", "balance"};  // static first: the baseline
#define LAUNCH_RANKS "2"  // the machine has 2 cores: one rank each
#define WAIT_TARGET 0.05  // balance: every rank waits under 5% of the step

typedef struct {
    char model[32];
    int64_t tokens, context, capacity;
    int steps;
    char data[TRAIN_PATH_MAX];
    uint64_t seed;
    int quick;
} Opts;

// One measured step as rank 0 saw it (every rank's times are gathered by the trainer).
typedef struct {
    double seconds, tokens_per_s, sync_exposed, data_wait, est_seconds;
    double core_share;      // the least CPU seconds per wall second of any rank over the step
    double *wait;           // (n_ranks,) wait / step seconds
    int n_items, n_rings;
    uint64_t batch_hash;    // the global batch's sequences: equal across policies = same batches
    uint8_t *wire;          // the plan the trainer ran, packed (plan_pack)
    size_t wire_size;
    double sim_seconds;     // that plan's simulated step time
    double sim_wait_max;    // the simulated wait of the most waiting rank / simulated step time
} StepRec;

static void usage(FILE *f) {
    fprintf(f,
            "usage: bench_train [--quick] [--model NAME] [--tokens N] [--context N] [--capacity N] [--steps N]\n"
            "                   [--data DIR] [--seed N]\n"
            "  --model NAME    tiny or small (default tiny)\n"
            "  --tokens N      tokens per step (default 64K; suffixes K M)\n"
            "  --context N     longest sequence (default 16K)\n"
            "  --capacity N    C, tokens per rank per micro-batch (default 8K)\n"
            "  --steps N       measured steps per policy, after 1 warm-up step (default 8)\n"
            "  --data DIR      prepared dataset (default data/go-byte)\n"
            "  --seed N        weights and data order, the same for every policy (default 1337)\n"
            "  --quick         smoke run: context 4K, capacity 2K, 8K tokens, 2 steps\n"
            "Started without an MPI launcher it runs itself as mpirun -np " LAUNCH_RANKS " --bind-to core.\n");
}

// "64K" -> 65536 (K M G are powers of 1024, as in the CLI). -1 + error.
static int parse_tokens(const char *flag, const char *text, int64_t *out) {
    char *end;
    errno = 0;
    long long v = strtoll(text, &end, 10);
    int64_t mul = 1;
    if (*end == 'K' || *end == 'k') mul = 1ll << 10, end++;
    else if (*end == 'M' || *end == 'm') mul = 1ll << 20, end++;
    else if (*end == 'G' || *end == 'g') mul = 1ll << 30, end++;
    if (errno || end == text || *end || v < 1 || v > (1ll << 40) / mul)
        return bs_fail("%s '%s': want a positive number of tokens (suffixes K M G)", flag, text);
    *out = (int64_t)v * mul;
    return 0;
}

static void copy_flag(char *dst, size_t cap, const char *flag, const char *v) {
    if (strlen(v) >= cap) bs_die("%s: '%s' is too long", flag, v);
    memcpy(dst, v, strlen(v) + 1);
}

// Every rank parses the same argv, so a bad flag stops them all the same way.
static Opts parse_args(int argc, char **argv) {
    Opts o = {.tokens = 64 << 10, .context = 16 << 10, .capacity = 8 << 10, .steps = 8, .seed = 1337};
    snprintf(o.model, sizeof o.model, "tiny");
    snprintf(o.data, sizeof o.data, "data/go-byte");
    int64_t tokens = 0, context = 0, capacity = 0, steps = 0, seed = -1;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        int rc = 0;
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            usage(stdout);
            exit(0);
        } else if (!strcmp(a, "--quick")) {
            o.quick = 1;
            continue;
        } else if (!v) {
            rc = bs_fail("unknown flag '%s', or it needs a value", a);
        } else if (!strcmp(a, "--model")) {
            copy_flag(o.model, sizeof o.model, a, v);
        } else if (!strcmp(a, "--data")) {
            copy_flag(o.data, sizeof o.data, a, v);
        } else if (!strcmp(a, "--tokens")) {
            rc = parse_tokens(a, v, &tokens);
        } else if (!strcmp(a, "--context")) {
            rc = parse_tokens(a, v, &context);
        } else if (!strcmp(a, "--capacity")) {
            rc = parse_tokens(a, v, &capacity);
        } else if (!strcmp(a, "--steps")) {
            rc = parse_tokens(a, v, &steps);
            if (rc == 0 && steps > 10000) rc = bs_fail("--steps %s: at most 10000", v);
        } else if (!strcmp(a, "--seed")) {
            char *end;
            seed = strtoll(v, &end, 10);
            if (*end || end == v || seed < 0) rc = bs_fail("--seed '%s': want a number >= 0", v);
        } else {
            rc = bs_fail("unknown flag '%s'", a);
        }
        if (rc != 0) {
            fprintf(stderr, "bench_train: error: %s\n", bs_errmsg());
            usage(stderr);
            exit(2);
        }
        i++;
    }
    if (o.quick) o.tokens = 8 << 10, o.context = 4 << 10, o.capacity = 2 << 10, o.steps = 2;
    // flags given beside --quick still win
    if (tokens) o.tokens = tokens;
    if (context) o.context = context;
    if (capacity) o.capacity = capacity;
    if (steps) o.steps = (int)steps;
    if (seed >= 0) o.seed = (uint64_t)seed;
    return o;
}

// The dataset: as given, or, for a relative path that is not there, next to the build directory
// (bench_train lives in build/, the data in data/): so it also runs from another directory.
static int find_data(Opts *o) { return bench_find_data(o->data, sizeof o->data); }

// A rank that cannot go on ends the job: the others would wait for it forever.
static _Noreturn void rank_die(Comm *comm, const char *what) {
    fprintf(stderr, "bench_train: rank %d of %d: error: %s\n", comm->rank, comm->size, what);
    comm_abort(comm, 1);
    exit(1);
}

// Median of n values picked by get(i); sorts a copy.
static double median_of(const StepRec *r, int n, double (*get)(const StepRec *, int), int arg) {
    double *v = malloc((size_t)n * sizeof *v);
    if (!v) bs_die("out of memory");
    for (int i = 0; i < n; i++) v[i] = get(&r[i], arg);
    double m = bench_median(v, n);
    free(v);
    return m;
}
static double get_seconds(const StepRec *r, int a) { return (void)a, r->seconds; }
static double get_tps(const StepRec *r, int a) { return (void)a, r->tokens_per_s; }
static double get_wait(const StepRec *r, int rank) { return r->wait[rank]; }
static double get_sync(const StepRec *r, int a) { return (void)a, r->sync_exposed; }
static double get_data_wait(const StepRec *r, int a) { return (void)a, r->data_wait; }
static double get_est(const StepRec *r, int a) { return (void)a, r->est_seconds; }
static double get_items(const StepRec *r, int a) { return (void)a, r->n_items; }
static double get_rings(const StepRec *r, int a) { return (void)a, r->n_rings; }
static double get_share(const StepRec *r, int a) { return (void)a, r->core_share; }
static double get_sim(const StepRec *r, int a) { return (void)a, r->sim_seconds; }
static double get_sim_wait(const StepRec *r, int a) { return (void)a, r->sim_wait_max; }
static double get_sim_diff(const StepRec *r, int a) { return (void)a, r->sim_seconds / r->seconds - 1; }

static uint64_t batch_hash(const GlobalBatch *b) {
    uint64_t h = 1469598103934665603ull;  // FNV-1a over (id, src, len) of every sequence
    for (int64_t i = 0; i < b->n; i++) {
        uint64_t w[3] = {(uint64_t)b->seqs[i].id, (uint64_t)b->seqs[i].src, (uint64_t)b->seqs[i].len};
        for (int j = 0; j < 3; j++)
            for (int k = 0; k < 8; k++) h = (h ^ ((w[j] >> (8 * k)) & 0xff)) * 1099511628211ull;
    }
    return h;
}

// One trainer per policy, all made the same way but for the policy. Every rank calls it.
static Trainer *make_trainer(Comm *comm, const Opts *o, const char *policy) {
    TrainConfig cfg = train_defaults();
    snprintf(cfg.model, sizeof cfg.model, "%s", o->model);
    snprintf(cfg.policy, sizeof cfg.policy, "%s", policy);
    snprintf(cfg.data, sizeof cfg.data, "%s", o->data);
    cfg.tokens = o->tokens;
    cfg.context = o->context;
    cfg.capacity = o->capacity;
    cfg.seed = o->seed;
    cfg.steps = 1 + o->steps;  // the prefetch plans ahead only up to cfg.steps
    cfg.quiet = 1;
    Trainer *t = malloc(sizeof *t);  // large, and it must not move
    if (!t) rank_die(comm, "out of memory");
    if (trainer_init_comm(t, &cfg, comm) != 0) rank_die(comm, bs_errmsg());
    return t;
}

// One step of trainer t; step s of the run (0 = the warm-up), recorded into *r unless it is the warm-up.
static void run_step(Comm *comm, Trainer *t, const Opts *o, int s, StepRec *r) {
    int lead = comm->rank == 0;
    double c0 = bench_cpu_seconds(CLOCK_PROCESS_CPUTIME_ID), w0 = now_seconds();
    StepStats st;
    if (trainer_step(t, &st) != 0) rank_die(comm, bs_errmsg());
    // The core share: this process's CPU seconds per wall second of the step. A rank polls while it
    // waits (MPI spins), so on a core of its own this is about 1 (a little more with the prefetch
    // thread); well below 1 means other processes took the core and the step's time is not ours.
    double share = (bench_cpu_seconds(CLOCK_PROCESS_CPUTIME_ID) - c0) / (now_seconds() - w0), shares[64], least = share;
    if (comm->size <= 64) {
        if (comm_allgather(comm, &share, shares, sizeof share) != 0) rank_die(comm, bs_errmsg());
        for (int k = 0; k < comm->size; k++) least = fmin(least, shares[k]);
    }
    // Slot step % 2 still holds this step's plan: the background thread now reads the rows of the
    // next step's plan (the other slot), and this slot is only replaced when the next trainer_step
    // broadcasts the plan of step + 2.
    const Plan *p = &t->plans[t->step % 2];
    if (t->plan_of[t->step % 2] != t->step) rank_die(comm, "the trainer no longer holds the plan of its last step");
    if (lead) {
        fprintf(stderr, "bench_train: step %d/%d%s %-7s %6.2f s, %6.0f tok/s, wait", s, o->steps,
                s == 0 ? " (warm-up)" : "", t->cfg.policy, st.seconds, st.tokens_per_s);
        for (int k = 0; k < st.n_ranks; k++) fprintf(stderr, " %4.1f%%", 100 * st.ranks[k].wait / st.seconds);
        fprintf(stderr, ", core share %3.0f%%, %d items (%d rings), loss %.4f\n", 100 * least, st.n_items, st.n_rings,
                st.loss);
    }
    if (s == 0) return;  // the warm-up step planned its batch on the clock and warmed the caches
    r->seconds = st.seconds;
    r->tokens_per_s = st.tokens_per_s;
    r->sync_exposed = st.sync_exposed;
    r->data_wait = st.data_wait;
    r->est_seconds = st.est_seconds;
    r->core_share = least;
    r->n_items = st.n_items;
    r->n_rings = st.n_rings;
    r->wait = malloc((size_t)st.n_ranks * sizeof *r->wait);
    if (!r->wait) rank_die(comm, "out of memory");
    for (int k = 0; k < st.n_ranks; k++) r->wait[k] = st.ranks[k].wait / st.seconds;
    r->batch_hash = batch_hash(&p->batch);
    // kept packed and simulated after all training, so the simulator takes no core from the ranks
    if (lead && plan_pack(p, &r->wire, &r->wire_size) != 0) rank_die(comm, bs_errmsg());
}

// Rank 0: simulate every measured step's plan on the cpu profile, the cost model the trainer plans with.
static void simulate(const Opts *o, int n_ranks, StepRec *rec, int n) {
    const ModelConfig *m = model_find(o->model);
    const HardwareProfile *hw = hw_find("cpu");
    CostModel cm;
    Cluster cl;
    if (!m || !hw || cost_derive(&cm, m, hw, 1, 1, n_ranks, o->capacity) != 0 || cluster_init(&cl, hw, n_ranks, 1, 1) != 0)
        bs_die_errmsg();
    SimConfig sc = {.cm = &cm, .cluster = &cl, .model = m, .hw = hw, .fwd_fraction = 0};
    for (int i = 0; i < n; i++) {
        Plan p;
        SimResult res;
        if (plan_unpack(&p, rec[i].wire, rec[i].wire_size) != 0 || sim_run(&res, &p, &sc) != 0) bs_die_errmsg();
        rec[i].sim_seconds = res.step_time;
        double w = 0;
        for (int k = 0; k < res.n_res; k++) w = fmax(w, res.wait[k]);
        rec[i].sim_wait_max = w / res.step_time;
        sim_result_free(&res);
        plan_free(&p);
    }
}

// The 1-minute load average (/proc/loadavg), -1 where there is none.
static double loadavg(void) {
    FILE *f = fopen("/proc/loadavg", "r");
    double v = -1;
    if (f && fscanf(f, "%lf", &v) != 1) v = -1;
    if (f) fclose(f);
    return v;
}

static const char *tokens_text(char *buf, size_t n, int64_t v) {
    if (v % (1 << 20) == 0) snprintf(buf, n, "%lldM", (long long)(v >> 20));
    else if (v % (1 << 10) == 0) snprintf(buf, n, "%lldK", (long long)(v >> 10));
    else snprintf(buf, n, "%lld", (long long)v);
    return buf;
}

// rec: N_POLICIES runs of o->steps measured steps, policy j's at rec + j * o->steps.
static void report(const Opts *o, int R, const StepRec *all, double n_params, double seconds, const double load[2]) {
    int n = o->steps;
    const StepRec *rec[N_POLICIES];
    for (int j = 0; j < N_POLICIES; j++) rec[j] = all + (size_t)j * n;
    char a[24], b[24], c[24];
    int64_t d_cp = (o->context + o->capacity - 1) / o->capacity;
    printf("bench_train: HDP training on this machine: %d ranks x 1 core x 1 OpenBLAS thread, one run, every policy\n"
           "on the same global batches from the same weights\n",
           R);
    printf("model %s (%.2fM parameters), data %s, %s tokens/step, context %s, C %s (longer sequences ring;\n"
           "static d_cp = %lld), seed %llu; %d measured steps per policy after 1 warm-up step, medians\n\n",
           o->model, n_params / 1e6, o->data, tokens_text(a, sizeof a, o->tokens), tokens_text(b, sizeof b, o->context),
           tokens_text(c, sizeof c, o->capacity), (long long)d_cp, (unsigned long long)o->seed, n);

    // ---- table 1: measured ----
    printf("Table 1: measured (wait = blocked on ring messages and at the gradient sync, / step time)\n");
    printf("%-8s %9s %9s %8s", "policy", "tok/s", "vs static", "step s");
    for (int r = 0; r < R; r++) printf("  wait r%-2d", r);
    printf(" %11s %11s %6s %6s %6s\n", "sync exp s", "data wait s", "items", "rings", "core");
    double tps[N_POLICIES], wmax[N_POLICIES], share[N_POLICIES];
    for (int j = 0; j < N_POLICIES; j++) tps[j] = median_of(rec[j], n, get_tps, 0);
    for (int j = 0; j < N_POLICIES; j++) {
        printf("%-8s %9.0f %8.2fx %8.2f", POLICIES[j], tps[j], tps[j] / tps[0], median_of(rec[j], n, get_seconds, 0));
        wmax[j] = 0;
        for (int r = 0; r < R; r++) {
            double w = median_of(rec[j], n, get_wait, r);
            wmax[j] = fmax(wmax[j], w);
            printf("  %7.1f%%", 100 * w);
        }
        share[j] = median_of(rec[j], n, get_share, 0);
        printf(" %11.3f %11.3f %6.1f %6.1f %5.0f%%\n", median_of(rec[j], n, get_sync, 0),
               median_of(rec[j], n, get_data_wait, 0), median_of(rec[j], n, get_items, 0), median_of(rec[j], n, get_rings, 0),
               100 * share[j]);
    }
    printf("(core: the least CPU seconds per wall second of any rank during the step; a rank spins while it\n"
           "waits, so ~100%% = a core of its own. Load average (1 min): %.2f at the start, %.2f at the end.)\n",
           load[0], load[1]);
    double least = fmin(share[0], fmin(share[1], share[2]));
    if (least < 0.9)
        printf("NOTE: a rank had only %.0f%% of a core in the median step: other processes shared the cores, so\n"
               "these times are the machine's load as much as the policy's. Run again on a quiet machine.\n",
               100 * least);
    int bal = N_POLICIES - 1;
    printf("targets (balance):\n");
    // the batches are the same, so step i of balance and step i of static can be compared directly
    int faster = 0;
    for (int i = 0; i < n; i++) faster += rec[bal][i].seconds < rec[0][i].seconds;
    double ahead = tps[bal] / tps[0];
    printf("  ahead of static in tokens/s           %6.3fx  %s  (faster on %d of %d batches%s)\n", ahead,
           ahead > 1 ? "ok" : "MISSED", faster, n, fabs(ahead - 1) < 0.02 ? "; within 2%: a tie" : "");
    printf("  every rank waits < %.0f%% of the step     %5.1f%%   %s  (most waiting rank)\n", 100 * WAIT_TARGET,
           100 * wmax[bal], wmax[bal] < WAIT_TARGET ? "ok" : "MISSED");
    int same = 1, first_diff = 0;
    for (int j = 1; j < N_POLICIES; j++)
        for (int i = 0; i < n; i++)
            if (rec[j][i].batch_hash != rec[0][i].batch_hash && same) same = 0, first_diff = i + 1;
    if (same) printf("  same global batches for every policy    yes\n\n");
    else printf("  same global batches for every policy    NO (measured step %d differs): the ratios compare different data\n\n",
                first_diff);

    // ---- table 2: the simulator on the same plans ----
    printf("Table 2: the plans the trainer ran, simulated (cpu profile, docs/hardware.md) vs measured step time\n");
    printf("%-8s %10s %11s %8s %17s %9s %9s %10s %9s\n", "policy", "measured s", "simulated s", "diff", "per step diff",
           "meas vs", "sim vs", "planner s", "sim wait");
    printf("%-8s %10s %11s %8s %17s %9s %9s %10s %9s\n", "", "", "", "", "min .. max", "static", "static",
           "(compute)", "max rank");
    double meas0 = median_of(rec[0], n, get_seconds, 0), sim0 = median_of(rec[0], n, get_sim, 0);
    for (int j = 0; j < N_POLICIES; j++) {
        double meas = median_of(rec[j], n, get_seconds, 0), sim = median_of(rec[j], n, get_sim, 0);
        double lo = INFINITY, hi = -INFINITY;
        for (int i = 0; i < n; i++) lo = fmin(lo, get_sim_diff(&rec[j][i], 0)), hi = fmax(hi, get_sim_diff(&rec[j][i], 0));
        printf("%-8s %10.2f %11.2f %+7.1f%% %+7.1f%% .. %+4.0f%% %8.2fx %8.2fx %10.2f %8.1f%%\n", POLICIES[j], meas, sim,
               100 * (sim / meas - 1), 100 * lo, 100 * hi, meas0 / meas, sim0 / sim, median_of(rec[j], n, get_est, 0),
               100 * median_of(rec[j], n, get_sim_wait, 0));
    }
    printf("(vs static: step-time speedup, static's median step / the policy's; planner s: the plan's makespan\n"
           "under the same cost model, compute only)\n\n");
    printf("bench_train: %.0f s in all (%d steps per policy including the warm-up)\n", seconds, n + 1);
}

int main(int argc, char **argv) {
    blas_core_reexec("bench_train", argv);  // OpenBLAS's fastest kernels for this CPU (nn/blas_core.h)
    Opts o = parse_args(argc, argv);
    if (find_data(&o) != 0) {  // before starting ranks: one clear line instead of one per rank
        fprintf(stderr, "bench_train: %s\n", bs_errmsg());
        return 1;
    }
    if (!comm_launched_by_mpi()) bench_relaunch_under_mpirun("bench_train", LAUNCH_RANKS, argc, argv);

    double t0 = now_seconds(), load[2] = {loadavg(), 0};
    Comm *comm;
    if (comm_mpi_init(&comm, &argc, &argv) != 0) bs_die_errmsg();
    openblas_set_num_threads(1);  // also when someone ran mpirun without OPENBLAS_NUM_THREADS=1
    int lead = comm->rank == 0, R = comm->size;
    int64_t d_cp = (o.context + o.capacity - 1) / o.capacity;
    if (d_cp > R) {  // the static mesh would need more ranks than there are
        if (lead)
            fprintf(stderr,
                    "bench_train: error: static needs d_cp = ceil(context %lld / C %lld) = %lld <= ranks (%d): lower "
                    "--context or raise --capacity\n",
                    (long long)o.context, (long long)o.capacity, (long long)d_cp, R);
        comm_mpi_finalize();
        return 2;
    }
#ifndef __OPTIMIZE__
    if (lead) fprintf(stderr, "bench_train: note: built without optimization (a Debug build): the figures mean little\n");
#endif

    int n_rec = N_POLICIES * o.steps;  // policy j's measured steps are rec[j * steps ..]
    StepRec *rec = calloc((size_t)n_rec, sizeof *rec);
    if (!rec) rank_die(comm, "out of memory");
    // All three trainers live at once and take their steps in turn (step 1 of each, then step 2 of
    // each, ...), the order rotating every step: a change in the machine's load during the run (another
    // process, a thermal limit) then falls on every policy alike instead of on whichever ran last.
    Trainer *t[N_POLICIES];
    for (int j = 0; j < N_POLICIES; j++) t[j] = make_trainer(comm, &o, POLICIES[j]);
    double n_params = (double)t[0]->llama.n_params;
    for (int s = 0; s <= o.steps; s++)
        for (int k = 0; k < N_POLICIES; k++) {
            int j = (k + s) % N_POLICIES;
            run_step(comm, t[j], &o, s, s > 0 ? &rec[(size_t)j * o.steps + (s - 1)] : NULL);
        }
    for (int j = 0; j < N_POLICIES; j++) trainer_free(t[j]), free(t[j]);
    double seconds = now_seconds() - t0;
    load[1] = loadavg();
    if (lead) {
        fprintf(stderr, "bench_train: simulating the %d plans\n", n_rec);
        simulate(&o, R, rec, n_rec);
        report(&o, R, rec, n_params, seconds, load);
    }
    for (int i = 0; i < n_rec; i++) free(rec[i].wait), free(rec[i].wire);
    free(rec);
    comm_mpi_finalize();
    return 0;
}
