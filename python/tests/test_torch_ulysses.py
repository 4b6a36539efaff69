"""bytescale.torch a2a (Ulysses) and hybrid items (a ring of Ulysses groups) on 2, 3, 4 and 6
processes (gloo, CPU): every member's attention output and its dq, dk, dv against dense attention of
the whole item on one process, fp64 and fp32; GQA with the group above the K/V heads (replicated K/V
heads whose gradients are summed back), head splits that cut a GQA group, packed items of several
segments, members with no rows. Then a whole step of the tiny model with hand-made plans mixing
a2a, hybrid, ring and pack items against the one-process step: loss and every gradient, and the
parameters after 3 AdamW steps (docs/torch.md, "Tests")."""

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import bytescale.torch as bt  # noqa: E402
from bytescale.torch import attention, launch  # noqa: E402
from bytescale.torch.attention import reference_attention  # noqa: E402

from test_torch_ring import TOL, grads_of  # noqa: E402
from test_torch_step import (STEPS, make_batches, reference, run_steps, synthetic_source,  # noqa: E402
                             tensor_errors)

CASES = [
    # (segment lengths of the item, H, G, head_dim)
    ([37], 4, 2, 8),              # one sequence, uneven chunks; u = 4 above G = 2 (replicated K/V)
    ([5, 100, 1, 23], 4, 2, 8),   # a packed item: several segments, some shorter than 2D (empty chunks)
    ([64], 6, 3, 4),              # u = 2, 4: head ranges that cut GQA groups (K/V widened)
    ([50, 9], 6, 1, 8),           # MQA: every member needs the one K/V head
    ([3], 4, 4, 4),               # 3 tokens: on D >= 2 some members hold nothing
    ([2, 1], 8, 2, 4),            # tiny segments: empty members and an empty group in a hybrid
    ([1], 4, 2, 8),               # one token: every member but the first holds nothing
]


def group_sizes(D, H):
    """The a2a item (u = D) and every hybrid (2 <= u < D, u dividing D) the heads allow."""
    return [u for u in range(2, D + 1) if D % u == 0 and u <= H]


def ulysses_worker(rank, world):
    """Every case and group size, fp64 and fp32, default tiles and tiles of a few rows, the item on
    all `world` ranks in a shuffled order: this member's output and gradients against dense attention
    of the whole item computed locally. Returns (dtype, case, u, rows here, errors)."""
    errs = []
    for dtype in (torch.float64, torch.float32):
        for tiles in ((512, 1024), (7, 5)):
            attention.Q_TILE, attention.K_TILE = tiles
            for ci, (segs, H, G, hd) in enumerate(CASES):
                for u in group_sizes(world, H):
                    g = torch.Generator().manual_seed(ci * 10 + u)
                    T = sum(segs)
                    q = torch.randn(T, H, hd, generator=g, dtype=dtype)
                    k = torch.randn(T, G, hd, generator=g, dtype=dtype)
                    v = torch.randn(T, G, hd, generator=g, dtype=dtype)
                    dout = torch.randn(T, H, hd, generator=g, dtype=dtype)
                    order = torch.randperm(world, generator=g).tolist()
                    plan = bt.StepPlan(n_ranks=world, seq_doc=list(range(len(segs))), seq_start=[0] * len(segs),
                                       seq_len=list(segs), labelled=0, ulysses=[u],
                                       items=[(tuple(order), tuple((i, 0, n) for i, n in enumerate(segs)))])
                    members = [bt.Rows(*map(torch.from_numpy, plan.member_rows(0, m))) for m in range(world)]
                    me = order.index(rank)
                    base = np.concatenate([[0], np.cumsum(segs)])
                    pos, seg = plan.member_rows(0, me)
                    idx = torch.from_numpy(base[seg] + pos)  # this member's rows in the item's row order
                    grp = bt.Ulysses(order, me, members, u)
                    got = grads_of(lambda a, b, c: bt.ulysses_attention(a, b, c, grp), q[idx], k[idx], v[idx],
                                   dout[idx])
                    gpos = torch.cat([torch.arange(n) for n in segs])
                    gseg = torch.cat([torch.full((n,), i) for i, n in enumerate(segs)])
                    ref = grads_of(lambda a, b, c: reference_attention(a, b, c, gpos, gseg, gpos, gseg),
                                   q, k, v, dout)
                    e = [float((x - y[idx]).abs().max() / (y.abs().max() if y.abs().max() > 0 else 1.0))
                         if len(idx) else 0.0 for x, y in zip(got, ref)]
                    errs.append((dtype, ci, u, len(idx), e))
    return errs


STEP_WORLDS = (2, 3, 4)  # test_step_matches_one_process's


def job_worker(rank, world, parts):
    """The attention cases, then (on STEP_WORLDS) both step tests, in one set of processes: a spawned
    job's start-up costs more than either. The tiles are put back between them."""
    tiles = attention.Q_TILE, attention.K_TILE
    out = {"attention": ulysses_worker(rank, world)}
    attention.Q_TILE, attention.K_TILE = tiles
    if "step" in parts:
        out["step"] = step_worker(rank, world)
    return out


