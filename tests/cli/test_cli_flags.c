// test_cli_flags.c: `plan` and `simulate` speak one vocabulary, and no command takes a flag twice. Each shared flag is run in both
// commands and its outcome compared with the spelling it must equal: --dist (a length distribution),
// --ranks / --gpus (HDP ranks / devices = ranks x tp x pp), --hardware NAME|FILE, --cost FILE. The
// retired names are refused in both with what replaced them. Every command reports errors one way
// (README.md "Exit codes and errors"): "bytescale <command>: error: " on one process and on every rank
// of an mpirun job, exit 2 for usage errors and 1 for failures; refusals name only the flags in play.
#include "cli/cli_run.h"

#include <cJSON.h>

#include "bytescale/cost.h"
#include "bytescale/hw.h"
#include "bytescale/model.h"

static char dir[512];

static int setup(void **state) {
    (void)state;
    snprintf(dir, sizeof dir, "%s", test_tmpdir("cli_flags"));
    return 0;
}

// A small, fast batch for every run here: 1M tokens cut at 64K, C = 8K.
#define BATCH "--tokens 1M --context 64K --capacity 8K"

// Drop the wall-clock fields (planning and simulation seconds): everything else must match exactly.
static void strip_timings(cJSON *j) {
    if (!j) return;
    if (cJSON_IsObject(j)) {
        cJSON_DeleteItemFromObjectCaseSensitive(j, "plan_seconds");
        cJSON_DeleteItemFromObjectCaseSensitive(j, "sim_seconds");
    }
    for (cJSON *c = j->child; c; c = c->next) strip_timings(c);
}

// Run `bytescale <args>`, require exit 0 and JSON on stdout; the JSON without its timings.
static cJSON *run_json(const char *args) {
    int rc = cli_run(dir, "", args);
    if (rc != 0) fail_msg("bytescale %s: exit %d: %s", args, rc, cli_err);
    cJSON *j = cJSON_Parse(cli_out);
    if (!j) fail_msg("bytescale %s: not JSON:\n%s", args, cli_out);
    strip_timings(j);
    return j;
}

static void expect_same_json(const char *args_a, const char *args_b) {
    cJSON *a = run_json(args_a), *b = run_json(args_b);
    if (!cJSON_Compare(a, b, 1)) {
        char *ta = cJSON_Print(a), *tb = cJSON_Print(b);
        fail_msg("bytescale %s\nand\nbytescale %s\ndiffer:\n%s\n---\n%s", args_a, args_b, ta, tb);
    }
    cJSON_Delete(a);
    cJSON_Delete(b);
}

// `bytescale plan <args> --out <dir>/<name>`; the plan file's text into buf.
static void plan_file(const char *args, const char *name, char *buf, size_t cap) {
    char path[700], cmd[4096];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    snprintf(cmd, sizeof cmd, "plan %s --out %s", args, path);
    int rc = cli_run(dir, "", cmd);
    if (rc != 0) fail_msg("bytescale %s: exit %d: %s", cmd, rc, cli_err);
    cli_slurp(path, buf, cap);
    if (!buf[0]) fail_msg("bytescale %s wrote no plan", cmd);
}

// The two plan commands write byte-identical plan files (same batch, ranks, cost model, schedule).
static void expect_same_plan(const char *args_a, const char *args_b) {
    static char a[1 << 20], b[1 << 20];
    plan_file(args_a, "a.json", a, sizeof a);
    plan_file(args_b, "b.json", b, sizeof b);
    if (strcmp(a, b) != 0) fail_msg("plan %s\nand\nplan %s\nwrite different plans", args_a, args_b);
}

static double json_number(const cJSON *j, const char *key) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(j, key);
    if (!cJSON_IsNumber(v)) fail_msg("no number \"%s\"", key);
    return v->valuedouble;
}

static void expect_usage_error(const char *args, const char *in_stderr) {
    int rc = cli_run(dir, "", args);
    if (rc != 2 || !strstr(cli_err, in_stderr))
        fail_msg("bytescale %s: exit %d (want 2), stderr: %s (want '%s')", args, rc, cli_err, in_stderr);
}

