"""The Python plan is the C plan: for random batches and every policy, bytescale.plan() gives exactly
the plan `bytescale plan --lengths FILE --out FILE` writes (the same items, ranks, segments, offload
ratios and estimates, bit for bit), and what the package derives from it (chunk ranges, schedules,
offsets of cut pieces) is consistent with the plan."""

import json

import numpy as np
import pytest

import bytescale
from conftest import random_lengths

# cost models and shapes: pp 2, offloading off, a CPU-sized model, rings of up to 8 ranks
CONFIGS = [
    dict(ranks=16, capacity=4096, context=32768, pp=1, offload=True, model="llama-7b", hardware="h800-sxm", tp=2),
    dict(ranks=8, capacity=4096, context=32768, pp=1, offload=False, model="llama-7b", hardware="h100-sxm", tp=2),
    dict(ranks=12, capacity=2048, context=16384, pp=2, offload=True, model="llama-13b", hardware="h800-sxm", tp=4),
    dict(ranks=4, capacity=4096, context=16384, pp=1, offload=True, model="tiny", hardware="cpu", tp=1),
]
POLICIES = sorted(bytescale.policies())
# The peers' schedulers (docs/peers.md) add plan fields (barriers, delayed documents, all-to-all items):
# the package carries them (arrays barriers, delayed, item_a2a; Item.a2a; to_dict), and every policy,
# the peers too, is compared with the command's plan field by field.
PEERS = {"megatron-hcp", "wlb", "flexsp", "blocks", "blocks-all"}
WHOLE = [p for p in POLICIES if p != "wlb"]  # plans that train every token (wlb's leaves its delayed ones out)
ARRAYS = ["seq_id", "seq_len", "seq_src", "item_seg_begin", "item_n_segs", "item_rank_begin", "item_n_ranks",
          "item_offload", "item_tokens", "item_est_time", "seg_seq", "seg_start", "seg_len", "members", "rank_begin",
          "rank_items", "rank_busy", "barriers", "delayed", "item_a2a", "seg_owner", "item_ulysses"]


def cli_args(cfg, policy, lengths_path):
    args = ["plan", "--lengths", lengths_path, "--policy", policy]
    for key in ("ranks", "capacity", "context", "pp", "model", "hardware", "tp"):
        args += [f"--{key}", cfg[key]]
    if not cfg["offload"]:
        args.append("--no-offload")  # (the command refuses --offload with static: on is its default)
    return args


# flexsp's programs stop at GLPK's time limit (docs/peers.md), so on a loaded machine two runs of the
# same batch can differ: its plans are compared by what holds whatever the solver found (below).
EXACT = [p for p in POLICIES if p != "flexsp"]


