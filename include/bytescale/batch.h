// batch.h: global batches: the sequences one training step consumes (lengths and where their
// tokens live). Read from a file, generated from a named length distribution, or sampled from a
// token shard's document index (src/data).
#ifndef BYTESCALE_BATCH_H
#define BYTESCALE_BATCH_H

#include <stdint.h>

#include "bytescale/rng.h"

typedef struct {
    int64_t id;    // the caller's id: document number, or line number of a lengths file
    int64_t len;   // tokens (> 0)
    int64_t src;   // offset of its first token in the token stream; -1 when synthetic
} Sequence;

typedef struct {
    Sequence *seqs;   // (n,)
    int64_t n;
    int64_t n_tokens; // sum of len
} GlobalBatch;

int batch_init(GlobalBatch *b, int64_t cap_hint);
int batch_push(GlobalBatch *b, int64_t id, int64_t len, int64_t src);
void batch_free(GlobalBatch *b);

// Cut every sequence longer than max_ctx into max_ctx-long pieces (the last one shorter), as
// pretraining does. Each piece keeps the id and advances src.
int batch_cut(GlobalBatch *b, int64_t max_ctx);

// Lengths from a file: one integer per line ('#' comments and blank lines allowed), or a JSON
// array of integers, or a JSON object {"lengths": [...]}. -1 + error naming file and line.
int batch_read_file(GlobalBatch *b, const char *path);

// A named length distribution: "github", "byted" (fitted to PAPER.md section 7, see
// docs/datasets.md), "uniform:LO:HI", "lognormal:MU:SIGMA", "fixed:LEN".
typedef struct LengthDist LengthDist;
int dist_parse(LengthDist **out, const char *spec);   // -1 + error listing the valid forms
int64_t dist_sample(const LengthDist *d, Rng *rng);   // one length >= 1
void dist_free(LengthDist *d);

// Draw sequences until the token budget is reached (the last one is cut to fit exactly), then
// cut to max_ctx. max_ctx <= 0 means no cut.
int batch_generate(GlobalBatch *b, const char *spec, uint64_t seed, int64_t token_budget, int64_t max_ctx);

#endif
