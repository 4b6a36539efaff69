// cost.h: the cost model every planner and the simulator share (docs/cost-model.md).
//
// Per layer and per HDP rank (one rank = TP x PP devices):
//   compute  T(s)   = a1*s^2 + b1*s + c     seconds, forward + backward of one layer for one
//                                           sequence of s tokens (causal: area s(s+1)/2)
//   memory   Act(s) = a2*s + b2             activation bytes of one layer kept for backward
// Attention work is counted by the exact masked area (visible (query, key) pairs), so the
// quadratic term is a1 = 2 * (attention seconds per visible pair) and a pack of segments costs
// the sum over its segments, not (sum of lengths)^2.
#ifndef BYTESCALE_COST_H
#define BYTESCALE_COST_H

#include <stddef.h>
#include <stdint.h>

#include "bytescale/hw.h"
#include "bytescale/model.h"
#include "bytescale/export.h"

BS_API_BEGIN

typedef struct {
    // compute, seconds per layer per rank (forward + backward)
    double attn_pair;     // per visible (query, key) pair;  a1 = attn_pair / 2
    double lin_token;     // per token (linear layers, norms, MLP); b1 = lin_token + attn_pair / 2
    double layer_const;   // c: fixed per-layer overhead per micro-batch (kernel launches)
    // memory
    double act_token;     // a2: activation bytes per token per layer
    double act_const;     // b2
    int n_layers;         // l: layers per rank (model layers / pipeline stages)
    // communication
    double kv_token;      // bytes of K and V per token per layer (GQA aware, TP-sharded)
    double ring_bw;       // bytes/s of the link a ring step uses (the planner assumes the slower level)
    double ring_lat;      // seconds per ring message
    double offload_bw;    // min(B_out, B_in): bytes/s of the offload tier
    // whole step
    double grad_sync;     // seconds for ZeRO-1 reduce-scatter + all-gather over all HDP ranks
    double optimizer;     // seconds for the optimizer step on a rank's shard
    double capacity_bytes;// activation memory per rank at capacity C: cost_rank_act(C, 0) (derived: l * Act(C));
                          // informative: Eq. 3 computes its budget from C (cost_act_budget)
    // added after the first draft: the faster link for rings that fit inside one node. A ring of
    // D <= ranks_per_node consecutive ranks uses ring_bw_intra / ring_lat_intra, any other ring
    // ring_bw / ring_lat. ranks_per_node <= 1 or ring_bw_intra <= 0 (a hand-built model) means
    // every ring uses ring_bw. A zero ring_bw or offload_bw means "not modelled" (free).
    double ring_bw_intra;  // bytes/s per device per direction inside a node (NVLink)
    double ring_lat_intra; // seconds per message inside a node
    int ranks_per_node;    // HDP ranks per node: gpus_per_node / tp
    // added with `bytescale profile`, which measures them on the engine (a derived model leaves them
    // 0: on a GPU the shared buffers are kernel workspace and the head is a few percent of a deep
    // model). Optional in a file, 0 when absent.
    double act_shared_token; // bytes per token of the activation buffers all layers share (the head's
    double act_shared_const; // input, backward scratch): held once per rank, never offloaded
    double head_token;       // seconds per token of the embedding, output head and loss, forward +
    double head_const;       // backward: once per micro-batch (not per layer), on the last stage
    // added with flexsp (docs/peers.md): bytes per token per layer one rank's forward all-to-alls move
    // in Ulysses sequence parallelism (Q, K, V in, the attention output back; TP-sharded). Derived
    // only, not a field of cost files: 0 (a loaded file) stands for 2 x kv_token, Q and O taken as
    // large as K and V (exact without grouped-query attention, low with it).
    double a2a_token;
    // added with the head limit of flexsp's Ulysses groups (docs/peers.md): the attention heads of one
    // TP shard, query and K/V. Ulysses scatters the query heads over a group, so a group has at most
    // a2a_heads members (uneven splits allowed: the member with ceil(a2a_heads / D) heads sets the
    // time); with fewer K/V heads than members each K/V head is replicated so that every member gets
    // the one its query heads share (cost_a2a_bytes counts the copies). Derived only: 0 (a loaded
    // file, which does not know the model) means not known: no limit, no replication.
    int a2a_heads;
    int a2a_kv_heads;
    // added with the ring-step floor (docs/cost-model.md section 4): seconds one attention block costs
    // per layer, forward + backward, on top of its pairs (kernel launches and fixed work; the H100's
    // fused attention: ~0.25 ms below ~1K tokens per chunk, whatever the FLOPs). A layer of a pack
    // computes one block, a member of a ring of D ranks D blocks (one per ring step), a member of an
    // all-to-all group one. Split forward / backward like the rest of the layer. Optional in a file, 0
    // when absent (not modelled); TP does not shrink it (every TP device launches its own kernel).
    double attn_step;
    // added with the 3D cost terms (docs/cost-model.md section 4, "Tensor and pipeline parallelism"):
    // the links a TP group's all-reduces and a pipeline's stage-to-stage messages use. A TP all-reduce
    // of b bytes over T ranks is a ring: 2 (T-1)/T b / tp_bw + 2 (T-1) tp_lat; a stage message of b
    // bytes b / stage_bw + stage_lat. Optional in a file: a file without them (written before they
    // existed) takes ring_bw_intra / ring_lat_intra for both, the link its ranks measured. 0 (a
    // hand-built model, or stage_bw of cost_derive) means: TP all-reduces free, stage messages priced by
    // the simulator's cluster (its placement knows which stages share a node).
    double tp_bw;      // bytes/s per device of the TP group's all-reduce (bus bandwidth, inside a node)
    double tp_lat;     // seconds per step of that all-reduce (a ring all-reduce makes 2 (T-1) steps)
    double stage_bw;   // bytes/s of one stage-to-stage message (activations forward, gradients backward)
    double stage_lat;  // seconds per stage-to-stage message
    // Derived only (cost_derive, cost_shard; 0 in a loaded file: no TP, no stage bytes). tp: the TP
    // group's size. tp_token: bytes per token of one all-reduce of the residual stream (d_model
    // elements). stage_token: bytes per token of one stage message (d_model elements; / tp on a GPU,
    // where sequence parallelism splits them). tp_hide_qkv, tp_hide_mlp: the weight-gradient compute
    // each backward all-reduce overlaps, as a fraction of lin_token (the dW of wq, wk, wv; of w_gate,
    // w_up: a third of those matmuls' forward + backward).
    int tp;
    double tp_token;
    double stage_token;
    double tp_hide_qkv;
    double tp_hide_mlp;
    // Derived only: 1 (cost_derive, cost_shard with pp = 1) when cost_item_time charges the head's
    // all-reduces (cost_tp_head_times, both ends: one stage holds the whole model). With pp > 1 they
    // are on the first and last stage only, which a per-stage estimate cannot tell apart: 0, and the
    // simulator charges them where they run.
    int tp_head;
    // Set by cost_load when the file lacked the 3D link fields and they were taken from
    // ring_bw_intra / ring_lat_intra: 1 tp_bw, 2 stage_bw (both: 3); the commands say so.
    int derived_3d;
} CostModel;

