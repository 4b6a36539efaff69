"""The PyTorch example runs: 2 processes on gloo, 3 steps, and every token of every step's global
batch trained exactly once across the ranks (the example checks it and fails otherwise)."""

import pytest


def test_torch_hdp_sampler():
    pytest.importorskip("torch")
    from test_torch_run import run_ranks  # `python examples/torch_hdp_sampler.py`, forked (torch imported once)
    r = run_ranks(1, "torch_hdp_sampler", "--steps", "3", torchrun=False)
    steps = [line for line in r.stdout.splitlines() if line.startswith("step ")]
    assert len(steps) == 3, r.stdout
    assert all(line.endswith("every token trained once") for line in steps), r.stdout
    assert any("rings [(" in line for line in steps), "no step had a ring: the example should exercise rings"
