// profile_ring.c: one ring step's block compute, and the floor attn_step fitted to it (profile.h,
// docs/profile.md "Ring step: attn_step").
//
// A member of a ring of D ranks computes, per layer, one attention block per ring step: its queries
// against the K/V block in hand (ring_attn.c). Whatever a block costs beyond its (query, key) pairs
// (the tiles' gathers and small sgemm calls, the merge, clearing and summing the dK/dV partial) is
// paid D times per layer by a ring member and once by a pack: cost.h's attn_step. It is measured
// here on the engine's kernel, with the calls ring_forward and ring_backward make for a block, in
// their slices of query rows, on blocks of n query rows against n key rows for n = 16, 32, ... up
// to min(C, 1024), and fitted to t = attn_step + pairs x rate. No messages: the ring's transfers
// overlap the compute and are the links' part.
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "bytescale/attention.h"
#include "bytescale/error.h"
#include "bytescale/json.h"
#include "bytescale/ring_attn.h"
#include "bytescale/rng.h"
#include "bytescale/timer.h"
#include "profile_internal.h"

// A timed group repeats a small block until it holds about this many pairs (a 16 x 16 block alone is
// a few microseconds), at most RING_MAX_ITERS times: merging a block into a result that already holds
// it raises the log-sum-exp by ln 2 per merge, and 64 merges (+44) keep the merge's weights normal floats.
#define RING_SAMPLE_PAIRS (1 << 18)
#define RING_MAX_ITERS 64

// The ladder: block sizes n = 16, 32, ... up to min(C, 1024) (at least two sizes), each full and
// causal, ascending. Returns the number of points; fills n, causal, pairs and iters.
static int ring_ladder(const ProfileConfig *c, ProfileRingPoint *pts) {
    int64_t top = c->capacity < PROFILE_RING_MAX_ROWS ? c->capacity : PROFILE_RING_MAX_ROWS;
    if (top < 2 * PROFILE_RING_MIN_ROWS) top = 2 * PROFILE_RING_MIN_ROWS;
    int k = 0;
    for (int n = PROFILE_RING_MIN_ROWS; n <= top && k + 2 <= PROFILE_MAX_RING; n *= 2)
        for (int causal = 0; causal < 2; causal++, k++) {
            ProfileRingPoint *pt = &pts[k];
            memset(pt, 0, sizeof *pt);
            pt->n = n, pt->causal = causal;
            pt->pairs = causal ? cost_causal_area(n) : (double)n * n;
            double it = RING_SAMPLE_PAIRS / pt->pairs;
            pt->iters = it < 1 ? 1 : it > RING_MAX_ITERS ? RING_MAX_ITERS : (int)it;
        }
    return k;
}

// Estimated milliseconds of one timed group on the `cpu` profile (progress units).
static int64_t ring_units(const Profile *p, const ProfileRingPoint *pt) {
    double ms = 1e3 * pt->iters * (p->derived.attn_pair * pt->pairs + p->derived.attn_step);
    return ms > 1 ? (int64_t)ms : 1;
}

int64_t profile_ring_units(const Profile *p) {
    ProfileRingPoint pts[PROFILE_MAX_RING];
    int n = ring_ladder(&p->cfg, pts);
    int64_t units = 0;
    for (int i = 0; i < n; i++) units += (int64_t)(p->cfg.warmup + p->cfg.reps) * ring_units(p, &pts[i]);
    return units;
}

// ---- the blocks -------------------------------------------------------------------------------------

// One block's inputs and the ring's buffers, for blocks of up to max_n rows. Rows carry positions
// 0 .. 2 max_n - 1 of one segment: the keys of a block of n are rows [0, n); its queries the same
// rows (causal, the diagonal block) or [n, 2n) (full: every key before every query).
typedef struct {
    AttnShape s;
    int slice;                 // query rows per kernel call: ring_attn.c's (RingAttn.slice_rows)
    int max_n;
    int32_t *pos, *seg;        // (2 max_n,)
    float *q, *dout, *dq;      // (max_n, n_heads, head_dim)
    float *out, *lse;          // (max_n, n_heads, head_dim), (max_n, n_heads): the result merged into
    float *out_part, *lse_part;  // (slice, n_heads, head_dim), (slice, n_heads): one slice's partial
    float *kv;                 // (max_n, 2 kv_dim): K rows, then V rows (ring_attn.c's message layout)
    float *acc, *inc;          // (max_n, 2 kv_dim): the dK/dV partial being summed, and the one arriving
    // per point: what the ring's backward gets from its layer, the block's own final result
    float *out0[PROFILE_MAX_RING];  // (n, n_heads, head_dim) the block's forward alone
    float *lse0[PROFILE_MAX_RING];  // (n, n_heads) its log-sum-exp (backward's lse)
    float *delta[PROFILE_MAX_RING]; // (n, n_heads) sum dout * out (attn_backward_delta)
} RingBench;

