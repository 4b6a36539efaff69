// profile.c: measure this machine for the cost model (profile.h, docs/profile.md).
//
// Four measurements, each as the trainer would meet it: one layer's compute on the engine itself,
// its activation bytes from the engine's own accounting, ring-sized messages through the Comm API,
// and the offload file tier. Each is fitted to the cost model's form for it; whatever one machine
// cannot measure comes from cost_derive on the `cpu` hardware profile, and the file says which is
// which, field by field.
#include "bytescale/profile.h"

#include <cblas.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <cJSON.h>

#include "bytescale/arena.h"
#include "bytescale/error.h"
#include "bytescale/fileio.h"
#include "bytescale/hw.h"
#include "bytescale/json.h"
#include "bytescale/llama.h"
#include "bytescale/offload.h"
#include "bytescale/rng.h"
#include "bytescale/scenario.h"
#include "bytescale/timer.h"
#include "profile_internal.h"

#define P2P_TAG 7101            // the ping-pong's messages; nothing else is in flight meanwhile
#define P2P_SAMPLE_BYTES (4 << 20)  // a sample moves about this much, so small messages repeat
#define P2P_MAX_ITERS 100
#define P2P_MAX_BYTES (64 << 20)    // the largest message timed
#define TIER_MIN_CHUNK (1 << 20)

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

// (profile_internal.h)
double profile_median(const double *v, int n) {
    if (n < 1) return NAN;
    double *c = malloc((size_t)n * sizeof *c);
    if (!c) return NAN;
    memcpy(c, v, (size_t)n * sizeof *c);
    qsort(c, (size_t)n, sizeof *c, cmp_double);
    double m = n % 2 ? c[n / 2] : 0.5 * (c[n / 2 - 1] + c[n / 2]);
    free(c);
    return m;
}

// ---- least squares ----------------------------------------------------------------------------------

enum { LSQ_MAX_K = 4 };

// Weighted least squares on the columns in mask (the others held at 0): modified Gram-Schmidt on
// sqrt(w) X, its columns scaled to unit length first so that s^2, s and 1 are on equal terms.
// *sse: the weighted sum of squared residuals. -1 when the columns are (nearly) dependent.
static int lstsq_subset(const double *X, const double *y, const double *w, int n, int k, unsigned mask, double *coef,
                        double *sse) {
    int cols[LSQ_MAX_K], m = 0;
    for (int j = 0; j < k; j++)
        if (mask >> j & 1) cols[m++] = j;
    double *q = malloc(sizeof(double) * (size_t)n * (size_t)(m + 1));
    if (!q) return bs_fail("out of memory");
    double *b = q + (size_t)n * m;  // the right-hand side, then the residual
    double scale[LSQ_MAX_K], R[LSQ_MAX_K][LSQ_MAX_K] = {{0}}, z[LSQ_MAX_K];
    int rc = n >= m ? 0 : -1;
    for (int j = 0; rc == 0 && j < m; j++) {
        double *qj = q + (size_t)j * n, norm = 0;
        for (int i = 0; i < n; i++) qj[i] = sqrt(w[i]) * X[i * k + cols[j]], norm += qj[i] * qj[i];
        scale[j] = sqrt(norm);
        if (!(scale[j] > 0) || !isfinite(scale[j])) rc = -1;
        for (int i = 0; rc == 0 && i < n; i++) qj[i] /= scale[j];
    }
    for (int i = 0; i < n; i++) b[i] = sqrt(w[i]) * y[i];
    for (int j = 0; rc == 0 && j < m; j++) {
        double *qj = q + (size_t)j * n;
        for (int p = 0; p < j; p++) {
            double *qp = q + (size_t)p * n, d = 0;
            for (int i = 0; i < n; i++) d += qp[i] * qj[i];
            R[p][j] = d;
            for (int i = 0; i < n; i++) qj[i] -= d * qp[i];
        }
        double norm = 0;
        for (int i = 0; i < n; i++) norm += qj[i] * qj[i];
        R[j][j] = sqrt(norm);
        if (R[j][j] < 1e-10) {  // column j is (nearly) a combination of the ones before it
            rc = -1;
            break;
        }
        for (int i = 0; i < n; i++) qj[i] /= R[j][j];
        // project the right-hand side as the columns come (MGS on the augmented system)
        double d = 0;
        for (int i = 0; i < n; i++) d += qj[i] * b[i];
        z[j] = d;
        for (int i = 0; i < n; i++) b[i] -= d * qj[i];
    }
    if (rc == 0) {
        *sse = 0;
        for (int i = 0; i < n; i++) *sse += b[i] * b[i];
        for (int j = 0; j < k; j++) coef[j] = 0;
        for (int j = m - 1; j >= 0; j--) {
            double v = z[j];
            for (int p = j + 1; p < m; p++) v -= R[j][p] * z[p];
            z[j] = v / R[j][j];  // z now holds the solution in scaled units, back to front
            coef[cols[j]] = z[j] / scale[j];
        }
    }
    free(q);
    return rc;
}

int profile_lstsq(const double *X, const double *y, const double *w, int n, int k, double *coef) {
    if (k < 1 || k > LSQ_MAX_K) return bs_fail("least squares: %d basis functions (1 to %d)", k, LSQ_MAX_K);
    if (n < k) return bs_fail("least squares: %d point%s cannot determine %d coefficients", n, n == 1 ? "" : "s", k);
    for (int i = 0; i < n; i++)
        if (!isfinite(y[i]) || !(w[i] >= 0) || !isfinite(w[i]))
            return bs_fail("least squares: point %d is not finite", i);
    double best = INFINITY, c[LSQ_MAX_K];
    int found = 0;
    for (unsigned mask = (1u << k) - 1; mask > 0; mask--) {  // every coefficient free first
        double sse = INFINITY;
        if (lstsq_subset(X, y, w, n, k, mask, c, &sse) != 0) continue;
        int feasible = 1;
        for (int j = 0; j < k; j++) feasible &= c[j] >= 0;
        if (!feasible || !(sse < best)) continue;
        best = sse;
        memcpy(coef, c, sizeof(double) * (size_t)k);
        found = 1;
    }
    if (!found) return bs_fail("least squares: no solution from %d points for %d coefficients", n, k);
    return 0;
}

int profile_fit_time(const int64_t *s, const double *t, int n, CostModel *cm) {
    double *X = malloc(sizeof(double) * (size_t)n * 3), *w = malloc(sizeof(double) * (size_t)n);
    int rc = X && w ? 0 : bs_fail("out of memory");
    for (int i = 0; rc == 0 && i < n; i++) {
        if (!(t[i] > 0)) rc = bs_fail("fitting T(s): the time at s = %lld is %g, not > 0", (long long)s[i], t[i]);
        // the basis of cost_layer_time: its coefficients are the cost model's fields as they are
        X[i * 3 + 0] = cost_causal_area(s[i]);
        X[i * 3 + 1] = (double)s[i];
        X[i * 3 + 2] = 1.0;
        w[i] = 1.0 / (t[i] * t[i]);  // minimizes the squared relative error
    }
    double c[3];
    if (rc == 0) rc = profile_lstsq(X, t, w, n, 3, c);
    free(X), free(w);
    if (rc != 0) return bs_fail_ctx("fitting T(s) to %d lengths", n);
    if (!(c[1] > 0))
        return bs_fail("fitting T(s): lin_token came out %g; the cost model needs it > 0 (the measurements are too "
                       "noisy or the lengths too few)",
                       c[1]);
    cm->attn_pair = c[0];
    cm->lin_token = c[1];
    cm->layer_const = c[2];
    return 0;
}

int profile_fit_link(const double *bytes, const double *t, int n, double *lat, double *bw) {
    double *X = malloc(sizeof(double) * (size_t)n * 2), *w = malloc(sizeof(double) * (size_t)n);
    int rc = X && w ? 0 : bs_fail("out of memory");
    for (int i = 0; rc == 0 && i < n; i++) {
        if (!(t[i] > 0)) rc = bs_fail("fitting the link: the time of %g bytes is %g, not > 0", bytes[i], t[i]);
        X[i * 2] = 1.0, X[i * 2 + 1] = bytes[i], w[i] = 1.0 / (t[i] * t[i]);
    }
    double c[2];
    if (rc == 0) rc = profile_lstsq(X, t, w, n, 2, c);
    free(X), free(w);
    if (rc != 0) return bs_fail_ctx("fitting lat + bytes / bw to %d message sizes", n);
    if (!(c[1] > 0)) return bs_fail("fitting the link: the time does not grow with the message size (bw infinite)");
    *lat = c[0];
    *bw = 1.0 / c[1];
    return 0;
}

