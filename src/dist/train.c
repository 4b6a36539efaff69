// train.c: one training step on one process, structured as the HDP executor (see train.h):
// sample -> plan -> this rank's items as packed micro-batches -> accumulate -> reduce -> optimizer.
#include "bytescale/train.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "bytescale/error.h"
#include "bytescale/fileio.h"
#include "bytescale/hw.h"
#include "bytescale/policy.h"
#include "bytescale/timer.h"

TrainConfig train_defaults(void) {
    TrainConfig c;
    memset(&c, 0, sizeof c);
    snprintf(c.model, sizeof c.model, "small");
    snprintf(c.policy, sizeof c.policy, "balance");
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
    return c;
}

int train_config_check(const TrainConfig *c) {
    if (c->tokens < 1) return bs_fail("tokens per step must be >= 1 (got %lld)", (long long)c->tokens);
    if (c->context < 1) return bs_fail("context must be >= 1 token (got %lld)", (long long)c->context);
    if (c->capacity < 0) return bs_fail("capacity must be >= 1 token, or 0 for the context (got %lld)",
                                        (long long)c->capacity);
    int64_t C = c->capacity ? c->capacity : c->context;
    if (C > (1 << 30)) return bs_fail("capacity %lld is too large for one micro-batch (at most 1G tokens)", (long long)C);
    if (c->context > C)
        return bs_fail("context %lld > capacity %lld: a sequence that long needs a ring, and a ring needs >= 2 ranks "
                       "(run under mpirun), or raise the capacity to the context",
                       (long long)c->context, (long long)C);
    if (!(c->lr > 0) || !isfinite(c->lr)) return bs_fail("learning rate must be positive (got %g)", c->lr);
    if (!(c->min_lr >= 0 && c->min_lr <= c->lr))
        return bs_fail("min learning rate must be in [0, lr = %g] (got %g)", c->lr, c->min_lr);
    if (c->warmup < 0) return bs_fail("warmup must be >= 0 steps (got %lld)", (long long)c->warmup);
    if (c->steps < 0) return bs_fail("steps must be >= 0 (got %lld)", (long long)c->steps);
    if (c->schedule_steps < 0) return bs_fail("schedule steps must be >= 0 (got %lld)", (long long)c->schedule_steps);
    if (!(c->weight_decay >= 0) || !isfinite(c->weight_decay))
        return bs_fail("weight decay must be >= 0 (got %g)", c->weight_decay);
    if (!isfinite(c->clip)) return bs_fail("clip must be a finite number (got %g)", c->clip);
    if (c->ckpt_every < 0) return bs_fail("checkpoint interval must be >= 0 steps (got %lld)", (long long)c->ckpt_every);
    if (c->ckpt_keep < 0) return bs_fail("checkpoints to keep must be >= 0 (got %d)", c->ckpt_keep);
    if (c->seed >= (1ull << 53))  // checkpoints and metrics keep it exact as a JSON number
        return bs_fail("seed must be below 2^53 (got %llu)", (unsigned long long)c->seed);
    return 0;
}

// ---- making a trainer ---------------------------------------------------------------------------------

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
    if ((int64_t)ix->vocab != t->model.vocab_size) {
        int rc = bs_fail("dataset %s has a vocabulary of %u tokens (%s tokenizer) but model %s has %d: prepare the "
                         "data with the tokenizer the model was made for (--tokenizer byte for vocab 256)",
                         dir, ix->vocab, ix->tokenizer == TOKENIZER_GPT2 ? "gpt2" : "byte", t->model.name,
                         t->model.vocab_size);
        dataset_close(&t->data);
        memset(&t->data, 0, sizeof t->data);
        return rc;
    }
    t->data_fingerprint = train_data_fingerprint(ix);
    return 0;
}

static int alloc_microbatch(Trainer *t) {
    size_t C = (size_t)t->capacity;
    t->mb_tokens = bs_malloc(C * sizeof(int32_t));
    t->mb_targets = bs_malloc(C * sizeof(int32_t));
    t->mb_pos = bs_malloc(C * sizeof(int32_t));
    t->mb_seg = bs_malloc(C * sizeof(int32_t));
    t->span = bs_malloc((C + 1) * sizeof(uint32_t));
    return t->mb_tokens && t->mb_targets && t->mb_pos && t->mb_seg && t->span ? 0 : -1;
}

