// sim_api.c: the flat API's simulator (api.h): one step of a plan on a modelled cluster, as
// `bytescale simulate --plan FILE` runs it (src/cli/simulate.c, simulate_plan_file).
#include <stdlib.h>
#include <string.h>

#include "bytescale/api.h"
#include "bytescale/cluster.h"
#include "bytescale/error.h"
#include "bytescale/hw.h"
#include "bytescale/model.h"
#include "bytescale/sim.h"

struct BsSim {
    Plan plan;          // the simulator's copy, finalized with cm (a trace needs it)
    CostModel cm;
    ModelConfig model;
    HardwareProfile hw;
    Cluster cluster;
    SimResult res;
};

// A copy of p's batch and items, finalized and validated with cm: the simulator re-derives the
// items' estimates with its own cost model, and the caller's plan must not change under it. Every
// item keeps its kind (a block item its owners, an all-to-all group or a hybrid its flag and u), and
// the plan its barriers and delayed sequences: what the simulator runs is the plan as written.
static int copy_item(Plan *dst, const Plan *p, int32_t k) {
    const Item *it = &p->items[k];
    const Segment *segs = p->segs + it->seg_begin;
    const int32_t *ranks = p->ranks + it->rank_begin;
    int32_t got = plan_item_kind(p, k) == ITEM_BLOCKS
                      ? plan_add_blocks_item(dst, segs, it->n_segs, ranks, it->n_ranks, p->seg_owner + it->seg_begin)
                      : plan_add_item(dst, segs, it->n_segs, ranks, it->n_ranks, it->offload);
    if (got < 0) return -1;
    dst->items[got].a2a = it->a2a;
    dst->items[got].ulysses = it->ulysses;
    return 0;
}

static int plan_copy(Plan *dst, const Plan *p, const CostModel *cm) {
    if (plan_init(dst, &p->batch, p->n_ranks, p->capacity, p->pp, p->policy) != 0) return -1;
    for (int32_t k = 0, w = 0; k < p->n_items; k++) {
        for (; w < p->n_barriers && p->barriers[w] == k; w++)
            if (plan_add_barrier(dst) != 0) goto fail;
        if (copy_item(dst, p, k) != 0) goto fail;
    }
    for (int32_t d = 0; d < p->n_delayed; d++)
        if (plan_add_delayed(dst, p->delayed[d]) != 0) goto fail;
    if (plan_finalize(dst, cm) != 0 || plan_validate(dst, cm) != 0) {
        plan_free(dst);
        return -1;
    }
    return 0;
fail:
    plan_free(dst);
    return -1;
}