int profile_held_out(int i, int n, int every) {
    return every > 0 && i > 0 && i < n - 1 && i % every == every - 1;
}

// ---- settings -----------------------------------------------------------------------------------------

void profile_defaults(ProfileConfig *c, const ModelConfig *m) {
    memset(c, 0, sizeof *c);
    c->model = m;
    static const int64_t lengths[] = {256, 384, 512, 768, 1024, 1536, 2048, 3072, 4096, 6144, 8192};
    c->n_lengths = (int)(sizeof lengths / sizeof lengths[0]);
    memcpy(c->lengths, lengths, sizeof lengths);
    c->reps = 5;
    c->warmup = 1;
    c->layers[0] = 1, c->layers[1] = 3;
    c->holdout = 3;
    c->capacity = 4096;  // train_defaults(): capacity = context = 4K
    c->hdp_ranks = 2;    // the `cpu` profile: one rank per core of this 2-core machine
    c->p2p_reps = 15;
    c->tier_bytes = 256 << 20;
    c->tier_reps = 3;
}

int profile_config_check(const ProfileConfig *c) {
    if (!c->model) return bs_fail("no model");
    if (c->n_lengths < 1 || c->n_lengths > PROFILE_MAX_LENGTHS)
        return bs_fail("--lengths: %d lengths (1 to %d)", c->n_lengths, PROFILE_MAX_LENGTHS);
    for (int i = 0; i < c->n_lengths; i++) {
        if (c->lengths[i] < 1 || c->lengths[i] > (1 << 20))
            return bs_fail("--lengths: %lld is out of range [1, 1M]", (long long)c->lengths[i]);
        if (i > 0 && c->lengths[i] <= c->lengths[i - 1])
            return bs_fail("--lengths: must be ascending and distinct (%lld after %lld)", (long long)c->lengths[i],
                           (long long)c->lengths[i - 1]);
    }
    int fit = 0;
    for (int i = 0; i < c->n_lengths; i++) fit += !profile_held_out(i, c->n_lengths, c->holdout);
    if (fit < 3)
        return bs_fail("--lengths: %d of the %d lengths %s left to fit T(s) = a1 s^2 + b1 s + c (--holdout %d holds "
                       "out %d); the fit needs at least 3: give more lengths, or --holdout 0",
                       fit, c->n_lengths, fit == 1 ? "is" : "are", c->holdout, c->n_lengths - fit);
    if (c->reps < 1 || c->reps > 1000) return bs_fail("--reps: %d is out of range [1, 1000]", c->reps);
    if (c->warmup < 0 || c->warmup > 100) return bs_fail("--warmup: %d is out of range [0, 100]", c->warmup);
    if (c->layers[0] < 1 || c->layers[1] <= c->layers[0] || c->layers[1] > 64)
        return bs_fail("--layers: %d,%d must be two layer counts 1 <= A < B <= 64", c->layers[0], c->layers[1]);
    if (c->holdout < 0) return bs_fail("--holdout: %d must be >= 0", c->holdout);
    if (c->capacity < 1 || c->capacity > (1 << 24))
        return bs_fail("--capacity: %lld is out of range [1, 16M]", (long long)c->capacity);
    if (c->hdp_ranks < 1 || c->hdp_ranks > (1 << 20))
        return bs_fail("--ranks: %d is out of range [1, 1M]", c->hdp_ranks);
    if (c->p2p_reps < 1 || c->p2p_reps > 10000)
        return bs_fail("--p2p-reps: %d is out of range [1, 10000]", c->p2p_reps);
    if (c->tier_bytes < 4096 || c->tier_bytes > (1ll << 40))
        return bs_fail("--tier-bytes: %lld is out of range [4K, 1T]", (long long)c->tier_bytes);
    if (c->tier_reps < 1 || c->tier_reps > 100)
        return bs_fail("--tier-reps: %d is out of range [1, 100]", c->tier_reps);
    if (c->model->n_experts > 1) return bs_fail("model %s: the engine has no MoE layers", c->model->name);
    return 0;
}

// ---- progress ---------------------------------------------------------------------------------------
// Units are estimated milliseconds (the `cpu` profile's T(s) for the compute), so the ETA holds
// although the longest lengths take most of the time (profile_internal.h).

void profile_tick(ProfileTick *t, int64_t units, const char *note) {
    t->done += units > 0 ? units : 1;
    if (t->pr) progress_update(t->pr, t->done, note);
}

static int64_t compute_units(const Profile *p, int64_t s) {
    double ms = 1e3 * cost_layer_time(&p->derived, s) * (p->cfg.layers[0] + p->cfg.layers[1]);
    return ms > 1 ? (int64_t)ms : 1;
}

static int64_t tier_units(const ProfileConfig *c) { return 2 * c->tier_bytes / (1 << 20) + 1; }  // ~1 GB/s

// ---- compute --------------------------------------------------------------------------------------------

// (profile_internal.h)
double *profile_gather(Comm *comm, const double *mine, int n) {
    double *all = bs_malloc(sizeof(double) * (size_t)n * (size_t)comm->size);
    if (all && comm_allgather(comm, mine, all, sizeof(double) * (size_t)n) != 0) {
        free(all);
        return NULL;
    }
    return all;
}

// One causal sequence of s tokens for every model: random tokens, each target the next token.
typedef struct {
    int32_t *tok, *tgt, *pos, *seg;
} Tokens;

static int tokens_init(Tokens *t, int max_T, int vocab) {
    t->tok = bs_malloc(sizeof(int32_t) * (size_t)(max_T + 1));
    t->tgt = bs_malloc(sizeof(int32_t) * (size_t)max_T);
    t->pos = bs_malloc(sizeof(int32_t) * (size_t)max_T);
    t->seg = bs_calloc((size_t)max_T, sizeof(int32_t));
    if (!t->tok || !t->tgt || !t->pos || !t->seg) return -1;
    Rng rng;
    rng_seed(&rng, 4242);
    for (int i = 0; i <= max_T; i++) t->tok[i] = (int32_t)rng_below(&rng, (uint64_t)vocab);
    for (int i = 0; i < max_T; i++) t->tgt[i] = t->tok[i + 1], t->pos[i] = i;
    return 0;
}

static void tokens_free(Tokens *t) { free(t->tok), free(t->tgt), free(t->pos), free(t->seg); }

// One forward + backward of the first T tokens: wall seconds and CPU seconds of this thread (the one
// BLAS thread computes here, and nothing else runs: no offloading). On a core of its own the two are
// equal; when other processes share the core, the wall clock also counts their turns and the CPU
// clock does not.
static int timed_pass(Llama *m, const Tokens *tk, int T, double *wall, double *cpu) {
    MicroBatch mb = {.tokens = tk->tok, .targets = tk->tgt, .pos = tk->pos, .seg = tk->seg, .T = T};
    double loss, c0 = thread_cpu_seconds(), t0 = now_seconds();
    int rc = llama_forward_backward(m, &mb, 1.0f / (float)T, &loss, NULL);
    *wall = now_seconds() - t0;
    *cpu = thread_cpu_seconds() - c0;
    return rc;
}

enum { NV = 4 };  // values per timed (length, repetition): per layer, model A, model B, core share

