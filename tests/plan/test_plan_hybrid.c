// test_plan_hybrid.c: the hybrid item kind (Item.ulysses: a ring of n_ranks / u Ulysses groups of u)
// in the plan (docs/plan-format.md):
//   - plan_finalize sets its est_time with cost_hybrid_item_time (the hand-computed 1.0887 s of
//     tests/core/test_cost_hybrid.c) and plan_stats counts its bytes by hand;
//   - it goes through a plan file ("ulysses": 2 on that item only, a second write byte-identical)
//     and the wire form (version 4; with block items too, version 5; a plan without hybrid items
//     still version 1);
//   - plan_validate refuses each bad case with a message naming it: u not dividing the ranks, u = 1,
//     u = D, u with a2a, u with offloading, u above the heads of a TP shard, a member over capacity.
#include "plan/plan_fixtures.h"

#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include "bytescale/error.h"
#include "bytescale/plan.h"

// tests/core/test_cost_hybrid.c's hand model: 2 layers, 4 query heads and 1 K/V head per shard,
// K/V 8 bytes a token, Q + O 16 more, 2 ranks a node (links 4e5 / 1e-4 inside, 2e5 / 1e-3 across).
static CostModel hybrid_model(void) {
    CostModel cm = hand_model();
    cm.layer_const = 0;
    cm.attn_pair = 1e-6;
    cm.head_token = 1e-4;
    cm.kv_token = 8, cm.a2a_token = 24;
    cm.a2a_heads = 4, cm.a2a_kv_heads = 1;
    cm.ring_bw = 2e5, cm.ring_lat = 1e-3;
    cm.ring_bw_intra = 4e5, cm.ring_lat_intra = 1e-4;
    cm.ranks_per_node = 2;
    return cm;
}

// 8 ranks, capacity 300: sequence 0 (1,200 tokens) as a hybrid on ranks 0-3 (u = 2: groups {0, 1} and
// {2, 3}), sequences 1 and 2 (100 each) as packs on ranks 4 and 5; item 0's u set to `u`, its
// offload to `off`, its a2a flag to `a2a`. Not finalized.
static void build(Plan *p, GlobalBatch *b, int u, double off, int a2a, int64_t capacity) {
    int64_t lens[] = {1200, 100, 100};
    *b = make_batch(lens, 3);
    assert_int_equal(plan_init(p, b, 8, capacity, 1, "hand"), 0);
    Segment s0 = {0, 0, 1200}, s1 = {1, 0, 100}, s2 = {2, 0, 100};
    int32_t r0[] = {0, 1, 2, 3}, r1[] = {4}, r2[] = {5};
    assert_int_equal(plan_add_item(p, &s0, 1, r0, 4, off), 0);
    assert_int_equal(plan_add_item(p, &s1, 1, r1, 1, 0), 1);
    assert_int_equal(plan_add_item(p, &s2, 1, r2, 1, 0), 2);
    p->items[0].ulysses = u;
    p->items[0].a2a = a2a;
}

static char *slurp(const char *path) {
    FILE *f = fopen(path, "rb");
    assert_non_null(f);
    static char buf[1 << 14];
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = '\0';
    char *out = malloc(n + 1);
    memcpy(out, buf, n + 1);
    return out;
}

