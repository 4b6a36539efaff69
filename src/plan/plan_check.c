// plan_check.c: plan_validate, everything the executor relies on (plan.h, docs/plan-format.md):
//   1. the plan's header and its batch;
//   2. every item: segments in range, token count, distinct ranks in range, offload in [0, 1],
//      capacity (r = 0: at most D * C tokens, and every ring member at most C under the 2D-chunk
//      layout; r > 0: Eq. 3's memory rule with that r for the fullest member);
//   3. every token of every sequence covered exactly once;
//   4. the per-rank schedules: exactly the items each rank is a member of, in increasing global
//      order (then no two ranks can wait on each other in a cycle);
//   5. the peers' additions (docs/peers.md): barriers increasing inside the item list, delayed
//      sequences increasing and in no item (3. skips them), all-to-all items without offloading.
// Errors name the first problem found: item, segment, rank, sequence.
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bytescale/error.h"
#include "core/fminmax.h"
#include "bytescale/keep.h"
#include "bytescale/plan.h"

static int check_header(const Plan *p) {
    if (p->n_ranks < 1) return bs_fail("n_ranks must be >= 1 (got %d)", p->n_ranks);
    if (p->capacity < 1) return bs_fail("capacity must be >= 1 (got %lld)", (long long)p->capacity);
    if (p->pp < 1) return bs_fail("pp must be >= 1 (got %d)", p->pp);
    if (p->batch.n < 0 || p->batch.n > INT32_MAX)
        return bs_fail("%lld sequences is out of range", (long long)p->batch.n);
    return 0;
}

// The batch: every length >= 1 and their sum its token count. The lengths go into len32 on the way
// (-1 where one does not fit an int32; see Seen), the one pass over the batch's 24-byte sequences.
static int check_batch(const Plan *p, int32_t *len32) {
    int64_t sum = 0;
    for (int64_t i = 0; i < p->batch.n; i++) {
        const Sequence *s = &p->batch.seqs[i];
        if (s->len < 1)
            return bs_fail("sequence %lld (id %lld): length %lld must be >= 1", (long long)i, (long long)s->id,
                           (long long)s->len);
        if (s->len > INT64_MAX - sum)
            return bs_fail("the sequences hold more than %lld tokens (at sequence %lld)", (long long)INT64_MAX,
                           (long long)i);
        sum += s->len;
        len32[i] = s->len <= INT32_MAX ? (int32_t)s->len : -1;
    }
    if (sum != p->batch.n_tokens)
        return bs_fail("the batch says %lld tokens but its sequences hold %lld", (long long)p->batch.n_tokens,
                       (long long)sum);
    return 0;
}

// Tokens the fullest member of a ring holds under the symmetric 2D-chunk layout (plan_chunk), and
// its position in the ring (the first one if several tie). Member i of D holds chunks i and 2D-1-i
// of every segment: 2 * (len / 2D) tokens, one more if chunk i is among the first rem = len % 2D
// (i < rem) and one more if chunk 2D-1-i is (i >= 2D - rem). Those +1s fall on ranges of members,
// so a difference array over the members (diff, D + 1 entries) counts them in O(segments + D), not
// O(segments * D). No sum overflows: every count is at most the item's tokens, checked to fit int64.
static int64_t fullest_member(const Plan *p, const Item *it, int64_t *diff, int32_t *member) {
    int64_t D = it->n_ranks, parts = 2 * D, base = 0;
    memset(diff, 0, (size_t)(D + 1) * sizeof *diff);
    for (int32_t j = 0; j < it->n_segs; j++) {
        int64_t len = p->segs[it->seg_begin + j].len, rem = len % parts;
        base += 2 * (len / parts);
        diff[0]++, diff[rem < D ? rem : D]--;     // members i < rem
        if (rem > D) diff[parts - rem]++, diff[D]--;  // members i >= 2D - rem
    }
    int64_t extra = 0, most = -1;
    for (int32_t i = 0; i < D; i++) {
        extra += diff[i];
        if (extra > most) most = extra, *member = i;
    }
    return base + most;
}

// Does a member holding `share` tokens of a ring with offload ratio r > 0 fit? Eq. 3 of the paper
// in the per-rank form cost_min_ranks uses: the shared buffers, two layers' whole activations and
// (1-r) of the other l-2 (cost_rank_act) against the budget for capacity C (cost_act_budget). The
// relative slack absorbs the float rounding of r as stored in the plan.
static int offload_fits(const CostModel *cm, double share, double r, int64_t capacity, double *need, double *budget) {
    *need = cost_rank_act(cm, share, r);
    *budget = cost_act_budget(cm, capacity);
    return *need <= *budget * (1 + 1e-6);
}

