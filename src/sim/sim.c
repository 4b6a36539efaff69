// sim.c: the timeline of one training step of a plan (see sim.h for the model).
//
// The simulation is one pass over the operations sorted by their global key: an operation starts
// at max(its input ready, the free time of its stage on every member), and every resource runs its
// operations in key order, so this pass yields exactly the as-soon-as-possible schedule. The cost
// is O(pp * (items log items + ring members)): thousands of items on 16,384 GPUs take milliseconds.
#include "bytescale/sim.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "bytescale/error.h"

static double fwd_share(const SimConfig *cfg) { return cfg->fwd_fraction > 0 ? cfg->fwd_fraction : 1.0 / 3.0; }

static int elem_bytes(const SimConfig *cfg) { return cfg->hw && cfg->hw->elem_bytes > 0 ? cfg->hw->elem_bytes : 2; }

// Exact causal area of an item: every segment attends causally within itself.
static double item_area(const Plan *p, const Item *it) {
    double a = 0;
    for (int k = 0; k < it->n_segs; k++) a += cost_causal_area(p->segs[it->seg_begin + k].len);
    return a;
}

typedef struct {
    const Cluster *c;
    int stage;
} NodeCtx;

static int64_t cluster_node_of(int32_t rank, const void *ctx) {
    const NodeCtx *n = ctx;
    return cluster_node(n->c, rank, n->stage);
}

// One member's fetch of `intra` and `inter` tokens' K/V (or dK/dV): both links at once.
static double blocks_fetch(const SimConfig *cfg, const BlockLoad *ld, int32_t rank, int stage, double intra, double inter) {
    double kv = cfg->cm->kv_token, x = 0;
    if (intra > 0) x = cluster_msg_time(cfg->cluster, ld->src_intra, stage, rank, stage, intra * kv);
    if (inter > 0) x = fmax(x, cluster_msg_time(cfg->cluster, ld->src_inter, stage, rank, stage, inter * kv));
    return x;
}

// A block item (the block peer, docs/simulator.md): every member computes its own queries' pairs and
// receives the K/V blocks they see from their owners while it computes its local part (one remote
// stage); backward the K/V come again and the partial dK/dV go back to the owners after the remote
// part. The group's collectives tie the members: the item takes as long as its slowest member.
static SimOpCost blocks_op_cost(const SimConfig *cfg, const Plan *p, int32_t item, int stage, int bwd) {
    const CostModel *cm = cfg->cm;
    const Item *it = &p->items[item];
    SimOpCost oc = {0};
    BlockLoad *ld = malloc((size_t)it->n_ranks * sizeof *ld);
    NodeCtx nc = {cfg->cluster, stage};
    if (!ld || plan_blocks_loads(p, item, cluster_node_of, &nc, ld) != 0) {
        free(ld);
        return oc;  // out of memory: the item costs nothing (plan_finalize has derived it once already)
    }
    double phi = bwd ? 1.0 - fwd_share(cfg) : fwd_share(cfg), worst = -1, bytes = 0;
    int l = cm->n_layers;
    for (int32_t m = 0; m < it->n_ranks; m++) {
        const BlockLoad *b = &ld[m];
        int32_t rank = p->ranks[it->rank_begin + m];
        double lin = phi * (cm->lin_token * b->tokens + cm->layer_const);
        double local = phi * (cm->attn_pair * b->local_pairs + cm->attn_step);
        double remote = b->remote_pairs > 0 ? phi * (cm->attn_pair * b->remote_pairs + cm->attn_step) : 0;
        double x = blocks_fetch(cfg, b, rank, stage, b->kv_intra, b->kv_inter);
        double elapsed = lin + fmax(local, x) + remote;
        if (bwd) elapsed += blocks_fetch(cfg, b, rank, stage, b->dkv_intra, b->dkv_inter);
        double tp_fwd, tp_bwd;
        cost_tp_layer_times(cm, b->tokens, &tp_fwd, &tp_bwd);
        double tp = bwd ? tp_bwd : tp_fwd;
        bytes += cm->kv_token * (b->kv_intra + b->kv_inter + (bwd ? b->dkv_intra + b->dkv_inter : 0));
        if (l * (elapsed + tp) <= worst) continue;
        worst = l * (elapsed + tp);
        oc.compute = l * (lin + local + remote);
        if (stage == p->pp - 1) oc.compute += phi * cost_head_time(cm, b->tokens);
        oc.tp = l * tp;
        double head_fwd, head_bwd;
        cost_tp_head_times(cm, b->tokens, stage == 0, stage == p->pp - 1, &head_fwd, &head_bwd);
        oc.tp += bwd ? head_bwd : head_fwd;
        oc.comm = l * (elapsed - (lin + local + remote)) + oc.tp;
    }
    oc.ring_bytes = l * bytes / it->n_ranks;  // per member, as for rings: the mean of what the members receive
    free(ld);
    return oc;
}

