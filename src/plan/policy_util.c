// policy_util.c: sharding, best-fit packing and the rank heap the policies share (policy_util.h).
#include "plan/policy_util.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "bytescale/error.h"
#include "bytescale/keep.h"

int policy_shard_one(const GlobalBatch *b, int64_t i, const PlanConfig *cfg, const CostModel *cm, int32_t *D,
                     double *r) {
    int64_t C = cfg->capacity, s = b->seqs[i].len;
    *D = 1;
    *r = 0;
    if (s <= C) return 0;
    int d = cost_min_ranks(cm, s, C, cfg->offload, cfg->n_ranks, r);
    if (d < 1) {
        // say how many it would need: without offloading ceil(s / C), with it Eq. 3's minimum
        int64_t plain = s / C + (s % C != 0), need = plain;
        double rr;
        if (cfg->offload && plain <= INT32_MAX) {
            int dd = cost_min_ranks(cm, s, C, 1, (int)plain, &rr);
            if (dd >= 1) need = dd;
        }
        return bs_fail("sequence %lld (id %lld): a sequence of %lld tokens needs %lld ranks of capacity %lld%s; "
                       "only %d given",
                       (long long)i, (long long)b->seqs[i].id, (long long)s, (long long)need, (long long)C,
                       cfg->offload ? " (with offloading)" : "", cfg->n_ranks);
    }
    *D = d;
    *r = policy_offload_ratio(*r);
    return 0;
}

int policy_shard(const GlobalBatch *b, const PlanConfig *cfg, const CostModel *cm, int32_t *D, double *r) {
    for (int64_t i = 0; i < b->n; i++)
        if (policy_shard_one(b, i, cfg, cm, &D[i], &r[i]) != 0) return -1;
    return 0;
}

int policy_offload_for(const CostModel *cm, int64_t s, int64_t C, int D, double *r) {
    if (!cost_offload_ratio(cm, s, C, D, r)) return 0;
    *r = policy_offload_ratio(*r);
    return 1;
}

ItemChoice policy_item_choice(const CostModel *cm, const int64_t *segs, int n_segs, int D, double r) {
    ItemTerms terms;  // what every kind shares, computed once
    cost_item_terms(cm, segs, n_segs, D, &terms);
    ItemChoice c = {cost_ring_terms_time(cm, &terms, r), 0, 0};
    if (D <= 1 || cm->a2a_heads <= 0) return c;
    int heads = cost_a2a_max(cm, INT32_MAX);  // a group splits the query heads of a TP shard: at most that many
    if (D <= heads) {
        double t = cost_a2a_terms_time(cm, &terms, r);
        if (t < c.t) c = (ItemChoice){t, 1, 0};
    }
    // a hybrid's Ulysses group size u (r = D / u groups): cost_hybrid_next
    for (int g = cost_gcd(D, heads), u = cost_hybrid_next(1, g, D); u > 0; u = cost_hybrid_next(u, g, D)) {
        double t = cost_hybrid_terms_time(cm, &terms, u, r);
        if (t < c.t) c = (ItemChoice){t, 0, u};
    }
    return c;
}

double policy_kind_time(const CostModel *cm, const int64_t *segs, int n_segs, int D, double r, int a2a, int ulysses) {
    if (a2a) return cost_a2a_item_time(cm, segs, n_segs, D, r);
    if (ulysses > 1) return cost_hybrid_item_time(cm, segs, n_segs, ulysses, D / ulysses, r);
    return cost_item_time(cm, segs, n_segs, D, r);
}

double policy_offload_ratio(double r) {
    if (!(r > 0)) return 0;
    if (r >= 1) return 1;
    float f = (float)r;
    if ((double)f < r) f = nextafterf(f, 2.0f);
    return f > 1.0f ? 1.0 : (double)f;
}

void policy_bounds(const GlobalBatch *b, const PlanConfig *cfg, const CostModel *cm, double bounds[2]) {
    plan_bounds(b, cm, cfg->n_ranks, cfg->capacity, cfg->pp, &bounds[0], &bounds[1]);
}

// ---- best fit -----------------------------------------------------------------------------------

