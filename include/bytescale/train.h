// train.h: the training loop (`bytescale train`, `mpirun -np N bytescale train`), docs/training.md
// and docs/runtime.md.
//
// Every step, on every rank of the job (one process is the N = 1 case of the same code):
//   rank 0 samples a global batch and plans it (policy_plan over N ranks) -> the plan is broadcast
//   -> each rank reads only its own rows -> runs its items in global order (packs with local
//   attention, rings with ring attention), accumulating gradients -> reduce-scatter (ZeRO-1) ->
//   global-norm clip -> AdamW on the rank's shard -> all-gather of the parameters.
// The next step's sampling, planning and reading run in a background thread while a step trains.
// The loss is token-level over the GLOBAL batch: every micro-batch's gradient is scaled by
// 1 / (target tokens in the whole batch), so the accumulated gradient is that of the batch's mean
// token loss whatever the plan was.
//
// Checkpoints hold everything a step depends on (parameters, Adam moments and step count, the step,
// the sampler position, the settings and the LR schedule), so a resumed run continues bit for bit.
#ifndef BYTESCALE_TRAIN_H
#define BYTESCALE_TRAIN_H

#include <stdint.h>
#include <stdio.h>

#include <pthread.h>

#include "bytescale/batch.h"
#include "bytescale/comm.h"
#include "bytescale/cost.h"
#include "bytescale/executor.h"
#include "bytescale/parallel.h"
#include "bytescale/pipeline.h"
#include "bytescale/llama.h"
#include "bytescale/loader.h"
#include "bytescale/model.h"
#include "bytescale/optim.h"
#include "bytescale/plan.h"
#include "bytescale/rtrace.h"
#include "bytescale/sampler.h"
#include "bytescale/shard.h"

enum { TRAIN_PATH_MAX = 1024 };
#define TRAIN_MAX_LR 1.0  // the largest peak learning rate train_config_check accepts
enum { TRAIN_RANK_FIELDS = 22 };  // numbers each rank reports per step (train.c run_plan)
enum { TRAIN_TIER_MAX = 16 };

typedef struct {
    // settings: a resumed run must keep them (trainer_load refuses a checkpoint made with others)
    char model[32];           // catalogue name (model.h)
    char policy[24];          // planner (policy.h)
    int64_t tokens;           // global batch: tokens per step
    int64_t context;          // longest sequence: longer documents are cut into pieces this long
    int64_t capacity;         // C: most tokens in one micro-batch; 0 = context
    double lr, min_lr;        // peak and final learning rate
    int64_t warmup;           // linear warmup steps
    int64_t schedule_steps;   // length of the cosine schedule; 0 = steps
    double weight_decay;      // AdamW, matrices only
    double clip;              // global gradient norm limit; 0 disables clipping
    uint64_t seed;            // initial weights and the data order
    // the run: where the data is, how far to go, what to write (free to change on resume)
    char data[TRAIN_PATH_MAX];      // a prepared dataset (`bytescale prepare`)
    int64_t steps;                  // stop when this many steps are done in all
    char ckpt_dir[TRAIN_PATH_MAX];  // "" = no checkpoints
    int64_t ckpt_every;             // a checkpoint every N steps (and at the end); 0 = at the end only
    int ckpt_keep;                  // keep the newest N checkpoints this run wrote; 0 = keep all
    char metrics[TRAIN_PATH_MAX];   // JSONL metrics file; "" = none
    char trace[TRAIN_PATH_MAX];     // Chrome-trace JSON of every rank's timeline; "" = none
    int quiet;                      // no progress line
    // activation memory (docs/training.md, "Offloading"): run options too, not kept by checkpoints
    char offload_tier[TRAIN_TIER_MAX];  // "off": plans never offload (default); "file" / "memory": plans may,
                                        // and r of layers 0 .. L-3 goes to that tier; "resident": plans may,
                                        // but every byte stays in memory (the same plans without copies)
    char offload_dir[TRAIN_PATH_MAX];   // the file tier's directory; "" = $TMPDIR, else /tmp
    int64_t mem_budget;             // activation bytes a rank's micro-batch may hold at once; 0 = no limit
    // the planner's cost model and the plans it made (run options, not kept by checkpoints)
    char cost[TRAIN_PATH_MAX];       // a cost-model or profile file (`bytescale profile`); "" = derived
                                     // from the model and the `cpu` hardware profile
    char save_plans[TRAIN_PATH_MAX]; // write every step's plan there as plan-<step>.json; "" = none
    // the 3D layout (parallel.h; run options: a checkpoint holds the whole model and resumes on any)
    int tp;                          // tensor-parallel processes per HDP rank and stage; 0 or 1 = none
    int pp;                          // pipeline stages; 0 or 1 = none
    int tp_blocking;                 // 1: the backward's tp all-reduces wait at once instead of overlapping the
                                     // weight gradients (for measuring the overlap; BS_TP_OVERLAP=0 in the
                                     // environment does the same); the results are the same bits either way
} TrainConfig;

