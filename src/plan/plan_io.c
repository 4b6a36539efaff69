// plan_io.c: plans as JSON files (docs/plan-format.md).
// Writing builds a cJSON tree and writes it atomically; reading checks every field's type and
// range with errors naming the path inside the file ("plan.json: items[3].ranks[1]: ..."), rebuilds
// the plan with plan_add_item, derives the schedules (plan_finalize) and runs plan_validate.
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bytescale/error.h"
#include "bytescale/json.h"
#include "bytescale/plan.h"

enum { PLAN_FORMAT_VERSION = 1 };

static cJSON *int_array(const int32_t *v, int n) {
    cJSON *a = cJSON_CreateArray();
    for (int i = 0; a && i < n; i++) {
        cJSON *x = cJSON_CreateNumber(v[i]);
        if (!x) {
            cJSON_Delete(a);
            return NULL;
        }
        cJSON_AddItemToArray(a, x);
    }
    return a;
}

static cJSON *plan_to_json(const Plan *p) {
    cJSON *root = cJSON_CreateObject();
    if (!root) return NULL;
    cJSON_AddStringToObject(root, "format", "bytescale-plan");
    cJSON_AddNumberToObject(root, "version", PLAN_FORMAT_VERSION);
    cJSON_AddStringToObject(root, "policy", p->policy);
    cJSON_AddNumberToObject(root, "n_ranks", p->n_ranks);
    cJSON_AddNumberToObject(root, "pp", p->pp);
    cJSON_AddNumberToObject(root, "capacity", (double)p->capacity);
    cJSON_AddNumberToObject(root, "makespan", p->makespan);
    cJSON_AddNumberToObject(root, "lower_bound", p->lower_bound);
    cJSON *seqs = cJSON_AddArrayToObject(root, "sequences");
    for (int64_t i = 0; seqs && i < p->batch.n; i++) {
        const Sequence *s = &p->batch.seqs[i];
        cJSON *o = cJSON_CreateObject();
        if (!o) goto fail;
        cJSON_AddItemToArray(seqs, o);
        cJSON_AddNumberToObject(o, "id", (double)s->id);
        cJSON_AddNumberToObject(o, "len", (double)s->len);
        cJSON_AddNumberToObject(o, "src", (double)s->src);
    }
    cJSON *items = cJSON_AddArrayToObject(root, "items");
    for (int32_t k = 0; items && k < p->n_items; k++) {
        const Item *it = &p->items[k];
        cJSON *o = cJSON_CreateObject();
        if (!o) goto fail;
        cJSON_AddItemToArray(items, o);
        cJSON *ranks = int_array(p->ranks + it->rank_begin, it->n_ranks);
        if (!ranks) goto fail;
        cJSON_AddItemToObject(o, "ranks", ranks);
        cJSON_AddNumberToObject(o, "offload", it->offload);
        cJSON *segs = cJSON_AddArrayToObject(o, "segments");
        for (int32_t j = 0; segs && j < it->n_segs; j++) {
            const Segment *sg = &p->segs[it->seg_begin + j];
            cJSON *t = cJSON_CreateArray();
            if (!t) goto fail;
            cJSON_AddItemToArray(segs, t);
            cJSON_AddItemToArray(t, cJSON_CreateNumber(sg->seq));
            cJSON_AddItemToArray(t, cJSON_CreateNumber((double)sg->start));
            cJSON_AddItemToArray(t, cJSON_CreateNumber((double)sg->len));
            if (cJSON_GetArraySize(t) != 3) goto fail;
        }
        if (!segs) goto fail;
        cJSON_AddNumberToObject(o, "est_time", it->est_time);
    }
    if (!seqs || !items) goto fail;
    return root;
fail:
    cJSON_Delete(root);
    return NULL;
}

int plan_write_json(const Plan *p, const char *path) {
    cJSON *root = plan_to_json(p);
    if (!root) return bs_fail("%s: out of memory building the plan's JSON", path);
    int rc = json_write_file(path, root, 1);
    cJSON_Delete(root);
    return rc;
}

