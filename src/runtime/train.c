// train.c: making a trainer and one training step over the job's ranks (train.h):
// (rank 0) sample -> plan -> broadcast -> this rank's rows -> executor -> ZeRO-1 sync -> optimizer.
// The pipeline that prepares the next step in the background is in train_prefetch.c.
#include "bytescale/train.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "bytescale/error.h"
#include "bytescale/fileio.h"
#include "bytescale/hw.h"
#include "bytescale/offload.h"
#include "bytescale/policy.h"
#include "bytescale/profile.h"
#include "bytescale/progress.h"
#include "bytescale/timer.h"
#include "runtime/train_internal.h"

TrainConfig train_defaults(void) {
    TrainConfig c;
    memset(&c, 0, sizeof c);
    snprintf(c.model, sizeof c.model, "small");
    snprintf(c.policy, sizeof c.policy, "elastic");  // bytescale's best (README, "Which policy")
    snprintf(c.data, sizeof c.data, "data/go-byte");
    c.tokens = 32 << 10;
    c.context = 4 << 10;
    c.capacity = 0;
    c.lr = 1e-3;
    c.min_lr = 1e-4;
    c.warmup = 20;
    c.weight_decay = 0.1;
    c.clip = 1.0;
    c.seed = 1337;
    c.steps = 300;
    c.ckpt_every = 0;
    c.ckpt_keep = 2;
    snprintf(c.offload_tier, sizeof c.offload_tier, "off");
    return c;
}

static int tier_is(const TrainConfig *c, const char *name) { return strcmp(c->offload_tier, name) == 0; }

int train_config_check(const TrainConfig *c) {
    if (c->tokens < 1) return bs_fail("tokens per step must be >= 1 (got %lld)", (long long)c->tokens);
    if (c->context < 1) return bs_fail("context must be >= 1 token (got %lld)", (long long)c->context);
    if (c->capacity < 0) return bs_fail("capacity must be >= 1 token, or 0 for the context (got %lld)",
                                        (long long)c->capacity);
    int64_t C = c->capacity ? c->capacity : c->context;
    if (C > (1 << 30)) return bs_fail("capacity %lld is too large for one micro-batch (at most 1G tokens)", (long long)C);
    // Adam moves a weight by about lr per step whatever the gradient's scale: above 1 every weight
    // leaves its range in a step or two (and 1e39 is infinity in fp32), so such a run can only diverge
    if (!(c->lr > 0 && c->lr <= TRAIN_MAX_LR))
        return bs_fail("learning rate must be in (0, %g] (got %g)", TRAIN_MAX_LR, c->lr);
    if (!(c->min_lr >= 0 && c->min_lr <= c->lr))
        return bs_fail("min learning rate must be in [0, lr = %g] (got %g)", c->lr, c->min_lr);
    if (c->warmup < 0) return bs_fail("warmup must be >= 0 steps (got %lld)", (long long)c->warmup);
    if (c->steps < 0) return bs_fail("steps must be >= 0 (got %lld)", (long long)c->steps);
    if (c->schedule_steps < 0) return bs_fail("schedule steps must be >= 0 (got %lld)", (long long)c->schedule_steps);
    // decoupled decay multiplies weights by (1 - lr * wd) each step: above 1 it flips their sign
    if (!(c->weight_decay >= 0 && c->weight_decay <= 1))
        return bs_fail("weight decay must be in [0, 1] (got %g)", c->weight_decay);
    if (!(c->clip >= 0) || !isfinite(c->clip))
        return bs_fail("clip must be a gradient norm >= 0, 0 for no clipping (got %g)", c->clip);
    if (c->ckpt_every < 0) return bs_fail("checkpoint interval must be >= 0 steps (got %lld)", (long long)c->ckpt_every);
    if (c->ckpt_keep < 0) return bs_fail("checkpoints to keep must be >= 0 (got %d)", c->ckpt_keep);
    if (c->seed >= (1ull << 53))  // checkpoints and metrics keep it exact as a JSON number
        return bs_fail("seed must be below 2^53 (got %llu)", (unsigned long long)c->seed);
    if (!tier_is(c, "off") && !tier_is(c, "file") && !tier_is(c, "memory") && !tier_is(c, "resident"))
        return bs_fail("offload tier must be off, file, memory or resident (got \"%s\")", c->offload_tier);
    if (c->offload_dir[0] && !tier_is(c, "file"))
        return bs_fail("--offload-dir is used only by --offload-tier file, not by --offload-tier %s%s", c->offload_tier,
                       tier_is(c, "off") ? " (the default)" : "");
    if (c->mem_budget < 0) return bs_fail("memory budget must be >= 0 bytes, 0 for none (got %lld)",
                                          (long long)c->mem_budget);
    if (c->tp < 0 || c->tp > 4096) return bs_fail("--tp must be in [1, 4096] (got %d)", c->tp);
    if (c->pp < 0 || c->pp > 256) return bs_fail("--pp must be in [1, 256] (got %d)", c->pp);
    return 0;
}

// ---- making a trainer ---------------------------------------------------------------------------------