// data/go-byte, model small, 300 steps of 32K tokens, context 4K, capacity = context, balance,
// lr 1e-3 -> 1e-4 after 20 warmup steps, weight decay 0.1, clip 1.0, seed 1337, checkpoints kept 2.
TrainConfig train_defaults(void);
// -1 + error naming the setting that is out of range.
int train_config_check(const TrainConfig *c);

// One rank's share of a step (the metrics file's "ranks" array).
typedef struct {
    double compute;    // forward + backward work, ring block compute included
    double comm;       // moving data: gradient reduce-scatter + parameter all-gather once every rank arrived
    double wait;       // blocked: on ring messages, on the offload tier, and at the gradient sync for slower ranks
    int32_t items;     // micro-batches run
    int32_t rings;     // of them, ring members
    int64_t tokens;    // rows held
    double ring_bytes; // K/V and dK/dV bytes sent
    double act_peak_bytes;  // most activation bytes resident in one micro-batch (the model's accounting)
    double offload_bytes;   // activation bytes copied out to the offload tier (each also came back)
    double offload_wait;    // seconds blocked on the tier's copies (part of wait)
    double load_bytes;      // token bytes this rank read for the step's rows (from the data servers or
                            // its shards), while the step before it trained
    double load_seconds;    // seconds that reading took (in the prefetch thread: exposed only when the
                            // step had to wait for it, StepStats.data_wait)
    double core_share;      // CPU seconds of the rank's process / wall seconds of its items and sync:
                            // ~1 (or more, with copier threads) when it had its core, below ~0.9 when
                            // other processes took turns on it and its times are not to be trusted
    int stage, tp_rank, hdp_rank;  // where the process sits in the 3D layout (parallel.h)
    double p2p_wait;        // pp > 1: seconds blocked receiving activations / gradients from a neighbouring
                            // stage (part of wait): the pipeline's bubbles and hand-off waits
    double p2p_bytes;       // pp > 1: bytes sent to the neighbouring stages
    double tp_seconds;      // tp > 1: seconds blocked in the tp group's all-reduces (part of compute): the
                            // exposed time; the backward's overlapped sums count only their wait
    double tp_total_seconds;  // tp > 1: seconds from each tp all-reduce's start to its end, hidden or not
    double fetch_bytes;     // token bytes this process received from the data servers for the step's
                            // rows (0 without servers; 0 on a middle stage and on a tp member whose
                            // group's rank 0 fetched for it; docs/loader.md)
} RankTimes;

