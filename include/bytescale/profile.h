// profile.h: measure this machine for the cost model (`bytescale profile`, docs/profile.md).
//
// A profile measures, for one model of the catalogue, on the engine itself:
//   compute   T(s) of one layer, forward + backward, at a range of sequence lengths: two models that
//             differ only in their layer count run llama_forward_backward on one causal sequence of s
//             tokens; the per-layer time is their difference over the layer difference (the
//             embedding, the head and the loss cancel). Fitted to the cost model's
//             T(s) = attn_pair s(s+1)/2 + lin_token s + layer_const by least squares weighted by
//             1/T^2 (relative error), some lengths held out to test the fit;
//   memory    Act(s) of one layer and the buffers all layers share, from the engine's own
//             accounting (profile_engine_act);
//   head      the embedding, output head and loss: the smaller model's time less its layers,
//             fitted to head_token s + head_const;
//   links     ping-pong between ranks 0 and 1 of an MPI job through the Comm API at the sizes of
//             ring blocks, fitted to lat + bytes / bw (one process: the `cpu` profile's figures);
//   3D        the TP all-reduce (every rank) and the stage-to-stage message (ranks 0 and 1) at
//             micro-batch sizes, rows x d_model floats, fitted to lat + bytes / bw (profile_3d.c);
//   tier      the write and read bandwidth of the offload file tier (offload.h, O_DIRECT);
//   ring step one attention block's forward + backward as a ring step computes it (ring_attn.c's
//             attn_forward + attn_merge, attn_backward per block) on n x n blocks, full and causal,
//             fitted to attn_step + pairs x rate: the per-block floor attn_step, which the layer's
//             constant then no longer counts (layer_const = max(0, c - attn_step));
// and takes the rest (kv_token, grad_sync, optimizer, n_layers, ranks_per_node) from cost_derive on
// the `cpu` hardware profile. The result is a CostModel and a profile file that cost_load reads, with
// the measurements beside the coefficients (members cost_load ignores).
#ifndef BYTESCALE_PROFILE_H
#define BYTESCALE_PROFILE_H

#include <stdint.h>
#include <stdio.h>

#include "bytescale/comm.h"
#include "bytescale/cost.h"
#include "bytescale/model.h"
#include "bytescale/progress.h"

enum {
    PROFILE_MAX_LENGTHS = 64,
    PROFILE_MAX_SIZES = 32,   // message sizes of the ping-pong
    PROFILE_PATH_MAX = 1024,
    PROFILE_MAX_RING = 32,    // ring-step points: block sizes x {full, causal}
    PROFILE_RING_MIN_ROWS = 16,    // the ring-step blocks: n = 16, 32, ... up to min(C, 1024), at least 32
    PROFILE_RING_MAX_ROWS = 1024,  // (past ~1K rows the floor is lost in the pairs' time)
};

// ---- least squares ----------------------------------------------------------------------------------

// Non-negative weighted least squares for k <= 4 basis functions: coef >= 0 minimizing
// sum_i w[i] (sum_j X[i*k + j] coef[j] - y[i])^2. Exact: the optimum is the unconstrained solution on
// some subset of the coefficients with the others at 0, so every subset is solved (2^k - 1, by
// modified Gram-Schmidt on the weighted, column-scaled system) and the best one with no negative
// coefficient wins; where none is without one, the optimum is every coefficient 0. -1 + error when
// no subset has a solution (n < 1, or the columns are dependent).
int profile_lstsq(const double *X, const double *y, const double *w, int n, int k, double *coef);

// T(s) = attn_pair * s(s+1)/2 + lin_token * s + layer_const (cost_layer_time's form), weights 1/t^2 so
// the relative error is minimized. Fills those three fields of *cm. -1 + error, also when the fit
// leaves lin_token at 0 (cost_load requires it > 0: the measurements are too noisy to use).
int profile_fit_time(const int64_t *s, const double *t, int n, CostModel *cm);
// The engine's activation accounting as the cost model's memory terms (act_token, act_const,
// act_shared_token, act_shared_const): one layer's block (llama_activation_bytes of two layer counts)
// and the shared buffers (what llama_resident_bytes holds at r = 1 beyond the resident layers), each
// the line through two lengths where the accounting is exact, its constant raised by the largest
// excess of the rounded accounting over it (*layer_margin, *shared_margin; may be NULL), so
// cost_rank_act is never below llama_resident_bytes at any length and ratio. What the planner
// budgets by in training and in a profile.
int profile_engine_act(const ModelConfig *m, CostModel *cm, double *layer_margin, double *shared_margin);
// t = lat + bytes / bw, weights 1/t^2. -1 + error when the fit gives no finite bandwidth.
int profile_fit_link(const double *bytes, const double *t, int n, double *lat, double *bw);
// One ring step's block time t = attn_step + pairs x rate (cost.h attn_step), weights 1/t^2 (relative
// error), both >= 0. -1 + error when the fit gives no rate > 0 (the time does not grow with the pairs).
int profile_fit_ring_step(const double *pairs, const double *t, int n, double *attn_step, double *rate);
// Whether the i-th of n lengths (ascending) is held out of the time fit: every `every`-th one
// (i % every == every - 1), never the shortest or the longest, so the fit never extrapolates.
// every <= 0: none.
int profile_held_out(int i, int n, int every);

