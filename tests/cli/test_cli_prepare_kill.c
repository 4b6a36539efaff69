// test_cli_prepare_kill.c: `kill -9` at 20 random moments of `bytescale prepare` over an existing
// dataset. After every kill the output directory opens (dataset_open checks every checksum) and
// holds, whole, either the dataset that was there before or the one the killed run was writing -
// never a mix, never nothing. What a killed run left behind is removed by the next run.
//
// Two corpora take turns, so every run changes the content and "old" and "new" can be told apart by
// a fingerprint of all their tokens. The kill moments are spread over the whole run: from before the
// first shard to after the index is switched, scaled by the measured length of a full run.
// ctest: slow (20 or more kills at random moments: crash consistency, which the Release pass checks)
#include "cli/cli_run.h"

#include <dirent.h>
#include <signal.h>
#include <unistd.h>

#include "bytescale/error.h"
#include "bytescale/fileio.h"
#include "bytescale/rng.h"
#include "bytescale/shard.h"
#include "bytescale/timer.h"

#define KDIR "test-tmp/cli_prepare_kill"
#define FLAGS "--tokenizer gpt2 --shard-size 16K"

// A corpus of n files of 2.5 to 17.5 KB of Go-like text with random identifiers (so BPE has real
// work: a run lasts a fraction of a second), about one file a shard: over a hundred shards. (Files of
// 10 to 70 KB in shards of 64K made the same shards at 3.5x the time a run.)
static void make_corpus(const char *dir, int n, uint64_t seed) {
    static const char *words[] = {"func ", "return ", "if ", "err ", "!= ", "nil ",
                                  "{\n",   "}\n",     ":= ", "for ", "range "};
    assert_int_equal(make_dirs(dir), 0);
    Rng rng;
    rng_seed(&rng, seed);
    static char text[20000];
    for (int f = 0; f < n; f++) {
        size_t len = 2500 + rng_below(&rng, 15000), at = 0;
        while (at + 16 < len) {
            if (rng_below(&rng, 2)) {
                const char *w = words[rng_below(&rng, sizeof words / sizeof words[0])];
                memcpy(text + at, w, strlen(w));
                at += strlen(w);
            } else {
                for (uint64_t k = 2 + rng_below(&rng, 8); k > 0; k--) text[at++] = (char)('a' + rng_below(&rng, 26));
                text[at++] = ' ';
            }
        }
        char path[300];
        snprintf(path, sizeof path, "%s/f%03d.go", dir, f);
        FILE *fp = fopen(path, "wb");
        assert_non_null(fp);
        assert_int_equal(fwrite(text, 1, at, fp), at);
        assert_int_equal(fclose(fp), 0);
    }
}

// Start `bytescale prepare --input in --out out` in the background.
static pid_t start_prepare(const char *in, const char *out) {
    char cmd[4096];
    snprintf(cmd, sizeof cmd, "BS_QUIET=1 OPENBLAS_NUM_THREADS=1 exec '%s' prepare --input %s --out %s " FLAGS " >" KDIR
             "/stdout 2>" KDIR "/stderr",
             getenv("BS_BINARY"), in, out);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        execl("/bin/sh", "sh", "-c", cmd, (char *)NULL);
        _exit(127);
    }
    return pid;
}

static int wait_exit(pid_t pid) {
    int st;
    double t0 = now_seconds();
    while (waitpid(pid, &st, WNOHANG) == 0) {
        if (now_seconds() - t0 > 600) {  // a bound for a hang, generous for a loaded machine
            kill(pid, SIGKILL);
            waitpid(pid, &st, 0);
            fail_msg("prepare still ran 600 s after it started");
        }
        usleep(2000);
    }
    return st;
}

// A full run into out; its length in seconds.
static double prepare_full(const char *in, const char *out) {
    double t0 = now_seconds();
    int st = wait_exit(start_prepare(in, out));
    if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) {
        cli_slurp(KDIR "/stderr", cli_err, sizeof cli_err);
        fail_msg("prepare --input %s --out %s failed: %s", in, out, cli_err);
    }
    return now_seconds() - t0;
}

// Every document's length and tokens as one number; 0 when the dataset does not open.
static uint32_t fingerprint(const char *dir, char *why, size_t cap) {
    Dataset ds;
    if (dataset_open(&ds, dir) != 0) {
        snprintf(why, cap, "%s", bs_errmsg());
        return 0;
    }
    uint32_t crc = checksum_crc32(0, &ds.index.n_docs, sizeof ds.index.n_docs);
    static uint32_t buf[1 << 16];
    for (int64_t d = 0; d < ds.index.n_docs; d++) {
        int64_t len = ds.index.docs[d].len;
        crc = checksum_crc32(crc, &len, sizeof len);
        for (int64_t at = 0; at < len; at += 1 << 16) {
            int64_t k = len - at < (1 << 16) ? len - at : 1 << 16;
            assert_int_equal(dataset_read(&ds, d, at, k, buf), 0);
            crc = checksum_crc32(crc, buf, (size_t)k * sizeof *buf);
        }
    }
    dataset_close(&ds);
    return crc ? crc : 1;
}

