// test_member_layout.c: the rows the runtime gives each ring member (mb_member_rows, mb_layout) are
// the ones the planner counted: on static plans of many short sequences (the rings where the chunk
// layout's leftover tokens pile up on the low members) every member gets exactly the tokens of its
// chunks i and 2D-1-i, at most C of them (what the model's buffers are sized for), and the members
// together hold every token of every segment once.
#include "test_util.h"

#include "bytescale/error.h"
#include "bytescale/hw.h"
#include "bytescale/microbatch.h"
#include "bytescale/model.h"
#include "bytescale/policy.h"
#include "bytescale/rng.h"

static void test_static_rows_per_member(void **state) {
    (void)state;
    static const char *DISTS[] = {"uniform:1:100", "fixed:7", "github", "uniform:1:40"};
    Rng rng;
    rng_seed(&rng, 5);
    for (int trial = 0; trial < 40; trial++) {
        int64_t C = 64 + (int64_t)rng_below(&rng, 2000);
        int d_cp = 2 + (int)rng_below(&rng, 15);
        int32_t R = d_cp * (1 + (int32_t)rng_below(&rng, 3));
        GlobalBatch b;
        if (batch_generate(&b, DISTS[trial % 4], (uint64_t)trial, 4 * R * C, d_cp * C) != 0) fail_msg("%s", bs_errmsg());
        CostModel cm;
        if (cost_derive(&cm, model_find("tiny"), hw_find("cpu"), 1, 1, R, C) != 0) fail_msg("%s", bs_errmsg());
        PlanConfig cfg = {.n_ranks = R, .capacity = C, .context = d_cp * C, .pp = 1};
        Plan p;
        if (policy_plan(&p, "static", &b, &cfg, &cm) != 0) fail_msg("%s", bs_errmsg());
        assert_true(mb_plan_max_rows(&p) <= C);
        for (int32_t k = 0; k < p.n_items; k++) {
            const Item *it = &p.items[k];
            int D = it->n_ranks;
            // seen[j][t]: how many members hold token t of segment j
            int64_t *first = malloc(((size_t)it->n_segs + 1) * sizeof *first);
            first[0] = 0;
            for (int32_t j = 0; j < it->n_segs; j++) first[j + 1] = first[j] + p.segs[it->seg_begin + j].len;
            int *seen = calloc((size_t)first[it->n_segs], sizeof *seen);
            for (int m = 0; m < D; m++) {
                // independently: chunk c of a segment of len tokens has len / 2D tokens, one more
                // for the first len mod 2D chunks; member m holds chunks m and 2D-1-m
                int64_t want = 0;
                for (int32_t j = 0; j < it->n_segs; j++) {
                    int64_t len = p.segs[it->seg_begin + j].len, parts = 2 * (int64_t)D;
                    want += 2 * (len / parts) + (m < len % parts) + (parts - 1 - m < len % parts);
                }
                int64_t rows = mb_member_rows(&p, k, m);
                assert_int_equal(rows, want);
                assert_true(rows <= C);
                int32_t *pos = malloc((size_t)(rows > 0 ? rows : 1) * sizeof *pos);
                int32_t *seg = malloc((size_t)(rows > 0 ? rows : 1) * sizeof *seg);
                mb_layout(&p, k, m, pos, seg);
                for (int64_t r = 0; r < rows; r++) {
                    const Segment *sg = &p.segs[it->seg_begin + seg[r]];
                    assert_true(pos[r] >= sg->start && pos[r] < sg->start + sg->len);
                    seen[first[seg[r]] + pos[r] - sg->start]++;
                }
                free(pos);
                free(seg);
            }
            for (int64_t t = 0; t < first[it->n_segs]; t++) assert_int_equal(seen[t], 1);
            free(seen);
            free(first);
        }
        plan_free(&p);
        batch_free(&b);
    }
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_static_rows_per_member),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
