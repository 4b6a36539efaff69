"""FSDP2 and ZeRO-1 over the HDP ranks in a loop of one's own (docs/torch-fsdp.md): the user's model
of examples/torch_user_loop.py (TinyLM, its attention bt.hdp_attention), 10 steps of clipped AdamW
in fp32 on 2 and 4 processes, with plans whose ranks run different numbers of micro-batches (rings
of 2 and 4, packs) and steps where some ranks run none, against the same 10 steps in one process
(a plan of one rank: every sequence whole in a pack, no message): every loss within 1e-5 relative,
every final parameter within 1e-5 of the largest; on 4 processes also FSDP2 at tp 2 x hdp 2 (losses
and gradient norms). Also the FSDP collectives' count (the same on
every rank whatever the plan), the local bytes of the shards, what shard refuses, and a Hugging
Face LlamaForCausalLM (bytescale.torch.hf) sharded by its "model.layers" against one process.
"""

import contextlib
import math

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import torch.nn.functional as F  # noqa: E402

import bytescale.torch as bt  # noqa: E402
from bytescale.torch import fsdp, launch  # noqa: E402
from conftest import load_example  # noqa: E402

STEPS = 10
LR, CLIP = 3e-3, 1.0
TOL = 1e-5


def user_loop():
    """examples/torch_user_loop.py as a module: its TinyLM and made-up documents."""
    return load_example("torch_user_loop")


def batch_of(ex, step):
    """Step `step`'s global batch: a few short documents and one long (a ring at capacity 160), or on
    every fourth step one long sequence alone (a ring of 2: the other ranks run nothing)."""
    rng = np.random.default_rng(50 + step)
    longs = [d for d in range(3, 200, 7)]
    shorts = [d for d in range(200) if d % 7 != 3 and ex.doc_length(d) < 120]
    if step % 4 == 2:
        d = longs[step % len(longs)]
        return bt.Batch([d], [0], [300])
    docs = [int(x) for x in rng.choice(shorts, 3 + step % 4, replace=False)]
    lens = [ex.doc_length(d) for d in docs]
    d = longs[(3 * step) % len(longs)]
    return bt.Batch(docs + [d], [0] * len(docs) + [0], lens + [200 + 30 * (step % 3)])


def plan_of(batch, source, ranks, step):
    """The planner's plan (capacity 160: the long sequence a ring), except on two steps of four, made
    by hand so that the ranks' micro-batch counts differ: a batch of one sequence runs on rank 0 alone
    (2 ranks) or as a ring of ranks 0 and 1 (4 ranks: ranks 2 and 3 run nothing); on every fourth
    step the long sequence is a ring of all the ranks, and the short ones packs of one on every rank
    but the last. On one rank every sequence is whole in a pack."""
    if ranks == 1:
        return bt.plan_step(batch, source, ranks=1, capacity=4096, policy="balance")
    segs = [((k, 0, n),) for k, n in enumerate(batch.lengths)]
    if len(batch.docs) == 1:
        items = [((0,) if ranks == 2 else (0, 1), segs[0])]
    elif step % 4 == 0:
        items = [(tuple(range(ranks)), segs[-1])] + [((k % (ranks - 1),), sg) for k, sg in enumerate(segs[:-1])]
    else:
        return bt.plan_step(batch, source, ranks=ranks, capacity=160, policy="balance")
    return bt.StepPlan(ranks, list(batch.docs), list(batch.starts), list(batch.lengths), items,
                       bt.labelled_tokens(batch, source))