int profile_measure_compute(Profile *p, Comm *comm, Progress *pr, int64_t *done) {
    const ProfileConfig *c = &p->cfg;
    int n = c->n_lengths, reps = c->reps, La = c->layers[0], Lb = c->layers[1];
    int max_T = (int)c->lengths[n - 1];
    Llama m[2];
    memset(m, 0, sizeof m);
    Tokens tk = {0};
    // per rank: (per-layer, model a, model b, core share) x length x rep
    double *mine = bs_calloc((size_t)NV * n * reps, sizeof(double)), *all = NULL;
    int rc = mine ? 0 : -1;
    for (int i = 0; rc == 0 && i < 2; i++) {
        ModelConfig cfg = *c->model;
        cfg.n_layers = c->layers[i];
        rc = llama_init(&m[i], &cfg, max_T);
        if (rc == 0) llama_init_weights(&m[i], 1337);
    }
    if (rc == 0) rc = tokens_init(&tk, max_T, c->model->vocab_size);
    ProfileTick t = {pr, done ? *done : 0};
    char note[96];
    // Every repetition runs every length once, so a change in the machine's load spreads over all
    // lengths instead of landing on a few. Within one (repetition, length) the two models run back to
    // back, in alternating order: the difference is taken between runs that saw the same machine.
    for (int r = 0; rc == 0 && r < c->warmup + reps; r++) {
        rc = comm_barrier(comm);  // the ranks compute at the same time, as in training
        for (int i = 0; rc == 0 && i < n; i++) {
            int T = (int)c->lengths[i];
            double wall[2] = {0, 0}, cpu[2] = {0, 0};
            int b_first = (r + i) % 2;
            if (b_first) rc = timed_pass(&m[1], &tk, T, &wall[1], &cpu[1]);
            if (rc == 0) rc = timed_pass(&m[0], &tk, T, &wall[0], &cpu[0]);
            if (rc == 0 && !b_first) rc = timed_pass(&m[1], &tk, T, &wall[1], &cpu[1]);
            if (rc == 0 && r >= c->warmup) {
                const double *sec = c->wall_clock ? wall : cpu;
                double *at = mine + (size_t)NV * ((size_t)i * reps + (r - c->warmup));
                at[0] = (sec[1] - sec[0]) / (Lb - La), at[1] = sec[0], at[2] = sec[1];
                at[3] = (cpu[0] + cpu[1]) / (wall[0] + wall[1]);
            }
            snprintf(note, sizeof note, "compute: s = %d, %s %d of %d", T, r < c->warmup ? "warm-up" : "run",
                     r < c->warmup ? r + 1 : r - c->warmup + 1, r < c->warmup ? c->warmup : reps);
            profile_tick(&t, compute_units(p, T), note);
        }
    }
    if (rc == 0 && !(all = profile_gather(comm, mine, NV * n * reps))) rc = -1;
    int ns = reps * comm->size;
    double *ta = rc == 0 ? bs_malloc(sizeof(double) * (size_t)ns * 3) : NULL, *tb = ta ? ta + ns : NULL;
    double *share = ta ? ta + 2 * ns : NULL;
    if (rc == 0 && !ta) rc = -1;
    for (int i = 0; rc == 0 && i < n; i++) {
        ProfilePoint *pt = &p->pts[i];
        pt->s = c->lengths[i];
        pt->held_out = profile_held_out(i, n, c->holdout);
        pt->samples = bs_malloc(sizeof(double) * (size_t)ns);
        if (!pt->samples) {
            rc = -1;
            break;
        }
        pt->n_samples = ns;
        for (int k = 0; k < comm->size; k++)
            for (int j = 0; j < reps; j++) {
                const double *at = all + (size_t)k * NV * n * reps + (size_t)NV * ((size_t)i * reps + j);
                pt->samples[k * reps + j] = at[0], ta[k * reps + j] = at[1], tb[k * reps + j] = at[2];
                share[k * reps + j] = at[3];
            }
        pt->measured = profile_median(pt->samples, ns);
        pt->core_share = profile_median(share, ns);
        pt->model_t[0] = profile_median(ta, ns);
        pt->model_t[1] = profile_median(tb, ns);
        if (!(pt->measured > 0))
            rc = bs_fail("s = %d: the %d-layer model took no longer than the %d-layer one (median %g s): too noisy "
                         "to measure; raise --reps or the lengths",
                         (int)pt->s, Lb, La, pt->measured);
    }
    p->n_pts = n;
    if (done) *done = t.done;
    free(ta);
    free(mine), free(all);
    tokens_free(&tk);
    llama_free(&m[0]), llama_free(&m[1]);
    return rc == 0 ? 0 : bs_fail_ctx("measuring model %s", c->model->name);
}

// The embedding, head and loss: what the smaller model takes beyond its layers, head(s) =
// model_t[0] - layers[0] x the per-layer time, fitted to head_token s + head_const (coefficients >= 0)
// with weights relative to the whole model's time: the head is a small difference of large times
// and may measure near zero at short lengths. Every length is used (it has two parameters).
static int fit_head(Profile *p) {
    int n = p->n_pts;
    double X[PROFILE_MAX_LENGTHS * 2], y[PROFILE_MAX_LENGTHS], w[PROFILE_MAX_LENGTHS], c[2] = {0, 0};
    for (int i = 0; i < n; i++) {
        ProfilePoint *pt = &p->pts[i];
        pt->head = pt->model_t[0] - p->cfg.layers[0] * pt->measured;
        X[i * 2] = (double)pt->s, X[i * 2 + 1] = 1.0;
        y[i] = pt->head;
        w[i] = 1.0 / (pt->model_t[0] * pt->model_t[0]);
    }
    if (profile_lstsq(X, y, w, n, 2, c) != 0) return bs_fail_ctx("fitting the head to %d lengths", n);
    p->cm.head_token = c[0], p->cm.head_const = c[1];
    p->max_head_err = 0;
    for (int i = 0; i < n; i++) {
        ProfilePoint *pt = &p->pts[i];
        pt->head_fitted = cost_head_time(&p->cm, (double)pt->s);
        // against the whole model's time: what an error in the head costs a step's estimate
        p->max_head_err = fmax(p->max_head_err, fabs(pt->head_fitted - pt->head) / pt->model_t[0]);
    }
    return 0;
}

int profile_fit_compute(Profile *p) {
    int64_t s[PROFILE_MAX_LENGTHS];
    double t[PROFILE_MAX_LENGTHS];
    int n = 0;
    for (int i = 0; i < p->n_pts; i++)
        if (!p->pts[i].held_out) s[n] = p->pts[i].s, t[n] = p->pts[i].measured, n++;
    if (profile_fit_time(s, t, n, &p->cm) != 0) return -1;
    // The measured layer ran one attention block, so its constant c holds that block's floor, which
    // the ring step measured as attn_step and cost_layer_time adds on top of layer_const: counted
    // once, the model's T(s) is the fit. (c < attn_step: the floor is more than the layer fit could
    // resolve in its constant; layer_const is then 0 and T(s) exceeds the fit by attn_step - c, which
    // the residuals below show.)
    p->layer_c = p->cm.layer_const;
    p->cm.layer_const = fmax(0.0, p->layer_c - p->cm.attn_step);
    p->max_fit_err = p->max_holdout_err = 0;
    for (int i = 0; i < p->n_pts; i++) {
        ProfilePoint *pt = &p->pts[i];
        pt->fitted = cost_layer_time(&p->cm, pt->s);
        pt->residual = pt->fitted / pt->measured - 1;
        double *worst = pt->held_out ? &p->max_holdout_err : &p->max_fit_err;
        if (fabs(pt->residual) > *worst) *worst = fabs(pt->residual);
    }
    return fit_head(p);
}

// ---- activations --------------------------------------------------------------------------------------

// One layer's block and the shared buffers of model m at T tokens, by the engine's accounting: the
// block is the difference of two layer counts laid out alike (3 or more layers page every block, so
// the model's own count and the next; else 1 and 2); the shared part is what a rank holds beyond
// its resident layers at r = 1 (llama_resident_bytes: two layers when the model offloads, all of
// them when it cannot).
static void engine_bytes(const ModelConfig *m, int T, double *layer, double *shared) {
    ModelConfig a = *m, b = *m;
    a.n_layers = m->n_layers >= 3 ? m->n_layers : 1;
    b.n_layers = a.n_layers + 1;
    *layer = (double)(llama_activation_bytes(&b, T) - llama_activation_bytes(&a, T));
    int resident = m->n_layers >= 3 ? 2 : m->n_layers;
    *shared = (double)llama_resident_bytes(m, T, 1.0) - resident * *layer;
}

int profile_engine_act(const ModelConfig *m, CostModel *cm, double *layer_margin, double *shared_margin) {
    // Every tensor is T x (a whole number of floats) and the head's logits stop growing at the
    // chunk's rows (at most 2M / vocab): from T0, the first multiple of 1024 past that, every
    // multiple of 1024 tokens is whole pages, so the accounting there is exactly a line.
    int T0 = ((1 << 21) / (m->vocab_size > 0 ? m->vocab_size : 1) / 1024 + 1) * 1024, T1 = T0 + 1024;
    double l0, s0, l1, s1;
    engine_bytes(m, T0, &l0, &s0);
    engine_bytes(m, T1, &l1, &s1);
    double la = (l1 - l0) / 1024, lb = l0 - la * T0, sa = (s1 - s0) / 1024, sb = s0 - sa * T0;
    if (!(la > 0) || sa < 0) return bs_fail("model %s: the engine's activation accounting is not increasing", m->name);
    // Elsewhere the tensors round up to 64 bytes and blocks to pages, and below T0 the logits are
    // fewer: the rounding repeats every 1024 tokens, so the largest excess over the line on 1 ..
    // T1 + 1024 is the largest anywhere. Raising the constants by it makes the lines upper bounds.
    double lm = 0, sm = 0;
    for (int T = 1; T <= T1 + 1024; T++) {
        double l, sh;
        engine_bytes(m, T, &l, &sh);
        lm = fmax(lm, l - (la * T + lb));
        sm = fmax(sm, sh - (sa * T + sb));
    }
    cm->act_token = la, cm->act_const = fmax(0.0, lb + lm);
    cm->act_shared_token = sa, cm->act_shared_const = fmax(0.0, sb + sm);
    if (layer_margin) *layer_margin = lm;
    if (shared_margin) *shared_margin = sm;
    return 0;
}

