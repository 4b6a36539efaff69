"""HDP beside tensor parallelism and pipeline stages (docs/torch.md, "3D"): a step of the tiny model
on a (tp, pp, hdp) layout of 4 processes, (2, 1, 2), (1, 2, 2) and (2, 2, 1), and of 8, (2, 2, 2),
against the one-process step of the same batch (loss and every gradient of the whole model, gathered
from the parts through Llama.full_index and gather_whole), with the planner's plans (balance,
PP-Balance when pp > 1: rings, several items per rank so the 1F1B order interleaves) and the same
plans with their 2-rank items as a2a items (Ulysses inside the tp shard's heads), and the parameters
after 2 clipped AdamW steps; random plans of every policy on (2, 2, 2) finish with the one-process
loss. fp64 shows the algorithms agree to rounding (1e-10), fp32 within 1e-5 relative to each
tensor's largest value. Also the layout's arithmetic, the C engine's stage split and pipeline
order, the tp layers alone against dense ones (biases, nn.Linear's initialisation), and
clip_grad_norm_ with save_tp / load_tp on tp 2 x hdp 2 against one process.
"""

import dataclasses
import math

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import bytescale.torch as bt  # noqa: E402
from bytescale.torch import launch  # noqa: E402

CAPACITY = 40
TOL = {torch.float64: 1e-10, torch.float32: 1e-5}


def source_and_batch(seed=31):
    """A synthetic corpus and one global batch: short sequences and a few up to 2 capacities long
    (rings on 2 HDP ranks), some starting inside their document."""
    rng = np.random.default_rng(seed)
    lengths = rng.integers(20, 200, 60)

    def read(doc, start, n):
        end = min(int(lengths[doc]), start + n)
        i = np.arange(start, max(start, end), dtype=np.int64)
        return (doc * 7919 + i * 104729 + (i * i) % 31) % 256

    source = bt.FunctionSource(read, lambda d: int(lengths[d]))
    docs, starts, lens = [], [], []
    for j in range(10):
        n = int(rng.integers(CAPACITY + 1, min(2 * CAPACITY, int(lengths[j])) + 1)) if j % 4 == 0 and \
            lengths[j] > CAPACITY else int(rng.integers(1, min(CAPACITY, int(lengths[j])) + 1))
        start = int(rng.integers(0, int(lengths[j]) - n + 1)) if j % 2 else 0
        docs.append(j), starts.append(start), lens.append(n)
    return source, bt.Batch(docs, starts, lens)


def as_a2a(plan):
    """The same plan with every 2-rank item an a2a item (a Ulysses group of 2)."""
    return dataclasses.replace(plan, ulysses=[2 if len(r) == 2 else 0 for r, _ in plan.items])


def step(layout, plan, source, dtype):
    """One step's loss and this part's gradients (summed over the hdp group, unclipped)."""
    model = bt.Llama(bt.LlamaConfig.named("tiny"), dtype=dtype, parallel=layout).init_weights(seed=3)
    trainer = bt.HDPTrainer(model, clip=0)
    hdp = layout.hdp_rank if layout is not None else 0
    mbs = bt.microbatches(plan, hdp, source, ring_stats=trainer.ring_stats, layout=layout)
    res = trainer.step(plan, mbs, apply=False)
    # the whole model's parameters and gradient on world rank 0 (what a 3D checkpoint needs)
    whole = (bt.gather_whole(model, model.flat), bt.gather_whole(model, trainer.flat_grad))
    return res.loss, res.grad_norm, trainer.flat_grad.double().clone(), model.full_index(), whole


def train(layout, plan, source, steps=2):
    """fp64 parameters after `steps` clipped AdamW steps on the same plan (the global gradient norm
    decides the clipping), gathered into the whole model's vector on world rank 0."""
    model = bt.Llama(bt.LlamaConfig.named("tiny"), dtype=torch.float64, parallel=layout).init_weights(seed=3)
    trainer = bt.HDPTrainer(model, lr=1e-2, warmup=1, schedule_steps=10, clip=0.05)
    hdp = layout.hdp_rank if layout is not None else 0
    scales = []
    for _ in range(steps):
        mbs = bt.microbatches(plan, hdp, source, ring_stats=trainer.ring_stats, layout=layout)
        scales.append(trainer.step(plan, mbs).clip_scale)
    return bt.gather_whole(model, model.flat), scales


