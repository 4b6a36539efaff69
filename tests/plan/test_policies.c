// test_policies.c: the policies static / naive / balance.
//   - helpers against brute force: best-fit packing, the rank heap, the radix order by time;
//   - property tests over random batches x policies x rank counts (1 .. 16,384) x offload x pp: every
//     plan validates, makespan >= lower bound, and each policy's own structure (static's mesh,
//     naive's and balance's sharding, naive's token-balanced assignment replayed by brute force);
//   - balance beats naive over many seeds on paper-like settings; balance within 5% of the bound at
//     the paper's settings (512 ranks, 32M tokens, C = 8K);
//   - errors: a sequence that fits nowhere, unknown policies, bad configurations.
#include "test_util.h"

#include <math.h>

#include "bytescale/error.h"
#include "bytescale/hw.h"
#include "bytescale/model.h"
#include "bytescale/policy.h"
#include "bytescale/rng.h"
#include "plan/policy_util.h"

static const char *POLICIES[] = {"static", "naive", "naive-eq3min", "balance"};
enum { N_POLICIES = sizeof POLICIES / sizeof POLICIES[0] };

static void derive(CostModel *cm, const char *model, int tp, int pp, int ranks, int64_t C) {
    if (cost_derive(cm, model_find(model), hw_find("h800-sxm"), tp, pp, ranks, C) != 0) fail_msg("%s", bs_errmsg());
}

// ---- helpers against brute force -------------------------------------------------------------------

static void test_bestfit_matches_brute_force(void **state) {
    (void)state;
    Rng rng;
    rng_seed(&rng, 11);
    for (int trial = 0; trial < test_trials(200); trial++) {
        int64_t C = 1 + (int64_t)rng_below(&rng, trial % 2 ? 5000 : 100);
        int n = 1 + (int)rng_below(&rng, 400);
        BestFit bf;
        assert_int_equal(bestfit_init(&bf, C), 0);
        int64_t room[400];  // brute force: scan every bin for the least room that fits
        int n_bins = 0;
        for (int i = 0; i < n; i++) {
            int64_t len = 1 + (int64_t)rng_below(&rng, (uint64_t)C);
            int best = -1;
            for (int k = 0; k < n_bins; k++)
                if (room[k] >= len && (best < 0 || room[k] < room[best])) best = k;
            if (best < 0) room[best = n_bins++] = C;
            room[best] -= len;
            int32_t got = bestfit_add(&bf, len);
            assert_true(got >= 0);
            // bins of equal room are interchangeable, so the chosen bin must have had the same room
            assert_int_equal(bf.room[got], room[best]);
            assert_int_equal(bf.n_bins, n_bins);
        }
        bestfit_free(&bf);
    }
}

static void test_rankheap_matches_brute_force(void **state) {
    (void)state;
    Rng rng;
    rng_seed(&rng, 12);
    for (int trial = 0; trial < 50; trial++) {
        int32_t n = 1 + (int32_t)rng_below(&rng, 70);
        RankHeap h;
        assert_int_equal(rankheap_init(&h, n), 0);
        double key[70] = {0};
        for (int step = 0; step < 500; step++) {
            int d = 1 + (int)rng_below(&rng, (uint64_t)n);
            int32_t got[70];
            for (int j = 0; j < d; j++) {
                got[j] = rankheap_pop(&h);
                int32_t want = -1;  // brute force: least key among those not yet popped, ties lowest rank
                for (int32_t r = 0; r < n; r++) {
                    int taken = 0;
                    for (int i = 0; i < j; i++) taken |= got[i] == r;
                    if (!taken && (want < 0 || key[r] < key[want])) want = r;
                }
                assert_int_equal(got[j], want);
            }
            for (int j = 0; j < d; j++) {
                key[got[j]] += (double)rng_below(&rng, 4);  // small integers: many ties
                rankheap_push(&h, got[j], key[got[j]]);
            }
        }
        rankheap_free(&h);
    }
}

