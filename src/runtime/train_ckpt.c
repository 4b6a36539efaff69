// train_ckpt.c: a trainer's checkpoint - what it holds, how it is checked against the trainer it is
// loaded into, and how a run is resumed from it (see train.h, docs/training.md).
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "bytescale/checkpoint.h"
#include "bytescale/error.h"
#include "bytescale/json.h"
#include "bytescale/train.h"
#include "runtime/train_internal.h"

#define CONFIG_FORMAT "bytescale-train"
#define CONFIG_VERSION 1

// The "state" section: little-endian 64-bit words in this order.
enum { ST_STEP, ST_ADAM_T, ST_SAMPLER_SEED, ST_SAMPLER_EPOCH, ST_SAMPLER_POS, ST_SAMPLER_TAKEN, ST_SAMPLER_NDOCS,
       ST_DATA_FINGERPRINT, ST_WORDS };

static const char *const required_sections[] = {"config", "state", "params", "adam.m", "adam.v"};
enum { N_REQUIRED = sizeof required_sections / sizeof required_sections[0] };

// What identifies the dataset a checkpoint was trained on.
typedef struct {
    int64_t n_docs, n_tokens, vocab;
    uint32_t fingerprint;
} DataId;

static DataId data_id(const Trainer *t) {
    const DocIndex *ix = &t->data.index;
    return (DataId){.n_docs = ix->n_docs, .n_tokens = ix->n_tokens, .vocab = ix->vocab,
                    .fingerprint = t->data_fingerprint};
}

// ---- the config section: JSON, readable with `strings` -----------------------------------------------

// Every number is written with json_add_exact: cJSON's own printing keeps 15 digits whenever they
// read back within an epsilon, and a resumed run needs its settings bit for bit (the CLI's default
// min lr, lr / 10, is often such a number). *ok drops to 0 when memory runs out (obj NULL included).
static void put_num(cJSON *obj, const char *key, double v, int *ok) {
    if (!json_add_exact(obj, key, v)) *ok = 0;
}

static void put_str(cJSON *obj, const char *key, const char *s, int *ok) {
    if (!cJSON_AddStringToObject(obj, key, s)) *ok = 0;
}

static char *config_json(const Trainer *t) {
    const TrainConfig *c = &t->cfg;
    const ModelConfig *m = &t->model;
    const AdamWConfig *a = &t->opt.cfg;
    DataId d = data_id(t);
    int ok = 1;
    cJSON *root = cJSON_CreateObject();
    put_str(root, "format", CONFIG_FORMAT, &ok);
    put_num(root, "version", CONFIG_VERSION, &ok);
    put_num(root, "step", (double)t->step, &ok);

    cJSON *mo = cJSON_AddObjectToObject(root, "model");
    put_str(mo, "name", m->name, &ok);
    put_num(mo, "n_layers", m->n_layers, &ok);
    put_num(mo, "n_heads", m->n_heads, &ok);
    put_num(mo, "n_kv_heads", m->n_kv_heads, &ok);
    put_num(mo, "d_model", m->d_model, &ok);
    put_num(mo, "head_dim", m->head_dim, &ok);
    put_num(mo, "d_ff", m->d_ff, &ok);
    put_num(mo, "vocab_size", m->vocab_size, &ok);
    put_num(mo, "n_experts", m->n_experts, &ok);
    put_num(mo, "top_k", m->top_k, &ok);
    put_num(mo, "rope_theta", m->rope_theta, &ok);
    put_num(mo, "norm_eps", m->norm_eps, &ok);
    put_num(mo, "n_params", (double)t->llama.n_params, &ok);

    cJSON *so = cJSON_AddObjectToObject(root, "settings");
    put_str(so, "policy", c->policy, &ok);
    put_num(so, "tokens", (double)c->tokens, &ok);
    put_num(so, "context", (double)c->context, &ok);
    put_num(so, "capacity", (double)t->capacity, &ok);
    put_num(so, "lr", c->lr, &ok);
    put_num(so, "min_lr", c->min_lr, &ok);
    put_num(so, "warmup", (double)c->warmup, &ok);
    put_num(so, "schedule_steps", (double)t->sched.total_steps, &ok);
    put_num(so, "weight_decay", c->weight_decay, &ok);
    put_num(so, "clip", c->clip, &ok);
    put_num(so, "seed", (double)c->seed, &ok);  // < 2^53 (train_config_check): the double is exact
    put_num(so, "beta1", a->beta1, &ok);
    put_num(so, "beta2", a->beta2, &ok);
    put_num(so, "eps", a->eps, &ok);

    cJSON *dob = cJSON_AddObjectToObject(root, "dataset");
    put_str(dob, "dir", c->data, &ok);
    put_num(dob, "n_docs", (double)d.n_docs, &ok);
    put_num(dob, "n_tokens", (double)d.n_tokens, &ok);
    put_num(dob, "vocab", (double)d.vocab, &ok);
    put_num(dob, "fingerprint", (double)d.fingerprint, &ok);

    cJSON *ro = cJSON_AddObjectToObject(root, "run");
    put_num(ro, "steps", (double)c->steps, &ok);
    put_str(ro, "ckpt_dir", c->ckpt_dir, &ok);
    put_num(ro, "ckpt_every", (double)c->ckpt_every, &ok);
    put_num(ro, "ckpt_keep", c->ckpt_keep, &ok);
    put_str(ro, "metrics", c->metrics, &ok);

    char *text = ok ? cJSON_Print(root) : NULL;
    cJSON_Delete(root);
    if (!text) bs_fail("out of memory printing the checkpoint config");
    return text;
}

