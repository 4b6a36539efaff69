"""Across implementations in 3D: bytescale.torch on a (tp, pp, hdp) Layout against `mpirun -np N
bytescale train --tp T --pp P` (N = 4, and 8 for tp 2 x pp 2 x hdp 2; docs/torch.md, "3D"): same
weights (checkpoint 1), same batch and plan (--save-plans: the C engine's PP-Balance plan for its
HDP ranks), the loss, the gradient norm and every gradient of the whole model (the C engine's from
two consecutive checkpoints' AdamW moments, as test_torch_vs_c.py; torch's gathered from the parts
through Llama.full_index).
"""

import json
import math

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import bytescale.torch as bt  # noqa: E402
from bytescale.torch import launch  # noqa: E402
from test_torch_vs_c import B1, c_train, corpus  # noqa: E402


def torch_step(rank, world, data, ckpt1, plan_file, tp, pp):
    """Step 2's C plan at checkpoint 1's weights on this process's part (fp32 as the C engine, fp64)."""
    layout = bt.Layout(tp=tp, pp=pp)
    ds = bt.Dataset(data)
    ck = bt.read_checkpoint(ckpt1)
    cfg = bt.LlamaConfig.from_dict(ck.config["model"])
    with open(plan_file) as f:
        plan = bt.StepPlan.from_plan_file(json.load(f), ds.doc_offset, ds.doc_len)
    out = {"where": (layout.stage, layout.hdp_rank, layout.tp_rank), "labelled": plan.labelled,
           "rings": plan.n_rings, "items": len(plan.schedule(layout.hdp_rank))}
    for dtype in (torch.float32, torch.float64):
        model = bt.Llama(cfg, dtype=dtype, parallel=layout)
        bt.load_params(model, ck)
        trainer = bt.HDPTrainer(model, clip=0)
        mbs = bt.microbatches(plan, layout.hdp_rank, ds, ring_stats=trainer.ring_stats, layout=layout)
        res = trainer.step(plan, mbs, apply=False)
        out[dtype] = (res.loss, res.grad_norm, trainer.flat_grad.double().clone(), model.full_index())
    return out


@pytest.mark.parametrize("tp,pp,hdp,capacity", [(2, 1, 2, 128), (1, 2, 2, 128), (2, 2, 1, 256), (2, 2, 2, 128)],
                         ids=["tp2-hdp2", "pp2-hdp2", "tp2-pp2", "tp2-pp2-hdp2"])
def test_3d_matches_c_engine(tmp_path, tp, pp, hdp, capacity):
    data = corpus(tmp_path)
    world = tp * pp * hdp
    run, metrics = c_train(tmp_path, data, world, capacity, ("--tp", tp, "--pp", pp))
    ck1 = bt.read_checkpoint(run / "ck" / "ckpt-000001.bin")
    ck2 = bt.read_checkpoint(run / "ck" / "ckpt-000002.bin")
    g_c = (ck2.floats("adam.m").astype(np.float64) - np.float64(B1) * ck1.floats("adam.m")) / np.float64(
        np.float32(1) - B1)
    results = launch.spawn(torch_step, world, args=(str(data), str(run / "ck" / "ckpt-000001.bin"),
                                                    str(run / "plans" / "plan-000002.json"), tp, pp))
    assert results[0]["labelled"] == metrics[1]["targets"]
    assert (results[0]["rings"] > 0) == (hdp > 1), "rings expected exactly where there are 2 HDP ranks"
    assert max(r["items"] for r in results) >= 2 * pp, "too few items per rank for 1F1B to interleave"
    layout = bt.Llama(bt.LlamaConfig.from_dict(ck1.config["model"])).layout
    rows = []
    for dtype in (torch.float32, torch.float64):
        g = np.full(g_c.size, np.nan)
        for r in results:
            if r["where"][1] == 0:
                g[r[dtype][3].numpy()] = r[dtype][2].numpy()
        assert not np.isnan(g).any(), "the parts do not cover the whole model"
        loss, norm = results[0][dtype][0], results[0][dtype][1]
        loss_err = abs(loss - metrics[1]["loss"]) / abs(metrics[1]["loss"])
        norm_err = abs(norm - metrics[1]["grad_norm"]) / metrics[1]["grad_norm"]
        grad_err = 0.0
        for _, off, shape, _ in layout:
            ref = g_c[off:off + math.prod(shape)]
            grad_err = max(grad_err, float(np.abs(g[off:off + math.prod(shape)] - ref).max() / np.abs(ref).max()))
        rows.append(f"{str(dtype)[6:]}: loss {loss_err:.1e}, gradients {grad_err:.1e}, grad norm {norm_err:.1e}")
        assert loss_err < 1e-5 and norm_err < 1e-5, (dtype, loss_err, norm_err)
        assert grad_err < 1e-4, (dtype, grad_err)
    print(f"\nC engine --tp {tp} --pp {pp} ({hdp} HDP ranks) vs torch: " + "; ".join(rows))
