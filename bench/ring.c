// bench/ring.c: does ring attention hide its messages behind its compute?
//
// The target: at D = 2, the ring's forward + backward within 10% of the same attention
// work computed without communication. For one causal sequence of S tokens (4K..32K) split over the
// ranks of the job (D = ranks, 2 by default) with the 2D-chunk layout (microbatch.h), every rank
// holds random q, k, v, dout for its rows and times, per repetition:
//   RING   ring_attn_ops: forward (the K/V ring merged with the online softmax), then delta
//          (attn_backward_delta) and backward (the K/V ring + the dK/dV ring), as one layer runs them.
//   LOCAL  the same block work with no messages: the rank's queries against every member's K/V (a
//          local copy of the same random values), in the ring's order and with the ring's query
//          slices: attn_forward + attn_merge, delta, then attn_backward for every key block.
// Each repetition starts from a barrier; a figure is the slowest rank's time (a ring ends when its
// slowest member does), and the table shows the median over the repetitions, after one warm-up.
// RING and LOCAL run back to back in every repetition, alternating which goes first, and RING/LOCAL
// is the median of the per-repetition ratios: a pair sees the same machine, so another process
// taking a core for a while moves both of its times alike. Both ranks compute at once in both
// variants, so they share the memory system alike.
//
// Beside the times: the ring's own split (RingStats: block compute, time blocked in waits, the
// rest: packing, summing partials, progress calls), the bytes each rank sends per layer, what those
// bytes cost with nothing else running (the same message size exchanged between the ranks alone,
// median of 9) and how much of that the overlap hid: hidden = 1 - wait / transfer. Attention FLOPs
// as in bench/kernels.c: forward 4 * head_dim * n_heads per visible pair, backward 10 * head_dim *
// n_heads, pairs counted exactly by attn_visible_pairs.
//
// Usage: bench_ring [--quick] [--reps N] [--slice-rows N] [--model NAME] [--max-tokens N]
//   --quick          4K and 8K tokens only
//   --reps N         timed repetitions per row (default 5; the median is shown)
//   --slice-rows N   query rows per kernel call between progress calls (default: the ring's own)
//   --model NAME     one model's attention shape (default: "small", then "tiny")
//   --max-tokens N   longest sequence (default 32768)
// Not started by an MPI launcher, it runs itself as `mpirun -np 2 --bind-to core <itself> <args>`
// (the environment passes through: as root set OMPI_ALLOW_RUN_AS_ROOT=1 and
// OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1). Rank 0 prints the tables on stdout, progress on stderr.
// One BLAS thread per rank: the bench sets it itself.
#include <cblas.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "bytescale/attention.h"
#include "bytescale/comm.h"
#include "bytescale/error.h"
#include "bytescale/llama.h"
#include "bytescale/microbatch.h"
#include "bytescale/model.h"
#include "bytescale/plan.h"
#include "bytescale/progress.h"
#include "bytescale/ring_attn.h"
#include "bytescale/rng.h"
#include "bytescale/timer.h"
#include "bench_util.h"
#include "nn/blas_core.h"

static Comm *world;
static Progress progress;
static int64_t reps_done;

// A failed library call on one rank ends every rank (the others would wait for it forever).
static void check(int rc) {
    if (rc == 0) return;
    fprintf(stderr, "bench_ring: rank %d: %s\n", world ? world->rank : -1, bs_errmsg());
    if (world) comm_abort(world, 1);
    exit(1);
}

static void *xmalloc(size_t bytes) {
    void *p = bs_malloc(bytes);
    if (!p) check(-1);
    return p;
}

static float *rand_floats(Rng *rng, int64_t n) {
    float *x = xmalloc((size_t)(n > 0 ? n : 1) * sizeof(float));
    for (int64_t i = 0; i < n; i++) x[i] = (float)(rng_uniform(rng) * 2 - 1);
    return x;
}

// ---- one case: a sequence of S tokens over the D ranks, one attention shape ----------------------

