// train.c: `bytescale train` - train a model on a prepared dataset, on one process or on the ranks of
// an MPI job (`mpirun -np N bytescale train ...`; train.h, docs/runtime.md).
#include <getopt.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "bytescale/comm.h"
#include "bytescale/error.h"
#include "bytescale/tokenizer.h"
#include "bytescale/fileio.h"
#include "bytescale/llama.h"
#include "bytescale/model.h"
#include "bytescale/offload.h"
#include "bytescale/policy.h"
#include "bytescale/train.h"
#include "cli/cli.h"
#include "nn/blas_core.h"

static void usage(FILE *f) {
    char trains[256];  // from the table of policies (policy.c), the one list
    policy_names(trains, sizeof trains, POLICY_TRAINS);
    TrainConfig d = train_defaults();
    fprintf(f,
            "usage: bytescale train [flags]\n"
            "\n"
            "Train a LLaMA-style model on a prepared dataset (`bytescale prepare`): every step samples a global\n"
            "batch, plans it with an HDP policy over the job's ranks, runs every rank's packs, rings (ring\n"
            "attention) and all-to-all or hybrid groups (Ulysses attention, a ring of Ulysses groups), and\n"
            "takes a ZeRO-1 AdamW step on the token-level mean loss (docs/training.md,\n"
            "docs/runtime.md). One process, or N ranks: mpirun -np N bytescale train ...\n"
            "\n"
            "settings (kept by a resumed run):\n"
            "  --model NAME         tiny, small or base (default %s)\n"
            "  --tokens N           tokens per step, the global batch (default %lld; suffixes K M G)\n"
            "  --context N          longest sequence: longer documents are cut (default %lld)\n"
            "  --capacity N         C: most tokens one rank holds in a micro-batch; longer sequences train as\n"
            "                       rings over several ranks (default: the context, or what --mem-budget holds)\n"
            "  --policy NAME        one planner of those the engine runs:\n"
            "                       %s (default %s); not wlb (its delay queue needs a data pipeline that\n"
            "                       carries documents to the next step) nor blocks / blocks-all (block\n"
            "                       dispatch, which the engine does not run): plan or simulate those\n"
            "  --lr X               peak learning rate, in (0, 1] (default %g)\n"
            "  --min-lr X           final learning rate of the cosine decay (default: lr / 10)\n"
            "  --warmup N           linear warmup steps (default %lld)\n"
            "  --weight-decay X     AdamW weight decay on matrices, in [0, 1] (default %g)\n"
            "  --clip X             global gradient norm limit, 0 = none (default %g)\n"
            "  --seed N             initial weights and data order (default %llu)\n"
            "\n"
            "the run:\n"
            "  --data DIR           prepared dataset (default %s)\n"
            "  --steps N            train until N steps are done; the LR schedule spans the first run's N\n"
            "                       (default %lld)\n"
            "  --ckpt-dir DIR       write checkpoints DIR/ckpt-NNNNNN.bin, the step in six digits (default: none)\n"
            "  --ckpt-every N       a checkpoint every N steps and at the end (default: at the end only)\n"
            "  --ckpt-keep N        keep the newest N checkpoints this run wrote, 0 = all (default %d)\n"
            "  --metrics PATH       one JSON line per step, with every rank's compute / comm / wait seconds\n"
            "                       (default: none, or PREFIX.jsonl with --plot)\n"
            "  --trace PATH         every rank's timeline as one Chrome-trace JSON (Perfetto, chrome://tracing)\n"
            "  --plot PREFIX        at the end, plot the loss to PREFIX.png and PREFIX.svg (gnuplot)\n"
            "  --offload-tier T     activation offloading: off (default: plans never offload), file or memory\n"
            "                       (plans may offload, and the share r of a stage's layers but its last\n"
            "                       two, of a micro-batch, moves to a file on disk, O_DIRECT, or to host\n"
            "                       memory and back; with --pp every micro-batch in flight on a stage has its\n"
            "                       own place in the tier), or\n"
            "                       resident (the same plans, every byte kept in memory)\n"
            "  --offload-dir DIR    where the file tier makes its file, deleted at once (default: $TMPDIR\n"
            "                       or /tmp)\n"
            "  --mem-budget BYTES   most activation bytes one process may hold at once (suffixes K M G); with\n"
            "                       --pp P, stage s shares it among the P - s micro-batches 1F1B keeps in\n"
            "                       flight there: the capacity becomes the most tokens one such share holds\n"
            "                       without offloading (a smaller --capacity may be given), the planner\n"
            "                       offloads longer sequences within it (Eq. 3), and the engine enforces it\n"
            "                       for every micro-batch (default: none)\n"
            "  --cost FILE          plan with this cost model: a profile of this machine (`bytescale profile`,\n"
            "                       docs/profile.md) or any cost file (default: derived from the model and the\n"
            "                       `cpu` hardware profile)\n"
            "  --save-plans DIR     write every step's plan to DIR/plan-<step>.json (`bytescale simulate --plan`)\n"
            "  --servers N          the last N ranks of the mpirun job are data servers of --data: the\n"
            "                       training ranks fetch only their own token ranges from them (docs/loader.md;\n"
            "                       also `mpirun ... bytescale train ... : -np N bytescale serve --data DIR`);\n"
            "                       with --tp / --pp only tp rank 0 of the first stage (inputs) and of the last\n"
            "                       (targets) fetch, for their tp group; -np is T x P x H + N\n"
            "  --tp T               tensor parallelism: every HDP rank is T processes, each with 1/T of the\n"
            "                       heads, the MLP and the vocabulary (Megatron-style; default 1); the\n"
            "                       backward's all-reduces overlap the weight gradients (BS_TP_OVERLAP=0:\n"
            "                       blocking, the same results, for measuring it)\n"
            "  --pp P               pipeline stages: the layers split over P stages that run each HDP rank's\n"
            "                       micro-batches 1F1B as the planner schedules them (PP-Balance; default 1).\n"
            "                       mpirun -np N with N = T x P x H runs H HDP ranks (docs/runtime.md)\n"
            "  --resume PATH        continue from a checkpoint: its settings, weights, optimizer and data\n"
            "                       position; its run's data, steps, checkpoint and metrics paths unless\n"
            "                       given again. The metrics file drops lines past the checkpoint's step.\n"
            "  --help               this text\n"
            "\n"
            "One process runs packs only: a context above the capacity needs ring attention over >= 2 ranks\n"
            "(mpirun). Checkpoints hold the whole model and optimizer state: a run resumes on any number of\n"
            "ranks and any --tp / --pp. Set\n"
            "OPENBLAS_NUM_THREADS=1 for bit-exact resumes, BS_QUIET=1 to hide the progress line.\n"
            "Exit status: 0 done, 1 a failure (files, data, the run; under mpirun the failing rank ends the job),\n"
            "2 a usage error (bad or conflicting flags, a layout the job's processes do not make).\n",
            d.model, (long long)d.tokens, (long long)d.context, trains, d.policy, d.lr, (long long)d.warmup, d.weight_decay,
            d.clip, (unsigned long long)d.seed, d.data, (long long)d.steps, d.ckpt_keep);
}