// Derive from a model and hardware. tp and pp >= 1; hdp_ranks = devices / (tp * pp), used for the
// gradient sync estimate; capacity C (tokens) sets the memory budget l * Act(C).
int cost_derive(CostModel *cm, const ModelConfig *m, const HardwareProfile *hw, int tp, int pp, int hdp_ranks,
                int64_t capacity);
// Load / save the coefficients as JSON (a measured profile: `bytescale profile`, docs/profile.md).
int cost_load(CostModel *cm, const char *path);
int cost_save(const CostModel *cm, const char *path);
// The file's numbers (all but n_layers and ranks_per_node) by name, in the order cost_save writes
// them: i in [0, cost_field_count()); outside it NULL / 0.
int cost_field_count(void);
const char *cost_field_name(int i);
double cost_field_value(const CostModel *cm, int i);

// A profile measures one process running every layer of the model; one stage of pp runs the layers
// of the largest stage (ceil(n_layers / pp)), and one of tp tensor-parallel processes about 1/tp of
// each layer's and the head's work and K/V, plus its all-reduces (cost_tp_layer_times: tp, tp_token,
// tp_hide_* set for the engine's fp32 residual stream) and the stage messages (stage_token: the
// engine sends rows x d_model floats). Applied to a cost model loaded for a whole model of m when it
// plans or simulates a 3D layout; for tp = pp = 1 only the derived byte counts and the heads of a
// shard (a2a_heads, a2a_kv_heads, a2a_token: what an all-to-all group splits and moves) are set.
void cost_shard(CostModel *cm, const ModelConfig *m, int tp, int pp);