static void bits_set(BestFit *bf, int64_t v) {
    for (int k = 0; k < bf->levels; k++) {
        uint64_t *w = &bf->bits[k][v >> 6];
        int was_empty = *w == 0;
        *w |= 1ull << (v & 63);
        if (!was_empty) return;
        v >>= 6;
    }
}

static void bits_clear(BestFit *bf, int64_t v) {
    for (int k = 0; k < bf->levels; k++) {
        uint64_t *w = &bf->bits[k][v >> 6];
        *w &= ~(1ull << (v & 63));
        if (*w != 0) return;
        v >>= 6;
    }
}

// The smallest set value >= v, or -1.
static int64_t bits_next(const BestFit *bf, int64_t v) {
    int k = 0;
    for (;;) {
        int64_t w = v >> 6;
        if (w >= bf->n_words[k]) return -1;
        uint64_t word = bf->bits[k][w] & (~0ull << (v & 63));
        if (word) {
            v = (w << 6) + __builtin_ctzll(word);
            break;
        }
        // nothing left in this word: look for the next non-empty word one level up
        if (++k == bf->levels) return -1;
        v = w + 1;
    }
    while (k > 0) {  // descend to the first set bit under the word found
        k--;
        v = (v << 6) + __builtin_ctzll(bf->bits[k][v]);
    }
    return v;
}

int bestfit_init(BestFit *bf, int64_t capacity) {
    memset(bf, 0, sizeof *bf);
    if (capacity < 1 || capacity > POLICY_MAX_CAPACITY)
        return bs_fail("capacity %lld is outside [1, %lld] tokens", (long long)capacity, (long long)POLICY_MAX_CAPACITY);
    bf->capacity = capacity;
    bf->head = bs_keep_alloc((size_t)(capacity + 1) * sizeof(int32_t));
    if (!bf->head) return bs_fail_ctx("best-fit packing");
    for (int64_t v = 0; v <= capacity; v++) bf->head[v] = -1;
    int64_t n = capacity + 1;
    do {
        int64_t words = (n + 63) / 64;
        bf->bits[bf->levels] = bs_keep_calloc((size_t)words, sizeof(uint64_t));
        if (!bf->bits[bf->levels]) {
            bestfit_free(bf);
            return bs_fail_ctx("best-fit packing");
        }
        bf->n_words[bf->levels++] = words;
        n = words;
    } while (n > 1);
    return 0;
}

static void stack_push(BestFit *bf, int32_t bin) {
    int64_t v = bf->room[bin];
    if (v == 0) return;  // a full bin takes nothing more: forget it
    bf->below[bin] = bf->head[v];
    if (bf->head[v] < 0) bits_set(bf, v);
    bf->head[v] = bin;
}

int32_t bestfit_add(BestFit *bf, int64_t len) {
    if (len < 1 || len > bf->capacity)
        return bs_fail("best-fit packing: length %lld outside [1, %lld]", (long long)len, (long long)bf->capacity);
    int64_t v = bits_next(bf, len);
    int32_t bin;
    if (v >= 0) {
        bin = bf->head[v];
        bf->head[v] = bf->below[bin];
        if (bf->head[v] < 0) bits_clear(bf, v);
    } else {
        if (bf->n_bins == bf->cap_bins) {
            int32_t c = bf->cap_bins ? bf->cap_bins * 2 : 256;
            int32_t *below = bs_keep_realloc(bf->below, (size_t)c * sizeof(int32_t));
            if (!below) return bs_fail_ctx("best-fit packing");
            bf->below = below;
            int64_t *room = bs_keep_realloc(bf->room, (size_t)c * sizeof(int64_t));
            if (!room) return bs_fail_ctx("best-fit packing");
            bf->room = room;
            bf->cap_bins = c;
        }
        bin = bf->n_bins++;
        bf->room[bin] = bf->capacity;
    }
    bf->room[bin] -= len;
    stack_push(bf, bin);
    return bin;
}

void bestfit_free(BestFit *bf) {
    bs_keep_free(bf->head);
    bs_keep_free(bf->below);
    bs_keep_free(bf->room);
    for (int k = 0; k < bf->levels; k++) bs_keep_free(bf->bits[k]);
    memset(bf, 0, sizeof *bf);
}

