// bench/loader.c: the remote data loader against an SPMD loader, on this machine.
//
// For 2, 4 and 8 training ranks (clients) and 2 data servers, one MPI job each (started by the
// bench itself; more ranks than cores run oversubscribed: their bytes are exact, their times only
// say what a shared core gives), `tiny` trains --steps steps on the Go corpus (data/go-byte), 64K
// tokens per step, context 4K, balance. Per step and client:
//   remote    the bytes the client fetched from the servers for its own chunks (plus one label token
//             per chunk) and the seconds that took in its prefetch thread (StepStats' load figures);
//   SPMD      what a loader in which every rank reads the whole global batch would read: the same
//             step's batch read whole from the local shards by every client, bytes and seconds;
//   exposed   the seconds the step waited for its plan and rows (data_wait) over the step's seconds:
//             the loader time left on the critical path (target under 1%).
// Medians over the steps after the first (the first has nothing to overlap with) and over clients.
//
// Then 3D jobs (tp x pp x hdp training processes and the 2 servers, 16K tokens per step): per step,
// the bytes all processes read for their rows (what the network would carry if every process
// fetched its own), the bytes the servers sent (tp rank 0 of the first and last stages fetches for
// its tp group, docs/loader.md "3D jobs"), their ratio (1/T), and what the middle stages read.
//
// usage: bench_loader [--quick] [--steps N] [--data DIR]
#include <cblas.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bytescale/comm.h"
#include "bytescale/error.h"
#include "bytescale/loader.h"
#include "bytescale/shard.h"
#include "bytescale/timer.h"
#include "bytescale/train.h"
#include "bench_util.h"
#include "nn/blas_core.h"

enum { MAX_STEPS = 64, N_SERVERS = 2 };

// Every client reads the whole batch of the plan in slot `slot` from its own shards: what an SPMD
// loader reads per step. Bytes and seconds.
static void spmd_read(const Dataset *ds, const Plan *p, double *bytes, double *seconds) {
    double t0 = now_seconds(), b = 0;
    int64_t cap = 0;
    uint32_t *buf = NULL;
    for (int64_t i = 0; i < p->batch.n; i++) {
        const Sequence *s = &p->batch.seqs[i];
        if (s->len + 1 > cap) {
            cap = s->len + 1;
            buf = realloc(buf, sizeof(uint32_t) * (size_t)cap);
            if (!buf) bs_die("out of memory");
        }
        int64_t got;
        if (dataset_read_span(ds, s->id, s->src, s->len + 1, buf, &got) != 0) bs_die_errmsg();
        b += (double)got * sizeof(uint32_t);
    }
    free(buf);
    *bytes = b, *seconds = now_seconds() - t0;
}

// A 3D job's row (rank 0): per step the bytes every process read, the bytes the servers sent, and
// the middle stages' bytes, medians over the steps after the first; the exposed loader time.
static void row_3d(const TrainConfig *c, int n_procs, const double *read, const double *fetched, const double *middle,
                   const double *exposed, int n) {
    double r = bench_median((double *)read, n), f = bench_median((double *)fetched, n);
    printf("| %d x %d x %d | %d + %d | %.1f | %.1f | %.3f | %.1f | %.2f%% |\n", c->tp, c->pp, n_procs / (c->tp * c->pp),
           n_procs, N_SERVERS, r / 1024, f / 1024, f / r, bench_median((double *)middle, n) / 1024,
           100 * bench_median((double *)exposed, n));
    fflush(stdout);
}

// One 3D job (tp, pp > 1): the processes train, rank 0 prints the row.
static int part_3d(Comm *comm, CommRoles *roles, TrainConfig *c, int steps) {
    Trainer *t = malloc(sizeof *t);
    if (!t || trainer_init_roles(t, c, comm, roles) != 0) {
        fprintf(stderr, "bench_loader: rank %d: %s\n", comm->rank, bs_errmsg());
        comm_abort(comm, 1);
    }
    double read[MAX_STEPS], fetched[MAX_STEPS], middle[MAX_STEPS], exposed[MAX_STEPS];
    int n = 0;
    for (int k = 0; k < steps; k++) {
        StepStats st;
        if (trainer_step(t, &st) != 0) {
            fprintf(stderr, "bench_loader: rank %d: %s\n", comm->rank, bs_errmsg());
            comm_abort(comm, 1);
        }
        if (k == 0) continue;  // nothing to overlap the first reading with
        read[n] = fetched[n] = middle[n] = 0;
        for (int r = 0; r < st.n_ranks; r++) {
            const RankTimes *x = &st.ranks[r];
            read[n] += x->load_bytes, fetched[n] += x->fetch_bytes;
            if (x->stage > 0 && x->stage < c->pp - 1) middle[n] += x->load_bytes;
        }
        exposed[n++] = st.data_wait / st.seconds;
        if (comm->rank == 0) fprintf(stderr, "\rbench_loader: tp %d pp %d, step %d of %d  ", c->tp, c->pp, k + 1, steps);
    }
    if (comm->rank == 0) fprintf(stderr, "\n");
    if (comm->rank == 0) row_3d(c, comm->size, read, fetched, middle, exposed, n);
    trainer_free(t);
    free(t);
    comm_mpi_finalize();
    return 0;
}