static void test_estimate_and_bytes(void **state) {
    (void)state;
    CostModel cm = hybrid_model();
    GlobalBatch b;
    Plan p;
    build(&p, &b, 2, 0, 0, 300);
    assert_int_equal(plan_finalize(&p, &cm), 0);
    if (plan_validate(&p, &cm) != 0) fail_msg("%s", bs_errmsg());
    assert_int_equal(plan_item_kind(&p, 0), ITEM_HYBRID);
    assert_int_equal(plan_item_kind(&p, 1), ITEM_RING);
    assert_close(p.items[0].est_time, 1.0887, 1e-12, 0);
    // packs: 2 layers x (1e-3 x 100 + 1e-6 x 5,050 pairs) + head 1e-4 x 100 = 0.2201
    assert_close(p.items[1].est_time, 0.2201, 1e-12, 0);
    PlanStats st;
    assert_int_equal(plan_stats(&p, &cm, &st), 0);
    assert_int_equal(st.n_rings, 1);
    // per layer: the two groups' all-to-alls, forward and backward, 32 bytes a token (K/V replicated)
    // for half of every token: 2 x 32 x 1200 / 2 = 38,400; the ring of 2 groups: 4 members, each a
    // group block of 600 tokens x 8 bytes = 4,800, sent 3 x 2 - 2 = 4 times (1 forward, 1 backward,
    // 1 dK/dV, 1 home): 76,800. 2 layers: 230,400.
    assert_close(st.ring_bytes, 230400, 1e-12, 0);
    plan_free(&p);
    batch_free(&b);
}

static void test_file_and_wire_round_trip(void **state) {
    (void)state;
    CostModel cm = hybrid_model();
    GlobalBatch b;
    Plan p, q, w;
    build(&p, &b, 2, 0, 0, 300);
    assert_int_equal(plan_finalize(&p, &cm), 0);
    char path[] = "/tmp/bs_test_hybrid_XXXXXX", path2[] = "/tmp/bs_test_hybrid2_XXXXXX";
    int fd = mkstemp(path), fd2 = mkstemp(path2);
    assert_true(fd >= 0 && fd2 >= 0);
    close(fd), close(fd2);
    assert_int_equal(plan_write_json(&p, path), 0);
    char *text = slurp(path);
    const char *at = strstr(text, "\"ulysses\": 2");
    assert_non_null(at);
    assert_null(strstr(at + 1, "\"ulysses\""));  // on the hybrid item only
    if (plan_read_json_cm(&q, path, &cm) != 0) fail_msg("%s", bs_errmsg());
    assert_int_equal(q.items[0].ulysses, 2);
    assert_int_equal(q.items[1].ulysses, 0);
    assert_close(q.items[0].est_time, 1.0887, 1e-12, 0);
    assert_int_equal(plan_write_json(&q, path2), 0);
    char *text2 = slurp(path2);
    assert_string_equal(text, text2);
    free(text), free(text2);
    uint8_t *buf;
    size_t size;
    assert_int_equal(plan_pack(&p, &buf, &size), 0);
    uint32_t version;
    memcpy(&version, buf + 4, 4);
    assert_int_equal(version, 4);
    if (plan_unpack(&w, buf, size) != 0) fail_msg("%s", bs_errmsg());
    assert_int_equal(w.items[0].ulysses, 2);
    assert_int_equal(w.items[2].ulysses, 0);
    free(buf);
    // a damaged u is refused, not run: 3 does not divide the ring of 4
    assert_int_equal(plan_pack(&p, &buf, &size), 0);
    int32_t bad = 3;
    memcpy(buf + size - 3 * 4, &bad, 4);  // the last n_items int32 are the items' u
    Plan x;
    assert_int_equal(plan_unpack(&x, buf, size), -1);
    assert_non_null(strstr(bs_errmsg(), "ulysses 3"));
    free(buf);
    // without hybrid items the message is the version it always was
    p.items[0].ulysses = 0;
    assert_int_equal(plan_pack(&p, &buf, &size), 0);
    memcpy(&version, buf + 4, 4);
    assert_int_equal(version, 1);
    free(buf);
    plan_free(&q), plan_free(&w), plan_free(&p);
    unlink(path), unlink(path2);
    batch_free(&b);
}