// ---- measuring ----------------------------------------------------------------------------------------

typedef struct {
    const ModelConfig *model;     // the model whose layer is measured (tiny, small, base)
    int64_t lengths[PROFILE_MAX_LENGTHS];  // ascending, distinct, >= 1
    int n_lengths;
    int reps;                     // timed runs per length (median), >= 1
    int warmup;                   // untimed runs first, >= 0
    int layers[2];                // the two layer counts whose difference is measured, 1 <= a < b
    int holdout;                  // every holdout-th length is held out of the fit (0: none)
    int wall_clock;               // time the runs by the wall clock; 0 (default): the rank thread's CPU
                                  // clock, the same on a core of its own, and blind to other processes'
                                  // turns on a shared one
    int64_t capacity;             // C: capacity_bytes = n_layers * Act(C), and the largest ring block
    int hdp_ranks;                // R for grad_sync and the optimizer (cost_derive)
    int p2p_reps;                 // timed ping-pong samples per message size
    int64_t tier_bytes;           // bytes written to and read from the tier per repetition
    int tier_reps;                // repetitions of the tier's write + read pass
    char offload_dir[PROFILE_PATH_MAX];  // the tier's directory ("" = $TMPDIR or /tmp)
    int quiet;                    // no progress line (BS_QUIET=1 also hides it)
} ProfileConfig;

// What one length measured. Times are per layer, forward + backward, seconds.
typedef struct {
    int64_t s;
    int held_out;           // not in the fit
    double measured;        // median of samples
    double fitted;          // cost_layer_time of the fit
    double residual;        // fitted / measured - 1
    double model_t[2];      // medians of the two whole models' forward + backward (layers[0], layers[1])
    double core_share;      // median CPU seconds / wall seconds of those runs (< ~0.9: the core was shared)
                            // (all times: the clock cfg.wall_clock chose)
    double *samples;        // (n_samples,) per-layer samples: every rank's timed runs
    int n_samples;
    double act_bytes;       // Act(s) from the engine's accounting
    double shared_bytes;    // the shared buffers at s tokens (profile_engine_act)
    double head;            // model_t[0] - layers[0] x measured: the embedding, head and loss
    double head_fitted;     // head_token s + head_const
} ProfilePoint;

typedef struct {
    double bytes;
    double seconds;         // one-way: median round trip / 2
    double fitted;          // lat + bytes / bw
    double residual;
    double *samples;        // (n_samples,) one-way seconds
    int n_samples;
    int iters;              // round trips per sample
    double core_share;      // the lesser CPU / wall seconds of ranks 0 and 1 over the samples
} ProfileLinkPoint;

// One block of a ring step: n query rows against n key rows of one segment, forward + backward as
// ring_attn.c computes a block (profile_measure_ring). Times are seconds of the one layer's block.
typedef struct {
    int n;                  // query rows = key rows
    int causal;             // 1: the diagonal block, a member's own (step 0: keys at the queries' positions,
                            // written straight into the result); 0: a full block, another member's
                            // (step t > 0: every key before every query, merged into the result)
    double pairs;           // visible (query, key) pairs: n(n+1)/2 causal, n^2 full (attn_visible_pairs)
    double measured;        // median seconds of one block's forward + backward
    double fitted;          // attn_step + pairs x ring_rate
    double residual;        // fitted / measured - 1
    double *samples;        // (n_samples,) seconds per block: every rank's timed groups
    int n_samples;
    int iters;              // blocks per timed group (small blocks repeat, so a sample is long enough)
    double core_share;      // median CPU seconds / wall seconds of the groups
} ProfileRingPoint;

