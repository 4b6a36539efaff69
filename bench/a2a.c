// bench/a2a.c: one long sequence on 2 processes as a ring of 2 and as an all-to-all (Ulysses) group
// of 2: the measured forward + backward beside the cost model's prediction.
//
// For S = 2C, 4C and 8C tokens of one document of the corpus (the longest; --quick: 2C only), a
// trainer over the 2 ranks (one core and one BLAS thread each) runs a plan of one item over both
// ranks, once as a ring (Item.a2a = 0) and once as an all-to-all group (Item.a2a = 1), the two kinds
// alternating which goes first in every repetition, so a change in the machine's load falls on both
// alike. A figure is the item's forward + backward on the slower rank (the executor's item time,
// from its trace hook: the gradient sync after it is not part of the item), the median over
// --reps repetitions after one warm-up; the core share (CPU seconds per wall second of the slower
// rank, median) says whether the ranks had their cores (well below 1: the figures are not to be
// trusted). Beside it, the cost model's time for the item:
// cost_item_time (ring) and cost_a2a_item_time (all-to-all) with the trainer's cost model: the
// `cpu` profile derived for the model, or the profile given with --cost (`bytescale profile`).
//
// usage: bench_a2a [--quick] [--model NAME] [--capacity N] [--reps N] [--data DIR] [--cost FILE]
//   defaults: model small, C = 1024, 5 repetitions, data data/go-byte (`bytescale prepare`)
// Run alone it starts itself as `mpirun -np 2 --bind-to core bench_a2a ...`. The table goes to stdout
// (rank 0), progress to stderr.
#include <cblas.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bytescale/comm.h"
#include "bytescale/cost.h"
#include "bytescale/error.h"
#include "bytescale/timer.h"
#include "bytescale/train.h"
#include "bench_util.h"
#include "nn/blas_core.h"

enum { MAX_REPS = 64 };

typedef struct {
    int quick, reps;
    int64_t capacity;
    char model[32], data[1024], cost[1024];
} Opts;

static void usage_exit(const char *why) {
    fprintf(stderr, "bench_a2a: %s\nusage: bench_a2a [--quick] [--model NAME] [--capacity N] [--reps N] [--data DIR] "
                    "[--cost FILE]\n", why);
    exit(2);
}

static Opts parse_args(int argc, char **argv) {
    Opts o = {.reps = 5, .capacity = 1024};
    snprintf(o.model, sizeof o.model, "small");
    snprintf(o.data, sizeof o.data, "data/go-byte");
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--quick")) {
            o.quick = 1;
            continue;
        }
        if (!v) usage_exit("a flag without its value, or an unknown flag");
        if (!strcmp(a, "--model")) snprintf(o.model, sizeof o.model, "%s", v);
        else if (!strcmp(a, "--capacity")) o.capacity = atoll(v);
        else if (!strcmp(a, "--reps")) o.reps = atoi(v);
        else if (!strcmp(a, "--data")) snprintf(o.data, sizeof o.data, "%s", v);
        else if (!strcmp(a, "--cost")) snprintf(o.cost, sizeof o.cost, "%s", v);
        else usage_exit("unknown flag");
        i++;
    }
    if (o.capacity < 16 || o.reps < 1 || o.reps > MAX_REPS) usage_exit("--capacity >= 16 and --reps in 1..64");
    return o;
}

static void rank_check(Comm *c, int rc) {
    if (rc == 0) return;
    fprintf(stderr, "bench_a2a: rank %d: %s\n", c->rank, bs_errmsg());
    comm_abort(c, 1);
}

// The executor's trace hook: the last item's seconds on this rank.
static void item_time(void *ctx, const char *name, int32_t item, double t0, double t1) {
    (void)name, (void)item;
    *(double *)ctx = t1 - t0;
}

// One item of S tokens of document doc over ranks 0 and 1; a2a: an all-to-all group, else a ring.
static void make_plan(Plan *p, const Trainer *t, int64_t doc, int64_t S, int a2a, Comm *c) {
    GlobalBatch b;
    rank_check(c, batch_init(&b, 1));
    rank_check(c, batch_push(&b, doc, S, t->data.index.docs[doc].start));
    rank_check(c, plan_init(p, &b, 2, t->capacity, 1, "bench"));
    batch_free(&b);
    Segment seg = {.seq = 0, .start = 0, .len = S};
    int32_t ranks[2] = {0, 1};
    rank_check(c, plan_add_item(p, &seg, 1, ranks, 2, 0) == 0 ? 0 : -1);
    p->items[0].a2a = a2a;
    rank_check(c, plan_finalize(p, NULL));
}

