// test_cli_blas.c: `bytescale train` runs OpenBLAS's fastest kernels for this CPU. Where OpenBLAS
// falls back to kernels older than the CPU (a model newer than its table), train says so once per
// job, runs again with OPENBLAS_CORETYPE set, and its "matmuls:" line names the kernels picked;
// elsewhere OpenBLAS's own choice stands and nothing is said. BS_QUIET=1 runs the same kernels
// without the note; a person's OPENBLAS_CORETYPE is kept, and --help runs nothing again. (nn/blas_core.h; the pick itself is tests/nn/test_blas_core.c.)
#include "cli/cli_run.h"

#include <cblas.h>

#include "nn/blas_core.h"

#define DIR "test-tmp/cli_blas"
#define ARGS "train --data " DIR "/data --model tiny --tokens 256 --context 64 --steps 1 --warmup 1"
#define NOTE "running again with OPENBLAS_CORETYPE="

// The kernel set named by train's "train: matmuls: OpenBLAS 0.3.21, <core> kernels..." line, into core.
static void matmuls_core(char *core, size_t n, int *forced) {
    const char *l = strstr(cli_out, "train: matmuls: OpenBLAS ");
    if (!l) fail_msg("no matmuls line: %s", cli_out);
    const char *c = strchr(l, ',');
    assert_non_null(c);
    c += 2;
    size_t len = strcspn(c, " ");
    snprintf(core, n, "%.*s", (int)len, c);
    const char *eol = strchr(l, '\n');
    const char *tag = strstr(l, "(OPENBLAS_CORETYPE)");
    *forced = tag && (!eol || tag < eol);
}

static int count(const char *hay, const char *needle) {
    int k = 0;
    for (const char *p = strstr(hay, needle); p; p = strstr(p + 1, needle)) k++;
    return k;
}

static void test_train_runs_the_cpus_kernels(void **state) {
    (void)state;
    test_tmpdir("cli_blas");
    cli_make_corpus(DIR, 6, 8, 4, 1024);
    char core[64];
    int forced;

    // as a person would start it: no OPENBLAS_CORETYPE, 2 ranks
    int rc = cli_run_job(DIR, 2, 0, "env -u OPENBLAS_CORETYPE -u BS_QUIET", ARGS);
    if (rc != 0) fail_msg("train: exit %d: %s", rc, cli_err);
    matmuls_core(core, sizeof core, &forced);
    const char *note = strstr(cli_err, NOTE);
    if (note) {
        // OpenBLAS fell back here: the note names the old kernels, once for the job, and the run
        // used the kernels it named, which are what the CPU can run
        assert_int_equal(count(cli_err, NOTE), 1);
        char picked[64], old[64];
        snprintf(picked, sizeof picked, "%.*s", (int)strcspn(note + strlen(NOTE), " "), note + strlen(NOTE));
        const char *chose = strstr(cli_err, "chose its ");
        assert_non_null(chose);
        snprintf(old, sizeof old, "%.*s", (int)strcspn(chose + 10, " "), chose + 10);
        const char *want = blas_core_pick(old, openblas_get_config(), blas_core_cpu());
        if (!want || strcmp(want, picked) != 0) fail_msg("fell back to %s, picked %s: %s", old, picked, cli_err);
        if (strcmp(core, picked) != 0 || !forced) fail_msg("picked %s, ran %s: %s", picked, core, cli_out);
        print_message("OpenBLAS falls back to %s on this CPU: train ran %s\n", old, picked);
    } else {
        // OpenBLAS knows this CPU: its choice stands, untouched
        assert_false(forced);
        assert_null(blas_core_pick(core, openblas_get_config(), blas_core_cpu()));
        print_message("OpenBLAS runs %s on this CPU: train kept it\n", core);
    }
    char core_first[64];
    snprintf(core_first, sizeof core_first, "%s", core);
    int forced_first = forced;

    // a script's repeated runs (BS_QUIET=1) run the same kernels without the note
    rc = cli_run_np(DIR, 2, "env -u OPENBLAS_CORETYPE", ARGS);
    if (rc != 0) fail_msg("train: exit %d: %s", rc, cli_err);
    assert_null(strstr(cli_err, NOTE));
    char quiet_core[64];
    int quiet_forced;
    matmuls_core(quiet_core, sizeof quiet_core, &quiet_forced);
    assert_string_equal(quiet_core, core_first);
    assert_int_equal(quiet_forced, forced_first);

    // a person's choice is kept, even a slow one, and nothing is said
    if (strstr(openblas_get_config(), "DYNAMIC_ARCH")) {
        rc = cli_run_job(DIR, 0, 0, "env -u BS_QUIET OPENBLAS_CORETYPE=Prescott", ARGS);
        if (rc != 0) fail_msg("train: exit %d: %s", rc, cli_err);
        assert_null(strstr(cli_err, NOTE));
        matmuls_core(core, sizeof core, &forced);
        if (strcmp(core, "Prescott") != 0 || !forced) fail_msg("OPENBLAS_CORETYPE=Prescott ran %s: %s", core, cli_out);
    }

    // help runs no matmuls, so nothing runs again
    rc = cli_run_job(DIR, 0, 0, "env -u OPENBLAS_CORETYPE -u BS_QUIET", "train --help");
    assert_int_equal(rc, 0);
    assert_null(strstr(cli_err, NOTE));
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_train_runs_the_cpus_kernels),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
