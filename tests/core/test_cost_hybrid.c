// test_cost_hybrid.c: the cost of a hybrid item (a ring of r Ulysses groups of u, cost_hybrid_item_time)
// and of an all-to-all group (cost_a2a_item_time): a small case worked out by hand, and the two ends
// of the hybrid (u = 1: the ring of r; r = 1: the group of u) against the ring's and the group's own
// functions over many random models, with and without TP, GQA replication and uneven heads.
#include "test_util.h"

#include <math.h>

#include "bytescale/cost.h"
#include "bytescale/rng.h"

static double uniform(Rng *r, double lo, double hi) { return lo + (hi - lo) * rng_uniform(r); }

// The hand case's model: 2 layers, no TP, 4 query heads and 1 K/V head per shard (GQA), K/V 8 bytes
// a token, Q + O 16 more (a2a_token 24), 2 ranks a node with a link 2x faster inside it.
static CostModel hand_model(void) {
    CostModel cm;
    memset(&cm, 0, sizeof cm);
    cm.n_layers = 2;
    cm.lin_token = 1e-3;
    cm.attn_pair = 1e-6;
    cm.head_token = 1e-4;
    cm.kv_token = 8;
    cm.a2a_token = 24;
    cm.a2a_heads = 4;
    cm.a2a_kv_heads = 1;
    cm.ring_bw = 2e5, cm.ring_lat = 1e-3;
    cm.ring_bw_intra = 4e5, cm.ring_lat_intra = 1e-4;
    cm.ranks_per_node = 2;
    cm.act_token = 1, cm.capacity_bytes = 1;
    return cm;
}

// One segment of 1,200 tokens on D = 4 ranks: area 1200 x 1201 / 2 = 720,600 pairs; every member
// holds 300 tokens: linear 1e-3 x 300 = 0.3 s a layer (forward 0.1, backward 0.2); head 1e-4 x 300 =
// 0.03 s once.
static void test_hand_computation(void **state) {
    (void)state;
    CostModel cm = hand_model();
    int64_t seg[] = {1200};
    // Hybrid u = 2, r = 2. The group (ranks 0-1, inside a node): 1 K/V head for 2 members, so K and
    // V are replicated: 24 + (2 - 1) x 8 / 1 = 32 bytes a token; a member sends half of its 300
    // tokens' bytes: 32 x 300 / 2 = 4,800 bytes, 4,800 / 4e5 + 1e-4 = 0.0121 s per direction.
    // The ring of 2 groups spans 4 ranks (2 nodes): the slow link. A group block is 600 tokens, each
    // member with its one K/V head (share 1): 8 x 600 = 4,800 bytes, forward 4,800 / 2e5 + 1e-3 =
    // 0.025 s, backward (K/V and dK/dV) 9,600 / 2e5 + 1e-3 = 0.049 s. A block: 720,600 / 4 pairs on
    // half of the heads (2 of 4) = 90,075 pairs x 1e-6 = 0.090075 s: forward 0.030025, backward 0.06005.
    //   forward  0.1 + 0.0121 + 0.030025 + max(0.030025, 0.025)             = 0.17215
    //   backward 0.2 + 0.0121 + 0.06005 + max(0.06005, 0.049) + 0.025 (home) = 0.3572
    //   2 layers x 0.52935 + head 0.03 = 1.0887
    assert_close(cost_hybrid_item_time(&cm, seg, 1, 2, 2, 0.0), 1.0887, 1e-12, 0);
    // The all-to-all group of 4 (spans 2 nodes: the slow link): 4 members, 1 K/V head replicated to
    // 4: 24 + 3 x 8 = 48 bytes a token; (4 - 1) / 4 of 300 tokens: 10,800 bytes, 10,800 / 2e5 + 1e-3 =
    // 0.055 s per direction. Attention: a quarter of the heads over the whole mask, 720,600 / 4 x 1e-6
    // = 0.18015 s. A layer: 0.3 + 0.18015 + 2 x 0.055 = 0.59015; 2 layers + head: 1.2103.
    assert_close(cost_a2a_item_time(&cm, seg, 1, 4, 0.0), 1.2103, 1e-12, 0);
    assert_close(cost_hybrid_item_time(&cm, seg, 1, 4, 1, 0.0), 1.2103, 1e-12, 0);
    // The ring of 4 (u = 1): a member's K/V block 8 x 300 = 2,400 bytes: forward 0.013 s, backward
    // 0.025 s; a block 720,600 / 16 x 1e-6 = 0.0450375 s (forward 0.0150125, backward 0.030025).
    //   forward  0.1 + 0.0150125 + 3 x max(0.0150125, 0.013)            = 0.16005
    //   backward 0.2 + 0.030025 + 3 x max(0.030025, 0.025) + 0.013 (home) = 0.3331
    //   2 layers x 0.49315 + 0.03 = 1.0163
    assert_close(cost_item_time(&cm, seg, 1, 4, 0.0), 1.0163, 1e-12, 0);
    assert_close(cost_hybrid_item_time(&cm, seg, 1, 1, 4, 0.0), 1.0163, 1e-12, 0);
    // Without GQA replication (4 K/V heads, 2 a member): the group moves 24 bytes a token (3,600:
    // 0.0091 s) and the ring half of the K/V (2,400 bytes: forward 0.013, backward 0.025):
    //   forward  0.1 + 0.0091 + 0.030025 + max(0.030025, 0.013)            = 0.16915
    //   backward 0.2 + 0.0091 + 0.06005 + max(0.06005, 0.025) + 0.013 (home) = 0.3422
    //   2 layers x 0.51135 + 0.03 = 1.0527
    cm.a2a_kv_heads = 4;
    assert_close(cost_hybrid_kv_share(&cm, 2), 0.5, 1e-12, 0);
    assert_close(cost_hybrid_item_time(&cm, seg, 1, 2, 2, 0.0), 1.0527, 1e-12, 0);
}