static const cJSON *get_object(const cJSON *obj, const char *key, const char *where) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(obj, key);
    if (cJSON_IsObject(v)) return v;
    bs_fail("%s: missing object \"%s\"", where, key);
    return NULL;
}

static int get_int(const cJSON *o, const char *key, int *out, const char *where) {
    int64_t v;
    if (json_get_int(o, key, &v, where) != 0) return -1;
    if (v < -2147483647 - 1 || v > 2147483647) return bs_fail("%s: \"%s\" is out of range", where, key);
    *out = (int)v;
    return 0;
}

static int get_str(const cJSON *o, const char *key, char *out, size_t cap, const char *where) {
    const char *s;
    if (json_get_string(o, key, &s, where) != 0) return -1;
    if (strlen(s) >= cap) return bs_fail("%s: \"%s\" is too long", where, key);
    memcpy(out, s, strlen(s) + 1);
    return 0;
}

// Parse the config section into the settings and run of a TrainConfig, the model shape and the
// dataset identity.
static int parse_config(const Checkpoint *ck, TrainConfig *c, ModelConfig *m, DataId *d) {
    const void *data;
    uint64_t size;
    if (ckpt_find(ck, "config", &data, &size) != 0) return -1;
    char where[1100];
    snprintf(where, sizeof where, "%s: config", ck->path);
    cJSON *root = cJSON_ParseWithLength(data, (size_t)size);
    if (!root) return bs_fail("%s: not valid JSON", where);
    *c = train_defaults();
    memset(m, 0, sizeof *m);
    memset(d, 0, sizeof *d);
    const char *format;
    int64_t version, x;
    const cJSON *mo = NULL, *so = NULL, *dob = NULL, *ro = NULL;
    int rc = json_get_string(root, "format", &format, where);
    if (rc == 0 && strcmp(format, CONFIG_FORMAT) != 0) rc = bs_fail("%s: format \"%s\" is not a trainer's", where, format);
    if (rc == 0) rc = json_get_int(root, "version", &version, where);
    if (rc == 0 && version != CONFIG_VERSION)
        rc = bs_fail("%s: version %lld (this build reads %d)", where, (long long)version, CONFIG_VERSION);
    if (rc == 0 && !((mo = get_object(root, "model", where)) && (so = get_object(root, "settings", where)) &&
                     (dob = get_object(root, "dataset", where)) && (ro = get_object(root, "run", where))))
        rc = -1;
    // the model shape
    if (rc == 0) rc = get_str(mo, "name", m->name, sizeof m->name, where);
    if (rc == 0) rc = get_int(mo, "n_layers", &m->n_layers, where);
    if (rc == 0) rc = get_int(mo, "n_heads", &m->n_heads, where);
    if (rc == 0) rc = get_int(mo, "n_kv_heads", &m->n_kv_heads, where);
    if (rc == 0) rc = get_int(mo, "d_model", &m->d_model, where);
    if (rc == 0) rc = get_int(mo, "head_dim", &m->head_dim, where);
    if (rc == 0) rc = get_int(mo, "d_ff", &m->d_ff, where);
    if (rc == 0) rc = get_int(mo, "vocab_size", &m->vocab_size, where);
    if (rc == 0) rc = get_int(mo, "n_experts", &m->n_experts, where);
    if (rc == 0) rc = get_int(mo, "top_k", &m->top_k, where);
    if (rc == 0) rc = json_get_double(mo, "rope_theta", &m->rope_theta, where);
    if (rc == 0) rc = json_get_double(mo, "norm_eps", &m->norm_eps, where);
    // the settings
    if (rc == 0) snprintf(c->model, sizeof c->model, "%s", m->name);
    if (rc == 0) rc = get_str(so, "policy", c->policy, sizeof c->policy, where);
    if (rc == 0) rc = json_get_int(so, "tokens", &c->tokens, where);
    if (rc == 0) rc = json_get_int(so, "context", &c->context, where);
    if (rc == 0) rc = json_get_int(so, "capacity", &c->capacity, where);
    if (rc == 0) rc = json_get_double(so, "lr", &c->lr, where);
    if (rc == 0) rc = json_get_double(so, "min_lr", &c->min_lr, where);
    if (rc == 0) rc = json_get_int(so, "warmup", &c->warmup, where);
    if (rc == 0) rc = json_get_int(so, "schedule_steps", &c->schedule_steps, where);
    if (rc == 0) rc = json_get_double(so, "weight_decay", &c->weight_decay, where);
    if (rc == 0) rc = json_get_double(so, "clip", &c->clip, where);
    if (rc == 0) rc = json_get_int(so, "seed", &x, where);
    if (rc == 0 && x < 0) rc = bs_fail("%s: \"seed\" is negative", where);
    if (rc == 0) c->seed = (uint64_t)x;
    // the dataset
    if (rc == 0) rc = get_str(dob, "dir", c->data, sizeof c->data, where);
    if (rc == 0) rc = json_get_int(dob, "n_docs", &d->n_docs, where);
    if (rc == 0) rc = json_get_int(dob, "n_tokens", &d->n_tokens, where);
    if (rc == 0) rc = json_get_int(dob, "vocab", &d->vocab, where);
    if (rc == 0) rc = json_get_int(dob, "fingerprint", &x, where);
    if (rc == 0) d->fingerprint = (uint32_t)x;
    // the run
    if (rc == 0) rc = json_get_int(ro, "steps", &c->steps, where);
    if (rc == 0) rc = get_str(ro, "ckpt_dir", c->ckpt_dir, sizeof c->ckpt_dir, where);
    if (rc == 0) rc = json_get_int(ro, "ckpt_every", &c->ckpt_every, where);
    if (rc == 0) rc = get_int(ro, "ckpt_keep", &c->ckpt_keep, where);
    if (rc == 0) rc = get_str(ro, "metrics", c->metrics, sizeof c->metrics, where);
    cJSON_Delete(root);
    return rc;
}