// --dist SPEC is a length distribution in both: the same spec, seed, budget and context give the
// same batch (sequence and token counts), and a different spec a different one.
static void test_dist_is_a_distribution_in_both(void **state) {
    (void)state;
    const char *specs[] = {"github", "uniform:1K:16K"};
    double seqs[2];
    for (int i = 0; i < 2; i++) {
        char args[512];
        snprintf(args, sizeof args, "plan --ranks 8 " BATCH " --seed 3 --dist %s --json", specs[i]);
        cJSON *p = run_json(args);
        const cJSON *batch = cJSON_GetObjectItemCaseSensitive(p, "batch");
        assert_string_equal(cJSON_GetObjectItemCaseSensitive(batch, "source")->valuestring, specs[i]);
        snprintf(args, sizeof args, "simulate --gpus 16 --tp 2 " BATCH " --seed 3 --dist %s --policy balance --json",
                 specs[i]);
        cJSON *s = run_json(args);
        const cJSON *set = cJSON_GetObjectItemCaseSensitive(s, "setup");
        assert_string_equal(cJSON_GetObjectItemCaseSensitive(set, "dataset")->valuestring, specs[i]);
        seqs[i] = json_number(batch, "sequences");
        assert_true(seqs[i] == json_number(set, "sequences"));
        assert_true(json_number(batch, "tokens") == 1 << 20 && json_number(set, "tokens") == 1 << 20);
        cJSON_Delete(p);
        cJSON_Delete(s);
    }
    assert_true(seqs[0] != seqs[1]);
}

// --ranks N is HDP ranks and --gpus N devices in both: N ranks = N x tp x pp GPUs.
static void test_ranks_and_gpus_mean_the_same_in_both(void **state) {
    (void)state;
    expect_same_plan("--ranks 4 --tp 2 " BATCH, "--gpus 8 --tp 2 " BATCH);
    expect_same_plan("--ranks 4 --tp 2 --pp 2 " BATCH, "--gpus 16 --tp 2 --pp 2 " BATCH);
    expect_same_json("simulate --ranks 4 --tp 2 " BATCH " --policy naive,balance --json",
                     "simulate --gpus 8 --tp 2 " BATCH " --policy naive,balance --json");
    cJSON *s = run_json("simulate --ranks 4 --tp 2 --pp 2 " BATCH " --policy balance --json");
    const cJSON *set = cJSON_GetObjectItemCaseSensitive(s, "setup");
    assert_true(json_number(set, "hdp_ranks") == 4 && json_number(set, "gpus") == 16);
    cJSON_Delete(s);
    // a plan of 4 ranks written by `plan --gpus 8 --tp 2` is simulated on --ranks 4 as on --gpus 8
    char buf[1 << 16], a[4096], b[4096];
    plan_file("--gpus 8 --tp 2 --hardware h100-sxm " BATCH, "ranks.json", buf, sizeof buf);
    snprintf(a, sizeof a, "simulate --plan %s/ranks.json --tp 2 --ranks 4 --json", dir);
    snprintf(b, sizeof b, "simulate --plan %s/ranks.json --tp 2 --gpus 8 --json", dir);
    expect_same_json(a, b);
    snprintf(a, sizeof a, "simulate --plan %s/ranks.json --tp 2 --ranks 8", dir);
    int rc = cli_run(dir, "", a);
    if (rc != 1 || !strstr(cli_err, "plan has 4 HDP ranks but the cluster has 8"))
        fail_msg("%s: exit %d: %s", a, rc, cli_err);
    // both at once is refused in both commands
    expect_usage_error("plan --ranks 4 --gpus 8", "give --ranks (HDP ranks) or --gpus");
    expect_usage_error("simulate --ranks 4 --gpus 8", "give --ranks (HDP ranks) or --gpus");
}