// A test aid: BS_OFFLOAD_FAIL=write:N or read:N puts a failing tier around the real one, so the
// tests can see a copy fail on every rank (ENOSPC writing, EIO reading) at a step they choose.
static int wrap_failing_tier(OffloadTier *tier) {
    const char *spec = getenv("BS_OFFLOAD_FAIL");
    if (!spec || !*spec) return 0;
    int n = 0, w = strncmp(spec, "write:", 6) == 0, r = strncmp(spec, "read:", 5) == 0;
    if (w || r) n = atoi(spec + (w ? 6 : 5));
    if (n < 1) {
        offload_tier_close(tier);
        return bs_fail("BS_OFFLOAD_FAIL=%s: expected write:N or read:N with N >= 1", spec);
    }
    OffloadTier inner = *tier;
    return offload_tier_failing(tier, inner, w ? 'w' : 'r', n, w ? ENOSPC : EIO);
}

// The budget of one micro-batch: --mem-budget is per process, and a pipeline stage holds the
// micro-batches 1F1B has in flight on it at once, each in an activation set of its own (pipeline.h),
// so each may use its share. Without stages: all of it.
static double micro_batch_budget(const TrainConfig *c, int stage) {
    int pp = c->pp > 1 ? c->pp : 1;
    return (double)c->mem_budget / cost_pipe_in_flight(pp, stage, 0);
}

// The copiers and tier of --offload-tier file|memory, attached to the model (and, through it, to a
// stage's other activation sets, pipeline.c); the budget.
static int open_offload(Trainer *t) {
    const TrainConfig *c = &t->cfg;
    t->llama.act_budget = (size_t)floor(micro_batch_budget(c, t->par.stage));
    if (!tier_is(c, "file") && !tier_is(c, "memory")) return 0;
    OffloadTier tier;
    int rc = tier_is(c, "file") ? offload_tier_file(&tier, c->offload_dir) : offload_tier_memory(&tier);
    if (rc == 0) rc = wrap_failing_tier(&tier);
    if (rc == 0) rc = offloader_init(&t->offloader, tier);
    if (rc != 0) return bs_fail_ctx("--offload-tier %s", c->offload_tier);
    t->llama.offload = t->offloader;
    return 0;
}

// The planner's cost model and the capacity C. The coefficients come from a measured profile
// (--cost) or the `cpu` hardware profile; the memory terms always from this engine's own accounting
// (profile_engine_act), so Eq. 3 counts what the engine holds. A --mem-budget is the paper's device
// memory: C is the most tokens it holds without offloading (unless --capacity sets a smaller C), and
// Eq. 3 offloads only what a longer sequence on fewer ranks must, within that budget, and only where
// the copies hide at the profile's tier bandwidth. The engine enforces the same budget. With pp
// stages the memory terms are one stage's layers (ceil(layers / pp), as the planner's), and the
// budget is shared by the micro-batches in flight on the first stage, which holds the most
// (cost_pipe_in_flight): C is what one of pp such shares holds.
static int plan_cost_model(Trainer *t, const ModelConfig *mc) {
    const TrainConfig *cfg = &t->cfg;
    int tp = cfg->tp > 1 ? cfg->tp : 1, pp = cfg->pp > 1 ? cfg->pp : 1;
    CostModel acts = {.n_layers = mc->n_layers};
    if (profile_engine_act(mc, &acts, NULL, NULL) != 0) return bs_fail_ctx("cost model");
    acts.n_layers = (mc->n_layers + pp - 1) / pp;
    t->capacity = cfg->capacity ? cfg->capacity : cfg->context;
    if (cfg->mem_budget > 0) {
        double share = micro_batch_budget(cfg, 0);
        char per[160] = "";
        if (pp > 1)
            snprintf(per, sizeof per, " (%.0f bytes per micro-batch: stage 0 of %d holds %d at once, each %d layers)",
                     floor(share), pp, cost_pipe_in_flight(pp, 0, 0), acts.n_layers);
        int64_t fit = cost_capacity_for(&acts, share, t->capacity);
        if (fit < 1)
            return bs_fail("--mem-budget %lld bytes%s holds no micro-batch of model %s (one token needs %.0f bytes)",
                           (long long)cfg->mem_budget, per, mc->name, ceil(cost_rank_act(&acts, 1.0, 0.0)));
        if (cfg->capacity && fit < cfg->capacity)
            return bs_fail("--mem-budget %lld bytes%s holds %lld tokens without offloading, less than --capacity %lld "
                           "(which needs %.0f bytes): raise the budget, lower the capacity, or leave --capacity out "
                           "to take it from the budget",
                           (long long)cfg->mem_budget, per, (long long)fit, (long long)cfg->capacity,
                           ceil(cost_rank_act(&acts, (double)cfg->capacity, 0.0)));
        t->capacity = fit;
    }
    CostModel *cm = &t->cost;
    if (cfg->cost[0]) {
        // a measured profile plans this run; one measured for another model would misplan it
        if (cost_load(cm, cfg->cost) != 0) return bs_fail_ctx("--cost");
        if (cm->n_layers != mc->n_layers)
            return bs_fail("--cost %s: the file is for a model of %d layers, model %s has %d (`bytescale profile "
                           "--model %s` makes one)",
                           cfg->cost, cm->n_layers, mc->name, mc->n_layers, mc->name);
        cost_shard(cm, mc, tp, pp);  // one stage's layers, one tp rank's share, its all-reduces
        if (cm->derived_3d && (tp > 1 || pp > 1) && t->comm->rank == 0 && !progress_env_quiet())
            fprintf(stderr, "bytescale train: note: --cost %s has no %s (a profile from before they were measured): "
                    "taken from ring_bw_intra %g bytes/s and ring_lat_intra %g s\n",
                    cfg->cost, cost_derived_3d_fields(cm), cm->ring_bw_intra, cm->ring_lat_intra);
    } else {
        const HardwareProfile *hw = hw_find("cpu");
        if (!hw || cost_derive(cm, mc, hw, tp, pp, t->hdp, t->capacity) != 0) return bs_fail_ctx("cost model");
    }
    cm->act_token = acts.act_token, cm->act_const = acts.act_const;
    cm->act_shared_token = acts.act_shared_token, cm->act_shared_const = acts.act_shared_const;
    cm->capacity_bytes = cost_act_budget(cm, t->capacity);
    return 0;
}