// The rank tree (balance's scheduler) against the brute force, as the heap above, with replace_top
// (the list scheduler's step) and keys with many ties, zeros and a negative zero (equal to zero).
static void test_ranktree_matches_brute_force(void **state) {
    (void)state;
    Rng rng;
    rng_seed(&rng, 14);
    for (int trial = 0; trial < 60; trial++) {
        int32_t n = 1 + (int32_t)rng_below(&rng, 70);
        RankTree t;
        assert_int_equal(ranktree_init(&t, n), 0);
        double key[70] = {0};
        for (int step = 0; step < 400; step++) {
            int32_t want = -1;  // brute force: least key, ties lowest rank
            for (int32_t r = 0; r < n; r++)
                if (want < 0 || key[r] < key[want]) want = r;
            if (step % 3 == 0) {  // replace the top's key
                assert_int_equal(ranktree_top(&t), want);
                key[want] += rng_below(&rng, 9) == 0 ? -0.0 : (double)rng_below(&rng, 4) * 0.5;
                ranktree_replace_top(&t, key[want]);
                continue;
            }
            int d = 1 + (int)rng_below(&rng, (uint64_t)n);
            int32_t got[70];
            for (int j = 0; j < d; j++) {
                got[j] = ranktree_pop(&t);
                want = -1;
                for (int32_t r = 0; r < n; r++) {
                    int taken = 0;
                    for (int i = 0; i < j; i++) taken |= got[i] == r;
                    if (!taken && (want < 0 || key[r] < key[want])) want = r;
                }
                assert_int_equal(got[j], want);
                assert_true(t.key[got[j]] == key[got[j]]);  // the key it was popped with
            }
            for (int j = 0; j < d; j++) {
                key[got[j]] = rng_below(&rng, 7) == 0 ? -0.0 : key[got[j]] + (double)rng_below(&rng, 4);
                ranktree_push(&t, got[j], key[got[j]]);
            }
            assert_int_equal(t.n, n);
        }
        ranktree_free(&t);
    }
}

// The same on trees of up to 20,000 ranks (13 to 15 levels, leaves past n_ranks padding, as at the
// planning table's 16,384): mostly replace_top as phase 3 does, with runs of pops and pushes as rings
// take their members, keys of a few values (ties far apart in the tree) against a brute-force scan.
static void test_ranktree_many_ranks(void **state) {
    (void)state;
    Rng rng;
    rng_seed(&rng, 15);
    enum { N_MAX = 20000 };
    double *key = calloc(N_MAX, sizeof(double));
    char *out = calloc(N_MAX, 1);
    int32_t got[16];
    assert_non_null(key);
    assert_non_null(out);
    for (int trial = 0; trial < 6; trial++) {
        int32_t n = trial < 3 ? 4096 + (int32_t)rng_below(&rng, 16000) : 1 + (int32_t)rng_below(&rng, 600);
        RankTree t;
        assert_int_equal(ranktree_init(&t, n), 0);
        memset(key, 0, sizeof(double) * N_MAX);
        memset(out, 0, N_MAX);
        for (int step = 0; step < 3000; step++) {
            int d = rng_below(&rng, 4) == 0 ? 1 + (int)rng_below(&rng, 16) : 0;  // else replace the top
            if (d > n) d = n;
            for (int j = 0; j < (d ? d : 1); j++) {
                int32_t want = 0;  // brute force: the least key not popped, ties lowest rank
                while (out[want]) want++;
                for (int32_t r = want + 1; r < n; r++)
                    if (!out[r] && key[r] < key[want]) want = r;
                if (d == 0) {
                    assert_int_equal(ranktree_top(&t), want);
                    key[want] += (double)rng_below(&rng, 3);
                    ranktree_replace_top(&t, key[want]);
                    break;
                }
                got[j] = ranktree_pop(&t);
                assert_int_equal(got[j], want);
                out[want] = 1;
            }
            for (int j = 0; j < d; j++) {
                key[got[j]] += (double)rng_below(&rng, 3);
                out[got[j]] = 0;
                ranktree_push(&t, got[j], key[got[j]]);
            }
            assert_int_equal(t.n, n);
        }
        ranktree_free(&t);
    }
    free(key);
    free(out);
}

// The radix order of planned starts (balance's global order) against a comparison sort by (time, index).
static const double *order_keys;
static int by_key_then_index(const void *a, const void *b) {
    int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    if (order_keys[x] != order_keys[y]) return order_keys[x] < order_keys[y] ? -1 : 1;
    return (x > y) - (x < y);
}

static void test_order_by_time_matches_sort(void **state) {
    (void)state;
    Rng rng;
    rng_seed(&rng, 13);
    for (int trial = 0; trial < test_trials(200); trial++) {
        int32_t n = (int32_t)rng_below(&rng, 3000);
        double *key = malloc((size_t)(n + 1) * sizeof(double));
        int32_t *got = malloc((size_t)(n + 1) * sizeof(int32_t)), *want = malloc((size_t)(n + 1) * sizeof(int32_t));
        for (int32_t i = 0; i < n; i++) {  // many ties, zeros (and a negative zero), wide magnitudes
            double k = trial % 3 == 0 ? (double)rng_below(&rng, 8) : rng_uniform(&rng) * pow(10, (double)rng_below(&rng, 12) - 6);
            key[i] = rng_below(&rng, 50) == 0 ? -0.0 : k;
            want[i] = i;
        }
        order_keys = key;
        qsort(want, (size_t)n, sizeof(int32_t), by_key_then_index);
        assert_int_equal(policy_order_by_time(key, n, got), 0);
        for (int32_t i = 0; i < n; i++)
            if (got[i] != want[i])
                fail_msg("trial %d, position %d: %d (key %g), expected %d (key %g)", trial, i, got[i], key[got[i]],
                         want[i], key[want[i]]);
        free(key);
        free(got);
        free(want);
    }
}