// One job: clients train, the last N_SERVERS ranks serve. Rank 0 prints the table row.
static int part(int argc, char **argv, const char *data, int steps, int tp, int pp) {
    Comm *comm;
    if (comm_mpi_init(&comm, &argc, &argv) != 0) bs_die_errmsg();
    int world = comm->size;
    int role = comm->rank >= world - N_SERVERS ? COMM_ROLE_SERVER : COMM_ROLE_CLIENT;
    CommRoles roles;
    if (comm_mpi_split_roles(comm, role, &roles) != 0) bs_die_errmsg();
    if (role == COMM_ROLE_SERVER) {
        LoaderServeConfig sc = {.dir = data, .tokenizer = "byte", .cache_bytes = 256ll << 20};
        int rc = loader_serve(&sc, &roles);
        comm_mpi_finalize();
        return rc == 0 ? 0 : 1;
    }
    openblas_set_num_threads(1);
    TrainConfig c = train_defaults();
    snprintf(c.data, sizeof c.data, "%s", data);
    snprintf(c.model, sizeof c.model, "tiny");
    snprintf(c.policy, sizeof c.policy, "balance");
    c.context = 4096, c.tokens = 65536, c.steps = steps, c.warmup = 1, c.ckpt_every = 0;
    if (tp * pp > 1) {
        c.tp = tp, c.pp = pp, c.tokens = 16384;
        if (pp > 2) snprintf(c.model, sizeof c.model, "small");  // tiny has 2 layers
        return part_3d(comm, &roles, &c, steps);
    }
    Trainer *t = malloc(sizeof *t);
    if (!t || trainer_init_roles(t, &c, comm, &roles) != 0) {
        fprintf(stderr, "bench_loader: rank %d: %s\n", comm->rank, bs_errmsg());
        comm_abort(comm, 1);
    }
    Dataset ds;  // the SPMD comparison reads the whole batch from local shards
    if (dataset_open(&ds, data) != 0) {
        fprintf(stderr, "bench_loader: rank %d: %s\n", comm->rank, bs_errmsg());
        comm_abort(comm, 1);
    }
    int C = comm->size, n = 0;
    double *rb = calloc((size_t)steps * C, sizeof(double)), *rs = calloc((size_t)steps * C, sizeof(double));
    double *sb = calloc((size_t)steps * C, sizeof(double)), *ss = calloc((size_t)steps * C, sizeof(double));
    double *exposed = calloc((size_t)steps, sizeof(double));
    if (!rb || !rs || !sb || !ss || !exposed) bs_die("out of memory");
    for (int k = 0; k < steps; k++) {
        StepStats st;
        if (trainer_step(t, &st) != 0) {
            fprintf(stderr, "bench_loader: rank %d: %s\n", comm->rank, bs_errmsg());
            comm_abort(comm, 1);
        }
        double mine[2];
        spmd_read(&ds, &t->plans[t->step % 2], &mine[0], &mine[1]);
        double *all = malloc(sizeof(double) * 2 * (size_t)C);
        if (!all || comm_allgather(comm, mine, all, sizeof mine) != 0) bs_die("gathering the SPMD figures");
        if (k > 0) {  // the first step has no previous step to overlap its reading with
            for (int r = 0; r < C; r++) {
                rb[n * C + r] = st.ranks[r].load_bytes, rs[n * C + r] = st.ranks[r].load_seconds;
                sb[n * C + r] = all[2 * r], ss[n * C + r] = all[2 * r + 1];
            }
            exposed[n] = st.data_wait / st.seconds;
            n++;
        }
        free(all);
        if (comm->rank == 0) fprintf(stderr, "\rbench_loader: %d clients, step %d of %d  ", C, k + 1, steps);
    }
    if (comm->rank == 0) {
        fprintf(stderr, "\n");
        double r_b = bench_median(rb, n * C), r_s = bench_median(rs, n * C);
        double s_b = bench_median(sb, n * C), s_s = bench_median(ss, n * C);
        double worst = 0;
        for (int i = 0; i < n; i++) worst = fmax(worst, exposed[i]);
        double ex = bench_median(exposed, n);
        printf("| %d | %d | %.1f | %.1f | %.3f | %.2f | %.3f | %.2f%% (largest %.2f%%) |\n", C, N_SERVERS, r_b / 1024,
               s_b / 1024, r_b / s_b, 1e3 * r_s, 1e3 * s_s, 100 * ex, 100 * worst);
        fflush(stdout);
    }
    free(rb), free(rs), free(sb), free(ss), free(exposed);
    dataset_close(&ds);
    trainer_free(t);
    free(t);
    comm_mpi_finalize();
    return 0;
}

