// hw.c: built-in hardware profiles and profile files (see hw.h). Every built-in number has its
// public source, or is marked as our assumption, in docs/hardware.md.
#include "bytescale/hw.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

#include "bytescale/error.h"
#include "bytescale/json.h"

// name, gpus/node, peak, efficiency, mem, intra_bw, inter_bw, intra_lat, inter_lat, host_bw, elem_bytes,
// attn_efficiency, mem_bw, attn_step
static const HardwareProfile profiles[] = {
    // 8x H100 SXM5 80GB (DGX/HGX H100): 989 TFLOP/s dense bf16; NVLink 4 900 GB/s bidirectional;
    // one ConnectX-7 400 Gb/s NIC per GPU; PCIe Gen5 x16 to the host; HBM3 3.35 TB/s.
    {"h100-sxm", 8, 989e12, 0.5, 80e9, 450e9, 50e9, 5e-6, 10e-6, 50e9, 2, 0.35, 3.35e12, 0},
    // h100-sxm with what one H100 measurement fixes (docs/measured/): efficiency and attn_efficiency
    // fitted to a LLaMA-7B layer's forward + backward at 16K-64K tokens (2K-8K held out), host_bw
    // the slower of the pinned copy directions, attn_step fitted to one ring step's block compute at
    // 16 to 16K tokens per chunk (h100-ring-step.json). NVLink, RDMA and latencies cannot be measured
    // on one GPU: h100-sxm's. Bench bench_costcheck re-derives the fit; tests/core/test_measured_h100.c
    // checks it.
    {"h100-measured", 8, 989e12, 0.535, 80e9, 450e9, 50e9, 5e-6, 10e-6, 54.7e9, 2, 0.479, 3.35e12, 248e-6},
    // H800 SXM5: the H100 with NVLink cut to 400 GB/s bidirectional (sold in China).
    {"h800-sxm", 8, 989e12, 0.5, 80e9, 200e9, 50e9, 5e-6, 10e-6, 50e9, 2, 0.35, 3.35e12, 0},
    // this machine: one core per rank, fp32 AVX2 FMA (2 x 8 lanes x 2 FLOPs x 2.6 GHz), 2 cores per node;
    // "links" are MPI shared-memory copies and "host" offload is a memcpy.
    {"cpu", 2, 83.2e9, 0.7, 8e9, 5e9, 5e9, 1e-6, 1e-6, 10e9, 4, 0.7, 20e9, 0},
};

enum { N_PROFILES = (int)(sizeof profiles / sizeof profiles[0]) };

int hw_count(void) { return N_PROFILES; }

const HardwareProfile *hw_at(int i) { return (i >= 0 && i < N_PROFILES) ? &profiles[i] : NULL; }

const HardwareProfile *hw_find(const char *name) {
    for (int i = 0; i < N_PROFILES; i++)
        if (name && strcmp(profiles[i].name, name) == 0) return &profiles[i];
    char known[256] = "";
    size_t used = 0;
    for (int i = 0; i < N_PROFILES; i++)
        used += (size_t)snprintf(known + used, sizeof known - used, "%s%s", i ? ", " : "", profiles[i].name);
    bs_fail("unknown hardware profile \"%s\" (known: %s)", name ? name : "(null)", known);
    return NULL;
}

