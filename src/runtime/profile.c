// profile.c: measure this machine for the cost model (profile.h, docs/profile.md).
//
// The whole profile: its settings, the measurements in order, the table and the file. Each
// measurement, as the trainer would meet it, is a file of its own with its table section and JSON
// member: one layer's compute on the engine itself (profile_layer.c) and the head it leaves
// (profile_head.c), one ring step's block (profile_ring.c), the activation bytes from the engine's
// own accounting (profile_act.c), ring-sized messages through the Comm API (profile_link.c), the 3D
// messages (profile_3d.c) and the offload file tier (profile_tier.c); their shared statistics and
// fits are profile_fit.c. Whatever one machine cannot measure comes from cost_derive on the `cpu`
// hardware profile, and the file says which is which, field by field.
#include "bytescale/profile.h"

#include <cblas.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <cJSON.h>

#include "bytescale/error.h"
#include "bytescale/hw.h"
#include "bytescale/json.h"
#include "bytescale/timer.h"
#include "profile_internal.h"

// ---- settings -----------------------------------------------------------------------------------------

void profile_defaults(ProfileConfig *c, const ModelConfig *m) {
    memset(c, 0, sizeof *c);
    c->model = m;
    static const int64_t lengths[] = {256, 384, 512, 768, 1024, 1536, 2048, 3072, 4096, 6144, 8192};
    c->n_lengths = (int)(sizeof lengths / sizeof lengths[0]);
    memcpy(c->lengths, lengths, sizeof lengths);
    c->reps = 5;
    c->warmup = 1;
    c->layers[0] = 1, c->layers[1] = 3;
    c->holdout = 3;
    c->capacity = 4096;  // train_defaults(): capacity = context = 4K
    c->hdp_ranks = 2;    // the `cpu` profile: one rank per core of this 2-core machine
    c->p2p_reps = 15;
    c->tier_bytes = 256 << 20;
    c->tier_reps = 3;
}

int profile_config_check(const ProfileConfig *c) {
    if (!c->model) return bs_fail("no model");
    if (c->n_lengths < 1 || c->n_lengths > PROFILE_MAX_LENGTHS)
        return bs_fail("--lengths: %d lengths (1 to %d)", c->n_lengths, PROFILE_MAX_LENGTHS);
    for (int i = 0; i < c->n_lengths; i++) {
        if (c->lengths[i] < 1 || c->lengths[i] > (1 << 20))
            return bs_fail("--lengths: %lld is out of range [1, 1M]", (long long)c->lengths[i]);
        if (i > 0 && c->lengths[i] <= c->lengths[i - 1])
            return bs_fail("--lengths: must be ascending and distinct (%lld after %lld)", (long long)c->lengths[i],
                           (long long)c->lengths[i - 1]);
    }
    int fit = 0;
    for (int i = 0; i < c->n_lengths; i++) fit += !profile_held_out(i, c->n_lengths, c->holdout);
    if (fit < 3)
        return bs_fail("--lengths: %d of the %d lengths %s left to fit T(s) = a1 s^2 + b1 s + c (--holdout %d holds "
                       "out %d); the fit needs at least 3: give more lengths, or --holdout 0",
                       fit, c->n_lengths, fit == 1 ? "is" : "are", c->holdout, c->n_lengths - fit);
    if (c->reps < 1 || c->reps > 1000) return bs_fail("--reps: %d is out of range [1, 1000]", c->reps);
    if (c->warmup < 0 || c->warmup > 100) return bs_fail("--warmup: %d is out of range [0, 100]", c->warmup);
    if (c->layers[0] < 1 || c->layers[1] <= c->layers[0] || c->layers[1] > 64)
        return bs_fail("--layers: %d,%d must be two layer counts 1 <= A < B <= 64", c->layers[0], c->layers[1]);
    if (c->holdout < 0) return bs_fail("--holdout: %d must be >= 0", c->holdout);
    if (c->capacity < 1 || c->capacity > (1 << 24))
        return bs_fail("--capacity: %lld is out of range [1, 16M]", (long long)c->capacity);
    if (c->hdp_ranks < 1 || c->hdp_ranks > (1 << 20))
        return bs_fail("--ranks: %d is out of range [1, 1M]", c->hdp_ranks);
    if (c->p2p_reps < 1 || c->p2p_reps > 10000)
        return bs_fail("--p2p-reps: %d is out of range [1, 10000]", c->p2p_reps);
    if (c->tier_bytes < 4096 || c->tier_bytes > (1ll << 40))
        return bs_fail("--tier-bytes: %lld is out of range [4K, 1T]", (long long)c->tier_bytes);
    if (c->tier_reps < 1 || c->tier_reps > 100)
        return bs_fail("--tier-reps: %d is out of range [1, 100]", c->tier_reps);
    if (c->model->n_experts > 1) return bs_fail("model %s: the engine has no MoE layers", c->model->name);
    return 0;
}