// The descending order with ties by a second key (the rings' and elastic's long sequences: time
// slowest first, then sequence index) against a comparison sort on (time desc, tie asc). The ties are
// a random permutation, so index order alone would not give them, and in every other trial scaled
// past 2^24, so that every byte of the second key moves.
static const int32_t *order_ties;
static int by_key_desc_then_tie(const void *a, const void *b) {
    int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    if (order_keys[x] != order_keys[y]) return order_keys[x] > order_keys[y] ? -1 : 1;
    return (order_ties[x] > order_ties[y]) - (order_ties[x] < order_ties[y]);
}

static void test_order_by_time_desc_matches_sort(void **state) {
    (void)state;
    Rng rng;
    rng_seed(&rng, 17);
    for (int trial = 0; trial < test_trials(200); trial++) {
        int32_t n = (int32_t)rng_below(&rng, 3000);
        double *key = malloc((size_t)(n + 1) * sizeof(double));
        int32_t *tie = malloc((size_t)(n + 1) * sizeof(int32_t));
        int32_t *got = malloc((size_t)(n + 1) * sizeof(int32_t)), *want = malloc((size_t)(n + 1) * sizeof(int32_t));
        for (int32_t i = 0; i < n; i++) {
            double k = trial % 3 == 0 ? (double)rng_below(&rng, 8) : rng_uniform(&rng) * pow(10, (double)rng_below(&rng, 12) - 6);
            key[i] = rng_below(&rng, 50) == 0 ? -0.0 : k;
            tie[i] = i;
            want[i] = i;
        }
        for (int32_t i = n - 1; i > 0; i--) {  // shuffle the ties (Fisher-Yates)
            int32_t j = (int32_t)rng_below(&rng, (uint64_t)i + 1), t = tie[i];
            tie[i] = tie[j];
            tie[j] = t;
        }
        for (int32_t i = 0; i < n && trial % 2; i++) tie[i] *= 700001;  // still distinct, up to 2.1e9
        order_keys = key;
        order_ties = tie;
        qsort(want, (size_t)n, sizeof(int32_t), by_key_desc_then_tie);
        assert_int_equal(policy_order_by_time_desc(key, tie, n, got), 0);
        for (int32_t i = 0; i < n; i++)
            if (got[i] != want[i])
                fail_msg("trial %d, position %d: %d (key %g, tie %d), expected %d (key %g, tie %d)", trial, i, got[i],
                         key[got[i]], tie[got[i]], want[i], key[want[i]], tie[want[i]]);
        free(key);
        free(tie);
        free(got);
        free(want);
    }
}

// ---- per-policy structure ------------------------------------------------------------------------------

// Which item holds each sequence (every sequence sits whole in one item under these policies).
static int32_t *item_of_seq(const Plan *p) {
    int32_t *of = malloc((size_t)(p->batch.n > 0 ? p->batch.n : 1) * sizeof(int32_t));
    for (int64_t i = 0; i < p->batch.n; i++) of[i] = -1;
    for (int32_t k = 0; k < p->n_items; k++)
        for (int32_t j = 0; j < p->items[k].n_segs; j++) {
            const Segment *s = &p->segs[p->items[k].seg_begin + j];
            assert_int_equal(s->start, 0);
            assert_int_equal(s->len, p->batch.seqs[s->seq].len);
            assert_int_equal(of[s->seq], -1);
            of[s->seq] = k;
        }
    return of;
}

// The most tokens a member of item it holds under the 2D-chunk layout, with one more sequence of len
// tokens in it (0: none): walk plan_chunk for every member (member m holds chunks m and 2D-1-m).
static int64_t fullest_member_with(const Plan *p, const Item *it, int64_t len) {
    int D = it->n_ranks;
    int64_t most = 0;
    for (int m = 0; m < D; m++) {
        int64_t held = 0, start, n;
        for (int32_t j = 0; j <= it->n_segs; j++) {
            int64_t l = j < it->n_segs ? p->segs[it->seg_begin + j].len : len;
            plan_chunk(l, D, m, &start, &n);
            held += n;
            plan_chunk(l, D, 2 * D - 1 - m, &start, &n);
            held += n;
        }
        if (held > most) most = held;
    }
    return most;
}