// ---- rank heap -------------------------------------------------------------------------------------
//
// A 4-ary heap of (key, rank) entries: half the levels of a binary heap, and the keys sit beside the
// ranks so a comparison touches no other array. Its pops are the same as any heap's: (key, rank) is a
// total order.

static int before(RankEntry a, RankEntry b) { return a.key < b.key || (a.key == b.key && a.rank < b.rank); }

int rankheap_init(RankHeap *h, int32_t n_ranks) {
    memset(h, 0, sizeof *h);
    h->key = bs_keep_calloc((size_t)n_ranks, sizeof(double));
    h->heap = bs_keep_alloc((size_t)n_ranks * sizeof(RankEntry));
    if (!h->key || !h->heap) {
        rankheap_free(h);
        return bs_fail_ctx("rank heap of %d ranks", n_ranks);
    }
    h->n_ranks = h->n = n_ranks;  // all idle: none in the binary heap yet
    return 0;
}

// Put e at position i and move it down to its place.
static void sift_down(RankHeap *h, int32_t i, RankEntry e) {
    for (;;) {
        int32_t c = 4 * i + 1;
        if (c >= h->n_heap) break;
        int32_t end = c + 4 < h->n_heap ? c + 4 : h->n_heap, best = c;
        for (int32_t j = c + 1; j < end; j++)
            if (before(h->heap[j], h->heap[best])) best = j;
        if (!before(h->heap[best], e)) break;
        h->heap[i] = h->heap[best];
        i = best;
    }
    h->heap[i] = e;
}

// Is the least rank an idle one (never popped: key 0, served in rank order)?
static int idle_first(const RankHeap *h) {
    return h->next_idle < h->n_ranks && (h->n_heap == 0 || !before(h->heap[0], (RankEntry){0.0, h->next_idle}));
}

int32_t rankheap_pop(RankHeap *h) {
    h->n--;
    if (idle_first(h)) return h->next_idle++;
    int32_t top = h->heap[0].rank;
    RankEntry last = h->heap[--h->n_heap];
    if (h->n_heap > 0) sift_down(h, 0, last);
    return top;
}

void rankheap_push(RankHeap *h, int32_t rank, double key) {
    h->key[rank] = key;
    h->n++;
    RankEntry e = {key, rank};
    int32_t i = h->n_heap++;
    while (i > 0) {  // sift up
        int32_t parent = (i - 1) / 4;
        if (!before(e, h->heap[parent])) break;
        h->heap[i] = h->heap[parent];
        i = parent;
    }
    h->heap[i] = e;
}

int32_t rankheap_top(const RankHeap *h) { return idle_first(h) ? h->next_idle : h->heap[0].rank; }

void rankheap_replace_top(RankHeap *h, double key) {
    if (idle_first(h)) {
        int32_t r = h->next_idle++;
        h->n--;
        rankheap_push(h, r, key);
        return;
    }
    int32_t r = h->heap[0].rank;  // the top gets its new key and sinks: one pass instead of two
    h->key[r] = key;
    sift_down(h, 0, (RankEntry){key, r});
}

void rankheap_free(RankHeap *h) {
    bs_keep_free(h->key);
    bs_keep_free(h->heap);
    memset(h, 0, sizeof *h);
}

// ---- rank tree ---------------------------------------------------------------------------------------
//
// An entry is (key, rank) as one unsigned 128-bit number, key bits above rank bits: non-negative
// doubles order as their bit patterns (key + 0.0 makes -0 into +0, as before() counts them equal),
// so the numbers order as before() does, and a minimum is two compares and moves the compiler makes
// without branches. RANKTREE_OUT (every bit set) is above every key, +inf included.

#define RANKTREE_OUT (~(unsigned __int128)0)

static unsigned __int128 tree_entry(double key, int32_t rank) {
    double k = key + 0.0;
    uint64_t bits;
    memcpy(&bits, &k, sizeof bits);
    return (unsigned __int128)bits << 32 | (uint32_t)rank;
}