// ---- the state section ------------------------------------------------------------------------------

static void put_u64(uint8_t *p, uint64_t x) {
    for (int i = 0; i < 8; i++) p[i] = (uint8_t)(x >> (8 * i));
}

static uint64_t get_u64(const uint8_t *p) {
    uint64_t x = 0;
    for (int i = 0; i < 8; i++) x |= (uint64_t)p[i] << (8 * i);
    return x;
}

static int save_file(const Trainer *t, const char *path, const float *params, const float *m, const float *v,
                     size_t n);

// The optimizer's moments of every ZeRO-1 shard, gathered into this process's whole part (m, v:
// n_params of its model shard each) on every HDP rank of its (stage, tp).
static int gather_moments(const Trainer *t, float **m, float **v) {
    size_t n = t->llama.n_params, shard = t->opt.end - t->opt.begin;
    *m = bs_malloc(n * sizeof(float));
    *v = bs_malloc(n * sizeof(float));
    if (!*m || !*v) return -1;
    memcpy(*m + t->opt.begin, t->opt.m, shard * sizeof(float));
    memcpy(*v + t->opt.begin, t->opt.v, shard * sizeof(float));
    if (comm_allgatherv(t->par.hdp_comm, *m, t->zero.counts, t->zero.displs) != 0 ||
        comm_allgatherv(t->par.hdp_comm, *v, t->zero.counts, t->zero.displs) != 0)
        return bs_fail_ctx("gathering the optimizer shards");
    return 0;
}