// What one step did; also one line of the metrics file.
typedef struct {
    int64_t step;         // steps done after this one (1 for the first)
    double loss;          // token-level mean cross-entropy over the global batch
    double lr;            // learning rate this step used
    double grad_norm;     // global gradient norm before clipping
    double clip_scale;    // factor the gradient was multiplied by (1 = not clipped)
    int64_t tokens;       // tokens in the global batch
    int64_t targets;      // of them, tokens with a next token: the loss's denominator
    int64_t seqs;         // sequences in the batch after the context cut
    int64_t longest;      // tokens of its longest sequence
    int32_t items;        // micro-batches this rank ran
    int32_t n_items;      // items in the plan (packs and rings)
    int32_t n_rings;      // of them, rings
    int64_t epoch;        // the sampler's epoch after the step
    double est_seconds;   // the plan's makespan under the cost model ("cpu" profile)
    double seconds;       // wall time of the step
    double tokens_per_s;  // tokens / seconds
    double sync_exposed;  // gradient sync seconds after the last rank arrived (not hidden by compute)
    double data_wait;     // seconds the step waited for its plan and tokens (the prefetch was late)
    int n_ranks;
    const RankTimes *ranks;  // (n_ranks,) owned by the trainer, valid until the next step
} StepStats;

typedef struct Trainer Trainer;

// The next step's plan and rows, prepared by a background thread while this step trains.
typedef struct {
    Trainer *t;
    int64_t read_step;     // read the rows of this step's plan (0 = none)
    int64_t plan_step;     // rank 0: sample and plan this step (0 = none)
    int rc;
    char err[1024];
} Prefetch;

// A trainer points into itself (the sampler reads its dataset's index): do not copy or move one
// after trainer_init.
struct Trainer {
    TrainConfig cfg;
    ModelConfig model;
    Dataset data;
    uint32_t data_fingerprint;  // identifies the dataset in checkpoints (train_data_fingerprint)
    Comm *comm;                 // every training process: comm_local() on one process, MPI under mpirun
    int rank, n_ranks;          // comm->rank, comm->size (processes: tp x pp x hdp)
    Parallel par;               // the 3D layout: this process's stage, HDP rank, TP rank and groups
    int hdp, hdp_rank;          // the plan's ranks (par.hdp) and this process's one among them
    Pipeline pipe;              // pp > 1: this stage's 1F1B executor
    double tp_seconds;          // this step's seconds blocked in tp all-reduces so far (exposed)
    double tp_total_seconds;    // ... and from each one's start to its end (hidden by compute or not)
    CommReq tp_req;             // the model's non-blocking tp sum in flight (llama.h TpOps.start)
    double tp_started;          // when it started
    Sampler sampler;            // rank 0 only: samples every global batch
    Llama llama;
    struct Offloader *offloader;  // the copiers and tier of --offload-tier file|memory; NULL = none
    Zero1 zero;                 // this rank's shard of the parameters and its summed gradient
    AdamW opt;                  // on the shard [zero.begin, zero.end)
    LrSchedule sched;
    CostModel cost;             // for the planner: --cost or cost_derive(model, hw "cpu", 1, 1, n_ranks, C), the
                                // memory terms from the engine (profile_engine_act)
    Executor exec;
    TokenSource tokens;         // this rank reads its rows through it (the dataset's shards; local mode)
    // the remote data loader (loader.h): with data servers in the job, rank 0 is the scheduler (its
    // t->data holds the gathered metadata, no tokens) and every rank fetches its rows from them
    const CommRoles *roles;     // NULL = no servers: every rank reads the dataset's shards itself
    int32_t *doc_server;        // rank 0: (n_docs,) which server holds each document
    LoadPlan load[2];           // slot s % 2: step s's loading plan
    RemoteSource remote;        // the TokenSource's state
    int64_t targets[2];         // slot s % 2: labelled tokens of step s's whole batch (from rank 0)
    double load_seconds[2];     // slot s % 2: time this rank spent reading step s's rows
    double load_start[2];       // slot s % 2: when that reading began (now_seconds)
    double load_bytes[2];       // slot s % 2: token bytes it read for them
    double fetch_bytes[2];      // slot s % 2: of them, received from the data servers by this process
    int64_t capacity;           // C, resolved (cfg.capacity, else what cfg.mem_budget holds, else cfg.context)
    int64_t step;               // steps done
    // the pipeline: slot s % 2 holds step s's plan and rows
    Plan plans[2];
    int64_t plan_of[2];         // which step each slot's plan is (0 = none)
    StepRows rows[2];
    int64_t rows_of[2];         // which step each slot's rows are (0 = none)
    GlobalBatch batch;          // rank 0: the batch being sampled
    uint8_t *wire;              // rank 0: the next step's packed plan
    size_t wire_size;
    int64_t wire_step;          // which step wire holds (0 = none)
    SamplerState before[4];     // rank 0: the sampler's position before sampling step s, at [s % 4]
    int64_t sampled;            // rank 0: the last step sampled (the thread's)
    int64_t planned;            // the last step whose plan was broadcast (the main thread's)
    Prefetch pf;
    pthread_t thread;
    int thread_live;
    RankTimes *times;           // (n_ranks,) the last step's, gathered from every rank
    double *gathered;           // (n_ranks, TRAIN_RANK_FIELDS) what the ranks send to make times
    double trace_origin;        // now_seconds() of the run's start on every rank
    RtTrace *trace;             // NULL = no trace
};

