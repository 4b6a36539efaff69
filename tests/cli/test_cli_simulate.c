// test_cli_simulate.c: `bytescale simulate` end to end - tables, JSON, traces, plan files, sweeps
// with plots, the grid, and bad flags giving exit code 2 with a message naming the problem.
#include "cli/cli_run.h"

#include <math.h>
#include <unistd.h>

#include "bytescale/batch.h"
#include "bytescale/cost.h"
#include "bytescale/error.h"
#include "bytescale/fileio.h"
#include "bytescale/json.h"
#include "bytescale/plan.h"
#include "bytescale/policy.h"

static const char *dir;

// Run `bytescale simulate <args>` with an optional environment prefix; returns the exit code.
static int run_env(const char *env, const char *args) {
    char a[4096];
    snprintf(a, sizeof a, "simulate %s", args);
    return cli_run(dir, env, a);
}

static int run(const char *args) { return run_env("", args); }

static void expect(const char *args, int code, const char *in_stderr) {
    char a[4096];
    snprintf(a, sizeof a, "simulate %s", args);
    cli_expect(dir, a, code, in_stderr);
}

static int count_lines(const char *text) {
    int n = 0;
    for (const char *p = text; *p; p++) n += *p == '\n';
    return n;
}

static int is_png(const char *path) {
    unsigned char head[8] = {0};
    FILE *f = fopen(path, "rb");
    if (!f) return 0;
    size_t n = fread(head, 1, 8, f);
    fclose(f);
    return n == 8 && head[0] == 0x89 && head[1] == 'P' && head[2] == 'N' && head[3] == 'G';
}

static int setup(void **state) {
    (void)state;
    dir = test_tmpdir("cli_simulate");
    return 0;
}

static void test_help_and_list(void **state) {
    (void)state;
    assert_int_equal(run("--help"), 0);
    assert_non_null(strstr(cli_out, "--scenario"));
    assert_non_null(strstr(cli_out, "--sweep"));
    assert_int_equal(run("--scenario list"), 0);
    assert_non_null(strstr(cli_out, "case-study"));
    assert_non_null(strstr(cli_out, "8x22b-16384-github-2m"));
    assert_int_equal(count_lines(cli_out), 1 + 48 + 1);  // header, the grid, the case study
}

static void test_json_results_of_a_small_cluster(void **state) {
    (void)state;
    int rc = run("--gpus 128 --tokens 4M --context 256K --dataset github --policy static,balance --json");
    if (rc != 0) fail_msg("exit %d: %s", rc, cli_err);
    cJSON *root = cJSON_Parse(cli_out);
    assert_non_null(root);
    const cJSON *setup_j = cJSON_GetObjectItem(root, "setup"), *results;
    int64_t ranks, tokens;
    assert_int_equal(json_get_int(setup_j, "hdp_ranks", &ranks, "setup"), 0);
    assert_int_equal(ranks, 64);  // 128 GPUs / tp 2 of the default scenario
    assert_int_equal(json_get_int(setup_j, "tokens", &tokens, "setup"), 0);
    assert_int_equal(tokens, 4 << 20);
    assert_int_equal(json_get_array(root, "results", &results, "root"), 0);
    assert_int_equal(cJSON_GetArraySize(results), 2);
    for (int i = 0; i < 2; i++) {
        const cJSON *r = cJSON_GetArrayItem(results, i);
        const char *policy;
        double step, tps, lb, mfu;
        assert_int_equal(json_get_string(r, "policy", &policy, "result"), 0);
        assert_string_equal(policy, i == 0 ? "static" : "balance");
        assert_int_equal(json_get_double(r, "step_time", &step, "result"), 0);
        assert_int_equal(json_get_double(r, "tokens_per_s", &tps, "result"), 0);
        assert_int_equal(json_get_double(r, "lower_bound", &lb, "result"), 0);
        assert_int_equal(json_get_double(r, "mfu", &mfu, "result"), 0);
        assert_close(tps * step, (double)(4 << 20), 1e-9, 0);
        assert_true(step >= lb && mfu > 0 && mfu < 1);
    }
    // the same run with the cost model from a file (what a measured profile would be): here the
    // derived one saved, so the results must not move
    double step0;
    assert_int_equal(json_get_double(cJSON_GetArrayItem(results, 1), "step_time", &step0, "result"), 0);
    cJSON_Delete(root);
    const ModelConfig *m = model_find("llama-7b");
    const HardwareProfile *hw = hw_find("h100-sxm");
    CostModel cm;
    assert_int_equal(cost_derive(&cm, m, hw, 2, 1, 64, 8 << 10), 0);
    char path[700], args[1400];
    snprintf(path, sizeof path, "%s/cost.json", dir);
    if (cost_save(&cm, path) != 0) fail_msg("%s", bs_errmsg());
    snprintf(args, sizeof args,
             "--gpus 128 --tokens 4M --context 256K --dataset github --policy balance --json --cost %s", path);
    int rc2 = run(args);
    if (rc2 != 0) fail_msg("exit %d: %s", rc2, cli_err);
    root = cJSON_Parse(cli_out);
    assert_non_null(root);
    double step1;
    assert_int_equal(json_get_double(cJSON_GetArrayItem(cJSON_GetObjectItem(root, "results"), 0), "step_time", &step1,
                                     "result"), 0);
    assert_close(step1, step0, 1e-12, 0);
    cJSON_Delete(root);
}