static int bad_usage(const char *fmt, const char *arg) { return cli_usage_error("train", fmt, arg); }

// A failure before the ranks exist (exit 1).
_Noreturn static void die(const char *msg) { cli_die("train", "%s", msg); }

enum {
    OPT_MODEL = 1000, OPT_TOKENS, OPT_CONTEXT, OPT_CAPACITY, OPT_POLICY, OPT_LR, OPT_MIN_LR, OPT_WARMUP, OPT_WD,
    OPT_CLIP, OPT_SEED,  // the settings, up to here
    OPT_DATA, OPT_STEPS, OPT_CKPT_DIR, OPT_CKPT_EVERY, OPT_CKPT_KEEP, OPT_METRICS, OPT_TRACE, OPT_OFFLOAD_TIER,
    OPT_OFFLOAD_DIR, OPT_MEM_BUDGET, OPT_COST, OPT_SAVE_PLANS, OPT_SERVERS, OPT_TP, OPT_PP, OPT_PLOT, OPT_RESUME,
    OPT_END
};

static const struct option options[] = {
    {"model", required_argument, NULL, OPT_MODEL},
    {"tokens", required_argument, NULL, OPT_TOKENS},
    {"context", required_argument, NULL, OPT_CONTEXT},
    {"capacity", required_argument, NULL, OPT_CAPACITY},
    {"policy", required_argument, NULL, OPT_POLICY},
    {"lr", required_argument, NULL, OPT_LR},
    {"min-lr", required_argument, NULL, OPT_MIN_LR},
    {"warmup", required_argument, NULL, OPT_WARMUP},
    {"weight-decay", required_argument, NULL, OPT_WD},
    {"clip", required_argument, NULL, OPT_CLIP},
    {"seed", required_argument, NULL, OPT_SEED},
    {"data", required_argument, NULL, OPT_DATA},
    {"steps", required_argument, NULL, OPT_STEPS},
    {"ckpt-dir", required_argument, NULL, OPT_CKPT_DIR},
    {"ckpt-every", required_argument, NULL, OPT_CKPT_EVERY},
    {"ckpt-keep", required_argument, NULL, OPT_CKPT_KEEP},
    {"metrics", required_argument, NULL, OPT_METRICS},
    {"trace", required_argument, NULL, OPT_TRACE},
    {"offload-tier", required_argument, NULL, OPT_OFFLOAD_TIER},
    {"offload-dir", required_argument, NULL, OPT_OFFLOAD_DIR},
    {"mem-budget", required_argument, NULL, OPT_MEM_BUDGET},
    {"cost", required_argument, NULL, OPT_COST},
    {"save-plans", required_argument, NULL, OPT_SAVE_PLANS},
    {"servers", required_argument, NULL, OPT_SERVERS},
    {"tp", required_argument, NULL, OPT_TP},
    {"pp", required_argument, NULL, OPT_PP},
    {"plot", required_argument, NULL, OPT_PLOT},
    {"resume", required_argument, NULL, OPT_RESUME},
    {"help", no_argument, NULL, 'h'},
    {NULL, 0, NULL, 0},
};

