// plan_stats.c: the numbers a person reads about a plan (plan.h PlanStats).
#include <stdlib.h>
#include <string.h>

#include "bytescale/error.h"
#include "bytescale/plan.h"

static int by_value(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

// Histogram bin of a ring size: 1 -> 0, 2 -> 1, 3-4 -> 2, 5-8 -> 3, ... (the last bin takes the rest).
static int size_bin(int32_t d) {
    int k = 0;
    while (k < PLAN_HIST_BINS - 1 && (1ll << k) < d) k++;
    return k;
}

// K/V bytes a ring of D ranks moves per layer for T tokens. Forward: D-1 steps in which every member
// passes a K/V block of T/D tokens, (D-1) * T * kv in all. Backward: the K/V blocks go round again
// (D-1 steps) and the partial dK/dV travel with them and take one more step home (D steps).
static double ring_layer_bytes(double kv_token, int64_t tokens, int32_t d) {
    return kv_token * (double)tokens * (double)((d - 1) + (d - 1) + d);
}

// The bytes a Ulysses all-to-all group of D ranks (Item.a2a, flexsp) moves per layer for T tokens,
// counted as the simulator does (sim.c): forward and backward, every member sends (D-1)/D of its T/D
// tokens' Q, K, V and attention output (their gradients backward), cost_a2a_bytes per token.
static double a2a_layer_bytes(const CostModel *cm, int64_t tokens, int32_t d) {
    return 2.0 * cost_a2a_bytes(cm, d) * (double)tokens * (double)(d - 1) / (double)d;
}

// The bytes a hybrid item (Item.ulysses: a ring of r groups of u) moves per layer for T tokens, as the
// simulator counts them (sim.c): every group's all-to-alls (a2a_layer_bytes of a group of u: the r
// groups together move (u-1)/u of all T tokens' bytes), then a ring of r over the groups in which each
// of the D = u r members passes group blocks of T / r tokens on its K/V heads (kv_token x
// cost_hybrid_kv_share(u) a token): forward r - 1 blocks, backward r - 1 with their dK/dV and one hop
// home (3r - 2 in all).
static double hybrid_layer_bytes(const CostModel *cm, int64_t tokens, int32_t d, int32_t u) {
    int32_t r = d / u;
    double a2a = a2a_layer_bytes(cm, tokens, u);  // the r groups' all-to-alls: (u-1)/u of every token's bytes
    double block = cm->kv_token * cost_hybrid_kv_share(cm, u) * (double)tokens / r;
    return a2a + (double)d * block * (double)(3 * r - 2);
}

// The K/V bytes a block item moves per layer, as the simulator counts them (sim.c): forward, every
// member receives the remote K/V blocks its queries see; backward, those again and the partial dK/dV
// of every block reduced to its owner.
static double blocks_layer_bytes(const Plan *p, int32_t k, const CostModel *cm) {
    const Item *it = &p->items[k];
    BlockLoad *ld = bs_malloc((size_t)it->n_ranks * sizeof *ld);
    double t = 0;
    if (!ld || plan_blocks_loads(p, k, NULL, NULL, ld) != 0) return free(ld), -1;
    for (int32_t m = 0; m < it->n_ranks; m++)
        t += 2 * (ld[m].kv_intra + ld[m].kv_inter) + ld[m].dkv_intra + ld[m].dkv_inter;
    free(ld);
    return t * cm->kv_token;
}

int plan_stats(const Plan *p, const CostModel *cm, PlanStats *out) {
    memset(out, 0, sizeof *out);
    if (!p->rank_begin || !p->rank_busy) return bs_fail("plan_stats: the plan is not finalized");
    double off_sum = 0;
    out->offload_min = 1;
    for (int32_t k = 0; k < p->n_items; k++) {
        const Item *it = &p->items[k];
        out->ring_hist[size_bin(it->n_ranks)]++;
        if (it->n_ranks == 1 && it->offload == 0) {
            out->n_packs++;
            continue;
        }
        if (it->n_ranks >= 2) {
            out->n_rings++;
            if (cm && plan_item_kind(p, k) == ITEM_BLOCKS) {
                double x = blocks_layer_bytes(p, k, cm);
                if (x < 0) return bs_fail_ctx("plan_stats");
                out->ring_bytes += (double)p->pp * cm->n_layers * x;
            } else if (cm)
                out->ring_bytes += (double)p->pp * cm->n_layers *
                                   (it->ulysses > 0 ? hybrid_layer_bytes(cm, it->tokens, it->n_ranks, it->ulysses)
                                    : it->a2a       ? a2a_layer_bytes(cm, it->tokens, it->n_ranks)
                                                    : ring_layer_bytes(cm->kv_token, it->tokens, it->n_ranks));
        }
        out->n_long++;
        if (it->offload > 0) out->n_offload++;
        off_sum += it->offload;
        if (it->offload < out->offload_min) out->offload_min = it->offload;
        if (it->offload > out->offload_max) out->offload_max = it->offload;
    }
    if (out->n_long > 0) out->offload_mean = off_sum / out->n_long;
    else out->offload_min = 0;

    double *busy = bs_malloc((size_t)p->n_ranks * sizeof(double));
    if (!busy) return bs_fail_ctx("plan_stats");
    memcpy(busy, p->rank_busy, (size_t)p->n_ranks * sizeof(double));
    qsort(busy, (size_t)p->n_ranks, sizeof(double), by_value);
    int32_t n = p->n_ranks;
    out->busy_min = busy[0];
    out->busy_max = busy[n - 1];
    out->busy_median = n % 2 ? busy[n / 2] : 0.5 * (busy[n / 2 - 1] + busy[n / 2]);
    free(busy);
    for (int32_t r = 0; r < n; r++)
        if (p->rank_begin[r + 1] == p->rank_begin[r]) out->idle_ranks++;
    return 0;
}
