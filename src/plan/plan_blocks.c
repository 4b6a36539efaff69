// plan_blocks.c: what the members of a block item (the block peer, docs/peers.md) compute and
// receive, derived from the blocks' owners (plan.h plan_blocks_loads, cost.h BlockLoad).
//
// In one sequence, a query block sees every block at or before it (causal). A member m therefore needs
// the K/V of every block up to its last own block, last[m]; the ones it does not own it receives from
// their owners (forward, and again backward), and it sends their partial dK/dV back to them (the owner
// receives, per block, one partial from every other member whose last own block is at or after it).
// One walk per sequence over its blocks in order; O(blocks log blocks) for the sort by position.
#include <stdlib.h>
#include <string.h>

#include "bytescale/error.h"
#include "bytescale/plan.h"

typedef struct {
    int32_t seq, owner;
    int64_t start, len;
} Blk;

static int blk_order(const void *a, const void *b) {
    const Blk *x = a, *y = b;
    if (x->seq != y->seq) return x->seq < y->seq ? -1 : 1;
    return (x->start > y->start) - (x->start < y->start);
}

typedef struct {
    int32_t *node;      // (D,) dense node index of each member
    int32_t *first;     // (D,) per node index: its lowest member
    int64_t *own;       // (D,) per member: tokens owned so far in this sequence
    int64_t *own_all;   // (D,) per member: tokens owned in this sequence
    int32_t *last;      // (D,) per member: position of its last block in this sequence, -1 none
    int64_t *on_node;   // (D,) per node index: tokens so far owned by its members in this sequence
    int32_t *alive;     // (D,) per node index: members whose last block is at or after the walk
    int32_t *touched;   // (D,) the members owning a block of this sequence
} Walk;

// Sort blocks by (sequence, start) unless they already are (as the policy writes them): O(n) then.
static void sort_blocks(Blk *bl, int32_t n) {
    for (int32_t j = 1; j < n; j++)
        if (blk_order(&bl[j - 1], &bl[j]) > 0) {
            qsort(bl, (size_t)n, sizeof *bl, blk_order);
            return;
        }
}

typedef struct {
    int64_t node;
    int32_t m;
} NodeOf;

static int by_node(const void *a, const void *b) {
    const NodeOf *x = a, *y = b;
    if (x->node != y->node) return x->node < y->node ? -1 : 1;
    return (x->m > y->m) - (x->m < y->m);
}

// Dense node indices of the members (node_of NULL: every rank its own node), and a representative
// sender of each class for the simulator's link (cluster_msg_time): the lowest other member of its
// node, and a member of another node. O(D log D). -1 + error on no memory.
static int number_nodes(Walk *w, const Plan *p, const Item *it, int64_t (*node_of)(int32_t, const void *),
                        const void *ctx, BlockLoad *ld) {
    const int32_t *ranks = p->ranks + it->rank_begin;
    int32_t D = it->n_ranks, n_nodes = 0;
    NodeOf *v = bs_malloc((size_t)D * sizeof *v);
    if (!v) return bs_fail_ctx("plan_blocks_loads");
    for (int32_t m = 0; m < D; m++) v[m] = (NodeOf){node_of ? node_of(ranks[m], ctx) : ranks[m], m};
    qsort(v, (size_t)D, sizeof *v, by_node);
    for (int32_t i = 0; i < D; i++) {
        if (i == 0 || v[i].node != v[i - 1].node) w->first[n_nodes++] = v[i].m;  // lowest member of the node
        w->node[v[i].m] = n_nodes - 1;
    }
    for (int32_t i = 0; i < D; i++) {
        int32_t m = v[i].m, f = w->first[w->node[m]];
        ld[m].src_intra = f != m ? ranks[f] : i + 1 < D && v[i + 1].node == v[i].node ? ranks[v[i + 1].m] : -1;
        ld[m].src_inter = n_nodes < 2 ? -1 : ranks[w->first[w->node[m] == 0 ? 1 : 0]];
    }
    free(v);
    return 0;
}

// One sequence's blocks bl[0 .. n), in order: every member's pairs and received tokens.
static void walk_sequence(Walk *w, const Blk *bl, int32_t n, BlockLoad *ld) {
    int32_t n_touched = 0;
    for (int32_t i = 0; i < n; i++) {
        int32_t o = bl[i].owner;
        if (w->last[o] < 0) w->touched[n_touched++] = o;
        w->last[o] = i;
        w->own_all[o] += bl[i].len;
    }
    // forward: pairs of each query block, and at a member's last block what it has received
    int64_t before = bl[0].start;  // tokens before the walk (0: a block item holds whole sequences)
    for (int32_t i = 0; i < n; i++) {
        const Blk *b = &bl[i];
        int32_t o = b->owner;
        double len = (double)b->len;
        ld[o].local_pairs += len * (double)w->own[o] + len * (len + 1) / 2;
        ld[o].remote_pairs += len * (double)(before - w->own[o]);
        ld[o].tokens += len;
        w->own[o] += b->len;
        w->on_node[w->node[o]] += b->len;
        before += b->len;
        if (w->last[o] == i) {  // it needs every block so far: its node's, less its own, and the rest
            double intra = (double)(w->on_node[w->node[o]] - w->own_all[o]);
            ld[o].kv_intra += intra;
            ld[o].kv_inter += (double)(before - bl[0].start) - (double)w->own_all[o] - intra;
        }
    }
    // backward: block i's partial dK/dV come from every other member whose last block is at or after i
    for (int32_t t = 0; t < n_touched; t++) w->alive[w->node[w->touched[t]]]++;
    int32_t alive_all = n_touched;
    for (int32_t i = 0; i < n; i++) {
        // the one member whose last block can be i - 1 is that block's owner: it sees no later block
        int32_t prev = i > 0 ? bl[i - 1].owner : -1;
        if (prev >= 0 && w->last[prev] == i - 1) {
            w->alive[w->node[prev]]--;
            alive_all--;
        }
        int32_t o = bl[i].owner, same = w->alive[w->node[o]] - 1;
        ld[o].dkv_intra += (double)bl[i].len * same;
        ld[o].dkv_inter += (double)bl[i].len * (alive_all - 1 - same);
    }
    // reset what this sequence touched
    for (int32_t t = 0; t < n_touched; t++) {
        int32_t m = w->touched[t];
        w->alive[w->node[m]] = 0;
        w->on_node[w->node[m]] = 0;
        w->own[m] = w->own_all[m] = 0;
        w->last[m] = -1;
    }
}