// The block peer's owners (Plan.seg_owner): a block item passes plan_blocks_check, any other item's
// segments have none. 1: a valid block item, 0: another item, -1 + error.
static int check_owners(const Plan *p, int32_t k) {
    const Item *it = &p->items[k];
    if (plan_item_kind(p, k) == ITEM_BLOCKS) return plan_blocks_check(p, k) == 0 ? 1 : -1;
    for (int32_t j = 0; p->seg_owner && j < it->n_segs; j++)
        if (p->seg_owner[it->seg_begin + j] != -1)
            return bs_fail("item %d: segment %d has an owner (%d) but the item is not a block item", k, j,
                           p->seg_owner[it->seg_begin + j]);
    return 0;
}

// The rules of the Ulysses kinds (docs/plan-format.md): an all-to-all group (a2a) and a hybrid (a ring
// of n_ranks / ulysses groups of ulysses consecutive members) split the query heads of a TP shard over
// a group, so a group has at most a2a_heads members (when the cost model knows them); an item is one
// kind. Their members hold tokens / n_ranks of the activations, as a ring's, so they offload as a
// ring does and the capacity rules that follow are the ring's.
static int check_heads_kind(const Item *it, int32_t k, const CostModel *cm) {
    if (it->a2a != 0 && it->a2a != 1)
        return bs_fail("item %d: an all-to-all group's flag (a2a %d) must be 0 or 1", k, it->a2a);
    if (it->a2a && cm && cm->a2a_heads > 0 && it->n_ranks > cm->a2a_heads)
        return bs_fail("item %d: an all-to-all group of %d ranks exceeds the %d attention heads of a TP shard (Ulysses "
                       "splits the heads over the group)",
                       k, it->n_ranks, cm->a2a_heads);
    int u = it->ulysses;
    if (u == 0) return 0;
    if (it->a2a) return bs_fail("item %d: a hybrid item (ulysses %d) cannot also be an all-to-all group (a2a 1)", k, u);
    if (u < 2 || u >= it->n_ranks || it->n_ranks % u != 0)
        return bs_fail("item %d: a hybrid item's Ulysses group size (ulysses %d) must be in [2, %d) and divide its %d "
                       "ranks (a ring of n_ranks / ulysses groups)",
                       k, u, it->n_ranks, it->n_ranks);
    if (cm && cm->a2a_heads > 0 && u > cm->a2a_heads)
        return bs_fail("item %d: a hybrid item's Ulysses group of %d ranks exceeds the %d attention heads of a TP "
                       "shard (Ulysses splits the heads over the group)",
                       k, u, cm->a2a_heads);
    return 0;
}

// Where an item's segments and ranks lie: in order, within the plan's arrays.
static int check_item_lists(const Plan *p, int32_t k, const Item *it, int64_t seg_at, int64_t ref_at) {
    if (it->n_segs < 1) return bs_fail("item %d has %d segments (needs at least one)", k, it->n_segs);
    if (it->seg_begin != seg_at || seg_at + it->n_segs > p->n_segs)
        return bs_fail("item %d: segments [%d, +%d) should start at %lld and lie within the %d segments "
                       "(items list their segments in order)",
                       k, it->seg_begin, it->n_segs, (long long)seg_at, p->n_segs);
    if (it->n_ranks < 1) return bs_fail("item %d has %d ranks (needs at least one)", k, it->n_ranks);
    if (it->rank_begin != ref_at || ref_at + it->n_ranks > p->n_refs)
        return bs_fail("item %d: ranks [%d, +%d) should start at %lld and lie within the %d rank refs "
                       "(items list their ranks in order)",
                       k, it->rank_begin, it->n_ranks, (long long)ref_at, p->n_refs);
    return 0;
}

// What check_items learns of the sequences on its way: which ones a segment holds, and how many
// segments are a whole sequence seen for the first time. The lengths are packed 4 bytes apart
// (check_batch's, -1 where one does not fit): the segments look them up at random, and a small array
// keeps those lookups in the cache and the TLB (the batch's sequences are 24 bytes each).
typedef struct {
    const int32_t *len32;  // (n,)
    uint8_t *hit;    // (n,)
    int64_t n_whole;
} Seen;