static void check_static(const Plan *p, const PlanConfig *cfg) {
    int64_t C = cfg->capacity, longest = 0;
    for (int64_t i = 0; i < p->batch.n; i++) longest = p->batch.seqs[i].len > longest ? p->batch.seqs[i].len : longest;
    int64_t ctx = cfg->context > 0 ? cfg->context : longest;
    int32_t d_cp = (int32_t)((ctx + C - 1) / C), d_dp = cfg->n_ranks / d_cp;
    int32_t *count = calloc((size_t)d_dp, sizeof(int32_t));
    int32_t *last_item = malloc((size_t)d_dp * sizeof(int32_t));
    int32_t prev_round = 0, prev_group = -1;
    for (int32_t k = 0; k < p->n_items; k++) {
        const Item *it = &p->items[k];
        assert_int_equal(it->n_ranks, d_cp);  // every ring is a whole CP group
        assert_true(it->offload == 0);
        int32_t g = p->ranks[it->rank_begin] / d_cp;
        assert_true(g < d_dp);
        for (int32_t j = 0; j < d_cp; j++) assert_int_equal(p->ranks[it->rank_begin + j], g * d_cp + j);
        assert_true(it->tokens <= C * d_cp);
        // global order: round k of every group (groups increasing), then round k+1
        int32_t round = count[g]++;
        assert_true(round > prev_round || (round == prev_round && g > prev_group));
        prev_round = round, prev_group = g;
    }
    // contiguous blocks of equal count, the first groups taking the remainder
    for (int32_t g = 1; g < d_dp; g++) assert_true(count[g] <= count[g - 1] && count[g - 1] - count[g] <= 1);
    // group 0's micro-batches, then group 1's, ... are the sequences in arrival order, next-fit
    int32_t *begin = calloc((size_t)d_dp + 1, sizeof(int32_t)), *by_group = malloc((size_t)(p->n_items + 1) * 4);
    for (int32_t g = 0; g < d_dp; g++) begin[g + 1] = begin[g] + count[g];
    memcpy(last_item, begin, (size_t)d_dp * sizeof(int32_t));
    for (int32_t k = 0; k < p->n_items; k++) by_group[last_item[p->ranks[p->items[k].rank_begin] / d_cp]++] = k;
    int64_t next_seq = 0;
    const Item *prev = NULL;
    for (int32_t i = 0; i < p->n_items; i++) {
        const Item *it = &p->items[by_group[i]];
        const Segment *s0 = &p->segs[it->seg_begin];
        assert_true(fullest_member_with(p, it, 0) <= C);  // every member within C (the chunk layout)
        if (prev) assert_true(fullest_member_with(p, prev, s0->len) > C);  // did not fit the last one
        for (int32_t j = 0; j < it->n_segs; j++) assert_int_equal(s0[j].seq, next_seq++);
        prev = it;
    }
    free(begin);
    free(by_group);
    assert_int_equal(next_seq, p->batch.n);
    free(count);
    free(last_item);
}

// naive, naive-eq3min and balance: s <= C in a pack; s > C alone in a ring whose size Eq. 3 decides.
static void check_sharding(const Plan *p, const PlanConfig *cfg, const CostModel *cm, int exact_min) {
    int32_t *of = item_of_seq(p);
    int64_t C = cfg->capacity;
    for (int64_t i = 0; i < p->batch.n; i++) {
        const Item *it = &p->items[of[i]];
        int64_t s = p->batch.seqs[i].len;
        if (s <= C) {
            assert_int_equal(it->n_ranks, 1);
            assert_true(it->offload == 0);
            continue;
        }
        assert_int_equal(it->n_segs, 1);
        double r;
        int d_min = cost_min_ranks(cm, s, C, cfg->offload, cfg->n_ranks, &r);
        assert_true(d_min >= 1);
        int64_t plain = (s + C - 1) / C;
        if (exact_min) {  // naive-eq3min: exactly Eq. 3's fewest ranks and its ratio
            assert_int_equal(it->n_ranks, d_min);
            assert_true(it->offload == (float)policy_offload_ratio(r));
        } else {  // naive, balance: between Eq. 3's fewest and ceil(s / C); no offloading at ceil(s / C)
            assert_true(it->n_ranks >= d_min && it->n_ranks <= plain);
            if (it->n_ranks == plain || !cfg->offload) assert_true(it->offload == 0);
        }
        if (!cfg->offload) assert_int_equal(it->n_ranks, plain);
    }
    free(of);
}