// Check the settings, open the dataset (a missing one says to run `bytescale prepare`), refuse a
// dataset whose vocabulary is not the model's and a context that would need a ring (context > C
// needs >= 2 ranks: mpirun), make the model for C tokens with weights from the seed, the optimizer
// and the sampler, and the offload tier when asked for (a test aid: BS_OFFLOAD_FAIL=write:N or
// read:N makes every rank's N-th copy out / back fail). Step 0. -1 + error; nothing is left
// allocated then.
int trainer_init(Trainer *t, const TrainConfig *cfg);
// The same over the ranks of comm (every rank calls it with the same settings). Rank 0 samples and
// plans every batch and broadcasts the plan; each rank reads only its own rows.
int trainer_init_comm(Trainer *t, const TrainConfig *cfg, Comm *comm);
// The same with data servers in the job (roles from comm_mpi_split_roles, must outlive t): rank 0
// gathers the servers' metadata and schedules; every rank fetches its rows from the servers (the
// dataset directory is theirs, cfg->data names it only in messages). roles NULL or without servers:
// trainer_init_comm.
int trainer_init_roles(Trainer *t, const TrainConfig *cfg, Comm *comm, const CommRoles *roles);
void trainer_free(Trainer *t);

// One step as above; fills *st (may be NULL). -1 + error (a bad plan, an unreadable token range, or
// divergence: a loss or gradient norm that is not finite stops the step before the update, so the
// parameters, moments, step and data position stay those of the last good step).
int trainer_step(Trainer *t, StepStats *st);

// The gradient half of a step on a given batch: zero the gradients, plan b, run this rank's items,
// reduce. Leaves the accumulated gradient of the batch's token-level mean loss in t->llama.grads and
// fills loss, tokens, targets, seqs, longest, items and est_seconds of *st (may be NULL). Parameters,
// optimizer and sampler are untouched. Sequences are (document, length, global offset) as the
// sampler makes them.
int trainer_grad(Trainer *t, const GlobalBatch *b, StepStats *st);
// The same with a plan made elsewhere instead of the trainer's policy (a plan file, a hand-built
// plan of any item kind), the same plan on every rank (nothing is broadcast): *p is moved into the
// trainer and left empty (freed on error too). -1 + error when p is for another number of HDP ranks
// or pipeline stages than the job's, or the job reads from data servers (their loading plan comes
// with a broadcast plan).
int trainer_grad_plan(Trainer *t, Plan *p, StepStats *st);
// trainer_grad_plan, then the optimizer update of trainer_step (clip, AdamW, all-gather; t->step
// advances). The sampler is not used: a run of these steps is not mixed with trainer_step.
int trainer_step_plan(Trainer *t, Plan *p, StepStats *st);

// Target tokens of a batch: every token but a sequence's last has one; the last has one iff its
// document continues past it (the next piece's first token is its label). -1 + error when a
// sequence does not lie inside its document.
int64_t train_count_targets(const DocIndex *ix, const GlobalBatch *b);