static const char *flag_name(int opt) {
    for (const struct option *o = options; o->name; o++)
        if (o->val == opt) return o->name;
    return "?";
}

static int copy_text(char *dst, size_t cap, const char *flag, const char *value) {
    if (strlen(value) >= cap) return bs_fail("%s: the value is too long (at most %zu bytes)", flag, cap - 1);
    memcpy(dst, value, strlen(value) + 1);
    return 0;
}

// Apply one flag's value to c. -1 + error naming the flag.
static int apply(TrainConfig *c, int opt, const char *v) {
    char flag[32];
    snprintf(flag, sizeof flag, "--%s", flag_name(opt));
    int64_t seed;
    switch (opt) {
    case OPT_MODEL: return copy_text(c->model, sizeof c->model, flag, v);
    case OPT_TOKENS: return arg_int64(flag, v, &c->tokens);
    case OPT_CONTEXT: return arg_int64(flag, v, &c->context);
    case OPT_CAPACITY: return arg_int64(flag, v, &c->capacity);
    case OPT_POLICY:
        if (strchr(v, ',') || !strcmp(v, "all") || !strcmp(v, "own") || !strcmp(v, "peers"))
            return bs_fail("--policy %s: a training job runs one policy; lists and the words own, peers and all "
                           "are for plan and simulate, which compare policies",
                           v);
        const Policy *pol = policy_find(v);  // the table says which plans the engine cannot run, and why
        if (pol && pol->no_train) return bs_fail("--policy %s: %s; plan or simulate it instead", v, pol->no_train);
        return copy_text(c->policy, sizeof c->policy, flag, v);
    case OPT_LR: return arg_double(flag, v, &c->lr);
    case OPT_MIN_LR: return arg_double(flag, v, &c->min_lr);
    case OPT_WARMUP: return arg_int64(flag, v, &c->warmup);
    case OPT_WD: return arg_double(flag, v, &c->weight_decay);
    case OPT_CLIP: return arg_double(flag, v, &c->clip);
    case OPT_SEED:
        if (arg_int64(flag, v, &seed) != 0) return -1;
        if (seed < 0) return bs_fail("%s: '%s' must be >= 0", flag, v);
        c->seed = (uint64_t)seed;
        return 0;
    case OPT_DATA: return copy_text(c->data, sizeof c->data, flag, v);
    case OPT_STEPS: return arg_int64(flag, v, &c->steps);
    case OPT_CKPT_DIR: return copy_text(c->ckpt_dir, sizeof c->ckpt_dir, flag, v);
    case OPT_CKPT_EVERY: return arg_int64(flag, v, &c->ckpt_every);
    case OPT_CKPT_KEEP: return arg_int(flag, v, &c->ckpt_keep);
    case OPT_METRICS: return copy_text(c->metrics, sizeof c->metrics, flag, v);
    case OPT_TRACE: return copy_text(c->trace, sizeof c->trace, flag, v);
    case OPT_OFFLOAD_TIER: return copy_text(c->offload_tier, sizeof c->offload_tier, flag, v);
    case OPT_OFFLOAD_DIR: return copy_text(c->offload_dir, sizeof c->offload_dir, flag, v);
    case OPT_MEM_BUDGET: return arg_int64(flag, v, &c->mem_budget);
    case OPT_COST: return copy_text(c->cost, sizeof c->cost, flag, v);
    case OPT_SAVE_PLANS: return copy_text(c->save_plans, sizeof c->save_plans, flag, v);
    case OPT_SERVERS: return 0;  // the job's layout, read in cmd_train
    case OPT_TP:
    case OPT_PP: {
        int *x = opt == OPT_TP ? &c->tp : &c->pp, most = opt == OPT_TP ? 4096 : 256;
        if (arg_int(flag, v, x) != 0) return -1;
        return *x >= 1 && *x <= most ? 0 : bs_fail("%s must be in [1, %d] (got %s)", flag, most, v);
    }
    default: return bs_fail("%s: not a setting", flag);
    }
}