// The split of the layers into stages is known once the groups are made (parallel_open balances
// time, so a stage may hold more than the ceil(layers / pp) C was sized for): every stage's
// micro-batch of C tokens must fit its share of the budget. Every process checks every stage, so
// all refuse together.
static int check_stage_budgets(Trainer *t) {
    const TrainConfig *c = &t->cfg;
    int pp = t->par.pp;
    if (pp < 2 || c->mem_budget <= 0) return 0;
    CostModel acts = t->cost;
    for (int s = 0; s < pp; s++) {
        acts.n_layers = t->par.stage_begin[s + 1] - t->par.stage_begin[s];
        double need = cost_rank_act(&acts, (double)t->capacity, 0.0), share = micro_batch_budget(c, s);
        if (need > share)
            return bs_fail("--mem-budget %lld bytes with --pp %d: stage %d holds %d layers and %d micro-batches at "
                           "once, and one of capacity %lld tokens needs %.0f bytes, more than its share of %.0f: "
                           "raise the budget or lower --capacity",
                           (long long)c->mem_budget, pp, s, acts.n_layers, cost_pipe_in_flight(pp, s, 0),
                           (long long)t->capacity, ceil(need), floor(share));
    }
    return 0;
}

// The model's vocabulary is the dataset's: the tokenizer's ids (byte 256, gpt2 50257, cl100k 100277,
// o200k 200019, hf: the tokenizer.json's highest id + 1), rounded up to a multiple of --tp so that the
// vocabulary-parallel embedding and head split evenly. The catalogue's vocab_size (src/core/model.c)
// only stands where no dataset can be read here (a remote data server's, or none: open_dataset and
// open_remote_dataset say so). The rows past the tokenizer's are ids no document holds.
static void vocab_from_dataset(Trainer *t, int tp) {
    char index[TRAIN_PATH_MAX + 16];
    snprintf(index, sizeof index, "%s/%s", t->cfg.data, INDEX_FILE);
    DocIndex ix;
    if (access(index, R_OK) != 0 || docindex_read(&ix, t->cfg.data) != 0) {
        bs_error_clear();
        return;
    }
    t->model.vocab_size = (int)(((int64_t)ix.vocab + tp - 1) / tp * tp);
    docindex_free(&ix);
}

static int open_dataset(Trainer *t) {
    const char *dir = t->cfg.data;
    char index[TRAIN_PATH_MAX + 16];
    snprintf(index, sizeof index, "%s/%s", dir, INDEX_FILE);
    if (access(dir, F_OK) != 0 || access(index, F_OK) != 0)
        return bs_fail("no prepared dataset in %s (%s not found): run `bytescale prepare` first (it writes "
                       "data/go-byte by default) or pass --data DIR",
                       dir, index);
    if (dataset_open(&t->data, dir) != 0) return bs_fail_ctx("dataset %s", dir);
    const DocIndex *ix = &t->data.index;
    if ((int64_t)ix->vocab > t->model.vocab_size) {
        int rc = bs_fail("dataset %s has a vocabulary of %u tokens (%s tokenizer) but model %s has %d: its ids would "
                         "have no row in the embedding (the dataset changed after training began?)",
                         dir, ix->vocab, tokenizer_kind_name(ix->tokenizer), t->model.name,
                         t->model.vocab_size);
        dataset_close(&t->data);
        memset(&t->data, 0, sizeof t->data);
        return rc;
    }
    // a corpus with no labelled token would "train" on nothing and exit 0; an empty one would leave
    // the sampler nothing to draw
    if (docindex_check_trainable(ix) != 0) {
        dataset_close(&t->data);
        memset(&t->data, 0, sizeof t->data);
        return -1;
    }
    t->data_fingerprint = train_data_fingerprint(ix);
    return 0;
}