typedef struct {
    AttnShape s;
    int D, me, S, slice;
    GlobalBatch batch;
    Plan plan;
    RingAttn ring;
    int32_t **pos, **seg;   // (D,) every member's layout (mb_layout)
    AttnRows *rows;         // (D,) views of pos/seg; rows[me] are this rank's
    float **k, **v;         // (D,) every member's K, V: the ring uses k[me], v[me], LOCAL all of them
    float *q, *dout;        // this rank's queries and output gradient
    float *out, *lse, *delta, *dq, *dk, *dv;  // results (both variants write them; only times matter)
    float **ldk, **ldv;     // (D,) LOCAL: this rank's share of every block's dK, dV
    float *part_out, *part_lse;  // LOCAL: one block's result before merging
    int64_t pairs;          // visible pairs of this rank's queries against all keys
} Case;

static void case_init(Case *c, AttnShape s, int S, int slice) {
    memset(c, 0, sizeof *c);
    c->s = s;
    c->S = S;
    c->D = world->size;
    check(batch_init(&c->batch, 1));
    check(batch_push(&c->batch, 0, S, -1));
    check(plan_init(&c->plan, &c->batch, world->size, S, 1, "bench"));
    int32_t *ranks = xmalloc(sizeof(int32_t) * (size_t)c->D);
    for (int i = 0; i < c->D; i++) ranks[i] = i;
    Segment seg = {.seq = 0, .start = 0, .len = S};
    if (plan_add_item(&c->plan, &seg, 1, ranks, c->D, 0) != 0) check(-1);
    free(ranks);
    check(plan_finalize(&c->plan, NULL));
    ring_attn_init(&c->ring, world, s);
    if (slice > 0) c->ring.slice_rows = slice;
    c->slice = c->ring.slice_rows;
    check(ring_attn_prepare(&c->ring, &c->plan, 0));
    c->me = c->ring.me;

    int D = c->D;
    int64_t Q = (int64_t)s.n_heads * s.head_dim, KV = (int64_t)s.n_kv_heads * s.head_dim;
    c->pos = xmalloc(sizeof(int32_t *) * (size_t)D), c->seg = xmalloc(sizeof(int32_t *) * (size_t)D);
    c->rows = xmalloc(sizeof(AttnRows) * (size_t)D);
    c->k = xmalloc(sizeof(float *) * (size_t)D), c->v = xmalloc(sizeof(float *) * (size_t)D);
    c->ldk = xmalloc(sizeof(float *) * (size_t)D), c->ldv = xmalloc(sizeof(float *) * (size_t)D);
    for (int j = 0; j < D; j++) {
        int64_t n = mb_member_rows(&c->plan, 0, j);
        c->pos[j] = xmalloc(sizeof(int32_t) * (size_t)(n > 0 ? n : 1));
        c->seg[j] = xmalloc(sizeof(int32_t) * (size_t)(n > 0 ? n : 1));
        mb_layout(&c->plan, 0, j, c->pos[j], c->seg[j]);
        c->rows[j] = (AttnRows){.pos = c->pos[j], .seg = c->seg[j], .n = (int)n};
        // member j's K/V from a seed of its own: every rank makes the same values for it
        Rng rng;
        rng_seed(&rng, 1000003u * (uint64_t)S + (uint64_t)j);
        c->k[j] = rand_floats(&rng, n * KV);
        c->v[j] = rand_floats(&rng, n * KV);
        c->ldk[j] = rand_floats(&rng, n * KV);
        c->ldv[j] = rand_floats(&rng, n * KV);
    }
    int64_t n = c->rows[c->me].n;
    Rng rng;
    rng_seed(&rng, 7777u * (uint64_t)S + (uint64_t)c->me);
    c->q = rand_floats(&rng, n * Q), c->dout = rand_floats(&rng, n * Q);
    c->out = rand_floats(&rng, n * Q), c->dq = rand_floats(&rng, n * Q);
    c->lse = rand_floats(&rng, n * s.n_heads), c->delta = rand_floats(&rng, n * s.n_heads);
    c->dk = rand_floats(&rng, n * KV), c->dv = rand_floats(&rng, n * KV);
    int64_t sl = c->slice < n ? c->slice : n;
    c->part_out = rand_floats(&rng, sl * Q), c->part_lse = rand_floats(&rng, sl * s.n_heads);
    for (int j = 0; j < D; j++) c->pairs += attn_visible_pairs(c->rows[c->me], c->rows[j]);
}