int ranktree_init(RankTree *t, int32_t n_ranks) {
    memset(t, 0, sizeof *t);
    int32_t size = 1;
    while (size < n_ranks) size *= 2;
    t->key = bs_keep_calloc((size_t)n_ranks, sizeof(double));
    t->node = bs_keep_alloc(2 * (size_t)size * sizeof(unsigned __int128));
    if (!t->key || !t->node) {
        ranktree_free(t);
        return bs_fail_ctx("rank tree of %d ranks", n_ranks);
    }
    memset(t->node, 0xff, 2 * (size_t)size * sizeof(unsigned __int128));  // every leaf out: all idle
    t->size = size;
    t->n_ranks = t->n = n_ranks;
    return 0;
}

// Set rank r's leaf and replay its path to the root. A push (the leaf was out) changes a node only
// while the new entry wins there: from the first node already holding the new minimum up, every one
// stays as it is. A pop or a replaced top always reaches the root (the top's entry was every node's).
static void tree_set(RankTree *t, int32_t r, unsigned __int128 v, int push) {
    unsigned __int128 *node = t->node;
    size_t i = (size_t)t->size + (size_t)r;  // unsigned and pointer-wide: no sign extension at every level
    node[i] = v;
    while (i > 1) {
        unsigned __int128 s = node[i ^ 1];
        v = s < v ? s : v;
        i >>= 1;
        if (push && node[i] == v) break;
        node[i] = v;
    }
}

// Is the least rank an idle one (never popped: key 0, served in rank order)?
static int tree_idle_first(const RankTree *t) {
    return t->next_idle < t->n_ranks && tree_entry(0.0, t->next_idle) < t->node[1];
}

int32_t ranktree_top(const RankTree *t) {
    return tree_idle_first(t) ? t->next_idle : (int32_t)(uint32_t)t->node[1];
}

int32_t ranktree_pop(RankTree *t) {
    t->n--;
    if (tree_idle_first(t)) return t->next_idle++;
    int32_t r = (int32_t)(uint32_t)t->node[1];
    uint64_t bits = (uint64_t)(t->node[1] >> 32);
    memcpy(&t->key[r], &bits, sizeof bits);  // the key it leaves with: the leaf's (key + 0.0)
    tree_set(t, r, RANKTREE_OUT, 0);
    return r;
}

void ranktree_push(RankTree *t, int32_t rank, double key) {
    t->n++;
    tree_set(t, rank, tree_entry(key, rank), 1);
}

void ranktree_replace_top(RankTree *t, double key) {
    int32_t r = tree_idle_first(t) ? t->next_idle++ : (int32_t)(uint32_t)t->node[1];
    tree_set(t, r, tree_entry(key, r), 0);
}

void ranktree_free(RankTree *t) {
    bs_keep_free(t->key);
    bs_keep_free(t->node);
    memset(t, 0, sizeof *t);
}

// ---- plans -------------------------------------------------------------------------------------------

static int reserve(void **arr, int32_t *cap, int64_t need, size_t elem) {
    if (need <= *cap) return 0;
    if (need > INT32_MAX) need = INT32_MAX;  // plan_add_item reports what does not fit
    void *q = bs_keep_realloc(*arr, (size_t)need * elem);
    if (!q) return -1;
    *arr = q;
    *cap = (int32_t)need;
    return 0;
}

int policy_plan_reserve(Plan *p, int64_t items, int64_t segs, int64_t refs) {
    if (reserve((void **)&p->items, &p->cap_items, items, sizeof(Item)) != 0 ||
        reserve((void **)&p->segs, &p->cap_segs, segs, sizeof(Segment)) != 0 ||
        reserve((void **)&p->ranks, &p->cap_refs, refs, sizeof(int32_t)) != 0)
        return bs_fail_ctx("plan: room for %lld items", (long long)items);
    return 0;
}