// An integer member within [lo, hi].
static int get_int_in(const cJSON *obj, const char *key, int64_t lo, int64_t hi, int64_t *out, const char *where) {
    if (json_get_int(obj, key, out, where) != 0) return -1;
    if (*out < lo || *out > hi)
        return bs_fail("%s: \"%s\" is %lld, outside [%lld, %lld]", where, key, (long long)*out, (long long)lo,
                       (long long)hi);
    return 0;
}

static int read_sequences(const cJSON *arr, GlobalBatch *b, const char *path) {
    int n = cJSON_GetArraySize(arr);
    b->seqs = bs_malloc((size_t)(n > 0 ? n : 1) * sizeof(Sequence));
    if (!b->seqs) return bs_fail_ctx("%s", path);
    b->n = 0;
    b->n_tokens = 0;
    char where[128];
    const cJSON *o;
    cJSON_ArrayForEach(o, arr) {
        snprintf(where, sizeof where, "%s: sequences[%lld]", path, (long long)b->n);
        Sequence s = {0, 0, -1};
        if (json_get_int(o, "id", &s.id, where) != 0 || get_int_in(o, "len", 1, INT64_MAX / 4, &s.len, where) != 0 ||
            json_opt_int(o, "src", &s.src, where) != 0)
            return -1;
        if (s.len > INT64_MAX - b->n_tokens)
            return bs_fail("%s: the sequences hold more than %lld tokens", where, (long long)INT64_MAX);
        b->seqs[b->n++] = s;
        b->n_tokens += s.len;
    }
    return 0;
}

// One item: {"ranks": [...], "offload": r, "segments": [[seq, start, len], ...], "est_time": t}.
static int read_item(Plan *p, const cJSON *o, int k, int32_t **rbuf, int *rcap, Segment **sbuf, int *scap,
                     const char *path) {
    char where[128], sub[160];
    snprintf(where, sizeof where, "%s: items[%d]", path, k);
    const cJSON *ranks, *segs;
    double offload, est = 0;
    if (json_get_array(o, "ranks", &ranks, where) != 0 || json_get_double(o, "offload", &offload, where) != 0 ||
        json_get_array(o, "segments", &segs, where) != 0 || json_opt_double(o, "est_time", &est, where) != 0)
        return -1;
    int nr = cJSON_GetArraySize(ranks), ns = cJSON_GetArraySize(segs);
    if (nr < 1) return bs_fail("%s: \"ranks\" is empty", where);
    if (ns < 1) return bs_fail("%s: \"segments\" is empty", where);
    if (nr > *rcap) {
        int32_t *r2 = bs_realloc(*rbuf, (size_t)nr * sizeof(int32_t));
        if (!r2) return bs_fail_ctx("%s", where);
        *rbuf = r2;
        *rcap = nr;
    }
    if (ns > *scap) {
        Segment *s2 = bs_realloc(*sbuf, (size_t)ns * sizeof(Segment));
        if (!s2) return bs_fail_ctx("%s", where);
        *sbuf = s2;
        *scap = ns;
    }
    snprintf(sub, sizeof sub, "%s.ranks", where);
    int i = 0;
    const cJSON *x;
    cJSON_ArrayForEach(x, ranks) {
        int64_t v;
        if (json_item_int(x, &v, sub, i) != 0) return -1;
        if (v < 0 || v >= p->n_ranks)
            return bs_fail("%s[%d]: rank %lld out of range [0, %d)", sub, i, (long long)v, p->n_ranks);
        (*rbuf)[i++] = (int32_t)v;
    }
    i = 0;
    int64_t tokens = 0;
    cJSON_ArrayForEach(x, segs) {
        snprintf(sub, sizeof sub, "%s.segments[%d]", where, i);
        if (!cJSON_IsArray(x) || cJSON_GetArraySize(x) != 3) return bs_fail("%s: expected [seq, start, len]", sub);
        int64_t v[3];
        for (int j = 0; j < 3; j++)
            if (json_item_int(cJSON_GetArrayItem(x, j), &v[j], sub, j) != 0) return -1;
        if (v[0] < 0 || v[0] >= p->batch.n)
            return bs_fail("%s: sequence %lld out of range [0, %lld)", sub, (long long)v[0], (long long)p->batch.n);
        // no valid item holds more than the batch, and the bound keeps the item's token sum from overflowing
        // (plan_validate checks the segment against its sequence)
        if (v[2] < 1 || v[2] > p->batch.n_tokens - tokens)
            return bs_fail("%s: length %lld: the item's segments must each hold >= 1 token and together at most "
                           "the batch's %lld",
                           sub, (long long)v[2], (long long)p->batch.n_tokens);
        tokens += v[2];
        (*sbuf)[i++] = (Segment){(int32_t)v[0], v[1], v[2]};
    }
    int32_t idx = plan_add_item(p, *sbuf, ns, *rbuf, nr, offload);
    if (idx < 0) return bs_fail_ctx("%s", where);
    p->items[idx].est_time = est;  // stands unless plan_finalize has a cost model to recompute it
    return 0;
}