// The fields cost_load took from the intra-node link (derived_3d), for a note: "tp_bw, tp_lat",
// "stage_bw, stage_lat", both, or NULL when the file had them.
const char *cost_derived_3d_fields(const CostModel *cm);
// The derived-only 3D terms (tp, tp_head, tp_token, stage_token, tp_hide_*) of model m on tp x pp,
// its residual stream in elem_bytes; seq_parallel: the stage message is split over the TP group
// (Megatron's sequence parallelism, what cost_derive assumes), else every TP rank sends all of it
// (the engine). cost_derive and cost_shard call it; so does a command that loads a file (which
// cannot hold these terms) for a layout.
void cost_layout_3d(CostModel *cm, const ModelConfig *m, int tp, int pp, int elem_bytes, int seq_parallel);
// One TP all-reduce of the residual stream of `rows` tokens: a ring over cm->tp ranks of rows x
// tp_token bytes, 2 (T-1)/T bytes / tp_bw + 2 (T-1) tp_lat. 0 with tp <= 1 or tp_bw 0.
double cost_tp_allreduce(const CostModel *cm, double rows);
// What one layer's all-reduces add to a rank's time for a micro-batch of `rows` tokens: forward, the
// two after wo and w_down, exposed; backward, the two of the input gradients of wq/wk/wv and of
// w_gate/w_up, each overlapping that matmul's weight gradient: max(0, allreduce - dW) each.
void cost_tp_layer_times(const CostModel *cm, double rows, double *fwd, double *bwd);
// The all-reduces outside the layers, once per micro-batch: forward on the first stage, the
// vocabulary-parallel embedding's sum (one cost_tp_allreduce); backward on the last stage, the
// vocabulary-parallel loss's row max (4 bytes a row) and exp-sum with target logit (8 bytes a row),
// and the head's input gradient (one cost_tp_allreduce). All exposed. 0 with tp <= 1.
void cost_tp_head_times(const CostModel *cm, double rows, int first, int last, double *fwd, double *bwd);
// One stage-to-stage message of `rows` tokens: rows x stage_token / stage_bw + stage_lat; 0 when
// stage_bw is 0 (not modelled here: the simulator's cluster prices it).
double cost_stage_transfer(const CostModel *cm, double rows);

// FLOPs of one layer's forward pass (backward is counted as 2x forward where FLOPs are reported).
double cost_linear_flops_per_token(const ModelConfig *m);      // projections + MLP (active experts)
double cost_attn_flops_per_pair(const ModelConfig *m);         // QK^T and PV per visible pair
double cost_head_flops_per_token(const ModelConfig *m);        // output head (not per layer)
// Model FLOPs of one training pass (forward + backward = 3x forward) over a pack of causal
// segments: every layer's linear and attention work plus the output head. For MFU.
double cost_train_flops(const ModelConfig *m, const int64_t *segs, int n_segs);
// Visible (query, key) pairs of a causal segment of s tokens: s(s+1)/2.
double cost_causal_area(int64_t s);