// On resume a settings flag may only repeat the checkpoint's value.
static int same_setting(const TrainConfig *ck, int opt, const char *v, const char *resume) {
    TrainConfig mine = *ck;
    if (apply(&mine, opt, v) != 0) return -1;
    if (opt == OPT_CAPACITY && mine.capacity == 0) mine.capacity = mine.context;  // 0 means the context
    int same = !strcmp(mine.model, ck->model) && !strcmp(mine.policy, ck->policy) && mine.tokens == ck->tokens &&
           mine.context == ck->context && mine.capacity == ck->capacity && mine.lr == ck->lr &&
           mine.min_lr == ck->min_lr && mine.warmup == ck->warmup && mine.weight_decay == ck->weight_decay &&
           mine.clip == ck->clip && mine.seed == ck->seed;
    if (!same)
        return bs_fail("--%s %s differs from checkpoint %s: a resumed run keeps the settings it was started with "
                       "(drop the flag, or start a new run without --resume)",
                       flag_name(opt), v, resume);
    return 0;
}

// The plotting script, looked up in the source tree (file_find_source).
static int find_plot_script(char *out, size_t cap) {
    if (file_find_source("scripts/plot_loss.sh", out, cap) == 0) return 0;
    return bs_fail_ctx("--plot");
}

// gnuplot on the PATH, checked before training so a missing one is not found out hours later.
static int have_gnuplot(void) {
    const char *path = getenv("PATH");
    if (!path) return 0;
    char dir[4096];
    for (const char *p = path; *p;) {
        const char *colon = strchr(p, ':');
        size_t len = colon ? (size_t)(colon - p) : strlen(p);
        if (len > 0 && len < sizeof dir - 16) {
            snprintf(dir, sizeof dir, "%.*s/gnuplot", (int)len, p);
            if (access(dir, X_OK) == 0) return 1;
        }
        p += len + (colon != NULL);
    }
    return 0;
}

static int run_plot(const char *script, const char *metrics, const char *prefix) {
    fflush(stdout);
    pid_t pid = fork();
    if (pid < 0) return bs_fail("--plot: cannot start %s", script);
    if (pid == 0) {
        execl("/bin/sh", "sh", script, metrics, prefix, (char *)NULL);
        _exit(127);
    }
    int st;
    if (waitpid(pid, &st, 0) < 0 || !WIFEXITED(st) || WEXITSTATUS(st) != 0)
        return bs_fail("--plot: %s %s %s failed (its message is above)", script, metrics, prefix);
    return 0;
}

