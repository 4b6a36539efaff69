// runner.c: make a scenario concrete (model, hardware, cluster, cost model, global batch) and run a
// policy variant on it: plan, then simulate.
#include <string.h>

#include "bytescale/error.h"
#include "bytescale/policy.h"
#include "bytescale/scenario.h"
#include "bytescale/timer.h"

int sim_setup_init(SimSetup *s, const Scenario *sc, uint64_t seed) {
    memset(s, 0, sizeof *s);
    s->sc = *sc;
    s->seed = seed;
    const ModelConfig *m = model_find(sc->model);
    if (!m) return bs_fail_ctx("scenario %s", sc->name);
    s->model = *m;
    if (hw_resolve(sc->hardware, &s->hw) != 0) return bs_fail_ctx("scenario %s", sc->name);
    if (sc->capacity < 1) return bs_fail("scenario %s: capacity must be >= 1 token", sc->name);
    if (sc->tokens < 1) return bs_fail("scenario %s: tokens per batch must be >= 1", sc->name);
    if (cluster_init(&s->cluster, &s->hw, sc->gpus, sc->tp, sc->pp) != 0) return bs_fail_ctx("scenario %s", sc->name);
    if (cost_derive(&s->cm, &s->model, &s->hw, sc->tp, sc->pp, s->cluster.n_ranks, sc->capacity) != 0)
        return bs_fail_ctx("scenario %s", sc->name);
    if (batch_generate(&s->batch, sc->dataset, seed, sc->tokens, sc->context) != 0) {
        batch_free(&s->batch);
        return bs_fail_ctx("scenario %s", sc->name);
    }
    return 0;
}

void sim_setup_free(SimSetup *s) {
    batch_free(&s->batch);
    memset(s, 0, sizeof *s);
}

SimConfig sim_setup_config(const SimSetup *s) {
    SimConfig c = {&s->cm, &s->cluster, &s->model, &s->hw, 0};
    return c;
}

int sim_setup_run(const SimSetup *s, const SimVariant *v, SimOutcome *out, Plan *plan_out) {
    memset(out, 0, sizeof *out);
    out->variant = *v;
    PlanConfig pc;
    memset(&pc, 0, sizeof pc);
    pc.n_ranks = s->cluster.n_ranks;
    pc.capacity = s->sc.capacity;
    pc.context = s->sc.context;
    pc.pp = s->sc.pp;
    pc.offload = v->offload;
    pc.flush = s->flush;
    pc.carried = s->carried;
    pc.block_size = s->sc.block_size;
    Plan plan;
    double t0 = now_seconds();
    if (policy_plan(&plan, v->policy, &s->batch, &pc, &s->cm) != 0)
        return bs_fail_ctx("scenario %s: policy %s", s->sc.name, v->label);
    double t1 = now_seconds();
    SimConfig cfg = sim_setup_config(s);
    int rc = sim_run(&out->res, &plan, &cfg);
    out->plan_seconds = t1 - t0;
    out->sim_seconds = now_seconds() - t1;
    out->planner_makespan = plan.makespan;
    out->lower_bound = plan.lower_bound;
    out->hdp_bound = plan.hdp_bound;
    out->n_items = plan.n_items;
    if (rc != 0) bs_fail_ctx("scenario %s: policy %s", s->sc.name, v->label);
    if (rc == 0 && plan_out) *plan_out = plan;
    else plan_free(&plan);
    return rc;
}

void sim_outcome_free(SimOutcome *o) { sim_result_free(&o->res); }