static void case_free(Case *c) {
    for (int j = 0; j < c->D; j++) {
        free(c->pos[j]), free(c->seg[j]), free(c->k[j]), free(c->v[j]), free(c->ldk[j]), free(c->ldv[j]);
    }
    free(c->pos), free(c->seg), free(c->rows), free(c->k), free(c->v), free(c->ldk), free(c->ldv);
    free(c->q), free(c->dout), free(c->out), free(c->lse), free(c->delta), free(c->dq), free(c->dk), free(c->dv);
    free(c->part_out), free(c->part_lse);
    ring_attn_free(&c->ring);
    plan_free(&c->plan);
    batch_free(&c->batch);
}

// ---- LOCAL: the ring's block work, in its order and slices, without messages -------------------

static void local_forward(Case *c) {
    AttnShape s = c->s;
    int D = c->D, H = s.n_heads;
    int64_t Q = (int64_t)s.n_heads * s.head_dim;
    AttnRows mine = c->rows[c->me];
    for (int t = 0; t < D; t++) {
        int j = (c->me - t + D) % D;
        AttnRows kr = c->rows[j];
        for (int qs = 0; qs < mine.n && kr.n > 0; qs += c->slice) {
            int nq = mine.n - qs < c->slice ? mine.n - qs : c->slice;
            AttnRows qr = {.pos = mine.pos + qs, .seg = mine.seg + qs, .n = nq};
            if (t == 0) {
                attn_forward(c->out + qs * Q, c->lse + (int64_t)qs * H, c->q + qs * Q, qr, c->k[j], c->v[j], kr, s);
            } else {
                attn_forward(c->part_out, c->part_lse, c->q + qs * Q, qr, c->k[j], c->v[j], kr, s);
                attn_merge(c->out + qs * Q, c->lse + (int64_t)qs * H, c->part_out, c->part_lse, nq, s);
            }
        }
    }
}

static void local_backward(Case *c) {
    AttnShape s = c->s;
    int D = c->D, H = s.n_heads;
    int64_t Q = (int64_t)s.n_heads * s.head_dim;
    AttnRows mine = c->rows[c->me];
    attn_backward_delta(c->delta, c->dout, c->out, mine.n, s);
    for (int t = 0; t < D; t++) {
        int j = (c->me - t + D) % D;
        AttnRows kr = c->rows[j];
        for (int qs = 0; qs < mine.n && kr.n > 0; qs += c->slice) {
            int nq = mine.n - qs < c->slice ? mine.n - qs : c->slice;
            AttnRows qr = {.pos = mine.pos + qs, .seg = mine.seg + qs, .n = nq};
            attn_backward(c->dq + qs * Q, c->ldk[j], c->ldv[j], c->dout + qs * Q, c->lse + (int64_t)qs * H,
                          c->delta + (int64_t)qs * H, c->q + qs * Q, qr, c->k[j], c->v[j], kr, s);
        }
    }
}

// ---- one repetition -----------------------------------------------------------------------------
// What each rank measures in one repetition; the slowest rank's value of each is kept.
// The ring's split (compute, waits) is the slowest rank's own, so that it adds up to its total.
enum {
    M_RING_FWD, M_RING_BWD, M_RING, M_COMPUTE, M_WAIT_FWD, M_WAIT_BWD,  // the ring's; split of the slowest
    M_LOCAL_FWD, M_LOCAL_BWD, M_LOCAL,
    N_MEASURES,
    M_OTHER = N_MEASURES, M_RATIO, N_DERIVED  // per repetition: the slowest ring rank's rest, RING / LOCAL
};

