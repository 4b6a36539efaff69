// profile_fit.c: what every measurement of the profile shares (profile_internal.h, profile.h): the
// samples gathered from every rank, their median and spread, the weighted least squares and the two
// fits of the cost model's forms (T(s) and lat + bytes / bw), and the samples as a JSON array. It
// calls nothing else of the profile, so each measurement's file uses it and none uses another's.
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "bytescale/error.h"
#include "profile_internal.h"

// ---- samples ----------------------------------------------------------------------------------------

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

// (profile_internal.h)
double profile_spread(const double *v, int n, double median) {
    double lo = INFINITY, hi = -INFINITY;
    for (int j = 0; j < n; j++) lo = fmin(lo, v[j]), hi = fmax(hi, v[j]);
    return (hi - lo) / median;
}

// (profile_internal.h)
double *profile_gather(Comm *comm, const double *mine, int n) {
    double *all = bs_malloc(sizeof(double) * (size_t)n * (size_t)comm->size);
    if (all && comm_allgather(comm, mine, all, sizeof(double) * (size_t)n) != 0) {
        free(all);
        return NULL;
    }
    return all;
}

// (profile_internal.h)
cJSON *profile_number_array(const double *v, int n) {
    cJSON *a = cJSON_CreateArray();
    for (int i = 0; a && i < n; i++) cJSON_AddItemToArray(a, cJSON_CreateNumber(v[i]));
    return a;
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
    int found = 0, solved = 0;
    for (unsigned mask = (1u << k) - 1; mask > 0; mask--) {  // every coefficient free first
        double sse = INFINITY;
        if (lstsq_subset(X, y, w, n, k, mask, c, &sse) != 0) continue;
        solved = 1;
        int feasible = 1;
        for (int j = 0; j < k; j++) feasible &= c[j] >= 0;
        if (!feasible || !(sse < best)) continue;
        best = sse;
        memcpy(coef, c, sizeof(double) * (size_t)k);
        found = 1;
    }
    if (!solved) return bs_fail("least squares: no solution from %d points for %d coefficients", n, k);
    // Every subset's solution has a negative coefficient: the optimum's support is empty, all zero (a
    // non-empty support would be its own subset's solution, feasible). The head, a small difference
    // of two large times, can measure below zero at every length on a noisy machine.
    if (!found)
        for (int j = 0; j < k; j++) coef[j] = 0;
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
    if (!(c[1] > 0))
        return bs_fail("fitting the link: the time does not grow with the message size (bw infinite): the measurements "
                       "are too noisy; raise --p2p-reps");
    *lat = c[0];
    *bw = 1.0 / c[1];
    return 0;
}

int profile_held_out(int i, int n, int every) {
    return every > 0 && i > 0 && i < n - 1 && i % every == every - 1;
}