@pytest.mark.parametrize("seed", [1, 2])
@pytest.mark.parametrize("cfg", CONFIGS, ids=lambda c: f"{c['model']}-r{c['ranks']}-pp{c['pp']}-off{int(c['offload'])}")
@pytest.mark.parametrize("policy", EXACT)
def test_python_plan_is_the_commands_plan(policy, cfg, seed, tmp_path, lengths_file, run_cli):
    lengths = random_lengths(seed * 100 + len(policy), capacity=cfg["capacity"])
    out = tmp_path / "cli.json"
    summary = json.loads(run_cli(*cli_args(cfg, policy, lengths_file(lengths)), "--out", out, "--json"))["plans"][0]
    p = bytescale.plan(lengths, policy=policy, **cfg)

    # the plan file's content, field by field (floats exactly: the writer prints 17 digits)
    assert p.to_dict() == json.loads(out.read_text())
    # and the file itself: the package writes with the library's writer
    mine = tmp_path / "python.json"
    p.write(mine)
    assert mine.read_bytes() == out.read_bytes()
    # the command's summary of the same plan (to 15 digits: cJSON prints the summary's numbers with
    # %.15g when that reads back within a rounding step; the plan file above is exact)
    for key, value in (("items", p.n_items), ("makespan", p.makespan), ("lower_bound", p.lower_bound),
                       ("hdp_bound", p.hdp_bound), ("packs", p.stats["n_packs"]), ("rings", p.stats["n_rings"]),
                       ("idle_ranks", p.stats["idle_ranks"]), ("busy_min", p.stats["busy_min"]),
                       ("busy_median", p.stats["busy_median"]), ("busy_max", p.stats["busy_max"]),
                       ("ring_bytes", p.stats["ring_bytes"]), ("offload_items", p.stats["n_offload"])):
        assert summary[key] == pytest.approx(value, rel=1e-14, abs=0), key

    # the command's file read back by the library (no cost model: the file's estimates stand)
    q = bytescale.read_plan(out)
    for name in ARRAYS:
        np.testing.assert_array_equal(getattr(q, name), getattr(p, name), err_msg=name)
    assert (q.policy, q.n_ranks, q.pp, q.capacity, q.makespan, q.lower_bound) == \
           (p.policy, p.n_ranks, p.pp, p.capacity, p.makespan, p.lower_bound)
    # read with the cost model, the estimates are recomputed: the same numbers
    r = bytescale.read_plan(out, cost=p.cost)
    np.testing.assert_array_equal(r.item_est_time, p.item_est_time)
    assert (r.makespan, r.hdp_bound) == (p.makespan, p.hdp_bound)


@pytest.mark.parametrize("cfg", CONFIGS, ids=lambda c: f"{c['model']}-r{c['ranks']}-pp{c['pp']}-off{int(c['offload'])}")
def test_flexsp_python_and_command_plan_the_same_batch(cfg, tmp_path, lengths_file, run_cli):
    lengths = random_lengths(100 + len("flexsp"), capacity=cfg["capacity"])
    out = tmp_path / "cli.json"
    run_cli(*cli_args(cfg, "flexsp", lengths_file(lengths)), "--out", out)
    p = bytescale.plan(lengths, policy="flexsp", **cfg)
    # the command's file validates against the same cost model, and both plans train the same batch:
    # the same sequences, every token once, in items of the same layout
    q = bytescale.read_plan(out, cost=p.cost)
    np.testing.assert_array_equal(q.seq_len, p.seq_len)
    for plan in (p, q):
        assert plan.item_tokens.sum() == plan.n_tokens == p.seq_len.sum()
        assert (plan.policy, plan.n_ranks, plan.pp, plan.capacity) == ("flexsp", cfg["ranks"], cfg["pp"],
                                                                      cfg["capacity"])
        assert plan.makespan >= plan.lower_bound * (1 - 1e-12) or plan.item_a2a.any()


def test_plain_python_and_numpy_agree():
    p = bytescale.plan(random_lengths(7, capacity=4096), ranks=16, capacity=4096, context=32768)
    items = p.items
    assert len(items) == len(p) == p.n_items
    for k, it in enumerate(items):
        assert list(it.ranks) == p.members[p.item_rank_begin[k]:p.item_rank_begin[k] + p.item_n_ranks[k]].tolist()
        assert [tuple(s) for s in it.segments] == list(zip(
            *(a[p.item_seg_begin[k]:p.item_seg_begin[k] + p.item_n_segs[k]].tolist()
              for a in (p.seg_seq, p.seg_start, p.seg_len))))
        assert (it.offload, it.tokens, it.est_time) == (p.item_offload[k], p.item_tokens[k], p.item_est_time[k])
        assert it.tokens == sum(s.len for s in it.segments)
    # schedules: rank r runs exactly the items it is a member of, in increasing global order
    for r, sched in enumerate(p.schedules):
        assert sched == p.schedule(r) == [k for k, it in enumerate(items) if r in it.ranks]
    assert [s.len for s in p.sequences] == p.seq_len.tolist()
    assert p.seq_len.sum() == p.n_tokens
    with pytest.raises(ValueError):
        p.seq_len[0] = 1  # the arrays are read-only views of the plan