int profile_measure_act(Profile *p) {
    const ProfileConfig *c = &p->cfg;
    if (profile_engine_act(c->model, &p->cm, &p->act_margin, &p->act_shared_margin) != 0) return -1;
    p->act_max_dev = 0;
    for (int i = 0; i < c->n_lengths; i++) {
        ProfilePoint *pt = &p->pts[i];
        pt->s = c->lengths[i];
        engine_bytes(c->model, (int)pt->s, &pt->act_bytes, &pt->shared_bytes);
        p->act_max_dev = fmax(p->act_max_dev, cost_layer_act(&p->cm, pt->s) - pt->act_bytes);
    }
    return 0;
}

// ---- links ----------------------------------------------------------------------------------------------

// Ping-pong between ranks 0 and 1 at the sizes of ring blocks: one member's K/V for a block of t
// tokens (ring_attn.c sends K and V of a block as one message), t = 2C, C, C/2, ... C/64. A ring
// member holds between C/2 and C tokens without offloading, more with it; smaller messages (where
// MPI switches protocols and latency dominates) would pull the fit away from the sizes rings send.
// Rank 0 times groups of `iters` round trips; one group first as warm-up.
static int measure_p2p(Profile *p, Comm *comm, ProfileTick *t) {
    const ProfileConfig *c = &p->cfg;
    if (comm->size < 2) return 0;
    double kv_bytes = 2.0 * c->model->n_kv_heads * c->model->head_dim * sizeof(float);
    int64_t tokens[PROFILE_MAX_SIZES];
    int n = 0;
    for (int64_t x = 2 * c->capacity; x >= 1 && x >= c->capacity / 64 && n < PROFILE_MAX_SIZES; x /= 2)
        if (kv_bytes * (double)x <= P2P_MAX_BYTES) tokens[n++] = x;  // a huge --capacity: its smaller blocks
    for (int i = 0; i < n / 2; i++) {  // ascending
        int64_t x = tokens[i];
        tokens[i] = tokens[n - 1 - i], tokens[n - 1 - i] = x;
    }
    if (n < 2) return bs_fail("--capacity %lld: too few ring-sized messages under %d MiB to fit a link",
                              (long long)c->capacity, P2P_MAX_BYTES >> 20);
    size_t max_bytes = (size_t)(kv_bytes * (double)tokens[n - 1]);
    uint8_t *buf = bs_calloc(max_bytes, 1);
    double *samples = bs_malloc(sizeof(double) * (size_t)c->p2p_reps);
    int rc = buf && samples ? 0 : -1;
    int me = comm->rank;
    for (int i = 0; rc == 0 && i < n; i++) {
        size_t bytes = (size_t)(kv_bytes * (double)tokens[i]);
        int iters = (int)(P2P_SAMPLE_BYTES / bytes);
        iters = iters < 1 ? 1 : iters > P2P_MAX_ITERS ? P2P_MAX_ITERS : iters;
        rc = comm_barrier(comm);
        double wall = 0, cpu = 0;
        for (int g = 0; rc == 0 && me <= 1 && g <= c->p2p_reps; g++) {
            double t0 = now_seconds(), c0 = thread_cpu_seconds();
            for (int it = 0; rc == 0 && it < iters; it++) {
                CommReq req = {0};
                if (me == 0) {
                    rc = comm_isend(comm, buf, bytes, 1, P2P_TAG, &req);
                    if (rc == 0) rc = comm_wait(comm, &req);
                    if (rc == 0) rc = comm_irecv(comm, buf, bytes, 1, P2P_TAG, &req);
                    if (rc == 0) rc = comm_wait(comm, &req);
                } else {
                    rc = comm_irecv(comm, buf, bytes, 0, P2P_TAG, &req);
                    if (rc == 0) rc = comm_wait(comm, &req);
                    if (rc == 0) rc = comm_isend(comm, buf, bytes, 0, P2P_TAG, &req);
                    if (rc == 0) rc = comm_wait(comm, &req);
                }
            }
            if (g > 0) samples[g - 1] = (now_seconds() - t0) / (2.0 * iters);  // one way
            if (g > 0) wall += now_seconds() - t0, cpu += thread_cpu_seconds() - c0;
        }
        // rank 0's samples to everybody, so every rank holds the same profile; and how much of its
        // core each rank had: MPI waits by polling, so a rank that lost its core shows, and then its
        // partner waited for the scheduler, not for the link
        double share = me <= 1 && wall > 0 ? cpu / wall : 1, *shares = NULL;
        if (rc == 0) rc = comm_bcast(comm, samples, sizeof(double) * (size_t)c->p2p_reps, 0);
        if (rc == 0 && !(shares = profile_gather(comm, &share, 1))) rc = -1;
        if (rc != 0) break;
        ProfileLinkPoint *lp = &p->link[i];
        lp->core_share = fmin(shares[0], shares[1]);
        free(shares);
        lp->bytes = (double)bytes;
        lp->iters = iters;
        lp->n_samples = c->p2p_reps;
        lp->samples = bs_malloc(sizeof(double) * (size_t)c->p2p_reps);
        if (!lp->samples) {
            rc = -1;
            break;
        }
        memcpy(lp->samples, samples, sizeof(double) * (size_t)c->p2p_reps);
        lp->seconds = profile_median(samples, c->p2p_reps);
        p->n_link = i + 1;
        char note[64];
        snprintf(note, sizeof note, "links: %zu bytes", bytes);
        profile_tick(t, 1, note);
    }
    free(buf), free(samples);
    if (rc != 0) return bs_fail_ctx("ping-pong between ranks 0 and 1");
    double x[PROFILE_MAX_SIZES], y[PROFILE_MAX_SIZES];
    for (int i = 0; i < p->n_link; i++) x[i] = p->link[i].bytes, y[i] = p->link[i].seconds;
    if (profile_fit_link(x, y, p->n_link, &p->link_lat, &p->link_bw) != 0) return -1;
    for (int i = 0; i < p->n_link; i++) {
        ProfileLinkPoint *lp = &p->link[i];
        lp->fitted = p->link_lat + lp->bytes / p->link_bw;
        lp->residual = lp->fitted / lp->seconds - 1;
    }
    p->p2p_measured = 1;
    return 0;
}

// ---- the offload tier ----------------------------------------------------------------------------------