// One repetition of one kind: the slower rank's item seconds; *share: the smaller rank's CPU seconds
// per wall second over the repetition (well below 1: the rank did not have its core).
static double run_once(Trainer *t, Comm *c, int64_t doc, int64_t S, int a2a, double *share) {
    Plan p;
    make_plan(&p, t, doc, S, a2a, c);
    double mine[2] = {0, 0}, both[4];
    t->exec.trace = item_time;
    t->exec.trace_ctx = &mine[0];
    double w0 = now_seconds(), c0 = bench_cpu_seconds(CLOCK_PROCESS_CPUTIME_ID);
    rank_check(c, trainer_grad_plan(t, &p, NULL));
    mine[1] = (bench_cpu_seconds(CLOCK_PROCESS_CPUTIME_ID) - c0) / (now_seconds() - w0);
    t->exec.trace = NULL;
    rank_check(c, comm_allgather(c, mine, both, sizeof mine));
    *share = both[1] < both[3] ? both[1] : both[3];
    return both[0] > both[2] ? both[0] : both[2];
}

int main(int argc, char **argv) {
    blas_core_reexec("bench_a2a", argv);
    Opts o = parse_args(argc, argv);
    if (bench_find_data(o.data, sizeof o.data) != 0) {  // before starting ranks: one clear line
        fprintf(stderr, "bench_a2a: %s\n", bs_errmsg());
        return 1;
    }
    if (!comm_launched_by_mpi()) bench_relaunch_under_mpirun("bench_a2a", "2", argc, argv);
    Comm *c;
    if (comm_mpi_init(&c, &argc, &argv) != 0) bs_die_errmsg();
    openblas_set_num_threads(1);
    if (c->size != 2) rank_check(c, bs_fail("runs on 2 ranks (mpirun -np 2), not %d", c->size));
    TrainConfig cfg = train_defaults();
    snprintf(cfg.model, sizeof cfg.model, "%s", o.model);
    snprintf(cfg.data, sizeof cfg.data, "%s", o.data);
    snprintf(cfg.cost, sizeof cfg.cost, "%s", o.cost);
    cfg.capacity = o.capacity;
    cfg.context = cfg.tokens = 8 * o.capacity;
    cfg.quiet = 1;
    Trainer *t = malloc(sizeof *t);
    if (!t) rank_check(c, bs_fail("out of memory"));
    rank_check(c, trainer_init_comm(t, &cfg, c));
    int64_t doc = 0;
    for (int64_t d = 1; d < t->data.index.n_docs; d++)
        if (t->data.index.docs[d].len > t->data.index.docs[doc].len) doc = d;
    int lead = c->rank == 0;
    if (lead) {
        printf("bench_a2a: model %s, C = %lld, cost model %s, one sequence on 2 ranks (one core each), median of "
               "%d\n\n",
               o.model, (long long)o.capacity, o.cost[0] ? o.cost : "cpu (derived)", o.reps);
        printf("| tokens | ring of 2 (s) | cost model (s) | all-to-all of 2 (s) | cost model (s) | measured a2a / ring "
               "| predicted a2a / ring | core share |\n|---:|---:|---:|---:|---:|---:|---:|---:|\n");
    }
    for (int f = 2; f <= (o.quick ? 2 : 8); f *= 2) {
        int64_t S = f * o.capacity;
        if (S > t->data.index.docs[doc].len)
            rank_check(c, bs_fail("the longest document has fewer than %lld tokens", (long long)S));
        double times[2][MAX_REPS], shares[2 * MAX_REPS];
        for (int r = -1; r < o.reps; r++)
            for (int i = 0; i < 2; i++) {
                int a2a = (i + (r > 0 ? r : 0)) % 2;  // alternating which kind goes first
                double share, s = run_once(t, c, doc, S, a2a, &share);
                if (r >= 0) times[a2a][r] = s, shares[2 * r + i] = share;
            }
        double ring = bench_median(times[0], o.reps), a2a = bench_median(times[1], o.reps);
        double share = bench_median(shares, 2 * o.reps);
        double pr = cost_item_time(&t->cost, &S, 1, 2, 0.0), pa = cost_a2a_item_time(&t->cost, &S, 1, 2, 0.0);
        if (lead) {
            printf("| %lld | %.3f | %.3f | %.3f | %.3f | %.2f | %.2f | %.2f |\n", (long long)S, ring, pr, a2a, pa,
                   a2a / ring, pa / pr, share);
            fflush(stdout);
        }
    }
    trainer_free(t);
    free(t);
    comm_mpi_finalize();
    return 0;
}
