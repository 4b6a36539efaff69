// test_policy_blocks.c: the block-level peer (policy_blocks.c, plan_blocks.c; docs/peers.md "blocks").
//
// Worked example, traced by hand: 2 ranks, C = 16, context 32 (d_cp = 2, one group), lengths 24 and 8.
// 32 tokens = d C: one micro-batch. B = ceil(32 / (8 x 2)) = 2 (MagiAttention's default). Blocks in
// order (the packed stream cut every 2 tokens; 24 is even, so no block spans both sequences):
// sequence 0 at 0, 2, .., 22 (indices 0-11), sequence 1 at 0, 2, 4, 6 (12-15); the area of a
// block of 2 at `a` is 2a + 3: sequence 0 gives 3 7 11 .. 47, sequence 1 gives 3 7 11 15. Limit
// ceil(16 / 2) = 8 blocks per member. Heaviest first (equal: the later index first), each to the
// member with the least area (equal: member 0):
//   47->m0 (47)  43->m1 (43)  39->m1 (82)  35->m0 (82)  31->m0 (113, tie)  27->m1 (109)  23->m1 (132)
//   19->m0 (132)  15 [idx 15]->m0 (147, tie)  15 [idx 3]->m1 (147)  11 [14]->m0 (158)  11 [2]->m1 (158)
//   7 [13]->m0 (165)  7 [1]->m1 (165)  3 [12]->m0 (168)  3 [0]->m1 (168)
// Owners of sequence 0 by start: 0 2 4 6 -> m1, 8 -> m0, 10 12 -> m1, 14 16 -> m0, 18 20 -> m1,
// 22 -> m0; sequence 1: all m0. Each member owns 8 blocks = 16 tokens and 168 pairs.
// m0: local pairs 3 + 7 + 11 + 15 (its blocks of sequence 0 against its own earlier ones) + 36
// (sequence 1) = 72, remote 16 + 24 + 24 + 32 = 96; it sees all 24 tokens of sequence 0 and owns 8:
// receives 16. m1: local 136, remote 32; its last block is at 20, it sees 22 tokens and owns 16:
// receives 6. Backward, m1 receives the dK/dV of its 16 tokens from m0 (whose last block, 22, is
// after all of them) and m0 those of blocks 8, 14, 16 (6 tokens) from m1; nobody else needs 22.
#include "plan/plan_fixtures.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "bytescale/error.h"
#include "bytescale/policy.h"
#include "bytescale/rng.h"
#include "bytescale/sim.h"

static void plan_ok(Plan *p, const char *policy, const GlobalBatch *b, const PlanConfig *cfg, const CostModel *cm) {
    if (policy_plan(p, policy, b, cfg, cm) != 0)
        fail_msg("%s R %d, C %lld, B %lld: %s", policy, cfg->n_ranks, (long long)cfg->capacity,
                 (long long)cfg->block_size, bs_errmsg());
}

static int64_t pair_node(int32_t rank, const void *ctx) {
    (void)ctx;
    return rank / 2;  // two ranks per node
}

static void test_worked_example(void **state) {
    (void)state;
    int64_t lens[] = {24, 8};
    GlobalBatch b = make_batch(lens, 2);
    CostModel cm = hand_model();
    PlanConfig cfg = {.n_ranks = 2, .capacity = 16, .context = 32, .pp = 1};
    Plan p;
    plan_ok(&p, "blocks", &b, &cfg, &cm);
    assert_int_equal(p.n_items, 1);
    assert_int_equal(plan_item_kind(&p, 0), ITEM_BLOCKS);
    const int32_t owner0[12] = {1, 1, 1, 1, 0, 1, 1, 0, 0, 1, 1, 0};
    for (int32_t j = 0; j < p.items[0].n_segs; j++) {
        const Segment *s = &p.segs[j];
        assert_int_equal(s->len, 2);
        assert_int_equal(p.seg_owner[j], s->seq == 0 ? owner0[s->start / 2] : 0);
    }
    BlockLoad ld[2];
    assert_int_equal(plan_blocks_loads(&p, 0, NULL, NULL, ld), 0);
    assert_true(ld[0].tokens == 16 && ld[1].tokens == 16);
    assert_true(ld[0].local_pairs == 72 && ld[0].remote_pairs == 96);
    assert_true(ld[1].local_pairs == 136 && ld[1].remote_pairs == 32);
    assert_true(ld[0].kv_inter == 16 && ld[1].kv_inter == 6);
    assert_true(ld[0].dkv_inter == 6 && ld[1].dkv_inter == 16);
    plan_free(&p);
    batch_free(&b);
}

