// test_plan.c: the plan structure: chunk layout, schedules and estimates derived by hand, the lower
// bound, the validator against hand-broken plans, plan statistics, and the JSON form.
#include "plan/plan_fixtures.h"

#include <math.h>

#include "bytescale/error.h"
#include "bytescale/fileio.h"
#include "bytescale/hw.h"
#include "bytescale/model.h"
#include "bytescale/plan.h"
#include "bytescale/policy.h"
#include "bytescale/rng.h"

static int32_t add(Plan *p, int seq, int64_t len, const int32_t *ranks, int nr) {
    Segment s = {seq, 0, len};
    return plan_add_item(p, &s, 1, ranks, nr, 0.0);
}

// The plan worked out in the comments of test_schedule_by_hand.
static void build_hand_plan(Plan *p, GlobalBatch *b) {
    static const int64_t lens[] = {100, 300, 200, 50, 30, 60};
    *b = make_batch(lens, 6);
    assert_int_equal(plan_init(p, b, 3, 300, 1, "hand"), 0);
    int32_t r0[] = {0}, r1[] = {1}, r2[] = {2}, r01[] = {0, 1}, r20[] = {2, 0};
    assert_int_equal(add(p, 0, 100, r0, 1), 0);   // A
    assert_int_equal(add(p, 1, 300, r1, 1), 1);   // B
    assert_int_equal(add(p, 2, 200, r01, 2), 2);  // C
    Segment d[] = {{3, 0, 50}, {4, 0, 30}};
    assert_int_equal(plan_add_item(p, d, 2, r2, 1, 0.0), 3);  // D
    assert_int_equal(add(p, 5, 60, r20, 2), 4);                // E
}

static void test_chunk_layout(void **state) {
    (void)state;
    Rng rng;
    rng_seed(&rng, 7);
    for (int trial = 0; trial < 2000; trial++) {
        int64_t len = 1 + (int64_t)rng_below(&rng, 5000);
        int D = 1 + (int)rng_below(&rng, 40);
        int64_t at = 0, per_rank[40] = {0};
        for (int j = 0; j < 2 * D; j++) {
            int64_t start, n;
            plan_chunk(len, D, j, &start, &n);
            // independently: 2D near-equal parts, the longer ones first
            int64_t want = (len + 2 * D - 1 - j) / (2 * D);
            assert_int_equal(n, want);
            assert_int_equal(start, at);  // chunks tile the subsequence in order
            at += n;
            per_rank[j < D ? j : 2 * D - 1 - j] += n;  // rank i holds chunks i and 2D-1-i
        }
        assert_int_equal(at, len);
        for (int i = 0; i < D; i++) assert_true(llabs(per_rank[i] - per_rank[0]) <= 1);
    }
}