// How far ahead check_segments asks for a segment's sequence: the lookups are at random, and each
// one's cache miss then overlaps the work on the segments before it instead of stalling the loop.
#define SEEN_AHEAD 16

// An item's segments: each inside its sequence, their tokens the item's count.
static int check_segments(const Plan *p, int32_t k, const Item *it, Seen *sn) {
    int64_t tokens = 0;
    for (int32_t j = 0; j < it->n_segs; j++) {
        int64_t ahead = (int64_t)it->seg_begin + j + SEEN_AHEAD;
        if (ahead < p->n_segs && p->segs[ahead].seq >= 0 && p->segs[ahead].seq < p->batch.n) {
            __builtin_prefetch(&sn->len32[p->segs[ahead].seq]);
            __builtin_prefetch(&sn->hit[p->segs[ahead].seq], 1);
        }
        const Segment *s = &p->segs[it->seg_begin + j];
        if (s->seq < 0 || s->seq >= p->batch.n)
            return bs_fail("item %d: segment %d: sequence %d out of range [0, %lld)", k, j, s->seq,
                           (long long)p->batch.n);
        int64_t len = sn->len32[s->seq] >= 0 ? sn->len32[s->seq] : p->batch.seqs[s->seq].len;
        sn->n_whole += s->start == 0 && s->len == len && !sn->hit[s->seq];
        sn->hit[s->seq] = 1;
        // start > len - s->len, not start + len > len: a start near INT64_MAX must not overflow
        if (s->start < 0 || s->len < 1 || s->len > len || s->start > len - s->len)
            return bs_fail("item %d: segment %d: tokens [%lld, +%lld) outside sequence %d (length %lld)", k, j,
                           (long long)s->start, (long long)s->len, s->seq, (long long)len);
        // segments may repeat a sequence (a fault coverage reports later), so the sum can overflow
        if (__builtin_add_overflow(tokens, s->len, &tokens))
            return bs_fail("item %d: its segments hold more than %lld tokens", k, (long long)INT64_MAX);
    }
    if (tokens != it->tokens)
        return bs_fail("item %d: says %lld tokens but its segments hold %lld", k, (long long)it->tokens,
                       (long long)tokens);
    return 0;
}