static void test_table_and_traces(void **state) {
    (void)state;
    char args[1024];
    snprintf(args, sizeof args, "--gpus 128 --tokens 4M --context 256K --policy static,naive --trace %s/step.json",
             dir);
    int rc = run(args);
    if (rc != 0) fail_msg("exit %d: %s", rc, cli_err);
    assert_non_null(strstr(cli_out, "tokens/s"));
    assert_non_null(strstr(cli_out, "1.00x"));
    // two policies: one trace each, named after the policy
    const char *names[] = {"step-static.json", "step-naive.json"};
    for (int i = 0; i < 2; i++) {
        char path[700];
        snprintf(path, sizeof path, "%s/%s", dir, names[i]);
        cJSON *t;
        if (json_read_file(path, &t) != 0) fail_msg("%s", bs_errmsg());
        assert_true(cJSON_IsArray(t) && cJSON_GetArraySize(t) > 64);
        cJSON_Delete(t);
    }
}

static void test_plan_file(void **state) {
    (void)state;
    // a plan made by the library, written as a file, simulated by the command
    const ModelConfig *m = model_find("llama-7b");
    const HardwareProfile *hw = hw_find("h100-sxm");
    CostModel cm;
    assert_int_equal(cost_derive(&cm, m, hw, 2, 1, 16, 8 << 10), 0);
    GlobalBatch b;
    assert_int_equal(batch_generate(&b, "byted", 2, 1 << 20, 128 << 10), 0);
    PlanConfig pc = {16, 8 << 10, 128 << 10, 1, 1, 0, 0};
    Plan p;
    if (policy_plan(&p, "balance", &b, &pc, &cm) != 0) fail_msg("%s", bs_errmsg());
    char path[700], args[1400];
    snprintf(path, sizeof path, "%s/plan.json", dir);
    if (plan_write_json(&p, path) != 0) fail_msg("%s", bs_errmsg());
    snprintf(args, sizeof args, "--plan %s --tp 2", path);
    int rc = run(args);
    if (rc != 0) fail_msg("exit %d: %s", rc, cli_err);
    char want[64];
    snprintf(want, sizeof want, "%d items on 16 HDP ranks (32 GPUs", p.n_items);
    if (!strstr(cli_out, want)) fail_msg("output lacks '%s': %s", want, cli_out);
    assert_non_null(strstr(cli_out, "step time"));
    // a cluster of the wrong size is refused with both sizes named
    snprintf(args, sizeof args, "--plan %s --tp 2 --gpus 64", path);
    expect(args, 1, "plan has 16 HDP ranks but the cluster has 32");
    plan_free(&p);
    batch_free(&b);
}