static void bench_free(RingBench *b) {
    free(b->pos), free(b->seg), free(b->q), free(b->dout), free(b->dq), free(b->out), free(b->lse);
    free(b->out_part), free(b->lse_part), free(b->kv), free(b->acc), free(b->inc);
    for (int i = 0; i < PROFILE_MAX_RING; i++) free(b->out0[i]), free(b->lse0[i]), free(b->delta[i]);
    memset(b, 0, sizeof *b);
}

static float *floats(int64_t n) { return bs_malloc(sizeof(float) * (size_t)(n > 0 ? n : 1)); }

static void fill_uniform(Rng *g, float *x, int64_t n) {
    for (int64_t i = 0; i < n; i++) x[i] = (float)(2 * rng_uniform(g) - 1);
}

static AttnRows key_rows(const RingBench *b, int n) { return (AttnRows){.pos = b->pos, .seg = b->seg, .n = n}; }

static AttnRows query_rows(const RingBench *b, int n, int causal) {
    int at = causal ? 0 : n;
    return (AttnRows){.pos = b->pos + at, .seg = b->seg + at, .n = n};
}

static AttnRows slice_of(AttnRows r, int qs, int nq) {
    return (AttnRows){.pos = r.pos + qs, .seg = r.seg + qs, .n = nq};
}

static int imin(int a, int b) { return a < b ? a : b; }

static int bench_init(RingBench *b, Comm *comm, const ModelConfig *m, const ProfileRingPoint *pts, int n_pts) {
    memset(b, 0, sizeof *b);
    b->s = (AttnShape){.n_heads = m->n_heads, .n_kv_heads = m->n_kv_heads, .head_dim = m->head_dim};
    RingAttn ring;  // only for the ring's slice size, so that the blocks are cut as the ring cuts them
    ring_attn_init(&ring, comm, b->s);
    b->slice = ring.slice_rows;
    ring_attn_free(&ring);
    for (int i = 0; i < n_pts; i++) b->max_n = pts[i].n > b->max_n ? pts[i].n : b->max_n;
    int64_t N = b->max_n, Q = (int64_t)b->s.n_heads * b->s.head_dim, KV = (int64_t)b->s.n_kv_heads * b->s.head_dim;
    int64_t H = b->s.n_heads;
    b->pos = bs_malloc(sizeof(int32_t) * (size_t)(2 * N));
    b->seg = bs_calloc((size_t)(2 * N), sizeof(int32_t));
    b->q = floats(N * Q), b->dout = floats(N * Q), b->dq = floats(N * Q);
    b->out = floats(N * Q), b->lse = floats(N * H);
    b->out_part = floats((int64_t)b->slice * Q), b->lse_part = floats((int64_t)b->slice * H);
    b->kv = floats(N * 2 * KV), b->acc = floats(N * 2 * KV), b->inc = floats(N * 2 * KV);
    if (!b->pos || !b->seg || !b->q || !b->dout || !b->dq || !b->out || !b->lse || !b->out_part || !b->lse_part ||
        !b->kv || !b->acc || !b->inc)
        return -1;
    for (int i = 0; i < 2 * N; i++) b->pos[i] = i;
    Rng g;
    rng_seed(&g, 2121);
    fill_uniform(&g, b->q, N * Q), fill_uniform(&g, b->dout, N * Q), fill_uniform(&g, b->kv, N * 2 * KV);
    fill_uniform(&g, b->inc, N * 2 * KV);
    memset(b->dq, 0, sizeof(float) * (size_t)(N * Q));
    // each point's final result, as the layer hands it to ring_backward: the block alone
    for (int i = 0; i < n_pts; i++) {
        int n = pts[i].n;
        b->out0[i] = floats(n * Q), b->lse0[i] = floats(n * H), b->delta[i] = floats(n * H);
        if (!b->out0[i] || !b->lse0[i] || !b->delta[i]) return -1;
        AttnRows qr = query_rows(b, n, pts[i].causal), kr = key_rows(b, n);
        attn_forward(b->out0[i], b->lse0[i], b->q, qr, b->kv, b->kv + n * KV, kr, b->s);
        attn_backward_delta(b->delta[i], b->dout, b->out0[i], n, b->s);
    }
    return 0;
}