int plan_read_json_cm(Plan *p, const char *path, const CostModel *cm) {
    memset(p, 0, sizeof *p);
    cJSON *root;
    if (json_read_file(path, &root) != 0) return -1;
    GlobalBatch b = {0};
    int32_t *rbuf = NULL;
    Segment *sbuf = NULL;
    int rcap = 0, scap = 0, inited = 0, rc = -1;
    int64_t version, n_ranks, pp, capacity;
    const char *policy;
    const cJSON *seqs, *items;
    double makespan = 0, lower_bound = 0;
    if (!cJSON_IsObject(root)) {
        bs_fail("%s: expected a JSON object", path);
        goto out;
    }
    if (json_get_int(root, "version", &version, path) != 0) goto out;
    if (version != PLAN_FORMAT_VERSION) {
        bs_fail("%s: plan format version %lld; this build reads version %d", path, (long long)version,
                PLAN_FORMAT_VERSION);
        goto out;
    }
    // n_ranks and pp size the per-rank tables the reader allocates: bounded as `bytescale plan`'s
    // --ranks and --pp, so a file cannot ask for gigabytes (or overflow ranks x tp x pp later)
    if (json_get_string(root, "policy", &policy, path) != 0 || get_int_in(root, "n_ranks", 1, 1 << 20, &n_ranks, path) != 0 ||
        get_int_in(root, "pp", 1, 1 << 10, &pp, path) != 0 ||
        get_int_in(root, "capacity", 1, INT64_MAX / 4, &capacity, path) != 0 ||
        json_opt_double(root, "makespan", &makespan, path) != 0 ||
        json_opt_double(root, "lower_bound", &lower_bound, path) != 0 ||
        json_get_array(root, "sequences", &seqs, path) != 0 || json_get_array(root, "items", &items, path) != 0)
        goto out;
    if (strlen(policy) >= sizeof p->policy) {
        bs_fail("%s: \"policy\" is longer than %zu characters", path, sizeof p->policy - 1);
        goto out;
    }
    if (read_sequences(seqs, &b, path) != 0) goto out;
    if (plan_init(p, &b, (int32_t)n_ranks, capacity, (int32_t)pp, policy) != 0) {
        bs_fail_ctx("%s", path);
        goto out;
    }
    inited = 1;
    int k = 0;
    const cJSON *o;
    cJSON_ArrayForEach(o, items) {
        if (read_item(p, o, k++, &rbuf, &rcap, &sbuf, &scap, path) != 0) goto out;
    }
    if (plan_finalize(p, cm) != 0 || plan_validate(p, cm) != 0) {
        bs_fail_ctx("%s", path);
        goto out;
    }
    if (!cm) p->lower_bound = lower_bound;  // without a cost model the file's estimates stand
    (void)makespan;                         // always re-derived from the items' est_time
    rc = 0;
out:
    if (rc != 0 && inited) plan_free(p);
    free(b.seqs);
    free(rbuf);
    free(sbuf);
    cJSON_Delete(root);
    return rc;
}

int plan_read_json(Plan *p, const char *path) { return plan_read_json_cm(p, path, NULL); }
