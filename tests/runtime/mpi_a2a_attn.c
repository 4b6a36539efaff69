// mpi_a2a_attn.c: all-to-all (Ulysses) and hybrid attention over D = 2 .. ranks members equal
// one-process attention.
// ranks: 2 3 4
// sanitizer ranks: 4
//
// Every trial builds the same plan on every rank from one seed: a batch of random sequences and, for
// each D, items of every kind that runs on D members, on one A2aAttn (buffers grow and are reused):
//   item 0  an all-to-all group over ranks 0..D-1 shuffled, small segments (one shorter than 2D:
//           members with empty chunks);
//   item 1  an all-to-all group over a random D-subset of all ranks, several larger segments;
//   item 2  a ring over the same members (the executor's other attention, between all-to-alls);
//   item 3  a hybrid (a ring of D / u groups of u) for every u with 2 <= u < D dividing D;
// with head shapes that split every way: H = 4 with 4, 2, 1 K/V heads (u above the K/V heads:
// replicated K/V whose gradients sum back), and H = 6 with 3 K/V heads, where u = 2 gives member 0
// heads 0-2 reading K/V 0, 0, 1 (no whole GQA groups: one K/V head per query head is sent); and a
// group wider than the query heads is refused.
#include "runtime/mpi_attn_check.h"

#include "bytescale/a2a_attn.h"
#include "bytescale/ring_attn.h"
#include "bytescale/timer.h"

typedef struct {
    A2aAttn *a;
    RingAttn *r;
} Under;

static AttnOps prepare(void *ctx, const Plan *p, int32_t k, int me) {
    Under *u = ctx;
    if (plan_item_kind(p, k) == ITEM_RING) {
        CHECK_OK(ring_attn_prepare(u->r, p, k));
        return ring_attn_ops(u->r);
    }
    CHECK_OK(a2a_attn_prepare(u->a, p, k));
    int g = plan_item_kind(p, k) == ITEM_HYBRID ? p->items[k].ulysses : p->items[k].n_ranks;
    CHECK(u->a->u == g && u->a->me == me % g && u->a->hybrid == (g < p->items[k].n_ranks),
          "item %d: prepare gives a group of %d, member %d, hybrid %d", k, u->a->u, u->a->me, u->a->hybrid);
    return a2a_attn_ops(u->a);
}

// The heads every member computes cover each query head once, and each member receives the K/V heads
// its query heads read (checked on the prepared split).
static void after(void *ctx, const Plan *p, int32_t k) {
    Under *u = ctx;
    if (plan_item_kind(p, k) == ITEM_RING) return;
    const A2aAttn *a = u->a;
    int H = a->shape.n_heads, G = H / a->shape.n_kv_heads, next = 0;
    for (int d = 0; d < a->u; d++) {
        int n = a->nq[d], nk = a->nk[d];
        CHECK(n >= 1 && nk >= 1 && n % nk == 0, "item %d member %d: %d query heads, %d K/V heads", k, d, n, nk);
        for (int i = 0; i < n; i++) {
            CHECK(a->qh[d * H + i] == next++, "item %d member %d: query heads out of order", k, d);
            CHECK(a->kvh[d * H + i / (n / nk)] == a->qh[d * H + i] / G, "item %d member %d: query head %d reads K/V %d",
                  k, d, a->qh[d * H + i], a->kvh[d * H + i / (n / nk)]);
        }
    }
    CHECK(next == H, "item %d: the members compute %d of %d heads", k, next, H);
}

static int32_t add_item(Plan *p, const Segment *segs, int ns, const int32_t *ranks, int D, int a2a, int u) {
    int32_t k = plan_add_item(p, segs, ns, ranks, D, 0);
    CHECK(k >= 0, "%s", bs_errmsg());
    p->items[k].a2a = a2a;
    p->items[k].ulysses = u;
    return k;
}

