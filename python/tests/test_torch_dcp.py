"""Distributed checkpoints (bytescale.torch.dcp, docs/torch-fsdp.md): the user's model of
examples/torch_user_loop.py with AdamW and a loader of the test's own (a seed and a step counter
that draw each step's batch), saved after 3 steps and resumed for 3 more on another world size and
layout: FSDP2 on 2 processes resumed on 3 (FSDP2 again, and replicated); ZeRO-1 on 2 resumed on 3
(ZeRO-1 again, another partition, and a plain AdamW); tp 2 x hdp 2 on 4 resumed at tp 1 on 3
(under ZeRO-1) and as FSDP over the tp parts on 4; FSDP over the tp parts on 4 resumed at tp 1 on
3; HDPTrainer(zero=True) on 2 resumed on 3 with and without ZeRO-1. The resumed losses equal the
uninterrupted run's to 1e-6 relative (fp32); ZeRO-1 loads the Adam
state of its own share only; ZeRO-1 and FSDP over tp write the keys and whole shapes a plain
optimizer and TP write. Also what a crash before the rename leaves (the previous checkpoint,
readable), and the refusals, the same error on every rank: a missing directory, no manifest, a
damaged file, another model.
"""

import contextlib
import os
import shutil

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import torch.nn.functional as F  # noqa: E402

import bytescale.torch as bt  # noqa: E402
from bytescale.torch import dcp, fsdp, launch  # noqa: E402
from bytescale.torch.checkpoint import CheckpointError  # noqa: E402
from conftest import load_example  # noqa: E402

LR = 3e-3
CAPACITY = 160
TOL = 1e-6


def user_loop():
    return load_example("torch_user_loop")


class Draw:
    """The test's loader: each step's batch drawn from (seed, step), 4 short documents and a long one
    cut at 300 tokens (a ring of 2 at capacity 160); its state is the same on every rank."""

    def __init__(self, ex, seed):
        self.ex, self.seed, self.step = ex, seed, 0

    def next_batch(self):
        rng = np.random.default_rng([self.seed, self.step])
        self.step += 1
        shorts = [d for d in range(300) if d % 7 != 3 and self.ex.doc_length(d) < 120]
        docs = [int(x) for x in rng.choice(shorts, 4, replace=False)] + [int(rng.choice(range(3, 300, 7)))]
        lens = [self.ex.doc_length(d) for d in docs[:-1]] + [300]
        return bt.Batch(docs, [0] * 5, lens)

    def state_dict(self):
        return {"seed": self.seed, "step": self.step}

    def load_state_dict(self, sd):
        self.seed, self.step = sd["seed"], sd["step"]


def make(mode, tp, ex, d=32):
    """The model of `mode` (replicated, fsdp, tp; zero: replicated with ZeRO-1's AdamW) and its AdamW."""
    layout = bt.Layout(tp=tp)
    model = ex.TinyLM(layout, 7, d=d)
    if mode == "fsdp":
        fsdp.shard(model, layout, blocks="blocks")
    if mode == "zero":
        return layout, model, fsdp.zero_optimizer(model, layout, lr=LR, weight_decay=0.0)
    return layout, model, torch.optim.AdamW(model.parameters(), lr=LR, weight_decay=0.0)


def train_step(mode, layout, model, opt, loader, source):
    """One step; the batch's mean token loss (the same on every rank)."""
    batch = loader.next_batch()
    plan = bt.broadcast_plan(lambda: bt.plan_step(batch, source, ranks=layout.hdp, capacity=CAPACITY,
                                                  policy="balance"))
    mbs = bt.microbatches(plan, layout.hdp_rank, source, layout=layout)
    total = torch.zeros((), dtype=torch.float64)
    with fsdp.step(model) if mode == "fsdp" else contextlib.nullcontext():
        for mb in mbs:
            with bt.microbatch_context(mb):
                logits = model(mb.tokens, mb.pos)
            loss = F.cross_entropy(logits, mb.targets, ignore_index=-1, reduction="sum") / plan.labelled
            loss.backward()
            total += loss.detach().double()
    if mode != "fsdp":
        bt.all_reduce_gradients(model, layout=layout)
    opt.step()
    opt.zero_grad(set_to_none=True)
    if layout.hdp > 1:
        torch.distributed.all_reduce(total, group=layout.hdp_group)
    return float(total)


