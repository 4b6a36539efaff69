#!/usr/bin/env python3
"""torch_loader.py: HDPLoader's read-ahead against the step it feeds, on N processes (gloo, CPU).

Two runs of the same steps of a Llama (`--model`, HDPTrainer, float32) over a prepared dataset:

1. **loader**: the steps come from bytescale.torch.loader.HDPLoader, which draws, plans, broadcasts,
   reads and checks each step in its thread, `--prefetch` steps ahead. Per step: the step's own
   seconds (HDPTrainer), the seconds the thread took to make it (read), and the seconds next()
   waited for it (wait).
2. **inline**: the same batches drawn, planned, broadcast, read and checked in the training thread
   before each step (broadcast_plan + microbatches, what a loop without the loader does).

The two runs take their steps in turn, each first every other step. The table gives the mean over the steps after the first
(nothing can be read ahead of the first), of the slowest rank; the last column is what a step costs
the training thread in each run.

    BYTESCALE_LIB=build/libbytescale.so.0 .venv/bin/python bench/torch_loader.py --data data/go-byte
"""

import argparse
import os
import statistics
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "python"))

import torch  # noqa: E402

import bytescale.torch as bt  # noqa: E402
from bytescale.torch import launch  # noqa: E402
from bytescale.torch.loader import BudgetSampler, HDPLoader, as_source  # noqa: E402


def trainer_for(model_name: str) -> bt.HDPTrainer:
    model = bt.Llama(bt.LlamaConfig.named(model_name), dtype=torch.float32).init_weights(seed=1)
    return bt.HDPTrainer(model, lr=1e-3, warmup=2, schedule_steps=100)


def loader_step(loader: HDPLoader, trainer: bt.HDPTrainer) -> tuple:
    """A step from the loader: (step s, read s in the thread, wait s in next(), both)."""
    t0 = time.perf_counter()
    step = next(loader)
    res = trainer.step(step.plan, step.microbatches)
    return res.seconds, step.read_s, step.wait_s, time.perf_counter() - t0


def inline_step(sampler: BudgetSampler, source, trainer: bt.HDPTrainer, rank: int, world: int, capacity: int) -> tuple:
    """The same step drawn, planned, broadcast, read and checked here first: (step s, read s, 0, both)."""
    t0 = time.perf_counter()
    plan = bt.broadcast_plan(lambda: bt.plan_step(sampler.next(), source, ranks=world, capacity=capacity))
    mbs = bt.microbatches(plan, rank, source, ring_stats=trainer.ring_stats)
    read = time.perf_counter() - t0
    res = trainer.step(plan, mbs)
    return res.seconds, read, 0.0, time.perf_counter() - t0


def job(rank: int, world: int, a) -> dict:
    """Both runs, their steps taken in turn (the machine's noise hits both alike): per step of the
    loader's run (step s, read s, wait s), of the inline run (step s, read s)."""
    trainers = {"loader": trainer_for(a.model), "inline": trainer_for(a.model)}
    source = as_source(bt.Dataset(a.data))
    sampler = BudgetSampler(source, source.n_docs, a.tokens, a.context, a.seed)
    rows = {"loader": [], "inline": []}
    with HDPLoader(source, tokens=a.tokens, capacity=a.capacity, context=a.context, seed=a.seed,
                   prefetch=a.prefetch, steps=a.steps, ring_stats=trainers["loader"].ring_stats) as loader:
        for k in range(a.steps):
            for run in (("loader", "inline") if k % 2 == 0 else ("inline", "loader")):  # each first in turn
                rows[run].append(loader_step(loader, trainers[run]) if run == "loader"
                                 else inline_step(sampler, source, trainers[run], rank, world, a.capacity))
    return rows


def mean_after_first(rows, col: int) -> float:
    return statistics.fmean(r[col] for r in rows[1:]) if len(rows) > 1 else rows[0][col]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--data", default="data/go-byte", help="a prepared dataset (bytescale prepare)")
    p.add_argument("--nprocs", type=int, default=2)
    p.add_argument("--model", default="tiny", choices=("tiny", "small", "base"))
    p.add_argument("--steps", type=int, default=12)
    p.add_argument("--tokens", type=int, default=4096, help="the global batch's token budget")
    p.add_argument("--capacity", type=int, default=1024)
    p.add_argument("--context", type=int, default=2048)
    p.add_argument("--prefetch", type=int, default=2)
    p.add_argument("--seed", type=int, default=1)
    a = p.parse_args()
    print(f"# {a.nprocs} processes, model {a.model}, {a.steps} steps of {a.tokens} tokens, capacity {a.capacity}, "
          f"context {a.context}, prefetch {a.prefetch}, {a.data}; torch {torch.__version__}")
    res = launch.spawn(job, a.nprocs, args=(a,), timeout_s=1800)
    print("| run | step s | read s | wait in next() s | step + wait (loader), read + step (inline) s |")
    print("|---|---:|---:|---:|---:|")
    for run in ("loader", "inline"):
        step, read, wait, whole = (max(mean_after_first(r[run], c) for r in res) for c in range(4))
        wait_s = f"{wait:.5f}" if run == "loader" else "(read in the step's thread)"
        print(f"| {run} | {step:.4f} | {read:.4f} | {wait_s} | {whole:.4f} |")
    worst = max(max(x[2] for x in r["loader"][1:]) for r in res)
    print(f"# the longest wait in next() after the first step, any rank: {worst:.5f} s")


if __name__ == "__main__":
    main()
