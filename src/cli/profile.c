// profile.c: `bytescale profile` - measure this machine for the cost model and write a profile file
// that `plan --cost` and `simulate --cost` read (profile.h, docs/profile.md). One process measures
// compute, activations and the offload tier; `mpirun -np 2 bytescale profile` also the link between
// two ranks.
#include <errno.h>
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "bytescale/comm.h"
#include "bytescale/error.h"
#include "bytescale/model.h"
#include "bytescale/profile.h"
#include "bytescale/train.h"
#include "cli/cli.h"

static void usage(FILE *f) {
    ProfileConfig d;
    profile_defaults(&d, model_find("small"));
    fprintf(f,
            "usage: bytescale profile [flags]            (links too: mpirun -np 2 bytescale profile [flags])\n"
            "\n"
            "Measure this machine for the cost model (docs/profile.md) and write a profile file that\n"
            "`bytescale plan --cost FILE` and `bytescale simulate --cost FILE` read:\n"
            "  compute       one layer's forward + backward time at each length, on the engine itself (the\n"
            "                difference of two models with --layers A,B layers), fitted to\n"
            "                T(s) = a1 s^2 + b1 s + c -> attn_pair, lin_token, layer_const\n"
            "  ring step     one attention block's forward + backward as a ring step computes it, n x n\n"
            "                rows for n = 16 .. min(C, 1024), full and causal, fitted to attn_step + pairs x\n"
            "                rate -> attn_step (layer_const = c - attn_step: the layer held its block's floor)\n"
            "  activations   one layer's bytes from the engine's accounting -> act_token, act_const\n"
            "  links         ping-pong between ranks 0 and 1 under mpirun -> ring_bw, ring_lat (one process:\n"
            "                the `cpu` profile's, marked \"measured\": false in the file)\n"
            "  offload tier  write and read bandwidth of the file tier (O_DIRECT) -> offload_bw\n"
            "  the rest      kv_token, grad_sync, optimizer, n_layers from the `cpu` hardware profile;\n"
            "                capacity_bytes = n_layers x the measured Act(C)\n"
            "\n"
            "  --model NAME       tiny, small or base, the trainer's models (default small)\n"
            "  --lengths LIST     comma-separated sequence lengths, suffix K allowed (default 256,384,512,768,\n"
            "                     1K,1536,2K,3K,4K,6K,8K)\n"
            "  --reps N           timed runs per length (default %d; the median is used)\n"
            "  --warmup N         untimed runs first (default %d)\n"
            "  --clock cpu|wall   what times a run: the rank thread's CPU clock (default: on a core of its own\n"
            "                     the same as the wall clock, and it leaves out other processes' turns on a\n"
            "                     shared machine) or the wall clock\n"
            "  --layers A,B       layer counts of the two models whose difference is one layer's time x (B-A)\n"
            "                     (default %d,%d)\n"
            "  --holdout K        hold every K-th length (never the shortest or longest) out of the fit and\n"
            "                     report the error there; 0 = fit them all (default %d)\n"
            "  --capacity C       tokens per rank: capacity_bytes = n_layers x Act(C), the largest ring\n"
            "                     message and ring-step block (up to 1K) (default %lld, the trainer's)\n"
            "  --ranks R          HDP ranks for grad_sync and the optimizer (default: the job's ranks under\n"
            "                     mpirun, else %d, one per core of the `cpu` profile)\n"
            "  --p2p-reps N       ping-pong samples per message size (default %d)\n"
            "  --tier-bytes N     bytes written to and read from the tier per pass (default 256M)\n"
            "  --tier-reps N      timed passes over the tier (default %d)\n"
            "  --offload-dir DIR  where the tier's file goes, deleted at once: an existing directory\n"
            "                     (default: $TMPDIR or /tmp)\n"
            "  --out FILE         the profile file (default profile-<model>.json); of the directories of\n"
            "                     --out and --plot only a missing last one is made, and that is said\n"
            "  --plot PREFIX      PREFIX.png, PREFIX.svg and PREFIX.gp: measured and fitted T(s), log-log\n"
            "                     (gnuplot)\n"
            "  --help             this text\n"
            "\n"
            "Every flag and output path is checked before measuring, which takes a while (minutes at the\n"
            "defaults): progress on stderr, BS_QUIET=1 hides it. One BLAS\n"
            "thread per rank; under mpirun, one rank per core. Exit status: 0 done, 1 a measurement\n"
            "failed, 2 bad flags.\n",
            d.reps, d.warmup, d.layers[0], d.layers[1], d.holdout, (long long)d.capacity, d.hdp_ranks, d.p2p_reps,
            d.tier_reps);
}

