// test_cli_profile.c: `bytescale profile` end to end, at fast settings: the file it writes is a cost
// model that `plan --cost` and `simulate --cost` accept; one process keeps the `cpu` profile's links
// and says so, `mpirun -np 2` measures them; --plot draws; every bad flag exits 2 with a message
// before anything is measured.
#include "cli/cli_run.h"

#include <cJSON.h>

#include "bytescale/cost.h"
#include "bytescale/error.h"
#include "bytescale/fileio.h"
#include "bytescale/hw.h"
#include "bytescale/json.h"

#define DIR "test-tmp/cli_profile"
// a few short lengths, one run each: seconds, not minutes
// (--reps and --p2p-reps: run_profile adds them, 3 and 2, more on a retry)
#define FAST "profile --model tiny --lengths 256,384,512,768,1K --warmup 1 --capacity 512 " \
             "--tier-bytes 4M --tier-reps 1"

// the fastest settings that measure at all, for the bad flags that must be refused before measuring
#define QUICK "--model tiny --lengths 256,384,512 --holdout 0 --reps 1 --warmup 0 --tier-bytes 4K --tier-reps 1 "

// Run `bytescale ARGS --reps R --p2p-reps P` (cli_run's way, or under `mpirun MPIRUN` when that is
// given) up to 3 times, R = 3, 9, 27 and P = 2, 6, 18: so few short runs on a machine ctest shares can
// be too noisy to fit (exit 1, "too noisy"), which is the command doing its job, not a failure of
// what these tests check; more runs a length or a message size make each median steadier. The R and
// P that ran are in profile_reps and profile_p2p.
static int profile_reps, profile_p2p;

static int run_profile(const char *mpirun, const char *args) {
    int rc = -1;
    const char *bin = getenv("BS_BINARY");
    if (mpirun && !bin) fail_msg("BS_BINARY is not set (run through ctest)");
    profile_reps = 3, profile_p2p = 2;
    for (int attempt = 1; attempt <= 3; attempt++, profile_reps *= 3, profile_p2p *= 3) {
        // every attempt starts where the first did: the --plot directory a refused attempt made would
        // otherwise be there already, and the retry would (rightly) not say it made it
        if (system("rm -rf " DIR "/fig") != 0) fail_msg("could not remove %s/fig", DIR);
        char line[4096];
        if (mpirun) {
            snprintf(line, sizeof line,
                     "BS_QUIET=1 OPENBLAS_NUM_THREADS=1 mpirun %s '%s' %s --reps %d --p2p-reps %d >" DIR
                     "/stdout 2>" DIR "/stderr",
                     mpirun, bin, args, profile_reps, profile_p2p);
            int st = system(line);
            cli_slurp(DIR "/stdout", cli_out, sizeof cli_out);
            cli_slurp(DIR "/stderr", cli_err, sizeof cli_err);
            rc = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
        } else {
            snprintf(line, sizeof line, "%s --reps %d --p2p-reps %d", args, profile_reps, profile_p2p);
            rc = cli_run(DIR, "", line);
        }
        if (rc != 1 || !strstr(cli_err, "too noisy")) break;
        printf("attempt %d (--reps %d --p2p-reps %d): %s", attempt, profile_reps, profile_p2p, cli_err);
    }
    return rc;
}

static const cJSON *member(const cJSON *o, const char *path) {  // "a.b.c"
    char buf[256];
    snprintf(buf, sizeof buf, "%s", path);
    for (char *save = NULL, *k = strtok_r(buf, ".", &save); k && o; k = strtok_r(NULL, ".", &save))
        o = cJSON_GetObjectItemCaseSensitive(o, k);
    if (!o) fail_msg("no member %s", path);
    return o;
}

static cJSON *read_json(const char *path) {
    cJSON *root;
    if (json_read_file(path, &root) != 0) fail_msg("%s", bs_errmsg());
    return root;
}