// *whole: 1 when every sequence is exactly one segment of its full length, the plans balance and
// elastic make (then check_coverage has nothing left to find); 0 when that is not shown here.
static int check_items(const Plan *p, const CostModel *cm, const int32_t *len32, int *whole) {
    int32_t *stamp = bs_keep_calloc((size_t)p->n_ranks, sizeof(int32_t));  // item index + 1 that last used a rank
    int64_t *diff = bs_keep_alloc(((size_t)p->n_ranks + 1) * sizeof(int64_t));  // fullest_member's, any ring fits
    size_t nn = (size_t)(p->batch.n > 0 ? p->batch.n : 1);
    Seen sn = {len32, bs_keep_calloc(nn, 1), 0};
    int rc = -1;
    int64_t seg_at = 0, ref_at = 0;
    *whole = 0;
    if (!stamp || !diff || !sn.hit) {
        bs_fail_ctx("plan_validate");
        goto out;
    }
    for (int32_t k = 0; k < p->n_items; k++) {
        const Item *it = &p->items[k];
        if (check_item_lists(p, k, it, seg_at, ref_at) != 0 || check_segments(p, k, it, &sn) != 0) goto out;
        seg_at += it->n_segs;
        ref_at += it->n_ranks;
        int64_t tokens = it->tokens;  // what its segments hold (check_segments)
        for (int32_t j = 0; j < it->n_ranks; j++) {
            int32_t r = p->ranks[it->rank_begin + j];
            if (r < 0 || r >= p->n_ranks) {
                bs_fail("item %d: rank %d out of range [0, %d)", k, r, p->n_ranks);
                goto out;
            }
            if (stamp[r] == k + 1) {
                bs_fail("item %d: rank %d appears twice in its ring", k, r);
                goto out;
            }
            stamp[r] = k + 1;
        }
        int blocks = check_owners(p, k);
        if (blocks < 0) goto out;
        if (blocks) continue;  // a block item's capacity is per owner: checked there
        double off = it->offload;
        if (!(off >= 0 && off <= 1)) {
            bs_fail("item %d: offload ratio %g outside [0, 1]", k, off);
            goto out;
        }
        if (check_heads_kind(it, k, cm) != 0) goto out;
        // D * C can exceed int64 (a file may give any capacity): compare tokens / D with C instead.
        // For a ring this is the coarse check, kept for its plainer message; the per-member one follows.
        if (off == 0 && tokens / it->n_ranks + (tokens % it->n_ranks != 0) > p->capacity) {
            bs_fail("item %d: %lld tokens on %d rank%s exceed the capacity of %lld tokens per rank "
                    "(and it does not offload)",
                    k, (long long)tokens, it->n_ranks, it->n_ranks > 1 ? "s" : "", (long long)p->capacity);
            goto out;
        }
        if (off == 0 && it->n_ranks == 1) continue;  // a pack holds its tokens: checked above
        // a ring: what each member really holds under the chunk layout
        int32_t m = 0;
        int64_t most = fullest_member(p, it, diff, &m);
        int32_t m_rank = p->ranks[it->rank_begin + m];
        if (off == 0 && most > p->capacity) {
            bs_fail("item %d: ring member %d (rank %d) holds %lld tokens, more than the capacity of %lld", k, m,
                    m_rank, (long long)most, (long long)p->capacity);
            goto out;
        }
        // Eq. 3 for the fullest member. The planners solve it with the fractional share tokens / D
        // (cost_offload_ratio), which for a ring of one segment is less than one token below that
        // member's ceil(tokens / D); so the share checked is the member's count less one token of
        // rounding, and never less than tokens / D. A ring of many short segments, whose low members
        // hold up to a token per segment more than tokens / D, is checked against what they hold.
        double share = cost_fmax((double)tokens / it->n_ranks, (double)(most - 1)), need, budget;
        if (off > 0 && cm && !offload_fits(cm, share, off, p->capacity, &need, &budget)) {
            char who[96] = "";
            if (it->n_ranks > 1)
                snprintf(who, sizeof who, "; ring member %d (rank %d) holds %lld tokens", m, m_rank, (long long)most);
            bs_fail("item %d: %lld tokens on %d rank%s with offload ratio %.4f need %.4g activation bytes per rank, "
                    "more than the budget of %.4g (Eq. 3)%s",
                    k, (long long)tokens, it->n_ranks, it->n_ranks > 1 ? "s" : "", off, need, budget, who);
            goto out;
        }
    }
    if (seg_at != p->n_segs) {
        bs_fail("the items use %lld of the %d segments", (long long)seg_at, p->n_segs);
        goto out;
    }
    if (ref_at != p->n_refs) {
        bs_fail("the items use %lld of the %d rank refs", (long long)ref_at, p->n_refs);
        goto out;
    }
    *whole = sn.n_whole == p->batch.n && p->n_segs == p->batch.n && p->n_delayed == 0;
    rc = 0;
out:
    bs_keep_free(stamp);
    bs_keep_free(diff);
    bs_keep_free(sn.hit);
    return rc;
}

typedef struct {
    int64_t start, len;
    int32_t item;
} Piece;

static int piece_by_start(const void *a, const void *b) {
    const Piece *x = a, *y = b;
    return (x->start > y->start) - (x->start < y->start);
}

// The item that holds segment i (items list their segments in order, check_items).
static int32_t item_of_segment(const Plan *p, int32_t i) {
    int32_t lo = 0, hi = p->n_items - 1;
    while (lo < hi) {
        int32_t mid = lo + (hi - lo + 1) / 2;
        if (p->items[mid].seg_begin <= i) lo = mid;
        else hi = mid - 1;
    }
    return lo;
}

// Sequence s's pieces, ordered by start, must tile [0, len) exactly.
static int walk_pieces(const Plan *p, int64_t s, Piece *ps, int32_t m) {
    const Sequence *q = &p->batch.seqs[s];
    if (m > 1) qsort(ps, (size_t)m, sizeof(Piece), piece_by_start);
    int64_t at = 0;
    for (int32_t i = 0; i < m; i++) {
        if (ps[i].start > at)
            return bs_fail("sequence %lld (id %lld): tokens [%lld, %lld) are in no item", (long long)s, (long long)q->id,
                           (long long)at, (long long)ps[i].start);
        if (ps[i].start < at)
            return bs_fail("sequence %lld (id %lld): tokens [%lld, %lld) are in two items (%d and %d)", (long long)s,
                           (long long)q->id, (long long)ps[i].start, (long long)at, ps[i - 1].item, ps[i].item);
        at = ps[i].start + ps[i].len;
    }
    if (at != q->len)
        return bs_fail("sequence %lld (id %lld): tokens [%lld, %lld) are in no item", (long long)s, (long long)q->id,
                       (long long)at, (long long)q->len);
    return 0;
}