static void zero(float *x, int64_t n) { memset(x, 0, (size_t)n * sizeof(float)); }

static void run_ring(Case *c, double *m) {
    AttnShape s = c->s;
    AttnRows mine = c->rows[c->me];
    int64_t Q = (int64_t)s.n_heads * s.head_dim, KV = (int64_t)s.n_kv_heads * s.head_dim;
    AttnOps ops = ring_attn_ops(&c->ring);
    zero(c->dq, mine.n * Q), zero(c->dk, mine.n * KV), zero(c->dv, mine.n * KV);
    memset(&c->ring.stats, 0, sizeof c->ring.stats);
    check(comm_barrier(world));
    double t0 = now_seconds();
    check(ops.forward(ops.ctx, 0, c->out, c->lse, c->q, c->k[c->me], c->v[c->me], mine, s));
    double t1 = now_seconds(), wait_fwd = c->ring.stats.wait;
    attn_backward_delta(c->delta, c->dout, c->out, mine.n, s);
    check(ops.backward(ops.ctx, 0, c->dq, c->dk, c->dv, c->dout, c->lse, c->delta, c->q, c->k[c->me], c->v[c->me],
                       mine, s));
    double t2 = now_seconds();
    m[M_RING_FWD] = t1 - t0, m[M_RING_BWD] = t2 - t1, m[M_RING] = t2 - t0;
    m[M_COMPUTE] = c->ring.stats.compute;
    m[M_WAIT_FWD] = wait_fwd, m[M_WAIT_BWD] = c->ring.stats.wait - wait_fwd;
}

static void run_local(Case *c, double *m) {
    AttnShape s = c->s;
    AttnRows mine = c->rows[c->me];
    int64_t Q = (int64_t)s.n_heads * s.head_dim, KV = (int64_t)s.n_kv_heads * s.head_dim;
    zero(c->dq, mine.n * Q);
    for (int j = 0; j < c->D; j++) zero(c->ldk[j], c->rows[j].n * KV), zero(c->ldv[j], c->rows[j].n * KV);
    check(comm_barrier(world));
    double t0 = now_seconds();
    local_forward(c);
    double t1 = now_seconds();
    local_backward(c);
    double t2 = now_seconds();
    m[M_LOCAL_FWD] = t1 - t0, m[M_LOCAL_BWD] = t2 - t1, m[M_LOCAL] = t2 - t0;
}

// The time of one exchange of `bytes` with the ring neighbours and nothing else running (both ranks
// send and receive at once, as a ring step does): the median of 9 after one warm-up.
static double exchange_seconds(size_t bytes) {
    char *sbuf = xmalloc(bytes > 0 ? bytes : 1), *rbuf = xmalloc(bytes > 0 ? bytes : 1);
    memset(sbuf, 1, bytes), memset(rbuf, 0, bytes);
    int D = world->size, me = world->rank;
    double t[10];
    for (int i = 0; i < 10; i++) {
        CommReq reqs[2] = {{0}};
        check(comm_barrier(world));
        double t0 = now_seconds();
        check(comm_irecv(world, rbuf, bytes, (me + D - 1) % D, 7, &reqs[0]));
        check(comm_isend(world, sbuf, bytes, (me + 1) % D, 7, &reqs[1]));
        check(comm_wait(world, &reqs[0]));
        check(comm_wait(world, &reqs[1]));
        t[i] = now_seconds() - t0;
    }
    double all[2 * 256], worst[9];
    if (D > 256) check(bs_fail("at most 256 ranks"));
    for (int i = 1; i < 10; i++) {
        check(comm_allgather(world, &t[i], all, sizeof(double)));
        worst[i - 1] = 0;
        for (int r = 0; r < D; r++) worst[i - 1] = all[r] > worst[i - 1] ? all[r] : worst[i - 1];
    }
    free(sbuf), free(rbuf);
    return bench_median(worst, 9);
}