def worker(rank, world, tp, pp):
    layout = bt.Layout(tp=tp, pp=pp)
    source, batch = source_and_batch()
    capacity = CAPACITY if layout.hdp > 1 else 2 * CAPACITY  # one HDP rank: no rings, every sequence fits
    plan = bt.broadcast_plan(bt.plan_step(batch, source, ranks=layout.hdp, capacity=capacity, policy="balance",
                                          pp=pp) if rank == 0 else None)
    out = {"where": (layout.stage, layout.hdp_rank, layout.tp_rank), "rings": plan.n_rings,
           "items": len(plan.schedule(layout.hdp_rank))}
    kinds = [("plan", plan)] + ([("a2a", as_a2a(plan))] if plan.n_rings else [])
    for kind, p in kinds:
        for dtype in TOL:
            out[kind, dtype] = step(layout, p, source, dtype)
    out["trained"] = train(layout, plan, source)
    return out


def reference(dtype):
    source, batch = source_and_batch()
    plan = bt.plan_step(batch, source, ranks=1, capacity=4 * CAPACITY, policy="balance")
    loss, norm, grad, _, (params, _) = step(None, plan, source, dtype)
    return loss, norm, grad, params


def whole_gradient(results, key, n):
    """The whole model's gradient from every part (hdp rank 0's; the other HDP ranks' must equal it)."""
    g = torch.full((n,), float("nan"), dtype=torch.float64)
    parts = {}
    for r in results:
        _, _, grad, idx, _ = r[key]
        stage, hdp, tp = r["where"]
        if hdp == 0:
            g[idx] = grad
            parts[stage, tp] = grad
    for r in results:  # every HDP rank holds the same summed gradient of its part
        stage, hdp, tp = r["where"]
        assert torch.equal(r[key][2], parts[stage, tp]), (key, r["where"])
    assert not torch.isnan(g).any(), "the parts do not cover the whole model"
    return g


def tensor_errors(got, ref):
    layout = bt.Llama(bt.LlamaConfig.named("tiny")).layout
    worst = 0.0
    for _, off, shape, _ in layout:
        r, g = ref[off:off + math.prod(shape)], got[off:off + math.prod(shape)]
        worst = max(worst, float((g - r).abs().max() / r.abs().max()))
    return worst


@pytest.mark.parametrize("tp,pp,hdp", [(2, 1, 2), (1, 2, 2), (2, 2, 1), (2, 2, 2)])
def test_3d_step_matches_one_process(tp, pp, hdp):
    results = launch.spawn(worker, tp * pp * hdp, args=(tp, pp))
    assert sorted(r["where"] for r in results) == sorted(
        (s, h, t) for s in range(pp) for h in range(hdp) for t in range(tp))
    if hdp > 1:
        assert results[0]["rings"] > 0, "the plan has no ring: the test needs one"
    assert max(r["items"] for r in results) >= 2 * pp, "too few items per rank for 1F1B to interleave"
    n = bt.LlamaConfig.named("tiny").n_params
    lines = []
    for kind in ("plan", "a2a"):
        if (kind, torch.float64) not in results[0]:
            continue
        for dtype, tol in TOL.items():
            ref_loss, ref_norm, ref_grad, ref_params = reference(dtype)
            losses = {r[kind, dtype][0] for r in results}
            assert len(losses) == 1, f"processes disagree on the loss: {losses}"
            loss_err = abs(results[0][kind, dtype][0] - ref_loss) / ref_loss
            norm_err = abs(results[0][kind, dtype][1] - ref_norm) / ref_norm
            grad = whole_gradient(results, (kind, dtype), n)
            grad_err = tensor_errors(grad, ref_grad)
            params, gathered = results[0][kind, dtype][4]  # gather_whole on world rank 0
            assert torch.equal(params, ref_params), "the parts' initial weights are not the whole model's"
            assert torch.equal(gathered.double(), grad)
            assert all(r[kind, dtype][4] == (None, None) for r in results[1:])
            lines.append(f"{kind} {str(dtype)[6:]}: loss {loss_err:.1e} grad {grad_err:.1e} norm {norm_err:.1e}")
            assert loss_err <= tol and norm_err <= tol, (kind, dtype, loss_err, norm_err)
            assert grad_err <= tol, (kind, dtype, grad_err)
    source, batch = source_and_batch()
    ref_params, ref_scales = train(None, bt.plan_step(batch, source, ranks=1, capacity=4 * CAPACITY), source)
    params, scales = results[0]["trained"]
    assert all(s < 1 for s in ref_scales), "the test wants clipped steps"
    assert max(abs(a - b) / b for a, b in zip(scales, ref_scales)) < 1e-10
    param_err = tensor_errors(params, ref_params)
    assert param_err < 1e-10, param_err
    lines.append(f"params after 2 clipped AdamW steps fp64 {param_err:.1e}")
    print(f"\ntp {tp} pp {pp} hdp {hdp} vs one process: " + "; ".join(lines))