def plan_chunk(length, d, j):
    """docs/plan-format.md, "Chunk layout of a ring": 2D chunks, the first len mod 2D one token longer."""
    base, rem = divmod(length, 2 * d)
    return j * base + min(j, rem), base + (1 if j < rem else 0)


@pytest.mark.parametrize("policy", WHOLE)
def test_chunks_cover_every_token_once_in_global_order(policy):
    lengths = random_lengths(11, capacity=2048)
    p = bytescale.plan(lengths, ranks=12, capacity=2048, context=16384, policy=policy)
    c = p.chunk_arrays()
    assert c.len.min() > 0
    # every token of every sequence exactly once, over all ranks
    counts = [np.zeros(n, dtype=np.int32) for n in p.seq_len.tolist()]
    for seq, start, n in zip(c.seq.tolist(), c.start.tolist(), c.len.tolist()):
        counts[seq][start:start + n] += 1
    assert all((x == 1).all() for x in counts)
    items = p.items
    for r in range(p.n_ranks):
        mine = p.chunk_arrays(r)
        sel = c.rank == r
        for a, b in zip(mine[1:], c[1:]):  # one rank's ranges are its slice of everyone's
            np.testing.assert_array_equal(a, b[sel])
        assert (np.diff(mine.item) >= 0).all()  # the global order
        assert sorted(set(mine.item.tolist())) == p.schedule(r)
        assert p.chunks(r) == [bytescale.Chunk(*t) for t in zip(*(x.tolist() for x in mine[1:]))]
        # the layout: member i of a ring of D holds chunks i and 2D-1-i of every segment; of a block
        # item (blocks), the blocks it owns
        expect = []
        for k in p.schedule(r):
            it = items[k]
            d, i = len(it.ranks), it.ranks.index(r)
            for j, s in enumerate(it.segments):
                if it.owners is not None:
                    expect += [(k, s.seq, s.start, s.len)] if it.owners[j] == i else []
                    continue
                if d == 1:
                    expect.append((k, s.seq, s.start, s.len))
                    continue
                (a0, n0), (a1, n1) = plan_chunk(s.len, d, i), plan_chunk(s.len, d, 2 * d - 1 - i)
                parts = [(a0, n0 + n1)] if a0 + n0 == a1 else [(a0, n0), (a1, n1)]
                expect += [(k, s.seq, s.start + a, n) for a, n in parts if n > 0]
        assert list(zip(*(x.tolist() for x in mine[1:5]))) == expect


def test_pieces_cut_by_the_context_map_back_to_the_callers_sequences():
    lengths = np.array([100, 10000, 50, 4097, 4096], dtype=np.int64)
    p = bytescale.plan(lengths, ranks=4, capacity=2048, context=4096, model="tiny", hardware="cpu", tp=1)
    # 10000 -> 4096 + 4096 + 1808, 4097 -> 4096 + 1, each piece keeping its sequence's id
    assert p.seq_id.tolist() == [0, 1, 1, 1, 2, 3, 3, 4]
    assert p.seq_len.tolist() == [100, 4096, 4096, 1808, 50, 4096, 1, 4096]
    assert p.seq_offset.tolist() == [0, 0, 4096, 8192, 0, 0, 4096, 0]
    counts = [np.zeros(n, dtype=np.int32) for n in lengths.tolist()]
    c = p.chunk_arrays()
    for i, s, n in zip(c.id.tolist(), c.id_start.tolist(), c.len.tolist()):
        counts[i][s:s + n] += 1
    assert all((x == 1).all() for x in counts)
    # without a context nothing is cut
    q = bytescale.plan(lengths, ranks=8, capacity=2048, model="tiny", hardware="cpu", tp=1)
    assert q.seq_len.tolist() == lengths.tolist() and q.seq_offset.tolist() == [0] * 5