// ---- the machine ----------------------------------------------------------------------------------------

static void describe_machine(Profile *p) {
    p->cores = (int)sysconf(_SC_NPROCESSORS_ONLN);
    snprintf(p->cpu, sizeof p->cpu, "unknown");
    FILE *f = fopen("/proc/cpuinfo", "r");
    char line[512];
    while (f && fgets(line, sizeof line, f)) {
        if (strncmp(line, "model name", 10) != 0) continue;
        const char *v = strchr(line, ':');
        if (!v) continue;
        v += 1 + (v[1] == ' ');
        snprintf(p->cpu, sizeof p->cpu, "%.*s", (int)strcspn(v, "\n"), v);
        break;
    }
    if (f) fclose(f);
    const char *cfg = openblas_get_config();
    snprintf(p->blas, sizeof p->blas, "%s", cfg ? cfg : "OpenBLAS");
    p->blas_threads = openblas_get_num_threads();
    time_t now = time(NULL);
    struct tm tm;
    gmtime_r(&now, &tm);
    strftime(p->date, sizeof p->date, "%Y-%m-%dT%H:%M:%SZ", &tm);
}

// ---- the whole profile ---------------------------------------------------------------------------------

int profile_run(Profile *p, const ProfileConfig *c, Comm *comm) {
    memset(p, 0, sizeof *p);
    p->cfg = *c;
    if (profile_config_check(c) != 0) return -1;
    double t_start = now_seconds();
    p->n_ranks = comm->size;
    // a rank is one core: the cost model's coefficients are per rank, and OpenBLAS would otherwise
    // spread one rank's matmuls over the cores its neighbours use
    openblas_set_num_threads(1);
    describe_machine(p);
    const HardwareProfile *cpu = hw_find("cpu");
    if (!cpu || cost_derive(&p->derived, c->model, cpu, 1, 1, c->hdp_ranks, c->capacity) != 0)
        return bs_fail_ctx("the `cpu` profile's cost model");
    p->cm = p->derived;  // what is not measured below stays the `cpu` profile's

    Progress pr;
    int64_t units = 0;
    for (int i = 0; i < c->n_lengths; i++)
        units += (int64_t)(c->warmup + c->reps) * profile_compute_units(p, c->lengths[i]);
    units += profile_ring_units(p) + (comm->size > 1 ? 32 : 0) + profile_tier_units(c) + profile_3d_units(p, comm);
    progress_start(&pr, "profile", units);
    pr.quiet |= c->quiet || comm->rank != 0;
    ProfileTick t = {&pr, 0};

    if (profile_measure_act(p) != 0) return -1;
    if (profile_measure_compute(p, comm, &pr, &t.done) != 0) return -1;
    // the ring step before the layer's fit: its floor comes out of the layer's constant
    if (profile_measure_ring(p, comm, &pr, &t.done) != 0) return -1;
    if (profile_fit_compute(p) != 0) return -1;
    if (profile_measure_link(p, comm, &t) != 0) return -1;
    if (profile_measure_3d(p, comm, &t) != 0) return -1;
    if (profile_measure_tier(p, comm, &t) != 0) return -1;
    progress_finish(&pr, units, "done");

    CostModel *cm = &p->cm;
    cm->capacity_bytes = cost_rank_act(cm, (double)c->capacity, 0.0);
    if (p->p2p_measured) {  // one node: both levels are the link just measured
        cm->ring_bw = cm->ring_bw_intra = p->link_bw;
        cm->ring_lat = cm->ring_lat_intra = p->link_lat;
    }
    if (!p->measured_3d) {  // one process: the link's figures, as cost_load takes them for an old file
        cm->tp_bw = cm->stage_bw = cm->ring_bw_intra;
        cm->tp_lat = cm->stage_lat = cm->ring_lat_intra;
    }
    // the model copies out during forward and back during backward, one direction at a time
    cm->offload_bw = fmin(p->tier_write_bw, p->tier_read_bw);
    p->seconds = now_seconds() - t_start;
    return 0;
}

