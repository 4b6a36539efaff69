// memory.c: the peak device memory of a simulated step (sim.h, sim_memory; docs/simulator.md,
// "Memory").
//
// Per device of every resource (HDP rank r, stage s), bytes:
//   static       parameters, gradients and optimizer state of the stage: cost_memory
//   activations  a walk over the resource's operations in execution order (SimResult.res_ops):
//                a forward adds what its item keeps for the backward on one member, the item's
//                backward frees it; the largest running sum is the peak. Under 1F1B stage s runs
//                pp - 1 - s warm-up forwards before its first backward, so the walk holds up to
//                pp - s micro-batches at once on stage s without being told (cost_pipe_in_flight,
//                the count the engine's memory budget shares a process among).
//                The buffers all layers share (the head's input, backward scratch: act_shared_*)
//                are held once per rank, not once per micro-batch in flight: the engine reserves
//                them once, with room for its longest micro-batch (llama.h, ActLayout), so they
//                count once, sized for the resource's largest n.
#include "bytescale/sim.h"

#include <stdlib.h>
#include <string.h>

#include "bytescale/error.h"

// Parameters, gradients and optimizer state per device: cost_memory's figure for the most loaded
// stage, on every stage. That is enough: the simulator charges every stage that stage's layers
// (cm->n_layers = ceil(layers / pp), sim.h) and the check asks whether the worst device fits; the
// other stages differ only by a layer's parameters and the embedding versus the head, so a
// per-stage figure could move a warning by that much and never hide one. 0 without a model and a
// hardware profile (a hand-built SimConfig): then only the activations are known.
static int static_bytes(const SimConfig *cfg, const Plan *p, double *out) {
    *out = 0;
    if (!cfg->model || !cfg->hw) return 0;
    const Cluster *c = cfg->cluster;
    CostMemory mem;
    // capacity only sizes cost_memory's activation term l * Act(C), which the walk replaces
    int64_t capacity = p->capacity > 0 ? p->capacity : 1;
    if (cost_memory(&mem, cfg->model, cfg->hw, c->tp, c->pp, c->n_ranks, capacity) != 0)
        return bs_fail_ctx("memory of the step");
    *out = mem.param_bytes + mem.grad_bytes + mem.optimizer_bytes;
    return 0;
}

// What one member of item i holds: tokens / D of the item at its offload ratio. cost_rank_act is
// the shared buffers plus the layers; the shared part alone is the same model with no layers.
static double item_act(const CostModel *cm, const Item *it) {
    return cost_rank_act(cm, (double)it->tokens / it->n_ranks, it->offload);
}

static double item_shared(const CostModel *no_layers, const Item *it) {
    return cost_rank_act(no_layers, (double)it->tokens / it->n_ranks, 0.0);
}

// The activation peak of resource k: the largest sum of the layers' parts of the micro-batches in
// flight, plus the shared buffers once, for the largest micro-batch the resource runs.
static double resource_act_peak(const SimResult *r, const Plan *p, const CostModel *cm, const CostModel *no_layers,
                                int k) {
    double held = 0, peak = 0, shared = 0;
    for (int32_t q = r->res_begin[k]; q < r->res_begin[k + 1]; q++) {
        const SimOp *o = &r->ops[r->res_ops[q]];
        const Item *it = &p->items[o->item];
        double sh = item_shared(no_layers, it), layers = item_act(cm, it) - sh;
        if (sh > shared) shared = sh;
        held += o->bwd ? -layers : layers;
        if (held > peak) peak = held;
    }
    return shared + peak;
}

int sim_memory(SimMemory *out, const SimResult *r, const Plan *p, const SimConfig *cfg) {
    memset(out, 0, sizeof *out);
    if (!cfg->cm || !cfg->cluster) return bs_fail("memory of the step: a cost model and a cluster are required");
    int pp = p->pp > 0 ? p->pp : 1;
    if (r->pp != pp || r->n_res != (int64_t)p->n_ranks * pp || r->n_ops != 2 * (int64_t)pp * p->n_items ||
        !r->res_begin || !r->res_ops || !r->ops)
        return bs_fail("memory of the step: the simulated step (%d resources, %d operations) is not of this plan "
                       "(%d ranks x %d stages, %d items)",
                       r->n_res, r->n_ops, p->n_ranks, pp, p->n_items);
    double stat;
    if (static_bytes(cfg, p, &stat) != 0) return -1;
    out->act_peak = bs_calloc(r->n_res > 0 ? (size_t)r->n_res : 1, sizeof(double));
    if (!out->act_peak) return -1;
    out->n_res = r->n_res;
    out->pp = pp;
    out->static_bytes = stat;
    CostModel no_layers = *cfg->cm;
    no_layers.n_layers = 0;
    int32_t best = 0;
    for (int32_t k = 0; k < r->n_res; k++) {
        out->act_peak[k] = resource_act_peak(r, p, cfg->cm, &no_layers, k);
        if (out->act_peak[k] > out->act_peak[best]) best = k;
    }
    double act = r->n_res > 0 ? out->act_peak[best] : 0;
    out->peak = (SimMemPeak){best / pp, best % pp, act, stat, stat + act};
    return 0;
}

void sim_memory_free(SimMemory *m) {
    free(m->act_peak);
    memset(m, 0, sizeof *m);
}