// --hardware takes a built-in name or a profile file in both: a file holding the h800-sxm profile
// gives what the name gives; a file with another profile changes the outcome.
static void test_hardware_name_or_file_in_both(void **state) {
    (void)state;
    char same[700], slow[700], bare[700], a[4096], b[4096];
    snprintf(same, sizeof same, "%s/h800.json", dir);
    assert_int_equal(hw_save_file(hw_find("h800-sxm"), same), 0);
    HardwareProfile lab = *hw_find("h800-sxm");
    snprintf(lab.name, sizeof lab.name, "lab");
    lab.peak_flops /= 2;  // half the compute: every step takes longer
    snprintf(slow, sizeof slow, "%s/lab.json", dir);
    assert_int_equal(hw_save_file(&lab, slow), 0);
    snprintf(bare, sizeof bare, "%s/lab.profile", dir);  // a '/' alone makes it a file
    assert_int_equal(hw_save_file(&lab, bare), 0);

    snprintf(a, sizeof a, "--ranks 8 " BATCH " --hardware %s", same);
    expect_same_plan(a, "--ranks 8 " BATCH " --hardware h800-sxm");
    snprintf(a, sizeof a, "simulate --gpus 16 --tp 2 " BATCH " --policy balance --json --hardware %s", same);
    expect_same_json(a, "simulate --gpus 16 --tp 2 " BATCH " --policy balance --json --hardware h800-sxm");

    snprintf(a, sizeof a, "plan --ranks 8 " BATCH " --json --hardware %s", slow);
    snprintf(b, sizeof b, "plan --ranks 8 " BATCH " --json --hardware %s", bare);
    expect_same_json(a, b);
    cJSON *p_lab = run_json(a), *p_h800 = run_json("plan --ranks 8 " BATCH " --json --hardware h800-sxm");
    double m_lab = json_number(cJSON_GetArrayItem(cJSON_GetObjectItem(p_lab, "plans"), 0), "makespan");
    double m_h800 = json_number(cJSON_GetArrayItem(cJSON_GetObjectItem(p_h800, "plans"), 0), "makespan");
    assert_true(m_lab > 1.5 * m_h800);
    cJSON_Delete(p_lab);
    cJSON_Delete(p_h800);
    snprintf(a, sizeof a, "simulate --gpus 16 --tp 2 " BATCH " --policy balance --json --hardware %s", slow);
    cJSON *s = run_json(a);
    assert_string_equal(cJSON_GetObjectItem(cJSON_GetObjectItem(s, "setup"), "hardware")->valuestring, "lab");
    cJSON_Delete(s);
    // a bare word is a profile name in both, and the error says how to name a file
    int rc = cli_run(dir, "", "plan --hardware lab.profile");
    if (rc != 1 || !strstr(cli_err, "./lab.profile")) fail_msg("plan: exit %d: %s", rc, cli_err);
    rc = cli_run(dir, "", "simulate --hardware lab.profile");
    if (rc != 1 || !strstr(cli_err, "./lab.profile")) fail_msg("simulate: exit %d: %s", rc, cli_err);
}

// --cost FILE reads cost-model coefficients in both: the coefficients the flags would derive, saved
// and read back, change nothing.
static void test_cost_file_in_both(void **state) {
    (void)state;
    char cost[700], a[4096];
    snprintf(cost, sizeof cost, "%s/cost.json", dir);
    CostModel cm;
    assert_int_equal(cost_derive(&cm, model_find("llama-7b"), hw_find("h100-sxm"), 2, 1, 8, 8 << 10), 0);
    assert_int_equal(cost_save(&cm, cost), 0);
    snprintf(a, sizeof a, "--ranks 8 " BATCH " --cost %s", cost);
    expect_same_plan(a, "--ranks 8 --tp 2 --hardware h100-sxm " BATCH);
    snprintf(a, sizeof a, "--gpus 16 --tp 2 " BATCH " --cost %s", cost);  // --tp counts the ranks here
    expect_same_plan(a, "--ranks 8 --tp 2 --hardware h100-sxm " BATCH);
    // --hardware names the device on the --cost side too: a cost file alone leaves the device's memory
    // unknown (docs/simulator.md, "Memory"), and the JSON would say so
    snprintf(a, sizeof a,
             "simulate --gpus 16 --tp 2 " BATCH " --policy static,balance --json --cost %s --hardware h100-sxm", cost);
    expect_same_json(a, "simulate --gpus 16 --tp 2 " BATCH " --policy static,balance --json");
}

