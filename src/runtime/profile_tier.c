// profile_tier.c: the offload tier's write and read bandwidth, the cost model's offload_bw
// (profile.h, docs/profile.md "The offload tier").
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "bytescale/arena.h"
#include "bytescale/error.h"
#include "bytescale/offload.h"
#include "bytescale/timer.h"
#include "profile_internal.h"

#define TIER_MIN_CHUNK (1 << 20)

// Progress units of one pass, written and read: estimated milliseconds at ~1 GB/s.
static int64_t pass_units(const ProfileConfig *c) { return 2 * c->tier_bytes / (1 << 20) + 1; }

// (profile_internal.h)
int64_t profile_tier_units(const ProfileConfig *c) { return pass_units(c) * (c->tier_reps + 1) / 2; }

// The file tier as the model uses it: page-aligned chunks of one layer's activations at the
// capacity (what r = 1 moves per layer), written at increasing offsets and read back. One untimed
// write pass first gives the file its blocks; training overwrites the same offsets every micro-batch.
int profile_measure_tier(Profile *p, Comm *comm, ProfileTick *t) {
    const ProfileConfig *c = &p->cfg;
    size_t total_cap = arena_page_round((size_t)c->tier_bytes);
    size_t chunk = arena_page_round((size_t)cost_layer_act(&p->cm, c->capacity));
    if (chunk < TIER_MIN_CHUNK) chunk = TIER_MIN_CHUNK;
    if (chunk > total_cap) chunk = total_cap;
    size_t n_chunks = total_cap / chunk;
    double total = (double)(n_chunks * chunk);
    p->tier_chunk = (int64_t)chunk;
    OffloadTier tier;
    if (offload_tier_file(&tier, c->offload_dir) != 0) return bs_fail_ctx("the offload tier");
    snprintf(p->tier_name, sizeof p->tier_name, "%s", tier.name);
    Arena a;
    int rc = arena_init_pages(&a, chunk);
    if (rc == 0) memset(a.base, 0x5a, chunk);  // written pages: nothing is read from the zero page
    double *mine = bs_malloc(sizeof(double) * 2 * (size_t)c->tier_reps), *all = NULL;
    if (!mine) rc = -1;
    char note[64];
    for (int r = 0; rc == 0 && r <= c->tier_reps; r++) {
        rc = comm_barrier(comm);  // every rank's copies at once, as every rank offloads in training
        double t0 = now_seconds();
        for (size_t k = 0; rc == 0 && k < n_chunks; k++)
            rc = tier.write(tier.ctx, 0, a.base, chunk, (uint64_t)(k * chunk));
        double t1 = now_seconds();
        for (size_t k = 0; rc == 0 && r > 0 && k < n_chunks; k++)
            rc = tier.read(tier.ctx, 0, a.base, chunk, (uint64_t)(k * chunk));
        double t2 = now_seconds();
        if (rc == 0 && r > 0) mine[2 * (r - 1)] = total / (t1 - t0), mine[2 * (r - 1) + 1] = total / (t2 - t1);
        snprintf(note, sizeof note, "offload tier: %s %d of %d", r ? "pass" : "first write", r, c->tier_reps);
        profile_tick(t, pass_units(c) / 2, note);
    }
    if (rc != 0) bs_fail_ctx("%s", tier.name);
    offload_tier_close(&tier);
    arena_free(&a);
    if (rc == 0 && !(all = profile_gather(comm, mine, 2 * c->tier_reps))) rc = -1;
    int ns = c->tier_reps * comm->size;
    if (rc == 0) {
        p->tier_write = bs_malloc(sizeof(double) * (size_t)ns);
        p->tier_read = bs_malloc(sizeof(double) * (size_t)ns);
        if (!p->tier_write || !p->tier_read) rc = -1;
    }
    for (int i = 0; rc == 0 && i < ns; i++) p->tier_write[i] = all[2 * i], p->tier_read[i] = all[2 * i + 1];
    if (rc == 0) {
        p->n_tier = ns;
        p->tier_write_bw = profile_median(p->tier_write, ns);
        p->tier_read_bw = profile_median(p->tier_read, ns);
    }
    free(mine), free(all);
    return rc;
}

// (profile_internal.h)
void profile_tier_print(FILE *f, const Profile *p) {
    const ProfileConfig *c = &p->cfg;
    const CostModel *cm = &p->cm, *d = &p->derived;
    fprintf(f, "offload tier: %s\n", p->tier_name);
    fprintf(f, "  %lld MiB in chunks of %.1f MiB, median of %d: write %.3f GB/s, read %.3f GB/s -> offload_bw = %.3f "
               "GB/s (the slower; `cpu` profile: %.3g)\n\n",
            (long long)(c->tier_bytes >> 20), (double)p->tier_chunk / (1 << 20), p->n_tier, p->tier_write_bw / 1e9,
            p->tier_read_bw / 1e9, cm->offload_bw / 1e9, d->offload_bw);
}

// (profile_internal.h)
cJSON *profile_tier_json(const Profile *p) {
    const ProfileConfig *c = &p->cfg;
    cJSON *off = cJSON_CreateObject();
    cJSON_AddStringToObject(off, "tier", p->tier_name);
    cJSON_AddNumberToObject(off, "bytes", (double)c->tier_bytes);
    cJSON_AddNumberToObject(off, "chunk_bytes", (double)p->tier_chunk);
    cJSON_AddNumberToObject(off, "write_bw", p->tier_write_bw);
    cJSON_AddNumberToObject(off, "read_bw", p->tier_read_bw);
    cJSON_AddItemToObject(off, "write_samples", profile_number_array(p->tier_write, p->n_tier));
    cJSON_AddItemToObject(off, "read_samples", profile_number_array(p->tier_read, p->n_tier));
    return off;
}