// naive's assignment replayed by brute force: items in arrival order of their first sequence, each
// to the D ranks with the fewest tokens so far (ties: lowest rank). For naive (not eq3min) the
// ring's D is replayed too: of every D from Eq. 3's fewest to ceil(s / C) (at most the ranks), the
// one whose ring on the D fewest-token ranks finishes earliest, counting from when the last of
// them is free (ties: fewer ranks); ranks are free when their last item's estimate ends.
static void check_naive_assignment(const Plan *p, const CostModel *cm, int offload, int eq3min) {
    int32_t R = p->n_ranks;
    double *tokens = calloc((size_t)R, sizeof(double)), *busy = calloc((size_t)R, sizeof(double));
    int32_t *order = malloc((size_t)R * sizeof(int32_t));
    char *chosen = calloc((size_t)R, 1);
    int32_t prev_first = -1;
    for (int32_t k = 0; k < p->n_items; k++) {
        const Item *it = &p->items[k];
        int32_t first = p->segs[it->seg_begin].seq;
        assert_true(first > prev_first);
        prev_first = first;
        memset(chosen, 0, (size_t)R);
        for (int32_t j = 0; j < R; j++) {  // ranks by tokens, fewest first (ties: lowest rank)
            int32_t want = -1;
            for (int32_t r = 0; r < R; r++)
                if (!chosen[r] && (want < 0 || tokens[r] < tokens[want])) want = r;
            chosen[want] = 1;
            order[j] = want;
        }
        memset(chosen, 0, (size_t)R);
        for (int32_t j = 0; j < it->n_ranks; j++) chosen[order[j]] = 1;
        for (int32_t j = 0; j < it->n_ranks; j++) assert_true(chosen[p->ranks[it->rank_begin + j]]);
        int64_t s = it->tokens, C = p->capacity;
        if (!eq3min && s > C) {
            double r0;
            int d_min = cost_min_ranks(cm, s, C, offload, R, &r0);
            int64_t plain = (s + C - 1) / C;
            int d_hi = plain < R ? (int)plain : R;
            double best = INFINITY, free_at = 0;
            int best_d = -1;
            for (int d = 1; d <= d_hi; d++) {
                free_at = fmax(free_at, busy[order[d - 1]]);
                double rd;
                if (d < d_min || !cost_offload_ratio(cm, s, C, d, &rd)) continue;
                double end = free_at + cost_item_time(cm, &s, 1, d, policy_offload_ratio(rd));
                if (end < best) best = end, best_d = d;
            }
            assert_int_equal(it->n_ranks, best_d);
        }
        double start = 0;
        for (int32_t j = 0; j < it->n_ranks; j++) start = fmax(start, busy[p->ranks[it->rank_begin + j]]);
        for (int32_t j = 0; j < it->n_ranks; j++) {
            tokens[p->ranks[it->rank_begin + j]] += (double)it->tokens / it->n_ranks;
            busy[p->ranks[it->rank_begin + j]] = start + it->est_time;
        }
    }
    free(tokens);
    free(busy);
    free(order);
    free(chosen);
}

// naive's packs: best fit in arrival order, replayed by brute force: the same multiset of pack sizes.
static int cmp_i64(const void *a, const void *b) {
    int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return (x > y) - (x < y);
}
static void check_naive_packs(const Plan *p) {
    int64_t C = p->capacity, n = p->batch.n;
    int64_t *room = malloc((size_t)(n > 0 ? n : 1) * sizeof(int64_t)), *got = malloc((size_t)(n > 0 ? n : 1) * 8);
    int n_bins = 0, n_got = 0;
    for (int64_t i = 0; i < n; i++) {
        int64_t len = p->batch.seqs[i].len;
        if (len > C) continue;
        int best = -1;
        for (int k = 0; k < n_bins; k++)
            if (room[k] >= len && (best < 0 || room[k] < room[best])) best = k;
        if (best < 0) room[best = n_bins++] = C;
        room[best] -= len;
    }
    for (int32_t k = 0; k < p->n_items; k++)
        if (p->items[k].n_ranks == 1 && p->items[k].offload == 0 && p->batch.seqs[p->segs[p->items[k].seg_begin].seq].len <= C)
            got[n_got++] = p->items[k].tokens;
    assert_int_equal(n_got, n_bins);
    for (int k = 0; k < n_bins; k++) room[k] = C - room[k];
    qsort(room, (size_t)n_bins, 8, cmp_i64);
    qsort(got, (size_t)n_got, 8, cmp_i64);
    for (int k = 0; k < n_bins; k++) assert_int_equal(got[k], room[k]);
    free(room);
    free(got);
}

// lower_bound bounds plans of packs and rings; balance may choose all-to-all groups and hybrids
// (docs/planner.md, "The bounds"), and then its plan follows HDP's rule, which hdp_bound bounds.
static void check_common(const Plan *p, const CostModel *cm) {
    if (plan_validate(p, cm) != 0) fail_msg("%s: %s", p->policy, bs_errmsg());
    int groups = 0;
    for (int32_t k = 0; k < p->n_items; k++) groups += p->items[k].a2a || p->items[k].ulysses;
    double bound = groups ? p->hdp_bound : p->lower_bound;
    if (!(p->makespan >= bound * (1 - 1e-9)))
        fail_msg("%s: makespan %.9g below the bound %.9g (%d all-to-all or hybrid items)", p->policy, p->makespan,
                 bound, groups);
    for (int32_t r = 0; r < p->n_ranks; r++) assert_true(p->makespan >= p->rank_busy[r] * (1 - 1e-12));
}

// ---- the vocabulary of policy lists ----------------------------------------------------------------------

