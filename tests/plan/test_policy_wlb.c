// test_policy_wlb.c: WLB-LLM's packing on a static DP x CP mesh (src/plan/policy_wlb.c, docs/peers.md
// "wlb"):
//   - a worked example by hand: a level released, another waiting, the rest packed by attention work,
//     the micro-batches dealt to the DP groups; the same batch flushed; N from the own documents only;
//   - Algorithm 1's fallback: a full least-work micro-batch gives way to the one with the fewest tokens;
//   - the delayed list through a plan file and the wire form;
//   - runs of steps through the planner API, each step's delayed documents put first into the next
//     batch and a last step that flushes: every document trained exactly once; over 64 steps the
//     queue rule, recomputed from the batch, holds at every step (the queue stays under 3 (N - 1));
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

// Work = attention only: a document of s tokens weighs s(s+1)/2. C = 800 = the context: d_cp = 1,
// L = 800; 2 ranks: d_dp = 2. Outlier levels: (100, 200], (200, 400], (400, 800]. Lengths 500 450
// 300 100 90 60 (1500 tokens): N = 2 micro-batches. Level 3 holds 500 and 450: N of them, both
// released; level 2 holds 300 alone: it waits; 100 90 60 are no outliers. Work 125250 101475 |
// 5050 4095 1830. Heaviest first to the least work: 500 -> mb0, 450 -> mb1, then 100, 90 and 60 all
// to mb1 (106525, 110620: still under mb0's 125250). Dealt heaviest first: mb0 -> group 0, mb1 ->
// group 1.
// Flushed, the 300 trains too: 500 -> mb0, 450 -> mb1, 300 -> mb1 (146625), then 100 90 60 -> mb0
// (130300, 134395, 136225); the heavier mb1 [450 300] goes to group 0, mb0 to group 1.
static void test_worked_example(void **state) {
    (void)state;
    int64_t lens[] = {500, 450, 300, 100, 90, 60};
    GlobalBatch b = make_batch(lens, 6);
    CostModel cm = hand_model();
    cm.attn_pair = 1, cm.lin_token = 0, cm.n_layers = 1;
    PlanConfig cfg = {.n_ranks = 2, .capacity = 800, .context = 800, .pp = 1};
    Plan p;
    plan_ok(&p, &b, &cfg, &cm);
    assert_int_equal(p.n_delayed, 1);
    assert_int_equal(p.delayed[0], 2);
    assert_int_equal(p.n_items, 2);
    expect_pack(&p, 0, 0, (int32_t[]){0}, 1);
    expect_pack(&p, 1, 1, (int32_t[]){1, 3, 4, 5}, 4);
    // the bounds are of what this step trains
    GlobalBatch rest = make_batch((int64_t[]){500, 450, 100, 90, 60}, 5);
    assert_true(p.lower_bound == plan_lower_bound(&rest, &cm, 2, 800));
    batch_free(&rest);
    plan_free(&p);
    cfg.flush = 1;
    plan_ok(&p, &b, &cfg, &cm);
    assert_int_equal(p.n_delayed, 0);
    assert_int_equal(p.n_items, 2);
    expect_pack(&p, 0, 0, (int32_t[]){1, 2}, 2);
    expect_pack(&p, 1, 1, (int32_t[]){0, 3, 4, 5}, 4);
    plan_free(&p);
    batch_free(&b);
    // N comes from the step's own documents: three 700s carried in before the same six. Counted as
    // the step's own (carried 0), 3600 tokens would give N = 6, more than level 3's five documents:
    // all five and the 300 would wait. Carried, the own 1500 tokens give N = 2: the four oldest of
    // level 3 (the 700s and the 500) go, the 450 and the 300 wait.
    int64_t lens2[] = {700, 700, 700, 500, 450, 300, 100, 90, 60};
    b = make_batch(lens2, 9);
    cfg.flush = 0;
    plan_ok(&p, &b, &cfg, &cm);
    assert_int_equal(p.n_delayed, 6);
    for (int d = 0; d < 6; d++) assert_int_equal(p.delayed[d], d);
    plan_free(&p);
    cfg.carried = 3;
    plan_ok(&p, &b, &cfg, &cm);
    assert_int_equal(p.n_delayed, 2);
    assert_int_equal(p.delayed[0], 4);
    assert_int_equal(p.delayed[1], 5);
    plan_free(&p);
    batch_free(&b);
}

