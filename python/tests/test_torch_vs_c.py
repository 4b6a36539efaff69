"""Across implementations: the torch trainer and the C engine (`bytescale train`), same weights, same
batch, same plan: the same loss within 1e-5 and the same gradients within 1e-4.

The C engine's gradients come out of its checkpoints, through the documented layout
(docs/training.md): with `--clip 0` AdamW's first moment after step s is
m_s = b1 m_{s-1} + (1 - b1) g_s (src/nn/adamw.c, fp32), so two consecutive checkpoints give the
gradient of step 2 exactly: g_2 = (m_2 - b1 m_1) / (1 - b1). Step 2 ran at the parameters of
checkpoint 1, on the batch and plan `--save-plans` wrote, and its loss is in the metrics file. The
torch side loads checkpoint 1's parameters into the reference LLaMA, reads the same rows from the
same prepared dataset, runs the C plan (rings included, on as many processes as the C job had
ranks), and compares. It also takes the AdamW step from checkpoint 1's moments and compares the
parameters with checkpoint 2's. test_torch_vs_c_a2a.py runs the same comparison (compare(), with
more flags for the C job) on plans of all-to-all and hybrid items.
"""

import json
import math
import os
import shutil
import subprocess

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import bytescale.torch as bt  # noqa: E402
from bytescale.torch import launch  # noqa: E402
from conftest import ROOT  # noqa: E402

B1, B2 = np.float32(0.9), np.float32(0.95)


def binary():
    path = os.environ.get("BS_BINARY") or str(ROOT / "build" / "bytescale")
    if not os.access(path, os.X_OK):
        pytest.skip(f"the bytescale command is not at {path} (build it with make, or set BS_BINARY)")
    return path