// policy_expand over a list: its names joined by "," ("" on an error, whose message must hold `want`).
static const char *expand(const char *list, const char *want) {
    static char buf[512];
    const char *names[16];
    int n = -1;
    buf[0] = '\0';
    if (policy_expand(list, names, 16, &n) != 0) {
        if (!want || !strstr(bs_errmsg(), want)) fail_msg("'%s': \"%s\" does not say \"%s\"", list, bs_errmsg(), want);
        return buf;
    }
    for (int i = 0; i < n; i++) snprintf(buf + strlen(buf), sizeof buf - strlen(buf), "%s%s", i ? "," : "", names[i]);
    return buf;
}

static void test_policy_vocabulary(void **state) {
    (void)state;
    char own[256], peers[256], all[256], trains[256];
    policy_names(own, sizeof own, POLICY_OWN);
    policy_names(peers, sizeof peers, POLICY_PEERS);
    policy_names(all, sizeof all, POLICY_ALL);
    policy_names(trains, sizeof trains, POLICY_TRAINS);
    assert_string_equal(own, "static, naive, naive-eq3min, balance, elastic");
    assert_string_equal(peers, "megatron-hcp, wlb, flexsp, blocks, blocks-all");
    assert_string_equal(trains, "static, naive, naive-eq3min, balance, elastic, megatron-hcp, flexsp");
    // every policy is in exactly one of own and peers, and all is both, in the table's order
    int n_own = 0, n_peers = 0;
    for (int i = 0; i < policy_count(); i++) policy_at(i)->peer ? n_peers++ : n_own++;
    assert_int_equal(n_own + n_peers, policy_count());
    char joined[512];
    snprintf(joined, sizeof joined, "%s, %s", own, peers);
    assert_string_equal(all, joined);
    // lists: names and words mix, each policy once, in the order first named
    assert_string_equal(expand("balance", NULL), "balance");
    assert_string_equal(expand("elastic,balance,elastic", NULL), "elastic,balance");
    assert_string_equal(expand("own", NULL), "static,naive,naive-eq3min,balance,elastic");
    assert_string_equal(expand("flexsp,own", NULL), "flexsp,static,naive,naive-eq3min,balance,elastic");
    assert_string_equal(expand("all,megatron-hcp", NULL),
                        "static,naive,naive-eq3min,balance,elastic,megatron-hcp,wlb,flexsp,blocks,blocks-all");
    assert_string_equal(expand("peers,balance", NULL), "megatron-hcp,wlb,flexsp,blocks,blocks-all,balance");
    // unknown words are named with the known ones; an empty list is refused
    expand("balance,fancy", "unknown policy 'fancy' in 'balance,fancy' (policies: static,");
    expand("balance,fancy", "; or own, peers, all)");
    expand(",", "no policy in ','");
}

// ---- property test -----------------------------------------------------------------------------------------

static void test_random_batches_all_policies(void **state) {
    (void)state;
    static const int32_t RANKS[] = {1, 2, 3, 7, 13, 64, 100, 509, 1024, 4099, 16384};
    static const char *DISTS[] = {"uniform:1:3000", "lognormal:6:1.5", "github", "byted", "fixed:700", "uniform:1:40"};
    enum { N_RANKS = sizeof RANKS / sizeof RANKS[0], N_DISTS = sizeof DISTS / sizeof DISTS[0] };
    Rng rng;
    rng_seed(&rng, 2025);
    int plans = 0, with_rings = 0, with_offload = 0;
    const int trials = test_trials(1200);
    for (int trial = 0; trial < trials; trial++) {
        int32_t R = RANKS[trial % N_RANKS];
        int64_t C = (int64_t)exp(log(32) + rng_uniform(&rng) * (log(8192) - log(32)));  // log-uniform 32 .. 8K
        int pp = rng_below(&rng, 2) ? 4 : 1;
        int offload = (int)rng_below(&rng, 2);
        const char *model = pp == 4 || rng_below(&rng, 2) ? "llama-7b" : "tiny";
        int tp = !strcmp(model, "tiny") ? 1 : (int)(1u << rng_below(&rng, 4));  // 1, 2, 4, 8
        // a small budget keeps large rank counts fast; the context keeps every sequence on <= R ranks
        int64_t per_rank = 1 + (int64_t)(rng_uniform(&rng) * 2.0 * (double)C);
        int64_t budget = R * per_rank < 300000 ? R * per_rank : 300000;
        int64_t max_ctx = C * (R < 64 ? R : 64);
        int64_t ctx = 1 + (int64_t)rng_below(&rng, (uint64_t)max_ctx);
        const char *dist = DISTS[rng_below(&rng, N_DISTS)];
        GlobalBatch b;
        if (batch_generate(&b, dist, (uint64_t)trial, budget, ctx) != 0) fail_msg("%s", bs_errmsg());
        CostModel cm;
        derive(&cm, model, tp, pp, R, C);
        // static takes the context half the time, the batch's longest sequence otherwise
        PlanConfig cfg = {.n_ranks = R, .capacity = C, .context = rng_below(&rng, 2) ? ctx : 0, .pp = pp,
                          .offload = offload};
        for (int k = 0; k < N_POLICIES; k++) {
            Plan p;
            if (policy_plan(&p, POLICIES[k], &b, &cfg, &cm) != 0)
                fail_msg("trial %d %s R=%d C=%lld %s ctx=%lld pp=%d offload=%d: %s", trial, POLICIES[k], R,
                         (long long)C, dist, (long long)ctx, pp, offload, bs_errmsg());
            check_common(&p, &cm);
            if (k == 0) check_static(&p, &cfg);
            if (k > 0) check_sharding(&p, &cfg, &cm, k == 2);
            if ((k == 1 || k == 2) && R <= 128) check_naive_assignment(&p, &cm, offload, k == 2);
            if ((k == 1 || k == 2) && b.n <= 2000) check_naive_packs(&p);
            for (int32_t i = 0; i < p.n_items; i++) {
                with_rings += p.items[i].n_ranks > 1;
                with_offload += p.items[i].offload > 0;
            }
            plans++;
            plan_free(&p);
        }
        batch_free(&b);
    }
    // the random settings did exercise rings and offloading
    assert_int_equal(plans, trials * N_POLICIES);
    assert_true(with_rings > trials * 5 / 6);
    assert_true(with_offload > trials / 12);
}