// The independent counter: token by token, O(tokens^2) per sequence. owner[t]: the member owning
// token t of the sequence. Adds to each member's pairs (local, remote), received K/V and dK/dV.
typedef struct {
    double local, remote, kv_intra, kv_inter, dkv_intra, dkv_inter, tokens;
} Count;

static void count_sequence(const int32_t *owner, int64_t len, const int32_t *ranks, int D, int nodes, Count *c) {
    for (int m = 0; m < D; m++) {
        for (int64_t k = 0; k < len; k++) {
            int need = 0;  // some query of m at or after key k
            for (int64_t q = k; q < len; q++) {
                if (owner[q] != m) continue;
                need = 1;
                if (owner[k] == m) c[m].local++;
                else c[m].remote++;
            }
            if (!need || owner[k] == m) continue;
            int same = nodes && pair_node(ranks[m], NULL) == pair_node(ranks[owner[k]], NULL);
            if (same) c[m].kv_intra++, c[owner[k]].dkv_intra++;
            else c[m].kv_inter++, c[owner[k]].dkv_inter++;
        }
    }
    for (int64_t t = 0; t < len; t++) c[owner[t]].tokens++;
}

// Recount every block item of p with the counter, against plan_blocks_loads, est_time and plan_stats.
static void recount(const Plan *p, const CostModel *cm, int nodes) {
    double total_bytes = 0;
    for (int32_t k = 0; k < p->n_items; k++) {
        const Item *it = &p->items[k];
        assert_int_equal(plan_item_kind(p, k), ITEM_BLOCKS);
        int D = it->n_ranks;
        Count *c = calloc((size_t)D, sizeof *c);
        BlockLoad *ld = calloc((size_t)D, sizeof *ld);
        for (int32_t s = 0; s < p->batch.n; s++) {
            int64_t len = p->batch.seqs[s].len, seen = 0;
            int32_t *owner = malloc((size_t)len * sizeof *owner);
            for (int64_t t = 0; t < len; t++) owner[t] = -1;
            for (int32_t j = 0; j < it->n_segs; j++) {
                const Segment *g = &p->segs[it->seg_begin + j];
                if (g->seq != s) continue;
                for (int64_t t = g->start; t < g->start + g->len; t++) owner[t] = p->seg_owner[it->seg_begin + j], seen++;
            }
            if (seen > 0) {
                assert_int_equal(seen, len);  // whole sequences
                count_sequence(owner, len, p->ranks + it->rank_begin, D, nodes, c);
            }
            free(owner);
        }
        assert_int_equal(plan_blocks_loads(p, k, nodes ? pair_node : NULL, NULL, ld), 0);
        double worst = 0;
        for (int m = 0; m < D; m++) {
            assert_true(c[m].tokens == ld[m].tokens && c[m].tokens <= p->capacity);
            assert_true(c[m].local == ld[m].local_pairs && c[m].remote == ld[m].remote_pairs);
            assert_true(c[m].kv_intra == ld[m].kv_intra && c[m].kv_inter == ld[m].kv_inter);
            assert_true(c[m].dkv_intra == ld[m].dkv_intra && c[m].dkv_inter == ld[m].dkv_inter);
            BlockLoad mine = {c[m].tokens, c[m].local, c[m].remote, c[m].kv_intra, c[m].kv_inter,
                              c[m].dkv_intra, c[m].dkv_inter, ld[m].src_intra, ld[m].src_inter};
            double t = cost_blocks_member_time(cm, &mine);
            if (t > worst) worst = t;
            total_bytes += 2 * (c[m].kv_intra + c[m].kv_inter) + c[m].dkv_intra + c[m].dkv_inter;
        }
        if (!nodes) assert_true(fabs(it->est_time - worst) <= 1e-9 * worst);
        free(c), free(ld);
    }
    PlanStats st;
    assert_int_equal(plan_stats(p, cm, &st), 0);
    double want = total_bytes * cm->kv_token * cm->n_layers * p->pp;
    assert_true(fabs(st.ring_bytes - want) <= 1e-9 * (want + 1));
}