// Algorithm 1's fallback (the smallest case): one rank, C = context = 64K, flushed, lengths
// 24399 8637 10708 45558 17956 22558 34107 (163923 tokens: 3 micro-batches), LLaMA-7B's work. Heaviest
// first: 45558 34107 24399 one each, 22558 -> the 24399's (least work), 17956 -> the 34107's, 10708 ->
// the 24399's (57665 tokens). 8637 is then lightest in the third (work) but does not fit there (66302
// > 65536): it goes to the micro-batch with the fewest tokens, the 45558's, not to the next least
// work (the 34107's, where the earlier wlb put it).
static void test_full_least_work_takes_fewest_tokens(void **state) {
    (void)state;
    int64_t lens[] = {24399, 8637, 10708, 45558, 17956, 22558, 34107};
    GlobalBatch b = make_batch(lens, 7);
    int64_t C = 64 << 10;
    CostModel cm;
    if (cost_derive(&cm, model_find("llama-7b"), hw_find("h800-sxm"), 1, 1, 1, C) != 0) fail_msg("%s", bs_errmsg());
    PlanConfig cfg = {.n_ranks = 1, .capacity = C, .context = C, .pp = 1, .flush = 1};
    Plan p;
    plan_ok(&p, &b, &cfg, &cm);
    assert_int_equal(p.n_delayed, 0);
    assert_int_equal(p.n_items, 3);
    // items heaviest first: the 45558's, the 34107's, the 24399's
    expect_pack(&p, 0, 0, (int32_t[]){3, 1}, 2);
    expect_pack(&p, 1, 0, (int32_t[]){6, 4}, 2);
    expect_pack(&p, 2, 0, (int32_t[]){0, 5, 2}, 3);
    plan_free(&p);
    batch_free(&b);
}

static void test_delayed_round_trip(void **state) {
    (void)state;
    int64_t lens[] = {500, 450, 300, 100, 90, 60};
    GlobalBatch b = make_batch(lens, 6);
    CostModel cm = hand_model();
    cm.attn_pair = 1, cm.lin_token = 0, cm.n_layers = 1;
    PlanConfig cfg = {.n_ranks = 2, .capacity = 800, .context = 800, .pp = 1};
    Plan p, q, w;
    plan_ok(&p, &b, &cfg, &cm);
    char path[] = "/tmp/bs_test_wlb_XXXXXX";
    int fd = mkstemp(path);
    assert_true(fd >= 0);
    close(fd);
    assert_int_equal(plan_write_json(&p, path), 0);
    if (plan_read_json_cm(&q, path, &cm) != 0) fail_msg("%s", bs_errmsg());
    assert_int_equal(q.n_delayed, 1);
    assert_int_equal(q.delayed[0], 2);
    assert_true(q.lower_bound == p.lower_bound);
    uint8_t *buf;
    size_t size;
    assert_int_equal(plan_pack(&p, &buf, &size), 0);
    if (plan_unpack(&w, buf, size) != 0) fail_msg("%s", bs_errmsg());
    assert_int_equal(w.n_delayed, 1);
    free(buf);
    // a delayed sequence that an item holds is refused, and so is a sequence neither trained nor delayed
    q.delayed = realloc(q.delayed, 2 * sizeof *q.delayed);
    q.delayed[1] = 3, q.n_delayed = q.cap_delayed = 2;
    assert_int_equal(plan_validate(&q, &cm), -1);
    assert_non_null(strstr(bs_errmsg(), "sequence 3 (id 3) is delayed but item"));
    q.n_delayed = 0;
    assert_int_equal(plan_validate(&q, &cm), -1);
    assert_non_null(strstr(bs_errmsg(), "sequence 2 (id 2): tokens [0, 300) are in no item"));
    plan_free(&q);
    plan_free(&w);
    plan_free(&p);
    unlink(path);
    // a carried count larger than the batch is refused by name
    cfg.carried = 7;
    assert_int_equal(policy_plan(&q, "wlb", &b, &cfg, &cm), -1);
    assert_non_null(strstr(bs_errmsg(), "7 carried documents in a batch of 6"));
    batch_free(&b);
}