// Every token exactly once. Nearly every sequence is one segment: seen[s] is then that segment
// (-1: none yet), and only the sequences cut into several (seen[s] = -2 - their index among those)
// have their pieces gathered by sequence (a counting sort, item order within one), ordered by start
// and walked. Linear, with one int per sequence and a Piece per segment of a cut sequence.
static int check_coverage(const Plan *p) {
    int64_t n = p->batch.n;
    int32_t *seen = bs_keep_alloc((size_t)(n > 0 ? n : 1) * sizeof(int32_t));
    int32_t *begin = NULL;
    Piece *pieces = NULL;
    int rc = -1;
    if (!seen) return bs_fail_ctx("plan_validate");
    for (int64_t s = 0; s < n; s++) seen[s] = -1;
    int32_t n_cut = 0;
    int64_t cut_segs = 0;
    for (int32_t i = 0; i < p->n_segs; i++) {
        int32_t q = p->segs[i].seq, was = seen[q];
        if (was == -1) {
            seen[q] = i;
            continue;
        }
        cut_segs += was >= 0 ? 2 : 1;
        if (was >= 0) seen[q] = -2 - n_cut++;
    }
    if (n_cut > 0) {  // the cut sequences' pieces, grouped by sequence in item order
        begin = bs_keep_calloc((size_t)n_cut + 1, sizeof(int32_t));
        pieces = bs_keep_alloc((size_t)cut_segs * sizeof(Piece));
        if (!begin || !pieces) {
            bs_fail_ctx("plan_validate");
            goto out;
        }
        for (int32_t i = 0; i < p->n_segs; i++)
            if (seen[p->segs[i].seq] <= -2) begin[-1 - seen[p->segs[i].seq]]++;
        for (int32_t c = 0; c < n_cut; c++) begin[c + 1] += begin[c];
        for (int32_t k = 0; k < p->n_items; k++) {
            const Item *it = &p->items[k];
            for (int32_t j = 0; j < it->n_segs; j++) {
                const Segment *sg = &p->segs[it->seg_begin + j];
                if (seen[sg->seq] <= -2) pieces[begin[-2 - seen[sg->seq]]++] = (Piece){sg->start, sg->len, k};
            }
        }
        for (int32_t c = n_cut; c > 0; c--) begin[c] = begin[c - 1];  // the fill moved each start to the next
        begin[0] = 0;
    }
    for (int64_t s = 0, d = 0; s < n; s++) {
        int32_t at = seen[s];
        Piece one;
        Piece *ps = &one;
        int32_t m = at == -1 ? 0 : 1;
        if (at >= 0) one = (Piece){p->segs[at].start, p->segs[at].len, -1};
        if (at <= -2) ps = pieces + begin[-2 - at], m = begin[-1 - at] - begin[-2 - at];
        if (d < p->n_delayed && p->delayed[d] == s) {  // a delayed sequence: trained in a later step
            d++;
            if (m > 0) {
                bs_fail("sequence %lld (id %lld) is delayed but item %d holds tokens of it", (long long)s,
                        (long long)p->batch.seqs[s].id, at >= 0 ? item_of_segment(p, at) : ps[0].item);
                goto out;
            }
            continue;
        }
        if (walk_pieces(p, s, ps, m) != 0) goto out;
    }
    rc = 0;
out:
    bs_keep_free(seen);
    bs_keep_free(begin);
    bs_keep_free(pieces);
    return rc;
}