def run(mode, rank, world, counts=None, tp=1):
    """STEPS clipped AdamW steps of TinyLM(seed 5) in `mode`: "fsdp" (bt.fsdp.shard; with tp 2 each
    tp rank's part sharded over its hdp group, clipped by fsdp.clip_grad_norm_) or "zero"
    (replicated, ZeRO-1). Returns the losses, the final whole parameters (tp 1), the micro-batches
    each step ran here and the gradient norms; `counts` gets the local bytes after each step."""
    ex = user_loop()
    layout = bt.Layout(tp=tp)
    model = ex.TinyLM(layout, 5)
    if mode == "fsdp":
        fsdp.shard(model, layout, blocks=model.blocks)
    if mode == "zero":
        opt = fsdp.zero_optimizer(model, layout, lr=LR, weight_decay=0.0)
    else:
        opt = torch.optim.AdamW(model.parameters(), lr=LR, weight_decay=0.0)
    source = bt.FunctionSource(ex.read, ex.doc_length)
    losses, norms, ran = [], [], []
    for s in range(STEPS):
        batch = batch_of(ex, s)
        plan = bt.broadcast_plan(lambda: plan_of(batch, source, layout.hdp, s))
        mbs = bt.microbatches(plan, layout.hdp_rank, source, layout=layout)
        total = torch.zeros((), dtype=torch.float64)
        ctx = fsdp.step(model) if mode == "fsdp" else contextlib.nullcontext()
        with ctx:
            for mb in mbs:
                with bt.microbatch_context(mb):
                    logits = model(mb.tokens, mb.pos)
                loss = F.cross_entropy(logits, mb.targets, ignore_index=-1, reduction="sum") / plan.labelled
                loss.backward()
                total += loss.detach().double()
        if mode != "fsdp":
            bt.all_reduce_gradients(model, layout=layout)
        if tp > 1:  # the norm of every tp part's FSDP shards
            norm = fsdp.clip_grad_norm_(model, CLIP)
        else:  # torch's own; FSDP: a DTensor, the whole norm
            norm = torch.nn.utils.clip_grad_norm_(model.parameters(), CLIP)
        norms.append(float(norm.full_tensor() if hasattr(norm, "full_tensor") else norm))
        opt.step()
        if counts is not None:
            counts.append(local_sizes(model, opt))
        opt.zero_grad(set_to_none=True)
        if layout.hdp > 1:
            torch.distributed.all_reduce(total, group=layout.hdp_group)
        losses.append(float(total))
        ran.append(len(mbs))
    whole = {k: (v.full_tensor() if hasattr(v, "full_tensor") else v).detach().clone()
             for k, v in model.state_dict().items()} if tp == 1 else None
    return losses, whole, ran, norms


def local_sizes(model, opt):
    """fsdp.local_bytes after the optimizer's step (its state made)."""
    return fsdp.local_bytes(model, opt)


def count_collectives(rank, world):
    """The all-gathers and reduce-scatters one FSDP step runs on this rank (torch.distributed's
    functions counted while they run), for a plan where rank 0 runs 3 micro-batches and the others
    fewer or none."""
    ex = user_loop()
    layout = bt.Layout()
    model = fsdp.shard(ex.TinyLM(layout, 5), layout, blocks="blocks")
    source = bt.FunctionSource(ex.read, ex.doc_length)
    batch = bt.Batch([5, 2, 1, 3], [0, 0, 0, 0], [40, 50, 30, 200])
    items = [((0,), ((0, 0, 40),)), ((0,), ((1, 0, 50),)), ((1,), ((2, 0, 30),)), ((0, 1), ((3, 0, 200),))]
    plan = bt.StepPlan(world, batch.docs, batch.starts, batch.lengths, items, bt.labelled_tokens(batch, source))
    seen = {"all_gather": 0, "reduce_scatter": 0, "other": 0}
    dist = torch.distributed
    names = ("all_gather_single", "all_gather_into_tensor", "reduce_scatter_single", "reduce_scatter_tensor",
             "all_reduce", "broadcast", "all_gather")
    orig = {k: getattr(dist, k) for k in names}

    def counting(name, fn):
        def f(*a, **kw):
            key = "all_gather" if name.startswith("all_gather_") else \
                "reduce_scatter" if name.startswith("reduce_scatter") else "other"
            seen[key] += 1
            return fn(*a, **kw)
        return f
    mbs = bt.microbatches(plan, rank, source)  # (its check: one all_gather on the control group)
    for k, fn in orig.items():
        setattr(dist, k, counting(k, fn))
    try:
        with fsdp.step(model):
            for mb in mbs:
                with bt.microbatch_context(mb):
                    loss = model(mb.tokens, mb.pos).sum() * 0 + 1
                loss.backward()
    finally:
        for k, fn in orig.items():
            setattr(dist, k, fn)
    return len(mbs), seen


HF_STEPS = 3


