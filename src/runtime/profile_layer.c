// profile_layer.c: one layer's compute time T(s), the cost model's attn_pair, lin_token and
// layer_const (profile.h, docs/profile.md "Compute: T(s) of one layer").
//
// Measured on the engine itself: llama_forward_backward on one causal sequence of s tokens, with two
// layer counts A < B, so (B - A) layers' time is the difference and the embedding, head and loss
// (profile_head.c) drop out. Fitted by profile_fit_time (profile_fit.c), held-out lengths excluded.
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "bytescale/error.h"
#include "bytescale/json.h"
#include "bytescale/llama.h"
#include "bytescale/rng.h"
#include "bytescale/timer.h"
#include "profile_internal.h"

// Progress units of one (length, repetition): estimated milliseconds on the `cpu` profile's T(s), so
// the ETA holds although the longest lengths take most of the time (profile_internal.h).
int64_t profile_compute_units(const Profile *p, int64_t s) {
    double ms = 1e3 * cost_layer_time(&p->derived, s) * (p->cfg.layers[0] + p->cfg.layers[1]);
    return ms > 1 ? (int64_t)ms : 1;
}

// ---- measuring ------------------------------------------------------------------------------------------

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
            profile_tick(&t, profile_compute_units(p, T), note);
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

// ---- fitting ----------------------------------------------------------------------------------------------

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
    return profile_fit_head(p);
}

// ---- reporting ----------------------------------------------------------------------------------------

// (profile_internal.h)
void profile_layer_print(FILE *f, const Profile *p) {
    const ProfileConfig *c = &p->cfg;
    const CostModel *cm = &p->cm, *d = &p->derived;
    int La = c->layers[0], Lb = c->layers[1];
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
}

// (profile_internal.h)
cJSON *profile_layer_json(const Profile *p) {
    const CostModel *cm = &p->cm;
    cJSON *comp = cJSON_CreateObject();
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
    return comp;
}