// Items (C = 300 tokens, 3 ranks; time of T tokens on D ranks = 2 * (1e-3 * T / D + 0.01)):
//   A pack {0}    seq0 100      0.22  starts 0     ends 0.22
//   B pack {1}    seq1 300      0.62  starts 0     ends 0.62
//   C ring {0,1}  seq2 200      0.22  starts max(0.22, 0.62) = 0.62, ends 0.84
//   D pack {2}    seq3+seq4 80  0.18  starts 0     ends 0.18
//   E ring {2,0}  seq5 60       0.08  starts max(0.18, 0.84) = 0.84, ends 0.92
// makespan 0.92; busy r0 = 0.22 + 0.22 + 0.08 = 0.52, r1 = 0.84, r2 = 0.26.
static void test_schedule_by_hand(void **state) {
    (void)state;
    CostModel cm = hand_model();
    GlobalBatch b;
    Plan p;
    build_hand_plan(&p, &b);
    assert_int_equal(plan_finalize(&p, &cm), 0);
    assert_int_equal(plan_validate(&p, &cm), 0);
    double want_t[] = {0.22, 0.62, 0.22, 0.18, 0.08};
    for (int k = 0; k < 5; k++) assert_close(p.items[k].est_time, want_t[k], 1e-12, 1e-15);
    int32_t want_begin[] = {0, 3, 5, 7}, want_items[] = {0, 2, 4, 1, 2, 3, 4};
    for (int r = 0; r <= 3; r++) assert_int_equal(p.rank_begin[r], want_begin[r]);
    for (int i = 0; i < 7; i++) assert_int_equal(p.rank_items[i], want_items[i]);
    assert_close(p.rank_busy[0], 0.52, 1e-12, 0);
    assert_close(p.rank_busy[1], 0.84, 1e-12, 0);
    assert_close(p.rank_busy[2], 0.26, 1e-12, 0);
    assert_close(p.makespan, 0.92, 1e-12, 0);
    // lower bound: work 2 * 1e-3 * 740 = 1.48; slots >= ceil(740 / 300) = 3, each 2 * 0.01 more:
    // (1.48 + 0.06) / 3 = 0.51333; the longest sequence (300) at best on 3 ranks: 2 * (0.1 + 0.01)
    // = 0.22 < 0.51333.
    assert_close(p.lower_bound, 1.54 / 3, 1e-12, 0);
    assert_true(p.makespan >= p.lower_bound);

    PlanStats st;
    assert_int_equal(plan_stats(&p, &cm, &st), 0);
    assert_int_equal(st.n_packs, 3);
    assert_int_equal(st.n_rings, 2);
    assert_int_equal(st.ring_hist[0], 3);
    assert_int_equal(st.ring_hist[1], 2);
    assert_int_equal(st.idle_ranks, 0);
    assert_close(st.busy_min, 0.26, 1e-12, 0);
    assert_close(st.busy_median, 0.52, 1e-12, 0);
    assert_close(st.busy_max, 0.84, 1e-12, 0);
    // a ring moves (3D - 2) * kv_token * T bytes per layer: C 4 * 10 * 200, E 4 * 10 * 60; 2 layers
    assert_close(st.ring_bytes, 2.0 * (8000 + 2400), 1e-12, 0);
    assert_int_equal(st.n_long, 2);
    assert_int_equal(st.n_offload, 0);
    plan_free(&p);
    batch_free(&b);
}

static void test_lower_bound_longest_sequence(void **state) {
    (void)state;
    // one sequence of 300 tokens alone: the bound is its best ring time, here on all 3 ranks:
    // 2 * (1e-3 * 300 / 3 + 0.01) = 0.22 > average (2 * 0.3 + 2 * 0.01) / 3 = 0.2067
    CostModel cm = hand_model();
    int64_t len = 300;
    GlobalBatch b = make_batch(&len, 1);
    assert_close(plan_lower_bound(&b, &cm, 3, 300), 0.22, 1e-12, 0);
    // with ring latency the best ring size is a compromise: brute force over D
    cm.ring_lat = 0.004;
    double best = INFINITY;
    for (int D = 1; D <= 3; D++) best = fmin(best, cost_item_time(&cm, &len, 1, D, 0));
    double avg = (2 * 0.3 + 2 * 0.01) / 3;
    assert_close(plan_lower_bound(&b, &cm, 3, 300), fmax(best, avg), 1e-12, 0);
    batch_free(&b);
}

// ---- the validator: every kind of violation, each with its message ----------------------------------

typedef void (*Breaker)(Plan *p);

static void expect_invalid(Breaker brk, const char *needle, int finalize_after) {
    CostModel cm = hand_model();
    GlobalBatch b;
    Plan p;
    build_hand_plan(&p, &b);
    assert_int_equal(plan_finalize(&p, &cm), 0);
    brk(&p);
    if (finalize_after) assert_int_equal(plan_finalize(&p, &cm), 0);
    bs_error_clear();
    assert_int_equal(plan_validate(&p, &cm), -1);
    if (!strstr(bs_errmsg(), needle)) fail_msg("expected \"%s\" in: %s", needle, bs_errmsg());
    plan_free(&p);
    batch_free(&b);
}