// With data servers: rank 0 (the scheduler) gathers their metadata into t->data.index (documents and
// shards, no tokens) and checks it as open_dataset does; every other rank learns what identifies
// the dataset (for checkpoints) and holds no documents. Every rank ends with rank 0's verdict.
static int open_remote_dataset(Trainer *t) {
    enum { MSG = 1024 };
    struct {
        int64_t ok, n_docs, n_tokens, vocab, tokenizer;
        uint32_t fingerprint;
        char msg[MSG];
    } v;
    memset(&v, 0, sizeof v);
    DocIndex *ix = &t->data.index;
    int *fetchers = NULL, n_fetchers = 0;
    if (train_loader_roles(t, &fetchers, &n_fetchers) != 0) return -1;
    if (t->rank == 0) {
        int rc = loader_gather_index(t->roles, fetchers, n_fetchers, ix, &t->doc_server);
        if (rc == 0 && (int64_t)ix->vocab > t->model.vocab_size)
            rc = bs_fail("the data servers' dataset %s has a vocabulary of %u tokens but model %s has %d: prepare the "
                         "data with the tokenizer the model was made for",
                         t->cfg.data, ix->vocab, t->model.name, t->model.vocab_size);
        if (rc == 0) rc = docindex_check_trainable(ix);
        v.ok = rc == 0;
        if (rc == 0) {
            v.n_docs = ix->n_docs, v.n_tokens = ix->n_tokens, v.vocab = ix->vocab, v.tokenizer = ix->tokenizer;
            v.fingerprint = train_data_fingerprint(ix);
        } else {
            snprintf(v.msg, sizeof v.msg, "%s", bs_errmsg());
        }
    }
    free(fetchers);
    if (comm_bcast(t->comm, &v, sizeof v, 0) != 0) return bs_fail_ctx("sharing the dataset's metadata");
    if (!v.ok) {
        if (t->rank == 0) dataset_close(&t->data);
        return bs_fail("%s", v.msg);
    }
    if (t->rank != 0) {  // what checkpoints record of the dataset
        ix->n_docs = v.n_docs, ix->n_tokens = v.n_tokens, ix->vocab = (uint32_t)v.vocab;
        ix->tokenizer = (TokenizerKind)v.tokenizer;
    }
    t->data_fingerprint = v.fingerprint;
    return 0;
}

int trainer_init(Trainer *t, const TrainConfig *cfg) { return trainer_init_comm(t, cfg, comm_local()); }

int trainer_init_comm(Trainer *t, const TrainConfig *cfg, Comm *comm) { return trainer_init_roles(t, cfg, comm, NULL); }

// The tp group's all-reduces for the model's layers (llama.h TpOps), timed for the metrics:
// tp_seconds is the time the model was blocked in them (the exposed part), tp_total_seconds the time
// from each one's start to its end. A blocking one counts in both; the backward's non-blocking sum
// counts its start, progress calls and wait as exposed, start to the wait's end as total.
static int tp_allreduce(void *ctx, float *x, size_t n, int op) {
    Trainer *t = ctx;
    double t0 = now_seconds();
    int rc = comm_allreduce_f32(t->par.tp_comm, x, n, op == LLAMA_TP_MAX ? COMM_MAX : COMM_SUM);
    double dt = now_seconds() - t0;
    t->tp_seconds += dt, t->tp_total_seconds += dt;
    return rc;
}

static int tp_start(void *ctx, float *x, size_t n, int *handle) {
    Trainer *t = ctx;
    if (t->tp_req.active) return bs_fail("a tensor-parallel all-reduce is already in flight");
    double t0 = now_seconds();
    int rc = comm_iallreduce_f32(t->par.tp_comm, x, n, COMM_SUM, &t->tp_req);
    t->tp_started = t0;
    t->tp_seconds += now_seconds() - t0;
    *handle = 0;  // the model has at most one in flight
    return rc;
}

static int tp_progress(void *ctx, int handle) {
    Trainer *t = ctx;
    (void)handle;
    double t0 = now_seconds();
    int done;
    int rc = comm_test(t->par.tp_comm, &t->tp_req, &done);
    t->tp_seconds += now_seconds() - t0;
    return rc;
}

static int tp_wait(void *ctx, int handle) {
    Trainer *t = ctx;
    (void)handle;
    double t0 = now_seconds();
    int rc = comm_wait(t->par.tp_comm, &t->tp_req);
    double t1 = now_seconds();
    t->tp_seconds += t1 - t0, t->tp_total_seconds += t1 - t->tp_started;
    return rc;
}

// Blocking (TrainConfig.tp_blocking, BS_TP_OVERLAP=0): the same MPI_Iallreduce, waited for at once.
// Not MPI_Allreduce: Open MPI may add in another order there (seen with 3 ranks), and the two
// settings are to give the same bits.
static int tp_start_blocking(void *ctx, float *x, size_t n, int *handle) {
    Trainer *t = ctx;
    double t0 = now_seconds();
    int rc = comm_iallreduce_f32(t->par.tp_comm, x, n, COMM_SUM, &t->tp_req);
    if (rc == 0) rc = comm_wait(t->par.tp_comm, &t->tp_req);
    double dt = now_seconds() - t0;
    t->tp_seconds += dt, t->tp_total_seconds += dt;
    *handle = 0;
    return rc;
}

static int tp_wait_done(void *ctx, int handle) {
    (void)ctx, (void)handle;
    return 0;
}

