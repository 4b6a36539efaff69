// test_plan_io.c: plan files are streamed both ways (plan_io.c). What streaming must not change:
// the writer's output parses as ordinary JSON (checked with cJSON, an independent parser) and holds
// the plan's every number; the reader takes members in any order and any layout, skips unknown
// members however deep, refuses duplicates, reads from a FIFO, locates syntax errors, and a plan
// large enough to cross many read pieces comes back whole. The writer never leaves a broken file.
#include "test_util.h"

#include <math.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cJSON.h>

#include "bytescale/error.h"
#include "bytescale/fileio.h"
#include "bytescale/hw.h"
#include "bytescale/json.h"
#include "bytescale/model.h"
#include "bytescale/plan.h"
#include "bytescale/policy.h"

static void make_plan(Plan *p, CostModel *cm, const char *dist, int64_t tokens, int ranks) {
    assert_int_equal(cost_derive(cm, model_find("llama-7b"), hw_find("h800-sxm"), 2, 1, ranks, 8192), 0);
    GlobalBatch b;
    assert_int_equal(batch_generate(&b, dist, 5, tokens, 1 << 20), 0);
    PlanConfig cfg = {.n_ranks = ranks, .capacity = 8192, .context = 1 << 20, .pp = 1, .offload = 1};
    if (policy_plan(p, "balance", &b, &cfg, cm) != 0) fail_msg("%s", bs_errmsg());
    batch_free(&b);
}

// Two plans hold the same batch, items, segments, ranks and estimates.
static void assert_same_plan(const Plan *a, const Plan *b) {
    assert_string_equal(a->policy, b->policy);
    assert_int_equal(a->n_ranks, b->n_ranks);
    assert_int_equal(a->pp, b->pp);
    assert_int_equal(a->capacity, b->capacity);
    assert_int_equal(a->batch.n, b->batch.n);
    assert_int_equal(a->batch.n_tokens, b->batch.n_tokens);
    for (int64_t i = 0; i < a->batch.n; i++) {
        assert_int_equal(a->batch.seqs[i].id, b->batch.seqs[i].id);
        assert_int_equal(a->batch.seqs[i].len, b->batch.seqs[i].len);
        assert_int_equal(a->batch.seqs[i].src, b->batch.seqs[i].src);
    }
    assert_int_equal(a->n_items, b->n_items);
    assert_int_equal(a->n_segs, b->n_segs);
    assert_int_equal(a->n_refs, b->n_refs);
    for (int32_t i = 0; i < a->n_segs; i++) {
        assert_int_equal(a->segs[i].seq, b->segs[i].seq);
        assert_int_equal(a->segs[i].start, b->segs[i].start);
        assert_int_equal(a->segs[i].len, b->segs[i].len);
    }
    assert_memory_equal(a->ranks, b->ranks, (size_t)a->n_refs * sizeof(int32_t));
    for (int32_t k = 0; k < a->n_items; k++) {
        assert_true(a->items[k].offload == b->items[k].offload);
        assert_true(a->items[k].est_time == b->items[k].est_time);
    }
    assert_true(a->makespan == b->makespan);
}