def share(model, opt):
    """ZeRO-1: (parameters whose Adam state this rank holds, parameters of its share, all of them)."""
    params = list(model.parameters())
    mine = {p for g in opt.optim.param_groups for p in g["params"]}
    return (sum(1 for p in params if opt.optim.state.get(p)), sum(1 for p in params if p in mine), len(params))


def segment(mode, tp, steps, load_from=None, save_to=None, held=None):
    """`steps` steps of a fresh model of `mode`, from the checkpoint load_from if given; saves to
    save_to at the end. Returns the losses; `held` (a list) gets ZeRO-1's share() after the load."""
    ex = user_loop()
    layout, model, opt = make(mode, tp, ex)
    loader = Draw(ex, 11)
    source = bt.FunctionSource(ex.read, ex.doc_length)
    if load_from:
        state = dcp.load(load_from, model, opt, loader=loader)
        assert state["step"] == loader.step == 3, (state["step"], loader.step)
        if held is not None:
            held.append(share(model, opt))
    losses = [train_step(mode, layout, model, opt, loader, source) for _ in range(steps)]
    if save_to:
        dcp.save(save_to, model, opt, step=loader.step, loader=loader, extra={"mode": mode})
    return losses


def trainer_run(zero, steps, load_from=None, save_at=None):
    """HDPTrainer (zero: ZeRO-1's optimizer, two parameter groups) on the reference Llama ("tiny"),
    the loader's batches: `steps` steps, from the checkpoint load_from (its step restarts the LR
    schedule there), saved to save_at[1] after save_at[0] steps. Returns the losses."""
    ex = user_loop()
    model = bt.Llama(bt.LlamaConfig.named("tiny")).init_weights(seed=3)
    trainer = bt.HDPTrainer(model, lr=LR, warmup=2, schedule_steps=6, zero=zero)
    loader = Draw(ex, 11)
    source = bt.FunctionSource(ex.read, ex.doc_length)
    world, rank = torch.distributed.get_world_size(), torch.distributed.get_rank()
    if load_from:
        trainer.step_count = dcp.load(load_from, model, trainer.opt, loader=loader)["step"]
    losses = []
    for s in range(steps):
        batch = loader.next_batch()
        plan = bt.broadcast_plan(lambda: bt.plan_step(batch, source, ranks=world, capacity=CAPACITY,
                                                      policy="balance"))
        losses.append(trainer.step(plan, bt.microbatches(plan, rank, source)).loss)
        if save_at and s + 1 == save_at[0]:
            dcp.save(save_at[1], model, trainer.opt, step=trainer.step_count, loader=loader)
    return losses


def refusal(fn):
    try:
        fn()
    except CheckpointError as e:
        return str(e)
    return None