// ---- balance against naive, and against the bound ----------------------------------------------------------

// Paper-like per-rank load (32M tokens over 512 ranks = 64K tokens per rank, C = 8K) at 64 ranks:
// over many seeds balance's makespan is at most naive's in nearly every case and well below it on
// average (both with and without offloading).
static void test_balance_beats_naive(void **state) {
    (void)state;
    static const char *DISTS[] = {"github", "byted"};
    static const int64_t CTX[] = {128 << 10, 256 << 10, 512 << 10};  // at most 64 ranks x 8K
    int wins = 0, cases = 0;
    double log_ratio = 0;
    CostModel cm;
    derive(&cm, "llama-7b", 2, 1, 64, 8192);
    for (int seed = 0; seed < 8; seed++)
        for (int d = 0; d < 2; d++)
            for (int c = 0; c < 3; c++)
                for (int off = 0; off < 2; off++) {
                    GlobalBatch b;
                    assert_int_equal(batch_generate(&b, DISTS[d], 100 + seed, 64 * 65536, CTX[c]), 0);
                    PlanConfig cfg = {.n_ranks = 64, .capacity = 8192, .pp = 1, .offload = off};
                    Plan pn, pb;
                    if (policy_plan(&pn, "naive", &b, &cfg, &cm) != 0 || policy_plan(&pb, "balance", &b, &cfg, &cm) != 0)
                        fail_msg("%s seed %d ctx %lld offload %d: %s", DISTS[d], seed, (long long)CTX[c], off, bs_errmsg());
                    wins += pb.makespan <= pn.makespan;
                    log_ratio += log(pb.makespan / pn.makespan);
                    cases++;
                    plan_free(&pn);
                    plan_free(&pb);
                    batch_free(&b);
                }
    double geo = exp(log_ratio / cases);
    print_message("balance <= naive in %d of %d cases; geometric mean of balance / naive %.3f\n", wins, cases, geo);
    if (wins < cases * 95 / 100 || geo > 0.9) fail_msg("balance <= naive in %d of %d cases; geometric mean ratio %.3f", wins, cases, geo);
}

// The target: at the paper's settings (512 ranks, 32M tokens, C = 8K, LLaMA-7B) balance's
// estimated makespan is within 5% of the lower bound, for both datasets and every context length.
static void test_balance_near_bound_at_paper_settings(void **state) {
    (void)state;
    static const char *DISTS[] = {"github", "byted"};
    static const int64_t CTX[] = {256 << 10, 512 << 10, 1 << 20, 2 << 20};
    CostModel cm;
    derive(&cm, "llama-7b", 2, 1, 512, 8192);
    for (int d = 0; d < 2; d++)
        for (int c = 0; c < 4; c++)
            for (int off = 0; off < 2; off++) {
                GlobalBatch b;
                assert_int_equal(batch_generate(&b, DISTS[d], 1, 32 << 20, CTX[c]), 0);
                PlanConfig cfg = {.n_ranks = 512, .capacity = 8192, .pp = 1, .offload = off};
                Plan p;
                assert_int_equal(policy_plan(&p, "balance", &b, &cfg, &cm), 0);
                double ratio = p.makespan / p.lower_bound;
                if (ratio > 1.05)
                    fail_msg("%s ctx %lld offload %d: makespan / bound = %.4f", DISTS[d], (long long)CTX[c], off, ratio);
                check_sharding(&p, &cfg, &cm, 0);
                plan_free(&p);
                batch_free(&b);
            }
}

// ---- errors ------------------------------------------------------------------------------------------------

