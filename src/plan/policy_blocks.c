// policy_blocks.c: the block-level peer, MagiAttention's dispatch (FCP's shape) (docs/peers.md,
// "blocks": the source, every choice and tie rule).
//
// A CP group of d ranks runs one micro-batch at a time. Its sequences, packed one after another in
// increasing index, are cut into blocks (the source's chunks) of B tokens of that stream, the last
// shorter; a block that spans the end of one sequence and the start of the next is several segments
// with one owner. The blocks are dispatched over the group's members as MagiAttention's default
// solver (the min-heap) does:
//   - a block's workload is its causal area, the (query, key) pairs of its rows: for each piece of
//     len tokens at `start` of its sequence, len start + len (len + 1) / 2;
//   - blocks go heaviest first (equal areas: the later block first, the source's reversed stable
//     argsort), each to the member with the least area so far (equal: the lower member);
//   - a member holds at most ceil(blocks / d) blocks (the source's limit; a full member leaves the
//     heap) and, ours, at most C tokens (a member without room sits out this block).
// Every member then receives from the owners the K/V blocks its queries see (plan_blocks_loads).
// B = 0 is the source's default, ceil(micro-batch tokens / (8 d)) (8 = its min_chunks_per_rank); a
// given B is capped by that too, as the source caps chunk_size. Ours: the source pads the stream so
// every member holds the same tokens; we do not, and where the blocks of a micro-batch then fit no
// member within C, B halves for that micro-batch until they fit (B = 1 always does: ceil(T / d) <= C).
//
// `blocks`: one dispatch per CP group of the static mesh's d_cp = ceil(context / C) ranks, DP over the
// R / d_cp groups; `blocks-all`: all R ranks are one group. Sequences go to micro-batches as a data
// loader balancing attention area would: largest area first (equal: lower index), each to the
// micro-batch with the least area that has room (d C tokens); the fewest micro-batches, a multiple of
// the groups, that hold the tokens, and G more while a sequence fits nowhere. Micro-batches go to the
// groups in rounds, heaviest first, each to the group with the least area so far (equal: the lower
// group); the global order is round by round.
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "bytescale/error.h"
#include "plan/policy_util.h"

enum { BLOCKS_MIN_PER_RANK = 8 };  // MagiAttention's min_chunks_per_rank default

typedef struct {
    const GlobalBatch *b;
    int64_t C, B;          // capacity; the block size asked for (0: the source's default)
    int32_t d, G;          // members per group, groups
    int32_t M;             // micro-batches
    int32_t *order;        // (n,) sequences by area, largest first
    int32_t *mb;           // (n,) the micro-batch of each sequence
    double *mb_area;       // (M,) causal area of each micro-batch
    int64_t *mb_tokens;    // (M,)
    int32_t *mb_first;     // (M + 1,) its sequences: mb_seqs[mb_first[m] .. mb_first[m + 1])
    int32_t *mb_seqs;      // (n,) by micro-batch, increasing sequence index within one
    Segment *segs;         // (cap_pieces,) the pieces of the chunks being dispatched, in stream order
    int32_t *piece_chunk;  // (cap_pieces,) the chunk of each piece
    int32_t *piece_owner;  // (cap_pieces,) its member, once dispatched
    double *area;          // (cap_chunks,) causal area of each chunk
    int64_t *chunk_len;    // (cap_chunks,) tokens of each chunk
    int32_t *owner;        // (cap_chunks,) the member of each chunk
    int32_t *by_area;      // (cap_chunks,)
    int64_t *held;         // (d,) tokens of each member
    int32_t *count;        // (d,) blocks of each member
    int32_t *aside;        // (d,) members without room for the current block
    int32_t cap_chunks, cap_pieces;
} Blocks;