def test_layout_ranks_and_stage_split():
    """World rank = (stage x H + hdp) x T + tp (parallel_world_rank), and the C engine's split."""
    seen = set()
    for rank in range(2 * 3 * 2):
        lay = bt.Layout(tp=2, pp=3, world=12, rank=rank)
        assert lay.world_rank(lay.stage, lay.hdp_rank, lay.tp_rank) == rank
        assert lay.hdp_to_world([0, 1]) == [lay.world_rank(lay.stage, h, lay.tp_rank) for h in (0, 1)]
        seen.add((lay.stage, lay.hdp_rank, lay.tp_rank))
    assert len(seen) == 12
    assert bt.split_layers(8, 3) == [0, 3, 6, 8]
    assert bt.split_layers(8, 3, 1.0, 1.5) == [0, 3, 6, 8]
    assert bt.split_layers(8, 3, 1.0, 2.5) == [0, 4, 7, 8]  # the head weighs a layer and a half
    with pytest.raises(ValueError, match="do not divide"):
        bt.Layout(tp=2, pp=2, world=6, rank=0)
    with pytest.raises(ValueError, match="at most 2 pipeline stages"):
        bt.split_layers(2, 3)


def test_pipeline_order_is_1f1b():
    """On one HDP rank of n items (slots 0..n-1) stage s runs P-1-s forwards ahead, then alternates;
    every forward precedes its backward; a barrier delays the next items' slots by pp - 1."""
    plan = bt.StepPlan(1, [0] * 5, [0] * 5, [1] * 5, [((0,), ((k, 0, 1),)) for k in range(5)], labelled=5)
    P = 3
    for s in range(P):
        order = bt.stage_order(plan, 0, s, P)
        ahead = P - 1 - s
        want = [(True, i) for i in range(ahead + 1)]
        f = ahead + 1
        for b in range(5):
            want.append((False, b))
            if f < 5:
                want.append((True, f))
                f += 1
        assert order == want, (s, order)
    plan.barriers = [2]
    assert bt.pipeline_slots(plan, P) == [0, 1, 4, 5, 6]


def tp_layers_worker(rank, world):
    """Column then row parallel, with biases, on 2 ranks against the dense product, forward and
    backward; the whole weights and biases given (weight=, bias=)."""
    lay = bt.Layout(tp=2)
    g = torch.Generator().manual_seed(1)
    x = torch.randn(5, 8, generator=g, dtype=torch.float64)
    w1, b1 = torch.randn(6, 8, generator=g, dtype=torch.float64), torch.randn(6, generator=g, dtype=torch.float64)
    w2, b2 = torch.randn(8, 6, generator=g, dtype=torch.float64), torch.randn(8, generator=g, dtype=torch.float64)
    col = bt.ColumnParallelLinear(8, 6, lay, bias=b1, weight=w1, dtype=torch.float64)
    row = bt.RowParallelLinear(6, 8, lay, bias=b2, weight=w2, dtype=torch.float64)
    xl = x.clone().requires_grad_()
    y = row(torch.tanh(col(xl)))
    (y * y).sum().backward()
    return (y.detach(), xl.grad, col.weight.grad, row.weight.grad, col.bias.grad, row.bias.grad, col.rows, row.cols,
            (col.weight.tp_dim, col.bias.tp_dim, row.weight.tp_dim, row.bias.tp_dim))


