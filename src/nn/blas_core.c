// blas_core.c: OpenBLAS's kernel choice on this CPU, and running again with a better one (blas_core.h).
#include "nn/blas_core.h"

#include "bytescale/api.h"
#include "bytescale/progress.h"

#include <cblas.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#endif

// OpenBLAS's x86 kernel sets that predate AVX2 (its corename[] table): on a CPU with AVX2 and FMA,
// one of these means OpenBLAS did not recognise the CPU, or recognised an older one. A name outside
// this list (Haswell, Zen, SkylakeX, Cooperlake, SapphireRapids, or one added after this was
// written) is OpenBLAS's informed choice and stands.
static const char *const old_cores[] = {
    "Katmai",  "Coppermine", "Northwood", "Prescott",     "Banias",    "Athlon",    "Opteron",
    "Nehalem", "Atom",       "Nano",      "Opteron_SSE3", "Barcelona", "Core2",     "Penryn",
    "Bobcat",  "Dunnington", "Sandybridge", "Bulldozer",  "Piledriver", "Steamroller",
};

const char *blas_core_pick(const char *core, const char *config, BlasCpu cpu) {
    // a build for one CPU ignores OPENBLAS_CORETYPE: running again would change nothing
    if (!core || !config || !strstr(config, "DYNAMIC_ARCH")) return NULL;
    int old = 0;
    for (size_t i = 0; i < sizeof old_cores / sizeof old_cores[0]; i++) old |= !strcasecmp(core, old_cores[i]);
    if (!old || !cpu.avx2_fma) return NULL;
    return cpu.avx512 ? "SkylakeX" : "Haswell";
}

BlasCpu blas_core_cpu(void) {
    BlasCpu c = {0, 0};
#if defined(__x86_64__) || defined(__i386__)
    // libgcc checks that the OS saves the YMM / ZMM registers before it reports AVX2 / AVX-512
    __builtin_cpu_init();
    c.avx2_fma = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
    c.avx512 = c.avx2_fma && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512cd") &&
               __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512dq") &&
               __builtin_cpu_supports("avx512vl");
#endif
    return c;
}

const char *blas_core_better(void) {
    return blas_core_pick(openblas_get_corename(), openblas_get_config(), blas_core_cpu());
}

const char *bs_blas_coretype(void) { return blas_core_better(); }

// The first two words of openblas_get_config(), "OpenBLAS 0.3.21": their length.
static int config_version_len(const char *cfg) {
    int n = (int)strcspn(cfg, " ");
    return cfg[n] ? n + 1 + (int)strcspn(cfg + n + 1, " ") : n;
}

void blas_core_describe(char *buf, size_t n) {
    const char *cfg = openblas_get_config();
    int threads = openblas_get_num_threads();
    snprintf(buf, n, "%.*s, %s kernels%s, %d thread%s", config_version_len(cfg), cfg, openblas_get_corename(),
             getenv("OPENBLAS_CORETYPE") ? " (OPENBLAS_CORETYPE)" : "", threads, threads == 1 ? "" : "s");
}

// "family 6, model 207" for the message (the numbers OpenBLAS's table goes by), or "" off x86.
static void cpu_family_model(char *buf, size_t n) {
    buf[0] = '\0';
#if defined(__x86_64__) || defined(__i386__)
    unsigned a, b, c, d;
    if (!__get_cpuid(1, &a, &b, &c, &d)) return;
    unsigned family = (a >> 8) & 0xf, model = (a >> 4) & 0xf;
    if (family == 6 || family == 15) model |= ((a >> 16) & 0xf) << 4;
    if (family == 15) family += (a >> 20) & 0xff;
    snprintf(buf, n, " (family %u, model %u)", family, model);
#endif
}

// Rank 0 of an MPI job, or a process that no launcher started: the one that speaks for the job.
static int first_of_job(void) {
    static const char *const vars[] = {"OMPI_COMM_WORLD_RANK", "PMIX_RANK", "PMI_RANK"};
    for (size_t i = 0; i < sizeof vars / sizeof vars[0]; i++) {
        const char *v = getenv(vars[i]);
        if (v) return atoi(v) == 0;
    }
    return 1;
}

void blas_core_reexec(const char *who, char **argv) {
    if (getenv("OPENBLAS_CORETYPE")) return;  // the user's choice, or ours after the exec
    const char *better = blas_core_better();
    if (!better) return;
    if (setenv("OPENBLAS_CORETYPE", better, 1) != 0) return;
    // one note per job, none with BS_QUIET=1 (scripts' repeated runs, as for the progress line)
    int speak = first_of_job() && !progress_env_quiet();
    if (speak) {
        char cpu[64];
        cpu_family_model(cpu, sizeof cpu);
        const char *cfg = openblas_get_config();
        fprintf(stderr,
                "%s: %.*s does not know this CPU%s and chose its %s kernels, slower than the CPU allows; "
                "running again with OPENBLAS_CORETYPE=%s (set OPENBLAS_CORETYPE to choose yourself)\n",
                who, config_version_len(cfg), cfg, cpu, openblas_get_corename(), better);
    }
    fflush(stdout);
    fflush(stderr);
    execv("/proc/self/exe", argv);
    // no exec (no /proc, say): go on with OpenBLAS's own kernels, and say so where the note went
    if (speak)
        fprintf(stderr, "%s: could not run again (%s): going on with the %s kernels\n", who, strerror(errno),
                openblas_get_corename());
    unsetenv("OPENBLAS_CORETYPE");
}