def test_cost_model_file_plans_as_the_command(tmp_path, lengths_file, run_cli):
    cost = bytescale.CostModel("llama-7b", "h100-sxm", tp=2, ranks=8, capacity=4096)
    path = tmp_path / "cost.json"
    cost.save(path)
    lengths = random_lengths(3, capacity=4096)
    out = tmp_path / "cli.json"
    run_cli("plan", "--lengths", lengths_file(lengths), "--ranks", 8, "--capacity", 4096, "--context", 32768,
            "--cost", path, "--out", out)
    for c in (path, bytescale.CostModel.load(path), cost):
        p = bytescale.plan(lengths, ranks=8, capacity=4096, context=32768, cost=c)
        assert p.to_dict() == json.loads(out.read_text())
    # the same coefficients derived: the same plan
    assert bytescale.plan(lengths, ranks=8, capacity=4096, context=32768, hardware="h100-sxm").to_dict() == \
        json.loads(out.read_text())
    assert cost.item_time([4096]) > cost.item_time([1024]) > 0
    assert cost.item_time([8192], ranks=2) < cost.item_time([8192])


def test_sampled_batches_are_the_commands(tmp_path, run_cli):
    lengths = bytescale.sample_lengths("byted", tokens=4 << 20, context=1 << 20, seed=5)
    assert lengths.sum() == 4 << 20 and lengths.max() <= 1 << 20
    out = tmp_path / "cli.json"
    run_cli("plan", "--dist", "byted", "--tokens", 4 << 20, "--context", 1 << 20, "--seed", 5, "--ranks", 64,
            "--out", out)
    cli = json.loads(out.read_text())
    assert [s["len"] for s in cli["sequences"]] == lengths.tolist()
    p = bytescale.plan(lengths, ranks=64, context=1 << 20)
    # the same plan; only the ids of cut pieces differ (the command's pieces share their document's)
    assert p.to_dict()["items"] == cli["items"]


@pytest.mark.parametrize("policy", sorted(PEERS))
def test_peers_plan(policy):
    p = bytescale.plan(random_lengths(5, capacity=2048), ranks=16, capacity=2048, context=16384, policy=policy)
    assert p.policy == policy and p.n_items > 0 and p.makespan > 0
    # one long document among short ones: wlb delays it (an outlier alone in its queue), megatron-hcp
    # gives it a wave of its own (a barrier), flexsp an all-to-all group of 8
    p = bytescale.plan([16384] + [512] * 128, ranks=16, capacity=2048, context=16384, policy=policy)
    # each peer's own field is there, and the others' are empty, in the arrays, the items and to_dict
    d = p.to_dict()
    assert (p.barriers.size > 0) == (policy == "megatron-hcp") == ("barriers" in d)
    assert (p.delayed.size > 0) == (policy == "wlb") == ("delayed" in d)
    assert p.item_a2a.shape == (p.n_items,) and p.item_a2a.any() == (policy == "flexsp")
    assert [it.a2a for it in p.items] == [bool(x) for x in p.item_a2a] == ["a2a" in it for it in d["items"]]
    if policy == "megatron-hcp":  # barriers increase inside the item list
        assert d["barriers"] == p.barriers.tolist() and 0 < p.barriers[0] and (np.diff(p.barriers) > 0).all()
        assert p.barriers[-1] < p.n_items
    if policy == "wlb":  # a delayed sequence is in no item
        held = set(p.seg_seq.tolist())
        assert not held & set(p.delayed.tolist()) and len(held) + p.delayed.size == p.n_seqs
    # block items (blocks): every segment of them has an owner among the item's members, no other does
    blocks = policy.startswith("blocks")
    assert (p.seg_owner >= 0).all() if blocks else (p.seg_owner == -1).all()
    assert all((it.owners is not None) == blocks == ("owners" in e) for it, e in zip(p.items, d["items"]))
    if blocks:  # a member's chunks are the blocks it owns
        for r in range(p.n_ranks):
            owned = sorted((s.seq, s.start, s.len) for it in p.items if r in it.ranks
                           for s, o in zip(it.segments, it.owners) if it.ranks[o] == r)
            assert sorted((c.seq, c.start, c.len) for c in p.chunks(r)) == owned
    if policy == "flexsp":  # an all-to-all group has at least 2 ranks, at most the heads of a TP shard (16)
        assert all(2 <= len(it.ranks) <= 16 for it in p.items if it.a2a)