// The file tier as the model uses it: page-aligned chunks of one layer's activations at the
// capacity (what r = 1 moves per layer), written at increasing offsets and read back. One untimed
// write pass first gives the file its blocks; training overwrites the same offsets every micro-batch.
static int measure_tier(Profile *p, Comm *comm, ProfileTick *t) {
    const ProfileConfig *c = &p->cfg;
    size_t total_cap = arena_page_round((size_t)c->tier_bytes);
    size_t chunk = arena_page_round((size_t)cost_layer_act(&p->cm, c->capacity));
    if (chunk < TIER_MIN_CHUNK) chunk = TIER_MIN_CHUNK;
    if (chunk > total_cap) chunk = total_cap;
    size_t n_chunks = total_cap / chunk;
    double total = (double)(n_chunks * chunk);
    p->tier_chunk = (int64_t)chunk;
    OffloadTier tier;
    if (offload_tier_file(&tier, c->offload_dir) != 0) return bs_fail_ctx("the offload tier");
    snprintf(p->tier_name, sizeof p->tier_name, "%s", tier.name);
    Arena a;
    int rc = arena_init_pages(&a, chunk);
    if (rc == 0) memset(a.base, 0x5a, chunk);  // written pages: nothing is read from the zero page
    double *mine = bs_malloc(sizeof(double) * 2 * (size_t)c->tier_reps), *all = NULL;
    if (!mine) rc = -1;
    char note[64];
    for (int r = 0; rc == 0 && r <= c->tier_reps; r++) {
        rc = comm_barrier(comm);  // every rank's copies at once, as every rank offloads in training
        double t0 = now_seconds();
        for (size_t k = 0; rc == 0 && k < n_chunks; k++)
            rc = tier.write(tier.ctx, 0, a.base, chunk, (uint64_t)(k * chunk));
        double t1 = now_seconds();
        for (size_t k = 0; rc == 0 && r > 0 && k < n_chunks; k++)
            rc = tier.read(tier.ctx, 0, a.base, chunk, (uint64_t)(k * chunk));
        double t2 = now_seconds();
        if (rc == 0 && r > 0) mine[2 * (r - 1)] = total / (t1 - t0), mine[2 * (r - 1) + 1] = total / (t2 - t1);
        snprintf(note, sizeof note, "offload tier: %s %d of %d", r ? "pass" : "first write", r, c->tier_reps);
        profile_tick(t, tier_units(c) / 2, note);
    }
    if (rc != 0) bs_fail_ctx("%s", tier.name);
    offload_tier_close(&tier);
    arena_free(&a);
    if (rc == 0 && !(all = profile_gather(comm, mine, 2 * c->tier_reps))) rc = -1;
    int ns = c->tier_reps * comm->size;
    if (rc == 0) {
        p->tier_write = bs_malloc(sizeof(double) * (size_t)ns);
        p->tier_read = bs_malloc(sizeof(double) * (size_t)ns);
        if (!p->tier_write || !p->tier_read) rc = -1;
    }
    for (int i = 0; rc == 0 && i < ns; i++) p->tier_write[i] = all[2 * i], p->tier_read[i] = all[2 * i + 1];
    if (rc == 0) {
        p->n_tier = ns;
        p->tier_write_bw = profile_median(p->tier_write, ns);
        p->tier_read_bw = profile_median(p->tier_read, ns);
    }
    free(mine), free(all);
    return rc;
}

// ---- the machine ----------------------------------------------------------------------------------------

static void describe_machine(Profile *p) {
    p->cores = (int)sysconf(_SC_NPROCESSORS_ONLN);
    snprintf(p->cpu, sizeof p->cpu, "unknown");
    FILE *f = fopen("/proc/cpuinfo", "r");
    char line[512];
    while (f && fgets(line, sizeof line, f)) {
        if (strncmp(line, "model name", 10) != 0) continue;
        const char *v = strchr(line, ':');
        if (!v) continue;
        v += 1 + (v[1] == ' ');
        snprintf(p->cpu, sizeof p->cpu, "%.*s", (int)strcspn(v, "\n"), v);
        break;
    }
    if (f) fclose(f);
    const char *cfg = openblas_get_config();
    snprintf(p->blas, sizeof p->blas, "%s", cfg ? cfg : "OpenBLAS");
    p->blas_threads = openblas_get_num_threads();
    time_t now = time(NULL);
    struct tm tm;
    gmtime_r(&now, &tm);
    strftime(p->date, sizeof p->date, "%Y-%m-%dT%H:%M:%SZ", &tm);
}

// ---- the whole profile ---------------------------------------------------------------------------------

int profile_run(Profile *p, const ProfileConfig *c, Comm *comm) {
    memset(p, 0, sizeof *p);
    p->cfg = *c;
    if (profile_config_check(c) != 0) return -1;
    double t_start = now_seconds();
    p->n_ranks = comm->size;
    // a rank is one core: the cost model's coefficients are per rank, and OpenBLAS would otherwise
    // spread one rank's matmuls over the cores its neighbours use
    openblas_set_num_threads(1);
    describe_machine(p);
    const HardwareProfile *cpu = hw_find("cpu");
    if (!cpu || cost_derive(&p->derived, c->model, cpu, 1, 1, c->hdp_ranks, c->capacity) != 0)
        return bs_fail_ctx("the `cpu` profile's cost model");
    p->cm = p->derived;  // what is not measured below stays the `cpu` profile's

    Progress pr;
    int64_t units = 0;
    for (int i = 0; i < c->n_lengths; i++)
        units += (int64_t)(c->warmup + c->reps) * compute_units(p, c->lengths[i]);
    units += profile_ring_units(p) + (comm->size > 1 ? 32 : 0) + tier_units(c) * (c->tier_reps + 1) / 2 +
             profile_3d_units(p, comm);
    progress_start(&pr, "profile", units);
    pr.quiet |= c->quiet || comm->rank != 0;
    ProfileTick t = {&pr, 0};

    if (profile_measure_act(p) != 0) return -1;
    if (profile_measure_compute(p, comm, &pr, &t.done) != 0) return -1;
    // the ring step before the layer's fit: its floor comes out of the layer's constant
    if (profile_measure_ring(p, comm, &pr, &t.done) != 0) return -1;
    if (profile_fit_compute(p) != 0) return -1;
    if (measure_p2p(p, comm, &t) != 0) return -1;
    if (profile_measure_3d(p, comm, &t) != 0) return -1;
    if (measure_tier(p, comm, &t) != 0) return -1;
    progress_finish(&pr, units, "done");

    CostModel *cm = &p->cm;
    cm->capacity_bytes = cost_rank_act(cm, (double)c->capacity, 0.0);
    if (p->p2p_measured) {  // one node: both levels are the link just measured
        cm->ring_bw = cm->ring_bw_intra = p->link_bw;
        cm->ring_lat = cm->ring_lat_intra = p->link_lat;
    }
    if (!p->measured_3d) {  // one process: the link's figures, as cost_load takes them for an old file
        cm->tp_bw = cm->stage_bw = cm->ring_bw_intra;
        cm->tp_lat = cm->stage_lat = cm->ring_lat_intra;
    }
    // the model copies out during forward and back during backward, one direction at a time
    cm->offload_bw = fmin(p->tier_write_bw, p->tier_read_bw);
    p->seconds = now_seconds() - t_start;
    return 0;
}

void profile_free(Profile *p) {
    for (int i = 0; i < PROFILE_MAX_LENGTHS; i++) free(p->pts[i].samples);
    for (int i = 0; i < PROFILE_MAX_SIZES; i++) free(p->link[i].samples);
    for (int i = 0; i < PROFILE_MAX_RING; i++) free(p->ring[i].samples);
    free(p->tier_write), free(p->tier_read);
    memset(p, 0, sizeof *p);
}

// ---- printing ----------------------------------------------------------------------------------------------

double profile_spread(const double *v, int n, double median) {
    double lo = INFINITY, hi = -INFINITY;
    for (int j = 0; j < n; j++) lo = fmin(lo, v[j]), hi = fmax(hi, v[j]);
    return (hi - lo) / median;
}

