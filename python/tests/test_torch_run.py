"""torchrun, as docs/torch.md gives it: plain `torchrun --nproc_per_node 2 SCRIPT`, the torchrun of the
environment the tests run in (the project's .venv: PyTorch 2).

- a user's own loop (examples/torch_user_loop.py: its own nn.Module, plain AdamW) on 2 processes
  under torchrun, with rings, against the same script in one process: both ranks finish, and the
  losses of every step and the final parameters agree (fp64).
- the same loop with --tp 2 on 4 processes (tp 2 x 2 HDP ranks: column- and row-parallel layers
  with biases, seeded init, clipping over the shards, a TP checkpoint after step 3 and a second job
  resuming from it) against one process with nn.Linear: every step's loss, and the parameters of
  the final TP checkpoint loaded into the one-process model (fp64).
- examples/torch_hdp_train.py on 2 processes under torchrun, with rings, against --nproc 1 with the
  same flags: both ranks report, and the steps' losses agree.

The one-process references and the resumed TP job run the script's main() as `python SCRIPT` and
torchrun start it, in processes forked from launch.spawn's server (run_ranks): a fresh interpreter
each would import torch again, 4 s a process.
"""

import importlib
import json
import os
import re
import subprocess
import sys
import tempfile
import types

import pytest

torch = pytest.importorskip("torch")

from bytescale.torch import launch  # noqa: E402
from conftest import ROOT, load_example  # noqa: E402
from test_torch_vs_c import corpus  # noqa: E402

EXAMPLES = ROOT / "examples"


def python_env():
    """The environment a user gives a script run from the checkout: the package on PYTHONPATH (the
    library through BYTESCALE_LIB, as ctest sets it, or the package's own copy)."""
    path = os.environ.get("PYTHONPATH", "")
    return dict(os.environ, PYTHONPATH=str(ROOT / "python") + (os.pathsep + path if path else ""), BS_QUIET="1")


def launch_cmd(nproc, script, *args):
    """The documented torchrun command: the environment's own `torchrun` (beside its python, as a venv
    puts it); a port of its own (tests run side by side)."""
    torchrun = os.path.join(os.path.dirname(sys.executable), "torchrun")
    assert os.access(torchrun, os.X_OK), f"no torchrun beside {sys.executable}"
    return [torchrun, "--nproc_per_node", str(nproc), "--master_port", str(launch.free_port()), str(script),
            *map(str, args)]


def check_run(cmd):
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=900, env=python_env(), cwd=ROOT)
    assert r.returncode == 0, f"{' '.join(cmd)}: exit {r.returncode}\n{r.stdout}\n{r.stderr}"
    return r


TORCHRUN_ENV = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")


def example_rank(rank, world, name, argv, port):
    """A launch.spawn worker: one rank of examples/NAME.py's main() as `torchrun --nproc_per_node WORLD`
    starts it (the rendezvous in its environment), or with port None as `python NAME.py` starts it (no
    such variables). Returns what it wrote to stdout and stderr."""
    launch.finish()  # the group spawn made: main() makes its own, as under torchrun
    for k in TORCHRUN_ENV:
        os.environ.pop(k, None)
    if port is not None:
        os.environ.update(RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank), LOCAL_WORLD_SIZE=str(world),
                          MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    os.environ["BS_QUIET"] = "1"  # as python_env()
    sys.path.insert(0, str(EXAMPLES))  # imported by name: an example's own launch.spawn pickles its functions
    sys.argv = [str(EXAMPLES / f"{name}.py"), *map(str, argv)]
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        # at the descriptors: what C code and the example's own processes write is caught too
        os.dup2(out.fileno(), 1)
        os.dup2(err.fileno(), 2)
        try:
            importlib.import_module(name).main()
            failed = None
        except BaseException as e:  # SystemExit too: the message says which run, with its output
            failed = e
        sys.stdout.flush()
        sys.stderr.flush()
        out.seek(0), err.seek(0)
        texts = out.read(), err.read()
    if failed is not None:
        raise RuntimeError(f"{name}.py {' '.join(sys.argv[1:])} (rank {rank}): {failed!r}\n{texts[0]}\n{texts[1]}")
    return texts


def run_ranks(nproc, name, *argv, torchrun=True, preload=()):
    """examples/NAME.py ARGV run as `torchrun --nproc_per_node NPROC` runs it (torchrun=False: as `python
    NAME.py`, one process), each rank's main() in a process forked from launch.spawn's server, which
    imported torch (and `preload`) once: a fresh interpreter per rank, as torchrun starts, pays those
    imports again (4 s for torch, 10 s with transformers' models). Returns the ranks' stdout and stderr
    (rank 0's first), as check_run's result has them. launch_cmd runs the real torchrun."""
    assert torchrun or nproc == 1
    port = launch.free_port() if torchrun else None
    outs = launch.spawn(example_rank, nproc, args=(name, list(argv), port), preload=preload)
    return types.SimpleNamespace(stdout="".join(o for o, _ in outs), stderr="".join(e for _, e in outs))


