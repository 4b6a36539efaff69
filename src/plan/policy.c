// policy.c: the table of policies and the one entry point that runs and validates them (policy.h).
#include "bytescale/policy.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

#include "bytescale/error.h"
#include "plan/policy_util.h"

// what `bytescale train` says of the block peers' plans (docs/peers.md)
#define BLOCK_ITEMS                                                                                                  \
    "its block items (blocks owned one by one, K/V fetched from their owners) do not run in the engine, which runs " \
    "packs, rings, all-to-all and hybrid items"

static const Policy policies[] = {
    {"static", "Megatron-style static DP x CP mesh: d_cp fixed by the context, packed micro-batches on CP rings",
     policy_static, 0, NULL},
    {"naive", "ByteScale Algorithm 1 as deployed: rings of Eq. 3's fewest to ceil(s/C) ranks, whichever finishes "
              "first (offloading only where that is no later), best-fit packs, tokens balanced",
     policy_naive, 0, NULL},
    {"naive-eq3min", "Algorithm 1 read literally: every long sequence on Eq. 3's fewest ranks (offloading), "
                     "best-fit packs, tokens balanced",
     policy_naive_eq3min, 0, NULL},
    {"balance", "ByteScale Algorithm 2: as naive, but assigned by estimated time (DP-Balance; PP-Balance when pp > 1)",
     policy_balance, 0, NULL},
    {"elastic", "bytescale's own and the default: balance, then rings widened past ceil(s/C) (up to all ranks) where "
                "a ring sets the step and ranks would idle, each item's kind (ring, all-to-all group, hybrid) chosen "
                "at its width, the widths chosen by replay under pipelines; never longer than balance",
     policy_elastic, 0, NULL},
    // the peers, as published (docs/peers.md)
    {"megatron-hcp", "Megatron-LM's hybrid DP x CP: power-of-two CP groups balanced by s^2/cp, in waves separated by "
                     "barriers",
     policy_megatron_hcp, 1, NULL},
    {"wlb", "WLB-LLM: static DP x CP mesh, micro-batches packed by attention-aware work, outlier documents delayed, "
            "per-document CP sharding",
     policy_wlb, 1,
     "its delay queue postpones documents to later steps, which the training data pipeline does not carry over"},
    {"flexsp", "FlexSP: heterogeneous power-of-two Ulysses (all-to-all) groups, at most the heads of a TP shard "
               "(rings beyond), sized by a MILP (GLPK)",
     policy_flexsp, 1, NULL},
    {"blocks", "MagiAttention / FCP: sequences cut into blocks of B tokens, min-heap dispatched by causal area over "
               "each CP group of the static mesh's d_cp ranks, K/V blocks fetched from their owners; simulate only",
     policy_blocks, 1, BLOCK_ITEMS},
    {"blocks-all", "blocks with all ranks as one CP group; simulate only", policy_blocks_all, 1, BLOCK_ITEMS},
};
enum { N_POLICIES = sizeof policies / sizeof policies[0] };

int policy_count(void) { return N_POLICIES; }

const Policy *policy_at(int i) { return i >= 0 && i < N_POLICIES ? &policies[i] : NULL; }

static int in_group(const Policy *p, int group) {
    if (group == POLICY_TRAINS) return p->no_train == NULL;
    return (group & (p->peer ? POLICY_PEERS : POLICY_OWN)) != 0;
}

const char *policy_names(char *buf, size_t size, int group) {
    size_t used = 0;
    buf[0] = '\0';
    for (int i = 0; i < N_POLICIES && used < size; i++)
        if (in_group(&policies[i], group))
            used += (size_t)snprintf(buf + used, size - used, "%s%s", used ? ", " : "", policies[i].name);
    return buf;
}

const Policy *policy_find(const char *name) {
    for (int i = 0; i < N_POLICIES; i++)
        if (name && !strcmp(name, policies[i].name)) return &policies[i];
    char names[256];
    bs_fail("unknown policy '%s' (policies: %s)", name ? name : "(null)", policy_names(names, sizeof names, POLICY_ALL));
    return NULL;
}

// Adds the table's policies of `group` (or the one named) to names, each once.
static int add_policy(const Policy *p, const char **names, int max, int *n) {
    for (int i = 0; i < *n; i++)
        if (names[i] == p->name) return 0;
    if (*n == max) return bs_fail("at most %d policies in one list", max);
    names[(*n)++] = p->name;
    return 0;
}

int policy_expand(const char *list, const char **names, int max, int *n) {
    *n = 0;
    char buf[512];
    if (!list || snprintf(buf, sizeof buf, "%s", list) >= (int)sizeof buf) return bs_fail("policy list too long");
    for (char *save = NULL, *w = strtok_r(buf, ",", &save); w; w = strtok_r(NULL, ",", &save)) {
        int group = !strcmp(w, "all")     ? POLICY_ALL
                    : !strcmp(w, "own")   ? POLICY_OWN
                    : !strcmp(w, "peers") ? POLICY_PEERS
                                          : 0;
        for (int i = 0; group && i < N_POLICIES; i++)
            if (in_group(&policies[i], group) && add_policy(&policies[i], names, max, n) != 0) return -1;
        if (group) continue;
        const Policy *p = policy_find(w);
        if (!p) {
            char known[256];
            return bs_fail("unknown policy '%s' in '%s' (policies: %s; or own, peers, all)", w, list,
                           policy_names(known, sizeof known, POLICY_ALL));
        }
        if (add_policy(p, names, max, n) != 0) return -1;
    }
    if (*n == 0) return bs_fail("no policy in '%s'", list);
    return 0;
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