static void test_one_process_file_plan_simulate_plot(void **state) {
    (void)state;
    test_tmpdir("cli_profile");
    int rc = run_profile(NULL, FAST " --out " DIR "/one.json --plot " DIR "/fig/one");
    if (rc != 0) fail_msg("profile: exit %d: %s", rc, cli_err);
    // the table, the fit, the links it did not measure
    const char *says[] = {"held out", "T(s) = a1 s^2 + b1 s + c", "attn_pair = 2 a1", "links: not measured",
                          "offload tier: file", "wrote " DIR "/one.json", "plot: " DIR "/fig/one.png",
                          "made the directory " DIR "/fig for --plot"};
    for (size_t i = 0; i < sizeof says / sizeof says[0]; i++)
        if (!strstr(cli_out, says[i])) fail_msg("no '%s' in:\n%s", says[i], cli_out);
    CostModel cm;
    if (cost_load(&cm, DIR "/one.json") != 0) fail_msg("%s", bs_errmsg());
    const HardwareProfile *cpu = hw_find("cpu");
    assert_true(cm.ring_bw == cpu->inter_bw && cm.ring_lat == cpu->inter_lat && cm.ring_bw_intra == cpu->intra_bw);
    assert_true(cm.attn_pair >= 0 && cm.lin_token > 0 && cm.offload_bw > 0);
    assert_int_equal(cm.n_layers, 2);
    // 3D not measured: the TP all-reduce and the stage messages are the link's figures, written out
    assert_true(cm.tp_bw == cm.ring_bw_intra && cm.tp_lat == cm.ring_lat_intra && cm.derived_3d == 0);
    assert_true(cm.stage_bw == cm.ring_bw_intra && cm.stage_lat == cm.ring_lat_intra);
    assert_non_null(strstr(cli_out, "3D: not measured"));
    cJSON *root = read_json(DIR "/one.json");
    assert_true(cJSON_IsFalse(member(root, "profile.fields.tp_bw.measured")));
    assert_true(cJSON_IsFalse(member(root, "profile.3d.measured")));
    assert_true(cJSON_IsFalse(member(root, "profile.fields.ring_bw.measured")));
    assert_true(cJSON_IsFalse(member(root, "profile.links.measured")));
    assert_true(cJSON_IsTrue(member(root, "profile.fields.lin_token.measured")));
    assert_int_equal(cJSON_GetArraySize(member(root, "profile.compute.points")), 5);
    assert_true(cJSON_IsTrue(cJSON_GetObjectItem(cJSON_GetArrayItem(member(root, "profile.compute.points"), 2),
                                                 "held_out")));
    assert_true(member(root, "profile.machine.cores")->valuedouble >= 1);
    assert_string_equal(member(root, "profile.settings.clock")->valuestring, "cpu");
    cJSON_Delete(root);
    // the pictures
    char head[8] = {0};
    FILE *f = fopen(DIR "/fig/one.png", "rb");
    assert_non_null(f);
    assert_int_equal(fread(head, 1, 4, f), 4);
    fclose(f);
    assert_memory_equal(head, "\x89PNG", 4);
    assert_int_equal(access(DIR "/fig/one.svg", R_OK), 0);

    // what it is for: plan and simulate read it
    rc = cli_run(DIR, "", "plan --cost " DIR "/one.json --ranks 4 --capacity 512 --context 2K --tokens 16K "
                          "--dist uniform:64:2048 --policy all");
    if (rc != 0) fail_msg("plan --cost: exit %d: %s", rc, cli_err);
    assert_non_null(strstr(cli_out, "cost model: " DIR "/one.json"));
    rc = cli_run(DIR, "", "simulate --cost " DIR "/one.json --seeds 1 --model tiny --hardware cpu --gpus 4 --tp 1 "
                          "--capacity 512 --context 2K --tokens 16K --dist uniform:64:2048");
    if (rc != 0) fail_msg("simulate --cost: exit %d: %s", rc, cli_err);
    assert_non_null(strstr(cli_out, "balance"));
}

// `mpirun MPIRUN bytescale ARGS --out DIR/OUT` through run_profile, its output in cli_out / cli_err.
static void mpirun_profile(const char *mpirun, const char *args, const char *out) {
    test_tmpdir("cli_profile");
    char line[2048];
    snprintf(line, sizeof line, "%s --out " DIR "/%s", args, out);
    if (run_profile(mpirun, line) != 0) fail_msg("mpirun %s profile: %s\n%s", mpirun, cli_out, cli_err);
}

