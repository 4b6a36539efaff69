// sampler.h: global batches drawn from a document index (docs/architecture.md, "The data path").
//
// Documents are taken in a seeded random order, a fresh order each epoch, until the batch holds
// exactly token_budget tokens. The document that crosses the budget is split: its first part ends
// this batch and the rest begins the next one, so every token of every document is used exactly
// once per epoch and every batch has the same number of tokens. Empty documents are skipped. Then
// batch_cut(max_ctx) cuts long pieces, as pretraining does.
//
// Each Sequence has id = document number, len = tokens, src = global token offset of its first
// token (DocEntry.start + position in the document), which dataset_read_span reads.
//
// The position is a SamplerState of five integers: the trainer checkpoints it and restores it to
// continue the exact same stream. The order of an epoch is a function of (seed, epoch) only, so no
// generator state needs saving.
#ifndef BYTESCALE_SAMPLER_H
#define BYTESCALE_SAMPLER_H

#include <stdint.h>

#include "bytescale/batch.h"
#include "bytescale/shard.h"

typedef struct {
    uint64_t seed;
    int64_t epoch;  // full passes over the documents completed
    int64_t pos;    // next position in this epoch's order
    int64_t taken;  // tokens of the document at pos already used (it was split by the last batch)
    int64_t n_docs; // of the index it was made for, so a state is not restored onto another dataset
} SamplerState;

typedef struct {
    const DocIndex *index;  // not owned
    SamplerState st;
    int64_t *perm;          // (n_docs,) this epoch's order of documents
    int64_t perm_epoch;     // the epoch perm holds; -1 = none yet
} Sampler;

// -1 + error when the index holds no tokens.
int sampler_init(Sampler *s, const DocIndex *ix, uint64_t seed);
void sampler_free(Sampler *s);
// Replace out's contents (out was batch_init'ed) with the next token_budget tokens, cut to
// max_ctx (<= 0: no cut).
int sampler_next(Sampler *s, int64_t token_budget, int64_t max_ctx, GlobalBatch *out);
SamplerState sampler_state(const Sampler *s);
// Continue from a saved position. -1 + error when it does not fit this index.
int sampler_restore(Sampler *s, const SamplerState *st);

#endif