static void fmt_time(char *buf, size_t cap, double s) {
    if (s < 60) snprintf(buf, cap, "%.1fs", s);
    else if (s < 3600) snprintf(buf, cap, "%dm%02ds", (int)s / 60, (int)s % 60);
    else snprintf(buf, cap, "%dh%02dm", (int)s / 3600, ((int)s % 3600) / 60);
}

// The refusal of a context above the capacity where no ring can form (fewer than 2 HDP ranks),
// naming where the two came from: the flags given, the default context, or the checkpoint resumed
// (whose settings a resumed run keeps, so only more ranks help there).
static const char *context_refusal(const TrainConfig *c, int context_given, const char *resume) {
    static char msg[768];
    char ctx[64], cap[64];
    if (resume) snprintf(ctx, sizeof ctx, "the checkpoint's context %lld", (long long)c->context);
    else if (context_given) snprintf(ctx, sizeof ctx, "--context %lld", (long long)c->context);
    else snprintf(ctx, sizeof ctx, "the context %lld (the default)", (long long)c->context);
    if (resume) snprintf(cap, sizeof cap, "its capacity %lld", (long long)c->capacity);
    else snprintf(cap, sizeof cap, "--capacity %lld", (long long)c->capacity);
    snprintf(msg, sizeof msg,
             "%s exceeds %s: a sequence that long trains as a ring over >= 2 HDP ranks, and %s has one (run "
             "mpirun -np N with more ranks)%s",
             ctx, cap, c->tp * c->pp > 1 ? "this job" : "one process",
             resume ? " (a resumed run keeps its checkpoint's settings)" : ", or raise --capacity to the context");
    return msg;
}

// The job's layout against the flags, once the number of training processes n is known: the refusals
// are the command line's (exit 2) and name only the flags in play.
static int check_layout(const TrainConfig *c, int n, int context_given, const char *resume) {
    int tp = c->tp > 1 ? c->tp : 1, pp = c->pp > 1 ? c->pp : 1;
    char lay[64];
    cli_layout_flags(lay, sizeof lay, tp, pp);
    if (n % (tp * pp) != 0)
        return bs_fail("%s needs a multiple of %d processes, and this job has %d: run mpirun -np N with N = %s%s "
                       "x HDP ranks",
                       lay, tp * pp, n, tp > 1 ? "tp" : "pp", tp > 1 && pp > 1 ? " x pp" : "");
    const ModelConfig *mc = model_find(c->model);
    if (!mc || !policy_find(c->policy)) return -1;
    if (pp > mc->n_layers)
        return bs_fail("--pp %d: model %s has %d layers, so at most %d stages", pp, mc->name, mc->n_layers,
                       mc->n_layers);
    LlamaShard whole_tp = {.tp = tp, .tp_rank = 0, .layer_begin = 0, .layer_end = mc->n_layers, .first = 1, .last = 1};
    if (llama_shard_check(mc, &whole_tp) != 0) return bs_fail_ctx("--tp %d", tp);
    int hdp = n / (tp * pp);
    // offloading may let one rank hold it: the trainer decides that with the cost model (exit 1)
    if (c->capacity && c->context > c->capacity && hdp < 2 && strcmp(c->offload_tier, "off") == 0)
        return bs_fail("%s", context_refusal(c, context_given, resume));
    return 0;
}

// End the job with msg; with tp or pp > 1 it names the process's stage, HDP rank and tp rank too.
_Noreturn static void die_at(const Trainer *t, Comm *comm, const char *msg) {
    char buf[2300];
    if (t->par.tp * t->par.pp > 1)
        snprintf(buf, sizeof buf, "stage %d of %d, HDP rank %d, tp rank %d: %s", t->par.stage, t->par.pp,
                 t->hdp_rank, t->par.tp_rank, msg);
    else
        snprintf(buf, sizeof buf, "%s", msg);
    cli_rank_die(comm, "train", buf);
}