// The model's tp collectives: the backward's sums overlap its weight gradients unless the run
// asked for blocking ones.
static TpOps tp_ops(Trainer *t) {
    const char *env = getenv("BS_TP_OVERLAP");
    if (t->cfg.tp_blocking || (env && !strcmp(env, "0")))
        return (TpOps){.allreduce = tp_allreduce, .start = tp_start_blocking, .wait = tp_wait_done, .ctx = t};
    return (TpOps){.allreduce = tp_allreduce, .start = tp_start, .progress = tp_progress, .wait = tp_wait, .ctx = t};
}

int trainer_init_roles(Trainer *t, const TrainConfig *cfg, Comm *comm, const CommRoles *roles) {
    memset(t, 0, sizeof *t);
    t->cfg = *cfg;
    t->comm = comm;
    t->rank = comm->rank;
    t->n_ranks = comm->size;
    t->roles = roles && roles->n_servers > 0 ? roles : NULL;
    if (t->roles && !t->roles->thread_multiple)
        return bs_fail("the remote data loader fetches from a prefetch thread while rings run, which needs an MPI "
                       "library with MPI_THREAD_MULTIPLE; this one does not provide it");
    if (train_config_check(cfg) != 0) return -1;
    int tp = cfg->tp > 1 ? cfg->tp : 1, pp = cfg->pp > 1 ? cfg->pp : 1;
    if (parallel_layout(&t->par, comm->size, comm->rank, tp, pp) != 0) return -1;
    t->hdp = t->par.hdp;
    t->hdp_rank = t->par.hdp_rank;
    const ModelConfig *mc = model_find(cfg->model);
    if (!mc) return -1;
    t->model = *mc;
    vocab_from_dataset(t, tp);
    mc = &t->model;
    // the layout's limits first, in its own words: the cost model would refuse them too, less clearly
    LlamaShard whole_tp = {.tp = tp, .tp_rank = 0, .layer_begin = 0, .layer_end = mc->n_layers, .first = 1, .last = 1};
    if (pipeline_split_layers(mc->n_layers, pp, NULL, 0, NULL) != 0 || llama_shard_check(mc, &whole_tp) != 0)
        return -1;
    if (plan_cost_model(t, mc) != 0) return -1;
    // one rank holds up to C tokens, more when it offloads (Eq. 3 with D = 1; the planner says
    // whether the copies hide)
    double one_rank = train_plans_offload(cfg) ? cost_max_offload_tokens(&t->cost, t->capacity) : (double)t->capacity;
    if ((double)cfg->context > one_rank && t->hdp < 2) {
        char most[96] = "";
        if (train_plans_offload(cfg)) snprintf(most, sizeof most, " (one rank holds %.0f offloading)", floor(one_rank));
        return bs_fail("context %lld > capacity %lld%s: a sequence that long needs a ring, and a ring needs >= 2 HDP "
                       "ranks (run under mpirun -np N with N = tp x pp x HDP ranks), or raise the capacity to the "
                       "context",
                       (long long)cfg->context, (long long)t->capacity, most);
    }
    if (!policy_find(cfg->policy)) return -1;
    // the groups: collective over comm, so every process makes them before anything can fail alone
    if (parallel_open(&t->par, comm, tp, pp, mc, &t->cost, t->capacity) != 0) return -1;
    if (check_stage_budgets(t) != 0) {
        parallel_close(&t->par);
        return -1;
    }
    if (t->roles ? open_remote_dataset(t) != 0 : open_dataset(t) != 0) {
        parallel_close(&t->par);
        return -1;
    }
    if (!t->roles) t->tokens = token_source_dataset(&t->data);

    // the sampler lives where the documents are: every rank of a local run, the scheduler of a remote one
    int rc = t->data.index.docs ? sampler_init(&t->sampler, &t->data.index, cfg->seed) : 0;
    if (rc == 0) rc = batch_init(&t->batch, 64);
    LlamaShard shard = parallel_shard(&t->par);
    if (rc == 0) rc = llama_init_shard(&t->llama, mc, (int)t->capacity, &shard);
    if (rc == 0) t->llama.tp_ops = tp_ops(t);
    if (rc == 0) rc = open_offload(t);
    // ZeRO-1 over the HDP ranks that hold the same parameters: one stage's, one tp rank's
    if (rc == 0) rc = zero1_init(&t->zero, t->par.hdp_comm, &t->llama);
    if (rc == 0) rc = (t->times = bs_calloc((size_t)t->n_ranks, sizeof *t->times)) ? 0 : -1;
    if (rc == 0)
        rc = (t->gathered = bs_calloc((size_t)t->n_ranks * TRAIN_RANK_FIELDS, sizeof *t->gathered)) ? 0 : -1;
    // a shard's weights are the whole model's for the seed (llama.h): every layout starts alike
    if (rc == 0) llama_init_weights(&t->llama, cfg->seed);
    if (rc == 0) {
        DecayRange *ranges = bs_malloc((size_t)t->llama.n_tensors * sizeof *ranges);
        rc = ranges ? 0 : -1;
        if (rc == 0) {
            llama_decay_ranges(&t->llama, ranges);
            AdamWConfig ac = adamw_defaults();
            ac.weight_decay = cfg->weight_decay;
            // ZeRO-1: this rank's optimizer owns one shard (the whole vector on one process)
            rc = adamw_init(&t->opt, &ac, t->zero.begin, t->zero.end, ranges, t->llama.n_tensors);
        }
        free(ranges);
    }
    executor_init(&t->exec, t->par.hdp_comm, &t->llama);
    t->exec.zero = &t->zero;
    if (rc == 0 && pp > 1) rc = pipeline_init(&t->pipe, &t->exec, &t->par);
    if (rc != 0) {
        bs_fail_ctx("trainer for model %s, capacity %lld", mc->name, (long long)t->capacity);
        trainer_free(t);
        return -1;
    }
    t->sched = (LrSchedule){.max_lr = cfg->lr,
                            .min_lr = cfg->min_lr,
                            .warmup_steps = cfg->warmup,
                            .total_steps = cfg->schedule_steps ? cfg->schedule_steps : cfg->steps};
    t->cfg.schedule_steps = t->sched.total_steps;
    t->trace_origin = now_seconds();
    return 0;
}