void profile_free(Profile *p) {
    for (int i = 0; i < PROFILE_MAX_LENGTHS; i++) free(p->pts[i].samples);
    for (int i = 0; i < PROFILE_MAX_SIZES; i++) free(p->link[i].samples);
    for (int i = 0; i < PROFILE_MAX_RING; i++) free(p->ring[i].samples);
    free(p->tier_write), free(p->tier_read);
    memset(p, 0, sizeof *p);
}

// ---- printing ----------------------------------------------------------------------------------------------

static void print_heading(FILE *f, const Profile *p) {
    const ModelConfig *m = p->cfg.model;
    fprintf(f, "profile: model %s (%d layers, d_model %d, %d heads, %d K/V heads of %d), %d rank%s\n", m->name,
            m->n_layers, m->d_model, m->n_heads, m->n_kv_heads, m->head_dim, p->n_ranks, p->n_ranks > 1 ? "s" : "");
    fprintf(f, "machine: %s, %d cores, %s, %d BLAS thread%s per rank, %s\n\n", p->cpu, p->cores, p->blas,
            p->blas_threads, p->blas_threads == 1 ? "" : "s", p->date);
}

// What no measurement gave: cost_derive's fields, and the capacity in bytes that both feed.
static void print_derived(FILE *f, const Profile *p) {
    const ProfileConfig *c = &p->cfg;
    const CostModel *cm = &p->cm, *d = &p->derived;
    fprintf(f, "from cost_derive on the `cpu` profile (%d HDP ranks, capacity %lld): n_layers %d, ranks_per_node %d, "
               "kv_token %.0f, grad_sync %.4g s, optimizer %.4g s\n",
            c->hdp_ranks, (long long)c->capacity, cm->n_layers, cm->ranks_per_node, cm->kv_token, cm->grad_sync,
            cm->optimizer);
    fprintf(f, "capacity_bytes = shared(C) + n_layers x Act(C) = %.6g (the engine's; the `cpu` profile's: %.6g)\n",
            cm->capacity_bytes, d->capacity_bytes);
}

// One section per measurement, in the order profile_run takes them, the ring step beside the layer
// fit it corrects.
void profile_print(FILE *f, const Profile *p) {
    print_heading(f, p);
    profile_layer_print(f, p);
    profile_ring_print(f, p);
    profile_head_print(f, p);
    profile_act_print(f, p);
    profile_link_print(f, p);
    profile_3d_print(f, p);
    profile_tier_print(f, p);
    print_derived(f, p);
    fprintf(f, "took %.1f s\n", p->seconds);
}

// ---- the file ------------------------------------------------------------------------------------------------

