// test_fuzz_profiles.c: hardware profiles and cost-model files under fuzzing (fuzz_util.h).
#include "fuzz_util.h"

#include "bytescale/cost.h"
#include "bytescale/hw.h"
#include "bytescale/model.h"

#define DIR "test-tmp/fuzz_profiles"

static int parse_hw(const char *path, void *ctx) {
    (void)ctx;
    HardwareProfile h;
    return hw_load_file(path, &h);
}

static int parse_cost(const char *path, void *ctx) {
    (void)ctx;
    CostModel cm;
    return cost_load(&cm, path);
}

static void test_fuzz_hardware_files(void **state) {
    (void)state;
    test_tmpdir("fuzz_profiles");
    const char *names[] = {"h100-sxm", "h800-sxm", "cpu"};
    char paths[3][128];
    const char *seeds[3];
    for (int i = 0; i < 3; i++) {
        snprintf(paths[i], sizeof paths[i], DIR "/%s.json", names[i]);
        assert_int_equal(hw_save_file(hw_find(names[i]), paths[i]), 0);
        seeds[i] = paths[i];
    }
    assert_true(fuzz_run(DIR, "hardware profile", seeds, 3, 3000, parse_hw, NULL) > 0);
}

static void test_fuzz_cost_files(void **state) {
    (void)state;
    test_tmpdir("fuzz_profiles");
    CostModel cm;
    const char *seeds[2] = {DIR "/7b.json", DIR "/tiny.json"};
    assert_int_equal(cost_derive(&cm, model_find("llama-7b"), hw_find("h800-sxm"), 2, 1, 512, 8192), 0);
    assert_int_equal(cost_save(&cm, seeds[0]), 0);
    assert_int_equal(cost_derive(&cm, model_find("tiny"), hw_find("cpu"), 1, 1, 2, 4096), 0);
    assert_int_equal(cost_save(&cm, seeds[1]), 0);
    assert_true(fuzz_run(DIR, "cost-model file", seeds, 2, 3000, parse_cost, NULL) > 0);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_fuzz_hardware_files),
        cmocka_unit_test(test_fuzz_cost_files),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