@pytest.fixture(scope="module")
def jobs():
    """job(world): every rank's results of job_worker on `world` processes, spawned once."""
    done = {}

    def job(world):
        if world not in done:
            parts = ("attention", "step") if world in STEP_WORLDS else ("attention",)
            done[world] = launch.spawn(job_worker, world, args=(parts,))
        return done[world]
    return job


@pytest.mark.parametrize("world", [2, 3, 4, 6])
def test_ulysses_attention_matches_full(world, jobs):
    results = [r["attention"] for r in jobs(world)]
    worst, kinds, empty = {}, set(), 0
    for rank, errs in enumerate(results):
        for dtype, ci, u, n, e in errs:
            kinds.add("a2a" if u == world else f"hybrid u={u}")
            empty += n == 0
            key = (dtype, "a2a" if u == world else "hybrid")
            worst[key] = max(worst.get(key, 0.0), max(e))
            assert max(e) < TOL[dtype], (world, dtype, rank, CASES[ci], u, e)
    assert "a2a" in kinds and empty > 0
    if world in (4, 6):
        assert any(k.startswith("hybrid") for k in kinds)
    print(f"\nD = {world} ({', '.join(sorted(kinds))}): largest relative error (out, dq, dk, dv) "
          + ", ".join(f"{kind} {str(dt)[6:]} {x:.1e}" for (dt, kind), x in sorted(worst.items(), key=str)))


