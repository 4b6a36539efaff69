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
#include "runtime/mpi_util.h"

#include <stdint.h>

#include "bytescale/attention.h"
#include "bytescale/batch.h"
#include "bytescale/microbatch.h"
#include "bytescale/plan.h"
#include "bytescale/ring_attn.h"
#include "bytescale/rng.h"
#include "bytescale/timer.h"

enum { N_LAYERS = 2, N_SEQS = 10, SEQ_MAX = 220 };

static void *xcalloc(size_t n, size_t size) {
    void *p = calloc(n ? n : 1, size);
    CHECK(p != NULL, "out of memory (%zu x %zu)", n, size);
    return p;
}

static float *floats(int64_t n) { return xcalloc((size_t)n, sizeof(float)); }

static void fill_normal(float *x, int64_t n, Rng *rng, float scale) {
    for (int64_t i = 0; i < n; i++) x[i] = scale * (float)rng_normal(rng);
}

static void shuffle(int32_t *a, int n, Rng *rng) {
    for (int i = n - 1; i > 0; i--) {
        int j = (int)rng_below(rng, (uint64_t)i + 1);
        int32_t t = a[i];
        a[i] = a[j], a[j] = t;
    }
}

// A random segment of length in [lo, hi] inside one of the batch's sequences (a sub-range when the
// sequence is longer, from a random start).
static Segment random_segment(const GlobalBatch *b, Rng *rng, int64_t lo, int64_t hi) {
    int64_t len = lo + (int64_t)rng_below(rng, (uint64_t)(hi - lo + 1));
    int32_t seq;
    do seq = (int32_t)rng_below(rng, (uint64_t)b->n);
    while (b->seqs[seq].len < len);
    int64_t start = (int64_t)rng_below(rng, (uint64_t)(b->seqs[seq].len - len + 1));
    return (Segment){.seq = seq, .start = start, .len = len};
}

// One layer's data over the item's rows in the canonical order (segment by segment, positions
// ascending), and the one-process reference result.
typedef struct {
    float *q, *k, *v, *dout;            // inputs (T, ...)
    float *out, *lse, *dq, *dk, *dv;    // reference (T, ...)
} Layer;

// One member's rows: its inputs gathered from the canonical rows, the ring's results, and the
// reference results gathered the same way.
typedef struct {
    float *q, *k, *v, *dout;
    float *out, *lse, *delta, *dq, *dk, *dv;
    float *ref_out, *ref_lse, *ref_dq, *ref_dk, *ref_dv;
} Mine;

static int n_checks;

static void check_lse(const float *a, const float *b, int64_t n, const char *what) {
    double worst = 0;
    for (int64_t i = 0; i < n; i++) {
        CHECK(!isnan(a[i]) && !isnan(b[i]), "%s: lse[%lld] is NaN (%g vs %g)", what, (long long)i, a[i], b[i]);
        if (isinf(a[i]) || isinf(b[i])) {
            CHECK(a[i] == b[i], "%s: lse[%lld] = %g, reference %g", what, (long long)i, a[i], b[i]);
            continue;
        }
        double d = fabs((double)a[i] - b[i]);
        if (d > worst) worst = d;
    }
    CHECK(worst <= 1e-4, "%s: lse differs by %g", what, worst);
}

static void check_rel(const float *a, const float *b, int64_t n, const char *what) {
    double e = rel_error_all(a, b, (size_t)n);  // collective: every rank calls it, n = 0 outside the ring
    CHECK(e <= 1e-5, "%s: relative error %g", what, e);
    n_checks++;
}

