// policy.c: the table of policies and the one entry point that runs and validates them (policy.h).
#include "bytescale/policy.h"

#include <math.h>
#include <string.h>

#include "bytescale/error.h"
#include "plan/policy_util.h"

static const Policy policies[] = {
    {"static", "Megatron-style static DP x CP mesh: d_cp fixed by the context, packed micro-batches on CP rings",
     policy_static},
    {"naive", "ByteScale Algorithm 1 as deployed: rings of Eq. 3's fewest to ceil(s/C) ranks, whichever finishes "
              "first (offloading only where that is no later), best-fit packs, tokens balanced",
     policy_naive},
    {"naive-eq3min", "Algorithm 1 read literally: every long sequence on Eq. 3's fewest ranks (offloading), "
                     "best-fit packs, tokens balanced",
     policy_naive_eq3min},
    {"balance", "ByteScale Algorithm 2: as naive, but assigned by estimated time (DP-Balance; PP-Balance when pp > 1)",
     policy_balance},
    {"elastic", "bytescale's own: balance, then rings widened past ceil(s/C) (up to all ranks) where a ring sets the "
                "step and ranks would idle; never longer than balance",
     policy_elastic},
    // the peers, as published (docs/peers.md)
    {"megatron-hcp", "Megatron-LM's hybrid DP x CP: power-of-two CP groups balanced by s^2/cp, in waves separated by "
                     "barriers",
     policy_megatron_hcp},
    {"wlb", "WLB-LLM: static DP x CP mesh, micro-batches packed by attention-aware work, outlier documents delayed, "
            "per-document CP sharding",
     policy_wlb},
    {"flexsp", "FlexSP: heterogeneous power-of-two Ulysses (all-to-all) groups, at most the heads of a TP shard "
               "(rings beyond), sized by a MILP (GLPK); simulate "
               "only, the engine runs no all-to-all",
     policy_flexsp},
    {"blocks", "MagiAttention / FCP: sequences cut into blocks of B tokens, min-heap dispatched by causal area over "
               "each CP group of the static mesh's d_cp ranks, K/V blocks fetched from their owners; simulate only",
     policy_blocks},
    {"blocks-all", "blocks with all ranks as one CP group; simulate only", policy_blocks_all},
};
enum { N_POLICIES = sizeof policies / sizeof policies[0] };

int policy_count(void) { return N_POLICIES; }

const Policy *policy_at(int i) { return i >= 0 && i < N_POLICIES ? &policies[i] : NULL; }

const Policy *policy_find(const char *name) {
    for (int i = 0; i < N_POLICIES; i++)
        if (name && !strcmp(name, policies[i].name)) return &policies[i];
    char names[256] = "";
    for (int i = 0; i < N_POLICIES; i++) {
        strncat(names, i ? ", " : "", sizeof names - strlen(names) - 1);
        strncat(names, policies[i].name, sizeof names - strlen(names) - 1);
    }
    bs_fail("unknown policy '%s' (policies: %s)", name ? name : "(null)", names);
    return NULL;
}

static int check_config(const PlanConfig *cfg, const CostModel *cm) {
    if (!cm) return bs_fail("planning needs a cost model");
    if (cfg->n_ranks < 1) return bs_fail("ranks must be >= 1 (got %d)", cfg->n_ranks);
    if (cfg->capacity < 1 || cfg->capacity > POLICY_MAX_CAPACITY)
        return bs_fail("capacity must be in [1, %lld] tokens (got %lld)", (long long)POLICY_MAX_CAPACITY,
                       (long long)cfg->capacity);
    if (cfg->context < 0) return bs_fail("context must be >= 0 (got %lld)", (long long)cfg->context);
    if (cfg->pp < 1) return bs_fail("pp must be >= 1 (got %d)", cfg->pp);
    if (!(cfg->delta >= 0 && cfg->delta < 1)) return bs_fail("delta must be in [0, 1) (got %g)", cfg->delta);
    if (cfg->block_size < 0) return bs_fail("block size must be >= 0 tokens (got %lld)", (long long)cfg->block_size);
    if (cfg->n_buckets < 0) return bs_fail("n_buckets must be >= 0 (got %d)", cfg->n_buckets);
    return 0;
}

int policy_plan(Plan *out, const char *name, const GlobalBatch *b, const PlanConfig *cfg, const CostModel *cm) {
    memset(out, 0, sizeof *out);
    const Policy *pol = policy_find(name);
    if (!pol) return -1;
    if (check_config(cfg, cm) != 0) return bs_fail_ctx("%s", pol->name);
    if (pol->fn(out, b, cfg, cm) != 0) {
        plan_free(out);
        return bs_fail_ctx("%s", pol->name);
    }
    // a policy that compares makespans (balance with pp > 1, elastic) has finalized its plan already
    if ((!out->rank_begin && plan_finalize(out, cm) != 0) || plan_validate(out, cm) != 0) {
        plan_free(out);
        return bs_fail_ctx("policy %s produced an invalid plan", pol->name);
    }
    return 0;
}
