"""Failures and timeouts (guard.py, docs/torch.md "Failures and timeouts"): every rank ends on the
cause, on 2 processes.

Each case runs bench/torch_failures.py's worker (the cases of that table) in processes this test
starts itself, holding the job's store as torchrun's agent or spawn's parent does: not through
torch.multiprocessing, whose join ends the other processes as soon as one fails, which is what this
test must not hide. Each is forked from multiprocessing's forkserver, which imported torch once, and
runs the worker as the interpreter runs the script (bench_rank); a fresh interpreter per rank
spends 4 s importing torch and dynamo. Every rank writes the exception it ended on; the test checks
each rank's:

- k one row short on rank 1 in a ring: rank 1 ShapeError, rank 0 PeerError naming rank 1 and the
  ShapeError (not gloo's "Connection closed by peer");
- the planner failing on rank 0 before broadcast_plan: rank 1 names rank 0 and the planner's error;
- a plan of lengths 100 tokens shorter than the batch, a plan file with every sequence 7 tokens
  longer than its segments, a sequence past its document's end: every rank raises the same error
  naming the sequence and both values;
- rank 1 stalling before step 2: rank 0 raises StallError naming rank 1 (BYTESCALE_TIMEOUT=3);
- a process that leaves without destroy_process_group: the group is destroyed at exit (the cause of
  "terminate called without an active exception"), and nothing aborts.

Times are not asserted (a loaded machine); the waits are hang guards.
"""

import atexit
import importlib.util
import json
import multiprocessing
import os
import subprocess
import sys
import textwrap

import pytest

torch = pytest.importorskip("torch")

from bytescale.torch import launch  # noqa: E402
from conftest import ROOT  # noqa: E402

BENCH = ROOT / "bench" / "torch_failures.py"
HANG_S = 300  # a hang guard, never a measurement


def env(**extra):
    path = os.environ.get("PYTHONPATH", "")
    return dict(os.environ, PYTHONPATH=str(ROOT / "python") + (os.pathsep + path if path else ""), BS_QUIET="1",
                **extra)


def bench_rank(case, out, store_port, environ):
    """One rank of `bench/torch_failures.py --worker CASE --out OUT --store-port PORT`, in a process
    forked from the forkserver, run as the interpreter runs that script: an uncaught exception goes to
    sys.excepthook (where bytescale.torch records it for the peers), then the exit handlers run
    (bytescale.torch's among them), then the process exits, 1 after an exception. Its output goes to
    OUT/logRANK.txt."""
    os.environ.clear()  # the forkserver's environment is its own, from when it started
    os.environ.update(environ)
    log = open(os.path.join(out, f"log{environ['RANK']}.txt"), "w")
    os.dup2(log.fileno(), 1)
    os.dup2(log.fileno(), 2)
    code = 0
    try:
        spec = importlib.util.spec_from_file_location("torch_failures", BENCH)
        bench = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(bench)
        bench.worker(case, out, store_port)
    except BaseException:
        sys.excepthook(*sys.exc_info())
        code = 1
    atexit._run_exitfuncs()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def start(case, out, nproc, store, **extra):
    """nproc ranks of `case` (bench_rank) in a job whose store this process holds, each forked from
    the forkserver (torch and dynamo imported there once, and this module)."""
    multiprocessing.set_forkserver_preload(["torch", "torch.distributed", "bytescale.torch", "torch._dynamo",
                                            __name__])
    ctx = multiprocessing.get_context("forkserver")
    procs = [ctx.Process(target=bench_rank, args=(case, str(out), store.port,
                                                  env(RANK=str(r), WORLD_SIZE=str(nproc), **extra)))
             for r in range(nproc)]
    for p in procs:
        p.start()
    return procs


def run_case(case, tmp_path, nproc=2, timeout_s=60, stalled=()):
    """Every rank's last record ({kind, message}) or None for a rank that wrote none; ranks in
    `stalled` are ended here once the others have."""
    store = launch.host_store(nproc, HANG_S)
    out = tmp_path / case
    out.mkdir()
    procs = start(case, out, nproc, store, BYTESCALE_TIMEOUT=str(timeout_s))
    for r, p in enumerate(procs):
        if r not in stalled:
            p.join(HANG_S)
            assert p.exitcode is not None, f"rank {r} of {case} still runs after {HANG_S} s"
    for r in stalled:
        procs[r].kill()
        procs[r].join(HANG_S)
    logs = [(out / f"log{r}.txt").read_text() if (out / f"log{r}.txt").exists() else "" for r in range(nproc)]
    ends = []
    for r in range(nproc):
        path = out / f"rank{r}.jsonl"
        recs = [json.loads(x) for x in path.read_text().splitlines()] if path.exists() else []
        end = [x for x in recs if x.get("event") == "end"]
        ends.append(end[-1] if end else None)
    print(f"\n{case}:\n" + "\n".join(f"  rank {r}: {e}" for r, e in enumerate(ends)))
    assert all(e is not None for r, e in enumerate(ends) if r not in stalled), logs
    return ends