static void brk_missing(Plan *p) { p->segs[p->items[4].seg_begin].len = 40, p->items[4].tokens = 40; }
static void brk_overlap(Plan *p) { p->segs[1].seq = 0, p->segs[1].len = 100, p->items[1].tokens = 100; }
static void brk_gap(Plan *p) { p->segs[0].start = 10, p->segs[0].len = 90, p->items[0].tokens = 90; }
static void brk_past_end(Plan *p) { p->segs[0].start = 50; }
static void brk_bad_seq(Plan *p) { p->segs[0].seq = 9; }
static void brk_dup_rank(Plan *p) { p->ranks[p->items[2].rank_begin + 1] = 0; }
static void brk_pack_cap(Plan *p) { p->capacity = 250; }  // B holds 300
static void brk_ring_cap(Plan *p) {
    // C's sequence grows to 700 tokens: more than its 2 ranks hold (2 * 300) without offloading
    p->batch.seqs[2].len = 700, p->batch.n_tokens += 500;
    p->segs[p->items[2].seg_begin].len = 700, p->items[2].tokens = 700;
}
static void brk_offload_range(Plan *p) { p->items[2].offload = 1.5f; }
static void brk_offload_short(Plan *p) {
    // everything offloads 10% with C = 90 and l = 2: A keeps (2 + 0.9 * 0) * Act(100) = 200 bytes
    // against l * Act(C) = 180 (with l <= 2 offloading cannot help)
    p->capacity = 90;
    for (int k = 0; k < p->n_items; k++) p->items[k].offload = 0.1f;
}
static void brk_tokens(Plan *p) { p->items[3].tokens = 10; }
static void brk_order(Plan *p) {
    int32_t *ri = p->rank_items + p->rank_begin[0];  // rank 0 runs 0, 2, 4: make it 0, 4, 2
    ri[1] = 4, ri[2] = 2;
}
static void brk_not_member(Plan *p) { p->rank_items[p->rank_begin[1]] = 0; }  // rank 1 lists item 0, not 1
static void brk_unfinalized(Plan *p) {
    free(p->rank_begin);
    p->rank_begin = NULL;
}
static void brk_rank_range(Plan *p) { p->ranks[0] = 3; }
static void brk_seg_count(Plan *p) { p->n_segs++; }
static void brk_no_ranks(Plan *p) { p->items[1].n_ranks = 0; }

static void test_validator_catches_each_violation(void **state) {
    (void)state;
    expect_invalid(brk_missing, "sequence 5 (id 5): tokens [40, 60) are in no item", 1);
    expect_invalid(brk_overlap, "sequence 0 (id 0): tokens [0, 100) are in two items (0 and 1)", 1);
    expect_invalid(brk_gap, "sequence 0 (id 0): tokens [0, 10) are in no item", 1);
    expect_invalid(brk_past_end, "item 0: segment 0: tokens [50, +100) outside sequence 0 (length 100)", 0);
    expect_invalid(brk_bad_seq, "item 0: segment 0: sequence 9 out of range [0, 6)", 0);
    expect_invalid(brk_dup_rank, "item 2: rank 0 appears twice", 0);
    expect_invalid(brk_pack_cap, "item 1: 300 tokens on 1 rank exceed the capacity of 250", 0);
    expect_invalid(brk_ring_cap, "item 2: 700 tokens on 2 ranks exceed the capacity of 300 tokens per rank", 0);
    expect_invalid(brk_offload_range, "item 2: offload ratio 1.5 outside [0, 1]", 0);
    expect_invalid(brk_offload_short,
                   "item 0: 100 tokens on 1 rank with offload ratio 0.1000 need 200 activation bytes per rank, more "
                   "than the budget of 180 (Eq. 3)",
                   0);
    expect_invalid(brk_tokens, "item 3: says 10 tokens but its segments hold 80", 0);
    expect_invalid(brk_order, "rank 0: runs item 2 after item 4", 0);
    expect_invalid(brk_not_member, "rank 1: its schedule lists item 0 but it is not a member", 0);
    expect_invalid(brk_unfinalized, "plan_finalize", 0);
    expect_invalid(brk_rank_range, "item 0: rank 3 out of range [0, 3)", 0);
    expect_invalid(brk_seg_count, "the items use 6 of the 7 segments", 0);
    expect_invalid(brk_no_ranks, "item 1 has 0 ranks", 0);
}