// T(s) and Act(s) of one layer (T: one sequence as a pack, so one attention block: attn_step once).
double cost_layer_time(const CostModel *cm, int64_t s);
double cost_layer_act(const CostModel *cm, int64_t s);
// The embedding, head and loss of a micro-batch of n tokens: head_token * n + head_const.
double cost_head_time(const CostModel *cm, double n);
// Activation bytes one rank holds for a micro-batch of n tokens at offload ratio r: the shared
// buffers plus every layer's Act(n) (r = 0 or l <= 2), or two whole layers and (1-r) of the other
// l-2 (Eq. 3's 2 + (1-r)(l-2)).
double cost_rank_act(const CostModel *cm, double n, double r);
// Eq. 3's budget per rank for capacity C: what C tokens hold without offloading, cost_rank_act(C, 0)
// (the paper's l Act(C) with the shared buffers). A memory budget enters through C: C is the most
// tokens the budget holds without offloading (train --mem-budget derives it so).
double cost_act_budget(const CostModel *cm, int64_t C);
// The capacity a memory budget gives: the most tokens, up to `most`, whose micro-batch holds at most
// `budget` bytes without offloading (cost_rank_act(C, 0) <= budget); 0 when not even one token fits.
int64_t cost_capacity_for(const CostModel *cm, double budget, int64_t most);
// Micro-batches a pipeline stage holds at once between their forward and their backward: 1F1B runs
// pp - 1 - stage warm-up forwards on stage `stage` before its first backward, so pp - stage are in
// flight there, or all n_micro of the step when it has fewer (n_micro <= 0: not known, as many as
// 1F1B can hold). 1 without stages. The simulator's memory walk reaches exactly this (sim.h); the
// engine's memory budget per process is shared by this many (train --mem-budget).
int cost_pipe_in_flight(int pp, int stage, int64_t n_micro);
// The most tokens one rank can hold at r = 1 with capacity C: C when the model cannot offload (l <= 2).
double cost_max_offload_tokens(const CostModel *cm, int64_t C);

// The planner's estimate of one item's per-rank time, seconds, all l layers, forward + backward:
// segs: lengths of the item's subsequences; D: ranks in its ring (1 = a pack on one rank);
// r: offload ratio. A ring pays, per layer, D steps of max(attention block compute, K/V transfer)
// (backward also moves dK/dV) with one transfer exposed (the dK/dV returning home at the end of
// backward); offload copies that compute cannot hide are added, and the head once (cost_head_time of
// the rank's tokens/D); with tp > 1 every layer adds its all-reduces (cost_tp_layer_times of the
// rank's tokens/D) and, when tp_head (pp = 1), the head its (cost_tp_head_times, both ends).
// docs/cost-model.md has the formula.
double cost_item_time(const CostModel *cm, const int64_t *segs, int n_segs, int D, double r);

// What every kind of item (ring, all-to-all group, hybrid) shares for the same segments on D
// members: the tokens and visible pairs, the TP all-reduces of a member's tokens / D rows per layer,
// and the head with its TP collectives. Choosing among the kinds of one item (policy_item_choice)
// computes them once; cost_*_terms_time give exactly what cost_item_time, cost_a2a_item_time and
// cost_hybrid_item_time give for the same arguments (those are these, with the terms made first).
typedef struct {
    double tokens, area;              // sum of the segments' lengths and of their causal areas
    int D;                            // members (>= 1)
    double tp_fwd, tp_bwd;            // cost_tp_layer_times(tokens / D)
    double head, head_fwd, head_bwd;  // cost_head_time(tokens / D) and cost_tp_head_times (both ends)
} ItemTerms;
void cost_item_terms(const CostModel *cm, const int64_t *segs, int n_segs, int D, ItemTerms *t);
double cost_ring_terms_time(const CostModel *cm, const ItemTerms *t, double r);         // a ring (D = 1: a pack)
double cost_a2a_terms_time(const CostModel *cm, const ItemTerms *t, double off);       // D = 1: the pack
double cost_hybrid_terms_time(const CostModel *cm, const ItemTerms *t, int u, double off);  // u divides D