// The hop of the rings across a hybrid item's r groups of u (member j of group g sends to member j of
// group g + 1 mod r): the inter-node link when any of those hops leaves a node, as cluster_ring_hop_time.
static double hybrid_ring_hop(const Cluster *c, const int32_t *ranks, int u, int r, int stage, double bytes) {
    if (r < 2) return 0;
    int from = 0, to = u;  // a hop that crosses nodes, if any; else the first one
    for (int m = 0; m < u * r; m++) {
        int next = (m + u) % (u * r);
        if (cluster_node(c, ranks[m], stage) != cluster_node(c, ranks[next], stage)) {
            from = m, to = next;
            break;
        }
    }
    return cluster_msg_time(c, ranks[from], stage, ranks[to], stage, bytes);
}

// A hybrid item (Item.ulysses: a ring of r Ulysses groups of u consecutive members, docs/simulator.md):
// per layer the group's all-to-all, exposed as an a2a item's (the slowest group's link), then a ring
// of r steps across the groups on the member's head share, pipelined as a ring's: each block is the
// group's queries against one group's keys, each transfer a group block of K/V on the member's K/V
// heads. Returns the attention's elapsed time per layer; *attn its compute, *bytes what a member sends.
static double hybrid_attention(const SimConfig *cfg, const Plan *p, const Item *it, int stage, int bwd, double phi,
                               double *attn, double *bytes) {
    const CostModel *cm = cfg->cm;
    const int32_t *ranks = p->ranks + it->rank_begin;
    int D = it->n_ranks, u = it->ulysses, r = D / u;
    double n = (double)it->tokens / D;  // tokens on each member
    double pairs = cm->attn_pair * item_area(p, it) * cost_a2a_head_share(cm, u) / ((double)r * r);
    double blk = phi * (pairs + cm->attn_step);  // the group's queries against one group's keys, its heads
    double a2a = cost_a2a_bytes(cm, u) * n * (u - 1) / u, x_a2a = 0;
    for (int g = 0; g < r; g++) x_a2a = fmax(x_a2a, cluster_ring_hop_time(cfg->cluster, ranks + g * u, u, stage, a2a));
    double kv = cm->kv_token * cost_hybrid_kv_share(cm, u) * n * u;  // one group block (u n tokens), its heads
    double x = hybrid_ring_hop(cfg->cluster, ranks, u, r, stage, bwd ? 2 * kv : kv);
    *attn = r * blk;
    *bytes = a2a + (bwd ? (2.0 * (r - 1) + 1.0) * kv : (r - 1.0) * kv);
    double elapsed = x_a2a + blk + (r - 1) * fmax(blk, x);
    if (bwd) elapsed += hybrid_ring_hop(cfg->cluster, ranks, u, r, stage, kv);  // the summed dK/dV home
    return elapsed;
}

