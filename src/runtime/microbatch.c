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

int mb_read(const Plan *p, int32_t k, int m, const TokenSource *src, int32_t *tokens, int32_t *targets,
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
            // one token past the chunk: the label of its last row (none at the document's end)
            int64_t got;
            if (src->read(src->ctx, sq->id, sq->src + sg->start + st[c], n[c] + 1, scratch, &got) != 0)
                return bs_fail_ctx("plan item %d, sequence %d (document %lld), tokens [%lld, %lld)", k, sg->seq,
                                   (long long)sq->id, (long long)(sg->start + st[c]),
                                   (long long)(sg->start + st[c] + n[c]));
            if (got < n[c])
                return bs_fail("plan item %d: document %lld ends %lld tokens before sequence %d's chunk does", k,
                               (long long)sq->id, (long long)(n[c] - got), sg->seq);
            for (int64_t i = 0; i < n[c]; i++) {
                tokens[at] = (int32_t)scratch[i];
                targets[at] = i + 1 < got ? (int32_t)scratch[i + 1] : -1;
                labelled += targets[at] >= 0;
                at++;
            }
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