// Where each field of the file came from.
static const char *field_source(const Profile *p, const char *key, int *measured) {
    *measured = 1;
    if (!strcmp(key, "attn_pair") || !strcmp(key, "lin_token"))
        return "fit of T(s) to the per-layer times (compute.points)";
    if (!strcmp(key, "layer_const"))
        return "fit of T(s) to the per-layer times (compute.points): max(0, its constant c - attn_step)";
    if (!strcmp(key, "attn_step")) {
        *measured = p->n_ring > 0;
        return p->n_ring > 0 ? "fit of attn_step + pairs x rate to one ring step's block times (ring_step.points)"
                             : "the `cpu` hardware profile (not measured)";
    }
    if (!strncmp(key, "act_", 4))
        return "the engine's accounting, llama_activation_bytes and llama_resident_bytes (activations)";
    if (!strncmp(key, "head_", 5)) return "fit of the model's time beyond its layers (head.points)";
    if (!strncmp(key, "ring_", 5)) {
        *measured = p->p2p_measured;
        return p->p2p_measured ? "fit of lat + bytes / bw to the ping-pong between ranks 0 and 1 (links.points)"
                               : "the `cpu` hardware profile (one process: not measured)";
    }
    if (!strncmp(key, "tp_", 3) || !strncmp(key, "stage_", 6)) {
        *measured = p->measured_3d;
        if (!p->measured_3d) return "ring_bw_intra / ring_lat_intra (one process: not measured)";
        return key[0] == 't' ? "fit of lat + bytes / bw to the all-reduce of rows x d_model floats (3d.tp_allreduce), "
                               "in the ring form: tp_bw = 2 (W-1)/W bw, tp_lat = lat / (2 (W-1))"
                             : "fit of lat + bytes / bw to rows x d_model floats between ranks 0 and 1 (3d.stage)";
    }
    if (!strcmp(key, "offload_bw")) return "min(write, read) bandwidth of the offload tier (offload)";
    if (!strcmp(key, "capacity_bytes"))
        return "what C = settings.capacity tokens hold without offloading: shared(C) + n_layers x Act(C)";
    *measured = 0;
    return "cost_derive on the `cpu` hardware profile";
}

static cJSON *machine_json(const Profile *p) {
    cJSON *mach = cJSON_CreateObject();
    cJSON_AddStringToObject(mach, "cpu", p->cpu);
    cJSON_AddNumberToObject(mach, "cores", p->cores);
    cJSON_AddStringToObject(mach, "blas", p->blas);
    cJSON_AddNumberToObject(mach, "blas_threads", p->blas_threads);
    cJSON_AddNumberToObject(mach, "ranks", p->n_ranks);
    cJSON_AddStringToObject(mach, "date", p->date);
    return mach;
}

static cJSON *settings_json(const ProfileConfig *c) {
    cJSON *set = cJSON_CreateObject();
    double lens[PROFILE_MAX_LENGTHS];
    for (int i = 0; i < c->n_lengths; i++) lens[i] = (double)c->lengths[i];
    cJSON_AddItemToObject(set, "lengths", profile_number_array(lens, c->n_lengths));
    cJSON_AddNumberToObject(set, "reps", c->reps);
    cJSON_AddNumberToObject(set, "warmup", c->warmup);
    double layers[2] = {c->layers[0], c->layers[1]};
    cJSON_AddItemToObject(set, "layers", profile_number_array(layers, 2));
    cJSON_AddNumberToObject(set, "holdout", c->holdout);
    cJSON_AddStringToObject(set, "clock", c->wall_clock ? "wall" : "cpu");
    cJSON_AddNumberToObject(set, "capacity", (double)c->capacity);
    cJSON_AddNumberToObject(set, "hdp_ranks", c->hdp_ranks);
    cJSON_AddNumberToObject(set, "p2p_reps", c->p2p_reps);
    cJSON_AddNumberToObject(set, "tier_bytes", (double)c->tier_bytes);
    cJSON_AddNumberToObject(set, "tier_reps", c->tier_reps);
    return set;
}