typedef struct {
    ProfileConfig cfg;
    CostModel cm;           // the profile: measured and derived fields together
    CostModel derived;      // what cost_derive gives for the model on the `cpu` profile
    int n_ranks;            // ranks of the job that measured
    // compute
    ProfilePoint pts[PROFILE_MAX_LENGTHS];
    int n_pts;
    double max_fit_err, max_holdout_err;  // largest |residual| on the fit lengths / held-out lengths
    double layer_c;         // the T(s) fit's constant c; cm.layer_const = max(0, c - cm.attn_step)
    // ring step (cm.attn_step is its floor)
    ProfileRingPoint ring[PROFILE_MAX_RING];
    int n_ring;             // 0: not measured (cm.attn_step stays the `cpu` profile's)
    double ring_rate;       // seconds per visible pair of a block (compare cm.attn_pair, the layer's)
    double max_ring_err;    // largest |residual| of the ring-step fit
    double ring_seconds;    // wall time of the ring-step part
    // activations
    double act_margin;         // bytes act_const was raised by to cover the engine's rounding
    double act_shared_margin;  // the same for act_shared_const
    double act_max_dev;        // largest fitted - accounted bytes of one layer at the lengths (>= 0)
    // the head
    double max_head_err;       // largest |head_fitted - head| / model_t[0] over the lengths
    // links
    int p2p_measured;       // 0: one process, ring_* are the `cpu` profile's
    ProfileLinkPoint link[PROFILE_MAX_SIZES];
    int n_link;
    double link_lat, link_bw;
    // 3D (profile_3d.c): rows x d_model floats as the engine sends them, fitted to lat + bytes / bw
    int measured_3d;        // 0: one process, tp_* and stage_* are ring_*_intra (cost_load's rule)
    ProfileLinkPoint tp_ar[PROFILE_MAX_SIZES];  // the all-reduce over every rank (samples NULL)
    int n_tp_ar;
    double tp_ar_lat, tp_ar_bw;                 // its fit; cm.tp_lat, cm.tp_bw from the ring form
    ProfileLinkPoint stage[PROFILE_MAX_SIZES];  // one way between ranks 0 and 1 (samples NULL)
    int n_stage;
    double stage_fit_lat, stage_fit_bw;         // = cm.stage_lat, cm.stage_bw
    // offload tier
    char tier_name[1300];
    int64_t tier_chunk;     // bytes per write / read call
    double tier_write_bw, tier_read_bw;  // medians, bytes/s
    double *tier_write, *tier_read;      // (n_tier,) per repetition and rank, bytes/s
    int n_tier;
    // the machine
    int cores;
    char cpu[128];
    char blas[256];
    int blas_threads;
    char date[32];          // UTC, ISO 8601
    double seconds;         // wall time of the whole profile
} Profile;

// Defaults for model m: lengths 256 .. 8K (powers of two and midpoints), 5 reps after 1 warm-up on
// the CPU clock, layers 1 and 3, every third length held out, C = 4K (the trainer's default), R = 2,
// 256 MiB of tier traffic 3 times, 15 ping-pong samples.
void profile_defaults(ProfileConfig *c, const ModelConfig *m);
// -1 + error naming the setting (too few lengths to fit, ...).
int profile_config_check(const ProfileConfig *c);

// Every measurement, on every rank of comm at once (as training runs them; p2p between ranks 0 and
// 1), then the fits and the cost model. Collective: every rank calls it; every rank gets the same
// Profile. -1 + error (on this rank; under MPI the caller aborts the job).
int profile_run(Profile *p, const ProfileConfig *c, Comm *comm);
// The parts of profile_run, for tests: the compute timings (collective) and their fit; the
// activation accounting (no timing).
int profile_measure_compute(Profile *p, Comm *comm, Progress *pr, int64_t *done);
// The ring step (collective): every block size of the ladder, full and causal, cfg.warmup + cfg.reps
// times on every rank, the medians fitted by profile_fit_ring_step into cm.attn_step and ring_rate.
int profile_measure_ring(Profile *p, Comm *comm, Progress *pr, int64_t *done);
// The T(s) fit of the compute points (profile_fit_time; layer_c = its c), and the head. The layer's
// measured time includes its one attention block's floor, which cost_layer_time adds as attn_step
// on top of layer_const: so layer_const = max(0, c - cm.attn_step) (cm.attn_step from
// profile_measure_ring, run first; 0: c as fitted), and the points' fitted values and residuals are
// cost_layer_time's.
int profile_fit_compute(Profile *p);
int profile_measure_act(Profile *p);
void profile_free(Profile *p);

// The tables (measured vs fitted per length, the fit, links, tier, what was derived) on f.
void profile_print(FILE *f, const Profile *p);
// The profile file: the cost model's fields as cost_save writes them (cost_load reads it), plus a
// "profile" member with every measurement (docs/profile.md). Atomic.
int profile_write(const Profile *p, const char *path);
// PREFIX.gp (the data inside), PREFIX.png and PREFIX.svg through gnuplot: measured per-layer times
// and the fitted T(s), log-log.
int profile_plot(const Profile *p, const char *prefix);

#endif
