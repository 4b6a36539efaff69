// adamw.c: AdamW on a shard of the flat parameter vector, gradient clipping helpers, and the
// warmup + cosine learning-rate schedule (see optim.h).
#include "bytescale/optim.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "bytescale/error.h"

AdamWConfig adamw_defaults(void) {
    AdamWConfig c = {.beta1 = 0.9, .beta2 = 0.95, .eps = 1e-8, .weight_decay = 0.1};
    return c;
}

static int cmp_range(const void *a, const void *b) {
    const DecayRange *x = a, *y = b;
    return (x->begin > y->begin) - (x->begin < y->begin);
}

int adamw_init(AdamW *opt, const AdamWConfig *cfg, size_t begin, size_t end, const DecayRange *ranges,
               int n_ranges) {
    memset(opt, 0, sizeof *opt);
    if (end < begin) return bs_fail("adamw: shard [%zu, %zu) ends before it begins", begin, end);
    if (!(cfg->beta1 >= 0 && cfg->beta1 < 1 && cfg->beta2 >= 0 && cfg->beta2 < 1 && cfg->eps > 0 &&
          cfg->weight_decay >= 0))
        return bs_fail("adamw: need 0 <= beta1, beta2 < 1, eps > 0, weight_decay >= 0 (got %g, %g, %g, %g)",
                       cfg->beta1, cfg->beta2, cfg->eps, cfg->weight_decay);
    // keep the parts of the ranges inside the shard, in order, and check they tile it exactly
    DecayRange *own = bs_calloc(n_ranges > 0 ? (size_t)n_ranges : 1, sizeof *own);
    if (!own) return -1;
    int n = 0;
    for (int i = 0; i < n_ranges; i++) {
        size_t b = ranges[i].begin > begin ? ranges[i].begin : begin;
        size_t e = ranges[i].end < end ? ranges[i].end : end;
        if (b < e) own[n++] = (DecayRange){b, e, ranges[i].decay};
    }
    qsort(own, (size_t)n, sizeof *own, cmp_range);
    size_t at = begin;
    int rc = 0;
    for (int i = 0; i < n && rc == 0; i++) {
        if (own[i].begin > at)
            rc = bs_fail("adamw: decay ranges leave out parameter %zu of the shard [%zu, %zu)", at, begin, end);
        else if (own[i].begin < at)
            rc = bs_fail("adamw: decay ranges cover twice parameter %zu of the shard [%zu, %zu)", own[i].begin, begin,
                         end);
        at = own[i].end;
    }
    if (rc == 0 && at != end)
        rc = bs_fail("adamw: decay ranges leave out parameter %zu of the shard [%zu, %zu)", at, begin, end);
    if (rc != 0) {
        free(own);
        return -1;
    }
    size_t len = end - begin;
    opt->m = bs_calloc(len ? len : 1, sizeof(float));
    opt->v = bs_calloc(len ? len : 1, sizeof(float));
    if (!opt->m || !opt->v) {
        free(own);
        adamw_free(opt);
        return -1;
    }
    opt->cfg = *cfg;
    opt->begin = begin;
    opt->end = end;
    opt->ranges = own;
    opt->n_ranges = n;
    return 0;
}

void adamw_free(AdamW *opt) {
    free(opt->m);
    free(opt->v);
    free(opt->ranges);
    memset(opt, 0, sizeof *opt);
}

void adamw_step(AdamW *opt, float *params, const float *grads, float lr, float grad_scale) {
    opt->t++;
    const AdamWConfig *c = &opt->cfg;
    float b1 = (float)c->beta1, b2 = (float)c->beta2, eps = (float)c->eps;
    // bias corrections in double: beta2^t for t in the thousands needs more than fp32's digits
    float bc1 = (float)(1.0 - pow(c->beta1, (double)opt->t));
    float bc2 = (float)(1.0 - pow(c->beta2, (double)opt->t));
    for (int r = 0; r < opt->n_ranges; r++) {
        float wd = opt->ranges[r].decay ? (float)c->weight_decay : 0.0f;
        for (size_t i = opt->ranges[r].begin - opt->begin; i < opt->ranges[r].end - opt->begin; i++) {
            float g = grads[i] * grad_scale;
            float m = b1 * opt->m[i] + (1.0f - b1) * g;
            float v = b2 * opt->v[i] + (1.0f - b2) * g * g;
            opt->m[i] = m;
            opt->v[i] = v;
            float mhat = m / bc1, vhat = v / bc2;
            params[i] -= lr * (mhat / (sqrtf(vhat) + eps) + wd * params[i]);
        }
    }
}

double grad_sumsq(const float *g, size_t n) {
    double s = 0;
    for (size_t i = 0; i < n; i++) s += (double)g[i] * g[i];
    return s;
}

float grad_clip_scale(double sumsq, double max_norm, double *norm) {
    double nrm = sqrt(sumsq);
    if (norm) *norm = nrm;
    if (max_norm <= 0 || nrm <= max_norm) return 1.0f;
    return (float)(max_norm / nrm);
}

double lr_schedule(const LrSchedule *s, int64_t step) {
    if (step < s->warmup_steps) return s->max_lr * (double)(step + 1) / (double)s->warmup_steps;
    if (step >= s->total_steps) return s->min_lr;
    double progress = (double)(step - s->warmup_steps) / (double)(s->total_steps - s->warmup_steps);
    return s->min_lr + (s->max_lr - s->min_lr) * 0.5 * (1.0 + cos(M_PI * progress));
}