// The outlier level policy_wlb.c gives a document of s tokens in micro-batches of L tokens.
static int level_of(int64_t s, int64_t L) { return s > L / 2 ? 3 : s > L / 4 ? 2 : s > L / 8 ? 1 : 0; }

// The queue rule, computed here from the batch alone (d_cp = 1, d_dp = R: micro-batches of L = C
// tokens): N = the own tokens' micro-batches rounded up to a multiple of R; level j's documents in
// batch order, of which the newest (count mod N) wait. Every one of those must be delayed; every
// other delayed document must be one that fitted nowhere: not even the item with the fewest tokens
// had room for it at the end (it had less then). Returns the waiting documents.
static int check_queue(const Plan *p, const GlobalBatch *b, int64_t carried, int32_t R, int64_t C) {
    int64_t own = 0, count[4] = {0}, seen[4] = {0};
    for (int64_t i = carried; i < b->n; i++) own += b->seqs[i].len;
    int64_t N = ((own + C - 1) / C + R - 1) / R * R;
    if (N == 0) N = R;
    for (int64_t i = 0; i < b->n; i++) count[level_of(b->seqs[i].len, C)]++;
    int32_t *delayed = calloc((size_t)b->n, sizeof *delayed);
    for (int32_t d = 0; d < p->n_delayed; d++) delayed[p->delayed[d]] = 1;
    int64_t least = INT64_MAX;  // the fewest tokens of any micro-batch (an empty one: 0)
    if (p->n_items < N) least = 0;
    for (int32_t k = 0; k < p->n_items; k++) {
        int64_t t = 0;
        for (int32_t j = 0; j < p->items[k].n_segs; j++) t += p->segs[p->items[k].seg_begin + j].len;
        if (t < least) least = t;
    }
    int waiting = 0;
    for (int64_t i = 0; i < b->n; i++) {
        int lv = level_of(b->seqs[i].len, C);
        int waits = lv > 0 && seen[lv]++ >= count[lv] / N * N;
        waiting += waits;
        if (waits && !delayed[i]) fail_msg("sequence %lld (level %d) should wait", (long long)i, lv);
        if (!waits && delayed[i] && b->seqs[i].len + least <= C)
            fail_msg("sequence %lld (%lld tokens) delayed but fits a micro-batch of %lld", (long long)i,
                     (long long)b->seqs[i].len, (long long)least);
    }
    free(delayed);
    return waiting;
}