// The index of the first of the n floats at x that is not finite, or -1. x may be unaligned (a
// section inside a checkpoint file's buffer), so each float is copied out.
static int64_t first_non_finite(const void *x, size_t n) {
    const unsigned char *b = x;
    for (size_t i = 0; i < n; i++) {
        float f;
        memcpy(&f, b + i * sizeof f, sizeof f);
        if (!isfinite(f)) return (int64_t)i;
    }
    return -1;
}

// A checkpoint must be a state training can continue from: a NaN or an infinity anywhere is refused
// before anything is written, so it can never replace (or, with --ckpt-keep, delete) a good one.
static int check_finite(size_t n, const char *path, const float *params, const float *m, const float *v) {
    const struct {
        const char *name;
        const float *x;
    } arrays[] = {{"parameter", params}, {"Adam first moment", m}, {"Adam second moment", v}};
    for (size_t a = 0; a < sizeof arrays / sizeof arrays[0]; a++) {
        int64_t i = first_non_finite(arrays[a].x, n);
        if (i >= 0)
            return bs_fail("not writing checkpoint %s: %s %lld is %g: the model diverged, and the newest checkpoint "
                           "before this one is the last good state",
                           path, arrays[a].name, (long long)i, arrays[a].x[i]);
    }
    return 0;
}

int trainer_save(const Trainer *t, const char *path) {
    // every rank takes part in the gathers; rank 0 writes; everyone learns whether it worked. The
    // file holds the whole model in its one layout, whatever the job's tp x pp x hdp
    float *m = NULL, *v = NULL, *full[3] = {NULL, NULL, NULL};
    size_t n = parallel_full_params(&t->model);
    int rc = gather_moments(t, &m, &v);
    for (int i = 0; rc == 0 && t->rank == 0 && i < 3; i++)
        if (!(full[i] = bs_malloc((n > 0 ? n : 1) * sizeof(float)))) rc = -1;
    const float *local[3] = {t->llama.params, m, v};
    for (int i = 0; rc == 0 && i < 3; i++) rc = parallel_gather_full(&t->par, &t->model, local[i], full[i]);
    if (rc == 0 && t->rank == 0) rc = check_finite(n, path, full[0], full[1], full[2]);
    if (rc == 0 && t->rank == 0) rc = save_file(t, path, full[0], full[1], full[2], n);
    free(m);
    free(v);
    for (int i = 0; i < 3; i++) free(full[i]);
    char msg[1024];
    snprintf(msg, sizeof msg, "%s", rc == 0 ? "" : bs_errmsg());
    int64_t ok = rc == 0;
    if (comm_bcast(t->comm, &ok, sizeof ok, 0) != 0 || comm_bcast(t->comm, msg, sizeof msg, 0) != 0) return -1;
    if (!ok) return bs_fail("%s", msg);
    return 0;
}

static int save_file(const Trainer *t, const char *path, const float *params, const float *m, const float *v,
                     size_t n) {
    char *config = config_json(t);
    if (!config) return bs_fail_ctx("%s", path);
    SamplerState ss = train_sampler_position(t);
    uint64_t w[ST_WORDS];
    w[ST_STEP] = (uint64_t)t->step;
    w[ST_ADAM_T] = (uint64_t)t->opt.t;
    w[ST_SAMPLER_SEED] = ss.seed;
    w[ST_SAMPLER_EPOCH] = (uint64_t)ss.epoch;
    w[ST_SAMPLER_POS] = (uint64_t)ss.pos;
    w[ST_SAMPLER_TAKEN] = (uint64_t)ss.taken;
    w[ST_SAMPLER_NDOCS] = (uint64_t)ss.n_docs;
    w[ST_DATA_FINGERPRINT] = t->data_fingerprint;
    uint8_t state[ST_WORDS * 8];
    for (int i = 0; i < ST_WORDS; i++) put_u64(state + 8 * i, w[i]);

    // the fp32 arrays are written in memory order: little-endian IEEE on every machine we run on
    uint64_t whole = (uint64_t)n * sizeof(float);
    CkptBlob blobs[] = {
        {"config", config, strlen(config)},
        {"state", state, sizeof state},
        {"params", params, whole},
        {"adam.m", m, whole},
        {"adam.v", v, whole},
    };
    int rc = ckpt_save(path, blobs, (int)(sizeof blobs / sizeof blobs[0]));
    free(config);
    return rc;
}