// The writer's file, parsed by cJSON, says exactly what the plan holds.
static void test_writer_output_is_plain_json(void **state) {
    (void)state;
    const char *dir = test_tmpdir("plan_io_plain");
    char path[600];
    snprintf(path, sizeof path, "%s/p.json", dir);
    Plan p;
    CostModel cm;
    make_plan(&p, &cm, "byted", 4 << 20, 64);
    snprintf(p.policy, sizeof p.policy, "we\"ird\\name\t1");  // needs escaping
    assert_int_equal(plan_write_json(&p, path), 0);
    cJSON *root;
    if (json_read_file(path, &root) != 0) fail_msg("%s", bs_errmsg());
    assert_string_equal(cJSON_GetObjectItem(root, "policy")->valuestring, p.policy);
    assert_int_equal(cJSON_GetObjectItem(root, "n_ranks")->valueint, p.n_ranks);
    assert_true(cJSON_GetObjectItem(root, "makespan")->valuedouble == p.makespan);
    const cJSON *seqs = cJSON_GetObjectItem(root, "sequences"), *items = cJSON_GetObjectItem(root, "items");
    assert_int_equal(cJSON_GetArraySize(seqs), p.batch.n);
    assert_int_equal(cJSON_GetArraySize(items), p.n_items);
    for (int64_t i = 0; i < p.batch.n; i++) {
        const cJSON *s = cJSON_GetArrayItem(seqs, (int)i);
        assert_true(cJSON_GetObjectItem(s, "len")->valuedouble == (double)p.batch.seqs[i].len);
        assert_true(cJSON_GetObjectItem(s, "id")->valuedouble == (double)p.batch.seqs[i].id);
    }
    for (int32_t k = 0; k < p.n_items; k++) {
        const cJSON *it = cJSON_GetArrayItem(items, k);
        const Item *pi = &p.items[k];
        assert_true(cJSON_GetObjectItem(it, "est_time")->valuedouble == pi->est_time);
        assert_true((float)cJSON_GetObjectItem(it, "offload")->valuedouble == pi->offload);
        const cJSON *ranks = cJSON_GetObjectItem(it, "ranks"), *segs = cJSON_GetObjectItem(it, "segments");
        assert_int_equal(cJSON_GetArraySize(ranks), pi->n_ranks);
        for (int j = 0; j < pi->n_ranks; j++)
            assert_int_equal(cJSON_GetArrayItem(ranks, j)->valueint, p.ranks[pi->rank_begin + j]);
        assert_int_equal(cJSON_GetArraySize(segs), pi->n_segs);
        for (int j = 0; j < pi->n_segs; j++) {
            const cJSON *t = cJSON_GetArrayItem(segs, j);
            const Segment *sg = &p.segs[pi->seg_begin + j];
            assert_int_equal(cJSON_GetArrayItem(t, 0)->valueint, sg->seq);
            assert_true(cJSON_GetArrayItem(t, 1)->valuedouble == (double)sg->start);
            assert_true(cJSON_GetArrayItem(t, 2)->valuedouble == (double)sg->len);
        }
    }
    cJSON_Delete(root);
    // and it reads back as the same plan, the odd policy name included
    Plan q;
    if (plan_read_json(&q, path) != 0) fail_msg("%s", bs_errmsg());
    assert_same_plan(&p, &q);
    plan_free(&q);
    plan_free(&p);
}

// A hand-written file with the members in reverse order, on one line, unknown members of every
// kind between them and integers written as 3e2 or 100.0 reads as the writer's file does.
static void test_any_order_and_layout(void **state) {
    (void)state;
    const char *dir = test_tmpdir("plan_io_order");
    char a[600], b[600];
    snprintf(a, sizeof a, "%s/a.json", dir);
    snprintf(b, sizeof b, "%s/b.json", dir);
    const char *plain =
        "{\"version\": 1, \"policy\": \"hand\", \"n_ranks\": 3, \"pp\": 1, \"capacity\": 300,\n"
        " \"sequences\": [{\"id\": 0, \"len\": 100, \"src\": -1}, {\"id\": 1, \"len\": 200, \"src\": 7}],\n"
        " \"items\": [{\"ranks\": [0], \"offload\": 0, \"segments\": [[0, 0, 100]], \"est_time\": 0.5},\n"
        "           {\"ranks\": [1, 2], \"offload\": 0, \"segments\": [[1, 0, 200]], \"est_time\": 0.25}]}\n";
    const char *shuffled =
        "{\"items\":[{\"est_time\":5e-1,\"segments\":[[0,0,1e2]],\"note\":{\"a\":[1,[2,{\"b\":null}]]},"
        "\"offload\":0.0,\"ranks\":[0.0]},{\"x\":true,\"segments\":[[1,0,200.0]],\"ranks\":[1,2],\"offload\":0,"
        "\"est_time\":0.25}],\"extra\":[[[[{}]]]],\"sequences\":[{\"src\":-1,\"len\":100,\"id\":0,\"y\":\"z\"},"
        "{\"len\":2e2,\"src\":7,\"id\":1}],\"capacity\":3e2,\"pp\":1,\"format\":false,\"n_ranks\":3,"
        "\"policy\":\"hand\",\"version\":1}";
    assert_int_equal(file_write_atomic(a, plain, strlen(plain)), 0);
    assert_int_equal(file_write_atomic(b, shuffled, strlen(shuffled)), 0);
    Plan p, q;
    if (plan_read_json(&p, a) != 0) fail_msg("%s", bs_errmsg());
    if (plan_read_json(&q, b) != 0) fail_msg("%s", bs_errmsg());
    assert_same_plan(&p, &q);
    assert_int_equal(q.batch.seqs[1].src, 7);
    assert_true(q.makespan == 0.5);  // rank 0's item: 0.5 s, the ring: 0.25 s
    plan_free(&p);
    plan_free(&q);
}

