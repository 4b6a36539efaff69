// test_cli_plan.c: `bytescale plan` as a user runs it: the built binary (BS_BINARY), exit codes,
// the plan file it writes (loads and validates), --json, and a clear message for every bad flag or
// file.
#include "test_util.h"

#include <sys/wait.h>

#include <cJSON.h>

#include "bytescale/cost.h"
#include "bytescale/error.h"
#include "bytescale/fileio.h"
#include "bytescale/hw.h"
#include "bytescale/model.h"
#include "bytescale/plan.h"
#include "bytescale/policy.h"

static char out[1 << 16];

// Run `$BS_BINARY plan <args>` with stderr merged into stdout; returns the exit code.
static int run(const char *args) {
    const char *bin = getenv("BS_BINARY");
    if (!bin) fail_msg("BS_BINARY is not set (run through ctest)");
    char cmd[2048];
    snprintf(cmd, sizeof cmd, "BS_QUIET=1 '%s' plan %s 2>&1", bin, args);
    FILE *f = popen(cmd, "r");
    assert_non_null(f);
    size_t n = fread(out, 1, sizeof out - 1, f);
    out[n] = '\0';
    int status = pclose(f);
    return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

static void expect_fail(const char *args, const char *needle) {
    int rc = run(args);
    if (rc == 0) fail_msg("plan %s: expected a failure, got exit 0:\n%s", args, out);
    if (!strstr(out, needle)) fail_msg("plan %s: expected \"%s\" in:\n%s", args, needle, out);
}

static void test_help(void **state) {
    (void)state;
    assert_int_equal(run("--help"), 0);
    assert_non_null(strstr(out, "usage: bytescale plan"));
    const char *flags[] = {"--ranks", "--gpus", "--capacity", "--context", "--model", "--hardware NAME|FILE",
                           "--cost FILE", "--tp", "--pp", "--policy", "--lengths FILE", "--dist SPEC", "--tokens",
                           "--seed", "--offload", "--no-offload", "--out", "--json", "--help"};
    for (size_t i = 0; i < sizeof flags / sizeof flags[0]; i++)
        if (!strstr(out, flags[i])) fail_msg("--help does not mention %s", flags[i]);
    const char *retired[] = {"--dataset", "--hardware-file", "--cost-file"};
    for (size_t i = 0; i < sizeof retired / sizeof retired[0]; i++)
        if (strstr(out, retired[i])) fail_msg("--help still mentions %s", retired[i]);
    assert_int_equal(run("-h"), 0);
}

// The summary names the kinds of items a plan has: flexsp's all-to-all groups are not called rings,
// and the kinds' counts add up to the items
static void test_summary_names_item_kinds(void **state) {
    (void)state;
    const char *cases[][3] = {
        {"flexsp", "all-to-all", NULL}, {"blocks", "blocks", "rings"}, {"balance", "rings", "all-to-all"}};
    for (int c = 0; c < 3; c++) {
        char args[256];
        snprintf(args, sizeof args, "--policy %s --dist github --context 256K --tokens 4M --ranks 64", cases[c][0]);
        assert_int_equal(run(args), 0);
        const char *items = strstr(out, "items: ");
        assert_non_null(items);
        char line[256];
        snprintf(line, sizeof line, "%.*s", (int)strcspn(items, "\n"), items);
        if (!strstr(line, cases[c][1]) || (cases[c][2] && strstr(line, cases[c][2])))
            fail_msg("%s: %s", cases[c][0], line);
        long total = strtol(line + 7, NULL, 10), sum = 0;
        for (const char *q = strchr(line, '('); q && *q; q++)
            if (*q >= '0' && *q <= '9' && (q[-1] == '(' || q[-1] == ' ')) sum += strtol(q, (char **)&q, 10);
        if (sum != total) fail_msg("%s: the kinds add up to %ld of %ld items: %s", cases[c][0], sum, total, line);
        if (strstr(out, "rings and long items")) fail_msg("%s: the old wording: %s", cases[c][0], out);
    }
}

static void test_writes_a_valid_plan(void **state) {
    (void)state;
    const char *dir = test_tmpdir("cli_plan");
    char args[1024], path[600];
    snprintf(path, sizeof path, "%s/plan.json", dir);
    snprintf(args, sizeof args, "--ranks 64 --tokens 4M --context 512K --dist github --seed 5 --out %s", path);
    int rc = run(args);
    if (rc != 0) fail_msg("exit %d:\n%s", rc, out);
    assert_non_null(strstr(out, "makespan / bound"));
    assert_non_null(strstr(out, "items by ring size"));
    // the file loads and validates against the cost model the command derived
    CostModel cm;
    assert_int_equal(cost_derive(&cm, model_find("llama-7b"), hw_find("h800-sxm"), 2, 1, 64, 8192), 0);
    Plan p;
    if (plan_read_json_cm(&p, path, &cm) != 0) fail_msg("%s", bs_errmsg());
    assert_int_equal(p.n_ranks, 64);
    assert_int_equal(p.capacity, 8192);
    assert_string_equal(p.policy, "elastic");  // the default
    assert_int_equal(p.batch.n_tokens, 4 << 20);
    assert_true(p.makespan >= p.lower_bound);
    plan_free(&p);
}

// --block-size reaches the block peer: every block of the plan holds at most B tokens (the default
// here, ceil(micro-batch / (8 x 8 ranks)), is larger), and a block size of 0 is refused.
static void test_block_size(void **state) {
    (void)state;
    const char *dir = test_tmpdir("cli_plan_blocks");
    char args[1024], path[600];
    snprintf(path, sizeof path, "%s/plan.json", dir);
    snprintf(args, sizeof args, "--ranks 16 --capacity 2K --tokens 256K --context 16K --policy blocks --block-size 100 "
                                "--out %s",
             path);
    int rc = run(args);
    if (rc != 0) fail_msg("exit %d:\n%s", rc, out);
    Plan p;
    if (plan_read_json(&p, path) != 0) fail_msg("%s", bs_errmsg());
    int64_t longest = 0;
    for (int32_t j = 0; j < p.n_segs; j++) longest = p.segs[j].len > longest ? p.segs[j].len : longest;
    assert_int_equal(longest, 100);
    for (int32_t k = 0; k < p.n_items; k++) assert_int_equal(plan_item_kind(&p, k), ITEM_BLOCKS);
    plan_free(&p);
    assert_int_not_equal(run("--policy blocks --block-size 0"), 0);
    assert_non_null(strstr(out, "--block-size"));
}

static void test_all_policies_json(void **state) {
    (void)state;
    int rc = run("--ranks 32 --tokens 1M --context 256K --policy all --json --no-offload");
    if (rc != 0) fail_msg("exit %d:\n%s", rc, out);
    cJSON *root = cJSON_Parse(out);
    if (!root) fail_msg("not JSON:\n%s", out);
    const cJSON *plans = cJSON_GetObjectItem(root, "plans");
    const char *names[] = {"static", "naive", "naive-eq3min", "balance", "elastic", "megatron-hcp", "wlb", "flexsp",
                           "blocks", "blocks-all"};
    assert_int_equal(cJSON_GetArraySize(plans), 10);
    for (int i = 0; i < 10; i++) {
        const cJSON *p = cJSON_GetArrayItem(plans, i);
        assert_string_equal(cJSON_GetObjectItem(p, "policy")->valuestring, names[i]);
        double ratio = cJSON_GetObjectItem(p, "ratio")->valuedouble;
        // (flexsp's all-to-all groups and blocks' block items are not bounded by the ring-timed bound,
        // docs/peers.md)
        assert_true(ratio >= 1.0 || !strcmp(names[i], "flexsp") || !strncmp(names[i], "blocks", 6));
        assert_true(cJSON_GetObjectItem(p, "offload_items")->valueint == 0);  // --no-offload
    }
    assert_int_equal((int64_t)cJSON_GetObjectItem(cJSON_GetObjectItem(root, "batch"), "tokens")->valuedouble, 1 << 20);
    cJSON_Delete(root);
}

// The vocabulary (policy_expand): `all` combines with names, each policy once; the help lists the table.
static void test_policy_lists(void **state) {
    (void)state;
    int rc = run("--ranks 32 --tokens 1M --context 256K --policy all,megatron-hcp,balance --json --no-offload");
    if (rc != 0) fail_msg("exit %d:\n%s", rc, out);
    cJSON *root = cJSON_Parse(out);
    assert_non_null(root);
    assert_int_equal(cJSON_GetArraySize(cJSON_GetObjectItem(root, "plans")), policy_count());
    cJSON_Delete(root);
    rc = run("--ranks 32 --tokens 1M --context 256K --policy peers,elastic --no-offload");
    if (rc != 0) fail_msg("exit %d:\n%s", rc, out);
    for (int i = 0; i < policy_count(); i++)  // a row per named policy, and none other
        assert_true((strstr(out, policy_at(i)->name) != NULL) ==
                    (policy_at(i)->peer || !strcmp(policy_at(i)->name, "elastic")));
    char own[256], peers[256];
    assert_int_equal(run("--help"), 0);
    assert_non_null(strstr(out, policy_names(own, sizeof own, POLICY_OWN)));
    assert_non_null(strstr(out, policy_names(peers, sizeof peers, POLICY_PEERS)));
}

static void test_lengths_and_cost_file(void **state) {
    (void)state;
    const char *dir = test_tmpdir("cli_plan_files");
    char lens[600], cost[600], args[2048];
    snprintf(lens, sizeof lens, "%s/lengths.txt", dir);
    snprintf(cost, sizeof cost, "%s/cost.json", dir);
    const char *text = "# lengths\n100\n20000\n3000\n\n8192\n";
    assert_int_equal(file_write_atomic(lens, text, strlen(text)), 0);
    CostModel cm;
    assert_int_equal(cost_derive(&cm, model_find("llama-13b"), hw_find("h100-sxm"), 8, 1, 8, 4096), 0);
    assert_int_equal(cost_save(&cm, cost), 0);
    snprintf(args, sizeof args, "--ranks 8 --capacity 4K --lengths %s --cost %s --policy naive", lens, cost);
    int rc = run(args);
    if (rc != 0) fail_msg("exit %d:\n%s", rc, out);
    assert_non_null(strstr(out, "31292 tokens in 4 sequences"));
    assert_non_null(strstr(out, cost));
}

static void test_bad_flags_and_files(void **state) {
    (void)state;
    const char *dir = test_tmpdir("cli_plan_bad");
    char bad_lens[600], bad_cost[600], args[2048];
    snprintf(bad_lens, sizeof bad_lens, "%s/lengths.txt", dir);
    snprintf(bad_cost, sizeof bad_cost, "%s/cost.json", dir);
    const char *lens = "100\nseven\n";
    assert_int_equal(file_write_atomic(bad_lens, lens, strlen(lens)), 0);
    const char *cost = "{\"version\": 1, \"n_layers\": 4}\n";
    assert_int_equal(file_write_atomic(bad_cost, cost, strlen(cost)), 0);

    expect_fail("--ranks abc", "--ranks: 'abc' is not an integer");
    expect_fail("--ranks 0", "--ranks: 0 is out of range");
    expect_fail("--capacity -5", "--capacity: -5 is out of range");
    expect_fail("--bogus", "unknown flag '--bogus'");
    expect_fail("--ranks", "--ranks needs a value");
    expect_fail("stray", "unexpected argument 'stray'");
    expect_fail("--policy fancy", "unknown policy 'fancy'");
    expect_fail("--model gpt-9", "gpt-9");
    expect_fail("--hardware abacus", "abacus");
    expect_fail("--hardware /nonexistent/hw.json", "/nonexistent/hw.json");
    expect_fail("--dist zipf:3", "zipf");
    expect_fail("--lengths /nonexistent/lengths.txt", "/nonexistent/lengths.txt");
    snprintf(args, sizeof args, "--lengths %s", bad_lens);
    expect_fail(args, "lengths.txt:2");
    snprintf(args, sizeof args, "--cost %s", bad_cost);
    expect_fail(args, "cost.json");
    expect_fail("--policy all --out x.json", "--out writes one plan: 'all' names 10 policies, pick one");
    expect_fail("--policy balance,bogus", "--policy: unknown policy 'bogus' in 'balance,bogus'");
    // --gpus counts whole TP x PP groups, and says so when it cannot
    assert_int_equal(run("--gpus 100 --tp 8"), 2);
    assert_non_null(strstr(out, "--gpus 100 is not a multiple of --tp 8"));
    expect_fail("--gpus 12 --tp 2 --pp 4", "--gpus 12 is not a multiple of --tp 2 x --pp 4 = 8");
    assert_int_equal(run("--ranks 4 --gpus 8"), 2);
    assert_non_null(strstr(out, "give --ranks (HDP ranks) or --gpus (devices = ranks x tp x pp), not both"));
    expect_fail("--ranks 8 --tokens 64K --out /nonexistent/dir/plan.json", "/nonexistent/dir/plan.json");
    // a sequence that cannot fit even on all ranks
    expect_fail("--ranks 4 --tokens 1M --context 1M --dist fixed:1M --no-offload",
                "a sequence of 1048576 tokens needs 128 ranks of capacity 8192; only 4 given");
    expect_fail("--ranks 4 --tokens 1M --context 1M --dist fixed:1M --policy static",
                "a sequence of 1048576 tokens needs 128 ranks of capacity 8192; only 4 given");
}

// Issue 8: extreme numbers in flags and lengths files are refused at once with the limit named,
// never an endless planning run, an absurd allocation or a wrapped-around sum.
static void test_extreme_numbers(void **state) {
    (void)state;
    const char *dir = test_tmpdir("cli_plan_extreme");
    char path[600], args[2048];
    expect_fail("--ranks 2147483648", "--ranks: 2147483648 is out of range [1, 1048576]");
    // --gpus up to 2^40 (2^20 ranks x tp 1024 x pp 1024), and never more ranks than --ranks allows
    expect_fail("--gpus 1099511627777", "--gpus: 1099511627777 is out of range [1, 1099511627776]");
    expect_fail("--gpus 9223372036854775807", "--gpus: 9223372036854775807 is out of range");
    expect_fail("--gpus 0", "--gpus: 0 is out of range");
    expect_fail("--gpus 2097152 --tp 1", "--gpus 2097152 / (tp x pp = 1) = 2097152 HDP ranks, more than 1048576");
    // 2^40 GPUs at tp x pp = 2^20 are 2^20 ranks: past the flag checks, refused by the cost model
    expect_fail("--gpus 1099511627776 --tp 1024 --pp 1024", "tp 1024 must divide the 32 query heads");
    expect_fail("--tokens 9223372036854775807", "--tokens: 9223372036854775807 is out of range");
    expect_fail("--capacity 9223372036854775807", "--capacity: 9223372036854775807 is out of range [1, 16777216]");
    // a context of 1 token cuts 32M tokens into 32M sequences: refused, not planned for minutes
    expect_fail("--context 1", "a batch holds at most 16777216");
    expect_fail("--tokens 1099511627776", "a batch holds at most 16777216");
    // one length of INT64_MAX: the cut at the 2M context would make 2^42 pieces
    snprintf(path, sizeof path, "%s/huge.txt", dir);
    const char *huge = "9223372036854775807\n";
    assert_int_equal(file_write_atomic(path, huge, strlen(huge)), 0);
    snprintf(args, sizeof args, "--lengths %s", path);
    expect_fail(args, "a batch holds at most 1099511627776");
    // two lengths of 2^62 overflow the sum; and 2^53 in JSON (the largest exact integer)
    const char *two = "4611686018427387904\n4611686018427387904\n";
    assert_int_equal(file_write_atomic(path, two, strlen(two)), 0);
    expect_fail(args, "huge.txt:1");
    snprintf(path, sizeof path, "%s/huge.json", dir);
    const char *js = "[9007199254740992, 9007199254740992]";
    assert_int_equal(file_write_atomic(path, js, strlen(js)), 0);
    snprintf(args, sizeof args, "--lengths %s --context 1099511627776 --capacity 16M --ranks 1048576", path);
    expect_fail(args, "a batch holds at most 1099511627776");
}

// Flags the others make pointless are refused, naming both.
static void test_ignored_flags_are_errors(void **state) {
    (void)state;
    const char *dir = test_tmpdir("cli_plan_ignored");
    char lens[600], cost[600], args[2048];
    snprintf(lens, sizeof lens, "%s/lengths.txt", dir);
    snprintf(cost, sizeof cost, "%s/cost.json", dir);
    assert_int_equal(file_write_atomic(lens, "100\n200\n", 8), 0);
    CostModel cm;
    assert_int_equal(cost_derive(&cm, model_find("llama-7b"), hw_find("h100-sxm"), 2, 1, 8, 4096), 0);
    assert_int_equal(cost_save(&cm, cost), 0);
    const char *with_lengths[] = {"--tokens 1M", "--seed 7", "--dist github", "--dist byted"};
    for (size_t i = 0; i < 4; i++) {
        snprintf(args, sizeof args, "--ranks 8 --lengths %s %s", lens, with_lengths[i]);
        expect_fail(args, "has no effect with --lengths");
    }
    const char *with_cost[] = {"--model llama-13b", "--hardware h100-sxm", "--hardware hw.json", "--tp 4"};
    for (size_t i = 0; i < 4; i++) {
        snprintf(args, sizeof args, "--ranks 8 --lengths %s --cost %s %s", lens, cost, with_cost[i]);
        expect_fail(args, "has no effect with --cost");
    }
    // with --gpus, --tp is no longer pointless: it turns the GPUs into ranks (8 / 2 = 4)
    snprintf(args, sizeof args, "--gpus 8 --tp 2 --lengths %s --cost %s", lens, cost);
    if (run(args) != 0) fail_msg("plan %s:\n%s", args, out);
    assert_non_null(strstr(out, "policy elastic: 4 ranks"));
    expect_fail("--policy static --offload", "--offload has no effect with --policy static");
}

// Not regular files: a directory is "is a directory" (not "out of memory allocating
// 9223372036854775808 bytes"), and a pipe on /dev/stdin is read as a stream.
static void test_directories_and_pipes(void **state) {
    (void)state;
    const char *dir = test_tmpdir("cli_plan_streams");
    char args[2048], lens[600];
    snprintf(args, sizeof args, "--lengths %s", dir);
    expect_fail(args, "is a directory");
    snprintf(args, sizeof args, "--cost %s", dir);
    expect_fail(args, "is a directory");
    snprintf(args, sizeof args, "--hardware %s", dir);
    expect_fail(args, "is a directory");
    snprintf(lens, sizeof lens, "%s/lengths.txt", dir);
    assert_int_equal(file_write_atomic(lens, "100\n2500\n700\n", 13), 0);
    snprintf(args, sizeof args, "--ranks 4 --capacity 1K --lengths /dev/stdin < '%s'", lens);
    assert_int_equal(run(args), 0);  // a regular file behind /dev/stdin
    const char *bin = getenv("BS_BINARY");
    char cmd[4096];
    snprintf(cmd, sizeof cmd, "cat '%s' | '%s' plan --ranks 4 --capacity 1K --lengths /dev/stdin 2>&1", lens, bin);
    FILE *f = popen(cmd, "r");
    assert_non_null(f);
    size_t n = fread(out, 1, sizeof out - 1, f);
    out[n] = '\0';
    int st = pclose(f);
    if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) fail_msg("--lengths /dev/stdin from a pipe:\n%s", out);
    assert_non_null(strstr(out, "3300 tokens in 3 sequences"));
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_help),
        cmocka_unit_test(test_writes_a_valid_plan),
        cmocka_unit_test(test_all_policies_json),
        cmocka_unit_test(test_policy_lists),
        cmocka_unit_test(test_block_size),
        cmocka_unit_test(test_lengths_and_cost_file),
        cmocka_unit_test(test_bad_flags_and_files),
        cmocka_unit_test(test_summary_names_item_kinds),
        cmocka_unit_test(test_extreme_numbers),
        cmocka_unit_test(test_ignored_flags_are_errors),
        cmocka_unit_test(test_directories_and_pipes),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
