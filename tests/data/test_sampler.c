// test_sampler.c: batches from a document index - reproducible, exactly on budget, every token once
// per epoch, exact resume from a saved position, and readable from a prepared dataset.
#include "test_util.h"

#include "bytescale/error.h"
#include "bytescale/fileio.h"
#include "bytescale/prepare.h"
#include "bytescale/rng.h"
#include "bytescale/sampler.h"

// An in-memory index: n documents of random lengths (some empty), laid out back to back.
static DocIndex make_index(int64_t n, uint64_t seed, int64_t max_len) {
    DocIndex ix;
    memset(&ix, 0, sizeof ix);
    snprintf(ix.dir, sizeof ix.dir, "memory");
    ix.n_docs = n;
    ix.docs = calloc((size_t)n, sizeof *ix.docs);
    Rng rng;
    rng_seed(&rng, seed);
    int64_t at = 0;
    for (int64_t d = 0; d < n; d++) {
        int64_t len = rng_below(&rng, 8) == 0 ? 0 : 1 + (int64_t)rng_below(&rng, (uint64_t)max_len);
        ix.docs[d] = (DocEntry){.shard = 0, .offset = at, .len = len, .start = at};
        at += len;
    }
    ix.n_tokens = at;
    return ix;
}

static void assert_batches_equal(const GlobalBatch *a, const GlobalBatch *b) {
    assert_int_equal(a->n, b->n);
    assert_int_equal(a->n_tokens, b->n_tokens);
    for (int64_t i = 0; i < a->n; i++) {
        assert_int_equal(a->seqs[i].id, b->seqs[i].id);
        assert_int_equal(a->seqs[i].len, b->seqs[i].len);
        assert_int_equal(a->seqs[i].src, b->seqs[i].src);
    }
}

static void test_same_seed_same_batches(void **state) {
    (void)state;
    DocIndex ix = make_index(300, 1, 500);
    Sampler s1, s2, s3;
    assert_int_equal(sampler_init(&s1, &ix, 42), 0);
    assert_int_equal(sampler_init(&s2, &ix, 42), 0);
    assert_int_equal(sampler_init(&s3, &ix, 43), 0);
    GlobalBatch a, b, c;
    batch_init(&a, 0);
    batch_init(&b, 0);
    batch_init(&c, 0);
    int differs = 0;
    for (int step = 0; step < 50; step++) {
        assert_int_equal(sampler_next(&s1, 4000, 256, &a), 0);
        assert_int_equal(sampler_next(&s2, 4000, 256, &b), 0);
        assert_int_equal(sampler_next(&s3, 4000, 256, &c), 0);
        assert_batches_equal(&a, &b);
        differs |= a.n != c.n || a.seqs[0].id != c.seqs[0].id;
    }
    assert_true(differs);  // another seed, another order
    batch_free(&a);
    batch_free(&b);
    batch_free(&c);
    sampler_free(&s1);
    sampler_free(&s2);
    sampler_free(&s3);
    free(ix.docs);
}