// A micro-batch of T tokens on d members: its block size, the source's rule.
static int64_t block_size(const Blocks *x, int64_t T) {
    int64_t dflt = (T + (int64_t)BLOCKS_MIN_PER_RANK * x->d - 1) / ((int64_t)BLOCKS_MIN_PER_RANK * x->d);
    if (dflt < 1) dflt = 1;
    return x->B > 0 && x->B < dflt ? x->B : dflt;
}

// Sequences into M micro-batches by area (x->order given). 1: all fit, 0: one fits nowhere, -1 + error.
static int pack_sequences(Blocks *x) {
    RankHeap h;
    int32_t *aside = bs_malloc((size_t)x->M * sizeof(int32_t));
    if (!aside || rankheap_init(&h, x->M) != 0) return free(aside), bs_fail_ctx("blocks"), -1;
    memset(x->mb_area, 0, (size_t)x->M * sizeof(double));
    memset(x->mb_tokens, 0, (size_t)x->M * sizeof(int64_t));
    int ok = 1;
    for (int64_t i = 0; ok && i < x->b->n; i++) {
        int32_t s = x->order[i], n_aside = 0, m = -1;
        int64_t len = x->b->seqs[s].len;
        while (h.n > 0) {
            int32_t t = rankheap_pop(&h);
            if (x->mb_tokens[t] + len <= (int64_t)x->d * x->C) {
                m = t;
                break;
            }
            aside[n_aside++] = t;
        }
        for (int32_t a = 0; a < n_aside; a++) rankheap_push(&h, aside[a], x->mb_area[aside[a]]);
        if (m < 0) {
            ok = 0;
            break;
        }
        x->mb[s] = m;
        x->mb_tokens[m] += len;
        x->mb_area[m] += cost_causal_area(len);
        rankheap_push(&h, m, x->mb_area[m]);
    }
    rankheap_free(&h);
    free(aside);
    return ok;
}

// Grow the chunk and piece arrays to hold n_chunks and n_pieces. -1 + error.
static int reserve_chunks(Blocks *x, int64_t n_chunks, int64_t n_pieces) {
    if (n_chunks > INT32_MAX / 2 || n_pieces > INT32_MAX / 2)
        return bs_fail("blocks: %lld blocks in one micro-batch", (long long)n_chunks);
    if (n_chunks > x->cap_chunks) {
        free(x->area), free(x->chunk_len), free(x->owner), free(x->by_area);
        x->area = bs_malloc((size_t)n_chunks * sizeof(double));
        x->chunk_len = bs_malloc((size_t)n_chunks * sizeof(int64_t));
        x->owner = bs_malloc((size_t)n_chunks * sizeof(int32_t));
        x->by_area = bs_malloc((size_t)n_chunks * sizeof(int32_t));
        x->cap_chunks = (int32_t)n_chunks;
        if (!x->area || !x->chunk_len || !x->owner || !x->by_area) return x->cap_chunks = 0, bs_fail_ctx("blocks");
    }
    if (n_pieces > x->cap_pieces) {
        free(x->segs), free(x->piece_chunk), free(x->piece_owner);
        x->segs = bs_malloc((size_t)n_pieces * sizeof(Segment));
        x->piece_chunk = bs_malloc((size_t)n_pieces * sizeof(int32_t));
        x->piece_owner = bs_malloc((size_t)n_pieces * sizeof(int32_t));
        x->cap_pieces = (int32_t)n_pieces;
        if (!x->segs || !x->piece_chunk || !x->piece_owner) return x->cap_pieces = 0, bs_fail_ctx("blocks");
    }
    return 0;
}

