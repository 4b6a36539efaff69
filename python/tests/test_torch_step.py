"""A whole training step of bytescale.torch on 1, 2, 3 and 4 processes (gloo, CPU), every policy, with
rings beside packs: the loss and every gradient equal the one-process step of the same batch, and the
parameters after 3 optimizer steps agree (docs/torch.md, "Tests").

The one-process reference runs the same batches with every sequence in a pack on one rank (no ring,
no message). Errors are relative to each tensor's largest value. Float64 shows the algorithms agree
to rounding (losses and gradients 1e-10, parameters after 3 steps 1e-10); fp32: losses of all 3 steps
and the first step's gradients within 1e-5.
"""

import math

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import bytescale.torch as bt  # noqa: E402
from bytescale.torch import launch  # noqa: E402

POLICIES = ("static", "naive", "balance", "elastic")
CAPACITY = 48
STEPS = 3


def synthetic_source(n_docs=400, seed=5):
    """Documents of a fixed synthetic corpus: lengths and tokens are functions of the document."""
    rng = np.random.default_rng(seed)
    lengths = rng.integers(2, 400, n_docs)

    def read(doc, start, n):
        end = min(int(lengths[doc]), start + n)
        i = np.arange(start, max(start, end), dtype=np.int64)
        return (doc * 7919 + i * 104729 + (i * i) % 31) % 256

    return bt.FunctionSource(read, lambda d: int(lengths[d])), lengths


def make_batches(world, seed):
    """STEPS global batches with short sequences and ones up to `world` capacities long (rings); some
    start inside their document or end before it does (their labels continue), some end with it."""
    source, doc_len = synthetic_source()
    rng = np.random.default_rng(seed)
    batches, used = [], 0
    for _ in range(STEPS):
        docs, starts, lengths = [], [], []
        for j in range(int(rng.integers(5, 9))):
            d = used
            used += 1
            longest = min(int(doc_len[d]), world * CAPACITY)
            if j % 3 == 0 and longest > CAPACITY:
                n = int(rng.integers(CAPACITY + 1, longest + 1))  # a ring on 2+ ranks
            else:
                n = int(rng.integers(1, min(CAPACITY, int(doc_len[d])) + 1))
            start = int(rng.integers(0, int(doc_len[d]) - n + 1)) if rng.random() < 0.5 else 0
            docs.append(d), starts.append(start), lengths.append(n)
        batches.append(bt.Batch(docs, starts, lengths))
    return source, batches


def run_steps(rank, world, policy, dtype, seed, capacity, batch_world):
    """STEPS steps of the tiny model on this rank over the batches of make_batches(batch_world, seed);
    returns the losses, the first step's gradients, the final parameters and the rings planned."""
    torch.manual_seed(0)
    source, batches = make_batches(batch_world, seed)
    model = bt.Llama(bt.LlamaConfig.named("tiny"), dtype=dtype).init_weights(seed=3)
    trainer = bt.HDPTrainer(model, lr=1e-2, warmup=1, schedule_steps=10, clip=1.0)
    losses, grads, rings = [], None, 0
    for step, batch in enumerate(batches):
        plan = None
        if rank == 0:
            plan = bt.plan_step(batch, source, ranks=world, capacity=capacity, policy=policy)
        plan = bt.broadcast_plan(plan)
        rings += plan.n_rings
        mbs = bt.microbatches(plan, rank, source, ring_stats=trainer.ring_stats)
        res = trainer.step(plan, mbs, apply=False)
        if step == 0:
            grads = trainer.flat_grad.clone()
        trainer.apply_update(res)
        losses.append(res.loss)
    return {"losses": losses, "grads": grads, "params": model.flat.detach().clone(), "rings": rings}


def worker(rank, world, dtypes, seed):
    """Every policy's steps in each of `dtypes`: by dtype, then policy."""
    return {dtype: {policy: run_steps(rank, world, policy, dtype, seed, CAPACITY, world) for policy in POLICIES}
            for dtype in dtypes}


@pytest.fixture(scope="module")
def jobs():
    """job(world): the spawned job of `world` processes that runs fp64 and fp32 both (its start-up
    costs more than the steps), once for the two tests of that world."""
    done = {}

    def job(world):
        if world not in done:
            done[world] = launch.spawn(worker, world, args=((torch.float64, torch.float32), 100 + world))
        return done[world]
    return job


def rel(a, b):
    return float((a - b).abs().max() / b.abs().max())


def reference(dtype, seed, batch_world):
    # every sequence in a pack on one process (capacity above the longest), no process group
    return run_steps(0, 1, "balance", dtype, seed, batch_world * CAPACITY, batch_world)


def tensor_errors(model_layout, got, ref):
    """Largest relative error over the model's tensors (each against its own largest value)."""
    worst = 0.0
    for _, off, shape, _ in model_layout:
        n = math.prod(shape)
        r, g = ref[off:off + n], got[off:off + n]
        if r.abs().max() > 0:
            worst = max(worst, rel(g, r))
        else:
            assert g.abs().max() == 0
    return worst