def refusals(rank, base):
    """Every refusal on every rank (the messages returned), and a crash before the rename."""
    ex = user_loop()
    good = os.path.join(base, "fsdp")
    out = {}
    layout, model, opt = make("replicated", 1, ex)
    out["missing"] = refusal(lambda: dcp.load(os.path.join(base, "nothing"), model, opt))
    if rank == 0:  # copies of the good checkpoint, one without its manifest, one with a byte changed
        shutil.copytree(good, os.path.join(base, "nomanifest"))
        os.unlink(os.path.join(base, "nomanifest", dcp.MANIFEST))
        shutil.copytree(good, os.path.join(base, "damaged"))
        data = sorted(f for f in os.listdir(os.path.join(base, "damaged")) if f.endswith(".distcp"))[0]
        with open(os.path.join(base, "damaged", data), "r+b") as f:
            f.seek(100)
            b = f.read(1)
            f.seek(100)
            f.write(bytes([b[0] ^ 1]))
    torch.distributed.barrier()
    out["nomanifest"] = refusal(lambda: dcp.load(os.path.join(base, "nomanifest"), model, opt))
    out["damaged"] = refusal(lambda: dcp.load(os.path.join(base, "damaged"), model, opt))
    _, wide, wide_opt = make("replicated", 1, ex, d=48)
    out["other_model"] = refusal(lambda: dcp.load(good, wide, wide_opt))
    # a crash on rank 0 before the rename (the tensors written, no manifest, no rename): the save
    # fails on every rank, and the previous checkpoint at that path is whole and reads back
    orig = dcp.before_publish

    def crash(tmp):
        raise OSError("simulated crash before the rename")
    dcp.before_publish = crash
    try:
        out["crash"] = refusal(lambda: dcp.save(good, model, opt, step=99, loader=Draw(ex, 0)))
    finally:
        dcp.before_publish = orig
    loader = Draw(ex, 0)
    out["after_crash_step"] = dcp.load(good, model, opt, loader=loader)["step"]
    out["after_crash_loader"] = loader.state_dict()
    out["leftover"] = sorted(n for n in os.listdir(base) if ".tmp-" in n)
    return out


def job_two(rank, world, base):
    """2 processes: the uninterrupted FSDP run; 3 FSDP steps saved, 3 ZeRO-1 steps saved; the refusals."""
    whole = segment("fsdp", 1, 6)
    first = segment("fsdp", 1, 3, save_to=os.path.join(base, "fsdp"))
    zero = segment("zero", 1, 3, save_to=os.path.join(base, "zero"))
    trainer = trainer_run(True, 6, save_at=(3, os.path.join(base, "trainer")))
    return {"whole": whole, "first": first, "zero": zero, "trainer": trainer, "refusals": refusals(rank, base)}


def job_four(rank, world, base):
    """4 processes, tp 2 x hdp 2: the uninterrupted run; 3 steps saved, TP and FSDP over the tp parts;
    the TP checkpoint resumed as FSDP over the tp parts."""
    whole = segment("tp", 2, 6)
    first = segment("tp", 2, 3, save_to=os.path.join(base, "tp"))
    fsdp_first = segment("fsdp", 2, 3, save_to=os.path.join(base, "fsdp-tp"))
    return {"whole": whole, "first": first, "fsdp_first": fsdp_first,
            "tp_fsdp": segment("fsdp", 2, 3, load_from=os.path.join(base, "tp"))}


def job_three(rank, world, base):
    """3 processes: the FSDP checkpoint of 2 resumed as FSDP and as replicated, the ZeRO-1 one of 2
    under ZeRO-1 (another partition) and with a plain AdamW, the tp 2 one (a plain AdamW's) at tp 1
    under ZeRO-1, the FSDP-over-tp-2 one at tp 1."""
    held = []
    return {"fsdp": segment("fsdp", 1, 3, load_from=os.path.join(base, "fsdp")),
            "replicated": segment("replicated", 1, 3, load_from=os.path.join(base, "fsdp")),
            "zero_zero": segment("zero", 1, 3, load_from=os.path.join(base, "zero"), held=held),
            "zero_plain": segment("replicated", 1, 3, load_from=os.path.join(base, "zero")),
            "tp": segment("zero", 1, 3, load_from=os.path.join(base, "tp"), held=held),
            "fsdp_tp": segment("replicated", 1, 3, load_from=os.path.join(base, "fsdp-tp")), "held": held,
            "trainer_zero": trainer_run(True, 3, load_from=os.path.join(base, "trainer")),
            "trainer_plain": trainer_run(False, 3, load_from=os.path.join(base, "trainer"))}


def keys(path):
    """A checkpoint's keys and whole shapes (DCP's metadata), the pickled state left out."""
    from torch.distributed.checkpoint import FileSystemReader
    meta = FileSystemReader(path).read_metadata().state_dict_metadata
    return {k: tuple(getattr(m, "size", ())) for k, m in meta.items() if not k.startswith("extra.")}