void trainer_free(Trainer *t) {
    train_prefetch_stop(t);
    for (int i = 0; i < 2; i++) {
        if (t->plan_of[i]) plan_free(&t->plans[i]);
        step_rows_free(&t->rows[i]);
    }
    pipeline_free(&t->pipe);
    executor_free(&t->exec);
    llama_free(&t->llama);
    offloader_free(t->offloader);
    zero1_free(&t->zero);
    adamw_free(&t->opt);
    sampler_free(&t->sampler);
    batch_free(&t->batch);
    if (t->data.index.docs) dataset_close(&t->data);
    if (train_fetches(t) && loader_client_done(t->roles) != 0) fprintf(stderr, "bytescale: %s\n", bs_errmsg());
    free(t->remote.members);
    free(t->doc_server);
    for (int i = 0; i < 2; i++) load_plan_free(&t->load[i]);
    free(t->remote.ranges);
    free(t->remote.tokens);
    free(t->wire);
    free(t->times);
    free(t->gathered);
    parallel_close(&t->par);
    memset(t, 0, sizeof *t);
}

// ---- the data -------------------------------------------------------------------------------------------

static uint32_t crc_u64(uint32_t crc, uint64_t x) {
    uint8_t b[8];
    for (int i = 0; i < 8; i++) b[i] = (uint8_t)(x >> (8 * i));
    return checksum_crc32(crc, b, 8);
}

uint32_t train_data_fingerprint(const DocIndex *ix) {
    uint32_t crc = 0;
    crc = crc_u64(crc, (uint64_t)ix->tokenizer);
    crc = crc_u64(crc, ix->vocab);
    crc = crc_u64(crc, (uint64_t)ix->n_shards);
    crc = crc_u64(crc, (uint64_t)ix->n_docs);
    crc = crc_u64(crc, (uint64_t)ix->n_tokens);
    for (int s = 0; s < ix->n_shards; s++) {
        crc = crc_u64(crc, (uint64_t)ix->shards[s].n_tokens);
        crc = crc_u64(crc, ix->shards[s].crc);
    }
    for (int64_t d = 0; d < ix->n_docs; d++) {
        crc = crc_u64(crc, (uint64_t)ix->docs[d].start);
        crc = crc_u64(crc, (uint64_t)ix->docs[d].len);
    }
    return crc;
}

// ---- one step ----------------------------------------------------------------------------------------

// Every rank's numbers of the step (mine: TRAIN_RANK_FIELDS of them) gathered into t->times; a rank's
// wait at the sync is how long after it the last one arrived, the rest of its sync is communication.
// *exposed: the longest such communication, the sync the step could not hide.
static int gather_rank_times(Trainer *t, const double *mine, double *exposed_out) {
    double *all = t->gathered;
    if (comm_allgather(t->comm, mine, all, sizeof(double) * TRAIN_RANK_FIELDS) != 0)
        return bs_fail_ctx("gathering step times");
    double last = 0;
    for (int r = 0; r < t->n_ranks; r++)
        if (all[TRAIN_RANK_FIELDS * r + 3] > last) last = all[TRAIN_RANK_FIELDS * r + 3];
    double exposed = 0;
    for (int r = 0; r < t->n_ranks; r++) {
        const double *a = all + TRAIN_RANK_FIELDS * r;
        double sync_wait = last - a[3], comm = a[2] - sync_wait;
        if (comm < 0) comm = 0, sync_wait = a[2];
        if (comm > exposed) exposed = comm;
        t->times[r] = (RankTimes){.compute = a[0],
                                  .comm = comm,
                                  .wait = a[1] + sync_wait,
                                  .items = (int32_t)a[4],
                                  .rings = (int32_t)a[5],
                                  .tokens = (int64_t)a[6],
                                  .ring_bytes = a[7],
                                  .act_peak_bytes = a[8],
                                  .offload_bytes = a[9],
                                  .offload_wait = a[10],
                                  .load_bytes = a[11],
                                  .load_seconds = a[12],
                                  .core_share = a[13],
                                  .stage = (int)a[14],
                                  .tp_rank = (int)a[15],
                                  .hdp_rank = (int)a[16],
                                  .p2p_wait = a[17],
                                  .p2p_bytes = a[18],
                                  .tp_seconds = a[19],
                                  .tp_total_seconds = a[20],
                                  .fetch_bytes = a[21]};
    }
    *exposed_out = exposed;
    return 0;
}

