// microbatch.h: what one rank holds of one plan item, and where its tokens come from.
//
// A pack is whole segments on one rank. A ring member m of D holds chunks m and 2D-1-m of every
// segment of the item (the symmetric 2D-chunk layout, plan_chunk), so every member holds about 1/D
// of every segment and of its causal-mask area. Each row keeps its global position in its sequence
// (RoPE and the mask) and its segment's index within the item (the mask): then ring attention needs
// nothing but these rows to mask K/V received from the other members.
//
// Labels: the target of a row is the next token of its document. Reading one token past every chunk
// gives the label of the chunk's last row; at the end of a document there is none (-1).
#ifndef BYTESCALE_MICROBATCH_H
#define BYTESCALE_MICROBATCH_H

#include <stdint.h>

#include "bytescale/plan.h"
#include "bytescale/shard.h"

// Where tokens come from: local shards today, a remote data server later (the same call).
typedef struct {
    // Copy tokens [src, src + n) (src a global token offset inside document doc), clipped at the
    // document's end; *got = how many were copied. -1 + error when the range is not in the document.
    int (*read)(void *ctx, int64_t doc, int64_t src, int64_t n, uint32_t *out, int64_t *got);
    void *ctx;
} TokenSource;

// A TokenSource over a prepared dataset's memory-mapped shards (shard.h); ds must outlive it.
TokenSource token_source_dataset(const Dataset *ds);

// Rows member m of item k holds (m = 0 for a pack).
int64_t mb_member_rows(const Plan *p, int32_t k, int m);
// The largest mb_member_rows over every item and member of the plan.
int64_t mb_plan_max_rows(const Plan *p);
// Positions and segment ids of member m's rows: pos, seg (mb_member_rows,).
void mb_layout(const Plan *p, int32_t k, int m, int32_t *pos, int32_t *seg);
// What a process reads of its rows (a pipeline's stages need different parts, docs/loader.md):
// the first stage embeds the tokens, the last stage's loss needs the targets (the next tokens), a
// middle stage neither (its rows' positions and segments come from the plan). One process of
// every stage (pp = 1) needs both: one read of each chunk and the token past it serves both.
enum { MB_TOKENS = 1, MB_TARGETS = 2, MB_BOTH = MB_TOKENS | MB_TARGETS };

// Tokens and targets of member m's rows (mb_member_rows,) through src, what `need` asks for
// (MB_*): a chunk's n tokens and one past it for MB_BOTH; its n tokens for MB_TOKENS (targets -1);
// the n tokens after its first for MB_TARGETS (tokens 0); nothing for 0 (tokens 0, targets -1).
// scratch holds at least the longest chunk + 1 tokens (mb_member_rows + 1 is enough).
// *n_targets = rows with a label (0 without MB_TARGETS). -1 + error naming the item and document
// when a range cannot be read.
int mb_read(const Plan *p, int32_t k, int m, int need, const TokenSource *src, int32_t *tokens, int32_t *targets,
            uint32_t *scratch, int64_t *n_targets);

// This rank's index in item k's ring order, or -1 when it is not a member.
int mb_member_index(const Plan *p, int32_t k, int rank);

#endif