#define GIVEN(opt) (given[(opt) - OPT_MODEL])

// The run's settings: the defaults, or what the checkpoint --resume names was made with, then every
// flag given (a resumed run may repeat a setting, not change it). 0, or the usage error's exit
// status; a checkpoint that cannot be read ends the process (exit 1).
static int read_config(TrainConfig *cfg, const char *const *given) {
    const char *plot = GIVEN(OPT_PLOT), *resume = GIVEN(OPT_RESUME);
    *cfg = train_defaults();
    if (resume) {
        if (train_read_config(resume, cfg) != 0) die(bs_errmsg());
        // a resumed run writes its checkpoints where it was resumed from, unless told otherwise
        char dir[TRAIN_PATH_MAX];
        snprintf(dir, sizeof dir, "%s", resume);
        char *slash = strrchr(dir, '/');
        if (slash) *slash = '\0';
        else snprintf(dir, sizeof dir, ".");
        if (!GIVEN(OPT_CKPT_DIR)) snprintf(cfg->ckpt_dir, sizeof cfg->ckpt_dir, "%s", dir);
    } else if (GIVEN(OPT_LR) && !GIVEN(OPT_MIN_LR)) {
        if (arg_double("--lr", GIVEN(OPT_LR), &cfg->lr) != 0) return bad_usage("%s", bs_errmsg());
        cfg->min_lr = cfg->lr / 10;
    }
    for (int opt = OPT_MODEL; opt < OPT_END; opt++) {
        const char *v = GIVEN(opt);
        if (!v || opt == OPT_PLOT || opt == OPT_RESUME) continue;
        int rc = resume && opt <= OPT_SEED ? same_setting(cfg, opt, v, resume) : apply(cfg, opt, v);
        if (rc != 0) return bad_usage("%s", bs_errmsg());
    }
    if (plot && !cfg->metrics[0]) {
        if (strlen(plot) + 7 > sizeof cfg->metrics) return bad_usage("--plot: '%s' is too long", plot);
        snprintf(cfg->metrics, sizeof cfg->metrics, "%s.jsonl", plot);
    }
    if (train_config_check(cfg) != 0) return bad_usage("%s", bs_errmsg());
    return 0;
}

// --plot PREFIX: the plotting script and gnuplot are found, and the pictures' paths checked, now
// rather than after the run; the pictures replace only pictures, in a directory that takes them.
// A failure ends the process (exit 1).
static void check_plot(const char *plot, char *script, size_t cap) {
    if (find_plot_script(script, cap) != 0) die(bs_errmsg());
    if (!have_gnuplot())
        die("--plot needs gnuplot, which is not on the PATH (apt-get install gnuplot-nox), or drop --plot");
    char png[TRAIN_PATH_MAX + 8], svg[TRAIN_PATH_MAX + 8];
    snprintf(png, sizeof png, "%s.png", plot);
    snprintf(svg, sizeof svg, "%s.svg", plot);
    if (train_check_output(png, "--plot", "\x89PNG") != 0 || train_check_output(svg, "--plot", "<?xml") != 0)
        die(bs_errmsg());
}

// --servers N (0 when not given): data servers are ranks of an MPI job. 0, or the usage error's
// exit status.
static int read_servers(const char *const *given, int *n_servers) {
    *n_servers = 0;
    if (!GIVEN(OPT_SERVERS)) return 0;
    if (arg_int("--servers", GIVEN(OPT_SERVERS), n_servers) != 0) return bad_usage("%s", bs_errmsg());
    if (*n_servers < 1 || *n_servers > COMM_MAX_SERVERS)
        return bad_usage("--servers %s: want 1 .. 64 data servers", GIVEN(OPT_SERVERS));
    if (!comm_launched_by_mpi())
        return bad_usage("--servers %s: data servers are ranks of an MPI job: run under mpirun with more ranks "
                         "than servers",
                         GIVEN(OPT_SERVERS));
    return 0;
}