// The per-rank schedules must list exactly the items each rank is a member of, increasing.
static int check_schedule(const Plan *p) {
    if (!p->rank_begin || !p->rank_items) return bs_fail("no per-rank schedule (call plan_finalize first)");
    const int32_t *rb = p->rank_begin;
    if (rb[0] != 0 || rb[p->n_ranks] != p->n_refs)
        return bs_fail("the per-rank schedules hold %d entries, the items have %d members", rb[p->n_ranks] - rb[0],
                       p->n_refs);
    int32_t *expect_begin = bs_keep_calloc((size_t)p->n_ranks + 1, sizeof(int32_t));
    int32_t *expect = bs_keep_alloc((size_t)(p->n_refs > 0 ? p->n_refs : 1) * sizeof(int32_t));
    int rc = -1;
    if (!expect_begin || !expect) {
        bs_fail_ctx("plan_validate");
        goto out;
    }
    for (int32_t i = 0; i < p->n_refs; i++) expect_begin[p->ranks[i] + 1]++;
    for (int32_t r = 0; r < p->n_ranks; r++) expect_begin[r + 1] += expect_begin[r];
    for (int32_t k = 0; k < p->n_items; k++) {
        const Item *it = &p->items[k];
        for (int32_t j = 0; j < it->n_ranks; j++) expect[expect_begin[p->ranks[it->rank_begin + j]]++] = k;
    }
    // expect_begin[r] now holds the end of rank r's list; its start is expect_begin[r-1]
    for (int32_t r = 0; r < p->n_ranks; r++) {
        int32_t e0 = r ? expect_begin[r - 1] : 0, e1 = expect_begin[r];
        if (rb[r + 1] < rb[r] || rb[r + 1] - rb[r] != e1 - e0) {
            bs_fail("rank %d: its schedule lists %d items but it is a member of %d", r, rb[r + 1] - rb[r],
                    e1 - e0);
            goto out;
        }
        for (int32_t i = rb[r] + 1; i < rb[r + 1]; i++) {
            if (p->rank_items[i] <= p->rank_items[i - 1]) {
                bs_fail("rank %d: runs item %d after item %d; ranks must run their items in increasing "
                        "global order",
                        r, p->rank_items[i], p->rank_items[i - 1]);
                goto out;
            }
        }
        for (int32_t i = rb[r], e = e0; i < rb[r + 1]; i++, e++) {
            int32_t k = p->rank_items[i];
            if (k < expect[e]) {
                bs_fail("rank %d: its schedule lists item %d but it is not a member of that item", r, k);
                goto out;
            }
            if (k > expect[e]) {
                bs_fail("rank %d: its schedule misses item %d", r, expect[e]);
                goto out;
            }
        }
    }
    rc = 0;
out:
    bs_keep_free(expect_begin);
    bs_keep_free(expect);
    return rc;
}

// Barriers strictly increasing in (0, n_items); delayed sequences strictly increasing in the batch.
static int check_peer_fields(const Plan *p) {
    if (p->n_barriers < 0 || (p->n_barriers > 0 && !p->barriers)) return bs_fail("%d barriers", p->n_barriers);
    for (int32_t w = 0; w < p->n_barriers; w++) {
        int32_t k = p->barriers[w];
        if (k <= 0 || k >= p->n_items || (w > 0 && k <= p->barriers[w - 1]))
            return bs_fail("barrier %d: before item %d, which is not in (%d, %d) (barriers increase strictly inside "
                           "the item list)",
                           w, k, w > 0 ? p->barriers[w - 1] : 0, p->n_items);
    }
    if (p->n_delayed < 0 || (p->n_delayed > 0 && !p->delayed)) return bs_fail("%d delayed sequences", p->n_delayed);
    for (int32_t d = 0; d < p->n_delayed; d++) {
        int32_t s = p->delayed[d];
        if (s < 0 || s >= p->batch.n || (d > 0 && s <= p->delayed[d - 1]))
            return bs_fail("delayed[%d]: sequence %d is out of range [0, %lld) or out of order (they increase "
                           "strictly)",
                           d, s, (long long)p->batch.n);
    }
    return 0;
}

int plan_validate(const Plan *p, const CostModel *cm) {
    if (check_header(p) != 0) return -1;
    int32_t *len32 = bs_keep_alloc((size_t)(p->batch.n > 0 ? p->batch.n : 1) * sizeof(int32_t));  // check_batch's
    if (!len32) return bs_fail_ctx("plan_validate");
    int whole = 0;  // every sequence one whole segment (check_items): coverage is then shown
    int rc = 0;
    if (check_batch(p, len32) != 0 || check_peer_fields(p) != 0 || check_items(p, cm, len32, &whole) != 0 ||
        (!whole && check_coverage(p) != 0) || check_schedule(p) != 0)
        rc = -1;
    bs_keep_free(len32);
    return rc;
}
