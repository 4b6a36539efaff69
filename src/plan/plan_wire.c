// plan_wire.c: the plan's compact binary form, for broadcasting it from the planning rank (plan.h).
//
// Native byte order and struct-free: the ranks of one job run the same build on the same kind of
// machine. A header with a magic number and the counts, then the arrays back to back:
//   header | seqs (id, len, src: int64) | items (seg_begin, n_segs, rank_begin, n_ranks: int32,
//   offload: float32, est_time: float64) | segs (seq: int32, start, len: int64) | ranks (int32)
// Unpacking checks every count against the size, then finalizes and validates the plan, so a
// damaged message is refused with a reason, never executed.
// Version 2 (only for plans with the peers' fields, docs/peers.md; every other plan is still sent as
// version 1, byte for byte as before): the header goes on with n_barriers and n_delayed (int32), and
// after the ranks come the barriers and the delayed sequences (int32 each) and one a2a byte per item.
// Version 3 (only for plans with block items, the block peer): version 2, then the owner of every
// segment (Plan.seg_owner, int32 each).
// Versions 4 and 5 (only for plans with hybrid items, Item.ulysses): version 2 and 3 respectively,
// then the Ulysses group size of every item (int32 each, 0 for every other kind).
#include <stdlib.h>
#include <string.h>

#include "bytescale/error.h"
#include "bytescale/plan.h"

#define WIRE_MAGIC 0x4c505342u  // "BSPL"
#define WIRE_VERSION 1u
#define WIRE_VERSION_PEERS 2u
#define WIRE_VERSION_BLOCKS 3u
#define WIRE_VERSION_HYBRID 4u         // version 2 + ulysses
#define WIRE_VERSION_BLOCKS_HYBRID 5u  // version 3 + ulysses

static int has_hybrid(const Plan *p) {
    for (int32_t k = 0; k < p->n_items; k++)
        if (p->items[k].ulysses) return 1;
    return 0;
}

static int has_peer_fields(const Plan *p) {
    if (p->n_barriers > 0 || p->n_delayed > 0) return 1;
    for (int32_t k = 0; k < p->n_items; k++)
        if (p->items[k].a2a) return 1;
    return 0;
}

typedef struct {
    uint8_t *p;
    size_t at, cap;
} Out;

static void put(Out *o, const void *v, size_t n) {
    if (o->p && n > 0) memcpy(o->p + o->at, v, n);  // (v may be NULL for an empty array)
    o->at += n;
}

typedef struct {
    const uint8_t *p;
    size_t at, size;
    int bad;
} In;

static void get(In *in, void *v, size_t n) {
    if (in->bad || n > in->size - in->at) {
        in->bad = 1;
        memset(v, 0, n);
        return;
    }
    memcpy(v, in->p + in->at, n);
    in->at += n;
}

// Write p into o (o->p NULL: only count the bytes).
static void emit(const Plan *p, Out *o) {
    int blocks = p->seg_owner != NULL, hybrid = has_hybrid(p), peers = blocks || hybrid || has_peer_fields(p);
    uint32_t magic = WIRE_MAGIC, version = blocks ? WIRE_VERSION_BLOCKS : peers ? WIRE_VERSION_PEERS : WIRE_VERSION;
    if (hybrid) version = blocks ? WIRE_VERSION_BLOCKS_HYBRID : WIRE_VERSION_HYBRID;
    put(o, &magic, 4);
    put(o, &version, 4);
    put(o, &p->n_ranks, 4);
    put(o, &p->pp, 4);
    put(o, &p->capacity, 8);
    put(o, p->policy, sizeof p->policy);
    put(o, &p->batch.n, 8);
    put(o, &p->n_items, 4);
    put(o, &p->n_segs, 4);
    put(o, &p->n_refs, 4);
    put(o, &p->lower_bound, 8);
    if (peers) {
        put(o, &p->n_barriers, 4);
        put(o, &p->n_delayed, 4);
    }
    for (int64_t i = 0; i < p->batch.n; i++) {
        const Sequence *s = &p->batch.seqs[i];
        put(o, &s->id, 8);
        put(o, &s->len, 8);
        put(o, &s->src, 8);
    }
    for (int32_t k = 0; k < p->n_items; k++) {
        const Item *it = &p->items[k];
        put(o, &it->seg_begin, 4);
        put(o, &it->n_segs, 4);
        put(o, &it->rank_begin, 4);
        put(o, &it->n_ranks, 4);
        put(o, &it->offload, 4);
        put(o, &it->est_time, 8);
    }
    for (int32_t j = 0; j < p->n_segs; j++) {
        put(o, &p->segs[j].seq, 4);
        put(o, &p->segs[j].start, 8);
        put(o, &p->segs[j].len, 8);
    }
    put(o, p->ranks, (size_t)p->n_refs * 4);
    if (!peers) return;
    put(o, p->barriers, (size_t)p->n_barriers * 4);
    put(o, p->delayed, (size_t)p->n_delayed * 4);
    for (int32_t k = 0; k < p->n_items; k++) {
        uint8_t a = (uint8_t)p->items[k].a2a;
        put(o, &a, 1);
    }
    if (blocks) put(o, p->seg_owner, (size_t)p->n_segs * 4);
    for (int32_t k = 0; hybrid && k < p->n_items; k++) put(o, &p->items[k].ulysses, 4);
}

