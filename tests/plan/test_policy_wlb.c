// test_policy_wlb.c: WLB-LLM's packing on a static DP x CP mesh (src/plan/policy_wlb.c, docs/peers.md
// "wlb"):
//   - a worked example by hand: the outlier delayed, the rest packed by attention work, the
//     micro-batches dealt to the DP groups; the same batch flushed;
//   - the delayed list through a plan file and the wire form;
//   - a run of several steps through the planner API, each step's delayed documents put first into
//     the next batch and a last step that flushes: every document trained exactly once;
//   - property test: valid plans, every trained sequence whole in one item on its CP group's ranks.
#include "plan/plan_fixtures.h"

#include <stdlib.h>
#include <unistd.h>

#include "bytescale/error.h"
#include "bytescale/hw.h"
#include "bytescale/model.h"
#include "bytescale/policy.h"
#include "bytescale/rng.h"

static void plan_ok(Plan *p, const GlobalBatch *b, const PlanConfig *cfg, const CostModel *cm) {
    if (policy_plan(p, "wlb", b, cfg, cm) != 0)
        fail_msg("R %d, C %lld, pp %d: %s", cfg->n_ranks, (long long)cfg->capacity, cfg->pp, bs_errmsg());
}

// Item k holds exactly the sequences seqs[0 .. n) (in this order) on rank `rank` alone.
static void expect_pack(const Plan *p, int k, int32_t rank, const int32_t *seqs, int n) {
    const Item *it = &p->items[k];
    assert_int_equal(it->n_ranks, 1);
    assert_int_equal(p->ranks[it->rank_begin], rank);
    assert_int_equal(it->n_segs, n);
    for (int j = 0; j < n; j++) assert_int_equal(p->segs[it->seg_begin + j].seq, seqs[j]);
}

// Work = attention only: a document of s tokens weighs s(s+1)/2. C = 100 = the context: d_cp = 1,
// 2 ranks: d_dp = 2. Lengths 100 60 50 40 30 20 (300 tokens): at least 3 micro-batches, 4 in
// multiples of d_dp. Work 5050 1830 1275 820 465 210, 9650 in all: a micro-batch's share 2412.5.
// 100 is an outlier, alone in the queue (fewer than 4): delayed. The rest, heaviest first to the
// least work with room: 60 -> mb0, 50 -> mb1, 40 -> mb2, 30 -> mb3, 20 -> mb3 (465, the least).
// Dealt heaviest first, two per round: mb0 -> group 0, mb1 -> group 1; then the lighter group 1
// takes mb2 and group 0 mb3.
// Flushed, 100 stays: 100 60 50 40 -> mb0..3, 30 -> mb3 (820), 20 -> mb2 (1275 < 1285):
// mb0 [100] 5050, mb1 [60] 1830, mb2 [50 20] 1485, mb3 [40 30] 1285; group 0 takes mb0 and mb3.
static void test_worked_example(void **state) {
    (void)state;
    int64_t lens[] = {100, 60, 50, 40, 30, 20};
    GlobalBatch b = make_batch(lens, 6);
    CostModel cm = hand_model();
    cm.attn_pair = 1, cm.lin_token = 0, cm.n_layers = 1;
    PlanConfig cfg = {.n_ranks = 2, .capacity = 100, .context = 100, .pp = 1};
    Plan p;
    plan_ok(&p, &b, &cfg, &cm);
    assert_int_equal(p.n_delayed, 1);
    assert_int_equal(p.delayed[0], 0);
    assert_int_equal(p.n_items, 4);
    expect_pack(&p, 0, 0, (int32_t[]){1}, 1);
    expect_pack(&p, 1, 1, (int32_t[]){2}, 1);
    expect_pack(&p, 2, 1, (int32_t[]){3}, 1);
    expect_pack(&p, 3, 0, (int32_t[]){4, 5}, 2);
    // the bounds are of what this step trains
    GlobalBatch rest = make_batch(lens + 1, 5);
    assert_true(p.lower_bound == plan_lower_bound(&rest, &cm, 2, 100));
    batch_free(&rest);
    plan_free(&p);
    cfg.flush = 1;
    plan_ok(&p, &b, &cfg, &cm);
    assert_int_equal(p.n_delayed, 0);
    assert_int_equal(p.n_items, 4);
    expect_pack(&p, 0, 0, (int32_t[]){0}, 1);
    expect_pack(&p, 1, 1, (int32_t[]){1}, 1);
    expect_pack(&p, 2, 1, (int32_t[]){2, 5}, 2);
    expect_pack(&p, 3, 0, (int32_t[]){3, 4}, 2);
    plan_free(&p);
    batch_free(&b);
}

