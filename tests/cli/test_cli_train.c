// test_cli_train.c: `bytescale train` end to end - a short run writes metrics and a checkpoint, a
// resume continues it, --plot draws the loss, and bad flags, a missing dataset or a vocabulary
// mismatch give the documented exit code and a message naming the problem.
#include "cli/cli_run.h"

#include <math.h>
#include <unistd.h>

#include <cJSON.h>

#include "bytescale/fileio.h"
#include "bytescale/train.h"

#define DIR "test-tmp/cli_train"

static int run(const char *env, const char *args) { return cli_run(DIR, env, args); }
static void expect(const char *args, int code, const char *in_stderr) { cli_expect(DIR, args, code, in_stderr); }

// A small byte-level dataset in DIR/data from a few generated files.
static void make_data(void) {
    test_tmpdir("cli_train");
    cli_make_corpus(DIR, 6, 8, 4, 1024);
}

// Parse every line of a metrics file; returns the number of lines. Each must be a step object.
static int check_metrics(const char *path, int64_t first_step) {
    char *text;
    size_t n;
    assert_int_equal(file_read_all(path, &text, &n), 0);
    int lines = 0;
    for (char *line = text; *line;) {
        char *nl = strchr(line, '\n');
        assert_non_null(nl);  // every line is finished
        *nl = '\0';
        cJSON *o = cJSON_Parse(line);
        if (!o) fail_msg("%s: line %d is not JSON: %s", path, lines + 1, line);
        const char *num[] = {"step", "loss", "lr", "grad_norm", "tokens", "targets", "items", "seconds", "tokens_per_s"};
        for (size_t k = 0; k < sizeof num / sizeof num[0]; k++) {
            const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, num[k]);
            if (!cJSON_IsNumber(v)) fail_msg("%s: line %d: \"%s\" missing", path, lines + 1, num[k]);
        }
        assert_int_equal((int64_t)cJSON_GetObjectItemCaseSensitive(o, "step")->valuedouble, first_step + lines);
        assert_int_equal((int64_t)cJSON_GetObjectItemCaseSensitive(o, "tokens")->valuedouble, 256);
        double loss = cJSON_GetObjectItemCaseSensitive(o, "loss")->valuedouble;
        assert_true(isfinite(loss) && loss > 0 && loss < 8);
        cJSON_Delete(o);
        lines++;
        line = nl + 1;
    }
    free(text);
    return lines;
}

#define RUN_FLAGS "train --data " DIR "/data --model tiny --tokens 256 --context 64 --warmup 1 --lr 3e-3 "

static void test_train_run_and_resume(void **state) {
    (void)state;
    make_data();
    int rc = run("", RUN_FLAGS "--steps 2 --metrics " DIR "/m.jsonl --ckpt-dir " DIR "/ckpt");
    if (rc != 0) fail_msg("train: exit %d: %s", rc, cli_err);
    assert_non_null(strstr(cli_out, "trained steps 1..2"));
    assert_non_null(strstr(cli_out, "checkpoint: " DIR "/ckpt/ckpt-000002.bin"));
    assert_int_equal(check_metrics(DIR "/m.jsonl", 1), 2);
    TrainConfig c;
    assert_int_equal(train_read_config(DIR "/ckpt/ckpt-000002.bin", &c), 0);
    assert_string_equal(c.model, "tiny");
    assert_int_equal(c.tokens, 256);
    assert_int_equal(c.steps, 2);
    assert_true(c.lr == 3e-3 && c.min_lr == 3e-3 / 10);  // --lr alone sets min-lr to lr / 10, kept exactly

    // a resume may not change the settings ...
    expect("train --resume " DIR "/ckpt/ckpt-000002.bin --lr 1e-3", 2, "--lr 1e-3 differs from checkpoint");
    expect("train --resume " DIR "/ckpt/nothing.bin", 1, "nothing.bin");
    // ... but goes further: the metrics file (from the checkpoint) gains step 3
    rc = run("", "train --resume " DIR "/ckpt/ckpt-000002.bin --steps 3 --lr 3e-3");
    if (rc != 0) fail_msg("resume: exit %d: %s", rc, cli_err);
    assert_non_null(strstr(cli_out, "resumed from"));
    assert_non_null(strstr(cli_out, "trained steps 3..3"));
    assert_int_equal(check_metrics(DIR "/m.jsonl", 1), 3);
    assert_int_equal(access(DIR "/ckpt/ckpt-000003.bin", F_OK), 0);
    // nothing left to do is not an error
    rc = run("", "train --resume " DIR "/ckpt/ckpt-000003.bin");
    assert_int_equal(rc, 0);
    assert_non_null(strstr(cli_out, "nothing to do"));
}