int plan_pack(const Plan *p, uint8_t **buf, size_t *size) {
    Out count = {0};
    emit(p, &count);
    uint8_t *b = bs_malloc(count.at);
    if (!b) return bs_fail_ctx("packing a plan of %zu bytes", count.at);
    Out o = {.p = b, .cap = count.at};
    emit(p, &o);
    *buf = b;
    *size = o.at;
    return 0;
}

// Version 3's tail: the owner of every segment. -1 + error (the plan freed) on no memory.
static int get_owners(Plan *p, In *in, int32_t n_segs) {
    p->seg_owner = bs_malloc((size_t)(n_segs > 0 ? n_segs : 1) * sizeof(int32_t));
    if (!p->seg_owner) {
        plan_free(p);
        return bs_fail_ctx("plan message");
    }
    p->cap_owner = n_segs;
    get(in, p->seg_owner, (size_t)n_segs * 4);
    return 0;
}

// The header as the message gives it, and what its version says follows the ranks.
typedef struct {
    uint32_t magic, version;
    int32_t n_ranks, pp, n_items, n_segs, n_refs, n_barriers, n_delayed;
    int64_t capacity, n_seqs;
    char policy[sizeof(((Plan *)0)->policy)];  // Plan.policy's size
    double lower_bound;
    int blocks, hybrid, peers;  // version 3 or 5; 4 or 5; 2 or later
} Header;

// The header, and every count checked against the bytes that follow, before anything is
// allocated. 0, or -1 + error.
static int get_header(Header *h, In *in, size_t size) {
    memset(h, 0, sizeof *h);
    get(in, &h->magic, 4);
    get(in, &h->version, 4);
    get(in, &h->n_ranks, 4);
    get(in, &h->pp, 4);
    get(in, &h->capacity, 8);
    get(in, h->policy, sizeof h->policy);
    get(in, &h->n_seqs, 8);
    get(in, &h->n_items, 4);
    get(in, &h->n_segs, 4);
    get(in, &h->n_refs, 4);
    get(in, &h->lower_bound, 8);
    if (in->bad || h->magic != WIRE_MAGIC) return bs_fail("plan message: %zu bytes, not a packed plan", size);
    if (h->version < WIRE_VERSION || h->version > WIRE_VERSION_BLOCKS_HYBRID)
        return bs_fail("plan message: version %u, this build reads %u to %u", h->version, WIRE_VERSION,
                       WIRE_VERSION_BLOCKS_HYBRID);
    h->blocks = h->version == WIRE_VERSION_BLOCKS || h->version == WIRE_VERSION_BLOCKS_HYBRID;
    h->hybrid = h->version >= WIRE_VERSION_HYBRID, h->peers = h->version >= WIRE_VERSION_PEERS;
    if (h->peers) {
        get(in, &h->n_barriers, 4);
        get(in, &h->n_delayed, 4);
        if (in->bad) return bs_fail("plan message: %zu bytes, not a packed plan", size);
    }
    h->policy[sizeof h->policy - 1] = '\0';
    size_t rest = size - in->at;
    uint64_t peer_bytes =
        h->peers ? (uint64_t)h->n_barriers * 4 + (uint64_t)h->n_delayed * 4 + (uint64_t)h->n_items : 0;
    if (h->blocks) peer_bytes += (uint64_t)h->n_segs * 4;
    if (h->hybrid) peer_bytes += (uint64_t)h->n_items * 4;
    if (h->n_seqs < 0 || h->n_items < 0 || h->n_segs < 0 || h->n_refs < 0 || h->n_barriers < 0 || h->n_delayed < 0 ||
        (uint64_t)h->n_seqs * 24 + (uint64_t)h->n_items * 28 + (uint64_t)h->n_segs * 20 + (uint64_t)h->n_refs * 4 +
                peer_bytes !=
            rest)
        return bs_fail("plan message: counts (%lld sequences, %d items, %d segments, %d rank refs) do not match its "
                       "%zu bytes",
                       (long long)h->n_seqs, h->n_items, h->n_segs, h->n_refs, size);
    return 0;
}

