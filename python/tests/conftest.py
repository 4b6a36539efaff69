"""What the Python tests share: the `bytescale` command (the C plans to compare with), random
batches, and a runner for the command.

BS_BINARY names the command (ctest sets it); without it, the build/ of this checkout.
"""

import importlib.util
import os
import pathlib
import subprocess

import numpy as np
import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]

# launch.spawn's workers fork from a server process that imports the worker's module once (launch.py),
# where the server's sys.path finds it: that is the environment's PYTHONPATH (Python 3.11's forkserver
# does not take pytest's sys.path), so this folder goes on it. Without it every spawned rank imports
# its test module, and pytest with it, again: half a second a rank, ~170 ranks in the suite.
os.environ["PYTHONPATH"] = os.pathsep.join(
    [str(pathlib.Path(__file__).resolve().parent), *filter(None, [os.environ.get("PYTHONPATH")])])


def load_example(name):
    """examples/NAME.py as a module, for the tests that call its functions (its main() runs only when
    asked: every example guards it with `if __name__ == "__main__"`)."""
    spec = importlib.util.spec_from_file_location(name, ROOT / "examples" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="session")
def cli():
    path = os.environ.get("BS_BINARY") or str(ROOT / "build" / "bytescale")
    if not os.access(path, os.X_OK):
        pytest.fail(f"the bytescale command is not at {path}: build it (make) or set BS_BINARY")
    return path


@pytest.fixture
def run_cli(cli):
    """Run `bytescale ARGS...`; return stdout, failing the test with stderr on a non-zero exit."""
    def run(*args):
        r = subprocess.run([cli, *map(str, args)], capture_output=True, text=True, timeout=300)
        if r.returncode != 0:
            pytest.fail(f"bytescale {' '.join(map(str, args))}: exit {r.returncode}: {r.stderr.strip()}")
        return r.stdout
    return run


def random_lengths(seed, n=200, capacity=4096, long_every=12):
    """A long-tailed batch: log-normal lengths around a few hundred tokens, and every long_every-th
    sequence between 1 and 6 capacities long (rings, offloading)."""
    rng = np.random.default_rng(seed)
    lengths = np.maximum(1, rng.lognormal(5.5, 1.2, n)).astype(np.int64)
    lengths = np.minimum(lengths, capacity)
    longs = rng.integers(capacity, 6 * capacity, n // long_every + 1)
    lengths[::long_every] = longs[:len(lengths[::long_every])]
    return lengths


@pytest.fixture
def lengths_file(tmp_path):
    """Write lengths one per line, as `bytescale plan --lengths` reads them; returns the path."""
    def write(lengths, name="lengths.txt"):
        path = tmp_path / name
        path.write_text("".join(f"{int(x)}\n" for x in lengths))
        return path
    return write