// Offloading under the Ulysses kinds: the hand case with 4 layers (2 of them offload) and a tier of
// 1,000 bytes/s at 1 byte a token. A member holds 300 tokens under every kind, so offloading all of
// them (r = 1) copies 300 bytes a layer: 0.3 s, against the layer's forward and backward above.
//   hybrid u = 2: forward 0.17215, backward 0.3572: 0.3 - 0.17215 = 0.12785 exposed a layer, x 2
//   layers = 0.2557; 4 x 0.52935 + 0.03 = 2.1474, + 0.2557 = 2.4031.
//   a2a of 4: a layer's work 0.48015 (a third forward), the exchange 0.055 each way: forward 0.21505,
//   backward 0.3751: 0.08495 exposed, x 2 = 0.1699; 4 x 0.59015 + 0.03 = 2.3906, + 0.1699 = 2.5605.
// Half of it (0.15 s) hides behind both directions of both kinds: nothing added.
static void test_hand_offload(void **state) {
    (void)state;
    CostModel cm = hand_model();
    cm.n_layers = 4;
    cm.offload_bw = 1000;
    int64_t seg[] = {1200};
    assert_close(cost_hybrid_item_time(&cm, seg, 1, 2, 2, 1.0), 2.4031, 1e-12, 0);
    assert_close(cost_a2a_item_time(&cm, seg, 1, 4, 1.0), 2.5605, 1e-12, 0);
    assert_close(cost_hybrid_item_time(&cm, seg, 1, 2, 2, 0.5), 2.1474, 1e-12, 0);
    assert_close(cost_a2a_item_time(&cm, seg, 1, 4, 0.5), 2.3906, 1e-12, 0);
    // the ends agree with offloading too: u = 1 is the ring's cost_item_time with the same r
    assert_close(cost_hybrid_item_time(&cm, seg, 1, 1, 4, 1.0), cost_item_time(&cm, seg, 1, 4, 1.0), 1e-12, 0);
}

// A random model as test_cost.c's, plus heads (sometimes unknown) and, sometimes, TP terms.
static CostModel random_model(Rng *g) {
    static const int heads[] = {0, 4, 8, 12, 32, 64};
    CostModel cm;
    memset(&cm, 0, sizeof cm);
    cm.attn_pair = uniform(g, 0.2, 5) * 1e-11;
    cm.lin_token = uniform(g, 0.2, 5) * 1e-7;
    cm.layer_const = rng_below(g, 2) ? uniform(g, 0, 1e-4) : 0;
    cm.n_layers = 1 + (int)rng_below(g, 40);
    cm.kv_token = uniform(g, 100, 3000);
    cm.a2a_token = rng_below(g, 2) ? cm.kv_token * uniform(g, 1, 5) : 0;  // 0: 2 kv_token
    cm.ring_bw = uniform(g, 1e9, 1e11);
    cm.ring_lat = uniform(g, 0, 2e-5);
    cm.ring_bw_intra = cm.ring_bw * 4;
    cm.ring_lat_intra = cm.ring_lat / 2;
    cm.ranks_per_node = 1 + (int)rng_below(g, 8);
    cm.head_token = rng_below(g, 2) ? uniform(g, 0, 3) * cm.lin_token : 0;
    cm.head_const = rng_below(g, 2) ? uniform(g, 0, 1e-4) : 0;
    cm.attn_step = rng_below(g, 2) ? uniform(g, 0, 3e-4) : 0;
    cm.a2a_heads = heads[rng_below(g, 6)];
    cm.a2a_kv_heads = cm.a2a_heads ? 1 + (int)rng_below(g, (uint64_t)cm.a2a_heads) : 0;
    if (rng_below(g, 2)) {  // TP: the all-reduces of every layer and the head
        cm.tp = 2 + (int)rng_below(g, 7), cm.tp_head = (int)rng_below(g, 2);
        cm.tp_token = uniform(g, 1e3, 2e4), cm.tp_bw = uniform(g, 1e10, 1e12), cm.tp_lat = uniform(g, 0, 1e-5);
        cm.tp_hide_qkv = uniform(g, 0, 0.3), cm.tp_hide_mlp = uniform(g, 0, 0.3);
    }
    cm.act_token = 1, cm.capacity_bytes = 1;
    return cm;
}