// Point i's block as a ring step computes it, forward then backward: ring_forward's and
// ring_backward's step bodies for one block without the messages (the causal block is step 0, the
// member's own: its result written directly, no partial arriving; a full block is a step t > 0:
// merged into the result so far, the arriving dK/dV partial added).
static void ring_block(RingBench *b, const ProfileRingPoint *pt, int i) {
    AttnShape s = b->s;
    int n = pt->n, H = s.n_heads;
    int64_t Q = (int64_t)s.n_heads * s.head_dim, KV = (int64_t)s.n_kv_heads * s.head_dim;
    AttnRows mine = query_rows(b, n, pt->causal), kr = key_rows(b, n);
    const float *kb = b->kv, *vb = b->kv + (int64_t)n * KV;
    for (int qs = 0; qs < n; qs += b->slice) {  // forward
        int nq = imin(b->slice, n - qs);
        AttnRows qr = slice_of(mine, qs, nq);
        if (pt->causal) {
            attn_forward(b->out + qs * Q, b->lse + (int64_t)qs * H, b->q + qs * Q, qr, kb, vb, kr, s);
        } else {
            attn_forward(b->out_part, b->lse_part, b->q + qs * Q, qr, kb, vb, kr, s);
            attn_merge(b->out + qs * Q, b->lse + (int64_t)qs * H, b->out_part, b->lse_part, nq, s);
        }
    }
    int64_t nb = (int64_t)n * 2 * KV;  // backward
    memset(b->acc, 0, (size_t)nb * sizeof(float));
    for (int qs = 0; qs < n; qs += b->slice) {
        int nq = imin(b->slice, n - qs);
        attn_backward(b->dq + qs * Q, b->acc, b->acc + (int64_t)n * KV, b->dout + qs * Q, b->lse0[i] + (int64_t)qs * H,
                      b->delta[i] + (int64_t)qs * H, b->q + qs * Q, slice_of(mine, qs, nq), kb, vb, kr, s);
    }
    if (!pt->causal)
        for (int64_t j = 0; j < nb; j++) b->acc[j] += b->inc[j];
}

// One timed group of pt->iters blocks: seconds per block by the profile's clock, and CPU / wall.
static void timed_group(RingBench *b, const ProfileRingPoint *pt, int i, int wall_clock, double *sec, double *share) {
    int64_t Q = (int64_t)b->s.n_heads * b->s.head_dim;
    // the result so far holds the block once (untimed): the merges' weights stay ordinary numbers
    memcpy(b->out, b->out0[i], sizeof(float) * (size_t)(pt->n * Q));
    memcpy(b->lse, b->lse0[i], sizeof(float) * (size_t)pt->n * (size_t)b->s.n_heads);
    double c0 = thread_cpu_seconds(), t0 = now_seconds();
    for (int it = 0; it < pt->iters; it++) ring_block(b, pt, i);
    double wall = now_seconds() - t0, cpu = thread_cpu_seconds() - c0;
    *sec = (wall_clock ? wall : cpu) / pt->iters;
    *share = wall > 0 ? cpu / wall : 1;
}

// ---- measuring and fitting --------------------------------------------------------------------------

int profile_fit_ring_step(const double *pairs, const double *t, int n, double *attn_step, double *rate) {
    double *X = malloc(sizeof(double) * (size_t)n * 2), *w = malloc(sizeof(double) * (size_t)n);
    int rc = X && w ? 0 : bs_fail("out of memory");
    for (int i = 0; rc == 0 && i < n; i++) {
        if (!(t[i] > 0)) rc = bs_fail("fitting the ring step: the time of %g pairs is %g, not > 0", pairs[i], t[i]);
        X[i * 2] = 1.0, X[i * 2 + 1] = pairs[i], w[i] = 1.0 / (t[i] * t[i]);  // relative error
    }
    double c[2];
    if (rc == 0) rc = profile_lstsq(X, t, w, n, 2, c);
    free(X), free(w);
    if (rc != 0) return bs_fail_ctx("fitting attn_step + pairs x rate to %d blocks", n);
    if (!(c[1] > 0))
        return bs_fail("fitting the ring step: the block time does not grow with its pairs (the measurements are too "
                       "noisy)");
    *attn_step = c[0], *rate = c[1];
    return 0;
}

enum { RV = 2 };  // values per timed (point, repetition): seconds per block, core share

