// profile_3d.c: the two messages 3D layouts add, measured as the engine sends them (profile.h,
// docs/profile.md "3D: tp_bw, tp_lat, stage_bw, stage_lat").
//
// A TP group all-reduces its residual stream, rows x d_model floats, four times per layer and
// micro-batch (src/nn/llama.c); a pipeline sends the same rows x d_model floats from one stage to the
// next, and their gradients back (src/runtime/pipeline.c). Both are timed through the Comm API at the
// sizes a micro-batch sends, rows = C/64, C/32, ... 2C, and fitted to lat + bytes / bw:
//   all-reduce  every rank of the job (comm_allreduce_f32, the call the TP group makes), W ranks; the
//               cost model's ring form 2 (W-1)/W bytes / tp_bw + 2 (W-1) tp_lat gives tp_bw and tp_lat;
//   stage       one way between ranks 0 and 1 (a ping-pong, round trip / 2), as a stage's isend to
//               the next: stage_bw and stage_lat.
// One process measures neither (the link figures stand in: cost_load's rule for old files).
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "bytescale/error.h"
#include "bytescale/json.h"
#include "bytescale/timer.h"
#include "profile_internal.h"

#define P3D_TAG 7102                 // the stage ping-pong's messages; nothing else is in flight
#define P3D_SAMPLE_BYTES (4 << 20)   // a sample moves about this much, so small messages repeat
#define P3D_MAX_ITERS 100
#define P3D_MAX_BYTES (64 << 20)     // the largest message timed

// The sizes: rows x d_model floats for rows = 2C, C, C/2, ... C/64 (at least 1), ascending, under
// P3D_MAX_BYTES. Returns the count.
static int p3d_sizes(const ProfileConfig *c, double *bytes) {
    double row = (double)c->model->d_model * sizeof(float);
    int64_t rows[PROFILE_MAX_SIZES];
    int n = 0;
    for (int64_t x = 2 * c->capacity; x >= 1 && x >= c->capacity / 64 && n < PROFILE_MAX_SIZES; x /= 2)
        if (row * (double)x <= P3D_MAX_BYTES) rows[n++] = x;
    for (int i = 0; i < n; i++) bytes[i] = row * (double)rows[n - 1 - i];
    return n;
}

int64_t profile_3d_units(const Profile *p, const Comm *comm) {
    double bytes[PROFILE_MAX_SIZES];
    return comm->size > 1 ? 2 * p3d_sizes(&p->cfg, bytes) : 0;
}

// One timed group of `iters` operations of `bytes`: the all-reduce on every rank, or the ping-pong
// between ranks 0 and 1 (the others idle). Seconds per operation (one way for the ping-pong).
static int p3d_group(Comm *comm, int allreduce, float *buf, size_t bytes, int iters, double *seconds) {
    int rc = 0, me = comm->rank;
    double t0 = now_seconds();
    for (int it = 0; rc == 0 && it < iters; it++) {
        if (allreduce) {
            rc = comm_allreduce_f32(comm, buf, bytes / sizeof(float), COMM_SUM);
            continue;
        }
        if (me > 1) break;
        CommReq req = {0};
        int peer = 1 - me;
        if (me == 0) rc = comm_isend(comm, buf, bytes, peer, P3D_TAG, &req);
        else rc = comm_irecv(comm, buf, bytes, peer, P3D_TAG, &req);
        if (rc == 0) rc = comm_wait(comm, &req);
        if (rc == 0) rc = me == 0 ? comm_irecv(comm, buf, bytes, peer, P3D_TAG, &req)
                                  : comm_isend(comm, buf, bytes, peer, P3D_TAG, &req);
        if (rc == 0) rc = comm_wait(comm, &req);
    }
    *seconds = (now_seconds() - t0) / (allreduce ? iters : 2.0 * iters);
    return rc;
}