// The old names are refused (exit 2, as any bad flag) in both commands, naming what replaced them.
static void test_retired_names_say_what_replaced_them(void **state) {
    (void)state;
    const struct {
        const char *flag, *replacement;
    } old[] = {
        {"--dataset github", "--dist SPEC"},
        {"--dataset lengths.txt", "--lengths FILE"},
        {"--dataset=github", "--dataset is gone"},
        {"--hardware-file hw.json", "--hardware FILE"},
        {"--cost-file cost.json", "--cost FILE"},
    };
    const char *commands[] = {"plan", "simulate"};
    for (int c = 0; c < 2; c++)
        for (size_t i = 0; i < sizeof old / sizeof old[0]; i++) {
            char args[256];
            snprintf(args, sizeof args, "%s %s", commands[c], old[i].flag);
            expect_usage_error(args, old[i].replacement);
            if (strstr(cli_err, "unknown flag")) fail_msg("bytescale %s: %s", args, cli_err);
        }
    // a near miss that never was a flag stays an unknown flag
    expect_usage_error("plan --datasets x", "unknown flag '--datasets'");
    expect_usage_error("simulate --datasets x", "unknown flag '--datasets'");
}

// A flag given twice is refused in every command (it was last-wins, silently): by its name, in
// either spelling (--x v, --x=v), and in the commands that read flags with getopt by an abbreviation
// too. prepare's --input is the one flag that may repeat.
static void test_repeated_flags_are_refused_everywhere(void **state) {
    (void)state;
    const struct {
        const char *args, *says;
    } twice[] = {
        {"plan --hardware h800-sxm --hardware cpu " BATCH, "error: --hardware is given twice: give it once"},
        {"plan --ranks 8 --ranks=16 " BATCH, "error: --ranks is given twice"},
        {"simulate --hardware h800-sxm --hardware cpu", "error: --hardware is given twice"},
        {"simulate --seed 1 --seed 2", "error: --seed is given twice"},
        {"train --steps 1 --steps 2", "error: --steps is given twice"},
        {"profile --reps 1 --reps=2", "error: --reps is given twice"},
        {"serve --cache 1K --cache 2K", "error: --cache is given twice"},
        {"prepare --input a --out x --out y", "error: --out is given twice"},
    };
    for (size_t i = 0; i < sizeof twice / sizeof twice[0]; i++) expect_usage_error(twice[i].args, twice[i].says);
    // an abbreviation and the whole name are the same flag
    expect_usage_error("train --step 1 --steps 2", "--steps is given twice ('1', then '2')");
    expect_usage_error("serve --ca 1K --cache 2K", "--cache is given twice");
    // flags that merely share a prefix are different flags; several --input are a list
    int rc = cli_run(dir, "", "simulate --seed 1 --seeds 1 --scenario case-study --json");
    if (rc != 0) fail_msg("simulate --seed --seeds: exit %d: %s", rc, cli_err);
    rc = cli_run(dir, "", "prepare --input /nonexistent/a --input /nonexistent/b --out x");
    if (rc != 1 || !strstr(cli_err, "/nonexistent/a")) fail_msg("prepare with two --input: exit %d: %s", rc, cli_err);
}