// Rank 0's account of the run before it starts: the model and data, the matmuls, the data servers,
// the layout and stages, the schedule, offloading and the memory budget.
static void print_setup(const Trainer *t, const TrainConfig *cfg, const CommRoles *roles, const char *resume) {
    const DocIndex *ix = &t->data.index;
    char share[96] = "";
    if (t->par.tp * t->par.pp > 1)  // rank 0's shard: stage 0's layers, tp rank 0's share of them
        snprintf(share, sizeof share, ", %.2fM on this process", (double)t->llama.n_params / 1e6);
    printf("train: model %s (%.2fM parameters%s, vocabulary %d: the dataset's %s tokenizer), data %s (%lld "
           "documents, %lld tokens)\n",
           t->model.name, (double)model_params_total(&t->model) / 1e6, share, t->model.vocab_size,
           tokenizer_kind_name(ix->tokenizer), cfg->data, (long long)ix->n_docs, (long long)ix->n_tokens);
    char blas[256];
    blas_core_describe(blas, sizeof blas);
    printf("train: matmuls: %s per rank\n", blas);
    if (t->roles) {
        printf("train: %d data server%s (world rank%s", roles->n_servers, roles->n_servers > 1 ? "s" : "",
               roles->n_servers > 1 ? "s" : "");
        for (int i = 0; i < roles->n_servers && i < COMM_MAX_SERVERS; i++)
            printf("%s %d", i ? "," : "", roles->servers[i]);
        if (t->par.tp * t->par.pp == 1) printf("); this rank schedules, every rank fetches its own token ranges\n");
        else printf("); this rank schedules; tp rank 0 of the first stage fetches its inputs and of the last stage "
                    "its targets, for its tp group; middle stages fetch nothing\n");
    }
    if (t->n_ranks > 1) {
        char line[512];
        parallel_describe(&t->par, line, sizeof line);
        printf("train: %s\n", line);
        for (int s = 0; s < t->par.pp && t->par.pp > 1; s++)
            printf("train: stage %d: layers %d..%d%s%s\n", s, t->par.stage_begin[s], t->par.stage_begin[s + 1] - 1,
                   s == 0 ? " + embedding" : "", s == t->par.pp - 1 ? " + head + loss" : "");
    }
    printf("train: %d %srank%s, %lld tokens/step, context %lld, capacity %lld, policy %s, lr %g -> %g (warmup %lld, "
           "schedule %lld steps), steps %lld -> %lld%s%s\n",
           t->hdp, t->par.tp * t->par.pp > 1 ? "HDP " : "", t->hdp > 1 ? "s" : "", (long long)cfg->tokens,
           (long long)cfg->context, (long long)t->capacity, cfg->policy, cfg->lr, cfg->min_lr, (long long)cfg->warmup,
           (long long)t->sched.total_steps, (long long)t->step, (long long)cfg->steps, resume ? ", resumed from " : "",
           resume ? resume : "");
    if (strcmp(cfg->offload_tier, "off") != 0)
        printf("train: offloading: %s%s", t->offloader ? offloader_name(t->offloader) : "resident (no copies)",
               cfg->mem_budget ? "" : "\n");
    if (cfg->mem_budget)
        printf("%sactivation budget %lld bytes per process%s\n",
               strcmp(cfg->offload_tier, "off") != 0 ? ", " : "train: ", (long long)cfg->mem_budget,
               cfg->pp > 1 ? " (shared by the micro-batches in flight on its stage)" : "");
}

// Rank 0's account of the run after it: the steps trained and the files written.
static void print_summary(const Trainer *t, const TrainConfig *cfg, const TrainSummary *sum) {
    int64_t done = sum->last_step - sum->first_step;
    char took[32];
    fmt_time(took, sizeof took, sum->seconds);
    if (done > 0)
        printf("trained steps %lld..%lld: loss %.4f -> %.4f (mean of the last %d: %.4f), %.0f tokens/s, %s\n",
               (long long)sum->first_step + 1, (long long)sum->last_step, sum->first_loss, sum->last_loss,
               done < TRAIN_RECENT_STEPS ? (int)done : TRAIN_RECENT_STEPS, sum->mean_last_loss,
               sum->seconds > 0 ? (double)sum->tokens / sum->seconds : 0, took);
    else
        printf("nothing to do: %lld steps are already done (--steps %lld)\n", (long long)t->step,
               (long long)cfg->steps);
    if (cfg->metrics[0]) printf("metrics: %s\n", cfg->metrics);
    if (sum->last_ckpt[0]) printf("checkpoint: %s\n", sum->last_ckpt);
}