static int bad_usage(const char *fmt, const char *arg) { return cli_usage_error("profile", fmt, arg); }

enum {
    OPT_MODEL = 1000, OPT_LENGTHS, OPT_REPS, OPT_WARMUP, OPT_CLOCK, OPT_LAYERS, OPT_HOLDOUT, OPT_CAPACITY, OPT_RANKS,
    OPT_P2P_REPS, OPT_TIER_BYTES, OPT_TIER_REPS, OPT_OFFLOAD_DIR, OPT_OUT, OPT_PLOT
};

static const struct option options[] = {
    {"model", required_argument, NULL, OPT_MODEL},
    {"lengths", required_argument, NULL, OPT_LENGTHS},
    {"reps", required_argument, NULL, OPT_REPS},
    {"warmup", required_argument, NULL, OPT_WARMUP},
    {"clock", required_argument, NULL, OPT_CLOCK},
    {"layers", required_argument, NULL, OPT_LAYERS},
    {"holdout", required_argument, NULL, OPT_HOLDOUT},
    {"capacity", required_argument, NULL, OPT_CAPACITY},
    {"ranks", required_argument, NULL, OPT_RANKS},
    {"p2p-reps", required_argument, NULL, OPT_P2P_REPS},
    {"tier-bytes", required_argument, NULL, OPT_TIER_BYTES},
    {"tier-reps", required_argument, NULL, OPT_TIER_REPS},
    {"offload-dir", required_argument, NULL, OPT_OFFLOAD_DIR},
    {"out", required_argument, NULL, OPT_OUT},
    {"plot", required_argument, NULL, OPT_PLOT},
    {"help", no_argument, NULL, 'h'},
    {NULL, 0, NULL, 0},
};

