// test_cli_train_kill.c: `kill -9` at 20 random moments of a training run that writes a checkpoint
// every step: afterwards the newest checkpoint always resumes, the metrics file's finished lines
// all parse, and the resumed run removes the temporary file a killed checkpoint write left.
// Half of the runs are one process, half are 2 MPI ranks (a rank killed mid-ring or mid-gather).
// A dataset whose shards are truncated under a running job ends it with a message, its newest
// checkpoint intact.
// ctest: slow (20 kills at random moments: crash consistency, which the Release pass checks; the
// truncated-shard reads run under the sanitizers in data/test_shard)
// ctest: long (20 training runs killed)
#include "cli/cli_run.h"

#include <dirent.h>
#include <signal.h>
#include <unistd.h>

#include <cJSON.h>

#include "bytescale/error.h"
#include "bytescale/fileio.h"
#include "bytescale/rng.h"
#include "bytescale/shard.h"

#define KDIR "test-tmp/cli_train_kill"
#define COMMON "--data " KDIR "/data --model tiny --context 256 --capacity 256 --tokens 512 --lr 3e-3 --warmup 1"

static void make_data(void) {
    test_tmpdir("cli_train_kill");
    assert_int_equal(make_dirs(KDIR "/in"), 0);
    for (int f = 0; f < 16; f++) {
        char path[256], text[4096] = "";
        for (int r = 0; r < 4 + 8 * f && strlen(text) < 3900; r++)
            strncat(text, "for i := range xs { sum += xs[i] }\n", sizeof text - strlen(text) - 1);
        snprintf(path, sizeof path, KDIR "/in/f%d.go", f);
        assert_int_equal(file_write_atomic(path, text, strlen(text)), 0);
    }
    if (cli_run(KDIR, "", "prepare --input " KDIR "/in --out " KDIR "/data") != 0) fail_msg("prepare: %s", cli_err);
}

// The newest ckpt-<step>.bin in dir (its step, or -1 when none) and how many temp files are there.
static int64_t newest_checkpoint(const char *dir, char *path, size_t cap, int *tmp_files) {
    DIR *d = opendir(dir);
    int64_t best = -1;
    *tmp_files = 0;
    if (!d) return -1;
    struct dirent *e;
    while ((e = readdir(d))) {
        long long step;
        char tail[64];
        if (strstr(e->d_name, ".tmp.")) (*tmp_files)++;
        else if (sscanf(e->d_name, "ckpt-%lld.bi%63s", &step, tail) == 2 && !strcmp(tail, "n") && step > best) {
            best = step;
            snprintf(path, cap, "%s/%s", dir, e->d_name);
        }
    }
    closedir(d);
    return best;
}

// Every finished line of the metrics file is a step record (a killed write may leave a last,
// unfinished line, which a resume drops).
static void check_metrics(const char *path) {
    char *text;
    size_t n;
    if (file_read_all(path, &text, &n) != 0) return;  // killed before the first step
    for (char *line = text, *nl; (nl = memchr(line, '\n', n - (size_t)(line - text))); line = nl + 1) {
        *nl = '\0';
        cJSON *o = cJSON_Parse(line);
        if (!o || !cJSON_IsNumber(cJSON_GetObjectItemCaseSensitive(o, "step")))
            fail_msg("%s: a finished line is not a step record: %s", path, line);
        cJSON_Delete(o);
    }
    free(text);
}

static void test_kill_at_random_moments(void **state) {
    (void)state;
    make_data();
    const char *bin = getenv("BS_BINARY");
    Rng rng;
    rng_seed(&rng, 2026);
    int resumed = 0, tmp_seen = 0;
    for (int trial = 0; trial < 20; trial++) {
        int mpi = trial % 2;
        char ck[128], cmd[4096];
        snprintf(ck, sizeof ck, KDIR "/ck%d", trial);
        snprintf(cmd, sizeof cmd,
                 "BS_QUIET=1 OPENBLAS_NUM_THREADS=1 exec %s '%s' train " COMMON
                 " --steps 100000 --ckpt-dir %s --ckpt-every 1 --ckpt-keep 2 --metrics %s/m.jsonl >" KDIR
                 "/out 2>" KDIR "/err",
                 mpi ? CLI_MPIRUN_OWN_PLACEMENT "mpirun -np 2 --oversubscribe" : "", bin, ck, ck);
        pid_t pid = fork();
        assert_true(pid >= 0);
        if (pid == 0) {
            execl("/bin/sh", "sh", "-c", cmd, (char *)NULL);
            _exit(127);
        }
        // a random moment: from start-up to well into training (steps take milliseconds here); every
        // other pair of trials waits for the first checkpoint first, so that however slow a loaded
        // machine starts a job, half of the kills land in training with a checkpoint to resume
        int after_ckpt = (trial / 2) % 2;
        char first[512];
        int ftmp;
        for (int i = 0; after_ckpt && i < 6000 && newest_checkpoint(ck, first, sizeof first, &ftmp) < 1; i++)
            usleep(50000);
        usleep((useconds_t)(after_ckpt ? rng_below(&rng, 1000000) : 200000 + rng_below(&rng, 1500000)));
        // with MPI, kill one rank, as a crashed node would; mpirun ends the rest
        int ranks[8], n = mpi ? cli_children(pid, ranks, 8) : 0;
        kill(n > 0 ? ranks[n - 1] : pid, SIGKILL);
        int st;
        // (a bound for a hang, generous for a loaded machine; mpirun ends the job in about a second)
        if (cli_wait_or_kill(pid, 300, &st) != 0) fail_msg("trial %d: the job still ran 300 s after the kill", trial);
        char newest[512], args[1024];
        int tmp;
        int64_t step = newest_checkpoint(ck, newest, sizeof newest, &tmp);
        tmp_seen += tmp;
        char metrics[256];
        snprintf(metrics, sizeof metrics, "%s/m.jsonl", ck);
        check_metrics(metrics);
        if (step < 0) continue;  // killed before the first checkpoint
        // the newest checkpoint resumes and trains one more step; stale temp files are cleaned up
        snprintf(args, sizeof args, "train --resume %s --steps %lld", newest, (long long)step + 1);
        int rc = cli_run(KDIR, "", args);
        if (rc != 0) fail_msg("trial %d: resuming %s: exit %d: %s", trial, newest, rc, cli_err);
        newest_checkpoint(ck, newest, sizeof newest, &tmp);
        assert_int_equal(tmp, 0);
        check_metrics(metrics);
        resumed++;
    }
    print_message("20 kills: %d runs had a checkpoint and resumed from it; %d temporary files were left by killed "
                  "writes and removed on resume\n",
                  resumed, tmp_seen);
    assert_true(resumed >= 10);
}