static void expect_refused(const char *dir, const char *text, const char *needle) {
    char path[600];
    snprintf(path, sizeof path, "%s/bad.json", dir);
    assert_int_equal(file_write_atomic(path, text, strlen(text)), 0);
    Plan p;
    bs_error_clear();
    assert_int_equal(plan_read_json(&p, path), -1);
    if (!strstr(bs_errmsg(), needle)) fail_msg("expected \"%s\" in: %s", needle, bs_errmsg());
}

static void test_refusals(void **state) {
    (void)state;
    const char *dir = test_tmpdir("plan_io_bad");
    const char *head = "{\"version\": 1, \"policy\": \"h\", \"n_ranks\": 2, \"pp\": 1, \"capacity\": 300, ";
    char text[1024];
    // a member given twice: which one would count is anybody's guess
    snprintf(text, sizeof text, "%s\"n_ranks\": 4, \"sequences\": [], \"items\": []}", head);
    expect_refused(dir, text, "bad.json: \"n_ranks\" is given twice");
    snprintf(text, sizeof text, "%s\"sequences\": [{\"id\": 0, \"len\": 5, \"len\": 6}], \"items\": []}", head);
    expect_refused(dir, text, "sequences[0]: \"len\" is given twice");
    snprintf(text, sizeof text, "%s\"sequences\": [], \"items\": [], \"items\": []}", head);
    expect_refused(dir, text, "\"items\" is given twice");
    // wrong kinds of value, each named
    snprintf(text, sizeof text, "%s\"sequences\": [7], \"items\": []}", head);
    expect_refused(dir, text, "sequences[0]: expected an object");
    snprintf(text, sizeof text, "%s\"sequences\": {}, \"items\": []}", head);
    expect_refused(dir, text, "\"sequences\" must be an array");
    snprintf(text, sizeof text, "%s\"sequences\": [{\"id\": 0, \"len\": 1.5}], \"items\": []}", head);
    expect_refused(dir, text, "sequences[0]: \"len\" must be an integer");
    snprintf(text, sizeof text, "%s\"sequences\": [{\"id\": 0, \"len\": 5}], \"items\": [{\"ranks\": [0], "
                                "\"offload\": \"no\", \"segments\": [[0, 0, 5]]}]}", head);
    expect_refused(dir, text, "items[0]: \"offload\" must be a number");
    snprintf(text, sizeof text, "%s\"sequences\": [{\"id\": 0, \"len\": 5}], \"items\": [{\"ranks\": [0], "
                                "\"offload\": 0, \"segments\": [[0, 0, 5, 9]]}]}", head);
    expect_refused(dir, text, "items[0].segments[0]: expected [seq, start, len]");
    snprintf(text, sizeof text, "%s\"sequences\": [{\"id\": 0, \"len\": 5}], \"items\": [{\"ranks\": [0], "
                                "\"offload\": 1e999, \"segments\": [[0, 0, 5]]}]}", head);
    expect_refused(dir, text, "items[0]: \"offload\" must be a number");
    expect_refused(dir, "[1, 2]", "bad.json: expected a JSON object");
    snprintf(text, sizeof text, "%s\"sequences\": [], \"items\": []} {}", head);
    expect_refused(dir, text, "invalid JSON");
    // missing members of the root, wherever the file ends
    expect_refused(dir, "{\"version\": 1, \"sequences\": [], \"items\": []}", "bad.json: missing \"policy\"");
}

// A broken file names the line and column where it broke.
static void test_syntax_error_position(void **state) {
    (void)state;
    const char *dir = test_tmpdir("plan_io_syntax");
    expect_refused(dir, "{\"version\": 1,\n \"policy\": \"h\",\n \"n_ranks\": 2 ]\n}", "bad.json:3:15: invalid JSON");
    expect_refused(dir, "{\"version\": 1,\n \"policy\": \"h\",\n", "bad.json:3:1: invalid JSON (parse error: premature EOF)");
    expect_refused(dir, "{\"version\": 1, // a comment\n}", "bad.json:1:16: invalid JSON");
}