static void test_offloading_ring_within_eq3(void **state) {
    (void)state;
    // l = 4: with ratio r a rank keeps (2 + 2(1-r)) Act(T/D) against 4 Act(C); 200 tokens on 2 ranks
    // with C = 60: Act(100) = 100 per rank, budget 240: 2 + 2(1-r) <= 2.4 needs r >= 0.8
    CostModel cm = hand_model();
    cm.n_layers = 4;
    int64_t len = 200;
    GlobalBatch b = make_batch(&len, 1);
    for (int pass = 0; pass < 2; pass++) {
        Plan p;
        assert_int_equal(plan_init(&p, &b, 2, 60, 1, "hand"), 0);
        int32_t r01[] = {0, 1};
        Segment s = {0, 0, 200};
        assert_true(plan_add_item(&p, &s, 1, r01, 2, pass ? 0.8 : 0.79) >= 0);
        assert_int_equal(plan_finalize(&p, &cm), 0);
        assert_int_equal(plan_validate(&p, &cm), pass ? 0 : -1);
        // without a cost model the offloading ring is not checked against Eq. 3
        assert_int_equal(plan_validate(&p, NULL), 0);
        plan_free(&p);
    }
    batch_free(&b);
}

// ---- JSON -------------------------------------------------------------------------------------------

static void policy_plan_for_test(Plan *p, GlobalBatch *b, CostModel *cm) {
    assert_int_equal(cost_derive(cm, model_find("llama-7b"), hw_find("h800-sxm"), 2, 1, 64, 8192), 0);
    assert_int_equal(batch_generate(b, "byted", 3, 4 << 20, 1 << 20), 0);
    PlanConfig cfg = {.n_ranks = 64, .capacity = 8192, .pp = 1, .offload = 1};
    assert_int_equal(policy_plan(p, "balance", b, &cfg, cm), 0);
}

static void test_json_round_trip(void **state) {
    (void)state;
    const char *dir = test_tmpdir("plan_json");
    char path[600];
    snprintf(path, sizeof path, "%s/plan.json", dir);
    CostModel cm;
    GlobalBatch b;
    Plan p, q, r;
    policy_plan_for_test(&p, &b, &cm);
    assert_int_equal(plan_write_json(&p, path), 0);
    assert_int_equal(plan_read_json_cm(&q, path, &cm), 0);
    assert_int_equal(q.n_ranks, p.n_ranks);
    assert_int_equal(q.pp, p.pp);
    assert_int_equal(q.capacity, p.capacity);
    assert_string_equal(q.policy, "balance");
    assert_int_equal(q.batch.n, p.batch.n);
    assert_int_equal(q.batch.n_tokens, p.batch.n_tokens);
    for (int64_t i = 0; i < p.batch.n; i++) {
        assert_int_equal(q.batch.seqs[i].id, p.batch.seqs[i].id);
        assert_int_equal(q.batch.seqs[i].len, p.batch.seqs[i].len);
        assert_int_equal(q.batch.seqs[i].src, p.batch.seqs[i].src);
    }
    assert_int_equal(q.n_items, p.n_items);
    assert_int_equal(q.n_segs, p.n_segs);
    assert_int_equal(q.n_refs, p.n_refs);
    for (int i = 0; i < p.n_segs; i++) {  // field by field: Segment has padding
        assert_int_equal(q.segs[i].seq, p.segs[i].seq);
        assert_int_equal(q.segs[i].start, p.segs[i].start);
        assert_int_equal(q.segs[i].len, p.segs[i].len);
    }
    assert_memory_equal(q.ranks, p.ranks, (size_t)p.n_refs * sizeof(int32_t));
    for (int k = 0; k < p.n_items; k++) {
        assert_true(q.items[k].offload == p.items[k].offload);  // a float survives the text exactly
        assert_true(q.items[k].est_time == p.items[k].est_time);
        assert_int_equal(q.items[k].tokens, p.items[k].tokens);
    }
    assert_true(q.makespan == p.makespan);
    assert_true(q.lower_bound == p.lower_bound);
    // without a cost model: the file's estimates stand, the schedule is re-derived from them
    assert_int_equal(plan_read_json(&r, path), 0);
    assert_true(r.makespan == p.makespan);
    assert_true(r.lower_bound == p.lower_bound);
    assert_memory_equal(r.rank_items, p.rank_items, (size_t)p.n_refs * sizeof(int32_t));
    plan_free(&p);
    plan_free(&q);
    plan_free(&r);
    batch_free(&b);
}