// One member of a block item (the block peer, docs/peers.md): what it owns, computes and receives,
// in tokens and (query, key) pairs per layer. plan_blocks_loads derives it from a plan.
typedef struct {
    double tokens;        // tokens it owns (its queries and its K/V)
    double local_pairs;   // causal pairs of its queries against its own keys
    double remote_pairs;  // causal pairs of its queries against the keys it receives
    double kv_intra, kv_inter;    // K/V tokens it receives from owners on its node / on other nodes
    double dkv_intra, dkv_inter;  // backward: dK/dV tokens of its own blocks reduced to it, the same split
    int32_t src_intra, src_inter; // one rank it receives from on its node / elsewhere (-1: none)
} BlockLoad;
// One layer of a block item's member, forward and backward, seconds, TP all-reduces included: the K/V
// of the remote blocks arrive while it computes its local attention (intra- and inter-node bytes on
// their own links at once), then it computes the remote part; backward the same with the K/V fetched
// again, then the partial dK/dV reduced to their owners, exposed. No offloading.
void cost_blocks_layer_times(const CostModel *cm, const BlockLoad *ld, double *fwd, double *bwd);
// The member's planner estimate, all l layers forward + backward plus the head (as cost_item_time).
double cost_blocks_member_time(const CostModel *cm, const BlockLoad *ld);

// The same estimate for an item run as a Ulysses all-to-all group of D ranks (flexsp, docs/peers.md,
// docs/cost-model.md): every member holds tokens/D of every segment, computes the attention of 1/D of
// the heads over whole segments (no causal imbalance, no ring steps), and per layer waits for the
// all-to-alls, forward and backward alike: a2a bytes x (D-1)/D of its tokens over the link a ring of
// D consecutive ranks would use, nothing hidden. D = 1 is cost_item_time's pack. Offloading a share
// `off` of the activations adds what cost_item_time adds for it: a member holds tokens / D of them.
// With the head count known, the attention share is cost_a2a_head_share and the bytes cost_a2a_bytes;
// D above a2a_heads is not checked here (plan_validate refuses such an item).
double cost_a2a_item_time(const CostModel *cm, const int64_t *segs, int n_segs, int D, double off);
// Bytes per token per layer of those all-to-alls: a2a_token, or 2 kv_token when that is 0.
double cost_a2a_token(const CostModel *cm);
// The same for a group of D members: cost_a2a_token, plus the replicated K/V heads when D exceeds
// a2a_kv_heads (each member then receives one K/V head: K and V move as D heads, not a2a_kv_heads).
double cost_a2a_bytes(const CostModel *cm, int D);
// The share of the attention the slowest member of a D-member group computes: ceil(a2a_heads / D) /
// a2a_heads (uneven heads), 1 / D when the head count is not known.
double cost_a2a_head_share(const CostModel *cm, int D);
// The largest all-to-all group: a2a_heads, or `most` when that is 0 (not known) or larger.
int cost_a2a_max(const CostModel *cm, int most);

// The same estimate for a hybrid item (Item.ulysses, docs/cost-model.md "Hybrid items"): a ring of r
// Ulysses groups of u consecutive ranks each, D = u r members holding tokens / D each. Per layer and
// direction a member waits for its group's all-to-all (cost_a2a_bytes(u) x (u-1)/u of its tokens, on
// the link of u consecutive ranks, nothing hidden), then runs a ring of r steps across the groups on
// its head share (cost_a2a_head_share(u)): each step the group's queries against one group block of
// keys (1/r^2 of the mask area), overlapped with the next block's K/V (the group's tokens, tokens / r,
// at kv_token x cost_hybrid_kv_share(u) bytes a token) on the link D consecutive ranks use, as a ring
// (cost_item_time): backward twice the bytes and one exposed dK/dV hop. Linear layers, TP terms and
// the head as cost_item_time for tokens / D; offloading `off` as cost_a2a_item_time. u = 1 is
// cost_item_time's ring of r; r = 1 is cost_a2a_item_time(u). u above a2a_heads is not checked here
// (plan_validate refuses it).
double cost_hybrid_item_time(const CostModel *cm, const int64_t *segs, int n_segs, int u, int r, double off);
// The share of kv_token a member of a Ulysses group of u holds per token after the all-to-all:
// ceil(a2a_kv_heads / u) / a2a_kv_heads (one replicated head, 1 / a2a_kv_heads, when u exceeds them),
// 1 / u when the head count is not known (0), 1 for u = 1.
double cost_hybrid_kv_share(const CostModel *cm, int u);
// The hybrids a D-member item may be: group sizes u with 2 <= u < D that divide D and `heads` (the
// query heads of a TP shard, so every member of a group gets the same heads), increasing. Those are
// the divisors below D of g = cost_gcd(D, heads); cost_hybrid_next(u, g, D) is the first after u
// (start from u = 1), 0 after the last. (Testing D and the heads at every u up to the heads cost two
// integer divisions per u, most of the time of costing a sequence at every width.)
int cost_gcd(int a, int b);  // a, b >= 1
int cost_hybrid_next(int u, int g, int D);