def rel(a, b):
    return max(abs(x - y) / abs(y) for x, y in zip(a, b))


def test_resume_on_other_world_and_layout(tmp_path):
    base = str(tmp_path)
    two = launch.spawn(job_two, 2, args=(base,))
    four = launch.spawn(job_four, 4, args=(base,))
    three = launch.spawn(job_three, 3, args=(base,))
    w2, w4 = two[0]["whole"], four[0]["whole"]
    # the first 3 steps of each run are the uninterrupted run's, and so is what the resumed runs do
    assert rel(two[0]["first"], w2[:3]) < TOL and rel(four[0]["first"], w4[:3]) < TOL
    assert rel(two[0]["zero"], w2[:3]) < TOL, (two[0]["zero"], w2[:3])
    for r in three:
        for k in ("fsdp", "replicated", "zero_zero", "zero_plain"):
            assert rel(r[k], w2[3:]) < TOL, (k, r[k], w2[3:])
        assert rel(r["tp"], w4[3:]) < TOL, (r["tp"], w4[3:])
        assert rel(r["fsdp_tp"], w4[3:]) < TOL, (r["fsdp_tp"], w4[3:])
        for k in ("trainer_zero", "trainer_plain"):  # HDPTrainer(zero=True) on 2, saved mid-run
            assert rel(r[k], two[0]["trainer"][3:]) < TOL, (k, r[k], two[0]["trainer"])
    for r in four:  # FSDP over the tp parts: its first 3 steps, and the TP checkpoint resumed in it
        assert rel(r["fsdp_first"], w4[:3]) < TOL and rel(r["tp_fsdp"], w4[3:]) < TOL, r
    # ZeRO-1 on 3: each rank loaded the Adam state of its own share only, and the shares cover the model
    held = [r["held"] for r in three]
    for h in held:
        assert all(state == mine < total for state, mine, total in h), held
    assert all(sum(h[i][1] for h in held) == held[0][i][2] for i in range(2)), held
    # a ZeRO-1 checkpoint is the one a plain optimizer writes: the same keys and whole shapes
    assert keys(os.path.join(base, "zero")) == keys(os.path.join(base, "fsdp"))
    assert any(k.endswith(".exp_avg_sq") for k in keys(os.path.join(base, "zero")))
    print("largest relative loss difference of each resume:",
          {k: f"{max(rel(r[k], w2[3:] if k != 'tp' else w4[3:]) for r in three):.1e}"
           for k in ("fsdp", "replicated", "zero_zero", "zero_plain", "tp", "fsdp_tp")},
          "tp -> fsdp over tp:", f"{max(rel(r['tp_fsdp'], w4[3:]) for r in four):.1e}",
          "HDPTrainer zero 2 -> zero 3, plain 3:",
          [f"{max(rel(r[k], two[0]['trainer'][3:]) for r in three):.1e}" for k in ("trainer_zero", "trainer_plain")])
    # and the steps after the checkpoint are not those before it (the resume does continue)
    assert rel(w2[3:], w2[:3]) > 1e-3
    # FSDP over tp 2 writes the TP checkpoint's keys and whole shapes
    assert keys(os.path.join(base, "fsdp-tp")) == keys(os.path.join(base, "tp"))
    # refusals, the same on every rank
    r0 = two[0]["refusals"]
    assert two[1]["refusals"] == r0
    assert "no such directory" in r0["missing"], r0
    assert f"no {dcp.MANIFEST}" in r0["nomanifest"], r0
    assert "CRC-32" in r0["damaged"] and "(damaged)" in r0["damaged"] and "found by rank 0" in r0["damaged"], r0
    assert "'emb.weight' has shape (64, 32) there, (64, 48) in the model: not this model's" in r0["other_model"], r0
    assert "simulated crash before the rename" in r0["crash"], r0
    assert r0["after_crash_step"] == 3 and r0["after_crash_loader"] == {"seed": 11, "step": 3}, r0
    assert len(r0["leftover"]) == 1, r0
