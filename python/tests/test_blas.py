"""bytescale.blas_coretype() and the workers bytescale.torch.launch.spawn starts: OpenBLAS's kernels
for this CPU (docs/training.md, "BLAS kernels"; the choice itself is tests/nn/test_blas_core.c).

OpenBLAS reads OPENBLAS_CORETYPE when it is loaded, and ctest sets it where OpenBLAS falls back on
this machine, so each check runs in a fresh interpreter started without the variable."""

import os
import pathlib
import subprocess
import sys

import pytest

import bytescale

HERE = pathlib.Path(__file__).resolve().parent


def fresh(code, coretype=None):
    """Run `code` in a fresh interpreter that sees this package, with OPENBLAS_CORETYPE=coretype (or
    without it); return its last line of output."""
    env = {k: v for k, v in os.environ.items() if k != "OPENBLAS_CORETYPE"}
    if coretype:
        env["OPENBLAS_CORETYPE"] = coretype
    env["PYTHONPATH"] = os.pathsep.join([str(HERE), str(pathlib.Path(bytescale.__file__).parents[1]),
                                         env.get("PYTHONPATH", "")])
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    return r.stdout.strip().splitlines()[-1]


def test_coretype_is_the_cure_and_then_none():
    picked = fresh("import bytescale; print(bytescale.blas_coretype())")
    assert picked in ("None", "SkylakeX", "Haswell")
    if picked != "None":
        # with the variable set, OpenBLAS loads those kernels and nothing better is left
        assert fresh("import bytescale; print(bytescale.blas_coretype())", picked) == "None"


def worker(rank, world):
    """What a spawned worker's OpenBLAS was given, and whether it left anything better undone."""
    return os.environ.get("OPENBLAS_CORETYPE"), bytescale.blas_coretype()


def test_spawn_gives_workers_the_kernels():
    pytest.importorskip("torch")
    code = ("import bytescale, test_blas\n"
            "from bytescale.torch import launch\n"
            "print(repr((bytescale.blas_coretype(), launch.spawn(test_blas.worker, 2))))")
    parent, workers = eval(fresh(code))
    for given, better in workers:
        assert given == parent       # the parent's pick (None: nothing to set)
        assert better is None        # and the workers run the CPU's kernels