static void expect_plan_error(const char *policy, const GlobalBatch *b, const PlanConfig *cfg, const CostModel *cm,
                              const char *needle) {
    Plan p;
    bs_error_clear();
    assert_int_equal(policy_plan(&p, policy, b, cfg, cm), -1);
    if (!strstr(bs_errmsg(), needle)) fail_msg("expected \"%s\" in: %s", needle, bs_errmsg());
    assert_null(p.items);  // nothing half-built is left behind
}

static void test_errors(void **state) {
    (void)state;
    GlobalBatch b;
    assert_int_equal(batch_init(&b, 4), 0);
    assert_int_equal(batch_push(&b, 0, 300, -1), 0);
    assert_int_equal(batch_push(&b, 1, 100000, -1), 0);
    CostModel tiny, big;
    derive(&tiny, "tiny", 1, 1, 4, 1000);  // 2 layers: offloading cannot shrink a ring
    derive(&big, "llama-7b", 2, 1, 4, 1000);
    PlanConfig cfg = {.n_ranks = 4, .capacity = 1000, .pp = 1, .offload = 0};
    expect_plan_error("static", &b, &cfg, &tiny, "a sequence of 100000 tokens needs 100 ranks of capacity 1000; only 4 given");
    expect_plan_error("naive", &b, &cfg, &tiny,
                      "sequence 1 (id 1): a sequence of 100000 tokens needs 100 ranks of capacity 1000; only 4 given");
    expect_plan_error("balance", &b, &cfg, &tiny, "needs 100 ranks of capacity 1000; only 4 given");
    cfg.offload = 1;
    expect_plan_error("naive", &b, &cfg, &tiny, "needs 100 ranks of capacity 1000 (with offloading); only 4 given");
    // with 32 layers offloading fits it on fewer ranks: Eq. 3 says how many
    double r;
    int need = cost_min_ranks(&big, 100000, 1000, 1, 1000, &r);
    assert_true(need >= 2 && need < 100);
    cfg.n_ranks = need - 1;
    char msg[200];
    snprintf(msg, sizeof msg, "needs %d ranks of capacity 1000 (with offloading); only %d given", need, need - 1);
    expect_plan_error("balance", &b, &cfg, &big, msg);
    cfg.n_ranks = need;
    Plan p;
    assert_int_equal(policy_plan(&p, "naive", &b, &cfg, &big), 0);
    plan_free(&p);
    cfg.n_ranks = 4;
    cfg.context = 5000;
    expect_plan_error("static", &b, &cfg, &tiny, "sequence 1 (id 1) has 100000 tokens, more than the context of 5000");
    cfg.context = 0;
    expect_plan_error("fancy", &b, &cfg, &tiny,
                      "unknown policy 'fancy' (policies: static, naive, naive-eq3min, balance, elastic, megatron-hcp, "
                      "wlb, flexsp, blocks, blocks-all)");
    assert_null(policy_find("fancy"));
    assert_non_null(policy_find("balance"));
    assert_non_null(policy_find("elastic"));
    // + elastic, megatron-hcp, wlb, flexsp, blocks, blocks-all: tested in test_policy_<name>.c
    assert_int_equal(policy_count(), N_POLICIES + 6);
    PlanConfig bad = cfg;
    bad.capacity = 0;
    expect_plan_error("naive", &b, &bad, &tiny, "capacity must be in [1,");
    bad = cfg, bad.n_ranks = 0;
    expect_plan_error("naive", &b, &bad, &tiny, "ranks must be >= 1");
    bad = cfg, bad.pp = 0;
    expect_plan_error("balance", &b, &bad, &tiny, "pp must be >= 1");
    bad = cfg, bad.delta = -1;
    expect_plan_error("balance", &b, &bad, &tiny, "delta must be in [0, 1)");
    expect_plan_error("balance", &b, &cfg, NULL, "planning needs a cost model");
    batch_free(&b);
    // an empty batch is a valid, empty plan
    GlobalBatch e;
    assert_int_equal(batch_init(&e, 1), 0);
    for (int k = 0; k < N_POLICIES; k++) {
        assert_int_equal(policy_plan(&p, POLICIES[k], &e, &cfg, &tiny), 0);
        assert_int_equal(p.n_items, 0);
        assert_true(p.makespan == 0);
        plan_free(&p);
    }
    batch_free(&e);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_bestfit_matches_brute_force),
        cmocka_unit_test(test_rankheap_matches_brute_force),
        cmocka_unit_test(test_ranktree_matches_brute_force),
        cmocka_unit_test(test_ranktree_many_ranks),
        cmocka_unit_test(test_order_by_time_matches_sort),
        cmocka_unit_test(test_order_by_time_desc_matches_sort),
        cmocka_unit_test(test_random_batches_all_policies),
        cmocka_unit_test(test_balance_beats_naive),
        cmocka_unit_test(test_balance_near_bound_at_paper_settings),
        cmocka_unit_test(test_errors),
        cmocka_unit_test(test_policy_vocabulary),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