static void test_delayed_round_trip(void **state) {
    (void)state;
    int64_t lens[] = {100, 60, 50, 40, 30, 20};
    GlobalBatch b = make_batch(lens, 6);
    CostModel cm = hand_model();
    cm.attn_pair = 1, cm.lin_token = 0, cm.n_layers = 1;
    PlanConfig cfg = {.n_ranks = 2, .capacity = 100, .context = 100, .pp = 1};
    Plan p, q, w;
    plan_ok(&p, &b, &cfg, &cm);
    char path[] = "/tmp/bs_test_wlb_XXXXXX";
    int fd = mkstemp(path);
    assert_true(fd >= 0);
    close(fd);
    assert_int_equal(plan_write_json(&p, path), 0);
    if (plan_read_json_cm(&q, path, &cm) != 0) fail_msg("%s", bs_errmsg());
    assert_int_equal(q.n_delayed, 1);
    assert_int_equal(q.delayed[0], 0);
    assert_true(q.lower_bound == p.lower_bound);
    uint8_t *buf;
    size_t size;
    assert_int_equal(plan_pack(&p, &buf, &size), 0);
    if (plan_unpack(&w, buf, size) != 0) fail_msg("%s", bs_errmsg());
    assert_int_equal(w.n_delayed, 1);
    free(buf);
    // a delayed sequence that an item holds is refused, and so is a sequence neither trained nor delayed
    q.delayed = realloc(q.delayed, 2 * sizeof *q.delayed);
    q.delayed[1] = 1, q.n_delayed = q.cap_delayed = 2;
    assert_int_equal(plan_validate(&q, &cm), -1);
    assert_non_null(strstr(bs_errmsg(), "sequence 1 (id 1) is delayed but item"));
    q.n_delayed = 0;
    assert_int_equal(plan_validate(&q, &cm), -1);
    assert_non_null(strstr(bs_errmsg(), "sequence 0 (id 0): tokens [0, 100) are in no item"));
    plan_free(&q);
    plan_free(&w);
    plan_free(&p);
    unlink(path);
    batch_free(&b);
}