// A plan with a hybrid item and a block item (the block peer's kind) beside it: the wire's version 5
// carries both the owners and every item's u.
static void test_wire_with_block_items(void **state) {
    (void)state;
    CostModel cm = hybrid_model();
    int64_t lens[] = {1200, 100, 100};
    GlobalBatch b = make_batch(lens, 3);
    Plan p, w;
    assert_int_equal(plan_init(&p, &b, 8, 300, 1, "hand"), 0);
    Segment s0 = {0, 0, 1200}, blocks[] = {{1, 0, 100}, {2, 0, 100}};
    int32_t r0[] = {0, 1, 2, 3}, r1[] = {4, 5}, owners[] = {0, 1};
    assert_int_equal(plan_add_item(&p, &s0, 1, r0, 4, 0), 0);
    assert_int_equal(plan_add_blocks_item(&p, blocks, 2, r1, 2, owners), 1);
    p.items[0].ulysses = 2;
    assert_int_equal(plan_finalize(&p, &cm), 0);
    if (plan_validate(&p, &cm) != 0) fail_msg("%s", bs_errmsg());
    assert_int_equal(plan_item_kind(&p, 0), ITEM_HYBRID);
    assert_int_equal(plan_item_kind(&p, 1), ITEM_BLOCKS);
    uint8_t *buf;
    size_t size;
    assert_int_equal(plan_pack(&p, &buf, &size), 0);
    uint32_t version;
    memcpy(&version, buf + 4, 4);
    assert_int_equal(version, 5);
    if (plan_unpack(&w, buf, size) != 0) fail_msg("%s", bs_errmsg());
    assert_int_equal(w.items[0].ulysses, 2);
    assert_int_equal(w.items[1].ulysses, 0);
    assert_int_equal(plan_item_kind(&w, 1), ITEM_BLOCKS);
    assert_int_equal(w.seg_owner[2], 1);
    // a block item cannot also be a hybrid
    p.items[1].ulysses = 2;
    assert_int_equal(plan_validate(&p, &cm), -1);
    assert_non_null(strstr(bs_errmsg(), "item 1: a block item cannot offload or be an all-to-all group or a hybrid"));
    free(buf);
    plan_free(&w), plan_free(&p);
    batch_free(&b);
}

// plan_validate on item 0 built with (u, offload, a2a, capacity): -1 and a message containing `want`.
static void refused(const CostModel *cm, int u, double off, int a2a, int64_t capacity, const char *want) {
    GlobalBatch b;
    Plan p;
    build(&p, &b, u, off, a2a, capacity);
    assert_int_equal(plan_finalize(&p, cm), 0);
    assert_int_equal(plan_validate(&p, cm), -1);
    if (!strstr(bs_errmsg(), want)) fail_msg("u %d: \"%s\" does not say \"%s\"", u, bs_errmsg(), want);
    plan_free(&p);
    batch_free(&b);
}

static void test_validator_refuses(void **state) {
    (void)state;
    CostModel cm = hybrid_model();
    refused(&cm, 3, 0, 0, 300, "item 0: a hybrid item's Ulysses group size (ulysses 3) must be in [2, 4) and divide");
    refused(&cm, 1, 0, 0, 300, "(ulysses 1) must be in [2, 4)");
    refused(&cm, 4, 0, 0, 300, "(ulysses 4) must be in [2, 4)");
    refused(&cm, 2, 0, 1, 300, "item 0: a hybrid item (ulysses 2) cannot also be an all-to-all group");
    // 1,200 tokens on 4 members are 300 each: over a capacity of 299
    refused(&cm, 2, 0, 0, 299, "item 0: 1200 tokens on 4 ranks exceed the capacity of 299");
    CostModel narrow = cm;
    narrow.a2a_heads = 1;  // one query head per TP shard: no Ulysses group of 2
    refused(&narrow, 2, 0, 0, 300, "item 0: a hybrid item's Ulysses group of 2 ranks exceeds the 1 attention heads");
    // the same plan without a cost model: the head limit is not known, the rest holds
    GlobalBatch b;
    Plan p;
    build(&p, &b, 2, 0, 0, 300);
    assert_int_equal(plan_finalize(&p, NULL), 0);
    assert_int_equal(plan_validate(&p, NULL), 0);
    plan_free(&p);
    batch_free(&b);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_estimate_and_bytes),
        cmocka_unit_test(test_file_and_wire_round_trip),
        cmocka_unit_test(test_wire_with_block_items),
        cmocka_unit_test(test_validator_refuses),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