def hf_run(rank, world, sharded):
    """HF_STEPS AdamW steps of a Hugging Face Llama (bytescale.torch.hf's small config, HDP attention)
    sharded over the HDP ranks with blocks="model.layers" (sharded), or on one process (the
    reference: a plan of one rank). Returns the losses and the final whole parameters."""
    from bytescale.torch import hf
    ex = user_loop()
    model = hf.small_model("llama", seed=3)
    if sharded:
        fsdp.shard(model, bt.Layout(), blocks="model.layers")
    opt = torch.optim.AdamW(model.parameters(), lr=LR, weight_decay=0.0)
    source = bt.FunctionSource(ex.read, ex.doc_length)
    losses = []
    for s in range(HF_STEPS):
        batch = batch_of(ex, s + 1)
        plan = bt.broadcast_plan(lambda: plan_of(batch, source, world, s + 1)) if sharded else \
            plan_of(batch, source, 1, s + 1)
        total = torch.zeros((), dtype=torch.float64)
        with fsdp.step(model) if sharded else contextlib.nullcontext():
            for mb in bt.microbatches(plan, rank, source, check=sharded):
                with bt.microbatch_context(mb):
                    logits = hf.logits(model, mb)
                loss = hf.loss_sum(logits, mb.targets) / plan.labelled
                loss.backward()
                total += loss.detach().double()
        opt.step()
        opt.zero_grad(set_to_none=True)
        if sharded:
            torch.distributed.all_reduce(total)
        losses.append(float(total))
    return losses, {k: (v.full_tensor() if hasattr(v, "full_tensor") else v).detach().clone()
                    for k, v in model.state_dict().items()}


def hf_worker(rank, world):
    """FSDP2 on a Hugging Face model's layers, and (rank 0) its one-process reference."""
    out = {"hf": hf_run(rank, world, True)}
    if rank == 0:
        out["hf_ref"] = hf_run(0, 1, False)
    return out


def test_fsdp_on_a_hugging_face_model():
    """The API is generic: blocks="model.layers" shards a transformers LlamaForCausalLM whose
    attention is bytescale's (hf.register), on 2 processes, and trains the one-process losses."""
    pytest.importorskip("transformers")
    res = launch.spawn(hf_worker, 2, preload=["transformers", "transformers.models.llama.modeling_llama"])
    losses, params = res[0]["hf"]
    ref_losses, ref_params = res[0]["hf_ref"]
    assert max(rel(a, b) for a, b in zip(losses, ref_losses)) < TOL, (losses, ref_losses)
    assert rel(losses[-1], losses[0]) > 1e-3  # it trains
    for k, v in ref_params.items():
        assert float((params[k] - v).abs().max()) <= TOL * max(float(v.abs().max()), 1.0), k


def worker(rank, world):
    out = {"count": count_collectives(rank, world)}
    for mode in ("fsdp", "zero"):
        counts = []
        out[mode] = run(mode, rank, world, counts)
        out[mode + "_bytes"] = counts[-1]
    if world == 4:
        out["fsdp_tp"] = run("fsdp", rank, world, tp=2)
    out["refuse"] = refuse(rank, world)
    if rank == 0:
        out["ref"] = reference()
    return out


def reference():
    """The one-process run without a process group's collectives: a plan of one rank (launch.init of a
    world of 1 is not needed: one rank's plan sends nothing, and microbatches' check is skipped)."""
    ex = user_loop()
    model = ex.TinyLM(bt.Layout(world=1, rank=0), 5)
    opt = torch.optim.AdamW(model.parameters(), lr=LR, weight_decay=0.0)
    source = bt.FunctionSource(ex.read, ex.doc_length)
    losses, norms = [], []
    for s in range(STEPS):
        batch = batch_of(ex, s)
        plan = plan_of(batch, source, 1, s)
        total = 0.0
        for mb in bt.microbatches(plan, 0, source, check=False):
            with bt.microbatch_context(mb):
                logits = model(mb.tokens, mb.pos)
            loss = F.cross_entropy(logits, mb.targets, ignore_index=-1, reduction="sum") / plan.labelled
            loss.backward()
            total += float(loss.detach().double())
        norms.append(float(torch.nn.utils.clip_grad_norm_(model.parameters(), CLIP)))
        opt.step()
        opt.zero_grad(set_to_none=True)
        losses.append(total)
    return losses, {k: v.detach().clone() for k, v in model.state_dict().items()}, norms


def rel(a, b):
    return abs(a - b) / max(abs(b), 1e-30)


