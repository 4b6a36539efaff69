"""bytescale.simulate() is `bytescale simulate --plan FILE`: the same step for the same plan, whichever
side wrote the plan file and whichever read it."""

import json

import numpy as np
import pytest

import bytescale
from conftest import random_lengths

KEYS = ["step_time", "compute_end", "sync_time", "optimizer_time", "tokens_per_s", "mfu", "model_flops", "ring_bytes",
        "offload_bytes"]


def cli_simulate(run_cli, path, model, hardware, tp):
    return json.loads(run_cli("simulate", "--plan", path, "--model", model, "--hardware", hardware, "--tp", tp,
                              "--json"))


# balance plans hybrid items at pp2 here, blocks owned blocks, wlb delayed sequences and barriers: the
# simulation keeps every one of them
@pytest.mark.parametrize("policy", ["static", "balance", "blocks", "wlb"])
@pytest.mark.parametrize("cfg", [dict(ranks=16, capacity=4096, context=32768, pp=1, model="llama-7b",
                                      hardware="h800-sxm", tp=2),
                                 dict(ranks=8, capacity=2048, context=16384, pp=2, model="llama-13b",
                                      hardware="h100-sxm", tp=4)], ids=["pp1", "pp2"])
def test_simulation_is_the_commands(policy, cfg, tmp_path, lengths_file, run_cli):
    lengths = random_lengths(21, capacity=cfg["capacity"])
    # a plan Python wrote, simulated by the command (the library's reader) and by Python
    p = bytescale.plan(lengths, policy=policy, **cfg)
    mine = tmp_path / "python.json"
    p.write(mine)
    s = bytescale.simulate(p, model=cfg["model"], hardware=cfg["hardware"], tp=cfg["tp"])
    cli = cli_simulate(run_cli, mine, cfg["model"], cfg["hardware"], cfg["tp"])
    for key in KEYS:  # cJSON prints 15 digits where they read back within a rounding step
        assert cli[key] == pytest.approx(getattr(s, key), rel=1e-14, abs=0), key
    assert (cli["items"], cli["rings"]) == (p.n_items, s.n_rings)
    # a plan the command wrote, read and simulated by Python
    theirs = tmp_path / "cli.json"
    args = ["plan", "--lengths", lengths_file(lengths), "--policy", policy, "--out", theirs]
    for key in ("ranks", "capacity", "context", "pp", "model", "hardware", "tp"):
        args += [f"--{key}", cfg[key]]
    run_cli(*args)
    q = bytescale.read_plan(theirs)
    t = bytescale.simulate(q, model=cfg["model"], hardware=cfg["hardware"], tp=cfg["tp"])
    assert t.to_dict() == s.to_dict()
    for name in ("busy", "comm", "wait", "offload"):
        np.testing.assert_array_equal(getattr(t, name), getattr(s, name))
    assert s.n_gpus == cfg["ranks"] * cfg["tp"] * cfg["pp"] and s.n_res == cfg["ranks"] * cfg["pp"]
    np.testing.assert_allclose(s.busy + s.comm + s.wait, s.step_time, rtol=1e-9)


def test_simulate_leaves_the_plan_alone_and_plans_lengths(tmp_path):
    lengths = random_lengths(4, capacity=4096)
    p = bytescale.plan(lengths, ranks=16, capacity=4096, context=32768)
    before = p.item_est_time.copy(), p.makespan
    s = bytescale.simulate(p, hardware="h100-sxm")  # another cost model: the simulator's own copy
    np.testing.assert_array_equal(p.item_est_time, before[0])
    assert p.makespan == before[1] and s.plan is p
    # lengths: planned first with the same model, hardware and tp
    t = bytescale.simulate(lengths, ranks=16, capacity=4096, context=32768, hardware="h100-sxm")
    assert t.to_dict() == bytescale.simulate(
        bytescale.plan(lengths, ranks=16, capacity=4096, context=32768, hardware="h100-sxm"),
        hardware="h100-sxm").to_dict()
    assert bytescale.simulate(p, gpus=32).to_dict() == bytescale.simulate(p).to_dict()
    trace = tmp_path / "trace.json"
    s.trace(trace, max_ranks=4)
    events = json.loads(trace.read_text())
    assert events and {e["ph"] for e in events} <= {"X", "M"}
    assert "step" in repr(s)