// An LSD radix sort of indices by a key of up to 12 bytes: hi's 8 (the significant part), then lo's 4
// (NULL: none). The keys travel with their indices (a pass reads both in order and writes each into
// its byte's bucket), so no pass looks a key up at random; every byte's counts come from one pass
// first, and a byte alike in every key moves nothing. hi and lo are the caller's scratch: permuted.
static int radix_order(uint64_t *hi, uint32_t *lo, int32_t n, int32_t *order, const char *what) {
    size_t nn = (size_t)(n > 0 ? n : 1);
    int bytes = lo ? 12 : 8;
    uint64_t *hi_to = bs_keep_alloc(nn * sizeof(uint64_t));
    uint32_t *lo_to = lo ? bs_keep_alloc(nn * sizeof(uint32_t)) : NULL;
    int32_t *other = bs_keep_alloc(nn * sizeof(int32_t));
    int32_t(*count)[257] = bs_keep_calloc(12, sizeof *count);
    int rc = -1;
    if (!hi_to || (lo && !lo_to) || !other || !count) {
        bs_fail_ctx("ordering %d %s", n, what);
        goto out;
    }
    for (int32_t i = 0; i < n; i++) {
        order[i] = i;
        for (int d = 0; d < 8; d++) count[d][((hi[i] >> (8 * d)) & 0xff) + 1]++;
        if (lo)
            for (int d = 0; d < 4; d++) count[8 + d][((lo[i] >> (8 * d)) & 0xff) + 1]++;
    }
    uint64_t *hf = hi, *ht = hi_to;
    uint32_t *lf = lo, *lt = lo_to;
    int32_t *from = order, *to = other;
    for (int pass = 0; pass < bytes; pass++) {
        int d = lo ? (pass + 8) % 12 : pass;  // lo's bytes first: they matter least
        int32_t *c = count[d];
        int skip = 0;  // every key has this byte alike: nothing to move
        for (int v = 1; v <= 256; v++) skip |= c[v] == n;
        if (skip) continue;
        for (int v = 0; v < 256; v++) c[v + 1] += c[v];
        for (int32_t i = 0; i < n; i++) {  // stable
            unsigned byte = d < 8 ? (unsigned)(hf[i] >> (8 * d)) & 0xff : (lf[i] >> (8 * (d - 8))) & 0xff;
            int32_t at = c[byte]++;
            ht[at] = hf[i];
            if (lo) lt[at] = lf[i];
            to[at] = from[i];
        }
        uint64_t *th = hf;
        hf = ht;
        ht = th;
        uint32_t *tl = lf;
        lf = lt;
        lt = tl;
        int32_t *t = from;
        from = to;
        to = t;
    }
    if (from != order) memcpy(order, from, nn * sizeof(int32_t));
    rc = 0;
out:
    bs_keep_free(hi_to);
    bs_keep_free(lo_to);
    bs_keep_free(other);
    bs_keep_free(count);
    return rc;
}

// A time's bits: non-negative doubles order as their bit patterns (-0 as +0); desc flips them, so
// that the larger time sorts first.
static uint64_t time_bits(double t, int desc) {
    double k = t + 0.0;  // -0 becomes +0
    uint64_t u;
    memcpy(&u, &k, sizeof k);
    return desc ? ~u : u;
}

int policy_order_by_time(const double *key, int32_t n, int32_t *order) {
    uint64_t *bits = bs_keep_alloc((size_t)(n > 0 ? n : 1) * sizeof(uint64_t));
    if (!bits) return bs_fail_ctx("ordering %d items by time", n);
    for (int32_t i = 0; i < n; i++) bits[i] = time_bits(key[i], 0);
    int rc = radix_order(bits, NULL, n, order, "items by time");
    bs_keep_free(bits);
    return rc;
}

int policy_sort_by_time_desc(void *items, int32_t n, size_t size, size_t time_at, size_t tie_at) {
    size_t nn = (size_t)(n > 0 ? n : 1);
    char *base = items, *was = bs_keep_alloc(nn * size);
    double *t = bs_keep_alloc(nn * sizeof(double));
    int32_t *tie = bs_keep_alloc(nn * sizeof(int32_t)), *order = bs_keep_alloc(nn * sizeof(int32_t));
    int rc = was && t && tie && order ? 0 : bs_fail_ctx("ordering %d items by time", n);
    for (int32_t k = 0; rc == 0 && k < n; k++) {
        memcpy(&t[k], base + (size_t)k * size + time_at, sizeof(double));
        memcpy(&tie[k], base + (size_t)k * size + tie_at, sizeof(int32_t));
    }
    if (rc == 0) {
        memcpy(was, base, (size_t)n * size);
        rc = policy_order_by_time_desc(t, tie, n, order);
    }
    for (int32_t k = 0; rc == 0 && k < n; k++) memcpy(base + (size_t)k * size, was + (size_t)order[k] * size, size);
    bs_keep_free(was);
    bs_keep_free(t);
    bs_keep_free(tie);
    bs_keep_free(order);
    return rc;
}