void profile_print(FILE *f, const Profile *p) {
    const ProfileConfig *c = &p->cfg;
    const ModelConfig *m = c->model;
    const CostModel *cm = &p->cm, *d = &p->derived;
    int La = c->layers[0], Lb = c->layers[1];
    fprintf(f, "profile: model %s (%d layers, d_model %d, %d heads, %d K/V heads of %d), %d rank%s\n", m->name,
            m->n_layers, m->d_model, m->n_heads, m->n_kv_heads, m->head_dim, p->n_ranks, p->n_ranks > 1 ? "s" : "");
    fprintf(f, "machine: %s, %d cores, %s, %d BLAS thread%s per rank, %s\n\n", p->cpu, p->cores, p->blas,
            p->blas_threads, p->blas_threads == 1 ? "" : "s", p->date);

    int n_held = 0;
    for (int i = 0; i < p->n_pts; i++) n_held += p->pts[i].held_out;
    fprintf(f, "compute: one layer, forward + backward, on one causal sequence of s tokens = (%d-layer model - "
               "%d-layer model) / %d;\n%s time, median of %d sample%s per length (%d run%s after %d warm-up, x %d "
               "rank%s)\n",
            Lb, La, Lb - La, c->wall_clock ? "wall-clock" : "CPU (the rank's thread)", p->pts[0].n_samples,
            p->pts[0].n_samples == 1 ? "" : "s", c->reps, c->reps == 1 ? "" : "s", c->warmup, p->n_ranks,
            p->n_ranks == 1 ? "" : "s");
    fprintf(f, "%8s %11s %11s %11s %11s %9s %7s %5s  %s\n", "s", "model A ms", "model B ms", "layer ms", "fitted ms",
            "residual", "spread", "core", "");
    for (int i = 0; i < p->n_pts; i++) {
        const ProfilePoint *pt = &p->pts[i];
        fprintf(f, "%8lld %11.3f %11.3f %11.3f %11.3f %+8.1f%% %6.0f%% %5.2f  %s\n", (long long)pt->s,
                1e3 * pt->model_t[0], 1e3 * pt->model_t[1], 1e3 * pt->measured, 1e3 * pt->fitted, 100 * pt->residual,
                100 * profile_spread(pt->samples, pt->n_samples, pt->measured), pt->core_share, pt->held_out ? "held out" : "");
    }
    double a1 = cm->attn_pair / 2, b1 = cm->lin_token + cm->attn_pair / 2;
    fprintf(f, "(model A: %d layer%s, B: %d layers; residual = fitted / measured - 1; spread = (max - min) / median of "
               "the samples;\n core = CPU seconds / wall seconds of the runs, median: below ~0.9 the rank shared its "
               "core with another process)\n",
            La, La == 1 ? "" : "s", Lb);
    fprintf(f, "fit on %d lengths (%d held out), least squares weighted by 1/T^2 (relative error), "
               "coefficients >= 0:\n",
            p->n_pts - n_held, n_held);
    fprintf(f, "  T(s) = a1 s^2 + b1 s + c:  a1 = %.4e s, b1 = %.4e s, c = %.4e s\n", a1, b1, p->layer_c);
    fprintf(f, "  attn_pair = 2 a1 = %.4e s, lin_token = b1 - a1 = %.4e s, layer_const = max(0, c - attn_step) = %.4e "
               "s, attn_step = %.4e s (the ring step below)\n",
            cm->attn_pair, cm->lin_token, cm->layer_const, cm->attn_step);
    if (p->layer_c < cm->attn_step)  // then cost_layer_time, the fitted column, is above the fit
        fprintf(f, "  (c < attn_step: the cost model's T(s) is the fit + %.4e s, as the fitted column shows)\n",
                cm->attn_step - p->layer_c);
    fprintf(f, "  largest |residual|: %.1f%% on the fitted lengths", 100 * p->max_fit_err);
    if (n_held) fprintf(f, ", %.1f%% on the held-out lengths", 100 * p->max_holdout_err);
    fprintf(f, "\n  the `cpu` profile derives attn_pair %.4e, lin_token %.4e, layer_const %.4e: measured / derived "
               "%.2f, %.2f\n\n",
            d->attn_pair, d->lin_token, d->layer_const, cm->attn_pair / d->attn_pair, cm->lin_token / d->lin_token);
    profile_ring_print(f, p);

    fprintf(f, "head: the embedding, output head and loss = model A - %d x layer, fitted to head_token s + "
               "head_const:\n  head_token = %.4e s, head_const = %.4e s; largest |fitted - measured| %.1f%% of "
               "model A's time\n\n",
            La, cm->head_token, cm->head_const, 100 * p->max_head_err);

    fprintf(f, "activations: the engine's accounting (llama_activation_bytes, llama_resident_bytes), upper lines:\n");
    fprintf(f, "  Act(s) = act_token s + act_const = %.17g s + %.17g bytes per layer (rounding margin %.0f)\n",
            cm->act_token, cm->act_const, p->act_margin);
    fprintf(f, "  shared = act_shared_token s + act_shared_const = %.17g s + %.17g bytes per rank (margin %.0f)\n",
            cm->act_shared_token, cm->act_shared_const, p->act_shared_margin);
    fprintf(f, "  the `cpu` profile derives act_token %.0f (it counts the norm and SwiGLU outputs, which the engine "
               "recomputes)\n\n",
            d->act_token);

    if (p->p2p_measured) {
        fprintf(f, "links: ping-pong between ranks 0 and 1 (Comm, MPI), one way = round trip / 2, median of %d:\n",
                c->p2p_reps);
        fprintf(f, "%12s %8s %11s %11s %9s %7s %5s\n", "bytes", "tokens", "us", "fitted us", "residual", "spread",
                "core");
        double kv = 2.0 * c->model->n_kv_heads * c->model->head_dim * sizeof(float);
        for (int i = 0; i < p->n_link; i++) {
            const ProfileLinkPoint *lp = &p->link[i];
            fprintf(f, "%12.0f %8.0f %11.2f %11.2f %+8.1f%% %6.0f%% %5.2f\n", lp->bytes, lp->bytes / kv,
                    1e6 * lp->seconds, 1e6 * lp->fitted, 100 * lp->residual,
                    100 * profile_spread(lp->samples, lp->n_samples, lp->seconds), lp->core_share);
        }
        fprintf(f, "  (core: the lesser share of its core rank 0 or 1 had; below ~0.9 the times are the "
                   "scheduler's)\n");
        fprintf(f, "  fit (weights 1/t^2): lat = %.2f us, bw = %.3f GB/s -> ring_lat, ring_lat_intra, ring_bw, "
                   "ring_bw_intra\n\n",
                1e6 * p->link_lat, p->link_bw / 1e9);
    } else {
        fprintf(f, "links: not measured (one process): ring_bw %.3g, ring_lat %.3g, ring_bw_intra %.3g, ring_lat_intra "
                   "%.3g are the `cpu` profile's; run under mpirun -np 2 to measure them\n\n",
                cm->ring_bw, cm->ring_lat, cm->ring_bw_intra, cm->ring_lat_intra);
    }

    profile_3d_print(f, p);

    fprintf(f, "offload tier: %s\n", p->tier_name);
    fprintf(f, "  %lld MiB in chunks of %.1f MiB, median of %d: write %.3f GB/s, read %.3f GB/s -> offload_bw = %.3f "
               "GB/s (the slower; `cpu` profile: %.3g)\n\n",
            (long long)(c->tier_bytes >> 20), (double)p->tier_chunk / (1 << 20), p->n_tier, p->tier_write_bw / 1e9,
            p->tier_read_bw / 1e9, cm->offload_bw / 1e9, d->offload_bw);

    fprintf(f, "from cost_derive on the `cpu` profile (%d HDP ranks, capacity %lld): n_layers %d, ranks_per_node %d, "
               "kv_token %.0f, grad_sync %.4g s, optimizer %.4g s\n",
            c->hdp_ranks, (long long)c->capacity, cm->n_layers, cm->ranks_per_node, cm->kv_token, cm->grad_sync,
            cm->optimizer);
    fprintf(f, "capacity_bytes = shared(C) + n_layers x Act(C) = %.6g (the engine's; the `cpu` profile's: %.6g)\n",
            cm->capacity_bytes, d->capacity_bytes);
    fprintf(f, "took %.1f s\n", p->seconds);
}

// ---- the file ------------------------------------------------------------------------------------------------

// Where each field of the file came from.
static const char *field_source(const Profile *p, const char *key, int *measured) {
    *measured = 1;
    if (!strcmp(key, "attn_pair") || !strcmp(key, "lin_token"))
        return "fit of T(s) to the per-layer times (compute.points)";
    if (!strcmp(key, "layer_const"))
        return "fit of T(s) to the per-layer times (compute.points): max(0, its constant c - attn_step)";
    if (!strcmp(key, "attn_step")) {
        *measured = p->n_ring > 0;
        return p->n_ring > 0 ? "fit of attn_step + pairs x rate to one ring step's block times (ring_step.points)"
                             : "the `cpu` hardware profile (not measured)";
    }
    if (!strncmp(key, "act_", 4))
        return "the engine's accounting, llama_activation_bytes and llama_resident_bytes (activations)";
    if (!strncmp(key, "head_", 5)) return "fit of the model's time beyond its layers (head.points)";
    if (!strncmp(key, "ring_", 5)) {
        *measured = p->p2p_measured;
        return p->p2p_measured ? "fit of lat + bytes / bw to the ping-pong between ranks 0 and 1 (links.points)"
                               : "the `cpu` hardware profile (one process: not measured)";
    }
    if (!strncmp(key, "tp_", 3) || !strncmp(key, "stage_", 6)) {
        *measured = p->measured_3d;
        if (!p->measured_3d) return "ring_bw_intra / ring_lat_intra (one process: not measured)";
        return key[0] == 't' ? "fit of lat + bytes / bw to the all-reduce of rows x d_model floats (3d.tp_allreduce), "
                               "in the ring form: tp_bw = 2 (W-1)/W bw, tp_lat = lat / (2 (W-1))"
                             : "fit of lat + bytes / bw to rows x d_model floats between ranks 0 and 1 (3d.stage)";
    }
    if (!strcmp(key, "offload_bw")) return "min(write, read) bandwidth of the offload tier (offload)";
    if (!strcmp(key, "capacity_bytes"))
        return "what C = settings.capacity tokens hold without offloading: shared(C) + n_layers x Act(C)";
    *measured = 0;
    return "cost_derive on the `cpu` hardware profile";
}