// ---- loading: check everything first, then change the trainer ---------------------------------------

static int compare_model(const char *path, const ModelConfig *ck, const ModelConfig *now) {
    struct {
        const char *field;
        int a, b;
    } f[] = {{"n_layers", ck->n_layers, now->n_layers},       {"n_heads", ck->n_heads, now->n_heads},
             {"n_kv_heads", ck->n_kv_heads, now->n_kv_heads}, {"d_model", ck->d_model, now->d_model},
             {"head_dim", ck->head_dim, now->head_dim},       {"d_ff", ck->d_ff, now->d_ff},
             {"vocab_size", ck->vocab_size, now->vocab_size}, {"n_experts", ck->n_experts, now->n_experts},
             {"top_k", ck->top_k, now->top_k}};
    for (size_t i = 0; i < sizeof f / sizeof f[0]; i++)
        if (f[i].a != f[i].b)
            return bs_fail("%s: model mismatch: the checkpoint holds model %s with %s %d, this run's model %s has %d",
                           path, ck->name, f[i].field, f[i].a, now->name, f[i].b);
    if (ck->rope_theta != now->rope_theta || ck->norm_eps != now->norm_eps)
        return bs_fail("%s: model mismatch: the checkpoint's model %s has rope_theta %g, norm_eps %g; this run's %s has "
                       "%g, %g",
                       path, ck->name, ck->rope_theta, ck->norm_eps, now->name, now->rope_theta, now->norm_eps);
    return 0;
}

static int compare_data(const char *path, const char *dir_ck, const DataId *ck, const char *dir_now,
                        const DataId *now) {
    if (ck->n_docs != now->n_docs || ck->n_tokens != now->n_tokens || ck->vocab != now->vocab ||
        ck->fingerprint != now->fingerprint)
        return bs_fail("%s: dataset mismatch: the checkpoint was trained on %s (%lld documents, %lld tokens, vocab %lld, "
                       "fingerprint %08x), this run's dataset %s has %lld documents, %lld tokens, vocab %lld, "
                       "fingerprint %08x",
                       path, dir_ck, (long long)ck->n_docs, (long long)ck->n_tokens, (long long)ck->vocab,
                       ck->fingerprint, dir_now, (long long)now->n_docs, (long long)now->n_tokens,
                       (long long)now->vocab, now->fingerprint);
    return 0;
}

static int compare_settings(const char *path, const TrainConfig *ck, const Trainer *t) {
    const TrainConfig *c = &t->cfg;
    const char *why = "a resumed run keeps the settings it was started with";
    if (strcmp(ck->policy, c->policy) != 0)
        return bs_fail("%s: made with policy %s, this run has %s (%s)", path, ck->policy, c->policy, why);
    struct {
        const char *name;
        int64_t a, b;
    } i64[] = {{"tokens", ck->tokens, c->tokens},
               {"context", ck->context, c->context},
               {"capacity", ck->capacity, t->capacity},
               {"warmup", ck->warmup, c->warmup},
               {"schedule steps", ck->schedule_steps, t->sched.total_steps},
               {"seed", (int64_t)ck->seed, (int64_t)c->seed}};
    for (size_t i = 0; i < sizeof i64 / sizeof i64[0]; i++)
        if (i64[i].a != i64[i].b)
            return bs_fail("%s: made with %s %lld, this run has %lld (%s)", path, i64[i].name, (long long)i64[i].a,
                           (long long)i64[i].b, why);
    struct {
        const char *name;
        double a, b;
    } dbl[] = {{"lr", ck->lr, c->lr},
               {"min lr", ck->min_lr, c->min_lr},
               {"weight decay", ck->weight_decay, c->weight_decay},
               {"clip", ck->clip, c->clip}};
    for (size_t i = 0; i < sizeof dbl / sizeof dbl[0]; i++)
        if (dbl[i].a != dbl[i].b)
            return bs_fail("%s: made with %s %.17g, this run has %.17g (%s)", path, dbl[i].name, dbl[i].a, dbl[i].b, why);
    return 0;
}