BsSim *bs_simulate(const Plan *p, const char *model, const char *hardware, int64_t tp, int64_t gpus,
                   const CostModel *cm) {
    if (!p || !p->rank_begin) {
        bs_fail("simulate: %s", p ? "the plan is not finalized" : "no plan");
        return NULL;
    }
    if (!model || !model[0] || !hardware || !hardware[0]) {
        bs_fail("simulate: %s: no value given", !model || !model[0] ? "model" : "hardware");
        return NULL;
    }
    if (tp < 1 || tp > CLUSTER_MAX_DEGREE) {
        bs_fail("tp: %lld is out of range [1, %d]", (long long)tp, CLUSTER_MAX_DEGREE);
        return NULL;
    }
    // ranks x tp x pp in 64 bits: a plan may hold up to 2^20 ranks and 1024 stages
    if (gpus < 0) {
        bs_fail("gpus: %lld is negative (0: the plan's ranks x tp x pp)", (long long)gpus);
        return NULL;
    }
    int64_t devices = gpus > 0 ? gpus : (int64_t)p->n_ranks * tp * p->pp;
    if (devices > CLUSTER_MAX_GPUS) {
        bs_fail("gpus: %lld devices (%s) is out of range [1, %d]", (long long)devices,
                gpus > 0 ? "given" : "the plan's ranks x tp x pp", CLUSTER_MAX_GPUS);
        return NULL;
    }
    BsSim *s = bs_calloc(1, sizeof *s);
    if (!s) return NULL;
    const ModelConfig *m = model_find(model);
    if (!m) {
        bs_fail_ctx("model");
        goto fail;
    }
    s->model = *m;
    if (hw_resolve(hardware, &s->hw) != 0) {
        bs_fail_ctx("hardware");
        goto fail;
    }
    if (cluster_init(&s->cluster, &s->hw, (int)devices, (int)tp, p->pp) != 0) goto fail;
    if (s->cluster.n_ranks != p->n_ranks) {
        bs_fail("gpus: %lld devices of tp %lld x pp %d make %d HDP ranks; the plan has %d", (long long)devices, (long long)tp, p->pp,
                s->cluster.n_ranks, p->n_ranks);
        goto fail;
    }
    if (cm) s->cm = *cm;
    else if (cost_derive(&s->cm, &s->model, &s->hw, (int)tp, p->pp, s->cluster.n_ranks, p->capacity) != 0)
        goto fail;
    if (plan_copy(&s->plan, p, &s->cm) != 0) {
        bs_fail_ctx("simulate");
        goto fail;
    }
    SimConfig cfg = {&s->cm, &s->cluster, &s->model, &s->hw, 0};
    if (sim_run(&s->res, &s->plan, &cfg) != 0) {
        plan_free(&s->plan);
        goto fail;
    }
    return s;
fail:
    free(s);
    return NULL;
}

void bs_sim_free(BsSim *s) {
    if (!s) return;
    sim_result_free(&s->res);
    plan_free(&s->plan);
    free(s);
}

int bs_sim_info(const BsSim *s, BsSimInfo *out, size_t size) {
    if (size != sizeof *out)
        return bs_fail("bs_sim_info: the caller's BsSimInfo has %zu bytes, this library's %zu: the binding and the "
                       "library are from different versions",
                       size, sizeof *out);  // (as plan_api.c's check_size)
    if (!s) return bs_fail("bs_sim_info: no simulation");
    const SimResult *r = &s->res;
    memset(out, 0, sizeof *out);
    out->n_gpus = s->cluster.n_gpus, out->n_ranks = r->n_ranks, out->pp = r->pp, out->n_res = r->n_res;
    out->n_rings = r->n_rings, out->n_ops = r->n_ops;
    out->step_time = r->step_time, out->compute_end = r->compute_end, out->sync_time = r->sync_time;
    out->optimizer_time = r->optimizer_time;
    out->tokens = r->tokens, out->tokens_per_s = r->tokens_per_s, out->model_flops = r->model_flops, out->mfu = r->mfu;
    out->ring_bytes = r->ring_bytes, out->offload_bytes = r->offload_bytes;
    out->exposed_comm = r->exposed_comm, out->exposed_offload = r->exposed_offload;
    return 0;
}

int bs_sim_resources(const BsSim *s, double *busy, double *comm, double *wait, double *offload) {
    if (!s) return bs_fail("bs_sim_resources: no simulation");
    size_t n = (size_t)s->res.n_res * sizeof(double);
    if (busy) memcpy(busy, s->res.busy, n);
    if (comm) memcpy(comm, s->res.comm, n);
    if (wait) memcpy(wait, s->res.wait, n);
    if (offload) memcpy(offload, s->res.offload, n);
    return 0;
}

int bs_sim_trace(const BsSim *s, const char *path, int64_t max_ranks) {
    if (!s) return bs_fail("bs_sim_trace: no simulation");
    if (!path || !path[0]) return bs_fail("path: no value given");
    if (max_ranks < 0 || max_ranks > INT32_MAX) return bs_fail("max_ranks: %lld is out of range [0, %d]", (long long)max_ranks, INT32_MAX);
    return sim_trace_write(&s->res, &s->plan, path, (int)max_ranks);
}