// A run of `steps` steps: each step's batch is the documents the last one delayed (first, in order,
// cfg.carried of them) and then a fresh batch; the last step flushes. Every document id is trained in
// exactly one step. With check (d_cp = 1) every step keeps the queue rule (check_queue), so the
// queue never holds more than 3 (N - 1) outliers. Returns the documents delayed over the run.
static int run_steps(uint64_t seed, const CostModel *cm, PlanConfig cfg, const char *dist, int64_t tokens, int steps,
                     int check) {
    enum { MAX_DOCS = 200000 };
    Rng g;
    rng_seed(&g, seed);
    int *trained = calloc(MAX_DOCS, sizeof(int));
    int64_t next_id = 0;
    int total_delayed = 0, max_waiting = 0;
    GlobalBatch carry;
    assert_int_equal(batch_init(&carry, 0), 0);
    for (int step = 0; step < steps; step++) {
        GlobalBatch b, fresh;
        assert_int_equal(batch_init(&b, 0), 0);
        for (int64_t i = 0; i < carry.n; i++) batch_push(&b, carry.seqs[i].id, carry.seqs[i].len, -1);
        if (batch_generate(&fresh, dist, rng_next(&g), tokens, cfg.context) != 0) fail_msg("%s", bs_errmsg());
        for (int64_t i = 0; i < fresh.n; i++) batch_push(&b, next_id++, fresh.seqs[i].len, -1);
        batch_free(&fresh);
        assert_true(next_id <= MAX_DOCS);
        cfg.flush = step == steps - 1, cfg.carried = carry.n;
        Plan p;
        plan_ok(&p, &b, &cfg, cm);
        for (int32_t s = 0; s < p.n_segs; s++) trained[p.batch.seqs[p.segs[s].seq].id]++;
        if (check && !cfg.flush) {
            int waiting = check_queue(&p, &b, carry.n, cfg.n_ranks, cfg.capacity);
            if (waiting > max_waiting) max_waiting = waiting;
        }
        batch_free(&carry);
        assert_int_equal(batch_init(&carry, 0), 0);
        for (int32_t d = 0; d < p.n_delayed; d++) {
            const Sequence *q = &p.batch.seqs[p.delayed[d]];
            batch_push(&carry, q->id, q->len, -1);
        }
        total_delayed += p.n_delayed;
        if (cfg.flush) assert_int_equal(p.n_delayed, 0);
        plan_free(&p);
        batch_free(&b);
    }
    for (int64_t id = 0; id < next_id; id++)
        if (trained[id] != 1) fail_msg("document %lld trained %d times", (long long)id, trained[id]);
    if (check) printf("%s: %d steps, %lld documents, at most %d outliers waiting\n", dist, steps, (long long)next_id, max_waiting);
    batch_free(&carry);
    free(trained);
    return total_delayed;
}

// 20 runs of six steps plus a flushing one on a CP mesh (d_cp 4): every document trained once.
static void test_every_document_once_over_steps(void **state) {
    (void)state;
    int64_t C = 4096;
    CostModel cm;
    if (cost_derive(&cm, model_find("llama-7b"), hw_find("h800-sxm"), 1, 1, 16, C) != 0) fail_msg("%s", bs_errmsg());
    PlanConfig cfg = {.n_ranks = 16, .capacity = C, .context = 16 << 10, .pp = 1};
    int total = 0;
    for (int run = 0; run < 20; run++) total += run_steps(77 + (uint64_t)run, &cm, cfg, "github", 64 << 10, 7, 0);
    assert_true(total > 0);  // the queue did delay documents
}

// 64 steps, d_cp = 1 (C = context), 4 ranks: the queue rule holds at every step, and every document is
// trained once. Two corpora: github (short, a long tail) and byted (long documents).
static void test_queue_rule_over_64_steps(void **state) {
    (void)state;
    int64_t C = 16 << 10;
    CostModel cm;
    if (cost_derive(&cm, model_find("llama-7b"), hw_find("h800-sxm"), 1, 1, 4, C) != 0) fail_msg("%s", bs_errmsg());
    PlanConfig cfg = {.n_ranks = 4, .capacity = C, .context = C, .pp = 1};
    assert_true(run_steps(5, &cm, cfg, "github", 128 << 10, 64, 1) > 0);
    assert_true(run_steps(6, &cm, cfg, "byted", 128 << 10, 64, 1) > 0);
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
        cmocka_unit_test(test_full_least_work_takes_fewest_tokens),
        cmocka_unit_test(test_delayed_round_trip),
        cmocka_unit_test(test_every_document_once_over_steps),
        cmocka_unit_test(test_queue_rule_over_64_steps),
        cmocka_unit_test(test_invariants),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