def spawning_main(name, *argv):
    """examples/NAME.py ARGV's main(argv) in this process, as `python NAME.py ARGV` runs it, for an
    example that spawns its ranks itself (launch.spawn): they fork from this process's server, where
    run_ranks would start a server of its own (7 s of imports). Its ranks' output goes where the
    server's does (not to this process's capture): for runs whose output is not checked."""
    if str(EXAMPLES) not in sys.path:
        sys.path.insert(0, str(EXAMPLES))  # imported by name: its ranks unpickle its functions
    return importlib.import_module(name).main(list(map(str, argv)))


def test_user_loop_under_torchrun_matches_one_process(tmp_path):
    script = EXAMPLES / "torch_user_loop.py"
    common = ["--steps", "3", "--dtype", "float64", "--tokens", "2048"]
    two = check_run(launch_cmd(2, script, *common, "--capacity", "512", "--dump", tmp_path / "two.pt"))
    run_ranks(1, "torch_user_loop", *common, "--capacity", "1024", "--dump", tmp_path / "one.pt", torchrun=False)
    for rank in (0, 1):
        assert re.search(rf"rank {rank}/2 done: \d+ micro-batches", two.stdout), two.stdout + two.stderr
    rings = [int(m) for m in re.findall(r"rings (\d+)", two.stdout)]
    assert len(rings) == 3 and sum(rings) > 0, two.stdout  # long documents ran as rings on 2 ranks
    a, b = torch.load(tmp_path / "two.pt"), torch.load(tmp_path / "one.pt")
    assert a["losses"] == pytest.approx(b["losses"], rel=1e-12)
    assert a["losses"][0] > 3.5  # about ln 64 at the start: a real loss, not a zero
    for name, p in b["params"].items():
        assert torch.allclose(a["params"][name], p, rtol=1e-9, atol=1e-12), name


def user_loop_module():
    return load_example("torch_user_loop")


def test_user_loop_tp2_hdp2_with_checkpoints_matches_one_process(tmp_path):
    """The figures of docs/torch.md ("Tensor parallelism in a loop of one's own"): printed here."""
    import bytescale.torch as bt

    script = EXAMPLES / "torch_user_loop.py"
    common = ["--tokens", "2048", "--dtype", "float64", "--ckpt-dir", tmp_path / "ck"]
    check_run(launch_cmd(4, script, "--tp", "2", "--steps", "3", "--ckpt-every", "3", *common,
                         "--dump", tmp_path / "a.pt"))
    # the second job as torchrun starts its ranks, in processes forked from spawn's server (run_ranks)
    second = run_ranks(4, "torch_user_loop", "--tp", "2", "--steps", "5", "--ckpt-every", "5", *common,
                       "--resume", tmp_path / "ck" / "step-3", "--dump", tmp_path / "b.pt")
    assert "ranks 4 (tp 2 x hdp 2)" in second.stdout
    run_ranks(1, "torch_user_loop", "--steps", "5", "--tokens", "2048", "--dtype", "float64",
              "--dump", tmp_path / "one.pt", torchrun=False)
    a, b, one = (torch.load(tmp_path / f"{n}.pt") for n in ("a", "b", "one"))
    losses = a["losses"] + b["losses"]
    loss_rel = max(abs(x - y) / abs(y) for x, y in zip(losses, one["losses"]))
    model = user_loop_module().TinyLM(bt.Layout(), 1).to(torch.float64)
    bt.load_tp(tmp_path / "ck" / "step-5", model)
    param_rel = max(float((model.state_dict()[k] - v).abs().max() / v.abs().max()) for k, v in one["params"].items())
    print(f"\ntp 2 x hdp 2 vs one process, 5 AdamW steps (a checkpoint after 3): loss {loss_rel:.1e}, "
          f"parameters {param_rel:.1e} (of each tensor's largest)")
    assert len(losses) == 5 and loss_rel < 1e-12 and param_rel < 1e-12
    assert any(k.endswith("bias") for k in one["params"])


def test_example_under_torchrun_matches_one_process(tmp_path):
    data = corpus(tmp_path)
    common = ["--data", data, "--model", "tiny", "--context", "512", "--tokens", "1K", "--steps", "2", "--lr", "1e-3",
              "--warmup", "1", "--capacity", "256"]
    check_run(launch_cmd(2, EXAMPLES / "torch_hdp_train.py", *common, "--metrics", tmp_path / "two.jsonl"))
    # the same flags on one process: it plans at the context, and says so
    one_run = run_ranks(1, "torch_hdp_train", *common, "--nproc", "1", "--metrics", tmp_path / "one.jsonl",
                        torchrun=False)
    assert "one HDP rank: capacity 256 raised to the context 512" in one_run.stderr
    two = [json.loads(x) for x in (tmp_path / "two.jsonl").read_text().splitlines()]
    one = [json.loads(x) for x in (tmp_path / "one.jsonl").read_text().splitlines()]
    assert [x["step"] for x in two] == [1, 2] and all(len(x["ranks"]) == 2 for x in two)
    assert all(r["items"] > 0 for x in two for r in x["ranks"]), "a rank ran nothing"
    assert any(x["plan_rings"] > 0 for x in two)
    # the same batches (rank 0's sampler), other plans: the same losses to fp32 summation order
    assert [x["loss"] for x in two] == pytest.approx([x["loss"] for x in one], rel=1e-5)
    assert two[0]["grad_norm"] == pytest.approx(one[0]["grad_norm"], rel=1e-4)