@pytest.mark.parametrize("world", [2, 4])
def test_fsdp_and_zero_match_one_process(world):
    res = launch.spawn(worker, world)
    ref_losses, ref_params, ref_norms = res[0]["ref"]
    # every rank ran the same FSDP collectives (one all-gather and one reduce-scatter per unit: 2
    # blocks and the root), whatever its micro-batches: 3, 1 and (on 4) none
    ran = [r["count"][0] for r in res]
    assert ran[:2] == [3, 2] and all(n == 0 for n in ran[2:]), ran
    want = {"all_gather": 3, "reduce_scatter": 3, "other": 0}
    assert all(r["count"][1] == want for r in res), [r["count"][1] for r in res]
    for mode in ("fsdp", "zero"):
        losses, params, steps_ran, norms = res[0][mode]
        # the plans made ranks run different numbers of micro-batches, and some none
        per_rank = np.array([r[mode][2] for r in res])
        assert (per_rank.min(0) != per_rank.max(0)).any() and (per_rank == 0).any(), per_rank
        worst = max(rel(a, b) for a, b in zip(losses, ref_losses))
        assert worst < TOL, (mode, world, losses, ref_losses)
        # the gradient norm before clipping, every step: the gradients are the SUM over the ranks
        # (AdamW would hide a factor in the losses: it is scale-invariant but for eps)
        assert max(rel(a, b) for a, b in zip(norms, ref_norms)) < TOL, (mode, world, norms, ref_norms)
        for k, v in ref_params.items():
            scale = float(v.abs().max())
            assert float((params[k] - v).abs().max()) <= TOL * max(scale, 1.0), (mode, k)
        for r in res[1:]:  # every rank ends with the same whole parameters
            for k, v in r[mode][1].items():
                assert torch.equal(v, params[k]), (mode, k)
    if world == 4:  # tp 2 x hdp 2: FSDP over each tp part's hdp group, the losses and norms of one process
        losses, _, _, norms = res[0]["fsdp_tp"]
        per_rank = np.array([r["fsdp_tp"][2] for r in res])
        assert (per_rank == 0).any() and (per_rank.min(0) != per_rank.max(0)).any(), per_rank
        assert max(rel(a, b) for a, b in zip(losses, ref_losses)) < TOL, (losses, ref_losses)
        assert max(rel(a, b) for a, b in zip(norms, ref_norms)) < TOL, (norms, ref_norms)
    # local bytes after the optimizer's step: FSDP holds its share of the parameters, gradients and
    # Adam state; ZeRO-1 the whole parameters and gradients and its share of the state
    n = sum(v.numel() * 4 for v in ref_params.values())
    f = [r["fsdp_bytes"] for r in res]
    z = [r["zero_bytes"] for r in res]
    assert sum(b["params"] for b in f) == n and sum(b["grads"] for b in f) == n
    assert sum(b["optimizer"] for b in f) > 2 * n * 0.99
    assert all(b["params"] <= math.ceil(n / world) + 4096 for b in f), f
    assert all(b["params"] == n for b in z) and sum(b["optimizer"] for b in z) < 2 * n * 1.01, z
    # what shard and step refuse, the same words on every rank
    msgs = res[0]["refuse"]
    assert all(r["refuse"] == msgs for r in res)
    assert "a layout of tp 1 x pp 2: FSDP2 over the HDP dimension runs on one pipeline stage" in msgs[0], msgs[0]
    assert "blocks='no_such': the model has no such submodule" in msgs[1], msgs[1]
    assert "block 0 (Linear) is not a submodule of the model" in msgs[2], msgs[2]
    assert "was not sharded by bytescale.torch.fsdp.shard" in msgs[3], msgs[3]
    assert "mp_policy= is not supported" in msgs[4], msgs[4]


def refuse(rank, world):
    ex = user_loop()
    msgs = []
    for make in (lambda: fsdp.shard(ex.TinyLM(bt.Layout(), 5), bt.Layout(pp=2), blocks="blocks"),
                 lambda: fsdp.shard(ex.TinyLM(bt.Layout(), 5), blocks="no_such"),
                 lambda: fsdp.shard(ex.TinyLM(bt.Layout(), 5), blocks=[torch.nn.Linear(2, 2)]),
                 lambda: fsdp.step(ex.TinyLM(bt.Layout(), 5)).__enter__(),
                 lambda: fsdp.shard(ex.TinyLM(bt.Layout(), 5), blocks="blocks", mp_policy=None)):
        try:
            make()
            msgs.append(None)
        except fsdp.FSDPError as e:
            msgs.append(str(e))
    return msgs