// The two ends of a hybrid are the ring's and the group's own estimates, written apart in cost.c.
static void test_ends_are_ring_and_a2a(void **state) {
    (void)state;
    Rng g;
    rng_seed(&g, 30);
    for (int trial = 0; trial < 2000; trial++) {
        CostModel cm = random_model(&g);
        int64_t segs[6];
        int n = 1 + (int)rng_below(&g, 6);
        for (int i = 0; i < n; i++) segs[i] = 1 + (int64_t)rng_below(&g, 1 << (8 + rng_below(&g, 12)));
        int k = 2 + (int)rng_below(&g, 15);
        double ring = cost_item_time(&cm, segs, n, k, 0.0);
        double a2a = cost_a2a_item_time(&cm, segs, n, k, 0.0);
        assert_close(cost_hybrid_item_time(&cm, segs, n, 1, k, 0.0), ring, 1e-12, 0);
        assert_close(cost_hybrid_item_time(&cm, segs, n, k, 1, 0.0), a2a, 1e-12, 0);
        assert_close(cost_hybrid_item_time(&cm, segs, n, 1, 1, 0.0), cost_item_time(&cm, segs, n, 1, 0.0), 1e-12, 0);
        // a real hybrid is no cheaper than its linear work and its share of the attention pairs
        int u = 2 + (int)rng_below(&g, 4), r = 2 + (int)rng_below(&g, 4);
        double tokens = 0;
        for (int i = 0; i < n; i++) tokens += (double)segs[i];
        double floor = cm.n_layers * cm.lin_token * tokens / (u * r);
        assert_true(cost_hybrid_item_time(&cm, segs, n, u, r, 0.0) >= floor);
    }
}

// More groups on a faster link: with bandwidth free and no latency, splitting the heads over a group
// costs nothing, so a hybrid of u x r with even heads is the compute of a ring of r on 1/u of the
// heads and 1/(ur) of the tokens: compared against that sum written out.
static void test_free_links_give_pure_compute(void **state) {
    (void)state;
    Rng g;
    rng_seed(&g, 31);
    for (int trial = 0; trial < 500; trial++) {
        CostModel cm = random_model(&g);
        cm.ring_bw = cm.ring_bw_intra = 0, cm.ring_lat = cm.ring_lat_intra = 0;  // 0: not modelled, free
        cm.tp = 0, cm.tp_head = 0;
        cm.a2a_heads = 24, cm.a2a_kv_heads = 8;
        int u = trial % 2 ? 2 : 3, r = 2 + (int)rng_below(&g, 5);
        int64_t segs[] = {1 + (int64_t)rng_below(&g, 100000), 1 + (int64_t)rng_below(&g, 1000)};
        double tokens = (double)(segs[0] + segs[1]);
        double area = cost_causal_area(segs[0]) + cost_causal_area(segs[1]);
        double blk = cm.attn_pair * area / u / ((double)r * r) + cm.attn_step;
        double want = cm.n_layers * (cm.lin_token * tokens / (u * r) + cm.layer_const + r * blk) +
                      cm.head_token * tokens / (u * r) + cm.head_const;
        assert_close(cost_hybrid_item_time(&cm, segs, 2, u, r, 0.0), want, 1e-12, 0);
    }
}

// The group sizes cost_hybrid_next walks are exactly those of the definition, 2 <= u < D dividing D
// and the heads, in increasing order: checked against testing every u for every D and head count.
static void test_hybrid_sizes_match_every_u(void **state) {
    (void)state;
    for (int D = 1; D <= 300; D++) {
        for (int heads = 1; heads <= 160; heads++) {
            int g = cost_gcd(D, heads), u = cost_hybrid_next(1, g, D);
            assert_true(D % g == 0 && heads % g == 0);
            for (int want = 2; want < D && want <= heads; want++) {
                if (D % want != 0 || heads % want != 0) continue;
                assert_int_equal(u, want);
                u = cost_hybrid_next(u, g, D);
            }
            assert_int_equal(u, 0);
        }
    }
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_hybrid_sizes_match_every_u),
        cmocka_unit_test(test_hand_computation),
        cmocka_unit_test(test_hand_offload),
        cmocka_unit_test(test_ends_are_ring_and_a2a),
        cmocka_unit_test(test_free_links_give_pure_compute),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