int profile_measure_ring(Profile *p, Comm *comm, Progress *pr, int64_t *done) {
    const ProfileConfig *c = &p->cfg;
    double t_start = now_seconds();
    int n = ring_ladder(c, p->ring), reps = c->reps;
    RingBench b;
    int rc = bench_init(&b, comm, c->model, p->ring, n);
    // per rank: (seconds, share) x point x rep
    double *mine = rc == 0 ? bs_calloc((size_t)RV * n * reps, sizeof(double)) : NULL, *all = NULL;
    if (!mine) rc = -1;
    ProfileTick t = {pr, done ? *done : 0};
    char note[96];
    // as the compute: every repetition visits every point, on every rank at once
    for (int r = 0; rc == 0 && r < c->warmup + reps; r++) {
        rc = comm_barrier(comm);
        for (int i = 0; rc == 0 && i < n; i++) {
            double sec, share;
            timed_group(&b, &p->ring[i], i, c->wall_clock, &sec, &share);
            if (r >= c->warmup) {
                double *at = mine + (size_t)RV * ((size_t)i * reps + (r - c->warmup));
                at[0] = sec, at[1] = share;
            }
            snprintf(note, sizeof note, "ring step: %d x %d %s, %s %d of %d", p->ring[i].n, p->ring[i].n,
                     p->ring[i].causal ? "causal" : "full", r < c->warmup ? "warm-up" : "run",
                     r < c->warmup ? r + 1 : r - c->warmup + 1, r < c->warmup ? c->warmup : reps);
            profile_tick(&t, ring_units(p, &p->ring[i]), note);
        }
    }
    if (rc == 0 && !(all = profile_gather(comm, mine, RV * n * reps))) rc = -1;
    int ns = reps * comm->size;
    double *share = rc == 0 ? bs_malloc(sizeof(double) * (size_t)ns) : NULL;
    if (rc == 0 && !share) rc = -1;
    for (int i = 0; rc == 0 && i < n; i++) {
        ProfileRingPoint *pt = &p->ring[i];  // pairs: set by ring_ladder
        if (!(pt->samples = bs_malloc(sizeof(double) * (size_t)ns))) {
            rc = -1;
            break;
        }
        pt->n_samples = ns;
        for (int k = 0; k < comm->size; k++)
            for (int j = 0; j < reps; j++) {
                const double *at = all + (size_t)k * RV * n * reps + (size_t)RV * ((size_t)i * reps + j);
                pt->samples[k * reps + j] = at[0], share[k * reps + j] = at[1];
            }
        pt->measured = profile_median(pt->samples, ns);
        pt->core_share = profile_median(share, ns);
    }
    p->n_ring = n;
    if (done) *done = t.done;
    free(share), free(mine), free(all);
    bench_free(&b);
    if (rc != 0) return bs_fail_ctx("measuring the ring step of model %s", c->model->name);

    // zeroed past n: the fit reads only n points, but gcc cannot always see that across files
    double x[PROFILE_MAX_RING] = {0}, y[PROFILE_MAX_RING] = {0}, step, rate;
    for (int i = 0; i < n; i++) x[i] = p->ring[i].pairs, y[i] = p->ring[i].measured;
    if (profile_fit_ring_step(x, y, n, &step, &rate) != 0) return -1;
    p->cm.attn_step = step, p->ring_rate = rate;
    p->max_ring_err = 0;
    for (int i = 0; i < n; i++) {
        ProfileRingPoint *pt = &p->ring[i];
        pt->fitted = step + rate * pt->pairs;
        pt->residual = pt->fitted / pt->measured - 1;
        p->max_ring_err = fmax(p->max_ring_err, fabs(pt->residual));
    }
    p->ring_seconds = now_seconds() - t_start;
    return 0;
}

// ---- reporting ----------------------------------------------------------------------------------------