// Every size: a warm-up group, then p2p_reps timed groups; rank 0's median (all ranks get it), and
// the least share of its core any rank had. Fills pts[0..n) and fits lat + bytes / bw.
static int p3d_measure(Profile *p, Comm *comm, ProfileTick *t, int allreduce, ProfileLinkPoint *pts, int *n_pts,
                       double *lat, double *bw) {
    const ProfileConfig *c = &p->cfg;
    double bytes[PROFILE_MAX_SIZES];
    int n = p3d_sizes(c, bytes);
    if (n < 2) return bs_fail("--capacity %lld: too few micro-batch sized messages under %d MiB to fit a link",
                              (long long)c->capacity, P3D_MAX_BYTES >> 20);
    float *buf = bs_calloc((size_t)(bytes[n - 1] / sizeof(float)), sizeof(float));
    double *samples = bs_malloc(sizeof(double) * (size_t)c->p2p_reps);
    int rc = buf && samples ? 0 : -1;
    for (int i = 0; rc == 0 && i < n; i++) {
        size_t b = (size_t)bytes[i];
        int iters = (int)(P3D_SAMPLE_BYTES / b);
        iters = iters < 1 ? 1 : iters > P3D_MAX_ITERS ? P3D_MAX_ITERS : iters;
        rc = comm_barrier(comm);
        double wall0 = now_seconds(), cpu0 = thread_cpu_seconds(), s;
        for (int g = 0; rc == 0 && g <= c->p2p_reps; g++) {
            rc = p3d_group(comm, allreduce, buf, b, iters, &s);
            if (g > 0) samples[g - 1] = s;  // group 0: warm-up
        }
        double wall = now_seconds() - wall0, share = wall > 0 ? (thread_cpu_seconds() - cpu0) / wall : 1, *shares = NULL;
        if (rc == 0) rc = comm_bcast(comm, samples, sizeof(double) * (size_t)c->p2p_reps, 0);
        if (rc == 0 && !(shares = profile_gather(comm, &share, 1))) rc = -1;
        if (rc != 0) break;
        ProfileLinkPoint *lp = &pts[i];
        memset(lp, 0, sizeof *lp);
        lp->core_share = 1;
        for (int r = 0; r < (allreduce ? comm->size : 2); r++) lp->core_share = fmin(lp->core_share, shares[r]);
        free(shares);
        lp->bytes = bytes[i];
        lp->iters = iters;
        lp->seconds = profile_median(samples, c->p2p_reps);
        *n_pts = i + 1;
        profile_tick(t, 1, allreduce ? "3D: all-reduce" : "3D: stage messages");
    }
    free(buf), free(samples);
    if (rc != 0) return bs_fail_ctx("%s", allreduce ? "the TP all-reduce" : "the stage ping-pong between ranks 0 and 1");
    double x[PROFILE_MAX_SIZES], y[PROFILE_MAX_SIZES];
    for (int i = 0; i < *n_pts; i++) x[i] = pts[i].bytes, y[i] = pts[i].seconds;
    if (profile_fit_link(x, y, *n_pts, lat, bw) != 0) return -1;
    for (int i = 0; i < *n_pts; i++) {
        pts[i].fitted = *lat + pts[i].bytes / *bw;
        pts[i].residual = pts[i].fitted / pts[i].seconds - 1;
    }
    return 0;
}

int profile_measure_3d(Profile *p, Comm *comm, ProfileTick *t) {
    if (comm->size < 2) return 0;
    if (p3d_measure(p, comm, t, 1, p->tp_ar, &p->n_tp_ar, &p->tp_ar_lat, &p->tp_ar_bw) != 0) return -1;
    if (p3d_measure(p, comm, t, 0, p->stage, &p->n_stage, &p->stage_fit_lat, &p->stage_fit_bw) != 0) return -1;
    // the fit is t = lat + bytes / bw; the ring all-reduce of W ranks is 2 (W-1)/W bytes / tp_bw + 2 (W-1) tp_lat
    int W = comm->size;
    p->cm.tp_bw = 2.0 * (W - 1) / W * p->tp_ar_bw;
    p->cm.tp_lat = p->tp_ar_lat / (2.0 * (W - 1));
    p->cm.stage_bw = p->stage_fit_bw;
    p->cm.stage_lat = p->stage_fit_lat;
    p->measured_3d = 1;
    return 0;
}

