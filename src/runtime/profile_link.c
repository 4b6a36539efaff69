// profile_link.c: the link between two ranks at ring-block sizes, the cost model's ring_bw,
// ring_lat, ring_bw_intra and ring_lat_intra (profile.h, docs/profile.md "Links"). One process measures
// nothing here: those fields stay the `cpu` profile's.
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "bytescale/error.h"
#include "bytescale/json.h"
#include "bytescale/timer.h"
#include "profile_internal.h"

#define P2P_TAG 7101            // the ping-pong's messages; nothing else is in flight meanwhile
#define P2P_SAMPLE_BYTES (4 << 20)  // a sample moves about this much, so small messages repeat
#define P2P_MAX_ITERS 100
#define P2P_MAX_BYTES (64 << 20)    // the largest message timed

// Ping-pong between ranks 0 and 1 at the sizes of ring blocks: one member's K/V for a block of t
// tokens (ring_attn.c sends K and V of a block as one message), t = 2C, C, C/2, ... C/64. A ring
// member holds between C/2 and C tokens without offloading, more with it; smaller messages (where
// MPI switches protocols and latency dominates) would pull the fit away from the sizes rings send.
// Rank 0 times groups of `iters` round trips; one group first as warm-up.
int profile_measure_link(Profile *p, Comm *comm, ProfileTick *t) {
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

// ---- reporting ----------------------------------------------------------------------------------------

// (profile_internal.h)
void profile_link_print(FILE *f, const Profile *p) {
    const ProfileConfig *c = &p->cfg;
    const CostModel *cm = &p->cm;
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
}

// (profile_internal.h)
cJSON *profile_link_json(const Profile *p) {
    cJSON *ln = cJSON_CreateObject();
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
    return ln;
}