static void test_train_plot(void **state) {
    (void)state;
    make_data();
    // no gnuplot: a clear error before any training
    int rc = run("PATH=/nonexistent", RUN_FLAGS "--steps 1 --plot " DIR "/loss");
    assert_int_equal(rc, 1);
    assert_non_null(strstr(cli_err, "gnuplot"));
    assert_int_equal(access(DIR "/loss.jsonl", F_OK), -1);
    if (system("command -v gnuplot >/dev/null 2>&1") != 0) {
        fprintf(stderr, "gnuplot is not installed: the plot itself is not checked\n");
        return;
    }
    rc = run("", RUN_FLAGS "--steps 3 --plot " DIR "/loss");
    if (rc != 0) fail_msg("train --plot: exit %d: %s", rc, cli_err);
    assert_int_equal(check_metrics(DIR "/loss.jsonl", 1), 3);  // --plot alone puts the metrics next to it
    char png[8];
    FILE *f = fopen(DIR "/loss.png", "rb");
    assert_non_null(f);
    assert_int_equal(fread(png, 1, 8, f), 8);
    fclose(f);
    assert_memory_equal(png, "\x89PNG\r\n\x1a\n", 8);
    cli_slurp(DIR "/loss.svg", cli_out, sizeof cli_out);
    assert_non_null(strstr(cli_out, "<svg"));
}

static void test_train_bad_flags_and_data(void **state) {
    (void)state;
    make_data();
    assert_int_equal(run("", "train --help"), 0);
    assert_non_null(strstr(cli_out, "--resume"));
    // usage errors: exit 2
    expect("train --bogus 1", 2, "unknown flag '--bogus'");
    expect("train --steps", 2, "--steps needs a value");
    expect("train --steps abc", 2, "--steps: 'abc' is not an integer");
    expect("train --lr -1", 2, "learning rate must be in (0, 1]");
    // settings that can only diverge are refused before anything runs or is written
    expect("train --data " DIR "/data --model tiny --lr 1e3 --ckpt-every 1 --ckpt-keep 1 --ckpt-dir " DIR "/ckd", 2,
           "learning rate must be in (0, 1]");
    expect("train --lr 1e39", 2, "learning rate must be in (0, 1]");
    expect("train --clip -1", 2, "clip must be a gradient norm >= 0");
    expect("train --weight-decay 3", 2, "weight decay must be in [0, 1]");
    assert_int_equal(access(DIR "/ckd", F_OK), -1);
    expect("train stray", 2, "unexpected argument 'stray'");
    expect("train --data " DIR "/data --context 256 --capacity 128", 2, "mpirun");
    // run errors: exit 1
    expect("train --data " DIR "/nothing", 1, "run `bytescale prepare`");
    // outputs that would be lost or would destroy something: refused before the first step
    assert_int_equal(file_write_atomic(DIR "/notes.png", "my notes", 8), 0);
    expect("train --data " DIR "/data --model tiny --steps 1 --plot " DIR "/notes", 1, "refusing to overwrite");
    expect("train --data " DIR "/data --model tiny --steps 1 --ckpt-dir " DIR "/notes.png", 1,
           "is a file, not a directory");
    expect("train --data " DIR "/data --model tiny --steps 1 --metrics " DIR "/data/index.bin", 1,
           "refusing to overwrite");
    // a value that is none of the choices is a usage error (README.md "Exit codes and errors")
    expect("train --data " DIR "/data --model tiny --policy fastest", 2, "unknown policy 'fastest'");
    expect("train --data " DIR "/data --model huge", 2, "unknown model");
}

// The model's vocabulary follows the dataset's tokenizer (cl100k: 100277 ids) and is said; a
// checkpoint trained on one vocabulary does not resume on another's data.
static void test_train_vocabulary_follows_the_dataset(void **state) {
    (void)state;
    TEST_TOKENIZER_OR_SKIP("cl100k_base.tiktoken");
    TEST_TOKENIZER_OR_SKIP("r50k_base.tiktoken");
    make_data();
    const char *lines = "{\"text\": \"package main\\n\\nfunc main() { println(\\\"hi\\\") }\\n\"}\n"
                        "{\"text\": \"if err != nil { return err } // \\u4e16\\u754c\"}\n";
    assert_int_equal(file_write_atomic(DIR "/c.jsonl", lines, strlen(lines)), 0);
    int rc = run("", "prepare --input " DIR "/c.jsonl --tokenizer cl100k --out " DIR "/cl100k");
    if (rc != 0) fail_msg("prepare cl100k: exit %d: %s", rc, cli_err);
    rc = run("", "train --data " DIR "/cl100k --model tiny --tokens 64 --context 32 --steps 1 --warmup 1 --ckpt-dir " DIR
                 "/ck");
    if (rc != 0) fail_msg("train: exit %d: %s", rc, cli_err);
    assert_non_null(strstr(cli_out, "vocabulary 100277: the dataset's cl100k tokenizer"));
    rc = run("", "prepare --input " DIR "/c.jsonl --tokenizer gpt2 --out " DIR "/gpt2");
    if (rc != 0) fail_msg("prepare gpt2: exit %d: %s", rc, cli_err);
    expect("train --data " DIR "/gpt2 --model tiny --tokens 64 --context 32 --steps 2 --resume " DIR "/ck/ckpt-000001.bin", 1,
           "with vocab_size 100277, this run's model tiny has 50257");
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_train_run_and_resume),
        cmocka_unit_test(test_train_plot),
        cmocka_unit_test(test_train_bad_flags_and_data),
        cmocka_unit_test(test_train_vocabulary_follows_the_dataset),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
