#!/usr/bin/env python3
"""torch_exit.py: count the jobs that abort at exit (docs/torch.md, "Failures and timeouts").

A job of 2 processes (torch.multiprocessing, rank 0 holding the store, as a user's own launcher
does) trains 2 steps of the tiny model with rings through HDPTrainer, ends with asynchronous
all-reduces (a trainer's bucket all-reduces are) and returns, leaving its process group alive (no
destroy_process_group: the docs' loop did not say to call it). Without the fix, a
process of such a job aborts now and then (the report: once in three runs) with "terminate called
without an active exception": a gloo worker thread drops its last finished work, whose tensors belong to Python
objects, while the main thread is already finalizing the interpreter, and acquiring the GIL there
ends the thread by an unwinding that crosses a noexcept frame. bytescale.torch destroys the groups
at exit (guard._at_exit). This runs the job N times and prints how many aborted.

    BYTESCALE_LIB=build/libbytescale.so.0 .venv/bin/python bench/torch_exit.py --runs 50
    ... --package DIR      # the bytescale package of another checkout (DIR/bytescale), to compare
"""

import argparse
import os
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))


def rank_main(rank, world, port, bare):
    import numpy as np
    import torch
    import torch.distributed as dist
    import bytescale.torch as bt
    from bytescale.torch import launch

    launch.init(rank, world, "gloo", port)
    if bare:  # the collectives alone, no training
        for _ in range(5):
            dist.all_reduce(torch.ones(1000))
        return ending(rank, torch, dist)
    lengths = np.random.default_rng(3).integers(50, 300, 40)

    def read(doc, start, n):
        i = np.arange(start, max(start, min(int(lengths[doc]), start + n)), dtype=np.int64)
        return (doc * 7919 + i * 104729) % 256
    src = bt.FunctionSource(read, lambda d: int(lengths[d]))
    trainer = bt.HDPTrainer(bt.Llama(bt.LlamaConfig.named("tiny")).init_weights(1))
    for step in range(2):
        docs = list(range(step * 6, step * 6 + 6))
        batch = bt.Batch(docs, [0] * 6, [int(lengths[d]) for d in docs])
        plan = bt.broadcast_plan(bt.plan_step(batch, src, ranks=world, capacity=200, policy="balance")
                                 if rank == 0 else None)
        trainer.step(plan, bt.microbatches(plan, rank, src, ring_stats=trainer.ring_stats))
    ending(rank, torch, dist)


def ending(rank, torch, dist):
    """The job's last collectives asynchronous, as a trainer's bucket all-reduces are; then it returns
    with its process group alive (rank 1 a moment later, as a rank writing its last metrics)."""
    works = [dist.all_reduce(torch.ones(10), async_op=True) for _ in range(3)]
    for w in works:
        w.wait()
    if rank == 1:
        time.sleep(1)


def job(bare):
    import torch.multiprocessing as mp
    from bytescale.torch import launch
    mp.start_processes(rank_main, args=(2, launch.free_port(), bare), nprocs=2, join=True, start_method="spawn")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=50)
    ap.add_argument("--package", default=os.path.join(HERE, "..", "python"),
                    help="the directory holding the bytescale package (default: this checkout's python/)")
    ap.add_argument("--bare", action="store_true", help="the job without training: 5 all-reduces, then the ending")
    ap.add_argument("--job", action="store_true", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.job:
        return job(a.bare)
    env = dict(os.environ, PYTHONPATH=os.path.abspath(a.package), OMP_NUM_THREADS="1")
    aborts = failures = 0
    t0 = time.time()
    for i in range(a.runs):
        r = subprocess.run([sys.executable, os.path.abspath(__file__), "--job"] + (["--bare"] if a.bare else []),
                           env=env, capture_output=True, text=True, timeout=600)
        log = r.stdout + r.stderr
        aborted = "terminate called" in log or "SIGABRT" in log
        aborts += aborted
        failures += r.returncode != 0 and not aborted
        if aborted or r.returncode != 0:
            print(f"run {i + 1}: exit {r.returncode}{' (aborted)' if aborted else ''}: {log.strip().splitlines()[-1]}",
                  flush=True)
    print(f"{a.runs} runs of a 2-process job{' (bare)' if a.bare else ''} leaving its process group alive "
          f"({a.package}): {aborts} aborted at exit, {failures} failed otherwise ({time.time() - t0:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