SimOpCost sim_op_cost(const SimConfig *cfg, const Plan *p, int32_t item, int stage, int bwd) {
    if (plan_item_kind(p, item) == ITEM_BLOCKS) return blocks_op_cost(cfg, p, item, stage, bwd);
    const CostModel *cm = cfg->cm;
    const Item *it = &p->items[item];
    SimOpCost oc = {0};
    int D = it->n_ranks;
    int l = cm->n_layers;
    double phi = bwd ? 1.0 - fwd_share(cfg) : fwd_share(cfg);
    double n = (double)it->tokens / D;                               // tokens on each member
    double lin = phi * (cm->lin_token * n + cm->layer_const);        // per layer
    // one ring step's block: its pairs, plus the floor every attention call pays (cost.h attn_step)
    double blk = phi * (cm->attn_pair * item_area(p, it) / ((double)D * D) + cm->attn_step);
    double attn = D * blk;                                           // attention compute per layer
    double attn_elapsed = attn;
    if (plan_item_kind(p, item) == ITEM_HYBRID) {
        double bytes;
        attn_elapsed = hybrid_attention(cfg, p, it, stage, bwd, phi, &attn, &bytes);
        oc.ring_bytes = l * bytes;
    } else if (D >= 2 && it->a2a) {
        // a Ulysses group (flexsp): every member computes 1/D of the heads over whole segments, after
        // and before the all-to-alls of Q, K, V and the output (the gradients of them backward), which
        // nothing hides; an all-to-all costs (D-1)/D of the member's bytes over the group's slowest link
        blk = phi * (cm->attn_pair * item_area(p, it) * cost_a2a_head_share(cm, D) + cm->attn_step);
        attn = attn_elapsed = blk;
        double bytes = cost_a2a_bytes(cm, D) * n * (D - 1) / D;
        attn_elapsed += cluster_ring_hop_time(cfg->cluster, p->ranks + it->rank_begin, D, stage, bytes);
        oc.ring_bytes = l * bytes;
    } else if (D >= 2) {
        // forward: K/V travel; backward: K/V and the partial dK/dV travel together, then the
        // finished dK/dV make one last hop home. Block t waits for transfer t, so with equal blocks
        // the pipeline takes b + (D - 1) max(b, x).
        const int32_t *ranks = p->ranks + it->rank_begin;
        double kv = cm->kv_token * n;
        double x = cluster_ring_hop_time(cfg->cluster, ranks, D, stage, bwd ? 2 * kv : kv);
        attn_elapsed = blk + (D - 1) * fmax(blk, x);
        if (bwd) attn_elapsed += cluster_ring_hop_time(cfg->cluster, ranks, D, stage, kv);
        oc.ring_bytes = l * (bwd ? (2.0 * (D - 1) + 1.0) * kv : (D - 1.0) * kv);
    }
    // TP (cost_tp_layer_times): forward, the all-reduces after wo and w_down, exposed; backward, those
    // of the input gradients, each behind its weight gradient
    double tp_fwd, tp_bwd;
    cost_tp_layer_times(cm, n, &tp_fwd, &tp_bwd);
    double tp = bwd ? tp_bwd : tp_fwd;
    double layer = lin + attn_elapsed + tp;
    oc.compute = l * (lin + attn);
    if (stage == p->pp - 1) oc.compute += phi * cost_head_time(cm, n);  // embedding, head and loss: once
    oc.tp = l * tp;
    // the embedding's sum (first stage, forward) and the loss's and head's (last stage, backward)
    double head_fwd, head_bwd;
    cost_tp_head_times(cm, n, stage == 0, stage == p->pp - 1, &head_fwd, &head_bwd);
    oc.tp += bwd ? head_bwd : head_fwd;
    oc.comm = l * (attn_elapsed - attn) + oc.tp;
    // offload: l - 2 layers move r of their activations; the copy of one layer overlaps the next
    // layer's work (forward: out; backward: the prefetch in), the last two layers stay resident
    double r = it->offload;
    if (r > 0 && l > 2) {
        double bytes = r * (cm->act_token * n + cm->act_const);
        double copy = cm->offload_bw > 0 ? bytes / cm->offload_bw : 0;  // 0: the tier is not modelled (cost.h)
        oc.offload = (l - 2) * fmax(0.0, copy - layer);
        oc.offload_bytes = (l - 2) * bytes;
    }
    return oc;
}

double sim_model_flops(const ModelConfig *m, const Plan *p) {
    double f = 0;
    for (int32_t k = 0; k < p->n_segs; k++) {
        const Segment *s = &p->segs[k];
        f += cost_train_flops(m, &s->len, 1);
        // a block of a block item (blocks) also attends to the start of its sequence before it
        if (p->seg_owner && p->seg_owner[k] >= 0)
            f += 3.0 * m->n_layers * cost_attn_flops_per_pair(m) * (double)s->len * (double)s->start;
    }
    return f;
}

// ---- operation order ---------------------------------------------------------------------------

typedef struct {
    int64_t key;   // 2 * (slot + s) forward, 2 * (slot + pp) - 1 backward
    int32_t item;
    int16_t stage;
    int16_t bwd;
} OpKey;