// The checkpoint's three arrays, the whole model's (any layout): where they lie in the file.
typedef struct {
    const void *params, *m, *v;  // (n_full,) float each, maybe unaligned
    size_t n_full;
} Arrays;

// The arrays found with the sizes the model needs, every value finite and every second moment >= 0:
// a NaN or infinity would poison the run from its first step, so such a file is not a state to
// resume. 0, or -1 + error naming the section.
static int check_arrays(Arrays *a, const Checkpoint *ck, const Trainer *t) {
    const char *path = ck->path;
    uint64_t np, nm, nv;
    if (ckpt_find(ck, "params", &a->params, &np) != 0 || ckpt_find(ck, "adam.m", &a->m, &nm) != 0 ||
        ckpt_find(ck, "adam.v", &a->v, &nv) != 0)
        return -1;
    // the arrays are the whole model's (any layout); this process keeps its part of them
    size_t n_full = a->n_full = parallel_full_params(&t->model);
    uint64_t want_p = (uint64_t)n_full * sizeof(float), want_s = want_p;
    if (np != want_p || nm != want_s || nv != want_s)
        return bs_fail("%s: sections params / adam.m / adam.v hold %llu / %llu / %llu bytes, the model needs %llu / "
                       "%llu / %llu",
                       path, (unsigned long long)np, (unsigned long long)nm, (unsigned long long)nv,
                       (unsigned long long)want_p, (unsigned long long)want_s, (unsigned long long)want_s);
    const struct {
        const char *name;
        const void *x;
    } arrays[] = {{"params", a->params}, {"adam.m", a->m}, {"adam.v", a->v}};
    for (size_t k = 0; k < sizeof arrays / sizeof arrays[0]; k++) {
        int64_t bad = first_non_finite(arrays[k].x, n_full);
        if (bad >= 0)
            return bs_fail("%s: section %s holds a value that is not finite (element %lld): not a state training can "
                           "continue from",
                           path, arrays[k].name, (long long)bad);
    }
    for (size_t i = 0; i < n_full; i++) {  // a second moment is a mean of squares
        float x;
        memcpy(&x, (const unsigned char *)a->v + i * sizeof x, sizeof x);
        if (x < 0)
            return bs_fail("%s: section adam.v holds a negative second moment (element %zu): not a state training can "
                           "continue from",
                           path, i);
    }
    return 0;
}

// The state words against this run: the dataset's fingerprint, steps in range, the data position
// saved for this seed and this many documents. 0 (ss: the sampler's position), or -1 + error.
static int check_state(SamplerState *ss, const char *path, const uint64_t *w, const Trainer *t) {
    if (w[ST_DATA_FINGERPRINT] != t->data_fingerprint)
        return bs_fail("%s: dataset mismatch: state fingerprint %08llx, this run's dataset %s has %08x", path,
                       (unsigned long long)w[ST_DATA_FINGERPRINT], t->cfg.data, t->data_fingerprint);
    if (w[ST_STEP] > (uint64_t)INT64_MAX / 2 || w[ST_ADAM_T] > (uint64_t)INT64_MAX / 2)
        return bs_fail("%s: invalid step %llu / optimizer step %llu", path, (unsigned long long)w[ST_STEP],
                       (unsigned long long)w[ST_ADAM_T]);
    *ss = (SamplerState){.seed = w[ST_SAMPLER_SEED],
                         .epoch = (int64_t)w[ST_SAMPLER_EPOCH],
                         .pos = (int64_t)w[ST_SAMPLER_POS],
                         .taken = (int64_t)w[ST_SAMPLER_TAKEN],
                         .n_docs = (int64_t)w[ST_SAMPLER_NDOCS]};
    if (ss->seed != t->cfg.seed)
        return bs_fail("%s: the data position was saved for seed %llu, this run has %llu", path,
                       (unsigned long long)ss->seed, (unsigned long long)t->cfg.seed);
    if (ss->n_docs != t->data.index.n_docs)
        return bs_fail("%s: the data position is for %lld documents, this run's dataset has %lld", path,
                       (long long)ss->n_docs, (long long)t->data.index.n_docs);
    return 0;
}