// Every field of the cost model >= 0 (none NaN) and at least one layer: then no term of an item's
// time is negative, the premise of cost_item_floor and of the planners' bounds.
int cost_fields_nonneg(const CostModel *cm);
// One sequence's compute, forward and backward, with no ring and no per-micro-batch constant: every
// layer's attention (attn_pair x its causal area) and linear layers (lin_token x s), and the head
// (head_token x s).
double cost_seq_work(const CostModel *cm, int64_t s);
// What every (item, member) slot pays once whatever it holds: each layer's constant and one
// attention call's floor (attn_step), and the head's constant.
double cost_slot_const(const CostModel *cm);
// A floor under the time of one sequence of s tokens on D ranks, whatever its kind (ring,
// all-to-all group, hybrid) and offload ratio, when cost_fields_nonneg holds: every member does at
// least 1/D of the sequence's compute (attention, linear layers, head) and pays each layer's
// constant, one attention call's floor (attn_step) per layer and the head's constant:
// cost_seq_work / D + cost_slot_const. In exact arithmetic; a caller comparing it with computed times leaves room for their rounding.
double cost_item_floor(const CostModel *cm, int64_t s, int D);

// Eq. 3 of the paper (docs/cost-model.md section 5): the fewest ranks D(s) that can hold a sequence of s
// tokens with capacity C, and the offload ratio r that achieves it (0 without offloading).
// Returns D >= 1, or -1 + error when s does not fit even on max_ranks ranks.
int cost_min_ranks(const CostModel *cm, int64_t s, int64_t C, int offload, int max_ranks, double *r_out);
// Eq. 3 for one ring size: can D ranks of capacity C hold s tokens? 1 with *r = 0 when s <= D * C;
// else (offloading, l > 2) 1 with *r the least ratio in [0, 1] with cost_rank_act(s/D, r) <=
// cost_act_budget(C) whose copies hide (r <= cost_offload_hidden_max); else 0.
int cost_offload_ratio(const CostModel *cm, int64_t s, int64_t C, int D, double *r);
// Why cost_offload_ratio says no for (s, C, D), in words that name the cost model's terms and
// their values (the memory terms and the budget, or the copy bandwidth against the compute it must
// hide behind), into buf (for a planner's "fits on no ring" error). buf is returned.
const char *cost_offload_why(const CostModel *cm, int64_t s, int64_t C, int D, char *buf, size_t size);
// The largest offload ratio whose copies hide for a sequence of s tokens on a ring of D ranks: a
// layer's copy out (r Act(s/D) / offload_bw) takes no longer than the next layer's forward on that
// ring, ring steps included. The one definition of "the copy hides": cost_item_time charges
// exactly what exceeds it, so at r <= this the item costs what it costs without offloading.
// 1 when the tier is not modelled (offload_bw 0).
double cost_offload_hidden_max(const CostModel *cm, int64_t s, int D);

// Device memory with ZeRO-1 over all HDP ranks (docs/cost-model.md), bytes per device of the most
// loaded pipeline stage: parameters and gradients in elem_bytes replicated over HDP ranks and
// sharded by TP; fp32 master weights (only when elem_bytes < 4) and Adam m, v sharded over TP x HDP
// ranks; activations l*Act(C).
typedef struct {
    double param_bytes;
    double grad_bytes;
    double optimizer_bytes;
    double act_bytes;        // l * Act(C)
    double total_bytes;      // the sum of the four
    double mem_bytes;        // the device's memory (hw->mem_bytes)
    int fits;                // total_bytes <= mem_bytes
} CostMemory;
// Fills *out; -1 + error only for invalid arguments (a plan that does not fit is fits = 0).
int cost_memory(CostMemory *out, const ModelConfig *m, const HardwareProfile *hw, int tp, int pp, int hdp_ranks,
                int64_t capacity);

BS_API_END

#endif