// A CRC-32 over what identifies a dataset's contents: tokenizer, vocabulary, every shard's size
// and checksum, every document's place and length.
uint32_t train_data_fingerprint(const DocIndex *ix);

// ---- checkpoints ------------------------------------------------------------------------------------
// Sections (checkpoint.h): "config" (JSON: model shape, settings, dataset identity, the run),
// "state" (step, Adam step count, sampler position, dataset fingerprint: little-endian 64-bit
// words), "params", "adam.m", "adam.v" (fp32 arrays). docs/training.md lists every field.

// Write atomically (temp file + rename).
int trainer_save(const Trainer *t, const char *path);
// Restore a checkpoint into a trainer made with trainer_init: refuses, with a message naming the
// file and the difference, a corrupt or truncated file, another model shape, another dataset or
// other settings; on any refusal the trainer is left exactly as it was.
int trainer_load(Trainer *t, const char *path);
// The TrainConfig a checkpoint was made with (settings and run), to resume it.
int train_read_config(const char *path, TrainConfig *out);

// ---- the whole run ----------------------------------------------------------------------------------
enum { TRAIN_RECENT_STEPS = 10 };  // mean_last_loss averages this many of the run's last steps

typedef struct {
    int64_t first_step, last_step;  // steps done before and after this run
    double first_loss, last_loss;   // loss of this run's first and last step (0 when none ran)
    double mean_last_loss;          // mean loss of this run's last (up to) TRAIN_RECENT_STEPS steps
    int64_t tokens;                 // trained this run
    double seconds;                 // wall time of this run's steps
    char last_ckpt[TRAIN_PATH_MAX]; // newest checkpoint written ("" if none)
} TrainSummary;

// Steps until cfg.steps are done: metrics lines, a progress line with loss, tokens/s and ETA,
// checkpoints every cfg.ckpt_every steps and at the end. A loss that is not finite stops the run
// with an error (the last checkpoint stays). With t->step > 0 (a loaded checkpoint) the metrics
// file keeps its lines up to that step and is appended to; otherwise it is started afresh.
int trainer_run(Trainer *t, TrainSummary *sum);

// ---- what a run writes (train_paths.c) -----------------------------------------------------------
// Checked by trainer_run on rank 0 before the first step: --ckpt-dir is (or is made as) a writable
// directory and locked for this run (<dir>/.lock), with stale ckpt-*.bin.tmp.* files of a killed
// write removed; --metrics is absent or a metrics file (never another file), in a writable
// directory, locked (<metrics>.lock, removed at the end); --trace is absent or a trace.
typedef struct {
    int ckpt_lock, metrics_lock;  // file descriptors holding the locks, -1 = none
    char metrics_lock_path[TRAIN_PATH_MAX + 8];
} TrainPaths;
int train_paths_open(TrainPaths *p, const TrainConfig *c);
void train_paths_close(TrainPaths *p);
// An output file at path: its directory made if needed and writable; the file absent, empty, or
// starting with magic (what the command writes there), never something else. -1 + error naming flag.
int train_check_output(const char *path, const char *flag, const char *magic);
// Whether path holds a metrics file (its first line is a step record) or is empty.
int train_file_is_metrics(const char *path);

// ---- metrics (JSONL, one object per step) -------------------------------------------------------------
// Open path for appending. keep_through < 0: start an empty file. Otherwise keep the lines whose
// "step" is <= keep_through (dropping later ones and any broken line a crash left), rewritten
// atomically, then append. Line-buffered, so every finished step is on disk.
int train_metrics_open(FILE **out, const char *path, int64_t keep_through);
int train_metrics_write(FILE *f, const StepStats *s);

// The checkpoint file name of a step inside dir: <dir>/ckpt-<step, 6 digits>.bin
void train_ckpt_path(char *out, size_t cap, const char *dir, int64_t step);

#endif
