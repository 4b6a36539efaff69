"""Across implementations with all-to-all (Ulysses) and hybrid items: the torch trainer against the C
engine (`bytescale train`) on plans the C planner made with a2a and hybrid items, on 2, 3 and 4
ranks, with GQA, a packed item and TP 2 on the C side. Same weights (checkpoint 1), same batch and
plan (`--save-plans`), and the same loss within 1e-5 and gradients within 1e-4, read as
test_torch_vs_c.py reads them (its helpers; the gradients from two checkpoints' AdamW moments).

Where the plans come from. `--policy flexsp` plans a2a items (groups of a power of two of ranks, a
packed item where short sequences share one). `balance` picks a ring, an a2a group or a hybrid by the
cost model; on the `cpu` hardware profile the tiny model's rings always win, so the test writes a
cost file (`--cost`) for a machine whose ranks sit two to a node with a slow link between nodes and
a floor per attention call: under it the planner prefers a2a groups to rings of 2 and 3, and on 4
ranks a hybrid of 2 x 2 (an all-to-all inside each node, a ring of 2 across) to both the ring and
the a2a group of 4. The tiny model has 4 query and 2 K/V heads, so a group of u = 3 or 4 lies above the K/V
heads (replicated K/V), 3 cuts a GQA group, and a hybrid needs 4 ranks (u = 2 dividing D and the
heads). Every case asserts that the compared plan holds the kinds it names, and compare() that
every rank ran each item as the plan file says (a2a, hybrid, ring or pack), so none can pass on a
plan of rings and packs.

bytescale.torch has no tensor parallelism of its own (a user's TP shard is what it is given, and
ulysses.py splits its heads): under TP 2 the C job runs 2 processes per HDP rank, each with half
the heads (the planner's groups then split 2 query heads and 1 K/V head), and torch runs the same
plan on one process per HDP rank with the whole model. The checkpoints hold the whole model, so
the loss and gradients compare all the same.
"""

import json

import pytest

pytest.importorskip("torch")

from test_torch_vs_c import compare  # noqa: E402


def slow_network(tmp):
    """A cost file (docs/cost-model.md, section 6) of the tiny model on ranks two to a node: fast
    inside a node (10 GB/s), 1 MB/s between nodes, 0.1 ms per attention call. The activation terms
    are the engine's own (train replaces them)."""
    path = tmp / "slow-network.json"
    path.write_text(json.dumps({
        "version": 1, "n_layers": 2, "ranks_per_node": 2, "attn_pair": 4e-8, "lin_token": 1.5e-5,
        "layer_const": 5e-5, "attn_step": 1e-4, "act_token": 1000, "act_const": 0, "kv_token": 256,
        "ring_bw": 1e6, "ring_lat": 1e-4, "ring_bw_intra": 1e10, "ring_lat_intra": 1e-6, "offload_bw": 1e10,
        "grad_sync": 1e-3, "optimizer": 1e-4, "capacity_bytes": 1e6}))
    return str(path)


def kinds(items):
    """Every item of a plan file as (kind, ranks, segments, Ulysses group size)."""
    out = []
    for it in items:
        D, u = len(it["ranks"]), int(it.get("ulysses", 0))
        if D == 1:
            out.append(("pack", D, len(it["segments"]), 0))
        elif u:
            out.append(("hybrid", D, len(it["segments"]), u))
        elif it.get("a2a"):
            out.append(("a2a", D, len(it["segments"]), D))
        else:
            out.append(("ring", D, len(it["segments"]), 0))
    return out


def has(items, kind, ranks=None, packed=False, u=None):
    return any(k == kind and (ranks is None or D == ranks) and (not packed or n > 1) and (u is None or g == u)
               for k, D, n, g in kinds(items))


def test_flexsp_two_ranks_packed(tmp_path):
    """flexsp on 2 ranks: a2a groups of 2, one of them a packed item of two sequences."""
    items = compare(tmp_path, 2, 128, ["--policy", "flexsp"], case="flexsp")
    assert has(items, "a2a", 2), kinds(items)
    assert has(items, "a2a", 2, packed=True), kinds(items)


def test_balance_three_ranks_a2a_of_three(tmp_path):
    """balance on 3 ranks, slow network: a2a groups of all 3 ranks beside packs. 3 members, above
    the 2 K/V heads, split the 4 query heads 1, 1, 2 (head_split): members 0 and 1 both use K/V
    head 0 (replicated; its GQA group of heads 0-1 cut between them), member 2 K/V head 1."""
    items = compare(tmp_path, 3, 86, ["--policy", "balance", "--cost", slow_network(tmp_path)], case="balance")
    assert has(items, "a2a", 3), kinds(items)


def test_flexsp_four_ranks_gqa_packed(tmp_path):
    """flexsp on 4 ranks: a2a groups of 4 (u = 4 above the 2 K/V heads: every K/V head sent to two
    members, their dK/dV summed back), one a packed item."""
    items = compare(tmp_path, 4, 64, ["--policy", "flexsp"], case="flexsp")
    assert has(items, "a2a", 4, packed=True), kinds(items)


def test_balance_four_ranks_hybrid(tmp_path):
    """balance on 4 ranks, slow network: hybrids of 2 groups of 2 (u = 2) beside packs."""
    items = compare(tmp_path, 4, 64, ["--policy", "balance", "--cost", slow_network(tmp_path)], case="balance")
    assert has(items, "hybrid", 4, u=2), kinds(items)


def test_flexsp_two_ranks_tp2(tmp_path):
    """flexsp on 2 HDP ranks x TP 2 (4 C processes): a2a groups of 2 on shards of 2 query heads and
    1 K/V head (u = 2 above it), one packed; torch on 2 processes, whole model."""
    items = compare(tmp_path, 2, 128, ["--policy", "flexsp", "--tp", "2"], tp=2, case="flexsp")
    assert has(items, "a2a", 2, packed=True), kinds(items)


def test_balance_four_ranks_hybrid_tp2(tmp_path):
    """balance on 4 HDP ranks x TP 2 (8 C processes), slow network: hybrids of 2 x 2 whose groups
    split a shard's 2 query heads, 1 each, over its one K/V head."""
    items = compare(tmp_path, 4, 64, ["--policy", "balance", "--tp", "2", "--cost", slow_network(tmp_path)], tp=2,
                    case="balance")
    assert has(items, "hybrid", 4, u=2), kinds(items)