static void test_sweep_writes_csv_and_plots(void **state) {
    (void)state;
    char args[1024], path[700];
    snprintf(args, sizeof args, "--gpus 1024 --tokens 4M --policy static,balance --sweep contexts --out %s/sweep", dir);
    int rc = run(args);
    if (rc != 0) fail_msg("exit %d: %s", rc, cli_err);
    snprintf(path, sizeof path, "%s/sweep/custom-contexts.csv", dir);
    char csv[1 << 14];
    cli_slurp(path, csv, sizeof csv);
    assert_int_equal(count_lines(csv), 1 + 4 * 2);  // header + 4 contexts x 2 policies
    assert_non_null(strstr(csv, "context,policy,step_s,tokens_per_s"));
    assert_non_null(strstr(csv, "2097152,balance,"));
    snprintf(path, sizeof path, "%s/sweep/custom-contexts.png", dir);
    assert_true(is_png(path));
    snprintf(path, sizeof path, "%s/sweep/custom-contexts.svg", dir);
    char svg[256];
    cli_slurp(path, svg, sizeof svg);
    assert_non_null(strstr(svg, "<svg") ? svg : strstr(svg, "<?xml"));
    // without gnuplot the CSV is still written and the command says why it failed
    snprintf(args, sizeof args, "--gpus 1024 --tokens 4M --policy balance --sweep gpus --out %s/noplot", dir);
    rc = run_env("PATH=/nonexistent", args);
    assert_int_equal(rc, 1);
    assert_non_null(strstr(cli_err, "gnuplot is not installed"));
    snprintf(path, sizeof path, "%s/noplot/custom-gpus.csv", dir);
    assert_int_equal(access(path, R_OK), 0);
}

static void test_grid_writes_the_results_page(void **state) {
    (void)state;
    char args[1024], path[700];
    snprintf(args, sizeof args, "--grid --policy static,balance --no-plot --out %s/grid", dir);
    int rc = run(args);
    if (rc != 0) fail_msg("exit %d: %s", rc, cli_err);
    snprintf(path, sizeof path, "%s/grid/paper-grid.md", dir);
    static char md[1 << 16];
    cli_slurp(path, md, sizeof md);
    // the exact regenerating command, then one row per (model, dataset, context)
    char want[1200];
    snprintf(want, sizeof want, "simulate %s\n", args);
    assert_non_null(strstr(md, want));
    int rows = 0;
    for (const char *p = md; (p = strstr(p, "\n| byted |")) != NULL; p++) rows++;
    for (const char *p = md; (p = strstr(p, "\n| github |")) != NULL; p++) rows++;
    assert_int_equal(rows, 48);
    assert_null(strstr(md, "failed"));
    snprintf(path, sizeof path, "%s/grid/paper-grid.csv", dir);
    static char csv[1 << 16];
    cli_slurp(path, csv, sizeof csv);
    assert_int_equal(count_lines(csv), 1 + 48 * 2);
}

static void test_bad_flags(void **state) {
    (void)state;
    expect("--bogus", 2, "unknown flag '--bogus'");
    expect("--gpus", 2, "--gpus needs a value");
    expect("--gpus 0", 2, "--gpus: '0' must be at least 1");
    expect("--context 2Q", 2, "--context: '2Q' is not an integer");
    expect("--sweep hours", 2, "--sweep: 'hours' is not contexts or gpus");
    expect("--policy nope", 2, "unknown policy \"nope\"");
    expect("--scenario nope", 2, "--scenario list");
    expect("--grid --json", 2, "--json is for single runs");
    expect("--gpus 100 --tp 8", 1, "100 GPUs are not a multiple of tp x pp");
    expect("--model llama-99b", 1, "unknown model \"llama-99b\"");
    expect("--plan /nonexistent/plan.json", 1, "/nonexistent/plan.json");
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_help_and_list),
        cmocka_unit_test(test_json_results_of_a_small_cluster),
        cmocka_unit_test(test_table_and_traces),
        cmocka_unit_test(test_plan_file),
        cmocka_unit_test(test_sweep_writes_csv_and_plots),
        cmocka_unit_test(test_grid_writes_the_results_page),
        cmocka_unit_test(test_bad_flags),
    };
    return cmocka_run_group_tests(tests, setup, NULL);
}