// The batch, and an empty plan of it. 0, or -1 + error (nothing to free).
static int get_batch(Plan *p, In *in, const Header *h) {
    GlobalBatch b = {.n = h->n_seqs, .seqs = bs_malloc((size_t)(h->n_seqs > 0 ? h->n_seqs : 1) * sizeof(Sequence))};
    if (!b.seqs) return bs_fail_ctx("plan message");
    for (int64_t i = 0; i < h->n_seqs; i++) {
        get(in, &b.seqs[i].id, 8);
        get(in, &b.seqs[i].len, 8);
        get(in, &b.seqs[i].src, 8);
        b.n_tokens += b.seqs[i].len;
    }
    int rc = plan_init(p, &b, h->n_ranks, h->capacity, h->pp, h->policy);
    free(b.seqs);
    if (rc != 0) return bs_fail_ctx("plan message");
    return 0;
}

// The items, segments and rank references. 0, or -1 + error (the plan freed).
static int get_items(Plan *p, In *in, const Header *h) {
    int32_t n_items = h->n_items, n_segs = h->n_segs, n_refs = h->n_refs;
    p->items = bs_malloc((size_t)(n_items > 0 ? n_items : 1) * sizeof(Item));
    p->segs = bs_malloc((size_t)(n_segs > 0 ? n_segs : 1) * sizeof(Segment));
    p->ranks = bs_malloc((size_t)(n_refs > 0 ? n_refs : 1) * sizeof(int32_t));
    if (!p->items || !p->segs || !p->ranks) {
        plan_free(p);
        return bs_fail_ctx("plan message");
    }
    p->n_items = p->cap_items = n_items;
    p->n_segs = p->cap_segs = n_segs;
    p->n_refs = p->cap_refs = n_refs;
    for (int32_t k = 0; k < n_items; k++) {
        Item *it = &p->items[k];
        memset(it, 0, sizeof *it);
        get(in, &it->seg_begin, 4);
        get(in, &it->n_segs, 4);
        get(in, &it->rank_begin, 4);
        get(in, &it->n_ranks, 4);
        get(in, &it->offload, 4);
        get(in, &it->est_time, 8);
    }
    for (int32_t j = 0; j < n_segs; j++) {
        get(in, &p->segs[j].seq, 4);
        get(in, &p->segs[j].start, 8);
        get(in, &p->segs[j].len, 8);
    }
    get(in, p->ranks, (size_t)n_refs * 4);
    return 0;
}

// Version 2's tail: the barriers, the delayed sequences, every item's a2a byte. 0, or -1 + error
// (the plan freed) on no memory.
static int get_peers(Plan *p, In *in, const Header *h) {
    p->barriers = bs_malloc((size_t)(h->n_barriers > 0 ? h->n_barriers : 1) * sizeof(int32_t));
    p->delayed = bs_malloc((size_t)(h->n_delayed > 0 ? h->n_delayed : 1) * sizeof(int32_t));
    if (!p->barriers || !p->delayed) {
        plan_free(p);
        return bs_fail_ctx("plan message");
    }
    p->n_barriers = p->cap_barriers = h->n_barriers;
    p->n_delayed = p->cap_delayed = h->n_delayed;
    get(in, p->barriers, (size_t)h->n_barriers * 4);
    get(in, p->delayed, (size_t)h->n_delayed * 4);
    for (int32_t k = 0; k < h->n_items; k++) {
        uint8_t a = 0;
        get(in, &a, 1);
        p->items[k].a2a = a;
    }
    return 0;
}

int plan_unpack(Plan *p, const uint8_t *buf, size_t size) {
    memset(p, 0, sizeof *p);
    In in = {.p = buf, .size = size};
    Header h;
    if (get_header(&h, &in, size) != 0 || get_batch(p, &in, &h) != 0 || get_items(p, &in, &h) != 0) return -1;
    if (h.peers && get_peers(p, &in, &h) != 0) return -1;
    if (h.blocks && get_owners(p, &in, h.n_segs) != 0) return -1;
    for (int32_t k = 0; h.hybrid && k < h.n_items; k++) get(&in, &p->items[k].ulysses, 4);
    // item token counts are derived, as plan_add_item does, from segments checked to be in range
    for (int32_t k = 0; k < h.n_items && !in.bad; k++) {
        Item *it = &p->items[k];
        if (it->n_segs < 1 || it->seg_begin < 0 || (int64_t)it->seg_begin + it->n_segs > h.n_segs) break;
        for (int32_t j = 0; j < it->n_segs; j++) it->tokens += p->segs[it->seg_begin + j].len;
    }
    // then the plan as a whole: a damaged message is refused with a reason, never executed
    if (in.bad || plan_finalize(p, NULL) != 0 || plan_validate(p, NULL) != 0) {
        bs_fail_ctx("plan message (%zu bytes)", size);
        plan_free(p);
        return -1;
    }
    p->lower_bound = h.lower_bound;
    return 0;
}