int policy_order_by_time_desc(const double *key, const int32_t *tie, int32_t n, int32_t *order) {
    size_t nn = (size_t)(n > 0 ? n : 1);
    uint64_t *bits = bs_keep_alloc(nn * sizeof(uint64_t));
    uint32_t *ties = bs_keep_alloc(nn * sizeof(uint32_t));
    if (!bits || !ties) {
        bs_keep_free(bits);
        bs_keep_free(ties);
        return bs_fail_ctx("ordering %d items by time", n);
    }
    for (int32_t i = 0; i < n; i++) {
        bits[i] = time_bits(key[i], 1);
        ties[i] = (uint32_t)tie[i];
    }
    int rc = radix_order(bits, ties, n, order, "items by time");
    bs_keep_free(bits);
    bs_keep_free(ties);
    return rc;
}

static int by_rank(const void *a, const void *b) {
    int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    return (x > y) - (x < y);
}

// The members come out of the rank queue least-loaded first, mostly runs of ranks freed together and
// so already ascending: an insertion sort is then a pass over them, without qsort's call per compare.
// A long list in no such order goes to qsort. (Distinct ranks: any correct sort gives this order.)
void policy_sort_ranks(int32_t *ranks, int n) {
    int64_t moves = 0;
    for (int i = 1; i < n; i++) {
        int32_t v = ranks[i];
        int j = i;
        for (; j > 0 && ranks[j - 1] > v; j--) ranks[j] = ranks[j - 1];
        ranks[j] = v;
        moves += i - j;
        if (moves > 8 * (int64_t)n) {  // far from sorted: the rest by qsort
            qsort(ranks, (size_t)n, sizeof(int32_t), by_rank);
            return;
        }
    }
}

void ring_fill_clear(RingFill *f) {
    f->base = f->most = 0;
    memset(f->extra, 0, (size_t)f->D * sizeof *f->extra);
}

int64_t ring_fill_add(RingFill *f, int64_t len) {
    int64_t parts = 2 * f->D, rem = len % parts, touched = rem < f->D ? rem : f->D;
    f->base += 2 * (len / parts);
    for (int64_t i = 0; i < touched; i++) {
        f->extra[i] += 1 + (i >= parts - rem);
        if (f->extra[i] > f->most) f->most = f->extra[i];
    }
    return f->base + f->most;
}

int64_t ring_fill_peek(const RingFill *f, int64_t len) {
    int64_t parts = 2 * f->D, rem = len % parts, touched = rem < f->D ? rem : f->D, most = f->most;
    for (int64_t i = 0; i < touched; i++) {
        int64_t e = f->extra[i] + 1 + (i >= parts - rem);
        if (e > most) most = e;
    }
    return f->base + 2 * (len / parts) + most;
}

int policy_mesh(const GlobalBatch *b, const PlanConfig *cfg, int64_t *d_cp, int32_t *d_dp) {
    int64_t C = cfg->capacity, longest = 0;
    for (int64_t i = 0; i < b->n; i++)
        if (b->seqs[i].len > longest) longest = b->seqs[i].len;
    int64_t context = cfg->context > 0 ? cfg->context : longest;
    for (int64_t i = 0; i < b->n; i++)
        if (b->seqs[i].len > context)
            return bs_fail("sequence %lld (id %lld) has %lld tokens, more than the context of %lld (cut the batch to "
                           "the context first)",
                           (long long)i, (long long)b->seqs[i].id, (long long)b->seqs[i].len, (long long)context);
    *d_cp = context / C + (context % C != 0);
    if (*d_cp < 1) *d_cp = 1;
    if (b->n > 0 && *d_cp > cfg->n_ranks)
        return bs_fail("a sequence of %lld tokens needs %lld ranks of capacity %lld; only %d given", (long long)context,
                       (long long)*d_cp, (long long)C, cfg->n_ranks);
    *d_dp = *d_cp <= cfg->n_ranks ? cfg->n_ranks / (int32_t)*d_cp : 0;
    return 0;
}
