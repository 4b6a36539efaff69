"""The PyTorch example runs: 2 processes on gloo, 3 steps, and every token of every step's global
batch trained exactly once across the ranks (the example checks it and fails otherwise)."""

import subprocess
import sys

from conftest import ROOT


def test_torch_hdp_sampler():
    r = subprocess.run([sys.executable, str(ROOT / "examples" / "torch_hdp_sampler.py"), "--steps", "3"],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    steps = [line for line in r.stdout.splitlines() if line.startswith("step ")]
    assert len(steps) == 3, r.stdout
    assert all(line.endswith("every token trained once") for line in steps), r.stdout
    assert any("rings [(" in line for line in steps), "no step had a ring: the example should exercise rings"