// Over many steps and budgets: every batch holds exactly the budget, pieces fit max_ctx and lie
// inside their document; the stream of pieces, split every n_tokens tokens into epochs, covers
// every token exactly once per epoch, each document in one contiguous run, in a new order each epoch.
static void test_every_token_once_per_epoch(void **state) {
    (void)state;
    for (int trial = 0; trial < 6; trial++) {
        DocIndex ix = make_index(50 + 40 * trial, 100 + (uint64_t)trial, 50 + 400 * trial);
        int64_t budgets[] = {1, 97, 1000, ix.n_tokens / 3 + 1, ix.n_tokens, 2 * ix.n_tokens + 5};
        int64_t budget = budgets[trial], max_ctx = trial % 2 ? 64 : 0;
        Sampler s;
        assert_int_equal(sampler_init(&s, &ix, (uint64_t)trial), 0);
        uint8_t *seen = calloc((size_t)ix.n_tokens, 1);
        int64_t *last_run = malloc((size_t)ix.n_docs * sizeof *last_run);  // stream index of the doc's last piece
        int64_t *first_doc = calloc(4, sizeof *first_doc);
        int64_t in_epoch = 0, epoch = 0, piece = 0, prev_doc = -1, pieces_in_epoch = 0;
        for (int64_t d = 0; d < ix.n_docs; d++) last_run[d] = -1;
        GlobalBatch b;
        batch_init(&b, 0);
        while (epoch < 3) {
            assert_int_equal(sampler_next(&s, budget, max_ctx, &b), 0);
            int64_t sum = 0;
            for (int64_t i = 0; i < b.n; i++, piece++) {
                const Sequence *q = &b.seqs[i];
                const DocEntry *e = &ix.docs[q->id];
                sum += q->len;
                assert_true(q->len > 0);
                if (max_ctx > 0) assert_true(q->len <= max_ctx);
                assert_true(q->src >= e->start && q->src + q->len <= e->start + e->len);
                // a document's pieces follow one another: once left, it does not come back this epoch
                if (q->id != prev_doc) {
                    assert_int_equal(last_run[q->id], -1);
                    if (pieces_in_epoch == 0 && epoch < 4) first_doc[epoch] = q->id;
                }
                last_run[q->id] = piece;
                prev_doc = q->id;
                pieces_in_epoch++;
                for (int64_t t = q->src; t < q->src + q->len; t++) {
                    assert_int_equal(seen[t], epoch % 256);
                    seen[t]++;
                }
                in_epoch += q->len;
                assert_true(in_epoch <= ix.n_tokens);  // a piece never straddles two epochs
                if (in_epoch == ix.n_tokens) {         // epoch done: every token seen epoch + 1 times
                    for (int64_t t = 0; t < ix.n_tokens; t++) assert_int_equal(seen[t], epoch + 1);
                    epoch++;
                    in_epoch = 0;
                    pieces_in_epoch = 0;
                    prev_doc = -1;
                    for (int64_t d = 0; d < ix.n_docs; d++) last_run[d] = -1;
                }
            }
            assert_int_equal(sum, budget);
            assert_int_equal(b.n_tokens, budget);
        }
        // a fresh order each epoch (the first documents of three epochs are not all the same)
        assert_true(first_doc[0] != first_doc[1] || first_doc[1] != first_doc[2]);
        batch_free(&b);
        free(seen);
        free(last_run);
        free(first_doc);
        sampler_free(&s);
        free(ix.docs);
    }
}

static void test_order_is_uniform(void **state) {
    (void)state;
    // 10 equal documents, 4000 seeds: which one comes first should be uniform
    DocIndex ix;
    memset(&ix, 0, sizeof ix);
    ix.n_docs = 10;
    ix.docs = calloc(10, sizeof *ix.docs);
    for (int d = 0; d < 10; d++) ix.docs[d] = (DocEntry){.offset = 5 * d, .len = 5, .start = 5 * d};
    ix.n_tokens = 50;
    int counts[10] = {0};
    GlobalBatch b;
    batch_init(&b, 0);
    for (uint64_t seed = 0; seed < 4000; seed++) {
        Sampler s;
        assert_int_equal(sampler_init(&s, &ix, seed), 0);
        assert_int_equal(sampler_next(&s, 1, 0, &b), 0);
        counts[b.seqs[0].id]++;
        sampler_free(&s);
    }
    // expected 400 each, standard deviation 19: allow 5 of them
    for (int d = 0; d < 10; d++) assert_close(counts[d], 400, 0, 95);
    batch_free(&b);
    free(ix.docs);
}

static void test_resume_reproduces_continuation(void **state) {
    (void)state;
    DocIndex ix = make_index(120, 9, 300);
    for (int cut_at = 0; cut_at < 40; cut_at += 3) {
        Sampler a;
        assert_int_equal(sampler_init(&a, &ix, 5), 0);
        GlobalBatch ba, bb;
        batch_init(&ba, 0);
        batch_init(&bb, 0);
        for (int i = 0; i < cut_at; i++) assert_int_equal(sampler_next(&a, 777, 100, &ba), 0);
        // the position goes through bytes, as a checkpoint would carry it
        SamplerState saved = sampler_state(&a), loaded;
        uint8_t bytes[sizeof saved];
        memcpy(bytes, &saved, sizeof saved);
        memcpy(&loaded, bytes, sizeof loaded);
        Sampler b;
        assert_int_equal(sampler_init(&b, &ix, 999), 0);  // the seed comes from the state
        assert_int_equal(sampler_restore(&b, &loaded), 0);
        for (int i = 0; i < 25; i++) {
            assert_int_equal(sampler_next(&a, 777, 100, &ba), 0);
            assert_int_equal(sampler_next(&b, 777, 100, &bb), 0);
            assert_batches_equal(&ba, &bb);
        }
        batch_free(&ba);
        batch_free(&bb);
        sampler_free(&a);
        sampler_free(&b);
    }
    // a position that does not belong to this index is refused
    Sampler s;
    assert_int_equal(sampler_init(&s, &ix, 1), 0);
    SamplerState bad = sampler_state(&s);
    bad.n_docs = 121;
    assert_int_equal(sampler_restore(&s, &bad), -1);
    assert_non_null(strstr(bs_errmsg(), "121 documents"));
    bad = sampler_state(&s);
    bad.pos = 200;
    assert_int_equal(sampler_restore(&s, &bad), -1);
    bad = sampler_state(&s);
    bad.taken = 100000;
    assert_int_equal(sampler_restore(&s, &bad), -1);
    GlobalBatch g;
    batch_init(&g, 0);
    assert_int_equal(sampler_next(&s, 0, 0, &g), -1);
    batch_free(&g);
    sampler_free(&s);
    DocIndex none = make_index(0, 1, 10);
    assert_int_equal(sampler_init(&s, &none, 1), -1);
    assert_non_null(strstr(bs_errmsg(), "no tokens"));
    free(none.docs);
    free(ix.docs);
}