// ---- the report ---------------------------------------------------------------------------------

typedef struct {
    int S, rows, slice;           // tokens in the sequence, the most rows a rank holds, rows per call
    double gflop;                 // attention FLOPs of the whole sequence (all ranks), forward + backward
    double med[N_DERIVED];        // medians over the repetitions of the slowest rank's figures
    double bytes_sent;            // per rank and layer (the most any rank sent)
    int msgs;                     // messages a rank sends per layer
    double xchg;                  // seconds of one exchange of a block alone
    size_t block_bytes;
} Row;

static void bench_case(AttnShape s, int S, int slice, int reps, Row *row) {
    Case c;
    case_init(&c, s, S, slice);
    int D = c.D;
    double *m = xmalloc(sizeof(double) * (size_t)reps * N_DERIVED);
    double mine[N_MEASURES], *all = xmalloc(sizeof(double) * (size_t)D * N_MEASURES);
    char note[64];
    for (int rep = -1; rep < reps; rep++) {  // rep -1: the warm-up
        if (rep % 2 == 0) {
            run_ring(&c, mine);
            run_local(&c, mine);
        } else {
            run_local(&c, mine);
            run_ring(&c, mine);
        }
        check(comm_allgather(world, mine, all, sizeof mine));
        if (rep >= 0) {
            int slowest = 0;
            for (int r = 1; r < D; r++)
                if (all[r * N_MEASURES + M_RING] > all[slowest * N_MEASURES + M_RING]) slowest = r;
            for (int i = 0; i < N_MEASURES; i++) {
                double w = 0;
                for (int r = 0; r < D; r++) w = all[r * N_MEASURES + i] > w ? all[r * N_MEASURES + i] : w;
                if (i == M_COMPUTE || i == M_WAIT_FWD || i == M_WAIT_BWD) w = all[slowest * N_MEASURES + i];
                m[rep * N_DERIVED + i] = w;
            }
            double *x = &m[rep * N_DERIVED];
            x[M_OTHER] = x[M_RING] - x[M_COMPUTE] - x[M_WAIT_FWD] - x[M_WAIT_BWD];
            x[M_RATIO] = x[M_RING] / x[M_LOCAL];
        }
        snprintf(note, sizeof note, "hd %d, %dK tokens: ring %.2f s, local %.2f s", s.head_dim, S / 1024,
                 mine[M_RING], mine[M_LOCAL]);
        progress_update(&progress, ++reps_done, note);
    }
    double *col = xmalloc(sizeof(double) * (size_t)reps);
    for (int i = 0; i < N_DERIVED; i++) {
        for (int rep = 0; rep < reps; rep++) col[rep] = m[rep * N_DERIVED + i];
        row->med[i] = bench_median(col, reps);
    }
    // bytes: the last repetition's (every repetition sends the same); the most any rank sent
    double b = c.ring.stats.bytes_sent, ball[256];
    check(comm_allgather(world, &b, ball, sizeof b));
    row->bytes_sent = 0;
    for (int r = 0; r < D; r++) row->bytes_sent = ball[r] > row->bytes_sent ? ball[r] : row->bytes_sent;
    row->msgs = 2 * (D - 1) + D;
    row->S = S;
    row->rows = c.ring.max_rows;
    row->slice = c.slice;
    row->block_bytes = (size_t)c.ring.max_rows * 2 * (size_t)s.n_kv_heads * (size_t)s.head_dim * sizeof(float);
    row->xchg = exchange_seconds(row->block_bytes);
    int64_t pairs = c.pairs, pall[256];
    check(comm_allgather(world, &pairs, pall, sizeof pairs));
    double total = 0;
    for (int r = 0; r < D; r++) total += (double)pall[r];
    row->gflop = 14.0 * s.head_dim * s.n_heads * total / 1e9;
    free(col), free(m), free(all);
    case_free(&c);
}

