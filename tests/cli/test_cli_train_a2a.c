// test_cli_train_a2a.c: `train --policy flexsp` runs its all-to-all (Ulysses) groups in the engine.
// On 2 ranks, and on 4 with --tp 2 and with --pp 2 (2 HDP ranks each), 3 steps whose saved plans hold
// all-to-all items lose what one process with every sequence packed loses, step by step (relative
// difference <= 1e-5: the same batches, the same gradients up to fp32 rounding).
#include "cli/cli_run.h"

#include <math.h>

#include <cJSON.h>

#include "bytescale/fileio.h"

#define DIR "test-tmp/cli_train_a2a"
#define COMMON "train --data " DIR "/data --model tiny --context 512 --tokens 1024 --lr 3e-3 --warmup 1 --steps 3"

static void make_data(void) {
    test_tmpdir("cli_train_a2a");
    cli_make_corpus(DIR, 12, 3, 6, 2100);
}

// The losses of a metrics file by step (1-based); returns the number of lines.
static int read_losses(const char *path, double *loss, int cap) {
    char *text;
    size_t n;
    assert_int_equal(file_read_all(path, &text, &n), 0);
    int lines = 0;
    for (char *line = strtok(text, "\n"); line; line = strtok(NULL, "\n")) {
        cJSON *o = cJSON_Parse(line);
        assert_non_null(o);
        int step = cJSON_GetObjectItem(o, "step")->valueint;
        assert_true(step >= 1 && step <= cap);
        loss[step] = cJSON_GetObjectItem(o, "loss")->valuedouble;
        cJSON_Delete(o);
        lines++;
    }
    free(text);
    return lines;
}

// All-to-all items ("a2a": 1) in the saved plans of steps 1..3.
static int a2a_items(const char *dir) {
    int n = 0;
    for (int s = 1; s <= 3; s++) {
        char path[300], *text;
        size_t len;
        snprintf(path, sizeof path, "%s/plan-%06d.json", dir, s);
        assert_int_equal(file_read_all(path, &text, &len), 0);
        for (const char *at = text; (at = strstr(at, "\"a2a\": 1")) != NULL; at++) n++;
        free(text);
    }
    return n;
}

static void run_flexsp(int np, const char *extra, const char *name, const double *ref) {
    char args[1024];
    snprintf(args, sizeof args,
             COMMON " --policy flexsp --capacity 300 %s --save-plans " DIR "/plans-%s --metrics " DIR "/%s.jsonl", extra,
             name, name);
    int rc = cli_run_np(DIR, np, "", args);
    if (rc != 0) fail_msg("%s: exit %d: %s", name, rc, cli_err);
    char path[300];
    snprintf(path, sizeof path, DIR "/plans-%s", name);
    int groups = a2a_items(path);
    if (groups == 0) fail_msg("%s: flexsp's plans hold no all-to-all group", name);
    double loss[4] = {0};
    snprintf(path, sizeof path, DIR "/%s.jsonl", name);
    assert_int_equal(read_losses(path, loss, 3), 3);
    for (int s = 1; s <= 3; s++)
        if (fabs(loss[s] - ref[s]) > 1e-5 * fabs(ref[s]))
            fail_msg("%s step %d: loss %.9g, one process %.9g", name, s, loss[s], ref[s]);
    printf("  %-8s %d all-to-all items in 3 steps, losses as one process's\n", name, groups);
}

static void test_flexsp_trains_like_one_process(void **state) {
    (void)state;
    make_data();
    int rc = cli_run(DIR, "", COMMON " --policy balance --capacity 512 --metrics " DIR "/ref.jsonl");
    if (rc != 0) fail_msg("one process: exit %d: %s", rc, cli_err);
    double ref[4] = {0};
    assert_int_equal(read_losses(DIR "/ref.jsonl", ref, 3), 3);
    run_flexsp(2, "", "hdp2", ref);
    run_flexsp(4, "--tp 2", "tp2", ref);
    run_flexsp(4, "--pp 2", "pp2", ref);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_flexsp_trains_like_one_process),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