static void run_trial(int D, int trial, int *hybrids) {
    Comm *c = mpi_comm;
    Rng rng;
    rng_seed(&rng, 0xa2a00000u + (uint64_t)D * 1000 + (uint64_t)trial);
    static const AttnShape shapes[] = {{4, 2, 16}, {4, 4, 16}, {4, 1, 16}, {6, 3, 8}};
    AttnShape s = shapes[trial % 4];

    GlobalBatch b;
    CHECK_OK(batch_init(&b, N_SEQS));
    for (int i = 0; i < N_SEQS; i++) CHECK_OK(batch_push(&b, i, 1 + (int64_t)rng_below(&rng, SEQ_MAX), -1));
    CHECK_OK(batch_push(&b, N_SEQS, SEQ_MAX, -1));
    Plan p;
    CHECK_OK(plan_init(&p, &b, c->size, 1 << 20, 1, "test"));
    int32_t ranks[8], all[256];
    CHECK(c->size <= 256, "at most 256 ranks");
    Segment segs[4];
    for (int i = 0; i < D; i++) ranks[i] = i;
    shuffle(ranks, D, &rng);
    int ns = 1 + (int)rng_below(&rng, 4);
    segs[0] = random_segment(&b, &rng, 1, 2 * D - 1);
    for (int j = 1; j < ns; j++) segs[j] = random_segment(&b, &rng, 1, 60);
    add_item(&p, segs, ns, ranks, D, 1, 0);
    for (int i = 0; i < c->size; i++) all[i] = i;
    shuffle(all, c->size, &rng);
    ns = 2 + (int)rng_below(&rng, 3);
    for (int j = 0; j < ns; j++) segs[j] = random_segment(&b, &rng, 40, SEQ_MAX);
    add_item(&p, segs, ns, all, D, 1, 0);
    add_item(&p, segs, ns, all, D, 0, 0);
    for (int u = 2; u < D; u++)
        if (D % u == 0) {
            for (int j = 0; j < ns; j++) segs[j] = random_segment(&b, &rng, 20, SEQ_MAX);
            add_item(&p, segs, ns, all, D, 0, u);
            (*hybrids)++;
        }
    CHECK_OK(plan_finalize(&p, NULL));

    A2aAttn a;
    RingAttn r;
    a2a_attn_init(&a, c, s);
    ring_attn_init(&r, c, s);
    Under under = {.a = &a, .r = &r};
    AttnUnderTest ut = {.prepare = prepare, .after = after, .ctx = &under};
    char tag[80];
    snprintf(tag, sizeof tag, "D %d trial %d (heads %d, kv heads %d)", D, trial, s.n_heads, s.n_kv_heads);
    for (int32_t k = 0; k < p.n_items; k++) run_item(&ut, &p, k, s, &rng, tag);
    a2a_attn_free(&a);
    ring_attn_free(&r);
    plan_free(&p);
    batch_free(&b);
}

// A group with more members than the shard has query heads is refused with the numbers, before any
// message (every member refuses it on its own).
static void check_head_limit(void) {
    Comm *c = mpi_comm;
    GlobalBatch b;
    CHECK_OK(batch_init(&b, 1));
    CHECK_OK(batch_push(&b, 0, 100, -1));
    Plan p;
    CHECK_OK(plan_init(&p, &b, c->size, 1 << 20, 1, "test"));
    int32_t ranks[256];
    for (int i = 0; i < c->size; i++) ranks[i] = i;
    Segment seg = {.seq = 0, .start = 0, .len = 100};
    add_item(&p, &seg, 1, ranks, c->size, 1, 0);
    CHECK_OK(plan_finalize(&p, NULL));
    A2aAttn a;
    a2a_attn_init(&a, c, (AttnShape){.n_heads = c->size - 1, .n_kv_heads = 1, .head_dim = 8});
    CHECK(a2a_attn_prepare(&a, &p, 0) == -1 && strstr(bs_errmsg(), "query heads") != NULL,
          "a group of %d on %d query heads: %s", c->size, c->size - 1, bs_errmsg());
    n_checks++;
    a2a_attn_free(&a);
    plan_free(&p);
    batch_free(&b);
}

int main(int argc, char **argv) {
    mpi_test_init(&argc, &argv);
    Comm *c = mpi_comm;
    int hybrids = 0;
    enum { TRIALS = 8 };
    for (int D = 2; D <= c->size; D++) {
        double t0 = now_seconds();
        for (int t = 0; t < TRIALS; t++) run_trial(D, t, &hybrids);
        if (c->rank == 0) printf("all-to-all of %d: %d trials ok (%.2f s)\n", D, TRIALS, now_seconds() - t0);
        fflush(stdout);
    }
    CHECK(c->size < 4 || hybrids > 0, "no hybrid item ran on %d ranks", c->size);
    check_head_limit();
    return mpi_test_done("all-to-all attention", n_checks);
}