def test_hybrid_items(tmp_path):
    """A hybrid item (a ring of 2 Ulysses groups of 2, docs/plan-format.md "ulysses") reads into
    item_ulysses and Item.ulysses, to_dict gives the file's JSON, the library's writer the same bytes,
    and the validator names a bad u."""
    plan = {"format": "bytescale-plan", "version": 1, "policy": "hand", "n_ranks": 6, "pp": 1, "capacity": 300,
            "makespan": 0, "lower_bound": 0,
            "sequences": [{"id": 7, "len": 1200, "src": -1}, {"id": 8, "len": 100, "src": -1}],
            "items": [{"ranks": [0, 1, 2, 3], "offload": 0, "segments": [[0, 0, 1200]], "est_time": 1.5, "ulysses": 2},
                      {"ranks": [4], "offload": 0, "segments": [[1, 0, 100]], "est_time": 0.25}]}
    path = tmp_path / "hybrid.json"
    path.write_text(json.dumps(plan))
    p = bytescale.read_plan(path)
    assert p.item_ulysses.tolist() == [2, 0] and p.item_a2a.tolist() == [0, 0]
    assert [it.ulysses for it in p.items] == [2, 0]
    d = p.to_dict()
    assert d["items"][0]["ulysses"] == 2 and "ulysses" not in d["items"][1]
    out = tmp_path / "out.json"
    p.write(out)
    assert json.loads(out.read_text()) == d
    q = bytescale.read_plan(out)
    q.write(tmp_path / "again.json")
    assert (tmp_path / "again.json").read_bytes() == out.read_bytes()
    # with a derived cost model the estimate is cost_hybrid_item_time's, not the ring's of 4
    cm = bytescale.CostModel("llama-7b", "h100-sxm", tp=2, ranks=6, capacity=300)
    r = bytescale.read_plan(out, cost=cm)
    del plan["items"][0]["ulysses"]
    path.write_text(json.dumps(plan))
    ring = bytescale.read_plan(path, cost=cm)
    assert r.item_ulysses[0] == 2 and 0 < r.item_est_time[0] != ring.item_est_time[0]
    assert r.item_est_time[1] == ring.item_est_time[1]
    plan["items"][0]["ulysses"] = 3
    path.write_text(json.dumps(plan))
    with pytest.raises(bytescale.Error, match="ulysses 3"):
        bytescale.read_plan(path)


def test_catalogues():
    assert {"static", "naive", "balance"} <= set(bytescale.policies())
    assert all(isinstance(v, str) and v for v in bytescale.policies().values())
    assert "llama-7b" in bytescale.models() and "tiny" in bytescale.models()
    assert "h800-sxm" in bytescale.hardware_profiles()
    assert bytescale.__version__.count(".") == 2


def test_empty_batch():
    p = bytescale.plan([], ranks=4, capacity=1024)
    assert (p.n_items, p.n_seqs, p.n_tokens) == (0, 0, 0)
    assert p.items == [] and p.schedules == [[], [], [], []] and p.chunk_arrays().len.size == 0


def test_threads_plan_independently():
    """A data loader may plan from worker threads: the library keeps no shared state (errors are per
    thread), so concurrent plans equal the serial ones."""
    from concurrent.futures import ThreadPoolExecutor
    batches = [random_lengths(s, capacity=4096) for s in range(8)]
    serial = [bytescale.plan(b, ranks=16, capacity=4096, context=32768).to_dict() for b in batches]
    with ThreadPoolExecutor(4) as ex:
        threaded = list(ex.map(lambda b: bytescale.plan(b, ranks=16, capacity=4096, context=32768).to_dict(), batches))
    assert threaded == serial