def test_head_split():
    """Contiguous query head ranges covering every head once, sizes within one; the K/V heads each
    range uses; a group wider than the heads is refused."""
    for H, G in ((4, 2), (6, 3), (8, 1), (12, 12), (32, 8)):
        for u in range(1, H + 1):
            parts = [bt.head_split(H, G, u, j) for j in range(u)]
            assert [p[0] for p in parts] == [0] + [p[1] for p in parts[:-1]] and parts[-1][1] == H
            assert max(p[1] - p[0] for p in parts) - min(p[1] - p[0] for p in parts) <= 1
            for h0, h1, g0, g1 in parts:
                assert {h // (H // G) for h in range(h0, h1)} == set(range(g0, g1))
    with pytest.raises(ValueError, match="needs at least 5 query heads"):
        bt.head_split(4, 2, 5, 0)
    with pytest.raises(ValueError, match="Ulysses group size 3"):
        bt.StepPlan(4, [0], [0], [8], [((0, 1, 2, 3), ((0, 0, 8),))], labelled=0, ulysses=[3])


def test_plan_file_kinds():
    """A plan file's a2a and hybrid items (docs/plan-format.md) read into StepPlan.ulysses; a group
    size that does not divide the item is refused with the item named."""
    seqs = [{"id": 0, "len": 40, "src": 0}, {"id": 1, "len": 30, "src": 100}, {"id": 2, "len": 9, "src": 200}]
    items = [{"ranks": [0, 1, 2, 3], "segments": [[0, 0, 40]], "a2a": 1},
             {"ranks": [3, 2, 1, 0], "segments": [[1, 0, 30]], "ulysses": 2},
             {"ranks": [1, 0], "segments": [[2, 0, 9]]}, {"ranks": [2], "segments": [[2, 0, 0]]}]
    d = {"n_ranks": 4, "sequences": seqs, "items": items}
    p = bt.StepPlan.from_plan_file(d, [0, 100, 200], [40, 30, 9])
    assert p.ulysses == [4, 2, 0, 0] and [p.item_ulysses(k) for k in range(4)] == [4, 2, 0, 0]
    items[1]["ulysses"] = 3
    with pytest.raises(ValueError, match="item 1: Ulysses group size 3 on 4 ranks"):
        bt.StepPlan.from_plan_file(d, [0, 100, 200], [40, 30, 9])


# ---- a whole step: hand-made plans mixing a2a, hybrid, ring and pack items -----------------------------

def handmade_plans(world, doc_len):
    """Per step, items over `world` ranks in a global order: an a2a item of every rank packing several
    segments, an a2a item of 2 ranks beside a ring (3+ ranks), a hybrid of 2 groups of 2 (4 ranks),
    packs; every rank's items in the list's order (the global order).
    Returns [(docs, starts, lengths, items, ulysses)] per step."""
    long = [d for d in range(len(doc_len)) if doc_len[d] >= 150]
    everyone = tuple(range(world))
    steps = []
    for s in range(STEPS):
        d = long[s * 8:(s + 1) * 8]
        docs = d[:7]
        starts = [0, 3, 0, 10, 0, 0, 5]
        lengths = [120, 7, 1, 90, 60, 40, 25]
        items = [(everyone[::-1], ((0, 0, 120), (1, 0, 7), (2, 0, 1)))]
        ulysses = [world]
        if world >= 3:
            items += [((1, 2), ((3, 0, 90),)), ((0, world - 1), ((4, 0, 60),))]
            ulysses += [2, 0]
        else:
            items += [((1, 0), ((3, 0, 90),)), ((0,), ((4, 0, 60),))]
            ulysses += [0, 0]
        if world == 4:
            items.append(((2, 0, 3, 1), ((5, 0, 40),)))  # groups (2, 0) and (3, 1), ringed across
            ulysses.append(2)
        else:
            items.append(((world - 1,), ((5, 0, 40),)))
            ulysses.append(0)
        items.append(((world - 2,), ((6, 0, 25),)))
        ulysses.append(0)
        steps.append((docs, starts, lengths, items, ulysses))
    return steps


def handmade_step_worker(rank, world, dtype, plan_world):
    """STEPS AdamW steps of the tiny model (4 query heads, 2 K/V heads) on the hand-made plans of
    `plan_world` ranks; with world 1 every item runs as a pack of its segments on the one rank."""
    source, doc_len = synthetic_source()
    model = bt.Llama(bt.LlamaConfig.named("tiny"), dtype=dtype).init_weights(seed=3)
    trainer = bt.HDPTrainer(model, lr=1e-2, warmup=1, schedule_steps=10, clip=1.0)
    losses, grads, kinds = [], None, set()
    for step, (docs, starts, lengths, items, ulysses) in enumerate(handmade_plans(plan_world, doc_len)):
        labelled = bt.labelled_tokens(bt.Batch(docs, starts, lengths), source)
        if world == 1:
            items, ulysses = [((0,), segs) for _, segs in items], []
        plan = bt.StepPlan(world, docs, starts, lengths, items, labelled=labelled, ulysses=ulysses)
        mbs = bt.microbatches(plan, rank, source, ring_stats=trainer.ring_stats)
        kinds |= {("hybrid" if m.ulysses.r > 1 else "a2a") if m.ulysses else ("ring" if m.ring else "pack")
                  for m in mbs}
        res = trainer.step(plan, mbs, apply=False)
        if step == 0:
            grads = trainer.flat_grad.clone()
        trainer.apply_update(res)
        losses.append(res.loss)
    return {"losses": losses, "grads": grads, "params": model.flat.detach().clone(), "kinds": kinds}


# ---- the C planner's a2a items: flexsp plans ---------------------------------------------------------

FLEXSP_CAPACITY = {2: 48, 3: 96, 4: 48}  # flexsp groups are powers of two: 3 ranks ring at most 2
DTYPES = ((torch.float64, 1e-10), (torch.float32, 1e-5))


def step_worker(rank, world):
    """Both step tests in one set of processes (each spawn imports torch anew): the hand-made plans
    and flexsp's, fp64 and fp32."""
    out = {}
    for dtype, _ in DTYPES:
        out["handmade", dtype] = handmade_step_worker(rank, world, dtype, world)
        out["flexsp", dtype] = run_steps(rank, world, "flexsp", dtype, 200 + world, FLEXSP_CAPACITY[world], world)
    return out


@pytest.mark.parametrize("world", STEP_WORLDS)
def test_step_matches_one_process(world, jobs):
    """A whole step of the tiny model (4 query heads, 2 K/V heads) on `world` processes against the
    one-process step of the same batches: the hand-made plans (a2a, hybrid, ring and pack items) and
    the peer flexsp's plans from bytescale.plan (a2a items of 2 and 4 ranks beside packs), as
    test_torch_step.py runs the other policies. Loss of every step and every gradient; parameters
    after 3 AdamW steps in fp64 (fp32: see test_torch_step.py)."""
    seed = 200 + world
    source, batches = make_batches(world, seed)
    a2a = sum(1 for b in batches
              for u in bt.plan_step(b, source, ranks=world, capacity=FLEXSP_CAPACITY[world], policy="flexsp").ulysses
              if u)
    assert a2a > 0, "flexsp planned no a2a item: the test needs them"
    results = [r["step"] for r in jobs(world)]
    layout = bt.Llama(bt.LlamaConfig.named("tiny")).layout
    lines = []
    for dtype, tol in DTYPES:
        refs = {"handmade": handmade_step_worker(0, 1, dtype, world), "flexsp": reference(dtype, seed, world)}
        for name, ref in refs.items():
            per_rank = [r[name, dtype] for r in results]
            for r in per_rank:
                assert torch.equal(r["params"], per_rank[0]["params"]) and r["losses"] == per_rank[0]["losses"]
            got = per_rank[0]
            loss_err = max(abs(a - b) / abs(b) for a, b in zip(got["losses"], ref["losses"]))
            grad_err = tensor_errors(layout, got["grads"], ref["grads"])
            param_err = tensor_errors(layout, got["params"], ref["params"])
            assert loss_err <= tol and grad_err <= tol, (name, dtype, loss_err, grad_err)
            if dtype == torch.float64:
                assert param_err <= tol, (name, param_err)
            lines.append(f"{name} {str(dtype)[6:]}: loss {loss_err:.1e} grad {grad_err:.1e} params {param_err:.1e}")
        kinds = set().union(*(r["handmade", dtype]["kinds"] for r in results))
        assert {"a2a", "pack"} <= kinds and (world < 3 or "ring" in kinds) and (world != 4 or "hybrid" in kinds)
    print(f"\n{world} ranks ({a2a} flexsp a2a items): " + "; ".join(lines))