// Run this rank's rows of plan p: gradients of the batch's token-level mean loss, summed over all
// ranks into this rank's ZeRO-1 shard (t->zero.grad); t->llama.grads keeps this rank's own sum.
static int run_plan(Trainer *t, int slot, StepStats *st) {
    const Plan *p = &t->plans[slot];
    const StepRows *rows = &t->rows[slot];
    double w0 = now_seconds(), c0 = process_cpu_seconds();
    llama_zero_grad(&t->llama);
    t->tp_seconds = t->tp_total_seconds = 0;
    // the loss's denominator comes from the whole batch (rank 0 counted it when it planned)
    int64_t targets = t->targets[slot];
    // a batch with no labels at all (only documents' last tokens) contributes no gradient
    float loss_scale = targets > 0 ? (float)(1.0 / (double)targets) : 0.0f;
    ExecStats ex;
    PipeStats ps = {0};
    double loss_sum;
    int rc = t->par.pp > 1 ? pipeline_run(&t->pipe, p, rows, loss_scale, &loss_sum, &ex, &ps)
                           : executor_run(&t->exec, p, rows, loss_scale, &loss_sum, &ex);
    if (rc != 0) return -1;

    // the gradient sync: every rank arrives when its last item is done
    double arrive = now_seconds();
    if (zero1_reduce(&t->zero, t->par.hdp_comm, t->llama.grads) != 0) return bs_fail_ctx("gradient reduce-scatter");
    double synced = now_seconds();
    // the loss lives on the last stage, the same on each of its tp ranks: counted once, by tp rank 0
    int counts = t->par.stage == t->par.pp - 1 && t->par.tp_rank == 0;
    double sums[2] = {counts ? loss_sum : 0.0, counts ? (double)rows->n_targets : 0.0};
    if (comm_allreduce_sum(t->comm, sums, 2) != 0) return bs_fail_ctx("summing the loss");
    if ((int64_t)sums[1] != targets)
        return bs_fail("the micro-batches held %lld labelled tokens but the batch has %lld", (long long)sums[1],
                       (long long)targets);
    if (t->trace) {
        rtrace_add(t->trace, "grad reduce-scatter", "comm", arrive, synced, -1);
    }
    // every rank's times: wait at the sync = how long after this rank the last one arrived
    double mine[TRAIN_RANK_FIELDS] = {ex.seconds - ex.ring_wait - ex.offload_wait,
                                      ex.ring_wait + ex.offload_wait,
                                      synced - arrive,
                                      arrive - t->trace_origin,
                                      ex.items,
                                      ex.rings,
                                      (double)ex.rows,
                                      ex.ring_bytes,
                                      ex.act_peak,
                                      ex.offload_bytes,
                                      ex.offload_wait,
                                      t->load_bytes[slot],
                                      t->load_seconds[slot],
                                      (process_cpu_seconds() - c0) / fmax(now_seconds() - w0, 1e-9),
                                      t->par.stage,
                                      t->par.tp_rank,
                                      t->hdp_rank,
                                      ps.p2p_wait,
                                      ps.p2p_bytes,
                                      t->tp_seconds,
                                      t->tp_total_seconds,
                                      t->fetch_bytes[slot]};
    double exposed = 0;
    if (gather_rank_times(t, mine, &exposed) != 0) return -1;
    if (st) {
        int64_t longest = 0;
        for (int64_t i = 0; i < p->batch.n; i++)
            if (p->batch.seqs[i].len > longest) longest = p->batch.seqs[i].len;
        int32_t rings = 0;
        for (int32_t k = 0; k < p->n_items; k++) rings += p->items[k].n_ranks > 1;
        st->loss = targets > 0 ? sums[0] / (double)targets : 0.0;
        st->tokens = p->batch.n_tokens;
        st->targets = targets;
        st->seqs = p->batch.n;
        st->longest = longest;
        st->items = ex.items;
        st->n_items = p->n_items;
        st->n_rings = rings;
        st->est_seconds = p->makespan;
        st->sync_exposed = exposed;
        st->n_ranks = t->n_ranks;
        st->ranks = t->times;
    }
    return 0;
}

int trainer_grad(Trainer *t, const GlobalBatch *b, StepStats *st) {
    train_prefetch_stop(t);
    // rank 0 plans b and broadcasts the plan, exactly as a step does
    if (t->rank == 0 && train_plan_batch(t, b) != 0) {
        train_bcast_plan_error(t);
        return -1;
    }
    Plan *p = &t->plans[0];
    if (train_bcast_plan(t, 0, 0) != 0) return -1;
    if (train_read_rows(t, 0, 0) != 0) return -1;
    t->plan_of[0] = t->rows_of[0] = 0;  // not a step of the run: the pipeline starts afresh
    StepStats s;
    memset(&s, 0, sizeof s);
    int rc = run_plan(t, 0, &s);
    plan_free(p);
    if (rc == 0 && st) *st = s;
    return rc;
}