// Under mpirun the links are measured: the file's ring fields are the ping-pong's fit and say so.
static void test_two_ranks_measure_links(void **state) {
    (void)state;
    mpirun_profile("-np 2 --oversubscribe", FAST, "two.json");
    assert_non_null(strstr(cli_out, "2 ranks"));
    assert_non_null(strstr(cli_out, "ping-pong between ranks 0 and 1"));
    CostModel cm;
    if (cost_load(&cm, DIR "/two.json") != 0) fail_msg("%s", bs_errmsg());
    cJSON *root = read_json(DIR "/two.json");
    assert_true(cJSON_IsTrue(member(root, "profile.links.measured")));
    const char *ring[] = {"ring_bw", "ring_lat", "ring_bw_intra", "ring_lat_intra"};
    for (int i = 0; i < 4; i++) {
        char path[96];
        snprintf(path, sizeof path, "profile.fields.%s.measured", ring[i]);
        assert_true(cJSON_IsTrue(member(root, path)));
    }
    // the fit's figures are the file's, and the samples are there (--p2p-reps per size)
    assert_true(cm.ring_bw > 0 && cm.ring_bw == cm.ring_bw_intra);
    assert_close(cm.ring_bw, member(root, "profile.links.bw")->valuedouble, 1e-12, 0);
    const cJSON *pts = member(root, "profile.links.points");
    assert_true(cJSON_GetArraySize(pts) >= 5);
    assert_int_equal(cJSON_GetArraySize(cJSON_GetObjectItem(cJSON_GetArrayItem(pts, 0), "samples")), profile_p2p);
    assert_int_equal((int)member(root, "profile.machine.ranks")->valuedouble, 2);
    // 3D: the all-reduce and the stage messages at micro-batch sizes (rows x d_model floats, C/64 .. 2C
    // rows: 8 sizes at C = 512), fitted, and the fields are those fits in the cost model's forms
    assert_non_null(strstr(cli_out, "3D, TP all-reduce"));
    assert_non_null(strstr(cli_out, "3D, stage to stage"));
    const char *f3d[] = {"tp_bw", "tp_lat", "stage_bw", "stage_lat"};
    for (int i = 0; i < 4; i++) {
        char path[96];
        snprintf(path, sizeof path, "profile.fields.%s.measured", f3d[i]);
        assert_true(cJSON_IsTrue(member(root, path)));
    }
    assert_int_equal(cm.derived_3d, 0);
    // two ranks: the ring all-reduce form 2 (W-1)/W bytes / tp_bw + 2 (W-1) tp_lat is bytes / bw + 2 tp_lat
    assert_close(cm.tp_bw, member(root, "profile.3d.tp_allreduce.bw")->valuedouble, 1e-12, 0);
    assert_close(2 * cm.tp_lat, member(root, "profile.3d.tp_allreduce.lat")->valuedouble, 1e-12, 0);
    assert_close(cm.stage_bw, member(root, "profile.3d.stage.bw")->valuedouble, 1e-12, 0);
    assert_close(cm.stage_lat, member(root, "profile.3d.stage.lat")->valuedouble, 1e-12, 0);
    const cJSON *tpp = member(root, "profile.3d.tp_allreduce.points");
    assert_int_equal(cJSON_GetArraySize(tpp), 8);
    assert_int_equal(cJSON_GetArraySize(member(root, "profile.3d.stage.points")), 8);
    // the sizes are rows x d_model floats of tiny, ascending from C/64 = 8 rows
    double row = model_find("tiny")->d_model * 4.0;
    assert_close(cJSON_GetObjectItem(cJSON_GetArrayItem(tpp, 0), "bytes")->valuedouble, 8 * row, 0, 0);
    assert_close(cJSON_GetObjectItem(cJSON_GetArrayItem(tpp, 7), "bytes")->valuedouble, 1024 * row, 0, 0);
    // every rank's runs are in the compute samples: --reps runs x 2 ranks
    const cJSON *p0 = cJSON_GetArrayItem(member(root, "profile.compute.points"), 0);
    assert_int_equal(cJSON_GetArraySize(cJSON_GetObjectItem(p0, "samples")), 2 * profile_reps);
    cJSON_Delete(root);
}

// `mpirun -np 1` starts MPI for one rank: the profile finalizes it and exits 0 (it left MPI
// unfinalized once, and mpirun failed the job although the file had been written). FAST's five
// lengths, not QUICK's three: three points fit three coefficients exactly, noise and all, and a
// loaded machine then fits lin_token <= 0 at any --reps.
static void test_one_rank_under_mpirun_exits_cleanly(void **state) {
    (void)state;
    mpirun_profile("-np 1", FAST, "one-mpi.json");
    assert_non_null(strstr(cli_out, "wrote " DIR "/one-mpi.json"));
    CostModel cm;
    if (cost_load(&cm, DIR "/one-mpi.json") != 0) fail_msg("%s", bs_errmsg());
}