// A prepared dataset: read every piece of an epoch with its extra label token, and put the
// documents back together from the pieces.
static void test_pieces_read_back_from_dataset(void **state) {
    (void)state;
    const char *dir = test_tmpdir("data_sampler_dataset");
    char in[600], out[600], path[700];
    snprintf(in, sizeof in, "%s/in", dir);
    snprintf(out, sizeof out, "%s/out", dir);
    assert_int_equal(make_dirs(in), 0);
    Rng rng;
    rng_seed(&rng, 3);
    for (int f = 0; f < 12; f++) {
        char text[3000];
        size_t n = (size_t)rng_below(&rng, sizeof text);
        for (size_t i = 0; i < n; i++) text[i] = (char)('a' + rng_below(&rng, 26));
        snprintf(path, sizeof path, "%s/f%02d.txt", in, f);
        assert_int_equal(file_write_atomic(path, text, n), 0);
    }
    const char *inputs[] = {in};
    PrepareConfig cfg = {.inputs = inputs, .n_inputs = 1, .tokenizer = "byte", .out_dir = out, .shard_bytes = 4096,
                         .quiet = 1};
    PrepareStats st;
    if (prepare_run(&cfg, &st) != 0) fail_msg("%s", bs_errmsg());
    Dataset ds;
    if (dataset_open(&ds, out) != 0) fail_msg("%s", bs_errmsg());
    const DocIndex *ix = &ds.index;
    uint32_t *rebuilt = calloc((size_t)ix->n_tokens + 1, sizeof *rebuilt), *buf = malloc(4096 * sizeof *buf);
    Sampler s;
    assert_int_equal(sampler_init(&s, ix, 8), 0);
    GlobalBatch b;
    batch_init(&b, 0);
    int64_t total = 0;
    while (total < ix->n_tokens) {
        assert_int_equal(sampler_next(&s, 1500, 512, &b), 0);
        for (int64_t i = 0; i < b.n && total < ix->n_tokens; i++) {
            const Sequence *q = &b.seqs[i];
            const DocEntry *e = &ix->docs[q->id];
            int64_t got;
            assert_int_equal(dataset_read_span(&ds, q->id, q->src, q->len + 1, buf, &got), 0);
            int at_end = q->src + q->len == e->start + e->len;
            assert_int_equal(got, at_end ? q->len : q->len + 1);  // the label token, unless the document ends
            memcpy(rebuilt + q->src, buf, (size_t)got * sizeof *buf);
            total += q->len;
        }
    }
    for (int64_t d = 0; d < ix->n_docs; d++) {
        const DocEntry *e = &ix->docs[d];
        char *text;
        size_t n;
        assert_int_equal(file_read_all(docindex_source(ix, d), &text, &n), 0);
        assert_int_equal((int64_t)n, e->len);
        for (size_t i = 0; i < n; i++) assert_int_equal(rebuilt[e->start + (int64_t)i], (uint8_t)text[i]);
        free(text);
    }
    batch_free(&b);
    sampler_free(&s);
    free(rebuilt);
    free(buf);
    dataset_close(&ds);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_same_seed_same_batches),
        cmocka_unit_test(test_every_token_once_per_epoch),
        cmocka_unit_test(test_order_is_uniform),
        cmocka_unit_test(test_resume_reproduces_continuation),
        cmocka_unit_test(test_pieces_read_back_from_dataset),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