// The dataset changes under a running job: a shard truncated in place (the shards are mapped, so
// this was a SIGBUS with no message). The run ends like any other data error: exit 1, a message
// naming the shard and saying the dataset changed; its newest checkpoint is intact and resumes once
// the dataset is prepared again.
static void test_dataset_truncated_under_a_running_job(void **state) {
    (void)state;
    make_data();
    const char *bin = getenv("BS_BINARY");
    char cmd[4096], shard[600];
    Dataset ds;
    if (dataset_open(&ds, KDIR "/data") != 0) fail_msg("%s", bs_errmsg());
    snprintf(shard, sizeof shard, KDIR "/data/%s", ds.index.shards[0].name);
    int n_shards = ds.index.n_shards;
    dataset_close(&ds);
    snprintf(cmd, sizeof cmd,
             "BS_QUIET=1 OPENBLAS_NUM_THREADS=1 exec '%s' train " COMMON
             " --steps 100000 --ckpt-dir " KDIR "/ckt --ckpt-every 1 --ckpt-keep 2 >" KDIR "/out 2>" KDIR "/err",
             bin);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        execl("/bin/sh", "sh", "-c", cmd, (char *)NULL);
        _exit(127);
    }
    // once a checkpoint is there (a bounded wait: a loaded machine is slow, not wrong), cut every
    // shard down to its header and a few tokens: whatever the next steps read is gone
    char newest[512];
    int tmp, st;
    for (int i = 0; i < 6000 && newest_checkpoint(KDIR "/ckt", newest, sizeof newest, &tmp) < 1; i++) usleep(50000);
    if (newest_checkpoint(KDIR "/ckt", newest, sizeof newest, &tmp) < 1) {
        kill(pid, SIGKILL);
        waitpid(pid, &st, 0);
        fail_msg("no checkpoint after 5 minutes: %s", cli_err);
    }
    DocIndex ix;
    assert_int_equal(docindex_read(&ix, KDIR "/data"), 0);
    for (int s = 0; s < n_shards; s++) {
        char path[700];
        snprintf(path, sizeof path, KDIR "/data/%s", ix.shards[s].name);
        assert_int_equal(truncate(path, 64 + 8), 0);
    }
    docindex_free(&ix);
    if (cli_wait_or_kill(pid, 300, &st) != 0) fail_msg("the job still ran 5 minutes after its dataset changed");
    cli_slurp(KDIR "/err", cli_err, sizeof cli_err);
    if (!WIFEXITED(st) || WEXITSTATUS(st) != 1)
        fail_msg("the job ended with %s %d, not exit 1: %s", WIFEXITED(st) ? "exit" : "signal",
                 WIFEXITED(st) ? WEXITSTATUS(st) : WTERMSIG(st), cli_err);
    if (!strstr(cli_err, "the dataset changed while it was in use") || !strstr(cli_err, "was truncated") ||
        !strstr(cli_err, shard + strlen(KDIR "/data/")))
        fail_msg("unclear message: %s", cli_err);
    char said[1024];
    snprintf(said, sizeof said, "%s", strstr(cli_err, "error: ") ? strstr(cli_err, "error: ") : cli_err);
    said[strcspn(said, "\n")] = '\0';
    // the newest checkpoint is whole: with the dataset prepared again it resumes and trains a step
    int64_t step = newest_checkpoint(KDIR "/ckt", newest, sizeof newest, &tmp);
    assert_true(step >= 1);
    if (cli_run(KDIR, "", "prepare --input " KDIR "/in --out " KDIR "/data") != 0) fail_msg("prepare: %s", cli_err);
    char args[1024];
    snprintf(args, sizeof args, "train --resume %s --steps %lld", newest, (long long)step + 1);
    int rc = cli_run(KDIR, "", args);
    if (rc != 0) fail_msg("resuming %s: exit %d: %s", newest, rc, cli_err);
    print_message("shards truncated under a running job: exit 1, %s\ncheckpoint %lld then resumed\n", said,
                  (long long)step);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_kill_at_random_moments),
        cmocka_unit_test(test_dataset_truncated_under_a_running_job),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
