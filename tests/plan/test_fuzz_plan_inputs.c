// test_fuzz_plan_inputs.c: the plan layer's parsers under fuzzing (fuzz_util.h): lengths files (lines
// and JSON) and plan files (JSON, read with and without a cost model, which also validates them).
#include "fuzz_util.h"

#include "bytescale/batch.h"
#include "bytescale/hw.h"
#include "bytescale/model.h"
#include "bytescale/plan.h"
#include "bytescale/policy.h"

#define DIR "test-tmp/fuzz_plan"

static int parse_lengths(const char *path, void *ctx) {
    (void)ctx;
    GlobalBatch b;
    if (batch_read_file(&b, path) != 0) return -1;
    batch_free(&b);
    return 0;
}

static int parse_plan(const char *path, void *ctx) {
    Plan p;
    if (plan_read_json_cm(&p, path, ctx) != 0) return -1;
    plan_free(&p);
    return 0;
}

static void test_fuzz_lengths_files(void **state) {
    (void)state;
    test_tmpdir("fuzz_plan");
    const char *seeds[] = {DIR "/lines.txt", DIR "/array.json", DIR "/object.json"};
    const char *lines = "# lengths\n4096\n131072\n\n17\n2097152\n8192\n";
    assert_int_equal(file_write_atomic(seeds[0], lines, strlen(lines)), 0);
    assert_int_equal(file_write_atomic(seeds[1], "[4096, 131072, 17, 2097152]", 27), 0);
    const char *obj = "{\"lengths\": [1, 2, 3, 65536, 524288]}";
    assert_int_equal(file_write_atomic(seeds[2], obj, strlen(obj)), 0);
    assert_true(fuzz_run(DIR, "lengths file", seeds, 3, 3000, parse_lengths, NULL) > 0);
}

static void test_fuzz_plan_files(void **state) {
    (void)state;
    test_tmpdir("fuzz_plan");
    CostModel cm;
    assert_int_equal(cost_derive(&cm, model_find("llama-7b"), hw_find("h800-sxm"), 2, 1, 16, 8192), 0);
    // seeds: real plans of every policy, with packs, rings and offloading
    const char *policies[] = {"static", "naive", "balance"};
    char names[3][128];
    const char *seeds[3];
    for (int i = 0; i < 3; i++) {
        GlobalBatch b;
        assert_int_equal(batch_generate(&b, "byted", (uint64_t)(7 + i), 256 << 10, 64 << 10), 0);
        PlanConfig pc = {.n_ranks = 16, .capacity = 8192, .context = 64 << 10, .pp = 1, .offload = i != 0};
        Plan p;
        if (policy_plan(&p, policies[i], &b, &pc, &cm) != 0) fail_msg("%s", bs_errmsg());
        snprintf(names[i], sizeof names[i], DIR "/%s.json", policies[i]);
        assert_int_equal(plan_write_json(&p, names[i]), 0);
        seeds[i] = names[i];
        plan_free(&p);
        batch_free(&b);
    }
    assert_true(fuzz_run(DIR, "plan file", seeds, 3, 2000, parse_plan, NULL) >= 0);
    assert_true(fuzz_run(DIR, "plan file + cost model", seeds, 3, 1000, parse_plan, &cm) >= 0);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_fuzz_lengths_files),
        cmocka_unit_test(test_fuzz_plan_files),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
