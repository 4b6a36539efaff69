// microbatch.c: the rows one rank holds of a plan item, and reading their tokens (microbatch.h).
#include "bytescale/microbatch.h"

#include "bytescale/error.h"
#include "bytescale/shard.h"

static int ds_read(void *ctx, int64_t doc, int64_t src, int64_t n, uint32_t *out, int64_t *got) {
    return dataset_read_span((const Dataset *)ctx, doc, src, n, out, got);
}

TokenSource token_source_dataset(const Dataset *ds) { return (TokenSource){.read = ds_read, .ctx = (void *)ds}; }

// The k-th of the (at most two) chunks member m holds of a segment of len tokens in a ring of D:
// chunk m first, then chunk 2D-1-m. A pack (D = 1) holds the whole segment as one piece.
static int member_pieces(int64_t len, int D, int m, int64_t start[2], int64_t n[2]) {
    if (D == 1) {
        start[0] = 0, n[0] = len;
        return 1;
    }
    plan_chunk(len, D, m, &start[0], &n[0]);
    plan_chunk(len, D, 2 * D - 1 - m, &start[1], &n[1]);
    return 2;
}

int64_t mb_member_rows(const Plan *p, int32_t k, int m) {
    const Item *it = &p->items[k];
    int64_t rows = 0;
    for (int32_t j = 0; j < it->n_segs; j++) {
        int64_t st[2], n[2];
        int pieces = member_pieces(p->segs[it->seg_begin + j].len, it->n_ranks, m, st, n);
        for (int c = 0; c < pieces; c++) rows += n[c];
    }
    return rows;
}

int64_t mb_plan_max_rows(const Plan *p) {
    int64_t most = 0;
    for (int32_t k = 0; k < p->n_items; k++)
        for (int m = 0; m < p->items[k].n_ranks; m++) {
            int64_t r = mb_member_rows(p, k, m);
            if (r > most) most = r;
        }
    return most;
}

void mb_layout(const Plan *p, int32_t k, int m, int32_t *pos, int32_t *seg) {
    const Item *it = &p->items[k];
    int64_t at = 0;
    for (int32_t j = 0; j < it->n_segs; j++) {
        const Segment *sg = &p->segs[it->seg_begin + j];
        int64_t st[2], n[2];
        int pieces = member_pieces(sg->len, it->n_ranks, m, st, n);
        for (int c = 0; c < pieces; c++)
            for (int64_t i = 0; i < n[c]; i++) {
                pos[at] = (int32_t)(sg->start + st[c] + i);
                seg[at] = j;
                at++;
            }
    }
}

// One chunk's rows: tokens [at, at + n) of sequence sq read as `need` asks (mb_read); *labelled +=
// the rows with a label.
static int read_chunk(const Sequence *sq, int64_t at, int64_t n, int need, const TokenSource *src, int32_t *tokens,
                      int32_t *targets, uint32_t *scratch, int64_t *labelled) {
    // the tokens start at the chunk's first (one past its end for the last label); the targets
    // alone start one later: the labels are the chunk's tokens shifted by one
    int64_t from = need == MB_TARGETS ? 1 : 0, count = n + (need & MB_TARGETS ? 1 : 0) - from, got = 0;
    if (need && src->read(src->ctx, sq->id, sq->src + at + from, count, scratch, &got) != 0) return -1;
    // the chunk's own tokens are inside the document; only the one past it may be missing
    if (need && got < n - from) return 1;
    for (int64_t i = 0; i < n; i++) {
        int64_t next = i + 1 - from;  // the label's place in scratch
        tokens[i] = need & MB_TOKENS ? (int32_t)scratch[i] : 0;
        targets[i] = need & MB_TARGETS && next < got ? (int32_t)scratch[next] : -1;
        *labelled += targets[i] >= 0;
    }
    return 0;
}

int mb_read(const Plan *p, int32_t k, int m, int need, const TokenSource *src, int32_t *tokens, int32_t *targets,
            uint32_t *scratch, int64_t *n_targets) {
    const Item *it = &p->items[k];
    int64_t at = 0, labelled = 0;
    for (int32_t j = 0; j < it->n_segs; j++) {
        const Segment *sg = &p->segs[it->seg_begin + j];
        const Sequence *sq = &p->batch.seqs[sg->seq];
        int64_t st[2], n[2];
        int pieces = member_pieces(sg->len, it->n_ranks, m, st, n);
        for (int c = 0; c < pieces; c++) {
            if (n[c] == 0) continue;
            int rc = read_chunk(sq, sg->start + st[c], n[c], need, src, tokens + at, targets + at, scratch, &labelled);
            if (rc < 0)
                return bs_fail_ctx("plan item %d, sequence %d (document %lld), tokens [%lld, %lld)", k, sg->seq,
                                   (long long)sq->id, (long long)(sg->start + st[c]),
                                   (long long)(sg->start + st[c] + n[c]));
            if (rc > 0)
                return bs_fail("plan item %d: document %lld ends before sequence %d's chunk [%lld, %lld) does", k,
                               (long long)sq->id, sg->seq, (long long)(sg->start + st[c]),
                               (long long)(sg->start + st[c] + n[c]));
            at += n[c];
        }
    }
    if (n_targets) *n_targets = labelled;
    return 0;
}

int mb_member_index(const Plan *p, int32_t k, int rank) {
    const Item *it = &p->items[k];
    for (int m = 0; m < it->n_ranks; m++)
        if (p->ranks[it->rank_begin + m] == rank) return m;
    return -1;
}
