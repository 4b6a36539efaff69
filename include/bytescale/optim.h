// optim.h: AdamW on a flat range of the parameter vector, global-norm gradient clipping, and the
// learning-rate schedule.
//
// ZeRO-1 gives every rank a shard [begin, end) of the flat parameter vector: the rank keeps the
// moments of its shard only and updates only its shard. Weight decay is decided per element by a
// list of DecayRange covering the vector (the model makes it: matrices decay, norm gains do not).
#ifndef BYTESCALE_OPTIM_H
#define BYTESCALE_OPTIM_H

#include <stddef.h>
#include <stdint.h>

typedef struct {
    size_t begin, end;  // floats [begin, end) of the flat parameter vector
    int decay;          // 1: weight decay applies to these parameters
} DecayRange;

typedef struct {
    double beta1, beta2, eps;
    double weight_decay;  // decoupled: p -= lr * weight_decay * p (AdamW, not L2 in the gradient)
} AdamWConfig;

typedef struct {
    AdamWConfig cfg;
    size_t begin, end;    // the shard of the flat vector this optimizer owns
    float *m;             // (end - begin,) first moment
    float *v;             // (end - begin,) second moment
    int64_t t;            // steps taken (bias correction uses t after the increment)
    DecayRange *ranges;   // (n_ranges,) owned copy, clipped to [begin, end)
    int n_ranges;
} AdamW;

// beta1 0.9, beta2 0.95, eps 1e-8, weight_decay 0.1
AdamWConfig adamw_defaults(void);
// Moments zeroed. ranges must cover [begin, end) (each element exactly once) or -1 + error.
int adamw_init(AdamW *opt, const AdamWConfig *cfg, size_t begin, size_t end, const DecayRange *ranges,
               int n_ranges);
void adamw_free(AdamW *opt);

// One step. params and grads point at element `begin` of the flat vectors (params = all + begin;
// grads may be a separate shard buffer, as a reduce-scatter leaves it) and hold end - begin floats.
// grad_scale multiplies every gradient first (clipping: grad_clip_scale). With t the new step count:
//   g = grad_scale * grad;  m = b1 m + (1-b1) g;  v = b2 v + (1-b2) g^2
//   p -= lr * ( (m / (1-b1^t)) / (sqrt(v / (1-b2^t)) + eps) + decay * weight_decay * p )
void adamw_step(AdamW *opt, float *params, const float *grads, float lr, float grad_scale);

// Sum of squares of n gradients, in double. A rank computes it over its shard; the sum over all
// shards (an all-reduce) is the squared global norm.
double grad_sumsq(const float *g, size_t n);
// The factor that brings the global norm sqrt(sumsq) down to max_norm: min(1, max_norm / norm).
// max_norm <= 0 disables clipping (1). *norm (may be NULL) = the global norm before clipping.
float grad_clip_scale(double sumsq, double max_norm, double *norm);

// Linear warmup then cosine decay to min_lr (steps count from 0):
//   step < warmup:           max_lr * (step + 1) / warmup
//   warmup <= step < total:  min_lr + (max_lr - min_lr) * (1 + cos(pi * (step - warmup) / (total - warmup))) / 2
//   step >= total:           min_lr
typedef struct {
    double max_lr, min_lr;
    int64_t warmup_steps, total_steps;
} LrSchedule;

double lr_schedule(const LrSchedule *s, int64_t step);

#endif