def test_ring_member_failure_names_the_rank_and_its_error(tmp_path):
    e0, e1 = run_case("ring_shape", tmp_path)
    assert e1["kind"] == "ShapeError" and "k has shape (44, 2, 8), expected (45, 2, 8)" in e1["message"]
    assert e0["kind"] == "PeerError", e0
    assert "rank 1 failed: ShapeError: ring attention: k has shape (44, 2, 8)" in e0["message"]
    assert "ring attention (member 0 of ring [0, 1])" in e0["message"]


def test_planner_failure_on_rank_0_reaches_rank_1(tmp_path):
    e0, e1 = run_case("planner_rank0", tmp_path)
    assert e0["kind"] == "Error" and "capacity 8" in e0["message"], e0
    assert e1["kind"] == "PeerError" and "the plan's broadcast: rank 0 failed: Error: balance:" in e1["message"], e1


@pytest.mark.parametrize("case, kind, words", [
    ("short_plan", "PlanError", ["rank 0 could not plan the step: ValueError: sequence 7 of the batch (document 7) "
                                 "has 142 tokens, the plan 42"]),
    ("edited_file", "PlanCheckError", ["the plan is not whole: sequence 0 (document 0, tokens [0, 288)): the plan "
                                       "gives it 288 tokens, its items' segments hold 281"]),
    ("past_end", "PlanCheckError", ["sequence 3 (document 3, tokens [5, 335)) runs past its document's end: the "
                                    "plan reads to token 335, the document has 330"]),
    ("planner_lambda", "PlanError", ["rank 0 could not plan the step: Error: balance:"]),
])
def test_bad_plans_raise_the_same_on_every_rank(tmp_path, case, kind, words):
    ends = run_case(case, tmp_path)
    assert all(e["kind"] == kind for e in ends), ends
    assert ends[0]["message"] == ends[1]["message"]
    for w in words:
        assert w in ends[0]["message"], ends[0]["message"]


def test_stalled_rank_is_named_within_the_timeout(tmp_path):
    e0, e1 = run_case("stall", tmp_path, timeout_s=3, stalled=(1,))
    assert e1 is None  # asleep until ended here
    assert e0["kind"] == "StallError", e0
    assert "the plan's broadcast: rank 1 did not arrive within 3 s" in e0["message"]


EXIT_SCRIPT = textwrap.dedent("""
    import atexit, os, sys
    import torch, torch.distributed as dist
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    # registered before bytescale's handler, so it runs after it (atexit: last registered, first run)
    atexit.register(lambda: open(sys.argv[1] + str(rank), "w").write(str(dist.is_initialized())))
    from bytescale.torch import launch
    launch.init(rank, world, store_port=int(sys.argv[3]))
    for _ in range(5):
        dist.all_reduce(torch.ones(1000))
    works = [dist.all_reduce(torch.ones(10), async_op=True) for _ in range(3)]
    for w in works:
        w.wait()
    if rank == int(sys.argv[2]):
        import time
        time.sleep(1)
    # no destroy_process_group: the script forgets it
""")


def test_process_group_destroyed_at_exit(tmp_path):
    """The cause of the abort at exit, tested directly: gloo's worker threads drop their last work
    (tensors owned by Python objects) while the interpreter finalizes, unless the group is destroyed
    first. bytescale.torch destroys it at exit; a few runs without it, and none aborts."""
    script = tmp_path / "exit.py"
    script.write_text(EXIT_SCRIPT)
    for run in range(3):
        store = launch.host_store(2, HANG_S)
        marker = tmp_path / f"destroyed{run}-"
        procs = [subprocess.Popen([sys.executable, str(script), str(marker), str(run % 2), str(store.port)],
                                  env=env(RANK=str(r), WORLD_SIZE="2"), stdout=subprocess.PIPE,
                                  stderr=subprocess.STDOUT, text=True) for r in range(2)]
        for p in procs:
            log = p.communicate(timeout=HANG_S)[0]
            assert p.returncode == 0 and "terminate called" not in log, log
        assert [(tmp_path / f"destroyed{run}-{r}").read_text() for r in range(2)] == ["False", "False"]