def corpus(tmp):
    """A small prepared dataset: Go-like text files of many lengths (some longer than the context,
    so the sampler cuts pieces whose labels continue into the next piece)."""
    src = tmp / "text"
    src.mkdir()
    rng = np.random.default_rng(11)
    words = ["func", "return", "if", "err", "!=", "nil", "{", "}", "package", "main", "import", "fmt", "x", ":=",
             "for", "range", "\n", "\t", "(", ")", "int", "string", "var", "//", "type", "struct"]
    for i in range(60):
        n = int(rng.integers(30, 1200)) if i % 7 else int(rng.integers(1500, 4000))
        text = " ".join(words[j] for j in rng.integers(0, len(words), n // 4 + 1))[:n]
        (src / f"f{i:03d}.go").write_text(text)
    out = tmp / "ds"
    r = subprocess.run([binary(), "prepare", "--input", str(src), "--out", str(out)], capture_output=True, text=True,
                       env=dict(os.environ, BS_QUIET="1"), timeout=120)
    assert r.returncode == 0, r.stderr
    return out


def c_train(tmp, data, procs, capacity, extra=(), case=None):
    """Two steps of `bytescale train` (mpirun when procs > 1): checkpoints after each, plans, metrics.
    extra: more flags (--policy, --tp, --pp, --cost); procs: every MPI process (tp x pp x HDP ranks);
    case: the run's directory name (default: made from procs and extra)."""
    run = tmp / (case or ("c" + "".join(str(a) for a in (procs,) + tuple(extra)).replace("-", "").replace("/", "")))
    args = [binary(), "train", "--data", str(data), "--model", "tiny", "--context", "256", "--capacity", str(capacity),
            "--tokens", "2K", "--steps", "2", "--warmup", "1", "--lr", "1e-3", "--clip", "0", "--seed", "7",
            "--ckpt-dir", str(run / "ck"), "--ckpt-every", "1", "--ckpt-keep", "0", "--save-plans", str(run / "plans"),
            "--metrics", str(run / "m.jsonl"), *map(str, extra)]
    env = dict(os.environ, BS_QUIET="1", OPENBLAS_NUM_THREADS="1", OMPI_ALLOW_RUN_AS_ROOT="1",
               OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
    if procs > 1:
        mpirun = shutil.which("mpirun") or shutil.which("mpiexec")
        if not mpirun:
            pytest.skip("no mpirun: the C engine's rings need MPI ranks")
        args = [mpirun, "--oversubscribe", "-np", str(procs)] + args
    (run / "plans").mkdir(parents=True)
    r = subprocess.run(args, capture_output=True, text=True, env=env, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    metrics = [json.loads(line) for line in (run / "m.jsonl").read_text().splitlines()]
    return run, metrics


def torch_step(rank, world, data, ckpt1, plan_file):
    """The C plan of step 2 at checkpoint 1's weights, in torch (fp32 as the C engine, and fp64)."""
    ds = bt.Dataset(data)
    ck = bt.read_checkpoint(ckpt1)
    cfg = bt.LlamaConfig.from_dict(ck.config["model"])
    with open(plan_file) as f:
        plan = bt.StepPlan.from_plan_file(json.load(f), ds.doc_offset, ds.doc_len)
    out = {"labelled": plan.labelled, "rings": plan.n_rings}
    for dtype in (torch.float32, torch.float64):
        model = bt.Llama(cfg, dtype=dtype)
        bt.load_params(model, ck)
        trainer = bt.HDPTrainer(model, clip=0)
        mbs = bt.microbatches(plan, rank, ds, ring_stats=trainer.ring_stats)
        # what this rank ran each item as: the Ulysses group size (a2a, hybrid), 0 for a ring or a pack
        out["ran"] = {mb.item: mb.ulysses.u if mb.ulysses else 0 for mb in mbs}
        res = trainer.step(plan, mbs, apply=False)
        out[dtype] = (res.loss, res.grad_norm, trainer.flat_grad.double().clone())
    return out


def compare(tmp, ranks, capacity, extra=(), tp=1, case=None):
    """The C job (ranks HDP ranks x tp) against torch on `ranks` processes, at step 2. Returns the
    plan file's items (for the caller's checks of what kinds it holds)."""
    data = corpus(tmp) if not (tmp / "ds").exists() else tmp / "ds"
    run, metrics = c_train(tmp, data, ranks * tp, capacity, extra, case)
    ck1 = bt.read_checkpoint(run / "ck" / "ckpt-000001.bin")
    ck2 = bt.read_checkpoint(run / "ck" / "ckpt-000002.bin")
    m1, m2 = ck1.floats("adam.m"), ck2.floats("adam.m")
    g_c = (m2.astype(np.float64) - B1.astype(np.float64) * m1) / np.float64(np.float32(1) - B1)
    plan_file = str(run / "plans" / "plan-000002.json")
    with open(plan_file) as f:
        items = json.load(f)["items"]
    if ranks == 1:
        results = [torch_step(0, 1, str(data), str(run / "ck" / "ckpt-000001.bin"), plan_file)]
    else:
        results = launch.spawn(torch_step, ranks, args=(str(data), str(run / "ck" / "ckpt-000001.bin"), plan_file))
    t = results[0]
    assert t["labelled"] == metrics[1]["targets"]
    for k, it in enumerate(items):  # every member ran the item as the C plan's kind, not as a ring
        u = int(it.get("ulysses", 0)) or (len(it["ranks"]) if it.get("a2a") and len(it["ranks"]) > 1 else 0)
        assert all(results[r]["ran"][k] == u for r in it["ranks"]), (k, it)
    if not extra:
        assert (t["rings"] > 0) == (capacity < 256)
    c_loss = metrics[1]["loss"]
    layout = bt.Llama(bt.LlamaConfig.from_dict(ck1.config["model"])).layout
    rows = []
    for dtype in (torch.float32, torch.float64):
        loss, norm, g_t = t[dtype]
        g_t = g_t.numpy()
        loss_err = abs(loss - c_loss) / abs(c_loss)
        grad_err = 0.0
        for name, off, shape, _ in layout:
            n = math.prod(shape)
            ref = g_c[off:off + n]
            grad_err = max(grad_err, float(np.abs(g_t[off:off + n] - ref).max() / max(np.abs(ref).max(), 1e-30)))
        rows.append((dtype, loss_err, grad_err, abs(norm - metrics[1]["grad_norm"]) / metrics[1]["grad_norm"]))
        assert loss_err < 1e-5, (dtype, loss, c_loss)
        assert grad_err < 1e-4, (dtype, grad_err)
    # AdamW from checkpoint 1's state with torch's gradient gives checkpoint 2's parameters
    g = t[torch.float32][2].numpy().astype(np.float32)
    cfg = json.loads(ck1.sections["config"])["settings"]
    lr, wd, eps = np.float32(cfg["lr"]), np.float32(cfg["weight_decay"]), np.float32(cfg["eps"])
    t_adam = ck1.state["adam_t"] + 1
    m = B1 * m1 + (np.float32(1) - B1) * g
    v = B2 * ck1.floats("adam.v") + (np.float32(1) - B2) * g * g
    mhat = m / np.float32(1 - 0.9 ** t_adam)
    vhat = v / np.float32(1 - 0.95 ** t_adam)
    decay = np.zeros_like(g)
    for _, off, shape, dec in layout:
        decay[off:off + math.prod(shape)] = wd if dec else 0
    p1 = ck1.floats("params")
    p2 = p1 - lr * (mhat / (np.sqrt(vhat) + eps) + decay * p1)
    step_err = float(np.abs(p2 - ck2.floats("params")).max() / lr)
    label = f"{ranks} rank(s)" + (f" x tp {tp}" if tp > 1 else "") + f", capacity {capacity}"
    label += f", {case}" if case else ""
    print(f"\nC engine vs torch, {label}: " + "; ".join(
        f"{str(d).split('.')[-1]}: loss {l:.1e}, gradients {g_:.1e}, grad norm {n_:.1e}" for d, l, g_, n_ in rows)
        + f"; parameters after the step within {step_err:.2g} lr")
    # Adam moves a weight by about lr * sign(gradient): gradients at fp32 rounding level may differ
    # in sign, so the bound is a fraction of lr, not of the weight
    assert step_err < 0.5
    return items


def test_c_engine_one_process(tmp_path):
    compare(tmp_path, 1, 256)


def test_c_engine_two_ranks_with_rings(tmp_path):
    compare(tmp_path, 2, 128)