cJSON *profile_number_array(const double *v, int n) {
    cJSON *a = cJSON_CreateArray();
    for (int i = 0; a && i < n; i++) cJSON_AddItemToArray(a, cJSON_CreateNumber(v[i]));
    return a;
}

static cJSON *profile_json(const Profile *p) {
    const ProfileConfig *c = &p->cfg;
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "format", "bytescale-profile");
    cJSON_AddNumberToObject(o, "format_version", 1);
    cJSON_AddStringToObject(o, "model", c->model->name);
    cJSON_AddNumberToObject(o, "seconds", p->seconds);

    cJSON *mach = cJSON_AddObjectToObject(o, "machine");
    cJSON_AddStringToObject(mach, "cpu", p->cpu);
    cJSON_AddNumberToObject(mach, "cores", p->cores);
    cJSON_AddStringToObject(mach, "blas", p->blas);
    cJSON_AddNumberToObject(mach, "blas_threads", p->blas_threads);
    cJSON_AddNumberToObject(mach, "ranks", p->n_ranks);
    cJSON_AddStringToObject(mach, "date", p->date);

    cJSON *set = cJSON_AddObjectToObject(o, "settings");
    double lens[PROFILE_MAX_LENGTHS];
    for (int i = 0; i < c->n_lengths; i++) lens[i] = (double)c->lengths[i];
    cJSON_AddItemToObject(set, "lengths", profile_number_array(lens, c->n_lengths));
    cJSON_AddNumberToObject(set, "reps", c->reps);
    cJSON_AddNumberToObject(set, "warmup", c->warmup);
    double layers[2] = {c->layers[0], c->layers[1]};
    cJSON_AddItemToObject(set, "layers", profile_number_array(layers, 2));
    cJSON_AddNumberToObject(set, "holdout", c->holdout);
    cJSON_AddStringToObject(set, "clock", c->wall_clock ? "wall" : "cpu");
    cJSON_AddNumberToObject(set, "capacity", (double)c->capacity);
    cJSON_AddNumberToObject(set, "hdp_ranks", c->hdp_ranks);
    cJSON_AddNumberToObject(set, "p2p_reps", c->p2p_reps);
    cJSON_AddNumberToObject(set, "tier_bytes", (double)c->tier_bytes);
    cJSON_AddNumberToObject(set, "tier_reps", c->tier_reps);

    cJSON *fields = cJSON_AddObjectToObject(o, "fields");
    const char *extra[] = {"n_layers", "ranks_per_node"};
    for (int i = 0; i < cost_field_count() + 2; i++) {
        const char *key = i < cost_field_count() ? cost_field_name(i) : extra[i - cost_field_count()];
        int measured;
        const char *src = field_source(p, key, &measured);
        cJSON *fo = cJSON_AddObjectToObject(fields, key);
        cJSON_AddBoolToObject(fo, "measured", measured);
        cJSON_AddStringToObject(fo, "source", src);
    }

    const CostModel *cm = &p->cm;
    cJSON *comp = cJSON_AddObjectToObject(o, "compute");
    cJSON_AddStringToObject(comp, "method", "per layer = (model with layers[1] - model with layers[0]) / (layers[1] - "
                                            "layers[0]), llama_forward_backward on one causal sequence of s tokens, "
                                            "paired runs, settings.clock seconds; median over every rank's "
                                            "runs");
    cJSON_AddStringToObject(comp, "fit", "T(s) = attn_pair s(s+1)/2 + lin_token s + c = a1 s^2 + b1 s + c, least "
                                         "squares weighted by 1/T^2, coefficients >= 0, held-out lengths excluded; "
                                         "layer_const = max(0, c - attn_step): the layer's one attention block's "
                                         "floor is attn_step (ring_step), which cost_layer_time adds; fitted = "
                                         "cost_layer_time");
    json_add_exact(comp, "a1", cm->attn_pair / 2);
    json_add_exact(comp, "b1", cm->lin_token + cm->attn_pair / 2);
    json_add_exact(comp, "c", p->layer_c);
    cJSON_AddNumberToObject(comp, "max_fit_residual", p->max_fit_err);
    cJSON_AddNumberToObject(comp, "max_held_out_residual", p->max_holdout_err);
    cJSON *pts = cJSON_AddArrayToObject(comp, "points");
    for (int i = 0; i < p->n_pts; i++) {
        const ProfilePoint *pt = &p->pts[i];
        cJSON *e = cJSON_CreateObject();
        cJSON_AddNumberToObject(e, "s", (double)pt->s);
        cJSON_AddBoolToObject(e, "held_out", pt->held_out);
        cJSON_AddNumberToObject(e, "measured", pt->measured);
        cJSON_AddNumberToObject(e, "fitted", pt->fitted);
        cJSON_AddNumberToObject(e, "residual", pt->residual);
        cJSON_AddNumberToObject(e, "core_share", pt->core_share);
        cJSON_AddItemToObject(e, "model_seconds", profile_number_array(pt->model_t, 2));
        cJSON_AddItemToObject(e, "samples", profile_number_array(pt->samples, pt->n_samples));
        cJSON_AddItemToArray(pts, e);
    }

    cJSON_AddItemToObject(o, "ring_step", profile_ring_json(p));

    cJSON *hd = cJSON_AddObjectToObject(o, "head");
    cJSON_AddStringToObject(hd, "method", "head(s) = compute.points[].model_seconds[0] - layers[0] x the per-layer "
                                          "time; fit head_token s + head_const, weights 1/model_seconds[0]^2, >= 0");
    cJSON_AddNumberToObject(hd, "max_error_of_model", p->max_head_err);
    cJSON *hpts = cJSON_AddArrayToObject(hd, "points");
    for (int i = 0; i < p->n_pts; i++) {
        cJSON *e = cJSON_CreateObject();
        cJSON_AddNumberToObject(e, "s", (double)p->pts[i].s);
        cJSON_AddNumberToObject(e, "measured", p->pts[i].head);
        cJSON_AddNumberToObject(e, "fitted", p->pts[i].head_fitted);
        cJSON_AddItemToArray(hpts, e);
    }

    cJSON *act = cJSON_AddObjectToObject(o, "activations");
    cJSON_AddStringToObject(act, "method", "one layer = llama_activation_bytes(L + 1 layers) - llama_activation_bytes("
                                           "L) (L = the model's layers if >= 3, else 1); shared = llama_resident_bytes("
                                           "s, r = 1) - the resident layers; each the line through two lengths where "
                                           "the accounting is exact, its constant raised by the rounding margin");
    cJSON_AddNumberToObject(act, "layer_margin_bytes", p->act_margin);
    cJSON_AddNumberToObject(act, "shared_margin_bytes", p->act_shared_margin);
    cJSON_AddNumberToObject(act, "max_deviation_bytes", p->act_max_dev);
    cJSON *apts = cJSON_AddArrayToObject(act, "points");
    for (int i = 0; i < p->n_pts; i++) {
        cJSON *e = cJSON_CreateObject();
        cJSON_AddNumberToObject(e, "s", (double)p->pts[i].s);
        cJSON_AddNumberToObject(e, "bytes", p->pts[i].act_bytes);
        cJSON_AddNumberToObject(e, "shared_bytes", p->pts[i].shared_bytes);
        cJSON_AddItemToArray(apts, e);
    }

    cJSON *ln = cJSON_AddObjectToObject(o, "links");
    cJSON_AddBoolToObject(ln, "measured", p->p2p_measured);
    if (p->p2p_measured) {
        cJSON_AddStringToObject(ln, "method", "ping-pong between ranks 0 and 1 through the Comm API (MPI); one way = "
                                              "round trip / 2; median of the samples; fit lat + bytes / bw weighted "
                                              "by 1/t^2");
        json_add_exact(ln, "lat", p->link_lat);
        json_add_exact(ln, "bw", p->link_bw);
        cJSON *lpts = cJSON_AddArrayToObject(ln, "points");
        for (int i = 0; i < p->n_link; i++) {
            const ProfileLinkPoint *lp = &p->link[i];
            cJSON *e = cJSON_CreateObject();
            cJSON_AddNumberToObject(e, "bytes", lp->bytes);
            cJSON_AddNumberToObject(e, "seconds", lp->seconds);
            cJSON_AddNumberToObject(e, "fitted", lp->fitted);
            cJSON_AddNumberToObject(e, "residual", lp->residual);
            cJSON_AddNumberToObject(e, "round_trips_per_sample", lp->iters);
            cJSON_AddNumberToObject(e, "core_share", lp->core_share);
            cJSON_AddItemToObject(e, "samples", profile_number_array(lp->samples, lp->n_samples));
            cJSON_AddItemToArray(lpts, e);
        }
    } else {
        cJSON_AddStringToObject(ln, "method", "not measured: one process; the ring_* fields are the `cpu` profile's");
    }

    cJSON_AddItemToObject(o, "3d", profile_3d_json(p));

    cJSON *off = cJSON_AddObjectToObject(o, "offload");
    cJSON_AddStringToObject(off, "tier", p->tier_name);
    cJSON_AddNumberToObject(off, "bytes", (double)c->tier_bytes);
    cJSON_AddNumberToObject(off, "chunk_bytes", (double)p->tier_chunk);
    cJSON_AddNumberToObject(off, "write_bw", p->tier_write_bw);
    cJSON_AddNumberToObject(off, "read_bw", p->tier_read_bw);
    cJSON_AddItemToObject(off, "write_samples", profile_number_array(p->tier_write, p->n_tier));
    cJSON_AddItemToObject(off, "read_samples", profile_number_array(p->tier_read, p->n_tier));

    cJSON *der = cJSON_AddObjectToObject(o, "cpu_profile");  // for comparison: what the analytic model says
    for (int i = 0; i < cost_field_count(); i++) cJSON_AddNumberToObject(der, cost_field_name(i), cost_field_value(&p->derived, i));
    return o;
}

