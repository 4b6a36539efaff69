// test_microbatch_read.c: what mb_read gives a process for each part of its rows it needs (a
// pipeline's first stage the tokens, the last the targets, a middle stage neither; one stage both),
// against a naive reading of the same rows: a row at position pos of a sequence starting at global
// offset src holds token text[src + pos], and its target is the next token of its document (-1 at
// the document's end). Over random documents, batches cut anywhere in them, rank counts and
// capacities (balance plans, with rings), for every rank, item and member: the parts asked for are
// the naive ones, the others are 0 / -1, and the source was asked for exactly the tokens needed
// (no read at all for a middle stage).
#include "test_util.h"

#include "bytescale/error.h"
#include "bytescale/hw.h"
#include "bytescale/microbatch.h"
#include "bytescale/model.h"
#include "bytescale/policy.h"
#include "bytescale/rng.h"

enum { MAX_DOCS = 12, MAX_TOKENS = MAX_DOCS * 600 };

// The documents back to back in one global token stream, and how much a reading took from it.
typedef struct {
    uint32_t text[MAX_TOKENS];
    int64_t start[MAX_DOCS + 1];  // document d is [start[d], start[d + 1])
    int64_t calls, delivered;
} Corpus;

static int corpus_read(void *ctx, int64_t doc, int64_t src, int64_t n, uint32_t *out, int64_t *got) {
    Corpus *c = ctx;
    int64_t end = c->start[doc + 1];
    if (src < c->start[doc] || src > end || n < 0) return bs_fail("read outside document %lld", (long long)doc);
    *got = src + n <= end ? n : end - src;
    memcpy(out, c->text + src, sizeof(uint32_t) * (size_t)*got);
    c->calls++, c->delivered += *got;
    return 0;
}

// Random documents, and a batch of pieces of them (whole ones, and ones cut before their end, whose
// last row has a label) no longer than ctx.
static void make_batch(Rng *rng, Corpus *c, GlobalBatch *b, int64_t ctx) {
    int n_docs = 3 + (int)rng_below(rng, MAX_DOCS - 2);
    c->start[0] = 0;
    for (int d = 0; d < n_docs; d++) c->start[d + 1] = c->start[d] + 1 + (int64_t)rng_below(rng, 600);
    for (int64_t i = 0; i < c->start[n_docs]; i++) c->text[i] = (uint32_t)rng_below(rng, 256);
    assert_int_equal(batch_init(b, 16), 0);
    for (int d = 0; d < n_docs; d++) {
        int64_t len = c->start[d + 1] - c->start[d], src = c->start[d];
        if (rng_below(rng, 2)) {  // a piece: anywhere in the document
            src += (int64_t)rng_below(rng, (uint64_t)len);
            len = 1 + (int64_t)rng_below(rng, (uint64_t)(c->start[d + 1] - src));
        }
        if (len > ctx) len = ctx;
        assert_int_equal(batch_push(b, d, len, src), 0);
    }
}

// One member's rows read with `need` against the naive rows.
static void check_member(Corpus *c, const Plan *p, int32_t k, int m, int need) {
    int64_t n = mb_member_rows(p, k, m);
    int32_t *pos = malloc(sizeof(int32_t) * (size_t)(n + 1)), *seg = malloc(sizeof(int32_t) * (size_t)(n + 1));
    int32_t *tok = malloc(sizeof(int32_t) * (size_t)(n + 1)), *tgt = malloc(sizeof(int32_t) * (size_t)(n + 1));
    uint32_t *scratch = malloc(sizeof(uint32_t) * (size_t)(n + 2));
    mb_layout(p, k, m, pos, seg);
    TokenSource src = {.read = corpus_read, .ctx = c};
    c->calls = c->delivered = 0;
    int64_t n_targets = -1, labelled = 0;
    if (mb_read(p, k, m, need, &src, tok, tgt, scratch, &n_targets) != 0) fail_msg("%s", bs_errmsg());
    for (int64_t i = 0; i < n; i++) {
        const Sequence *sq = &p->batch.seqs[p->segs[p->items[k].seg_begin + seg[i]].seq];
        int64_t at = sq->src + pos[i];
        int32_t want_tok = (int32_t)c->text[at], want_tgt = at + 1 < c->start[sq->id + 1] ? (int32_t)c->text[at + 1] : -1;
        labelled += want_tgt >= 0;
        assert_int_equal(tok[i], need & MB_TOKENS ? want_tok : 0);
        assert_int_equal(tgt[i], need & MB_TARGETS ? want_tgt : -1);
    }
    assert_int_equal(n_targets, need & MB_TARGETS ? labelled : 0);
    // exactly what was needed came from the source: the tokens, or one per label, or nothing
    if (need == MB_TOKENS) assert_int_equal(c->delivered, n);
    if (need == MB_TARGETS) assert_int_equal(c->delivered, labelled);
    if (need == 0) assert_int_equal(c->calls, 0);
    if (need == MB_BOTH) assert_true(c->delivered >= n && c->delivered <= n + labelled);
    free(pos), free(seg), free(tok), free(tgt), free(scratch);
}

static void test_reads_what_each_stage_needs(void **state) {
    (void)state;
    static Corpus c;
    Rng rng;
    rng_seed(&rng, 28);
    int rings = 0;
    for (int trial = 0; trial < test_trials(60); trial++) {
        int32_t R = 1 + (int32_t)rng_below(&rng, 4);
        int64_t C = 32 + (int64_t)rng_below(&rng, 400);
        GlobalBatch b;
        make_batch(&rng, &c, &b, R * C);
        CostModel cm;
        if (cost_derive(&cm, model_find("tiny"), hw_find("cpu"), 1, 1, R, C) != 0) fail_msg("%s", bs_errmsg());
        PlanConfig cfg = {.n_ranks = R, .capacity = C, .context = R * C, .pp = 1};
        Plan p;
        if (policy_plan(&p, "balance", &b, &cfg, &cm) != 0) fail_msg("trial %d: %s", trial, bs_errmsg());
        for (int32_t k = 0; k < p.n_items; k++) {
            rings += p.items[k].n_ranks > 1;
            for (int m = 0; m < p.items[k].n_ranks; m++)
                for (int need = 0; need <= MB_BOTH; need++) check_member(&c, &p, k, m, need);
        }
        plan_free(&p);
        batch_free(&b);
    }
    assert_true(rings > 0);  // the chunked layout was exercised, not only packs
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_reads_what_each_stage_needs),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