// A plan read from a FIFO streams like a file; a broken one names its byte offset.
static void read_from_fifo(const char *fifo, const char *text, int expect_ok, const char *needle) {
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        FILE *f = fopen(fifo, "w");
        if (!f) _exit(1);
        fputs(text, f);
        fclose(f);
        _exit(0);
    }
    Plan p;
    bs_error_clear();
    int rc = plan_read_json(&p, fifo);
    int status;
    waitpid(pid, &status, 0);
    assert_true(WIFEXITED(status) && WEXITSTATUS(status) == 0);
    if (expect_ok) {
        if (rc != 0) fail_msg("%s", bs_errmsg());
        assert_int_equal(p.n_items, 2);
        assert_int_equal(p.batch.n_tokens, 300);
        plan_free(&p);
    } else {
        assert_int_equal(rc, -1);
        if (!strstr(bs_errmsg(), needle)) fail_msg("expected \"%s\" in: %s", needle, bs_errmsg());
    }
}

static void test_fifo(void **state) {
    (void)state;
    const char *dir = test_tmpdir("plan_io_fifo");
    char fifo[600];
    snprintf(fifo, sizeof fifo, "%s/plan.fifo", dir);
    assert_int_equal(mkfifo(fifo, 0600), 0);
    const char *good =
        "{\"version\": 1, \"policy\": \"hand\", \"n_ranks\": 3, \"pp\": 1, \"capacity\": 300,\n"
        " \"sequences\": [{\"id\": 0, \"len\": 100}, {\"id\": 1, \"len\": 200}],\n"
        " \"items\": [{\"ranks\": [0], \"offload\": 0, \"segments\": [[0, 0, 100]]},\n"
        "           {\"ranks\": [1, 2], \"offload\": 0, \"segments\": [[1, 0, 200]]}]}\n";
    read_from_fifo(fifo, good, 1, NULL);
    read_from_fifo(fifo, "{\"version\": 1, \"policy\": ]", 0, "plan.fifo: byte 26: invalid JSON");
}

// Large enough that tokens cross the reader's 64 KiB pieces thousands of times.
static void test_large_plan_round_trip(void **state) {
    (void)state;
    const char *dir = test_tmpdir("plan_io_large");
    char path[600];
    snprintf(path, sizeof path, "%s/big.json", dir);
    Plan p, q;
    CostModel cm;
    make_plan(&p, &cm, "uniform:1:600", 64 << 20, 512);
    assert_true(p.batch.n > 100000);
    assert_int_equal(plan_write_json(&p, path), 0);
    struct stat st;
    assert_int_equal(stat(path, &st), 0);
    assert_true(st.st_size > (100 << 16));
    if (plan_read_json_cm(&q, path, &cm) != 0) fail_msg("%s", bs_errmsg());
    assert_same_plan(&p, &q);
    assert_true(q.lower_bound == p.lower_bound);
    plan_free(&p);
    plan_free(&q);
}

// A plan JSON cannot hold (a non-finite estimate) is refused, and the file already at the path
// stays whole, with no temporary file beside it.
static void test_write_failure_keeps_old_file(void **state) {
    (void)state;
    const char *dir = test_tmpdir("plan_io_keep");
    char path[600];
    snprintf(path, sizeof path, "%s/p.json", dir);
    Plan p, q;
    CostModel cm;
    make_plan(&p, &cm, "byted", 1 << 20, 16);
    assert_int_equal(plan_write_json(&p, path), 0);
    p.items[p.n_items - 1].est_time = NAN;
    bs_error_clear();
    assert_int_equal(plan_write_json(&p, path), -1);
    char want[64];
    snprintf(want, sizeof want, "items[%d].est_time", p.n_items - 1);
    if (!strstr(bs_errmsg(), want)) fail_msg("%s", bs_errmsg());
    if (plan_read_json(&q, path) != 0) fail_msg("the old file should still read: %s", bs_errmsg());
    assert_int_equal(q.n_items, p.n_items);
    char cmd[700];
    snprintf(cmd, sizeof cmd, "test $(ls '%s' | wc -l) -eq 1", dir);
    assert_int_equal(system(cmd), 0);
    plan_free(&p);
    plan_free(&q);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_writer_output_is_plain_json),
        cmocka_unit_test(test_any_order_and_layout),
        cmocka_unit_test(test_refusals),
        cmocka_unit_test(test_syntax_error_position),
        cmocka_unit_test(test_fifo),
        cmocka_unit_test(test_large_plan_round_trip),
        cmocka_unit_test(test_write_failure_keeps_old_file),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