// Cut micro-batch m, its sequences packed one after another, into chunks of B tokens of that stream
// (the last shorter), as the source does: a chunk that spans the end of one sequence and the start
// of the next is several pieces (segments). A chunk's area is its pieces' causal areas, each piece
// against the start of its own sequence. -1 + error on no memory.
static int cut_blocks(Blocks *x, int32_t m, int64_t B, int32_t *n_chunks, int32_t *n_pieces) {
    int64_t T = x->mb_tokens[m], nc = (T + B - 1) / B;
    if (reserve_chunks(x, nc, nc + (x->mb_first[m + 1] - x->mb_first[m])) != 0) return -1;
    memset(x->area, 0, (size_t)nc * sizeof(double));
    memset(x->chunk_len, 0, (size_t)nc * sizeof(int64_t));
    int64_t pos = 0;  // where the stream is
    int32_t k = 0;
    for (int32_t i = x->mb_first[m]; i < x->mb_first[m + 1]; i++) {
        int32_t s = x->mb_seqs[i];
        for (int64_t at = 0, len = x->b->seqs[s].len; at < len;) {
            int64_t c = pos / B, take = (c + 1) * B - pos;
            if (take > len - at) take = len - at;
            x->segs[k] = (Segment){s, at, take};
            x->piece_chunk[k++] = (int32_t)c;
            x->area[c] += (double)take * (double)at + cost_causal_area(take);
            x->chunk_len[c] += take;
            pos += take, at += take;
        }
    }
    *n_chunks = (int32_t)nc;
    *n_pieces = k;
    return 0;
}

// MagiAttention's min-heap dispatch of chunks 0 .. n over d members, each at most C tokens.
// 1: done (x->owner), 0: a block fits no member, -1 + error.
static int dispatch(Blocks *x, int32_t n) {
    // policy_order_by_time wants keys >= 0 and sorts ascending with ties in index order: walking
    // it backwards is the source's argsort(...)[::-1] (equal areas: the later block first)
    if (policy_order_by_time(x->area, n, x->by_area) != 0) return -1;
    RankHeap h;
    if (rankheap_init(&h, x->d) != 0) return bs_fail_ctx("blocks"), -1;
    memset(x->held, 0, (size_t)x->d * sizeof(int64_t));
    memset(x->count, 0, (size_t)x->d * sizeof(int32_t));
    int32_t limit = (n + x->d - 1) / x->d;
    int ok = 1;
    for (int32_t i = n - 1; ok && i >= 0; i--) {
        int32_t j = x->by_area[i], m = -1, n_aside = 0;
        while (h.n > 0) {
            int32_t t = rankheap_pop(&h);
            if (x->count[t] >= limit) continue;  // full: it leaves the heap, as in the source
            if (x->held[t] + x->chunk_len[j] <= x->C) {
                m = t;
                break;
            }
            x->aside[n_aside++] = t;  // no room for this block: back after it
        }
        for (int32_t a = 0; a < n_aside; a++) rankheap_push(&h, x->aside[a], h.key[x->aside[a]]);
        if (m < 0) {
            ok = 0;
            break;
        }
        x->owner[j] = m;
        x->held[m] += x->chunk_len[j];
        x->count[m]++;
        rankheap_push(&h, m, h.key[m] + x->area[j]);
    }
    rankheap_free(&h);
    return ok;
}

// The micro-batches' sequences, in increasing index (the order the blocks are cut in): a counting
// sort filled from the back, after which mb_first[m + 1] holds micro-batch m's start.
static void list_sequences(Blocks *x) {
    memset(x->mb_first, 0, ((size_t)x->M + 1) * sizeof(int32_t));
    for (int64_t s = 0; s < x->b->n; s++) x->mb_first[x->mb[s] + 1]++;
    for (int32_t m = 0; m < x->M; m++) x->mb_first[m + 1] += x->mb_first[m];
    for (int64_t s = x->b->n - 1; s >= 0; s--) x->mb_seqs[--x->mb_first[x->mb[s] + 1]] = (int32_t)s;
    for (int32_t m = 0; m < x->M; m++) x->mb_first[m] = x->mb_first[m + 1];
    x->mb_first[x->M] = (int32_t)x->b->n;
}