int main(int argc, char **argv) {
    blas_core_reexec("bench_loader", argv);  // OpenBLAS's fastest kernels for this CPU (nn/blas_core.h)
    const char *data = "data/go-byte";
    int steps = 8, quick = 0, part_clients = 0, tp = 1, pp = 1;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--quick")) quick = 1, steps = 3;
        else if (!strcmp(a, "--steps") && v) steps = atoi(v), i++;
        else if (!strcmp(a, "--data") && v) data = v, i++;
        else if (!strcmp(a, "--part") && v) part_clients = atoi(v), i++;
        else if (!strcmp(a, "--tp") && v) tp = atoi(v), i++;
        else if (!strcmp(a, "--pp") && v) pp = atoi(v), i++;
        else bs_die("unknown argument '%s'; usage: bench_loader [--quick] [--steps N] [--data DIR]", a);
    }
    if (steps < 2 || steps > MAX_STEPS) bs_die("--steps %d: want 2 .. %d", steps, MAX_STEPS);
    if (part_clients) return part(argc, argv, data, steps, tp, pp);

    char index[4200];
    snprintf(index, sizeof index, "%s/index.bin", data);
    if (access(index, R_OK) != 0)
        bs_die("bench_loader: no prepared dataset in %s: `build/bytescale prepare` writes data/go-byte", data);
    printf("## Remote data loader vs SPMD loader: model tiny, 64K tokens per step, context 4K, balance, %d data "
           "servers, %d steps\n\n",
           N_SERVERS, steps);
    printf("Per client and step, medians over the steps after the first. Jobs of more ranks than this machine's cores "
           "run oversubscribed: their bytes are exact, their seconds are a shared core's.\n\n");
    printf("| clients | servers | remote KiB read | SPMD KiB read | remote / SPMD | remote load ms | SPMD read ms | "
           "exposed loader time / step |\n|---:|---:|---:|---:|---:|---:|---:|---:|\n");
    const int sizes[] = {2, 4, 8};
    for (int i = 0; i < (quick ? 1 : 3); i++) {
        char clients[16], steps_s[16];
        snprintf(clients, sizeof clients, "%d", sizes[i]);
        snprintf(steps_s, sizeof steps_s, "%d", steps);
        char *args[] = {"--part", clients, "--steps", steps_s, "--data", (char *)data, NULL};
        int np = sizes[i] + N_SERVERS;
        if (bench_run_self_under_mpirun(np, np > 2, args) != 0) bs_die("bench_loader: the job of %d clients failed", sizes[i]);
    }
    printf("\n## Data servers in 3D jobs: model tiny (small for pp 3), 16K tokens per step, context 4K, balance, %d data "
           "servers, %d steps\n\n",
           N_SERVERS, steps);
    printf("Per step, medians over the steps after the first, summed over the training processes. *read*: the token "
           "bytes the processes read for their rows (what the servers would send if every process fetched its own); "
           "*from the servers*: what they sent (tp rank 0 of the first and the last stage fetches for its tp "
           "group).\n\n");
    printf("| tp x pp x hdp | processes + servers | KiB read | KiB from the servers | servers / read | middle stages KiB | "
           "exposed loader time / step |\n|---|---:|---:|---:|---:|---:|---:|\n");
    const int layouts[][3] = {{2, 2, 1}, {2, 1, 2}, {1, 2, 2}, {2, 2, 2}, {1, 3, 1}};
    for (int i = 0; i < (quick ? 1 : 5); i++) {
        char procs[16], tps[16], pps[16], steps_s[16];
        int n = layouts[i][0] * layouts[i][1] * layouts[i][2];
        snprintf(procs, sizeof procs, "%d", n);
        snprintf(tps, sizeof tps, "%d", layouts[i][0]);
        snprintf(pps, sizeof pps, "%d", layouts[i][1]);
        snprintf(steps_s, sizeof steps_s, "%d", steps);
        char *args[] = {"--part", procs, "--tp", tps, "--pp", pps, "--steps", steps_s, "--data", (char *)data, NULL};
        if (bench_run_self_under_mpirun(n + N_SERVERS, 1, args) != 0) bs_die("bench_loader: the 3D job of %d processes failed", n);
    }
    return 0;
}
