// batch.h: global batches: the sequences one training step consumes (lengths and where their
// tokens live). Read from a file, generated from a named length distribution, or sampled from a
// token shard's document index (src/data).
#ifndef BYTESCALE_BATCH_H
#define BYTESCALE_BATCH_H

#include <stdint.h>

#include "bytescale/rng.h"
#include "bytescale/export.h"

BS_API_BEGIN

typedef struct {
    int64_t id;    // the caller's id: document number, or index in a lengths file (0, 1, ...)
    int64_t len;   // tokens (> 0)
    int64_t src;   // offset of its first token in the token stream; -1 when synthetic
} Sequence;

typedef struct {
    Sequence *seqs;   // (n,)
    int64_t n;
    int64_t n_tokens; // sum of len
    int64_t cap;      // entries allocated in seqs (batch_push grows it); 0 with n > 0 means exactly n
} GlobalBatch;

int batch_init(GlobalBatch *b, int64_t cap_hint);
int batch_push(GlobalBatch *b, int64_t id, int64_t len, int64_t src);
void batch_free(GlobalBatch *b);

// Cut every sequence longer than max_ctx into max_ctx-long pieces (the last one shorter), as
// pretraining does. Each piece keeps the id and advances src. max_ctx <= 0: nothing is cut.
int batch_cut(GlobalBatch *b, int64_t max_ctx);

// Lengths from a file: one integer per line ('#' comments and blank lines allowed), or a JSON
// array of integers, or a JSON object {"lengths": [...]}. -1 + error naming file and line.
// b is an output (initialized here); ids are 0, 1, ... in file order, src = -1.
int batch_read_file(GlobalBatch *b, const char *path);

// A named length distribution: "github", "byted" (fitted to the paper's dataset
// statistics, see docs/datasets.md), "uniform:LO:HI", "lognormal:MU:SIGMA", "fixed:LEN".
typedef struct LengthDist LengthDist;
int dist_parse(LengthDist **out, const char *spec);   // -1 + error listing the valid forms
int64_t dist_sample(const LengthDist *d, Rng *rng);   // one length >= 1
void dist_free(LengthDist *d);

// The bucket table behind "github" and "byted": a length is floor(x), where x falls in bucket i
// with probability mass and has density proportional to x^-a inside [lo, hi) (a = 1: log-uniform).
typedef struct {
    int64_t lo, hi;  // lengths lo .. hi-1
    double mass;     // probability of the bucket
    double a;        // exponent of the density inside the bucket
} DistBucket;
// Number of buckets and *out pointing at them; 0 for the parametric forms (uniform, lognormal, fixed).
int dist_buckets(const LengthDist *d, const DistBucket **out);

// Draw sequences until the token budget is reached (the last one is cut to fit exactly), then
// cut to max_ctx. max_ctx <= 0 means no cut. b is an output; ids 0..n-1 in draw order, src = -1.
int batch_generate(GlobalBatch *b, const char *spec, uint64_t seed, int64_t token_budget, int64_t max_ctx);

BS_API_END

#endif
