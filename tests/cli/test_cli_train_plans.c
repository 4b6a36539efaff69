// test_cli_train_plans.c: `train --cost FILE --save-plans DIR` on 2 MPI ranks. The trainer plans with
// the cost file (the same coefficients as the built-in derivation give byte-identical plans and
// losses), writes exactly the plans it ran (one valid plan file per step, with the items the metrics
// report), and `simulate --plan --cost` reads them; a cost file for another model and a --save-plans
// that is a file are refused at start.
#include "cli/cli_run.h"

#include <cJSON.h>

#include "bytescale/cost.h"
#include "bytescale/error.h"
#include "bytescale/fileio.h"
#include "bytescale/hw.h"
#include "bytescale/model.h"
#include "bytescale/plan.h"

#define DIR "test-tmp/cli_train_plans"
#define COMMON                                                                                                \
    "train --data " DIR "/data --model tiny --context 512 --capacity 256 --tokens 1024 --lr 3e-3 --warmup 1 " \
    "--steps 3 --policy balance"

static int mpi_run(const char *args) { return cli_run_np(DIR, 2, "", args); }

static void make_data(void) {
    test_tmpdir("cli_train_plans");
    cli_make_corpus(DIR, 12, 3, 6, 2100);
}

// The n-th step's "plan_items" from a metrics file (-1 when absent).
static int plan_items_of(const char *metrics, int step) {
    char *text;
    size_t n;
    assert_int_equal(file_read_all(metrics, &text, &n), 0);
    int items = -1;
    for (char *line = strtok(text, "\n"); line; line = strtok(NULL, "\n")) {
        cJSON *o = cJSON_Parse(line);
        assert_non_null(o);
        if (cJSON_GetObjectItem(o, "step")->valueint == step) items = cJSON_GetObjectItem(o, "plan_items")->valueint;
        cJSON_Delete(o);
    }
    free(text);
    return items;
}

static void test_cost_file_and_saved_plans(void **state) {
    (void)state;
    make_data();
    // the coefficients the trainer derives by itself (tiny on the cpu profile, 2 ranks, C = 256)
    CostModel cm;
    assert_int_equal(cost_derive(&cm, model_find("tiny"), hw_find("cpu"), 1, 1, 2, 256), 0);
    assert_int_equal(cost_save(&cm, DIR "/cost.json"), 0);

    if (mpi_run(COMMON " --save-plans " DIR "/derived --metrics " DIR "/derived.jsonl") != 0)
        fail_msg("derived: %s", cli_err);
    if (mpi_run(COMMON " --cost " DIR "/cost.json --save-plans " DIR "/file --metrics " DIR "/file.jsonl") != 0)
        fail_msg("--cost: %s", cli_err);
    for (int step = 1; step <= 3; step++) {
        char a[256], b[256];
        snprintf(a, sizeof a, DIR "/derived/plan-%06d.json", step);
        snprintf(b, sizeof b, DIR "/file/plan-%06d.json", step);
        // the same coefficients plan the same batches the same way, byte for byte
        char *ta, *tb;
        size_t na, nb;
        assert_int_equal(file_read_all(a, &ta, &na), 0);
        assert_int_equal(file_read_all(b, &tb, &nb), 0);
        assert_int_equal(na, nb);
        assert_memory_equal(ta, tb, na);
        free(ta);
        free(tb);
        // a valid plan of 2 ranks with the items the step ran
        Plan p;
        if (plan_read_json_cm(&p, b, &cm) != 0) fail_msg("%s", bs_errmsg());
        assert_int_equal(p.n_ranks, 2);
        assert_int_equal(p.capacity, 256);
        assert_int_equal(p.n_items, plan_items_of(DIR "/file.jsonl", step));
        plan_free(&p);
    }
    // the training itself is unchanged: the same losses
    char *la, *lb;
    size_t na, nb;
    assert_int_equal(file_read_all(DIR "/derived.jsonl", &la, &na), 0);
    assert_int_equal(file_read_all(DIR "/file.jsonl", &lb, &nb), 0);
    for (int step = 1; step <= 3; step++) {
        char key[32];
        snprintf(key, sizeof key, "{\"step\":%d,\"loss\":", step);
        const char *x = strstr(la, key), *y = strstr(lb, key);
        assert_non_null(x);
        assert_non_null(y);
        assert_true(strtod(x + strlen(key), NULL) == strtod(y + strlen(key), NULL));
    }
    free(la);
    free(lb);
    // the simulator reads the plan the trainer ran, with the same cost file
    if (cli_run(DIR, "", "simulate --plan " DIR "/file/plan-000002.json --cost " DIR
                         "/cost.json --model tiny --hardware cpu --tp 1 --json") != 0)
        fail_msg("simulate: %s", cli_err);
    cJSON *o = cJSON_Parse(cli_out);
    assert_non_null(o);
    assert_true(cJSON_GetObjectItem(o, "step_time")->valuedouble > 0);
    cJSON_Delete(o);
}

static void test_refused_at_start(void **state) {
    (void)state;
    // a cost file of another model (32 layers, not tiny's)
    CostModel cm;
    assert_int_equal(cost_derive(&cm, model_find("llama-7b"), hw_find("cpu"), 1, 1, 2, 256), 0);
    assert_int_equal(cost_save(&cm, DIR "/llama.json"), 0);
    assert_int_not_equal(mpi_run(COMMON " --cost " DIR "/llama.json"), 0);
    if (!strstr(cli_err, "layers")) fail_msg("expected the layer counts named: %s", cli_err);
    assert_int_not_equal(mpi_run(COMMON " --cost " DIR "/missing.json"), 0);
    if (!strstr(cli_err, "missing.json")) fail_msg("expected the file named: %s", cli_err);
    // --save-plans names a file, not a directory: refused before the first step
    assert_int_equal(file_write_atomic(DIR "/afile", "x", 1), 0);
    assert_int_not_equal(mpi_run(COMMON " --save-plans " DIR "/afile"), 0);
    if (!strstr(cli_err, "--save-plans")) fail_msg("expected --save-plans named: %s", cli_err);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_cost_file_and_saved_plans),
        cmocka_unit_test(test_refused_at_start),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