int trainer_init(Trainer *t, const TrainConfig *cfg) {
    memset(t, 0, sizeof *t);
    t->cfg = *cfg;
    t->rank = 0;
    t->n_ranks = 1;
    if (train_config_check(cfg) != 0) return -1;
    const ModelConfig *mc = model_find(cfg->model);
    if (!mc) return -1;
    t->model = *mc;
    t->capacity = cfg->capacity ? cfg->capacity : cfg->context;
    if (!policy_find(cfg->policy)) return -1;
    const HardwareProfile *hw = hw_find("cpu");
    if (!hw || cost_derive(&t->cost, mc, hw, 1, 1, t->n_ranks, t->capacity) != 0) return bs_fail_ctx("cost model");
    if (open_dataset(t) != 0) return -1;

    int rc = sampler_init(&t->sampler, &t->data.index, cfg->seed);
    if (rc == 0) rc = batch_init(&t->batch, 64);
    if (rc == 0) rc = alloc_microbatch(t);
    if (rc == 0) rc = llama_init(&t->llama, mc, (int)t->capacity);
    if (rc == 0) {
        llama_init_weights(&t->llama, cfg->seed);
        DecayRange *ranges = bs_malloc((size_t)t->llama.n_tensors * sizeof *ranges);
        rc = ranges ? 0 : -1;
        if (rc == 0) {
            llama_decay_ranges(&t->llama, ranges);
            AdamWConfig ac = adamw_defaults();
            ac.weight_decay = cfg->weight_decay;
            // ZeRO-1 gives each rank a shard; one process owns the whole vector
            rc = adamw_init(&t->opt, &ac, 0, t->llama.n_params, ranges, t->llama.n_tensors);
        }
        free(ranges);
    }
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
    return 0;
}

void trainer_free(Trainer *t) {
    if (t->plan_live) plan_free(&t->plan);
    llama_free(&t->llama);
    adamw_free(&t->opt);
    sampler_free(&t->sampler);
    batch_free(&t->batch);
    if (t->data.index.docs) dataset_close(&t->data);
    free(t->mb_tokens);
    free(t->mb_targets);
    free(t->mb_pos);
    free(t->mb_seg);
    free(t->span);
    memset(t, 0, sizeof *t);
}

// ---- the data -------------------------------------------------------------------------------------------

int64_t train_count_targets(const DocIndex *ix, const GlobalBatch *b) {
    int64_t n = 0;
    for (int64_t i = 0; i < b->n; i++) {
        const Sequence *s = &b->seqs[i];
        if (s->id < 0 || s->id >= ix->n_docs)
            return bs_fail("batch sequence %lld: document %lld out of range [0, %lld)", (long long)i, (long long)s->id,
                           (long long)ix->n_docs);
        const DocEntry *d = &ix->docs[s->id];
        if (s->len < 1 || s->src < d->start || s->src + s->len > d->start + d->len)
            return bs_fail("batch sequence %lld: tokens [%lld, %lld) are not inside document %lld [%lld, %lld)",
                           (long long)i, (long long)s->src, (long long)(s->src + s->len), (long long)s->id,
                           (long long)d->start, (long long)(d->start + d->len));
        n += s->len - 1 + (s->src + s->len < d->start + d->len);
    }
    return n;
}

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

// ---- one step -------------------------------------------------------------------------------------------

// The plan of b for this process: n_ranks = 1, so every item must be a pack of <= C tokens.
static int plan_batch(Trainer *t, const GlobalBatch *b) {
    if (t->plan_live) plan_free(&t->plan);
    t->plan_live = 0;
    PlanConfig pc = {.n_ranks = t->n_ranks, .capacity = t->capacity, .context = t->cfg.context, .pp = 1, .offload = 0};
    for (int64_t i = 0; i < b->n; i++)
        if (b->seqs[i].len > t->capacity)
            return bs_fail("batch sequence %lld has %lld tokens > capacity %lld: it needs a ring, and a ring needs >= 2 "
                           "ranks (run under mpirun)",
                           (long long)i, (long long)b->seqs[i].len, (long long)t->capacity);
    if (policy_plan(&t->plan, t->cfg.policy, b, &pc, &t->cost) != 0) return bs_fail_ctx("planning the batch");
    t->plan_live = 1;
    for (int32_t k = 0; k < t->plan.n_items; k++) {
        const Item *it = &t->plan.items[k];
        if (it->n_ranks != 1 || it->tokens > t->capacity)
            return bs_fail("plan item %d spans %d ranks with %lld tokens: one process runs only packs of <= %lld "
                           "tokens (a ring needs >= 2 ranks: mpirun)",
                           k, it->n_ranks, (long long)it->tokens, (long long)t->capacity);
    }
    return 0;
}