// Per cost-model field (and the two integers the file adds): measured or not, and from what.
static cJSON *fields_json(const Profile *p) {
    cJSON *fields = cJSON_CreateObject();
    const char *extra[] = {"n_layers", "ranks_per_node"};
    for (int i = 0; i < cost_field_count() + 2; i++) {
        const char *key = i < cost_field_count() ? cost_field_name(i) : extra[i - cost_field_count()];
        int measured;
        const char *src = field_source(p, key, &measured);
        cJSON *fo = cJSON_AddObjectToObject(fields, key);
        cJSON_AddBoolToObject(fo, "measured", measured);
        cJSON_AddStringToObject(fo, "source", src);
    }
    return fields;
}

// The member "profile" of the file (docs/profile.md, "The file"): the run, then one member per
// measurement in the order of the table, then the `cpu` profile for comparison.
static cJSON *profile_json(const Profile *p) {
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "format", "bytescale-profile");
    cJSON_AddNumberToObject(o, "format_version", 1);
    cJSON_AddStringToObject(o, "model", p->cfg.model->name);
    cJSON_AddNumberToObject(o, "seconds", p->seconds);
    cJSON_AddItemToObject(o, "machine", machine_json(p));
    cJSON_AddItemToObject(o, "settings", settings_json(&p->cfg));
    cJSON_AddItemToObject(o, "fields", fields_json(p));
    cJSON_AddItemToObject(o, "compute", profile_layer_json(p));
    cJSON_AddItemToObject(o, "ring_step", profile_ring_json(p));
    cJSON_AddItemToObject(o, "head", profile_head_json(p));
    cJSON_AddItemToObject(o, "activations", profile_act_json(p));
    cJSON_AddItemToObject(o, "links", profile_link_json(p));
    cJSON_AddItemToObject(o, "3d", profile_3d_json(p));
    cJSON_AddItemToObject(o, "offload", profile_tier_json(p));
    cJSON *der = cJSON_AddObjectToObject(o, "cpu_profile");  // for comparison: what the analytic model says
    for (int i = 0; i < cost_field_count(); i++) cJSON_AddNumberToObject(der, cost_field_name(i), cost_field_value(&p->derived, i));
    return o;
}

int profile_write(const Profile *p, const char *path) {
    const CostModel *cm = &p->cm;
    cJSON *root = cJSON_CreateObject();
    if (!root) return bs_fail("%s: out of memory building JSON", path);
    // the cost model first, exactly as cost_save writes it, so the file reloads bit for bit
    int ok = cJSON_AddNumberToObject(root, "version", 1) != NULL;
    ok = ok && cJSON_AddNumberToObject(root, "n_layers", cm->n_layers);
    ok = ok && cJSON_AddNumberToObject(root, "ranks_per_node", cm->ranks_per_node);
    for (int i = 0; ok && i < cost_field_count(); i++) ok = json_add_exact(root, cost_field_name(i), cost_field_value(cm, i));
    cJSON *prof = ok ? profile_json(p) : NULL;
    ok = prof && cJSON_AddItemToObject(root, "profile", prof);
    int rc = ok ? json_write_file(path, root, 1) : bs_fail("%s: out of memory building JSON", path);
    cJSON_Delete(root);
    if (rc != 0) return -1;
    // what plan and simulate will read: the same numbers, or the file is no use
    CostModel back;
    if (cost_load(&back, path) != 0) return bs_fail_ctx("the profile just written does not load");
    for (int i = 0; i < cost_field_count(); i++)
        if (cost_field_value(&back, i) != cost_field_value(cm, i))
            return bs_fail("%s: \"%s\" reads back as %.17g, not %.17g", path, cost_field_name(i), cost_field_value(&back, i),
                           cost_field_value(cm, i));
    return 0;
}