// Steps of new documents; each step's batch is the documents the last one delayed (first, in order)
// and then the new ones; a last step with only the delayed ones, flushed. Every document id is
// trained in exactly one step.
static void test_every_document_once_over_steps(void **state) {
    (void)state;
    Rng g;
    rng_seed(&g, 77);
    int64_t C = 4096;
    CostModel cm;
    if (cost_derive(&cm, model_find("llama-7b"), hw_find("h800-sxm"), 1, 1, 16, C) != 0) fail_msg("%s", bs_errmsg());
    int total_delayed = 0;
    for (int run = 0; run < 20; run++) {
        enum { STEPS = 6, MAX_DOCS = 4000 };
        int *trained = calloc(MAX_DOCS, sizeof(int));
        int64_t next_id = 0;
        GlobalBatch carry;
        assert_int_equal(batch_init(&carry, 0), 0);
        for (int step = 0; step <= STEPS; step++) {
            GlobalBatch b;
            assert_int_equal(batch_init(&b, 0), 0);
            for (int64_t i = 0; i < carry.n; i++) batch_push(&b, carry.seqs[i].id, carry.seqs[i].len, -1);
            if (step < STEPS) {
                GlobalBatch fresh;
                if (batch_generate(&fresh, "github", rng_next(&g), 64 << 10, 16 << 10) != 0) fail_msg("%s", bs_errmsg());
                for (int64_t i = 0; i < fresh.n; i++) batch_push(&b, next_id++, fresh.seqs[i].len, -1);
                batch_free(&fresh);
            }
            PlanConfig cfg = {.n_ranks = 16, .capacity = C, .context = 16 << 10, .pp = 1, .flush = step == STEPS};
            Plan p;
            plan_ok(&p, &b, &cfg, &cm);
            for (int32_t s = 0; s < p.n_segs; s++) trained[p.batch.seqs[p.segs[s].seq].id]++;
            batch_free(&carry);
            assert_int_equal(batch_init(&carry, 0), 0);
            for (int32_t d = 0; d < p.n_delayed; d++) {
                const Sequence *q = &p.batch.seqs[p.delayed[d]];
                batch_push(&carry, q->id, q->len, -1);
            }
            total_delayed += p.n_delayed;
            if (step == STEPS) assert_int_equal(p.n_delayed, 0);
            plan_free(&p);
            batch_free(&b);
        }
        assert_true(next_id <= MAX_DOCS);
        for (int64_t id = 0; id < next_id; id++)
            if (trained[id] != 1) fail_msg("run %d: document %lld trained %d times", run, (long long)id, trained[id]);
        batch_free(&carry);
        free(trained);
    }
    assert_true(total_delayed > 0);  // the queue did delay documents
    printf("%d documents delayed over 20 runs\n", total_delayed);
}

static void test_invariants(void **state) {
    (void)state;
    const char *dists[] = {"github", "byted", "uniform:1:40000", "lognormal:8:1.5"};
    Rng g;
    rng_seed(&g, 31);
    for (int trial = 0; trial < 200; trial++) {
        int32_t R = 1 + (int32_t)rng_below(&g, 64), pp = 1 + (int32_t)rng_below(&g, 2);
        int64_t C = (int64_t)(1 << 10) << rng_below(&g, 4), ctx = C << rng_below(&g, 4);
        if (ctx / C > R) ctx = C;
        CostModel cm;
        if (cost_derive(&cm, model_find("llama-7b"), hw_find("h800-sxm"), 1, pp, R, C) != 0) fail_msg("%s", bs_errmsg());
        GlobalBatch b;
        if (batch_generate(&b, dists[rng_below(&g, 4)], rng_next(&g), C * (1 + (int64_t)rng_below(&g, 4 * R)), ctx) != 0)
            fail_msg("%s", bs_errmsg());
        PlanConfig cfg = {.n_ranks = R, .capacity = C, .context = ctx, .pp = pp, .flush = (int)rng_below(&g, 2)};
        Plan p;
        plan_ok(&p, &b, &cfg, &cm);
        int64_t d_cp = ctx / C;
        int32_t *seen = calloc((size_t)b.n, sizeof *seen);
        for (int32_t k = 0; k < p.n_items; k++) {
            const Item *it = &p.items[k];
            assert_int_equal(it->n_ranks, d_cp);
            assert_int_equal(p.ranks[it->rank_begin] % d_cp, 0);
            for (int32_t j = 0; j < it->n_segs; j++) seen[p.segs[it->seg_begin + j].seq]++;
        }
        for (int32_t d = 0; d < p.n_delayed; d++) seen[p.delayed[d]]++;
        for (int64_t i = 0; i < b.n; i++) assert_int_equal(seen[i], 1);
        if (cfg.flush) assert_int_equal(p.n_delayed, 0);
        free(seen);
        plan_free(&p);
        batch_free(&b);
    }
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_worked_example),
        cmocka_unit_test(test_delayed_round_trip),
        cmocka_unit_test(test_every_document_once_over_steps),
        cmocka_unit_test(test_invariants),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