static void print_rows(const ModelConfig *mc, const Row *rows, int n, int D, int reps) {
    printf("== ring attention at D = %d vs the same block work without messages: model \"%s\" ==\n", D, mc->name);
    printf("   (%d query heads, %d K/V heads, head_dim %d; one causal sequence; %d query rows per kernel call;\n"
           "    seconds of forward + backward of one layer, the slowest rank, median of %d)\n",
           mc->n_heads, mc->n_kv_heads, mc->head_dim, rows[0].slice, reps);
    printf("%6s %6s %8s | %8s %8s %8s | %8s %8s %8s | %10s %6s %4s | %9s %9s\n", "tokens", "rows", "GFLOP", "LOCAL fwd",
           "bwd", "total", "RING fwd", "bwd", "total", "RING/LOCAL", "target", "", "GF/s LOCAL", "RING");
    for (int i = 0; i < n; i++) {
        const Row *r = &rows[i];
        double ratio = r->med[M_RATIO];
        printf("%6d %6d %8.1f | %8.3f %8.3f %8.3f | %8.3f %8.3f %8.3f | %10.3f %6s %4s | %9.1f %9.1f\n", r->S,
               r->rows, r->gflop, r->med[M_LOCAL_FWD], r->med[M_LOCAL_BWD], r->med[M_LOCAL], r->med[M_RING_FWD],
               r->med[M_RING_BWD], r->med[M_RING], ratio, "<=1.10", ratio <= 1.10 ? "ok" : "MISS",
               r->gflop / D / r->med[M_LOCAL], r->gflop / D / r->med[M_RING]);
    }
    printf("\n%6s | %8s %8s %8s %8s | %8s %4s %8s %8s %10s %8s %7s\n", "tokens", "compute", "wait fwd", "bwd",
           "other", "MB/layer", "msgs", "block MB", "p2p GB/s", "transfer s", "wait s", "hidden");
    for (int i = 0; i < n; i++) {
        const Row *r = &rows[i];
        double rate = (double)r->block_bytes / r->xchg;  // bytes per second, one direction
        double transfer = r->bytes_sent / rate, wait = r->med[M_WAIT_FWD] + r->med[M_WAIT_BWD];
        printf("%6d | %8.3f %8.4f %8.4f %8.4f | %8.1f %4d %8.2f %8.2f %10.4f %8.4f %6.0f%%\n", r->S, r->med[M_COMPUTE],
               r->med[M_WAIT_FWD], r->med[M_WAIT_BWD], r->med[M_OTHER], r->bytes_sent / 1e6,
               r->msgs, (double)r->block_bytes / 1e6, rate / 1e9, transfer, wait, 100 * (1 - wait / transfer));
    }
    printf("\n");
}

// ---- main ---------------------------------------------------------------------------------------