static int opkey_cmp(const void *a, const void *b) {
    const OpKey *x = a, *y = b;
    if (x->key != y->key) return x->key < y->key ? -1 : 1;
    // equal keys: backward of one item on several stages runs from the last stage down
    if (x->item != y->item) return x->item < y->item ? -1 : 1;
    if (x->stage != y->stage) return x->bwd ? (x->stage > y->stage ? -1 : 1) : (x->stage < y->stage ? -1 : 1);
    return 0;
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static SimSpread spread_of(const double *v, int n) {
    SimSpread s = {0, 0, 0};
    if (n <= 0) return s;
    double *t = malloc((size_t)n * sizeof *t);
    if (!t) return s;
    memcpy(t, v, (size_t)n * sizeof *t);
    qsort(t, (size_t)n, sizeof *t, cmp_double);
    s.min = t[0];
    s.max = t[n - 1];
    s.median = n % 2 ? t[n / 2] : 0.5 * (t[n / 2 - 1] + t[n / 2]);
    free(t);
    return s;
}

// The slowest activation hop of a ring item between two stages of its members' pipelines: the cost
// model's stage link when it has one (a profile measured it: cost_stage_transfer), else the
// cluster's link between the two stages' devices.
static double stage_hop(const SimConfig *cfg, const Plan *p, const Item *it, int from, int to) {
    const Cluster *c = cfg->cluster;
    double n = (double)it->tokens / it->n_ranks;
    if (cfg->cm->stage_bw > 0) return cost_stage_transfer(cfg->cm, n);
    if (!cfg->model) return 0;
    // hidden states (or their gradients), split over the TP group (sequence parallel)
    double bytes = n * cfg->model->d_model * elem_bytes(cfg) / (double)c->tp;
    double worst = 0;
    for (int k = 0; k < it->n_ranks; k++) {
        int r = p->ranks[it->rank_begin + k];
        worst = fmax(worst, cluster_msg_time(c, r, from, r, to, bytes));
    }
    return worst;
}

// Gradient bytes per device of stage s: its layers (ceil(L / pp) per stage, the last ones fewer),
// the embedding on the first stage, the final norm and output head on the last, split over TP.
static double stage_grad_bytes(const SimConfig *cfg, int s) {
    const ModelConfig *m = cfg->model;
    int pp = cfg->cluster->pp, per = (m->n_layers + pp - 1) / pp;
    int layers = m->n_layers - s * per < per ? m->n_layers - s * per : per;
    if (layers < 0) layers = 0;
    double emb = (double)m->vocab_size * m->d_model;
    double outer = (double)(model_params_total(m) - (int64_t)m->n_layers * model_params_per_layer(m));
    double params = layers * (double)model_params_per_layer(m);
    if (s == 0) params += emb;
    if (s == pp - 1) params += outer - emb;
    return params * elem_bytes(cfg) / cfg->cluster->tp;
}

static int check_inputs(const Plan *p, const SimConfig *cfg) {
    if (!cfg->cm || !cfg->cluster) return bs_fail("simulate: a cost model and a cluster are required");
    const Cluster *c = cfg->cluster;
    int pp = p->pp > 0 ? p->pp : 1;
    if (!p->rank_begin || !p->rank_items) return bs_fail("simulate: plan '%s' is not finalized", p->policy);
    if (p->n_ranks != c->n_ranks)
        return bs_fail("simulate: plan has %d HDP ranks but the cluster has %d (%d GPUs / (tp %d x pp %d))",
                       p->n_ranks, c->n_ranks, c->n_gpus, c->tp, c->pp);
    if (pp != c->pp) return bs_fail("simulate: plan has %d pipeline stages but the cluster has pp %d", pp, c->pp);
    if (cfg->cm->n_layers < 1) return bs_fail("simulate: cost model has %d layers per stage", cfg->cm->n_layers);
    // the per-rank schedules must list exactly the items that name the rank (the timeline sizes
    // its per-resource lists from them)
    int32_t *count = bs_calloc((size_t)p->n_ranks, sizeof(int32_t));
    if (!count) return -1;
    int bad = 0;
    for (int32_t i = 0; i < p->n_items && !bad; i++) {
        const Item *it = &p->items[i];
        if (it->n_ranks < 1) bad = bs_fail("simulate: item %d has no ranks", i);
        for (int k = 0; k < it->n_ranks && !bad; k++) {
            int32_t m = p->ranks[it->rank_begin + k];
            if (m < 0 || m >= p->n_ranks)
                bad = bs_fail("simulate: item %d: rank %d out of range [0, %d)", i, m, p->n_ranks);
            else count[m]++;
        }
    }
    for (int32_t r = 0; r < p->n_ranks && !bad; r++)
        if (count[r] != p->rank_begin[r + 1] - p->rank_begin[r])
            bad = bs_fail("simulate: rank %d is named by %d items but its schedule lists %d (plan not finalized?)", r,
                          count[r], p->rank_begin[r + 1] - p->rank_begin[r]);
    free(count);
    return bad ? -1 : 0;
}

void sim_result_free(SimResult *r) {
    free(r->busy);
    free(r->comm);
    free(r->wait);
    free(r->offload);
    free(r->stage_sync_start);
    free(r->stage_sync);
    free(r->ops);
    free(r->res_begin);
    free(r->res_ops);
    memset(r, 0, sizeof *r);
}

// The result's arrays: per resource (rank x stage: r * pp + s), per stage, per operation. 0, or -1 +
// error (sim_result_free frees whatever was allocated).
static int result_alloc(SimResult *out, const Plan *p, int pp, int32_t n_ops) {
    int n_res = p->n_ranks * pp;
    out->n_ranks = p->n_ranks;
    out->pp = pp;
    out->n_res = n_res;
    out->n_ops = n_ops;
    out->busy = bs_calloc((size_t)n_res, sizeof(double));
    out->comm = bs_calloc((size_t)n_res, sizeof(double));
    out->wait = bs_calloc((size_t)n_res, sizeof(double));
    out->offload = bs_calloc((size_t)n_res, sizeof(double));
    out->stage_sync_start = bs_calloc((size_t)pp, sizeof(double));
    out->stage_sync = bs_calloc((size_t)pp, sizeof(double));
    out->ops = bs_calloc((size_t)n_ops, sizeof(SimOp));
    out->res_begin = bs_calloc((size_t)n_res + 1, sizeof(int32_t));
    out->res_ops = bs_calloc((size_t)(2 * pp) * (size_t)p->n_refs, sizeof(int32_t));
    if (!out->busy || !out->comm || !out->wait || !out->offload || !out->stage_sync_start || !out->stage_sync ||
        !out->ops || !out->res_begin || !out->res_ops)
        return -1;
    return 0;
}

// The timeline's working arrays.
typedef struct {
    int32_t *slot;   // (n_items,) the earliest round each item can be in
    int32_t *wave;   // (n_items + 1,) the barrier wave each item is in
    OpKey *keys;     // (n_ops,) every (item, stage, direction), in execution order once sorted
    int32_t *fill;   // (n_res,) operations listed so far in each resource's res_ops
    double *freet;   // (n_res,) when each resource is next free
    double *f_end;   // (n_items,) when the item's forward so far ended (the latest stage's)
    double *b_end;   // (n_items,) the same for its backward
} Timeline;

static int timeline_alloc(Timeline *tl, int32_t n_items, int n_res, int32_t n_ops) {
    tl->slot = bs_calloc((size_t)n_items, sizeof(int32_t));
    tl->fill = bs_calloc((size_t)n_res, sizeof(int32_t));
    tl->freet = bs_calloc((size_t)n_res, sizeof(double));
    tl->f_end = bs_calloc((size_t)n_items, sizeof(double));
    tl->b_end = bs_calloc((size_t)n_items, sizeof(double));
    tl->wave = bs_calloc((size_t)n_items + 1, sizeof(int32_t));
    tl->keys = bs_calloc((size_t)n_ops, sizeof(OpKey));
    if (!tl->slot || !tl->fill || !tl->freet || !tl->f_end || !tl->b_end || !tl->keys || !tl->wave) return -1;
    return 0;
}

static void timeline_free(Timeline *tl) {
    free(tl->slot);
    free(tl->fill);
    free(tl->freet);
    free(tl->f_end);
    free(tl->b_end);
    free(tl->wave);
    free(tl->keys);
}

// The operations in execution order. Slots: the earliest "round" an item can be in, given the items
// before it on its ranks; at a barrier (Plan.barriers) they jump past every key of the earlier waves
// (plan_pipeline_slots). Then 1F1B on every stage: forward s of slot t at key 2(t + s), backward at
// 2(t + pp) - 1.
static int order_ops(Timeline *tl, const Plan *p, int pp, int32_t n_ops) {
    int32_t n_items = p->n_items;
    if (plan_pipeline_slots(p, tl->slot) != 0) return -1;
    for (int32_t i = 0, w = 0; i < n_items; i++) {
        while (w < p->n_barriers && p->barriers[w] <= i) w++;
        tl->wave[i] = w;
    }
    int32_t k = 0;
    for (int32_t i = 0; i < n_items; i++)
        for (int s = 0; s < pp; s++) {
            tl->keys[k++] = (OpKey){2 * ((int64_t)tl->slot[i] + s), i, (int16_t)s, 0};
            tl->keys[k++] = (OpKey){2 * ((int64_t)tl->slot[i] + pp) - 1, i, (int16_t)s, 1};
        }
    qsort(tl->keys, (size_t)n_ops, sizeof *tl->keys, opkey_cmp);
    return 0;
}

// Each resource's slice of res_ops: every stage of rank r runs 2 operations per item of r.
static void list_resources(SimResult *out, const Plan *p, int pp) {
    for (int r = 0; r < p->n_ranks; r++)
        for (int s = 0; s < pp; s++) {
            int res = r * pp + s;
            out->res_begin[res + 1] = out->res_begin[res] + 2 * (p->rank_begin[r + 1] - p->rank_begin[r]);
        }
}

// Every operation in order: ready when its input arrives (the previous stage's forward, the next
// stage's backward, plus the hop between them), started when every member's stage is also free,
// and charged to those resources. A wave's first operation waits for the last end of the waves
// before it: sorted by keys, they all came first.
static void run_ops(SimResult *out, const Plan *p, const SimConfig *cfg, Timeline *tl) {
    const Cluster *c = cfg->cluster;
    int pp = c->pp;
    double all_end = 0, floor_t = 0;
    int32_t cur_wave = 0;
    for (int32_t o = 0; o < out->n_ops; o++) {
        OpKey ok = tl->keys[o];
        const Item *it = &p->items[ok.item];
        const int32_t *members = p->ranks + it->rank_begin;
        int s = ok.stage;
        if (tl->wave[ok.item] > cur_wave) cur_wave = tl->wave[ok.item], floor_t = all_end;
        double ready;
        double hop = 0;
        if (!ok.bwd && s > 0) hop = stage_hop(cfg, p, it, s - 1, s);
        if (ok.bwd && s < pp - 1) hop = stage_hop(cfg, p, it, s + 1, s);
        if (!ok.bwd) ready = s == 0 ? floor_t : tl->f_end[ok.item] + hop;
        else ready = s == pp - 1 ? tl->f_end[ok.item] : tl->b_end[ok.item] + hop;
        out->stage_msgs += hop;
        double start = ready;
        for (int m = 0; m < it->n_ranks; m++) start = fmax(start, tl->freet[members[m] * pp + s]);
        SimOpCost oc = sim_op_cost(cfg, p, ok.item, s, ok.bwd);
        double end = start + oc.compute + oc.comm + oc.offload;
        all_end = fmax(all_end, end);
        for (int m = 0; m < it->n_ranks; m++) {
            int res = members[m] * pp + s;
            out->wait[res] += start - tl->freet[res];
            out->busy[res] += oc.compute;
            out->comm[res] += oc.comm + oc.offload;
            out->offload[res] += oc.offload;
            tl->freet[res] = end;
            out->res_ops[out->res_begin[res] + tl->fill[res]++] = o;
        }
        if (ok.bwd) tl->b_end[ok.item] = end;
        else tl->f_end[ok.item] = end;
        out->ops[o] = (SimOp){ok.item, ok.stage, ok.bwd, ready, start, oc};
        double devices = (double)it->n_ranks * c->tp;
        out->ring_bytes += oc.ring_bytes * devices;
        out->offload_bytes += oc.offload_bytes * devices;
        out->exposed_comm += oc.comm * it->n_ranks;
        out->exposed_offload += oc.offload * it->n_ranks;
        out->exposed_tp += oc.tp * it->n_ranks;
    }
    for (int32_t i = 0; i < p->n_items; i++) out->n_rings += p->items[i].n_ranks >= 2;
}

// Gradient sync per stage, once every rank's stage is done; then the optimizer step. The step ends
// with the slowest stage; every resource waits for its stage's sync and then for that end.
static void sync_and_step(SimResult *out, const SimConfig *cfg, const double *freet) {
    const Cluster *c = cfg->cluster;
    const CostModel *cm = cfg->cm;
    int pp = out->pp, N = out->n_ranks;
    double step = 0;
    for (int s = 0; s < pp; s++) {
        double t = 0;
        for (int r = 0; r < N; r++) t = fmax(t, freet[r * pp + s]);
        out->stage_sync_start[s] = t;
        out->stage_sync[s] = cfg->model ? cluster_sync_time(c, s, stage_grad_bytes(cfg, s)) : cm->grad_sync;
        out->compute_end = fmax(out->compute_end, t);
        out->sync_time = fmax(out->sync_time, out->stage_sync[s]);
        step = fmax(step, t + out->stage_sync[s] + cm->optimizer);
    }
    for (int r = 0; r < N; r++)
        for (int s = 0; s < pp; s++) {
            int res = r * pp + s;
            double end_s = out->stage_sync_start[s] + out->stage_sync[s] + cm->optimizer;
            out->wait[res] += (out->stage_sync_start[s] - freet[res]) + (step - end_s);
            out->comm[res] += out->stage_sync[s];
            out->busy[res] += cm->optimizer;
        }
    out->step_time = step;
    out->optimizer_time = cm->optimizer;
}

// The step's totals: tokens trained (less the delayed sequences), throughput, MFU, the spreads.
static void summarize(SimResult *out, const Plan *p, const SimConfig *cfg) {
    double step = out->step_time;
    out->tokens = (double)p->batch.n_tokens;
    for (int32_t d = 0; d < p->n_delayed; d++) out->tokens -= (double)p->batch.seqs[p->delayed[d]].len;  // not trained
    out->tokens_per_s = step > 0 ? out->tokens / step : 0;
    if (cfg->model) out->model_flops = sim_model_flops(cfg->model, p);
    if (cfg->model && cfg->hw && step > 0 && cfg->hw->peak_flops > 0)
        out->mfu = out->model_flops / (step * cfg->cluster->n_gpus * cfg->hw->peak_flops);
    out->busy_spread = spread_of(out->busy, out->n_res);
    out->comm_spread = spread_of(out->comm, out->n_res);
    out->wait_spread = spread_of(out->wait, out->n_res);
}

int sim_run(SimResult *out, const Plan *p, const SimConfig *cfg) {
    memset(out, 0, sizeof *out);
    if (check_inputs(p, cfg) != 0) return -1;
    // N * pp <= the cluster's GPUs (check_inputs matched N to it; cluster_init bounds those), but
    // the operation counts grow with the plan's items, which a file may make arbitrarily many
    int pp = cfg->cluster->pp;
    int64_t ops64 = 2 * (int64_t)pp * p->n_items, refs64 = 2 * (int64_t)pp * p->n_refs;
    if (p->n_items < 0 || p->n_refs < 0 || ops64 > INT32_MAX || refs64 > INT32_MAX)
        return bs_fail("simulate: %d items with %d rank refs on %d pipeline stages are more operations than the "
                       "simulator takes (%d)",
                       p->n_items, p->n_refs, pp, INT32_MAX);
    int32_t n_ops = (int32_t)ops64;
    Timeline tl = {0};
    int rc = -1;
    if (result_alloc(out, p, pp, n_ops) != 0 || timeline_alloc(&tl, p->n_items, out->n_res, n_ops) != 0) goto done;
    if (order_ops(&tl, p, pp, n_ops) != 0) goto done;
    list_resources(out, p, pp);
    run_ops(out, p, cfg, &tl);
    sync_and_step(out, cfg, tl.freet);
    summarize(out, p, cfg);
    rc = 0;
done:
    timeline_free(&tl);
    if (rc != 0) sim_result_free(out);
    return rc;
}