// Every token owned exactly once, by hand (plan_validate checks it too).
static void owned_once(const Plan *p) {
    for (int32_t s = 0; s < p->batch.n; s++) {
        int64_t len = p->batch.seqs[s].len;
        int *n = calloc((size_t)len, sizeof *n);
        for (int32_t j = 0; j < p->n_segs; j++)
            if (p->segs[j].seq == s)
                for (int64_t t = p->segs[j].start; t < p->segs[j].start + p->segs[j].len; t++) n[t]++;
        for (int64_t t = 0; t < len; t++) assert_int_equal(n[t], 1);
        free(n);
    }
}

static void test_random_batches(void **state) {
    (void)state;
    Rng g;
    rng_seed(&g, 29);
    CostModel cm = hand_model();
    for (int trial = 0; trial < 200; trial++) {
        int32_t R = 1 + (int32_t)rng_below(&g, 6);
        int64_t C = 8 + (int64_t)rng_below(&g, 40);
        int n = 1 + (int)rng_below(&g, 8);
        int64_t lens[8], ctx = 1;
        for (int i = 0; i < n; i++) lens[i] = 1 + (int64_t)rng_below(&g, (uint64_t)(C * R < 120 ? C * R : 120));
        for (int i = 0; i < n; i++) ctx = lens[i] > ctx ? lens[i] : ctx;
        GlobalBatch b = make_batch(lens, n);
        PlanConfig cfg = {.n_ranks = R, .capacity = C, .context = ctx, .pp = 1 + (int)rng_below(&g, 2),
                          .block_size = (int64_t)rng_below(&g, 5)};
        const char *pol = trial % 2 ? "blocks" : "blocks-all";
        Plan p;
        plan_ok(&p, pol, &b, &cfg, &cm);
        owned_once(&p);
        recount(&p, &cm, trial % 4 < 2);
        plan_free(&p);
        batch_free(&b);
    }
}

static void same_blocks(const Plan *a, const Plan *b) {
    assert_int_equal(a->n_items, b->n_items);
    assert_int_equal(a->n_segs, b->n_segs);
    for (int32_t j = 0; j < a->n_segs; j++) {
        assert_int_equal(a->segs[j].start, b->segs[j].start);
        assert_int_equal(a->seg_owner[j], b->seg_owner[j]);
    }
    for (int32_t k = 0; k < a->n_items; k++) assert_int_equal(plan_item_kind(b, k), ITEM_BLOCKS);
}

static void test_round_trips(void **state) {
    (void)state;
    int64_t lens[] = {300, 40, 90, 7, 128};
    GlobalBatch b = make_batch(lens, 5);
    CostModel cm = hand_model();
    PlanConfig cfg = {.n_ranks = 8, .capacity = 64, .context = 300, .pp = 1};
    Plan p, q, w;
    plan_ok(&p, "blocks", &b, &cfg, &cm);
    char path[] = "/tmp/test_policy_blocks_XXXXXX";
    int fd = mkstemp(path);
    assert_true(fd >= 0);
    close(fd);
    assert_int_equal(plan_write_json(&p, path), 0);
    if (plan_read_json_cm(&q, path, &cm) != 0) fail_msg("%s", bs_errmsg());
    unlink(path);
    same_blocks(&p, &q);
    uint8_t *buf;
    size_t size;
    assert_int_equal(plan_pack(&p, &buf, &size), 0);
    if (plan_unpack(&w, buf, size) != 0) fail_msg("%s", bs_errmsg());
    same_blocks(&p, &w);
    // a damaged owner is refused with a reason
    buf[size - 4] = 99;
    Plan bad;
    assert_int_not_equal(plan_unpack(&bad, buf, size), 0);
    assert_non_null(strstr(bs_errmsg(), "owner"));
    free(buf);
    plan_free(&p), plan_free(&q), plan_free(&w);
    batch_free(&b);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_worked_example),
        cmocka_unit_test(test_random_batches),
        cmocka_unit_test(test_round_trips),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