// Fill the micro-batch buffers with one pack: each segment's tokens, labels (one token read past its
// end; none at its document's end), positions within its sequence, and a distinct segment id.
static int build_microbatch(Trainer *t, const Item *it, MicroBatch *mb) {
    const Plan *p = &t->plan;
    int T = 0;
    for (int32_t j = 0; j < it->n_segs; j++) {
        const Segment *sg = &p->segs[it->seg_begin + j];
        const Sequence *sq = &p->batch.seqs[sg->seq];
        int64_t got;
        if (dataset_read_span(&t->data, sq->id, sq->src + sg->start, sg->len + 1, t->span, &got) != 0)
            return bs_fail_ctx("item segment %d (sequence %d)", j, sg->seq);
        if (got < sg->len)
            return bs_fail("sequence %d: document %lld ends %lld tokens early", sg->seq, (long long)sq->id,
                           (long long)(sg->len - got));
        for (int64_t i = 0; i < sg->len; i++) {
            t->mb_tokens[T] = (int32_t)t->span[i];
            t->mb_targets[T] = i + 1 < got ? (int32_t)t->span[i + 1] : -1;
            t->mb_pos[T] = (int32_t)(sg->start + i);
            t->mb_seg[T] = j;
            T++;
        }
    }
    *mb = (MicroBatch){.tokens = t->mb_tokens, .targets = t->mb_targets, .pos = t->mb_pos, .seg = t->mb_seg, .T = T};
    return 0;
}

int trainer_grad(Trainer *t, const GlobalBatch *b, StepStats *st) {
    llama_zero_grad(&t->llama);
    // the loss's denominator comes from the whole batch, before any item runs
    int64_t targets = train_count_targets(&t->data.index, b);
    if (targets < 0) return -1;
    // a batch with no labels at all (only documents' last tokens) contributes no gradient
    float loss_scale = targets > 0 ? (float)(1.0 / (double)targets) : 0.0f;
    if (plan_batch(t, b) != 0) return -1;

    const Plan *p = &t->plan;
    double loss_sum = 0;
    int64_t seen = 0;
    int32_t first = p->rank_begin[t->rank], end = p->rank_begin[t->rank + 1];
    for (int32_t r = first; r < end; r++) {
        int32_t k = p->rank_items[r];
        MicroBatch mb;
        if (build_microbatch(t, &p->items[k], &mb) != 0) return bs_fail_ctx("plan item %d", k);
        double item_loss;
        int64_t n_targets;
        if (llama_forward_backward(&t->llama, &mb, loss_scale, &item_loss, &n_targets) != 0)
            return bs_fail_ctx("plan item %d", k);
        loss_sum += item_loss;
        seen += n_targets;
    }
    if (seen != targets)
        return bs_fail("the micro-batches held %lld labelled tokens but the batch has %lld", (long long)seen,
                       (long long)targets);
    // One process holds the only copy of the gradients, so there is nothing to sum; under MPI this is
    // where the reduce-scatter leaves each rank the summed gradient of its ZeRO-1 shard.

    if (st) {
        int64_t longest = 0;
        for (int64_t i = 0; i < b->n; i++)
            if (b->seqs[i].len > longest) longest = b->seqs[i].len;
        st->loss = targets > 0 ? loss_sum / (double)targets : 0.0;
        st->tokens = b->n_tokens;
        st->targets = targets;
        st->seqs = b->n;
        st->longest = longest;
        st->items = end - first;
        st->est_seconds = p->makespan;
    }
    return 0;
}

int trainer_step(Trainer *t, StepStats *out) {
    double t0 = now_seconds();
    StepStats st;
    memset(&st, 0, sizeof st);
    if (sampler_next(&t->sampler, t->cfg.tokens, t->cfg.context, &t->batch) != 0)
        return bs_fail_ctx("step %lld: sampling", (long long)(t->step + 1));
    if (trainer_grad(t, &t->batch, &st) != 0) return bs_fail_ctx("step %lld", (long long)(t->step + 1));

    // optimizer on this rank's shard; the squared norm would be all-reduced over the shards under MPI
    size_t begin = t->opt.begin, n = t->opt.end - t->opt.begin;
    double sumsq = grad_sumsq(t->llama.grads + begin, n);
    double lr = lr_schedule(&t->sched, t->step);
    st.clip_scale = grad_clip_scale(sumsq, t->cfg.clip, &st.grad_norm);
    adamw_step(&t->opt, t->llama.params + begin, t->llama.grads + begin, (float)lr, (float)st.clip_scale);
    t->step++;

    st.step = t->step;
    st.lr = lr;
    st.epoch = t->sampler.st.epoch;
    st.seconds = now_seconds() - t0;
    st.tokens_per_s = st.seconds > 0 ? (double)st.tokens / st.seconds : 0.0;
    if (out) *out = st;
    return 0;
}