void profile_ring_print(FILE *f, const Profile *p) {
    const ProfileConfig *c = &p->cfg;
    const CostModel *cm = &p->cm;
    if (p->n_ring == 0) {
        fprintf(f, "ring step: not measured: attn_step = %.4g s (the `cpu` profile's)\n\n", cm->attn_step);
        return;
    }
    fprintf(f, "ring step: one attention block of n query rows x n key rows, forward + backward, as ring_attn.c "
               "computes a ring step's block\n(attn_forward + attn_merge, attn_backward, the dK/dV partial; full: "
               "another member's keys, all before the queries; causal: the member's own);\n%s time, median of %d "
               "sample%s per block (%d run%s after %d warm-up, x %d rank%s; small blocks repeat within a sample)\n",
            c->wall_clock ? "wall-clock" : "CPU (the rank's thread)", p->ring[0].n_samples,
            p->ring[0].n_samples == 1 ? "" : "s", c->reps, c->reps == 1 ? "" : "s", c->warmup, p->n_ranks,
            p->n_ranks == 1 ? "" : "s");
    fprintf(f, "%6s %-7s %10s %7s %12s %11s %9s %7s %5s\n", "n", "kind", "pairs", "blocks", "measured us",
            "fitted us", "residual", "spread", "core");
    for (int i = 0; i < p->n_ring; i++) {
        const ProfileRingPoint *pt = &p->ring[i];
        fprintf(f, "%6d %-7s %10.0f %7d %12.2f %11.2f %+8.1f%% %6.0f%% %5.2f\n", pt->n, pt->causal ? "causal" : "full",
                pt->pairs, pt->iters, 1e6 * pt->measured, 1e6 * pt->fitted, 100 * pt->residual,
                100 * profile_spread(pt->samples, pt->n_samples, pt->measured), pt->core_share);
    }
    fprintf(f, "(blocks: per sample; residual = fitted / measured - 1)\n");
    fprintf(f, "fit t = attn_step + pairs x rate, least squares weighted by 1/t^2, coefficients >= 0:\n");
    fprintf(f, "  attn_step = %.3f us per block, rate = %.4e s per pair (the layer fit's attn_pair %.4e: x %.2f); "
               "largest |residual| %.1f%%\n",
            1e6 * cm->attn_step, p->ring_rate, cm->attn_pair, cm->attn_pair > 0 ? p->ring_rate / cm->attn_pair : 0,
            100 * p->max_ring_err);
    fprintf(f, "  layer_const = max(0, c - attn_step) = max(0, %.4e - %.4e) = %.4e s (the layer's time held its one "
               "block's floor)\n",
            p->layer_c, cm->attn_step, cm->layer_const);
    fprintf(f, "  took %.1f s\n\n", p->ring_seconds);
}

cJSON *profile_ring_json(const Profile *p) {
    cJSON *o = cJSON_CreateObject();
    cJSON_AddBoolToObject(o, "measured", p->n_ring > 0);
    if (p->n_ring == 0) {
        cJSON_AddStringToObject(o, "method", "not measured: attn_step is the `cpu` profile's");
        return o;
    }
    cJSON_AddStringToObject(o, "method", "one block of n query rows x n key rows, forward + backward as ring_attn.c "
                                         "computes a ring step's block (attn_forward + attn_merge in slices of "
                                         "query rows, attn_backward, the dK/dV partial cleared and summed), no "
                                         "messages; full: keys all before the queries (a step t > 0), causal: the "
                                         "diagonal block (step 0); small blocks repeated blocks_per_sample times "
                                         "per sample; settings.clock seconds per block, median over every rank's "
                                         "samples");
    cJSON_AddStringToObject(o, "fit", "t = attn_step + pairs x rate, least squares weighted by 1/t^2, coefficients "
                                      ">= 0; layer_const = max(0, compute.c - attn_step)");
    json_add_exact(o, "attn_step", p->cm.attn_step);
    json_add_exact(o, "rate", p->ring_rate);
    cJSON_AddNumberToObject(o, "max_residual", p->max_ring_err);
    cJSON_AddNumberToObject(o, "seconds", p->ring_seconds);
    cJSON *pts = cJSON_AddArrayToObject(o, "points");
    for (int i = 0; i < p->n_ring; i++) {
        const ProfileRingPoint *pt = &p->ring[i];
        cJSON *e = cJSON_CreateObject();
        cJSON_AddNumberToObject(e, "n", pt->n);
        cJSON_AddStringToObject(e, "kind", pt->causal ? "causal" : "full");
        cJSON_AddNumberToObject(e, "pairs", pt->pairs);
        cJSON_AddNumberToObject(e, "measured", pt->measured);
        cJSON_AddNumberToObject(e, "fitted", pt->fitted);
        cJSON_AddNumberToObject(e, "residual", pt->residual);
        cJSON_AddNumberToObject(e, "blocks_per_sample", pt->iters);
        cJSON_AddNumberToObject(e, "core_share", pt->core_share);
        cJSON_AddItemToObject(e, "samples", profile_number_array(pt->samples, pt->n_samples));
        cJSON_AddItemToArray(pts, e);
    }
    return o;
}
