// profile_head.c: the embedding, output head and loss, the cost model's head_token and head_const
// (profile.h, docs/profile.md "The head"). Nothing is timed here: the head is what the layer measurement's
// smaller model took beyond its layers (profile_layer.c), so it is fitted right after the layer.
#include <math.h>

#include "bytescale/error.h"
#include "profile_internal.h"

// The embedding, head and loss: what the smaller model takes beyond its layers, head(s) =
// model_t[0] - layers[0] x the per-layer time, fitted to head_token s + head_const (coefficients >= 0)
// with weights relative to the whole model's time: the head is a small difference of large times
// and may measure near zero at short lengths (or below it at all of them: then it fits to 0, which
// profile_lstsq returns as the optimum). Every length is used (it has two parameters).
int profile_fit_head(Profile *p) {
    int n = p->n_pts;
    // zeroed past n: profile_lstsq reads only n points, but in its own file the compiler cannot see that
    double X[PROFILE_MAX_LENGTHS * 2] = {0}, y[PROFILE_MAX_LENGTHS] = {0}, w[PROFILE_MAX_LENGTHS] = {0}, c[2] = {0, 0};
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

// (profile_internal.h)
void profile_head_print(FILE *f, const Profile *p) {
    const CostModel *cm = &p->cm;
    int La = p->cfg.layers[0];
    fprintf(f, "head: the embedding, output head and loss = model A - %d x layer, fitted to head_token s + "
               "head_const:\n  head_token = %.4e s, head_const = %.4e s; largest |fitted - measured| %.1f%% of "
               "model A's time\n\n",
            La, cm->head_token, cm->head_const, 100 * p->max_head_err);
}

// (profile_internal.h)
cJSON *profile_head_json(const Profile *p) {
    cJSON *hd = cJSON_CreateObject();
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
    return hd;
}