int hw_check(const HardwareProfile *h) {
    if (!h) return bs_fail("hardware profile: none given");
    if (memchr(h->name, '\0', sizeof h->name) == NULL) return bs_fail("hardware profile: name is not terminated");
    const char *n = h->name[0] ? h->name : "(unnamed)";
    if (h->gpus_per_node < 1)
        return bs_fail("hardware profile \"%s\": gpus_per_node must be >= 1 (got %d)", n, h->gpus_per_node);
    // quantities that must be finite and > 0
    struct {
        const char *field;
        double value;
    } positive[] = {
        {"peak_flops", h->peak_flops}, {"mem_bytes", h->mem_bytes}, {"intra_bw", h->intra_bw},
        {"inter_bw", h->inter_bw},     {"host_bw", h->host_bw},
    };
    for (size_t i = 0; i < sizeof positive / sizeof positive[0]; i++)
        if (!(isfinite(positive[i].value) && positive[i].value > 0))
            return bs_fail("hardware profile \"%s\": %s must be > 0 (got %g)", n, positive[i].field, positive[i].value);
    // latencies and the optional bandwidth may be 0
    struct {
        const char *field;
        double value;
    } nonneg[] = {{"intra_lat", h->intra_lat}, {"inter_lat", h->inter_lat}, {"mem_bw", h->mem_bw},
                  {"attn_step", h->attn_step}};
    for (size_t i = 0; i < sizeof nonneg / sizeof nonneg[0]; i++)
        if (!(isfinite(nonneg[i].value) && nonneg[i].value >= 0))
            return bs_fail("hardware profile \"%s\": %s must be >= 0 (got %g)", n, nonneg[i].field, nonneg[i].value);
    // what a real device can have (docs/hardware.md, "Profile files"): a number outside is a typo or a
    // unit mistake, refused here by name before it makes every plan infeasible with no word of why
    struct {
        const char *field, *unit;
        double value, lo, hi;
    } range[] = {
        {"peak_flops", "FLOP/s", h->peak_flops, 1e6, 1e18}, {"mem_bytes", "bytes", h->mem_bytes, 1e6, 1e14},
        {"intra_bw", "bytes/s", h->intra_bw, 1e3, 1e14},    {"inter_bw", "bytes/s", h->inter_bw, 1e3, 1e14},
        {"host_bw", "bytes/s", h->host_bw, 1e3, 1e14},      {"mem_bw", "bytes/s", h->mem_bw, 1e3, 1e14},
        {"intra_lat", "s", h->intra_lat, 0, 10},            {"inter_lat", "s", h->inter_lat, 0, 10},
        {"attn_step", "s", h->attn_step, 0, 1},
        {"gpus_per_node", "devices", h->gpus_per_node, 1, 65536},
    };
    for (size_t i = 0; i < sizeof range / sizeof range[0]; i++) {
        double v = range[i].value;
        if (v == 0 && !strcmp(range[i].field, "mem_bw")) continue;  // optional: 0 = not given
        if (v < range[i].lo || v > range[i].hi)
            return bs_fail("hardware profile \"%s\": %s is %g %s, outside what a device can have [%g, %g] %s", n,
                           range[i].field, v, range[i].unit, range[i].lo, range[i].hi, range[i].unit);
    }
    if (!(h->efficiency > 0 && h->efficiency <= 1))
        return bs_fail("hardware profile \"%s\": efficiency must be in (0, 1] (got %g)", n, h->efficiency);
    if (!(h->attn_efficiency >= 0 && h->attn_efficiency <= 1))
        return bs_fail("hardware profile \"%s\": attn_efficiency must be in [0, 1] (0 = efficiency) (got %g)", n,
                       h->attn_efficiency);
    if (h->elem_bytes != 2 && h->elem_bytes != 4)
        return bs_fail("hardware profile \"%s\": elem_bytes must be 2 (bf16) or 4 (fp32) (got %d)", n, h->elem_bytes);
    return 0;
}