int cmd_train(int argc, char **argv) {
    // a file-size limit (ulimit -f) then fails a write with EFBIG, which the offload tier and the
    // checkpoint writer report with the file named, instead of killing the process with SIGXFSZ
    signal(SIGXFSZ, SIG_IGN);
    const char *given[OPT_END - OPT_MODEL] = {0};  // the value of each flag given, NULL if not
    int got = cli_read_flags(argc, argv, options, OPT_MODEL, given, OPT_END - OPT_MODEL);
    if (got == 1) {
        usage(stdout);
        return 0;
    }
    if (got != 0) return bad_usage("%s", bs_errmsg());
    const char *plot = GIVEN(OPT_PLOT), *resume = GIVEN(OPT_RESUME);
    TrainConfig cfg;
    int n_servers, rc = read_config(&cfg, given);
    if (rc != 0) return rc;
    char script[4200];
    if (plot) check_plot(plot, script, sizeof script);
    if ((rc = read_servers(given, &n_servers)) != 0) return rc;

    // the ranks: MPI when an MPI launcher started us, else this process alone; under MPI every
    // process says its role (the last --servers ranks serve; `bytescale serve` processes of an MPMD
    // job serve too), and the training ranks get their own communicator
    Comm *comm = comm_local();
    CommRoles roles = {0};
    if (comm_launched_by_mpi()) {
        if (comm_mpi_init(&comm, &argc, &argv) != 0) die(bs_errmsg());
        if (n_servers >= comm->size)
            cli_rank_die(comm, "train", "--servers leaves no training rank: run more ranks than data servers");
        int role = comm->rank >= comm->size - n_servers ? COMM_ROLE_SERVER : COMM_ROLE_CLIENT;
        if (comm_mpi_split_roles(comm, role, &roles) != 0) cli_rank_die(comm, "train", bs_errmsg());
        if (role == COMM_ROLE_SERVER) {
            LoaderServeConfig sc;
            serve_defaults(&sc, cfg.data);
            return cmd_serve_role(comm, &sc, &roles);
        }
    }
    int lead = comm->rank == 0;
    if (check_layout(&cfg, comm->size, GIVEN(OPT_CONTEXT) != NULL, resume) != 0)
        cli_rank_usage(comm, "train", bs_errmsg());

    Trainer *t = malloc(sizeof *t);  // large, and it must not move: not on the stack
    if (!t) cli_rank_die(comm, "train", "out of memory");
    if (trainer_init_roles(t, &cfg, comm, &roles) != 0) cli_rank_die(comm, "train", bs_errmsg());
    if (resume && trainer_load(t, resume) != 0) {
        char msg[2048];
        snprintf(msg, sizeof msg, "cannot resume: %s", bs_errmsg());
        die_at(t, comm, msg);
    }
    if (lead) print_setup(t, &cfg, &roles, resume);
    fflush(stdout);

    TrainSummary sum;
    if (trainer_run(t, &sum) != 0) {
        if (sum.last_ckpt[0] && lead) fprintf(stderr, "bytescale train: the newest checkpoint is %s\n", sum.last_ckpt);
        die_at(t, comm, bs_errmsg());
    }
    if (!lead) {  // rank 0 reports and plots
        trainer_free(t);
        free(t);
        comm_mpi_finalize();
        return 0;
    }
    print_summary(t, &cfg, &sum);
    trainer_free(t);
    free(t);
    if (cfg.trace[0]) printf("trace: %s (open in ui.perfetto.dev or chrome://tracing)\n", cfg.trace);
    if (plot) {
        if (run_plot(script, cfg.metrics, plot) != 0) die(bs_errmsg());
        printf("plot: %s.png %s.svg\n", plot, plot);
    }
    if (comm_launched_by_mpi()) comm_mpi_finalize();
    return 0;
}
#undef GIVEN