// Files in dir besides index.bin and the shards it names: temporary files and shards of other
// generations (what a killed run leaves). Anything else there fails the test.
static int leftovers(const char *dir) {
    DocIndex ix;
    if (docindex_read(&ix, dir) != 0) fail_msg("%s", bs_errmsg());
    DIR *d = opendir(dir);
    assert_non_null(d);
    struct dirent *e;
    int n = 0;
    while ((e = readdir(d)) != NULL) {
        if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..") || !strcmp(e->d_name, INDEX_FILE)) continue;
        int named = 0;
        for (int s = 0; s < ix.n_shards && !named; s++) named = !strcmp(e->d_name, ix.shards[s].name);
        if (named) continue;
        if (strncmp(e->d_name, "shard-", 6) != 0 && strncmp(e->d_name, "index.bin.tmp.", 14) != 0)
            fail_msg("%s: a file prepare does not write: %s", dir, e->d_name);
        n++;
    }
    closedir(d);
    docindex_free(&ix);
    return n;
}

static void test_kill_prepare_at_random_moments(void **state) {
    (void)state;
    if (!getenv("BS_BINARY")) fail_msg("BS_BINARY is not set (run through ctest)");
    TEST_TOKENIZER_OR_SKIP("r50k_base.tiktoken");  // its runs tokenize with GPT-2 (FLAGS)
    test_tmpdir("cli_prepare_kill");
    make_corpus(KDIR "/a", 160, 1);
    make_corpus(KDIR "/b", 130, 2);
    // the two datasets a kill may leave, prepared on their own; how long a whole run takes
    double t = prepare_full(KDIR "/a", KDIR "/ref-a");
    double tb = prepare_full(KDIR "/b", KDIR "/ref-b");
    if (tb > t) t = tb;
    char why[512] = "";
    uint32_t fp[2] = {fingerprint(KDIR "/ref-a", why, sizeof why), fingerprint(KDIR "/ref-b", why, sizeof why)};
    assert_true(fp[0] != 0 && fp[1] != 0 && fp[0] != fp[1]);
    const char *corpus[2] = {KDIR "/a", KDIR "/b"};

    tb = prepare_full(corpus[0], KDIR "/ds");
    if (tb > t) t = tb;
    int have = 0;  // which corpus the dataset in ds holds
    int kept_old = 0, got_new = 0, left = 0;
    Rng rng;
    rng_seed(&rng, 2027);
    // 20 kills, then (a statistical check, so retried) 20 more with t measured again when fewer than 5
    // came before the switch: the runs went faster than the measurement, on a machine whose load changed
    int trials = 0;
    for (int round = 0; round < 3 && (round == 0 || kept_old < 5); round++) {
        if (round > 0) {
            double again = prepare_full(corpus[1 - have], KDIR "/ds");
            have = 1 - have;
            print_message("round %d: %d of %d kills came before the switch; again, with a %.3f s run (was %.3f s)\n",
                          round, kept_old, trials, again, t);
            t = again;
        }
        for (int trial = 0; trial < 20; trial++, trials++) {
            int next = 1 - have;
            pid_t pid = start_prepare(corpus[next], KDIR "/ds");
            // a moment from start-up to past the end of a whole run (which is slower when it has a killed
            // run's files to remove first, or the machine is busy)
            useconds_t at = (useconds_t)(1e6 * t * 1.6 * (double)rng_below(&rng, 1000) / 1000.0);
            usleep(at);
            kill(pid, SIGKILL);
            int st = wait_exit(pid);
            int killed = WIFSIGNALED(st) && WTERMSIG(st) == SIGKILL;
            if (!killed && !(WIFEXITED(st) && WEXITSTATUS(st) == 0)) fail_msg("trial %d: prepare failed on its own", trial);
            uint32_t f = fingerprint(KDIR "/ds", why, sizeof why);
            if (f == 0) fail_msg("trial %d: killed at %.3f s, the dataset does not open: %s", trial, at / 1e6, why);
            if (f != fp[have] && f != fp[next])
                fail_msg("trial %d: killed at %.3f s, the dataset is neither the old nor the new one", trial, at / 1e6);
            int n_left = leftovers(KDIR "/ds");
            print_message("kill %2d at %.3f s of a %.3f s run: %s dataset, whole; %d file%s left over\n",
                          trial, at / 1e6, t, f == fp[have] ? "old" : "new", n_left, n_left == 1 ? "" : "s");
            if (f == fp[next]) got_new++;
            else kept_old++;
            left += n_left;
            have = f == fp[next] ? next : have;
        }
    }
    // a run to the end removes whatever the killed ones left
    prepare_full(corpus[1 - have], KDIR "/ds");
    assert_int_equal(fingerprint(KDIR "/ds", why, sizeof why), fp[1 - have]);
    assert_int_equal(leftovers(KDIR "/ds"), 0);
    print_message("%d kills: the dataset always opened whole - %d times the old one, %d times the new one; %d files "
                  "left by killed runs, all removed by the next run\n",
                  trials, kept_old, got_new, left);
    // the moments covered the run: before the switch and after
    assert_true(kept_old >= 5);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_kill_prepare_at_random_moments),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