// Run and check item k of plan p on r. rng is shared: every rank draws the same numbers.
static void run_item(RingAttn *r, const Plan *p, int32_t k, AttnShape s, Rng *rng, const char *tag) {
    Comm *c = mpi_comm;
    const Item *it = &p->items[k];
    int D = it->n_ranks;
    int64_t T = it->tokens, Q = (int64_t)s.n_heads * s.head_dim, KV = (int64_t)s.n_kv_heads * s.head_dim;
    int H = s.n_heads;

    // canonical rows: segment j's rows begin at base[j]
    int64_t *base = xcalloc((size_t)it->n_segs + 1, sizeof *base);
    int32_t *pos = xcalloc((size_t)T, sizeof *pos), *seg = xcalloc((size_t)T, sizeof *seg);
    for (int32_t j = 0; j < it->n_segs; j++) {
        const Segment *sg = &p->segs[it->seg_begin + j];
        base[j + 1] = base[j] + sg->len;
        for (int64_t i = 0; i < sg->len; i++) {
            pos[base[j] + i] = (int32_t)(sg->start + i);
            seg[base[j] + i] = j;
        }
    }
    CHECK(base[it->n_segs] == T, "item %d: %lld rows, tokens %lld", k, (long long)base[it->n_segs], (long long)T);

    // the members' layouts cover every canonical row exactly once (checked on every rank: no MPI)
    int64_t **map = xcalloc((size_t)D, sizeof *map), *rows = xcalloc((size_t)D, sizeof *rows);
    int *seen = xcalloc((size_t)T, sizeof *seen);
    for (int m = 0; m < D; m++) {
        rows[m] = mb_member_rows(p, k, m);
        int32_t *mp = xcalloc((size_t)rows[m], sizeof *mp), *ms = xcalloc((size_t)rows[m], sizeof *ms);
        mb_layout(p, k, m, mp, ms);
        map[m] = xcalloc((size_t)rows[m], sizeof **map);
        for (int64_t i = 0; i < rows[m]; i++) {
            CHECK(ms[i] >= 0 && ms[i] < it->n_segs, "item %d member %d row %lld: segment %d", k, m, (long long)i, ms[i]);
            const Segment *sg = &p->segs[it->seg_begin + ms[i]];
            int64_t off = mp[i] - sg->start;
            CHECK(off >= 0 && off < sg->len, "item %d member %d row %lld: position %d outside segment %d", k, m,
                  (long long)i, mp[i], ms[i]);
            map[m][i] = base[ms[i]] + off;
            seen[map[m][i]]++;
        }
        free(mp), free(ms);
    }
    for (int64_t i = 0; i < T; i++) CHECK(seen[i] == 1, "item %d: row %lld held %d times", k, (long long)i, seen[i]);
    free(seen);

    // inputs of both layers: every rank draws them (the rng stays in step)
    Layer L[N_LAYERS];
    for (int l = 0; l < N_LAYERS; l++) {
        memset(&L[l], 0, sizeof L[l]);
        L[l].q = floats(T * Q), L[l].dout = floats(T * Q);
        L[l].k = floats(T * KV), L[l].v = floats(T * KV);
        fill_normal(L[l].q, T * Q, rng, 1.0f);
        fill_normal(L[l].k, T * KV, rng, 1.0f);
        fill_normal(L[l].v, T * KV, rng, 1.0f);
        fill_normal(L[l].dout, T * Q, rng, 1.0f);
    }

    int me = mb_member_index(p, k, c->rank);
    int64_t n = me >= 0 ? rows[me] : 0;
    Mine M[N_LAYERS];
    memset(M, 0, sizeof M);
    if (me >= 0) {
        AttnRows all = {.pos = pos, .seg = seg, .n = (int)T};
        float *delta = floats(T * H);
        for (int l = 0; l < N_LAYERS; l++) {
            Layer *y = &L[l];
            y->out = floats(T * Q), y->lse = floats(T * H), y->dq = floats(T * Q);
            y->dk = floats(T * KV), y->dv = floats(T * KV);
            attn_forward(y->out, y->lse, y->q, all, y->k, y->v, all, s);
            attn_backward_delta(delta, y->dout, y->out, (int)T, s);
            attn_backward(y->dq, y->dk, y->dv, y->dout, y->lse, delta, y->q, all, y->k, y->v, all, s);

            Mine *x = &M[l];
            x->q = floats(n * Q), x->dout = floats(n * Q), x->k = floats(n * KV), x->v = floats(n * KV);
            x->out = floats(n * Q), x->lse = floats(n * H), x->delta = floats(n * H), x->dq = floats(n * Q);
            x->dk = floats(n * KV), x->dv = floats(n * KV);
            x->ref_out = floats(n * Q), x->ref_lse = floats(n * H), x->ref_dq = floats(n * Q);
            x->ref_dk = floats(n * KV), x->ref_dv = floats(n * KV);
            for (int64_t i = 0; i < n; i++) {
                int64_t g = map[me][i];
                memcpy(x->q + i * Q, y->q + g * Q, (size_t)Q * sizeof(float));
                memcpy(x->dout + i * Q, y->dout + g * Q, (size_t)Q * sizeof(float));
                memcpy(x->k + i * KV, y->k + g * KV, (size_t)KV * sizeof(float));
                memcpy(x->v + i * KV, y->v + g * KV, (size_t)KV * sizeof(float));
                memcpy(x->ref_out + i * Q, y->out + g * Q, (size_t)Q * sizeof(float));
                memcpy(x->ref_lse + i * H, y->lse + g * H, (size_t)H * sizeof(float));
                memcpy(x->ref_dq + i * Q, y->dq + g * Q, (size_t)Q * sizeof(float));
                memcpy(x->ref_dk + i * KV, y->dk + g * KV, (size_t)KV * sizeof(float));
                memcpy(x->ref_dv + i * KV, y->dv + g * KV, (size_t)KV * sizeof(float));
            }
            // poison the outputs: the ring must overwrite out and lse entirely
            for (int64_t i = 0; i < n * Q; i++) x->out[i] = 1e30f;
            for (int64_t i = 0; i < n * H; i++) x->lse[i] = 1e30f;
        }
        free(delta);

        // the ring, as a model runs it: forward 0, forward 1, backward 1, backward 0
        CHECK_OK(ring_attn_prepare(r, p, k));
        CHECK(r->D == D && r->me == me, "item %d: prepare gives D %d me %d, expected %d %d", k, r->D, r->me, D, me);
        int32_t *lp = xcalloc((size_t)n, sizeof *lp), *ls = xcalloc((size_t)n, sizeof *ls);
        mb_layout(p, k, me, lp, ls);
        AttnRows mine = {.pos = lp, .seg = ls, .n = (int)n};
        AttnOps ops = ring_attn_ops(r);
        CHECK(ops.collective == 1, "ring attention ops must be collective");
        int64_t steps0 = r->stats.steps;
        for (int l = 0; l < N_LAYERS; l++) {
            Mine *x = &M[l];
            CHECK_OK(ops.forward(ops.ctx, l, x->out, x->lse, x->q, x->k, x->v, mine, s));
        }
        for (int l = N_LAYERS - 1; l >= 0; l--) {
            Mine *x = &M[l];
            attn_backward_delta(x->delta, x->dout, x->out, (int)n, s);
            CHECK_OK(ops.backward(ops.ctx, l, x->dq, x->dk, x->dv, x->dout, x->lse, x->delta, x->q, x->k, x->v, mine,
                                  s));
        }
        CHECK(r->stats.steps - steps0 == (int64_t)2 * N_LAYERS * D, "item %d: %lld ring steps, expected %d", k,
              (long long)(r->stats.steps - steps0), 2 * N_LAYERS * D);
        free(lp), free(ls);
    }

    for (int l = 0; l < N_LAYERS; l++) {
        Mine *x = &M[l];
        char what[160];
        snprintf(what, sizeof what, "%s item %d (D %d, %lld rows, member %d of %lld rows) layer %d", tag, k, D,
                 (long long)T, me, (long long)n, l);
        if (me >= 0) check_lse(x->lse, x->ref_lse, n * H, what);
        n_checks++;
        char w2[200];
        snprintf(w2, sizeof w2, "%s out", what);
        check_rel(x->out, x->ref_out, n * Q, w2);
        snprintf(w2, sizeof w2, "%s dq", what);
        check_rel(x->dq, x->ref_dq, n * Q, w2);
        snprintf(w2, sizeof w2, "%s dk", what);
        check_rel(x->dk, x->ref_dk, n * KV, w2);
        snprintf(w2, sizeof w2, "%s dv", what);
        check_rel(x->dv, x->ref_dv, n * KV, w2);
    }

    for (int l = 0; l < N_LAYERS; l++) {
        Layer *y = &L[l];
        free(y->q), free(y->k), free(y->v), free(y->dout), free(y->out), free(y->lse), free(y->dq), free(y->dk),
            free(y->dv);
        Mine *x = &M[l];
        free(x->q), free(x->k), free(x->v), free(x->dout), free(x->out), free(x->lse), free(x->delta), free(x->dq),
            free(x->dk), free(x->dv), free(x->ref_out), free(x->ref_lse), free(x->ref_dq), free(x->ref_dk),
            free(x->ref_dv);
    }
    for (int m = 0; m < D; m++) free(map[m]);
    free(map), free(rows), free(base), free(pos), free(seg);
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
    for (int32_t k = 0; k < p.n_items; k++) {
        run_item(&r, &p, k, s, &rng, tag);
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