int profile_write(const Profile *p, const char *path) {
    const CostModel *cm = &p->cm;
    cJSON *root = cJSON_CreateObject();
    if (!root) return bs_fail("%s: out of memory building JSON", path);
    // the cost model first, exactly as cost_save writes it, so the file reloads bit for bit
    int ok = cJSON_AddNumberToObject(root, "version", 1) != NULL;
    ok = ok && cJSON_AddNumberToObject(root, "n_layers", cm->n_layers);
    ok = ok && cJSON_AddNumberToObject(root, "ranks_per_node", cm->ranks_per_node);
    for (int i = 0; ok && i < cost_field_count(); i++) ok = json_add_exact(root, cost_field_name(i), cost_field_value(cm, i));
    cJSON *prof = ok ? profile_json(p) : NULL;
    ok = prof && cJSON_AddItemToObject(root, "profile", prof);
    int rc = ok ? json_write_file(path, root, 1) : bs_fail("%s: out of memory building JSON", path);
    cJSON_Delete(root);
    if (rc != 0) return -1;
    // what plan and simulate will read: the same numbers, or the file is no use
    CostModel back;
    if (cost_load(&back, path) != 0) return bs_fail_ctx("the profile just written does not load");
    for (int i = 0; i < cost_field_count(); i++)
        if (cost_field_value(&back, i) != cost_field_value(cm, i))
            return bs_fail("%s: \"%s\" reads back as %.17g, not %.17g", path, cost_field_name(i), cost_field_value(&back, i),
                           cost_field_value(cm, i));
    return 0;
}

// ---- the plot ------------------------------------------------------------------------------------------------

static const char *base_name(const char *path) {
    const char *s = strrchr(path, '/');
    return s ? s + 1 : path;
}

int profile_plot(const Profile *p, const char *prefix) {
    char gp[PROFILE_PATH_MAX + 8], png[PROFILE_PATH_MAX + 8], svg[PROFILE_PATH_MAX + 8];
    snprintf(gp, sizeof gp, "%s.gp", prefix);
    snprintf(png, sizeof png, "%s.png", prefix);
    snprintf(svg, sizeof svg, "%s.svg", prefix);
    const CostModel *cm = &p->cm, *d = &p->derived;
    AtomicFile af;
    if (atomic_open(&af, gp) != 0) return -1;
    FILE *f = af.f;
    fprintf(f, "# %s: bytescale profile, model %s: one layer's forward + backward time, measured (median, min-max "
               "bars) and fitted\n# (written by bytescale profile --plot; run from this directory)\n",
            base_name(prefix), p->cfg.model->name);
    for (int held = 0; held < 2; held++) {
        fprintf(f, "$%s << EOD\n", held ? "held" : "fit");  // s, median ms, min ms, max ms
        for (int i = 0; i < p->n_pts; i++) {
            const ProfilePoint *pt = &p->pts[i];
            if (pt->held_out != held) continue;
            double lo = INFINITY, hi = -INFINITY;
            for (int j = 0; j < pt->n_samples; j++) lo = fmin(lo, pt->samples[j]), hi = fmax(hi, pt->samples[j]);
            fprintf(f, "%lld %.6g %.6g %.6g\n", (long long)pt->s, 1e3 * pt->measured, 1e3 * fmax(lo, 1e-9), 1e3 * hi);
        }
        fprintf(f, "EOD\n");
    }
    // cost_layer_time: one attention block, so its floor attn_step on top of layer_const
    fprintf(f, "fit(x) = 1e3 * (%.17g * x * (x + 1) / 2 + %.17g * x + %.17g)\n", cm->attn_pair, cm->lin_token,
            cm->layer_const + cm->attn_step);
    fprintf(f, "cpu(x) = 1e3 * (%.17g * x * (x + 1) / 2 + %.17g * x + %.17g)\n", d->attn_pair, d->lin_token,
            d->layer_const + d->attn_step);
    int n_held = 0;
    for (int i = 0; i < p->n_pts; i++) n_held += p->pts[i].held_out;
    double lo = (double)p->pts[0].s / 1.25, hi = (double)p->pts[p->n_pts - 1].s * 1.25;
    fprintf(f, "set title \"%s: one layer, forward + backward (%d rank%s, %s)\"\n", p->cfg.model->name, p->n_ranks,
            p->n_ranks > 1 ? "s" : "", p->date);
    fprintf(f, "set logscale xy\nset grid\nset key top left\nset samples 200\nset xrange [%g:%g]\n", lo, hi);
    fprintf(f, "set xlabel \"sequence length s (tokens)\"\nset ylabel \"ms per layer\"\nset xtics (");
    for (int i = 0; i < p->n_pts; i++) {  // the measured lengths: a log axis over a few octaves has few tics
        int64_t x = p->pts[i].s;
        if (x >= 1024 && x % 1024 == 0)
            fprintf(f, "%s\"%lldK\" %lld", i ? ", " : "", (long long)x / 1024, (long long)x);
        else if (x >= 1024) fprintf(f, "%s\"%.1fK\" %lld", i ? ", " : "", (double)x / 1024, (long long)x);
        else fprintf(f, "%s\"%lld\" %lld", i ? ", " : "", (long long)x, (long long)x);
    }
    fprintf(f, ")\n");
    fprintf(f, "if (strstrt(GPVAL_TERMINALS, \"pngcairo\") > 0) { set terminal pngcairo size 800,500 noenhanced } "
               "else { set terminal png size 800,500 noenhanced }\n");
    fprintf(f, "set output \"%s\"\n", base_name(png));
    fprintf(f, "plot fit(x) with lines lw 2 lc rgb \"#08519c\" title \"fit: T(s) = %.3g s^2 + %.3g s + %.3g\", \\\n",
            cm->attn_pair / 2, cm->lin_token + cm->attn_pair / 2, cm->layer_const + cm->attn_step);
    fprintf(f, "     cpu(x) with lines dt 2 lc rgb \"#969696\" title \"cpu profile (derived, not measured)\", \\\n");
    fprintf(f, "     $fit using 1:2:3:4 with yerrorbars pt 7 lc rgb \"#e6550d\" title \"measured (fitted)\"%s\n",
            n_held ? ", \\" : "");
    if (n_held)
        fprintf(f, "     $held using 1:2:3:4 with yerrorbars pt 6 ps 1.5 lc rgb \"#31a354\" title \"measured (held "
                   "out)\"\n");
    fprintf(f, "set terminal svg size 800,500 noenhanced\nset output \"%s\"\nreplot\n", base_name(svg));
    if (atomic_close(&af) != 0) return -1;
    return sim_gnuplot(gp);
}