// Append micro-batch m as group g's block item. 1: added, 0: its dispatch failed, -1 + error.
static int add_micro_batch(Blocks *x, Plan *out, int32_t m, int32_t g, int32_t *ranks) {
    int32_t n = 0, n_pieces = 0;
    if (x->mb_first[m + 1] == x->mb_first[m]) return 1;  // an empty micro-batch runs nothing
    // blocks that fit no member (the last block of each sequence is shorter, so members can fill
    // unevenly): half the block size, until they fit; B = 1 always does (ceil(T / d) <= C)
    int r = 0;
    for (int64_t B = block_size(x, x->mb_tokens[m]); r == 0; B = (B + 1) / 2) {
        if (cut_blocks(x, m, B, &n, &n_pieces) != 0) return -1;
        r = dispatch(x, n);
        if (r < 0 || (r == 0 && B == 1)) return r;
    }
    for (int32_t j = 0; j < x->d; j++) ranks[j] = g * x->d + j;
    for (int32_t i = 0; i < n_pieces; i++) x->piece_owner[i] = x->owner[x->piece_chunk[i]];
    return plan_add_blocks_item(out, x->segs, n_pieces, ranks, x->d, x->piece_owner) < 0 ? -1 : 1;
}

// Deal the micro-batches to the groups in rounds, heaviest first, each to the group with the least
// area so far (equal: the lower group), and append them. 1: done, -1 + error.
static int deal(Blocks *x, Plan *out) {
    int32_t *mb_order = bs_malloc((size_t)x->M * sizeof(int32_t)), *gs = bs_malloc((size_t)x->G * sizeof(int32_t));
    double *key = bs_malloc((size_t)x->M * sizeof(double));
    int32_t *ranks = bs_malloc((size_t)x->d * sizeof(int32_t));
    RankHeap h = {0};
    int r = -1;
    if (!mb_order || !gs || !key || !ranks || rankheap_init(&h, x->G) != 0) {
        bs_fail_ctx("blocks");
        goto out;
    }
    double top = 0;
    for (int32_t m = 0; m < x->M; m++) top = fmax(top, x->mb_area[m]);
    for (int32_t m = 0; m < x->M; m++) key[m] = top - x->mb_area[m];  // ascending key: heaviest first
    if (policy_order_by_time(key, x->M, mb_order) != 0) goto out;
    r = 1;
    for (int32_t k = 0; r == 1 && k < x->M; k += x->G) {
        int32_t n_round = x->M - k < x->G ? x->M - k : x->G;
        for (int32_t g = 0; g < n_round; g++) gs[g] = rankheap_pop(&h);
        for (int32_t g = 0; r == 1 && g < n_round; g++) {
            r = add_micro_batch(x, out, mb_order[k + g], gs[g], ranks);
            rankheap_push(&h, gs[g], h.key[gs[g]] + x->mb_area[mb_order[k + g]]);
        }
    }
out:
    rankheap_free(&h);
    free(mb_order), free(gs), free(key), free(ranks);
    return r;
}

// Sequences by causal area, largest first (equal: lower index).
static int order_sequences(Blocks *x) {
    int32_t n = (int32_t)x->b->n;
    double *key = bs_malloc((size_t)(n > 0 ? n : 1) * sizeof(double)), top = 0;
    if (!key) return bs_fail_ctx("blocks");
    for (int32_t i = 0; i < n; i++) top = fmax(top, cost_causal_area(x->b->seqs[i].len));
    for (int32_t i = 0; i < n; i++) key[i] = top - cost_causal_area(x->b->seqs[i].len);
    int rc = policy_order_by_time(key, n, x->order);
    free(key);
    return rc;
}

static void blocks_free(Blocks *x) {
    free(x->order), free(x->mb), free(x->mb_area), free(x->mb_tokens), free(x->mb_first), free(x->mb_seqs);
    free(x->segs), free(x->piece_chunk), free(x->piece_owner), free(x->area), free(x->chunk_len), free(x->owner);
    free(x->by_area), free(x->held), free(x->count), free(x->aside);
}