// "256,1K,1536" -> ascending lengths (sorted here; a length twice is an error).
static int parse_lengths(const char *text, ProfileConfig *c) {
    char buf[4096];
    if (strlen(text) >= sizeof buf) return bs_fail("--lengths: the list is too long");
    snprintf(buf, sizeof buf, "%s", text);
    c->n_lengths = 0;
    char *save = NULL;
    for (char *tok = strtok_r(buf, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
        int64_t v = 0;
        if (arg_int64("--lengths", tok, &v) != 0) return -1;
        if (v < 1) return bs_fail("--lengths: %s is not a length (must be >= 1 token)", tok);
        if (c->n_lengths == PROFILE_MAX_LENGTHS) return bs_fail("--lengths: at most %d lengths", PROFILE_MAX_LENGTHS);
        int i = c->n_lengths++;
        for (; i > 0 && c->lengths[i - 1] > v; i--) c->lengths[i] = c->lengths[i - 1];  // insertion sort
        if (i > 0 && c->lengths[i - 1] == v) return bs_fail("--lengths: %s is listed twice", tok);
        c->lengths[i] = v;
    }
    if (c->n_lengths == 0) return bs_fail("--lengths: no length in '%s'", text);
    return 0;
}

static int parse_layers(const char *text, ProfileConfig *c) {
    char extra;
    if (sscanf(text, "%d,%d%c", &c->layers[0], &c->layers[1], &extra) != 2)
        return bs_fail("--layers: '%s' is not two layer counts A,B", text);
    return 0;
}

// The directory a file of --out or --plot goes into: it must exist, or be one directory to make in an
// existing one (`--plot out/fig` makes out/, and says so), never a chain of them: a mistyped path is
// refused before measuring rather than made. to_make: that directory, "" when it exists.
static int output_dir(const char *path, const char *flag, char *to_make, size_t cap) {
    to_make[0] = '\0';
    char dir[PROFILE_PATH_MAX], parent[PROFILE_PATH_MAX];
    snprintf(dir, sizeof dir, "%s", path);
    char *slash = strrchr(dir, '/');
    if (!slash) return 0;  // the current directory
    if (slash == dir) return 0;  // the root
    *slash = '\0';
    struct stat sb;
    if (stat(dir, &sb) == 0) return S_ISDIR(sb.st_mode) ? 0 : bs_fail("%s: %s is a file, not a directory", flag, dir);
    if (errno != ENOENT) return bs_fail("%s: %s: %s", flag, dir, strerror(errno));
    snprintf(parent, sizeof parent, "%s", dir);
    slash = strrchr(parent, '/');
    if (slash == parent) parent[1] = '\0';
    else if (slash) *slash = '\0';
    else snprintf(parent, sizeof parent, ".");
    if (stat(parent, &sb) != 0 || !S_ISDIR(sb.st_mode))
        return bs_fail("%s: neither %s nor %s is a directory: profile makes only the last directory of a path "
                       "(make %s first, or check the path)",
                       flag, dir, parent, parent);
    snprintf(to_make, cap, "%s", dir);
    return 0;
}

// Make the directory output_dir found missing, and say so; another rank of the job (or --out and
// --plot in the same directory) may have made it first.
static int make_output_dir(const char *dir, const char *flag) {
    if (!dir[0]) return 0;
    if (mkdir(dir, 0777) == 0) printf("made the directory %s for %s\n", dir, flag);
    else if (errno != EEXIST) return bs_fail("%s: cannot make the directory %s: %s", flag, dir, strerror(errno));
    return 0;
}

// --offload-dir (or $TMPDIR, or /tmp): an existing directory this process can write into. It is never
// made: the tier's file is temporary, so it goes where files can already go.
static int offload_dir_ok(const char *dir) {
    const char *flag = dir && *dir ? "--offload-dir" : "the offload directory ($TMPDIR or /tmp)";
    if (!dir || !*dir) dir = getenv("TMPDIR");
    if (!dir || !*dir) dir = "/tmp";
    struct stat sb;
    if (stat(dir, &sb) != 0) return bs_fail("%s: %s: %s", flag, dir, strerror(errno));
    if (!S_ISDIR(sb.st_mode)) return bs_fail("%s: %s is not a directory", flag, dir);
    if (access(dir, W_OK | X_OK) != 0) return bs_fail("%s: cannot write into %s: %s", flag, dir, strerror(errno));
    return 0;
}

static int is_trainer_model(const char *name) {
    return !strcmp(name, "tiny") || !strcmp(name, "small") || !strcmp(name, "base");
}

int cmd_profile(int argc, char **argv) {
    const char *given[OPT_PLOT - OPT_MODEL + 1] = {0};
    int got = cli_read_flags(argc, argv, options, OPT_MODEL, given, OPT_PLOT - OPT_MODEL + 1);
    if (got == 1) {
        usage(stdout);
        return 0;
    }
    if (got != 0) return bad_usage("%s", bs_errmsg());
#define GIVEN(opt) (given[(opt) - OPT_MODEL])

    const char *model_name = GIVEN(OPT_MODEL) ? GIVEN(OPT_MODEL) : "small";
    if (!is_trainer_model(model_name))
        return bad_usage("--model: '%s' is not one of the trainer's models (tiny, small, base)", model_name);
    ProfileConfig cfg;
    profile_defaults(&cfg, model_find(model_name));
    int64_t v = 0;
    int rc = 0;
    if (rc == 0 && GIVEN(OPT_LENGTHS)) rc = parse_lengths(GIVEN(OPT_LENGTHS), &cfg);
    if (rc == 0 && GIVEN(OPT_REPS)) rc = arg_int("--reps", GIVEN(OPT_REPS), &cfg.reps);
    if (rc == 0 && GIVEN(OPT_WARMUP)) rc = arg_int("--warmup", GIVEN(OPT_WARMUP), &cfg.warmup);
    if (rc == 0 && GIVEN(OPT_CLOCK)) {
        const char *clk = GIVEN(OPT_CLOCK);
        if (strcmp(clk, "cpu") != 0 && strcmp(clk, "wall") != 0)
            return bad_usage("--clock: '%s' is not cpu or wall", clk);
        cfg.wall_clock = !strcmp(clk, "wall");
    }
    if (rc == 0 && GIVEN(OPT_LAYERS)) rc = parse_layers(GIVEN(OPT_LAYERS), &cfg);
    if (rc == 0 && GIVEN(OPT_HOLDOUT)) rc = arg_int("--holdout", GIVEN(OPT_HOLDOUT), &cfg.holdout);
    if (rc == 0 && GIVEN(OPT_CAPACITY)) rc = arg_int64("--capacity", GIVEN(OPT_CAPACITY), &cfg.capacity);
    if (rc == 0 && GIVEN(OPT_RANKS)) rc = arg_int("--ranks", GIVEN(OPT_RANKS), &cfg.hdp_ranks);
    if (rc == 0 && GIVEN(OPT_P2P_REPS)) rc = arg_int("--p2p-reps", GIVEN(OPT_P2P_REPS), &cfg.p2p_reps);
    if (rc == 0 && GIVEN(OPT_TIER_BYTES) && (rc = arg_int64("--tier-bytes", GIVEN(OPT_TIER_BYTES), &v)) == 0)
        cfg.tier_bytes = v;
    if (rc == 0 && GIVEN(OPT_TIER_REPS)) rc = arg_int("--tier-reps", GIVEN(OPT_TIER_REPS), &cfg.tier_reps);
    if (rc == 0 && GIVEN(OPT_OFFLOAD_DIR)) {
        if (strlen(GIVEN(OPT_OFFLOAD_DIR)) >= sizeof cfg.offload_dir)
            return bad_usage("--offload-dir: '%s' is too long", GIVEN(OPT_OFFLOAD_DIR));
        snprintf(cfg.offload_dir, sizeof cfg.offload_dir, "%s", GIVEN(OPT_OFFLOAD_DIR));
    }
    if (rc == 0) rc = profile_config_check(&cfg);
    if (rc != 0) return bad_usage("%s", bs_errmsg());

    // what it writes, checked now rather than after minutes of measuring
    char out[PROFILE_PATH_MAX];
    if (GIVEN(OPT_OUT)) snprintf(out, sizeof out, "%s", GIVEN(OPT_OUT));
    else snprintf(out, sizeof out, "profile-%s.json", model_name);
    if (strlen(out) + 16 >= sizeof out) return bad_usage("--out: '%s' is too long", out);
    if (offload_dir_ok(cfg.offload_dir) != 0) cli_die("profile", "%s", bs_errmsg());
    const char *plot = GIVEN(OPT_PLOT);
    if (plot && strlen(plot) + 8 >= PROFILE_PATH_MAX) return bad_usage("--plot: '%s' is too long", plot);
    if (plot && system("gnuplot --version >/dev/null 2>&1") != 0)
        cli_die("profile", "--plot needs gnuplot, which is not on the PATH (apt-get install gnuplot-nox), or drop "
                           "--plot");
    // the files' directories: both checked, then one missing at the end of a path made (and said),
    // before anything is measured
    char out_dir[PROFILE_PATH_MAX], plot_dir[PROFILE_PATH_MAX] = "";
    if (output_dir(out, "--out", out_dir, sizeof out_dir) != 0 ||
        (plot && output_dir(plot, "--plot", plot_dir, sizeof plot_dir) != 0) ||
        make_output_dir(out_dir, "--out") != 0 || make_output_dir(plot_dir, "--plot") != 0)
        cli_die("profile", "%s", bs_errmsg());
    if (train_check_output(out, "--out", "{") != 0) cli_die("profile", "%s", bs_errmsg());
    if (plot) {
        char png[PROFILE_PATH_MAX + 8], svg[PROFILE_PATH_MAX + 8], gp[PROFILE_PATH_MAX + 8];
        snprintf(png, sizeof png, "%s.png", plot);
        snprintf(svg, sizeof svg, "%s.svg", plot);
        snprintf(gp, sizeof gp, "%s.gp", plot);
        if (train_check_output(png, "--plot", "\x89PNG") != 0 || train_check_output(svg, "--plot", "<?xml") != 0 ||
            train_check_output(gp, "--plot", "#") != 0)
            cli_die("profile", "%s", bs_errmsg());
    }

    Comm *comm = comm_local();
    if (comm_launched_by_mpi() && comm_mpi_init(&comm, &argc, &argv) != 0) cli_die("profile", "%s", bs_errmsg());
    int lead = comm->rank == 0;
    if (!GIVEN(OPT_RANKS) && comm->size > 1) cfg.hdp_ranks = comm->size;  // the job's ranks
    Profile *p = malloc(sizeof *p);
    if (!p) cli_rank_die(comm, "profile", "out of memory");
    if (profile_run(p, &cfg, comm) != 0) cli_rank_die(comm, "profile", bs_errmsg());
    if (lead) {
        profile_print(stdout, p);
        fflush(stdout);
        if (profile_write(p, out) != 0) cli_rank_die(comm, "profile", bs_errmsg());
        printf("wrote %s (bytescale plan --cost %s, bytescale simulate --cost %s)\n", out, out, out);
        if (plot && profile_plot(p, plot) != 0) {
            fprintf(stderr, "bytescale profile: error: %s\n", bs_errmsg());
            rc = 1;
        } else if (plot) {
            printf("plot: %s.png %s.svg (%s.gp redraws them)\n", plot, plot, plot);
        }
    }
    profile_free(p);
    free(p);
    // MPI was started whenever mpirun launched the job, one rank too (`mpirun -np 1`): finalize it
    // then, or mpirun reports the rank as exiting improperly and fails the job
    if (comm_launched_by_mpi()) comm_mpi_finalize();
    return rc;
#undef GIVEN
}
