// test_blas_core.c: which OpenBLAS kernels a CPU should run (nn/blas_core.h). blas_core_pick against
// a table written from OpenBLAS's kernel sets and the CPU features they need; and the kernels this
// process loaded are the ones ctest asked for (CMakeLists.txt sets OPENBLAS_CORETYPE for the tests
// when OpenBLAS falls back on this machine), with nothing better left.
#include "test_util.h"

#include <cblas.h>
#include <strings.h>

#include "nn/blas_core.h"

#define DYN "OpenBLAS 0.3.21 NO_LAPACKE DYNAMIC_ARCH NO_AFFINITY Prescott MAX_THREADS=64"

static void expect_pick(const char *core, const char *config, int avx2, int avx512, const char *want) {
    BlasCpu cpu = {avx2, avx512};
    const char *got = blas_core_pick(core, config, cpu);
    if ((got == NULL) != (want == NULL) || (got && want && strcmp(got, want) != 0))
        fail_msg("core %s, avx2 %d, avx512 %d, config '%s': picked %s, want %s", core ? core : "(null)", avx2, avx512,
                 config ? config : "(null)", got ? got : "none", want ? want : "none");
}

static void test_pick(void **state) {
    (void)state;
    // the fallback on a CPU OpenBLAS does not know: the widest kernels the CPU can run
    expect_pick("Prescott", DYN, 1, 1, "SkylakeX");
    expect_pick("Prescott", DYN, 1, 0, "Haswell");
    expect_pick("prescott", DYN, 1, 1, "SkylakeX");  // OpenBLAS's names, any case
    // older kernel sets that a newer CPU outgrew
    expect_pick("Nehalem", DYN, 1, 0, "Haswell");
    expect_pick("Sandybridge", DYN, 1, 1, "SkylakeX");
    expect_pick("Core2", DYN, 1, 0, "Haswell");
    // a CPU without AVX2 + FMA: the old kernels are right for it
    expect_pick("Prescott", DYN, 0, 0, NULL);
    expect_pick("Sandybridge", DYN, 0, 0, NULL);
    // OpenBLAS's informed choices stand, also on a CPU with AVX-512 (it picks Haswell where the
    // 512-bit units are slow), and so does a name newer than the table
    expect_pick("Haswell", DYN, 1, 1, NULL);
    expect_pick("Zen", DYN, 1, 0, NULL);
    expect_pick("SkylakeX", DYN, 1, 1, NULL);
    expect_pick("Cooperlake", DYN, 1, 1, NULL);
    expect_pick("SapphireRapids", DYN, 1, 1, NULL);
    expect_pick("Zen5", DYN, 1, 1, NULL);
    // a build for one CPU ignores OPENBLAS_CORETYPE: nothing to gain by running again
    expect_pick("Prescott", "OpenBLAS 0.3.21 NO_AFFINITY Prescott MAX_THREADS=64", 1, 1, NULL);
    expect_pick(NULL, DYN, 1, 1, NULL);
    expect_pick("Prescott", NULL, 1, 1, NULL);
}

static void test_this_process(void **state) {
    (void)state;
    BlasCpu cpu = blas_core_cpu();
    assert_true(!cpu.avx512 || cpu.avx2_fma);  // AVX-512 as OpenBLAS uses it comes with AVX2 + FMA
    const char *asked = getenv("OPENBLAS_CORETYPE");
    const char *core = openblas_get_corename();
    assert_non_null(core);
    // under ctest (it sets BS_BINARY) the configure step's probe gave the tests the kernels to run:
    // none better may be left, or every test here ran OpenBLAS's fallback
    const char *better = blas_core_better();
    if (getenv("BS_BINARY") && better)
        fail_msg("OpenBLAS runs %s here and %s would be better: ctest should have set OPENBLAS_CORETYPE=%s "
                 "(cmake/blas_core_probe.c; did the configure step warn?)",
                 core, better, better);
    if (asked && strstr(openblas_get_config(), "DYNAMIC_ARCH")) {
        // ctest's choice (or the person's) is what OpenBLAS loaded, and nothing better is left
        if (strcasecmp(core, asked) != 0) fail_msg("OPENBLAS_CORETYPE=%s, but OpenBLAS runs %s", asked, core);
        assert_null(better);
    }
    char line[256];
    blas_core_describe(line, sizeof line);
    if (!strstr(line, core) || strncmp(line, "OpenBLAS ", 9) != 0) fail_msg("describe: %s (core %s)", line, core);
    assert_true((strstr(line, "(OPENBLAS_CORETYPE)") != NULL) == (asked != NULL));
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_pick),
        cmocka_unit_test(test_this_process),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