def test_column_row_parallel_match_dense():
    got = launch.spawn(tp_layers_worker, 2)
    g = torch.Generator().manual_seed(1)
    x = torch.randn(5, 8, generator=g, dtype=torch.float64).requires_grad_()
    w1, b1 = (torch.randn(6, 8, generator=g, dtype=torch.float64).requires_grad_(),
              torch.randn(6, generator=g, dtype=torch.float64).requires_grad_())
    w2, b2 = (torch.randn(8, 6, generator=g, dtype=torch.float64).requires_grad_(),
              torch.randn(8, generator=g, dtype=torch.float64).requires_grad_())
    y = torch.tanh(x @ w1.t() + b1) @ w2.t() + b2
    (y * y).sum().backward()
    close = dict(rtol=1e-12, atol=1e-12)
    for yr, dx, dw1, dw2, db1, db2, rows, cols, dims in got:
        assert torch.allclose(yr, y.detach(), **close)
        assert torch.allclose(dx, x.grad, **close)
        assert torch.allclose(dw1, w1.grad[rows.start:rows.stop], **close)
        assert torch.allclose(dw2, w2.grad[:, cols.start:cols.stop], **close)
        assert torch.allclose(db1, b1.grad[rows.start:rows.stop], **close)
        assert torch.allclose(db2, b2.grad, **close)  # added once, after the sum: whole on every rank
        assert dims == (0, 0, 1, None)


def test_tp_layers_start_as_nn_linear():
    """The shards of a seeded layer are nn.Linear's rows (column) or columns (row) under the same seed,
    and with seed=None those of the default generator, as nn.Linear draws them."""
    for tp in (1, 2, 4):
        for r in range(tp):
            lay = bt.Layout(tp=tp, world=tp, rank=r)  # the arithmetic only: no process group
            torch.manual_seed(5)
            ref = torch.nn.Linear(8, 12, dtype=torch.float64)
            col = bt.ColumnParallelLinear(8, 12, lay, seed=5, dtype=torch.float64)
            assert torch.equal(col.weight, ref.weight[col.rows.start:col.rows.stop])
            assert torch.equal(col.bias, ref.bias[col.rows.start:col.rows.stop])
            torch.manual_seed(6)
            ref = torch.nn.Linear(12, 8)
            torch.manual_seed(6)
            row = bt.RowParallelLinear(12, 8, lay)
            assert torch.equal(row.weight, ref.weight[:, row.cols.start:row.cols.stop])
            assert torch.equal(row.bias, ref.bias)
    assert bt.ColumnParallelLinear(8, 12, bt.Layout(tp=2, world=2, rank=0), bias=False).bias is None
    with pytest.raises(ValueError, match="weight has shape"):
        bt.RowParallelLinear(12, 8, bt.Layout(), weight=torch.zeros(8, 11))


class TPNet(torch.nn.Module):
    """Column then row parallel with biases and a replicated gain: nn.Linear layers on one tp rank."""

    def __init__(self, lay):
        super().__init__()
        if lay.tp == 1:
            torch.manual_seed(1)
            self.a = torch.nn.Linear(6, 8, dtype=torch.float64)
            torch.manual_seed(2)
            self.b = torch.nn.Linear(8, 6, dtype=torch.float64)
        else:
            self.a = bt.ColumnParallelLinear(6, 8, lay, seed=1, dtype=torch.float64)
            self.b = bt.RowParallelLinear(8, 6, lay, seed=2, dtype=torch.float64)
        self.gain = torch.nn.Parameter(torch.linspace(0.5, 1.5, 6, dtype=torch.float64))

    def forward(self, x):
        return self.b(torch.tanh(self.a(x))) * self.gain


def tp_train(model, opt, lay, xs, steps):
    """steps of: this HDP rank's inputs (all of them on one process), gradients summed over the HDP
    ranks, clipped to 0.5 by the whole model's norm, AdamW; the norms."""
    norms = []
    for _ in range(steps):
        opt.zero_grad()
        for x in xs:
            model(x).pow(2).sum().backward()
        bt.all_reduce_gradients(model, layout=lay)
        norms.append(float(bt.clip_grad_norm_(model.parameters(), 0.5, layout=lay)))
        opt.step()
    return norms


def tp_inputs(h):
    return torch.randn(5, 6, dtype=torch.float64, generator=torch.Generator().manual_seed(h))


def tp_checkpoint_worker(rank, world, path):
    """tp 2 x hdp 2: two steps, save_tp, a fresh model and optimizer (another lr) load_tp, one more
    step on each; returns the norms, whether the loaded state equals the saved, the last parameters."""
    lay = bt.Layout(tp=2)
    model = TPNet(lay)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    norms = tp_train(model, opt, lay, [tp_inputs(lay.hdp_rank)], 2)
    bt.save_tp(path, model, opt, extra={"step": 2})
    again = TPNet(lay)
    opt2 = torch.optim.AdamW(again.parameters(), lr=5.0)
    extra = bt.load_tp(path, again, opt2)
    same = all(torch.equal(p, q) and all(torch.equal(opt.state[p][k], opt2.state[q][k]) for k in opt.state[p])
               for p, q in zip(model.parameters(), again.parameters()))
    norms += tp_train(again, opt2, lay, [tp_inputs(lay.hdp_rank)], 1)
    return norms, same, extra, opt2.param_groups[0]["lr"]