@pytest.mark.parametrize("world", [2, 3, 4])
@pytest.mark.parametrize("dtype,tol", [(torch.float64, 1e-10), (torch.float32, 1e-5)], ids=["fp64", "fp32"])
def test_step_matches_one_process(world, dtype, tol, jobs):
    seed = 100 + world
    ref = reference(dtype, seed, world)
    layout = bt.Llama(bt.LlamaConfig.named("tiny")).layout
    results = [r[dtype] for r in jobs(world)]
    table = []
    for policy in POLICIES:
        per_rank = [r[policy] for r in results]
        assert per_rank[0]["rings"] > 0, f"{policy} on {world} ranks planned no ring: the test needs rings"
        for r in per_rank:  # every rank ends with the same parameters and sees the same losses
            assert torch.equal(r["params"], per_rank[0]["params"])
            assert r["losses"] == per_rank[0]["losses"]
        got = per_rank[0]
        loss_err = max(abs(a - b) / abs(b) for a, b in zip(got["losses"], ref["losses"]))
        grad_err = tensor_errors(layout, got["grads"], ref["grads"])
        param_err = tensor_errors(layout, got["params"], ref["params"])
        table.append((policy, loss_err, grad_err, param_err))
        assert loss_err <= tol, (policy, loss_err)
        assert grad_err <= tol, (policy, grad_err)
        # after 3 AdamW steps. fp64: to rounding. fp32: Adam's first steps move every weight by about
        # lr * sign(gradient), so a weight whose gradient is at fp32's rounding level (an embedding
        # row seen once) moves by a different lr-sized step in any two summation orders; the losses
        # of all 3 steps (which depend on every weight) agreeing within tol is the fp32 check
        if dtype == torch.float64:
            assert param_err <= tol, (policy, param_err)
    print(f"\n{world} ranks {dtype}: " + "; ".join(f"{p}: loss {l:.2e} grad {g:.2e} params {q:.2e}"
                                                 for p, l, g, q in table))


def test_one_process_plans_agree():
    """On one process, any capacity (many packs or one) gives the same loss and gradients."""
    seed = 7
    a = reference(torch.float64, seed, 4)
    b = run_steps(0, 1, "balance", torch.float64, seed, 1000, 4)
    layout = bt.Llama(bt.LlamaConfig.named("tiny")).layout
    assert max(abs(x - y) / y for x, y in zip(a["losses"], b["losses"])) < 1e-12
    assert tensor_errors(layout, a["grads"], b["grads"]) < 1e-12


def handmade_worker(rank, world):
    """Hand-made plans the planners never make: a ring whose second member holds no row at all (one
    token on 2 ranks), and a packed ring of tiny segments, beside packs; the model's every layer still
    runs its ring attention on the empty member (or the ring would stall)."""
    source, doc_len = synthetic_source()
    d = [i for i in range(len(doc_len)) if doc_len[i] >= 100][:6]
    plans = [
        bt.StepPlan(2, d[:3], [0, 0, 5], [1, 30, 60], [((0, 1), ((0, 0, 1),)), ((1,), ((1, 0, 30),)),
                                                       ((1, 0), ((2, 0, 60),))], labelled=0),
        bt.StepPlan(2, d[3:], [0, 0, 0], [2, 1, 3], [((1, 0), ((0, 0, 2), (1, 0, 1))), ((0,), ((2, 0, 3),))],
                    labelled=0),
    ]
    out = []
    for p in plans:
        p.labelled = bt.labelled_tokens(bt.Batch([p.seq_doc[q] for q, *_ in _segs(p)],
                                                 [p.seq_start[q] + s for q, s, _ in _segs(p)],
                                                 [n for *_, n in _segs(p)]), source)
        model = bt.Llama(bt.LlamaConfig.named("tiny"), dtype=torch.float64).init_weights(seed=3)
        trainer = bt.HDPTrainer(model)
        if world == 1:  # the reference: every item's rows as packs of whole segments on one rank
            p = bt.StepPlan(1, p.seq_doc, p.seq_start, p.seq_len, [((0,), segs) for _, segs in p.items], p.labelled)
        res = trainer.step(p, bt.microbatches(p, rank, source), apply=False)
        out.append((res.loss, trainer.flat_grad.clone(), [m.T for m in bt.microbatches(p, rank, source)]))
    return out


def _segs(p):
    return [s for _, segs in p.items for s in segs]


def test_handmade_rings_with_empty_members():
    ref = handmade_worker(0, 1)
    got = launch.spawn(handmade_worker, 2)
    assert 0 in got[1][0][2], "rank 1 should hold no row of the first ring"
    for (l, g, _), (rl, rg, _) in zip(got[0], ref):
        assert abs(l - rl) / rl < 1e-12
        assert rel(g, rg) < 1e-12