// Size the micro-batch arrays for x->M. -1 + error.
static int size_micro_batches(Blocks *x) {
    free(x->mb_area), free(x->mb_tokens), free(x->mb_first);
    x->mb_area = bs_malloc((size_t)x->M * sizeof(double));
    x->mb_tokens = bs_malloc((size_t)x->M * sizeof(int64_t));
    x->mb_first = bs_malloc(((size_t)x->M + 1) * sizeof(int32_t));
    return x->mb_area && x->mb_tokens && x->mb_first ? 0 : bs_fail_ctx("blocks: %d micro-batches", x->M);
}

// Plan the batch on G groups of d members (ranks g d .. g d + d - 1).
static int plan_blocks(Plan *out, const GlobalBatch *b, const PlanConfig *cfg, int32_t d, int32_t G, const char *name) {
    if (plan_init(out, b, cfg->n_ranks, cfg->capacity, cfg->pp, name) != 0) return -1;
    if (b->n == 0) return 0;
    Blocks x = {.b = b, .C = cfg->capacity, .B = cfg->block_size, .d = d, .G = G};
    size_t n = (size_t)b->n;
    x.order = bs_malloc(n * sizeof(int32_t));
    x.mb = bs_malloc(n * sizeof(int32_t));
    x.mb_seqs = bs_malloc(n * sizeof(int32_t));
    x.held = bs_malloc((size_t)d * sizeof(int64_t));
    x.count = bs_malloc((size_t)d * sizeof(int32_t));
    x.aside = bs_malloc((size_t)d * sizeof(int32_t));
    int rc = -1;
    if (!x.order || !x.mb || !x.mb_seqs || !x.held || !x.count || !x.aside || order_sequences(&x) != 0) goto out;
    int64_t per_mb = (int64_t)d * x.C, M = (b->n_tokens + per_mb - 1) / per_mb;
    M = (M + G - 1) / G * G;
    for (;; M += G) {  // the fewest micro-batches, a multiple of G, that hold the batch and dispatch
        if (M > (int64_t)b->n + G || M > INT32_MAX / 2) {
            bs_fail("blocks: no split of the batch into micro-batches of %d ranks dispatches blocks of %lld tokens "
                    "within the capacity of %lld (use a smaller --block-size)",
                    d, (long long)cfg->block_size, (long long)x.C);
            goto out;
        }
        x.M = (int32_t)M;
        if (size_micro_batches(&x) != 0) goto out;
        int r = pack_sequences(&x);
        if (r < 0) goto out;
        if (r == 0) continue;
        list_sequences(&x);
        // a retry starts the item list afresh
        out->n_items = out->n_segs = out->n_refs = 0;
        r = deal(&x, out);
        if (r < 0) goto out;
        if (r == 1) break;
    }
    rc = 0;
out:
    blocks_free(&x);
    return rc;
}

int policy_blocks(Plan *out, const GlobalBatch *b, const PlanConfig *cfg, const CostModel *cm) {
    (void)cm;
    int64_t d_cp;
    int32_t d_dp;
    if (policy_mesh(b, cfg, &d_cp, &d_dp) != 0) return -1;
    return plan_blocks(out, b, cfg, (int32_t)d_cp, d_dp, "blocks");
}

int policy_blocks_all(Plan *out, const GlobalBatch *b, const PlanConfig *cfg, const CostModel *cm) {
    (void)cm;
    int64_t longest = 0;
    for (int64_t i = 0; i < b->n; i++)
        if (b->seqs[i].len > longest) longest = b->seqs[i].len;
    if (longest > (int64_t)cfg->n_ranks * cfg->capacity)
        return bs_fail("a sequence of %lld tokens does not fit %d ranks of capacity %lld", (long long)longest,
                       cfg->n_ranks, (long long)cfg->capacity);
    return plan_blocks(out, b, cfg, cfg->n_ranks, 1, "blocks-all");
}