static int load_fields(const cJSON *root, HardwareProfile *h, const char *where) {
    const char *name;
    if (json_get_string(root, "name", &name, where) != 0) return -1;
    if (name[0] == '\0' || strlen(name) >= sizeof h->name)
        return bs_fail("%s: \"name\" must have 1 to %zu characters", where, sizeof h->name - 1);
    memcpy(h->name, name, strlen(name) + 1);
    int64_t gpus, elem;
    if (json_get_int(root, "gpus_per_node", &gpus, where) != 0) return -1;
    if (json_get_int(root, "elem_bytes", &elem, where) != 0) return -1;
    if (gpus < 1 || gpus > 1 << 20) return bs_fail("%s: \"gpus_per_node\" out of range (got %lld)", where, (long long)gpus);
    if (elem < 0 || elem > 64) return bs_fail("%s: \"elem_bytes\" out of range (got %lld)", where, (long long)elem);
    h->gpus_per_node = (int)gpus;
    h->elem_bytes = (int)elem;
    struct {
        const char *key;
        double *dst;
    } required[] = {
        {"peak_flops", &h->peak_flops}, {"efficiency", &h->efficiency}, {"mem_bytes", &h->mem_bytes},
        {"intra_bw", &h->intra_bw},     {"inter_bw", &h->inter_bw},     {"intra_lat", &h->intra_lat},
        {"inter_lat", &h->inter_lat},   {"host_bw", &h->host_bw},
    };
    for (size_t i = 0; i < sizeof required / sizeof required[0]; i++)
        if (json_get_double(root, required[i].key, required[i].dst, where) != 0) return -1;
    if (json_opt_double(root, "attn_efficiency", &h->attn_efficiency, where) != 0) return -1;
    if (json_opt_double(root, "mem_bw", &h->mem_bw, where) != 0) return -1;
    if (json_opt_double(root, "attn_step", &h->attn_step, where) != 0) return -1;
    return 0;
}

int hw_load_file(const char *path, HardwareProfile *out) {
    cJSON *root;
    if (json_read_file(path, &root) != 0) return -1;
    HardwareProfile h;
    memset(&h, 0, sizeof h);
    int rc = load_fields(root, &h, path);
    cJSON_Delete(root);
    if (rc != 0) return -1;
    if (hw_check(&h) != 0) return bs_fail_ctx("%s", path);
    *out = h;
    return 0;
}

int hw_resolve(const char *name_or_file, HardwareProfile *out) {
    if (!name_or_file || !*name_or_file) return bs_fail("hardware: no profile name or file given");
    size_t n = strlen(name_or_file);
    int is_file = strchr(name_or_file, '/') != NULL || (n > 5 && strcmp(name_or_file + n - 5, ".json") == 0);
    if (is_file) return hw_load_file(name_or_file, out);
    const HardwareProfile *hw = hw_find(name_or_file);
    if (!hw) {
        // a file in the current directory named without '/' or .json reads as a name: say how to pass it
        char known[512];
        snprintf(known, sizeof known, "%s", bs_errmsg());
        return bs_fail("%s; a profile file needs a '/' or a .json name (./%s)", known, name_or_file);
    }
    *out = *hw;
    return 0;
}

int hw_save_file(const HardwareProfile *h, const char *path) {
    if (hw_check(h) != 0) return bs_fail_ctx("%s: not saved", path);
    cJSON *root = cJSON_CreateObject();
    if (!root) return bs_fail("%s: out of memory building JSON", path);
    int ok = cJSON_AddStringToObject(root, "name", h->name) != NULL;
    ok = ok && json_add_exact(root, "gpus_per_node", h->gpus_per_node);
    ok = ok && json_add_exact(root, "peak_flops", h->peak_flops);
    ok = ok && json_add_exact(root, "efficiency", h->efficiency);
    ok = ok && json_add_exact(root, "attn_efficiency", h->attn_efficiency);
    ok = ok && json_add_exact(root, "mem_bytes", h->mem_bytes);
    ok = ok && json_add_exact(root, "mem_bw", h->mem_bw);
    ok = ok && json_add_exact(root, "intra_bw", h->intra_bw);
    ok = ok && json_add_exact(root, "inter_bw", h->inter_bw);
    ok = ok && json_add_exact(root, "intra_lat", h->intra_lat);
    ok = ok && json_add_exact(root, "inter_lat", h->inter_lat);
    ok = ok && json_add_exact(root, "host_bw", h->host_bw);
    ok = ok && json_add_exact(root, "attn_step", h->attn_step);
    ok = ok && json_add_exact(root, "elem_bytes", h->elem_bytes);
    int rc = ok ? json_write_file(path, root, 1) : bs_fail("%s: out of memory building JSON", path);
    cJSON_Delete(root);
    return rc;
}