def test_tp_clip_and_checkpoint_match_one_process(tmp_path):
    """clip_grad_norm_ over TP shards and HDP ranks, and save_tp / load_tp (torch.distributed.checkpoint),
    on tp 2 x hdp 2 against nn.Linear on one process: the norms of 3 steps, and the one process's
    parameters and Adam moments after 2 steps against the TP checkpoint loaded into its model."""
    got = launch.spawn(tp_checkpoint_worker, 4, args=(str(tmp_path / "ck"),))
    lay = bt.Layout()
    model = TPNet(lay)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    xs = [tp_inputs(h) for h in range(2)]
    norms = tp_train(model, opt, lay, xs, 2)
    loaded = TPNet(lay)
    opt2 = torch.optim.AdamW(loaded.parameters(), lr=5.0)
    assert bt.load_tp(tmp_path / "ck", loaded, opt2) == {"step": 2}
    for p, q in zip(model.parameters(), loaded.parameters()):
        assert torch.allclose(p, q, rtol=1e-12, atol=1e-14)
        for k in ("exp_avg", "exp_avg_sq"):
            assert torch.allclose(opt.state[p][k], opt2.state[q][k], rtol=1e-10, atol=1e-16)
    norms += tp_train(model, opt, lay, xs, 1)
    for got_norms, same, extra, lr in got:
        assert same and extra == {"step": 2} and lr == 1e-2
        assert got_norms == pytest.approx(norms, rel=1e-12)
    assert norms[0] > 0.5  # the clipping clipped


def random_batch(rng, source_lengths):
    docs = rng.choice(len(source_lengths), int(rng.integers(3, 9)), replace=False)
    lens = [int(rng.integers(1, min(2 * CAPACITY, int(source_lengths[d])) + 1)) for d in docs]
    return bt.Batch([int(d) for d in docs], [0] * len(docs), lens)


def random_plans_worker(rank, world, n_plans):
    """n_plans random batches on a (2, 2, 2) layout, every policy (PP-Balance for balance), every
    other plan's 2-rank items as a2a items: each step's fp64 loss (every process runs it to the end)."""
    layout = bt.Layout(tp=2, pp=2)
    source, _ = source_and_batch()
    lengths = [source.doc_length(d) for d in range(60)]
    rng = np.random.default_rng(77)
    model = bt.Llama(bt.LlamaConfig.named("tiny"), dtype=torch.float64, parallel=layout).init_weights(seed=3)
    trainer = bt.HDPTrainer(model, clip=0)
    out = []
    for i in range(n_plans):
        batch = random_batch(rng, lengths)
        policy = ("static", "naive", "balance", "elastic")[i % 4]
        plan = bt.broadcast_plan(bt.plan_step(batch, source, ranks=2, capacity=CAPACITY, policy=policy, pp=2)
                                 if rank == 0 else None)
        if i % 2:
            plan = as_a2a(plan)
        mbs = bt.microbatches(plan, layout.hdp_rank, source, ring_stats=trainer.ring_stats, layout=layout)
        out.append((batch, trainer.step(plan, mbs, apply=False).loss, plan.n_rings))
    return out


def test_3d_random_plans_finish_with_one_process_losses():
    """No plan deadlocks the 1F1B stages, the rings and all-to-alls on the hdp groups and the tp
    all-reduces together, and every step's loss is the one-process loss of its batch."""
    got = launch.spawn(random_plans_worker, 8, args=(8,))
    source, _ = source_and_batch()
    model = bt.Llama(bt.LlamaConfig.named("tiny"), dtype=torch.float64).init_weights(seed=3)
    trainer = bt.HDPTrainer(model, clip=0)
    assert sum(r for _, _, r in got[0]) > 0, "no ring in any plan: the test needs rings"
    for batch, loss, _ in got[0]:
        plan = bt.plan_step(batch, source, ranks=1, capacity=4 * CAPACITY)
        ref = trainer.step(plan, bt.microbatches(plan, 0, source), apply=False).loss
        assert abs(loss - ref) / ref < 1e-12, (loss, ref)
    for r in got[1:]:
        assert [l for _, l, _ in r] == [l for _, l, _ in got[0]]