// Bad flags: exit 2, a message naming the problem, nothing measured and nothing written; output paths
// the file system refuses: exit 1, before measuring.
static void test_bad_flags(void **state) {
    (void)state;
    test_tmpdir("cli_profile");
    assert_int_equal(file_write_atomic(DIR "/plain", "x", 1), 0);
    const struct {
        const char *args, *says;
    } bad[] = {
        {"--lengths 0,256,512,1K", "not a length"},
        {"--lengths 256,-5,512,1K", "not a length"},
        {"--lengths 256,x", "not an integer"},
        {"--lengths 256,512", "at least 3"},
        {"--lengths 256,384,512 --holdout 2", "at least 3"},
        {"--lengths 256,512,512,1K", "listed twice"},
        {"--model llama-7b", "not one of the trainer's models"},
        {"--model nope", "not one of the trainer's models"},
        {"--reps 0", "--reps"},
        {"--layers 3,1", "--layers"},
        {"--clock sundial", "not cpu or wall"},
        {"--layers 2", "--layers"},
        {"--holdout -1", "--holdout"},
        {"--tier-bytes 1", "--tier-bytes"},
        // a flag given twice is refused, not last-wins (by its name or an abbreviation of it)
        {"--model tiny --model small", "--model is given twice"},
        {"--out=" DIR "/x.json --out " DIR "/y.json", "--out is given twice"},
        {"--mod tiny --model small", "--model is given twice ('tiny', then 'small')"},
        {"--frobnicate", "unknown flag"},
        {"--model", "needs a value"},
        {"extra", "unexpected argument"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        char args[512];
        snprintf(args, sizeof args, "profile %s", bad[i].args);
        cli_expect(DIR, args, 2, bad[i].says);
    }
    // paths the file system refuses: failures (exit 1), found before measuring (at fast settings, so
    // that a check that came only after the measuring would still end quickly, with output); a missing
    // directory is made only as the last one of a path, never a chain of them
    const struct {
        const char *args, *says;
    } refused[] = {
        {"--out " DIR "/plain/p.json", "is a file, not a directory"},
        {"--out " DIR, "is a directory"},
        {"--out " DIR "/plain", "refusing to overwrite"},
        {QUICK "--offload-dir " DIR "/none", "--offload-dir: " DIR "/none: No such file"},
        {QUICK "--offload-dir " DIR "/plain", "--offload-dir: " DIR "/plain is not a directory"},
        {QUICK "--out " DIR "/a/b/p.json", "neither " DIR "/a/b nor " DIR "/a is a directory"},
        {QUICK "--plot " DIR "/c/d/fig", "neither " DIR "/c/d nor " DIR "/c is a directory"},
        {QUICK "--out " DIR "/e/p.json --plot " DIR "/c/d/fig", "neither " DIR "/c/d nor"},  // e/ not made either
    };
    for (size_t i = 0; i < sizeof refused / sizeof refused[0]; i++) {
        char args[512];
        snprintf(args, sizeof args, "profile %s", refused[i].args);
        cli_expect(DIR, args, 1, refused[i].says);
        if (strstr(cli_out, "wrote ")) fail_msg("profile %s measured and wrote: %s", refused[i].args, cli_out);
    }
    assert_int_equal(access(DIR "/a", F_OK), -1);  // nothing made
    assert_int_equal(access(DIR "/c", F_OK), -1);
    assert_int_equal(access(DIR "/e", F_OK), -1);
    // --plot without gnuplot on the PATH: refused before measuring
    int rc = cli_run(DIR, "PATH=/nonexistent", "profile --plot " DIR "/fig");
    if (rc != 1 || !strstr(cli_err, "--plot needs gnuplot")) fail_msg("no gnuplot: exit %d: %s", rc, cli_err);
    rc = cli_run(DIR, "", "profile --help");
    assert_int_equal(rc, 0);
    assert_non_null(strstr(cli_out, "--lengths LIST"));
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_one_rank_under_mpirun_exits_cleanly),
        cmocka_unit_test(test_bad_flags),
        cmocka_unit_test(test_one_process_file_plan_simulate_plot),
        cmocka_unit_test(test_two_ranks_measure_links),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