int plan_blocks_loads(const Plan *p, int32_t item, int64_t (*node_of)(int32_t rank, const void *ctx),
                      const void *ctx, BlockLoad *ld) {
    const Item *it = &p->items[item];
    int32_t D = it->n_ranks, n = it->n_segs;
    if (!p->seg_owner) return bs_fail("plan_blocks_loads: item %d is not a block item", item);
    memset(ld, 0, (size_t)D * sizeof *ld);
    Blk *bl = bs_malloc((size_t)n * sizeof *bl);
    int32_t *i32 = bs_malloc((size_t)D * 5 * sizeof(int32_t));
    int64_t *i64 = bs_calloc((size_t)D * 3, sizeof(int64_t));
    if (!bl || !i32 || !i64) {
        free(bl), free(i32), free(i64);
        return bs_fail_ctx("plan_blocks_loads (%d blocks, %d members)", n, D);
    }
    Walk w = {.node = i32, .first = i32 + D, .last = i32 + 2 * D, .alive = i32 + 3 * D, .touched = i32 + 4 * D,
              .own = i64, .own_all = i64 + D, .on_node = i64 + 2 * D};
    for (int32_t m = 0; m < D; m++) w.last[m] = -1, w.alive[m] = 0;
    if (number_nodes(&w, p, it, node_of, ctx, ld) != 0) {
        free(bl), free(i32), free(i64);
        return -1;
    }
    for (int32_t j = 0; j < n; j++) {
        const Segment *s = &p->segs[it->seg_begin + j];
        bl[j] = (Blk){s->seq, p->seg_owner[it->seg_begin + j], s->start, s->len};
    }
    sort_blocks(bl, n);
    for (int32_t a = 0, b; a < n; a = b) {
        for (b = a + 1; b < n && bl[b].seq == bl[a].seq;) b++;
        walk_sequence(&w, bl + a, b - a, ld);
    }
    free(bl), free(i32), free(i64);
    return 0;
}

int plan_blocks_check(const Plan *p, int32_t k) {
    const Item *it = &p->items[k];
    const int32_t *own = p->seg_owner + it->seg_begin;
    if (it->offload != 0 || it->a2a || it->ulysses)
        return bs_fail("item %d: a block item cannot offload or be an all-to-all group or a hybrid (offload %g, "
                       "a2a %d, ulysses %d)",
                       k, it->offload, it->a2a, it->ulysses);
    int64_t *held = bs_calloc((size_t)it->n_ranks, sizeof(int64_t));
    Blk *bl = bs_malloc((size_t)it->n_segs * sizeof *bl);
    if (!held || !bl) return free(held), free(bl), bs_fail_ctx("plan_validate");
    int rc = 0;
    for (int32_t j = 0; rc == 0 && j < it->n_segs; j++) {
        const Segment *s = &p->segs[it->seg_begin + j];
        if (own[j] < 0 || own[j] >= it->n_ranks) rc = bs_fail("item %d: block %d: owner %d outside the item's %d members", k, j, own[j], it->n_ranks);
        else held[own[j]] += s->len;
        bl[j] = (Blk){s->seq, own[j], s->start, s->len};
    }
    for (int32_t m = 0; rc == 0 && m < it->n_ranks; m++)
        if (held[m] > p->capacity)
            rc = bs_fail("item %d: member %d (rank %d) owns %lld tokens, more than the capacity of %lld", k, m,
                         p->ranks[it->rank_begin + m], (long long)held[m], (long long)p->capacity);
    // a block item holds whole sequences: each one's blocks follow each other from token 0 to its end
    if (rc == 0) sort_blocks(bl, it->n_segs);
    for (int32_t j = 0; rc == 0 && j < it->n_segs; j++) {
        int first = j == 0 || bl[j - 1].seq != bl[j].seq, end = j + 1 == it->n_segs || bl[j + 1].seq != bl[j].seq;
        int64_t want = first ? 0 : bl[j - 1].start + bl[j - 1].len;
        if (bl[j].start != want || (end && bl[j].start + bl[j].len != p->batch.seqs[bl[j].seq].len))
            rc = bs_fail("item %d: the blocks of sequence %d do not cover it from token 0 to %lld once (a block item "
                         "holds whole sequences)",
                         k, bl[j].seq, (long long)p->batch.seqs[bl[j].seq].len);
    }
    free(held), free(bl);
    return rc;
}