// Every line of stderr that says "error: " says it in the one form: "bytescale <command>: error: ",
// then "rank R of N: " where a rank of an mpirun job found it; usage errors (exit 2) end with the help line, failures do not.
static void expect_error(int np, const char *args, int code, const char *in_stderr) {
    char command[32], prefix[64], help[96];
    sscanf(args, "%31s", command);
    snprintf(prefix, sizeof prefix, "bytescale %s: error: ", command);
    snprintf(help, sizeof help, "(bytescale %s --help lists the flags)", command);
    int rc = cli_run_np(dir, np, "", args);
    if (rc != code || !strstr(cli_err, prefix) || !strstr(cli_err, in_stderr) || !strstr(cli_err, help) != (code == 1))
        fail_msg("np %d, bytescale %s: exit %d (want %d), stderr: %s (want '%s', '%s'%s)", np, args, rc, code, cli_err,
                 prefix, in_stderr, code == 2 ? " and the help line" : "");
    for (char *line = cli_err; line && *line; line = strchr(line, '\n') ? strchr(line, '\n') + 1 : NULL) {
        char *e = strstr(line, "error: "), *eol = strchr(line, '\n');
        if (e && (!eol || e < eol) && strncmp(line, prefix, strlen(prefix)) != 0)
            fail_msg("np %d, bytescale %s: a line not in the one form: %s", np, args, line);
    }
}

static void test_one_error_form_and_exit_codes(void **state) {
    (void)state;
    const char *commands[] = {"plan", "simulate", "prepare", "train", "profile", "serve"};
    for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++) {
        char args[128];
        snprintf(args, sizeof args, "%s --bogus 1", commands[i]);
        expect_error(0, args, 2, "unknown flag '--bogus'");
    }
    expect_error(0, "plan --lengths /nonexistent/l.txt", 1, "/nonexistent/l.txt");
    expect_error(0, "simulate --plan /nonexistent/p.json", 1, "/nonexistent/p.json");
    expect_error(0, "prepare --input /nonexistent/in --out x", 1, "/nonexistent/in");
    expect_error(0, "train --data /nonexistent/d --steps 1", 1, "/nonexistent/d");
    expect_error(0, "train --tp 2", 2, "--tp 2 needs a multiple of 2 processes, and this job has 1");
    // under mpirun, 2 processes: the same form, the rank named once the ranks exist, the same codes
    // (mpirun returns them)
    expect_error(2, "train --bogus 1", 2, "unknown flag '--bogus'");
    expect_error(2, "train --tp 3 --data /nonexistent/d", 2, " of 2: --tp 3 needs a multiple of 3 processes");
    expect_error(2, "train --data /nonexistent/d --steps 1", 1, " of 2: no prepared dataset in /nonexistent/d");
}

// A refusal of flags that do not go together names the flags given, not the ones left at defaults.
static void test_refusals_name_only_the_flags_in_play(void **state) {
    (void)state;
    const struct {
        const char *args, *want, *not_named;
    } cases[] = {
        {"simulate --grid --plan x.json", "--grid and --plan exclude each other", "--sweep"},
        {"simulate --sweep gpus --plan x.json", "--sweep and --plan exclude each other", "--grid"},
        {"plan --gpus 100 --tp 8", "--gpus 100 is not a multiple of --tp 8", "pp"},
        {"plan --gpus 100 --tp 1 --pp 3", "--gpus 100 is not a multiple of --pp 3", "tp"},
        {"train --tp 2", "--tp 2 needs", "--pp"},
        {"train --pp 2", "--pp 2 needs", "--tp"},
        {"train --capacity 1024", "the context 4096 (the default) exceeds --capacity 1024", "--context"},
        {"train --offload-dir /tmp", "--offload-dir is used only by --offload-tier file", "--pp"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        expect_usage_error(cases[i].args, cases[i].want);
        const char *msg = strstr(cli_err, "error: ");
        if (strstr(msg, cases[i].not_named))
            fail_msg("bytescale %s names %s, which is not in play: %s", cases[i].args, cases[i].not_named, cli_err);
    }
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_dist_is_a_distribution_in_both),
        cmocka_unit_test(test_ranks_and_gpus_mean_the_same_in_both),
        cmocka_unit_test(test_hardware_name_or_file_in_both),
        cmocka_unit_test(test_cost_file_in_both),
        cmocka_unit_test(test_retired_names_say_what_replaced_them),
        cmocka_unit_test(test_repeated_flags_are_refused_everywhere),
        cmocka_unit_test(test_one_error_form_and_exit_codes),
        cmocka_unit_test(test_refusals_name_only_the_flags_in_play),
    };
    return cmocka_run_group_tests(tests, setup, NULL);
}