int main(int argc, char **argv) {
    blas_core_reexec("bench_ring", argv);  // OpenBLAS's fastest kernels for this CPU (nn/blas_core.h)
    int quick = 0, reps = 5, slice = 0, max_tokens = 32768;
    const char *model = NULL;
    for (int i = 1; i < argc; i++) {
        char *end = NULL;
        if (strcmp(argv[i], "--quick") == 0) {
            quick = 1;
        } else if (strcmp(argv[i], "--reps") == 0 && i + 1 < argc) {
            reps = (int)strtol(argv[++i], &end, 10);
            if (*end || reps < 1 || reps > 100) bs_die("--reps %s: want a number in [1, 100]", argv[i]);
        } else if (strcmp(argv[i], "--slice-rows") == 0 && i + 1 < argc) {
            slice = (int)strtol(argv[++i], &end, 10);
            if (*end || slice < 1 || slice > (1 << 20))
                bs_die("--slice-rows %s: want a number in [1, 1048576]", argv[i]);
        } else if (strcmp(argv[i], "--max-tokens") == 0 && i + 1 < argc) {
            max_tokens = (int)strtol(argv[++i], &end, 10);
            if (*end || max_tokens < 1024 || max_tokens > (1 << 20))
                bs_die("--max-tokens %s: want a number in [1024, 1048576]", argv[i]);
        } else if (strcmp(argv[i], "--model") == 0 && i + 1 < argc) {
            model = argv[++i];
            if (!model_find(model)) bs_die_errmsg();
        } else {
            bs_die("unknown argument '%s'; usage: bench_ring [--quick] [--reps N] [--slice-rows N] [--model NAME] "
                   "[--max-tokens N]",
                   argv[i]);
        }
    }
    if (!comm_launched_by_mpi()) bench_relaunch_under_mpirun("bench_ring", "2", argc, argv);
    openblas_set_num_threads(1);
    check(comm_mpi_init(&world, &argc, &argv));
    if (world->size < 2) {
        fprintf(stderr, "bench_ring: a ring needs at least 2 ranks; run it as mpirun -np 2 --bind-to core %s\n",
                argv[0]);
        comm_abort(world, 1);
    }
    int D = world->size, root = world->rank == 0;
#ifndef __OPTIMIZE__
    if (root)
        fprintf(stderr, "bench_ring: note: built without optimization (a Debug build): the figures mean little\n");
#endif
    if (quick) max_tokens = max_tokens < 8192 ? max_tokens : 8192;
    const char *models[2] = {"small", "tiny"};
    int n_models = 2;
    if (model) models[0] = model, n_models = 1;
    int sizes[16], n_sizes = 0;
    for (int S = 4096; S <= max_tokens && n_sizes < 16; S *= 2) sizes[n_sizes++] = S;
    if (n_sizes == 0) sizes[n_sizes++] = max_tokens;

    progress_start(&progress, "bench_ring", (int64_t)n_models * n_sizes * (reps + 1));
    if (!root) progress.quiet = 1;
    double wall0 = now_seconds(), cpu0 = bench_cpu_seconds(CLOCK_THREAD_CPUTIME_ID);
    Row rows[2][16];
    for (int mi = 0; mi < n_models; mi++) {
        const ModelConfig *mc = model_find(models[mi]);
        if (!mc) check(-1);
        AttnShape s = {mc->n_heads, mc->n_kv_heads, mc->head_dim};
        for (int i = 0; i < n_sizes; i++) bench_case(s, sizes[i], slice, reps, &rows[mi][i]);
    }
    double wall = now_seconds() - wall0, cpu = bench_cpu_seconds(CLOCK_THREAD_CPUTIME_ID) - cpu0, cpus[256];
    if (D > 256) check(bs_fail("at most 256 ranks"));
    double share = cpu / wall;
    check(comm_allgather(world, &share, cpus, sizeof share));
    progress_finish(&progress, reps_done, NULL);
    if (root) {
        for (int mi = 0; mi < n_models; mi++) print_rows(model_find(models[mi]), rows[mi], n_sizes, D, reps);
        double least = 1;
        for (int r = 0; r < D; r++) least = cpus[r] < least ? cpus[r] : least;
        printf("rows: the most query rows a rank holds; GFLOP: forward + backward of the whole sequence; GF/s:\n"
               "per rank; RING/LOCAL: the median of the per-repetition ratios. compute / wait: RingStats of the\n"
               "slowest rank (block kernels / blocked on messages, in forward and backward); other = its RING\n"
               "total - both (packing K/V, summing dK/dV partials, delta). p2p GB/s: one block exchanged with\n"
               "the neighbours alone; transfer s: the layer's bytes at that rate; hidden = 1 - wait / transfer.\n"
               "%d ranks, wall %.0f s; the least busy rank had %.0f%% of a core",
               D, wall, 100 * least);
        if (least < 0.9) printf(" -- other processes shared the cores: expect noise");
        printf(".\n");
    }
    comm_mpi_finalize();
    return 0;
}