// A small valid plan file, then variants with one thing wrong.
static const char *GOOD =
    "{\"version\": 1, \"policy\": \"hand\", \"n_ranks\": 3, \"pp\": 1, \"capacity\": 300,\n"
    " \"sequences\": [{\"id\": 0, \"len\": 100, \"src\": -1}, {\"id\": 1, \"len\": 200, \"src\": -1}],\n"
    " \"items\": [{\"ranks\": [0], \"offload\": 0, \"segments\": [[0, 0, 100]]},\n"
    "           {\"ranks\": [1, 2], \"offload\": 0, \"segments\": [[1, 0, 200]]}]}\n";

static void expect_bad_file(const char *dir, const char *from, const char *to, const char *needle) {
    char path[600], text[2048];
    snprintf(path, sizeof path, "%s/bad.json", dir);
    const char *at = strstr(GOOD, from);
    assert_non_null(at);
    snprintf(text, sizeof text, "%.*s%s%s", (int)(at - GOOD), GOOD, to, at + strlen(from));
    assert_int_equal(file_write_atomic(path, text, strlen(text)), 0);
    Plan p;
    CostModel cm = hand_model();
    bs_error_clear();
    assert_int_equal(plan_read_json_cm(&p, path, &cm), -1);
    if (!strstr(bs_errmsg(), needle)) fail_msg("expected \"%s\" in: %s", needle, bs_errmsg());
    if (!strstr(bs_errmsg(), "bad.json")) fail_msg("the message should name the file: %s", bs_errmsg());
}

static void test_json_errors_name_the_place(void **state) {
    (void)state;
    const char *dir = test_tmpdir("plan_json_bad");
    char path[600];
    snprintf(path, sizeof path, "%s/good.json", dir);
    assert_int_equal(file_write_atomic(path, GOOD, strlen(GOOD)), 0);
    Plan p;
    CostModel cm = hand_model();
    assert_int_equal(plan_read_json_cm(&p, path, &cm), 0);
    assert_int_equal(p.n_items, 2);
    assert_int_equal(p.rank_begin[3], 3);
    plan_free(&p);

    expect_bad_file(dir, "\"version\": 1", "\"version\": 2", "plan format version 2");
    expect_bad_file(dir, "\"n_ranks\": 3", "\"n_ranks\": 0", "\"n_ranks\" is 0, outside [1,");
    expect_bad_file(dir, "\"capacity\": 300", "\"capacity\": \"big\"", "\"capacity\" must be an integer");
    expect_bad_file(dir, " \"items\": [", " \"itemz\": [", "missing \"items\"");
    expect_bad_file(dir, "\"len\": 200", "\"len\": -5", "sequences[1]: \"len\" is -5");
    expect_bad_file(dir, "[1, 2]", "[1, \"x\"]", "items[1].ranks[1]: expected an integer");
    expect_bad_file(dir, "[1, 2]", "[1, 7]", "items[1].ranks[1]: rank 7 out of range [0, 3)");
    expect_bad_file(dir, "[[1, 0, 200]]", "[[1, 0]]", "items[1].segments[0]: expected [seq, start, len]");
    expect_bad_file(dir, "[[1, 0, 200]]", "[[5, 0, 200]]", "items[1].segments[0]: sequence 5 out of range");
    expect_bad_file(dir, "\"offload\": 0, \"segments\": [[1", "\"segments\": [[1", "items[1]: missing \"offload\"");
    expect_bad_file(dir, "[[1, 0, 200]]", "[[1, 0, 150]]", "sequence 1 (id 1): tokens [150, 200) are in no item");
    expect_bad_file(dir, "[[1, 0, 200]]", "[[1, 0, 200]], \"x\": [", "invalid JSON");
    expect_bad_file(dir, "\"ranks\": [0]", "\"ranks\": []", "items[0]: \"ranks\" is empty");
}

