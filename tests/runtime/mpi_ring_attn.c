// mpi_ring_attn.c: ring attention over D = 2 .. min(8, ranks) members equals one-process attention.
// ranks: 2 3 8
//
// Every trial builds the same plan on every rank from one seed: a batch of random sequences and
// three ring items of D members each (random sub-ranges of sequences as segments, uneven lengths):
//   item 0  small segments, one shorter than 2D (empty chunks), over ranks 0..D-1 in a shuffled order;
//   item 1  larger segments (buffers grow), over a random D-subset of ALL ranks in a random order;
//   item 2  every segment shorter than D, so member D-1 holds no rows (buffers are reused, larger);
// One RingAttn per trial runs the items in order. For each item, two layers of random q, k, v, dout
// are run as a model does (forward 0, forward 1, backward 1, backward 0) and every member's out, lse,
// dq, dk, dv are compared with the one-process kernel over all the item's rows. Ranks outside an
// item only take part in the error reductions.
#include "runtime/mpi_attn_check.h"

#include "bytescale/ring_attn.h"
#include "bytescale/timer.h"

// Ring attention under test: prepare checks the ring's view of the item, after its step count.
typedef struct {
    RingAttn *r;
    int64_t steps0;
} RingUnderTest;

static AttnOps ring_prepare(void *ctx, const Plan *p, int32_t k, int me) {
    RingUnderTest *t = ctx;
    CHECK_OK(ring_attn_prepare(t->r, p, k));
    CHECK(t->r->D == p->items[k].n_ranks && t->r->me == me, "item %d: prepare gives D %d me %d, expected %d %d", k,
          t->r->D, t->r->me, p->items[k].n_ranks, me);
    t->steps0 = t->r->stats.steps;
    return ring_attn_ops(t->r);
}

static void ring_after(void *ctx, const Plan *p, int32_t k) {
    RingUnderTest *t = ctx;
    int D = p->items[k].n_ranks;
    CHECK(t->r->stats.steps - t->steps0 == (int64_t)2 * N_LAYERS * D, "item %d: %lld ring steps, expected %d", k,
          (long long)(t->r->stats.steps - t->steps0), 2 * N_LAYERS * D);
}

// Whether some member of item k holds no rows.
static int has_empty_member(const Plan *p, int32_t k) {
    for (int m = 0; m < p->items[k].n_ranks; m++)
        if (mb_member_rows(p, k, m) == 0) return 1;
    return 0;
}

static void run_trial(int D, int trial, int *empty_seen) {
    Comm *c = mpi_comm;
    Rng rng;
    rng_seed(&rng, 0x5eed0000u + (uint64_t)D * 1000 + (uint64_t)trial);
    static const int kv_heads[] = {2, 4, 1};
    AttnShape s = {.n_heads = 4, .n_kv_heads = kv_heads[trial % 3], .head_dim = 16};

    GlobalBatch b;
    CHECK_OK(batch_init(&b, N_SEQS));
    for (int i = 0; i < N_SEQS; i++) CHECK_OK(batch_push(&b, i, 1 + (int64_t)rng_below(&rng, SEQ_MAX), -1));
    CHECK_OK(batch_push(&b, N_SEQS, SEQ_MAX, -1));  // one long enough for any segment
    Plan p;
    CHECK_OK(plan_init(&p, &b, c->size, 1 << 20, 1, "test"));

    int32_t ranks[8], all[256];
    CHECK(c->size <= 256, "at most 256 ranks");
    Segment segs[4];
    // item 0: small segments, the first shorter than 2D; ranks 0..D-1 shuffled, never in rank order
    for (int i = 0; i < D; i++) ranks[i] = i;
    shuffle(ranks, D, &rng);
    if (ranks[0] == 0 && ranks[1] == 1) ranks[0] = 1, ranks[1] = 0;
    int ns = 1 + (int)rng_below(&rng, 4);
    segs[0] = random_segment(&b, &rng, 1, 2 * D - 1);
    for (int j = 1; j < ns; j++) segs[j] = random_segment(&b, &rng, 1, 60);
    CHECK(plan_add_item(&p, segs, ns, ranks, D, 0) == 0, "%s", bs_errmsg());
    // item 1: larger segments over a random D-subset of all ranks
    for (int i = 0; i < c->size; i++) all[i] = i;
    shuffle(all, c->size, &rng);
    ns = 2 + (int)rng_below(&rng, 3);
    for (int j = 0; j < ns; j++) segs[j] = random_segment(&b, &rng, 40, SEQ_MAX);
    if (segs[0].len % (2 * D) == 0) segs[0].len--;  // uneven for sure
    CHECK(plan_add_item(&p, segs, ns, all, D, 0) == 1, "%s", bs_errmsg());
    // item 2: every segment shorter than D (at D = 2: one token), so member D-1 holds nothing
    for (int i = 0; i < D; i++) ranks[i] = i;
    shuffle(ranks, D, &rng);
    ns = 1 + (int)rng_below(&rng, 4);
    for (int j = 0; j < ns; j++) segs[j] = random_segment(&b, &rng, 1, D > 2 ? D - 1 : 1);
    CHECK(plan_add_item(&p, segs, ns, ranks, D, 0) == 2, "%s", bs_errmsg());
    CHECK_OK(plan_finalize(&p, NULL));
    CHECK(mb_member_rows(&p, 2, D - 1) == 0, "item 2: member %d holds rows", D - 1);
    *empty_seen |= has_empty_member(&p, 2);

    RingAttn r;
    ring_attn_init(&r, c, s);
    // a few trials cut the query rows into small slices (many kernel calls and progress calls per block)
    if (trial % 2 == 1) r.slice_rows = 1 + (int)rng_below(&rng, 16);
    char tag[64];
    snprintf(tag, sizeof tag, "D %d trial %d (kv heads %d, slice %d)", D, trial, s.n_kv_heads, r.slice_rows);
    int64_t cap0 = 0;
    RingUnderTest rt = {.r = &r};
    AttnUnderTest ut = {.prepare = ring_prepare, .after = ring_after, .ctx = &rt};
    for (int32_t k = 0; k < p.n_items; k++) {
        run_item(&ut, &p, k, s, &rng, tag);
        if (k == 1 && mb_member_index(&p, 0, c->rank) >= 0 && mb_member_index(&p, 1, c->rank) >= 0)
            CHECK(r.cap_buf >= cap0, "buffers shrank");
        if (k == 0) cap0 = r.cap_buf;
    }
    ring_attn_free(&r);
    plan_free(&p);
    batch_free(&b);
}

int main(int argc, char **argv) {
    mpi_test_init(&argc, &argv);
    Comm *c = mpi_comm;
    int max_D = c->size < 8 ? c->size : 8, empty_seen = 0;
    enum { TRIALS = 6 };
    for (int D = 2; D <= max_D; D++) {
        double t0 = now_seconds();
        for (int t = 0; t < TRIALS; t++) run_trial(D, t, &empty_seen);
        if (c->rank == 0) printf("ring of %d: %d trials ok (%.2f s)\n", D, TRIALS, now_seconds() - t0);
        fflush(stdout);
    }
    CHECK(empty_seen, "no trial had a member without rows");
    return mpi_test_done("ring attention", n_checks);
}