static void p3d_print_points(FILE *f, const ProfileLinkPoint *pts, int n, double row) {
    fprintf(f, "%12s %8s %11s %11s %9s %5s\n", "bytes", "rows", "us", "fitted us", "residual", "core");
    for (int i = 0; i < n; i++)
        fprintf(f, "%12.0f %8.0f %11.2f %11.2f %+8.1f%% %5.2f\n", pts[i].bytes, pts[i].bytes / row,
                1e6 * pts[i].seconds, 1e6 * pts[i].fitted, 100 * pts[i].residual, pts[i].core_share);
}

void profile_3d_print(FILE *f, const Profile *p) {
    const CostModel *cm = &p->cm;
    if (!p->measured_3d) {
        fprintf(f, "3D: not measured (one process): tp_bw %.3g, tp_lat %.3g, stage_bw %.3g, stage_lat %.3g are the "
                   "link's figures; run under mpirun -np 2 to measure them\n\n",
                cm->tp_bw, cm->tp_lat, cm->stage_bw, cm->stage_lat);
        return;
    }
    double row = (double)p->cfg.model->d_model * sizeof(float);
    fprintf(f, "3D, TP all-reduce: comm_allreduce_f32 of rows x d_model floats over the %d ranks, median of %d:\n",
            p->n_ranks, p->cfg.p2p_reps);
    p3d_print_points(f, p->tp_ar, p->n_tp_ar, row);
    fprintf(f, "  fit: lat = %.2f us, bw = %.3f GB/s -> tp_lat = lat / (2 (W-1)) = %.2f us, tp_bw = 2 (W-1)/W bw = "
               "%.3f GB/s\n",
            1e6 * p->tp_ar_lat, p->tp_ar_bw / 1e9, 1e6 * cm->tp_lat, cm->tp_bw / 1e9);
    fprintf(f, "3D, stage to stage: rows x d_model floats between ranks 0 and 1, one way = round trip / 2:\n");
    p3d_print_points(f, p->stage, p->n_stage, row);
    fprintf(f, "  fit: lat = %.2f us, bw = %.3f GB/s -> stage_lat, stage_bw\n\n", 1e6 * cm->stage_lat,
            cm->stage_bw / 1e9);
}

static cJSON *p3d_points_json(const ProfileLinkPoint *pts, int n) {
    cJSON *a = cJSON_CreateArray();
    for (int i = 0; a && i < n; i++) {
        cJSON *e = cJSON_CreateObject();
        cJSON_AddNumberToObject(e, "bytes", pts[i].bytes);
        cJSON_AddNumberToObject(e, "seconds", pts[i].seconds);
        cJSON_AddNumberToObject(e, "fitted", pts[i].fitted);
        cJSON_AddNumberToObject(e, "residual", pts[i].residual);
        cJSON_AddNumberToObject(e, "ops_per_sample", pts[i].iters);
        cJSON_AddNumberToObject(e, "core_share", pts[i].core_share);
        cJSON_AddItemToArray(a, e);
    }
    return a;
}

cJSON *profile_3d_json(const Profile *p) {
    cJSON *o = cJSON_CreateObject();
    cJSON_AddBoolToObject(o, "measured", p->measured_3d);
    if (!p->measured_3d) {
        cJSON_AddStringToObject(o, "method", "not measured: one process; tp_* and stage_* are ring_bw_intra and "
                                             "ring_lat_intra");
        return o;
    }
    cJSON_AddStringToObject(o, "method", "rows x d_model floats, rows = C/64 .. 2C; tp: comm_allreduce_f32 over every "
                                         "rank, stage: ping-pong between ranks 0 and 1 (one way = round trip / 2); "
                                         "median of the samples; fit lat + bytes / bw weighted by 1/t^2");
    cJSON *tp = cJSON_AddObjectToObject(o, "tp_allreduce");
    json_add_exact(tp, "lat", p->tp_ar_lat);
    json_add_exact(tp, "bw", p->tp_ar_bw);
    cJSON_AddNumberToObject(tp, "ranks", p->n_ranks);
    cJSON_AddItemToObject(tp, "points", p3d_points_json(p->tp_ar, p->n_tp_ar));
    cJSON *st = cJSON_AddObjectToObject(o, "stage");
    json_add_exact(st, "lat", p->stage_fit_lat);
    json_add_exact(st, "bw", p->stage_fit_bw);
    cJSON_AddItemToObject(st, "points", p3d_points_json(p->stage, p->n_stage));
    return o;
}