int trainer_grad_plan(Trainer *t, Plan *p, StepStats *st) {
    train_prefetch_stop(t);
    if (p->n_ranks != t->hdp || p->pp != t->par.pp || t->roles) {
        int32_t n = p->n_ranks, pp = p->pp;
        plan_free(p);
        if (t->roles)  // the servers' loading plan comes with a broadcast plan only
            return bs_fail("a plan made elsewhere runs on local shards, not with data servers");
        return bs_fail("a plan for %d HDP ranks with pp %d, the job has %d with pp %d", n, pp, t->hdp, t->par.pp);
    }
    if (t->plan_of[0]) plan_free(&t->plans[0]);
    t->plans[0] = *p;
    memset(p, 0, sizeof *p);
    t->plan_of[0] = t->rows_of[0] = 0;  // not a step of the run: the pipeline starts afresh
    t->targets[0] = train_count_targets(&t->data.index, &t->plans[0].batch);
    StepStats s;
    memset(&s, 0, sizeof s);
    int rc = t->targets[0] < 0 ? -1 : train_read_rows(t, 0, 0);
    if (rc == 0) rc = run_plan(t, 0, &s);
    plan_free(&t->plans[0]);
    if (rc == 0 && st) *st = s;
    return rc;
}

// --save-plans: the step's plan as a plan file (docs/plan-format.md), so `bytescale simulate --plan
// --cost` can predict exactly the steps that ran. Written by the planning rank, atomically.
static int save_plan(const Trainer *t, const Plan *p, int64_t step) {
    char path[TRAIN_PATH_MAX + 32];
    snprintf(path, sizeof path, "%s/plan-%06lld.json", t->cfg.save_plans, (long long)step);
    if (plan_write_json(p, path) != 0) return bs_fail_ctx("--save-plans: step %lld", (long long)step);
    return 0;
}

// Step s's update from the reduced gradient shard: clip by the global norm, AdamW on this rank's
// shard, then every rank gets every parameter. Fills step, lr, epoch, grad_norm, clip_scale of *st.
static int apply_update(Trainer *t, int64_t s, StepStats *st) {
    double ts = now_seconds(), sumsq;
    if (zero1_sumsq_global(&t->zero, &t->llama, t->comm, &sumsq) != 0)
        return bs_fail_ctx("step %lld: gradient norm", (long long)s);
    double lr = lr_schedule(&t->sched, t->step);
    st->clip_scale = grad_clip_scale(sumsq, t->cfg.clip, &st->grad_norm);
    // a non-finite loss or gradient would poison every weight and both moments: stop before the
    // update, so the trainer (and any checkpoint written from it) keeps the last good state. Every
    // rank sees the same all-reduced values, so every rank stops here.
    if (!isfinite(st->loss) || !isfinite(st->grad_norm))
        return bs_fail("step %lld: the loss is %g and the gradient norm %g: training diverged; the step's update was "
                       "not applied and the model is as it was after step %lld (try a lower --lr)",
                       (long long)s, st->loss, st->grad_norm, (long long)t->step);
    adamw_step(&t->opt, t->llama.params + t->zero.begin, t->zero.grad, (float)lr, (float)st->clip_scale);
    if (zero1_gather(&t->zero, t->par.hdp_comm, t->llama.params) != 0)
        return bs_fail_ctx("step %lld: parameter all-gather", (long long)s);
    if (t->trace) rtrace_add(t->trace, "optimizer + all-gather", "comm", ts, now_seconds(), s);
    t->step++;
    st->step = t->step;
    st->lr = lr;
    st->epoch = t->rank == 0 ? train_sampler_position(t).epoch : 0;
    return 0;
}

int trainer_step(Trainer *t, StepStats *out) {
    double t0 = now_seconds();
    StepStats st;
    memset(&st, 0, sizeof st);
    int64_t s = t->step + 1;
    // this step's plan and rows (prepared during the last step), and the next step's started
    if (train_prefetch_ready(t, s) != 0) return bs_fail_ctx("step %lld", (long long)s);
    st.data_wait = now_seconds() - t0;
    if (t->trace) rtrace_add(t->trace, "plan + data", "data", t0, now_seconds(), s);
    if (run_plan(t, (int)(s % 2), &st) != 0) return bs_fail_ctx("step %lld", (long long)s);
    if (t->rank == 0 && t->cfg.save_plans[0] && save_plan(t, &t->plans[s % 2], s) != 0) return -1;
    if (apply_update(t, s, &st) != 0) return -1;
    st.seconds = now_seconds() - t0;
    st.tokens_per_s = st.seconds > 0 ? (double)st.tokens / st.seconds : 0.0;
    if (t->trace) rtrace_add(t->trace, "step", "step", t0, now_seconds(), t->step);
    if (out) *out = st;
    return 0;
}

int trainer_step_plan(Trainer *t, Plan *p, StepStats *out) {
    double t0 = now_seconds();
    StepStats st;
    if (trainer_grad_plan(t, p, &st) != 0) return -1;
    if (apply_update(t, t->step + 1, &st) != 0) return -1;
    st.seconds = now_seconds() - t0;
    st.tokens_per_s = st.seconds > 0 ? (double)st.tokens / st.seconds : 0.0;
    if (out) *out = st;
    return 0;
}