// This process's part of the arrays into the trainer, with the steps from the state words. The
// parts are unpacked first (the sections may be unaligned: copied out first), so a failure (no
// memory) leaves the trainer as it was; nothing can fail once it starts changing.
static int install_arrays(Trainer *t, const char *path, const Arrays *a, const uint64_t *w) {
    size_t n_full = a->n_full, n_local = t->llama.n_params, shard = t->opt.end - t->opt.begin;
    float *whole = bs_malloc((n_full > 0 ? n_full : 1) * sizeof(float));
    float *lm = bs_malloc((n_local > 0 ? n_local : 1) * sizeof(float));
    float *lv = bs_malloc((n_local > 0 ? n_local : 1) * sizeof(float));
    int rc = whole && lm && lv ? 0 : -1;
    LlamaShard sh = t->llama.shard;
    if (rc == 0) {
        memcpy(whole, a->m, n_full * sizeof(float));
        rc = parallel_take_local(&t->model, &sh, whole, lm);
    }
    if (rc == 0) {
        memcpy(whole, a->v, n_full * sizeof(float));
        rc = parallel_take_local(&t->model, &sh, whole, lv);
    }
    if (rc == 0) memcpy(whole, a->params, n_full * sizeof(float));
    if (rc != 0) {
        free(whole), free(lm), free(lv);
        return bs_fail_ctx("%s: unpacking this process's part", path);
    }
    // nothing can fail from here on
    parallel_take_local(&t->model, &sh, whole, t->llama.params);
    memcpy(t->opt.m, lm + t->opt.begin, shard * sizeof(float));
    memcpy(t->opt.v, lv + t->opt.begin, shard * sizeof(float));
    free(whole), free(lm), free(lv);
    t->opt.t = (int64_t)w[ST_ADAM_T];
    t->step = (int64_t)w[ST_STEP];
    llama_zero_grad(&t->llama);
    return 0;
}

// The checkpoint into the trainer, every check first: the run's model, data and settings, the
// arrays, the state words; then the sampler's position (the last check) and the arrays.
static int load_checked(Trainer *t, const Checkpoint *ck) {
    const char *path = ck->path;
    TrainConfig cc;
    ModelConfig cm;
    DataId cd;
    if (parse_config(ck, &cc, &cm, &cd) != 0) return -1;
    if (compare_model(path, &cm, &t->model) != 0) return -1;
    DataId now = data_id(t);
    if (compare_data(path, cc.data, &cd, t->cfg.data, &now) != 0) return -1;
    if (compare_settings(path, &cc, t) != 0) return -1;
    uint8_t state[ST_WORDS * 8];
    if (ckpt_read(ck, "state", state, sizeof state) != 0) return -1;
    // the arrays' sizes and values now, so nothing can fail after the trainer starts changing
    Arrays a;
    if (check_arrays(&a, ck, t) != 0) return -1;
    uint64_t w[ST_WORDS];
    for (int i = 0; i < ST_WORDS; i++) w[i] = get_u64(state + 8 * i);
    SamplerState ss;
    if (check_state(&ss, path, w, t) != 0) return -1;
    // the last check; on failure sampler_restore keeps the old position. The sampler lives where
    // the documents are (with data servers: rank 0, the scheduler, alone)
    if (t->sampler.index && sampler_restore(&t->sampler, &ss) != 0) return bs_fail_ctx("%s", path);
    return install_arrays(t, path, &a, w);
}

int trainer_load(Trainer *t, const char *path) {
    // the background thread uses the sampler: wait for it; what it prepared stands if the load fails
    if (train_prefetch_join(t) != 0) return -1;
    Checkpoint ck;
    if (ckpt_load(&ck, path, required_sections, N_REQUIRED) != 0) return -1;
    int rc = load_checked(t, &ck);
    ckpt_free(&ck);
    if (rc == 0) train_prefetch_reset(t);  // the batches prepared ahead belong to the old position
    return rc;
}

int train_read_config(const char *path, TrainConfig *out) {
    Checkpoint ck;
    if (ckpt_load(&ck, path, required_sections, N_REQUIRED) != 0) return -1;
    ModelConfig m;
    DataId d;
    TrainConfig c;
    int rc = parse_config(&ck, &c, &m, &d);
    ckpt_free(&ck);
    if (rc == 0) *out = c;
    return rc;
}

void train_ckpt_path(char *out, size_t cap, const char *dir, int64_t step) {
    snprintf(out, cap, "%s/ckpt-%06lld.bin", dir, (long long)step);
}