// Token counts read from a file are bounded before they are summed: a file with huge lengths is an
// error that names the place, not a signed overflow.
static void test_json_token_counts_cannot_overflow(void **state) {
    (void)state;
    const char *dir = test_tmpdir("plan_json_overflow");
    char path[600];
    snprintf(path, sizeof path, "%s/huge.json", dir);
    enum { N = 1100 };
    const char *big = "9007199254740992";  // 2^53, the largest integer a plan file holds; 1024 of them overflow
    size_t cap = N * 64 + 1024;
    char *text = malloc(cap);
    assert_non_null(text);
    Plan p;
    // 1. sequences whose lengths sum past INT64_MAX
    size_t n = (size_t)snprintf(text, cap, "{\"version\": 1, \"policy\": \"hand\", \"n_ranks\": 1, \"pp\": 1, "
                                           "\"capacity\": 300, \"items\": [], \"sequences\": [");
    for (int i = 0; i < N; i++)
        n += (size_t)snprintf(text + n, cap - n, "%s{\"id\": %d, \"len\": %s}", i ? ", " : "", i, big);
    snprintf(text + n, cap - n, "]}\n");
    assert_int_equal(file_write_atomic(path, text, strlen(text)), 0);
    bs_error_clear();
    assert_int_equal(plan_read_json(&p, path), -1);
    if (!strstr(bs_errmsg(), "huge.json: sequences[1023]: the sequences hold more than")) fail_msg("%s", bs_errmsg());
    // 2. one item whose segments sum past INT64_MAX (the same 2^53-token sequence over and over)
    n = (size_t)snprintf(text, cap, "{\"version\": 1, \"policy\": \"hand\", \"n_ranks\": 1, \"pp\": 1, "
                                    "\"capacity\": 300, \"sequences\": [{\"id\": 0, \"len\": %s}], "
                                    "\"items\": [{\"ranks\": [0], \"offload\": 0, \"segments\": [", big);
    for (int i = 0; i < N; i++) n += (size_t)snprintf(text + n, cap - n, "%s[0, 0, %s]", i ? ", " : "", big);
    snprintf(text + n, cap - n, "]}]}\n");
    assert_int_equal(file_write_atomic(path, text, strlen(text)), 0);
    bs_error_clear();
    assert_int_equal(plan_read_json(&p, path), -1);
    if (!strstr(bs_errmsg(), "huge.json: items[0].segments[1]: length 9007199254740992")) fail_msg("%s", bs_errmsg());
    free(text);
}

// Issue 8: a plan's numbers near the ends of int64. D x C is formed as tokens / D against C (2048
// ranks x C = 2^52 is 2^63, one past INT64_MAX: UBSan reported src/plan/plan_check.c), and a
// segment's start + len is never formed when start is huge.
static void test_validate_extreme_numbers(void **state) {
    (void)state;
    GlobalBatch b;
    const int64_t lens[] = {5000};
    b = make_batch(lens, 1);
    Plan p;
    assert_int_equal(plan_init(&p, &b, 2048, (int64_t)1 << 52, 1, "hand"), 0);
    int32_t *ranks = malloc(2048 * sizeof *ranks);
    for (int r = 0; r < 2048; r++) ranks[r] = r;
    assert_int_equal(add(&p, 0, 5000, ranks, 2048), 0);
    assert_int_equal(plan_finalize(&p, NULL), 0);
    if (plan_validate(&p, NULL) != 0) fail_msg("%s", bs_errmsg());
    // the same tokens on one rank of capacity 4999: over by one
    plan_free(&p);
    assert_int_equal(plan_init(&p, &b, 1, 4999, 1, "hand"), 0);
    assert_int_equal(add(&p, 0, 5000, ranks, 1), 0);
    assert_int_equal(plan_finalize(&p, NULL), 0);
    assert_int_equal(plan_validate(&p, NULL), -1);
    assert_non_null(strstr(bs_errmsg(), "exceed the capacity of 4999"));
    // a segment starting at INT64_MAX - 10: outside its sequence, said so without overflowing
    p.segs[0].start = INT64_MAX - 10;
    assert_int_equal(plan_validate(&p, NULL), -1);
    assert_non_null(strstr(bs_errmsg(), "outside sequence 0"));
    plan_free(&p);
    free(ranks);
    batch_free(&b);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_chunk_layout),
        cmocka_unit_test(test_schedule_by_hand),
        cmocka_unit_test(test_lower_bound_longest_sequence),
        cmocka_unit_test(test_validator_catches_each_violation),
        cmocka_unit_test(test_offloading_ring_within_eq3),
        cmocka_unit_test(test_json_round_trip),
        cmocka_unit_test(test_json_errors_name_the_place),
        cmocka_unit_test(test_json_token_counts_cannot_overflow),
        cmocka_unit_test(test_validate_extreme_numbers),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
