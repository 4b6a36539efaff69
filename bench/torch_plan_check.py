#!/usr/bin/env python3
"""torch_plan_check.py: what the per-step plan check (bytescale.torch check_plan, docs/torch.md "Plan
checks") costs, on N processes (gloo, CPU, one thread each), printed as a table.

For plans of growing size (the C planner's `balance` plans of long-tailed batches of S sequences),
per step: the fingerprint alone (thread CPU time), the whole check (fingerprint + the plan's own
check + one all_gather of 12 int64 per rank on the control group + the verdict; the slowest rank's
wall time, the ranks leaving a barrier together), the check's CPU time on rank 0's calling thread (thread CPU time: what a loaded machine does not
inflate), the bare all_gather of the same tensor, and microbatches() without the check (reading the
rank's tokens: work every step does anyway); medians of --repeats. With --step, one training step of
the tiny model on the smallest plan, for scale.

    make && BYTESCALE_LIB=build/libbytescale.so.0 .venv/bin/python bench/torch_plan_check.py
"""

import argparse
import os
import statistics
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "python"))

import numpy as np  # noqa: E402
import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

import bytescale.torch as bt  # noqa: E402
from bytescale.torch import launch  # noqa: E402
from bytescale.torch.check import _gather  # noqa: E402

CAPACITY = 4096


def source():
    """Documents of 1M tokens each, tokens a function of (document, position)."""
    def read(doc, start, n):
        i = np.arange(start, min(start + n, 1 << 20), dtype=np.int64)
        return (doc * 7919 + i * 104729) % 256
    return bt.FunctionSource(read, lambda d: 1 << 20)


def batch_of(n_seq, seed, world):
    """n_seq long-tailed lengths (log-normal around a few hundred tokens, every 16th 1 to `world`
    capacities: a ring)."""
    rng = np.random.default_rng(seed)
    lengths = np.clip(rng.lognormal(5.5, 1.0, n_seq), 1, CAPACITY).astype(np.int64)
    lengths[::16] = rng.integers(CAPACITY + 1, world * CAPACITY + 1, len(lengths[::16]))
    return bt.Batch(list(range(n_seq)), [0] * n_seq, lengths.tolist())


def slowest(seconds):
    t = torch.tensor([seconds], dtype=torch.float64)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return float(t)


def timed(fn, repeats):
    """Median over repeats of the slowest rank's wall seconds of fn(), every rank starting together."""
    out = []
    for _ in range(repeats):
        dist.barrier()
        t0 = time.perf_counter()
        fn()
        out.append(slowest(time.perf_counter() - t0))
    return statistics.median(out)


def worker(rank, world, sizes, repeats, step):
    src = source()
    rows = []
    for n_seq in sizes:
        batch = batch_of(n_seq, n_seq, world)
        plan = bt.broadcast_plan(bt.plan_step(batch, src, ranks=world, capacity=CAPACITY, policy="balance")
                                 if rank == 0 else None)
        fps = []
        for _ in range(repeats):
            t0 = time.thread_time()
            bt.plan_fingerprint(plan)
            fps.append(time.thread_time() - t0)
        row = [rank, plan.n_ranks, world, bt.plan_fingerprint(plan), len(plan.items), plan.n_tokens, plan.labelled,
               -1, 0, -1, 0, 0]  # check_plan's row (check._FIELDS)
        # the two alternate, so the machine's noise hits both alike
        pairs = [(timed(lambda: bt.check_plan(plan, rank), 1), timed(lambda: _gather(row), 1))
                 for _ in range(repeats)]
        check, gather = (statistics.median(x) for x in zip(*pairs))
        cpu = []
        for _ in range(repeats):
            t0 = time.thread_time()
            bt.check_plan(plan, rank)
            cpu.append(time.thread_time() - t0)
        mbs = timed(lambda: bt.microbatches(plan, rank, src, check=False), max(3, repeats // 10))
        rows.append((n_seq, len(plan.items), plan.n_tokens, statistics.median(fps), statistics.median(cpu), check,
                     gather, mbs))
    step_s = None
    if step:
        torch.manual_seed(0)
        plan = bt.broadcast_plan(bt.plan_step(batch_of(sizes[0], sizes[0], world), src, ranks=world, capacity=CAPACITY,
                                              policy="balance") if rank == 0 else None)
        trainer = bt.HDPTrainer(bt.Llama(bt.LlamaConfig.named("tiny")).init_weights(1))
        step_s = timed(lambda: trainer.step(plan, bt.microbatches(plan, rank, src, ring_stats=trainer.ring_stats)),
                       1)
        step_s = (step_s, plan.n_tokens)
    return rows, step_s


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--nproc", type=int, default=2)
    ap.add_argument("--sizes", default="16,128,1024", help="sequences per batch, comma-separated")
    ap.add_argument("--repeats", type=int, default=50)
    ap.add_argument("--step", action="store_true", help="also time one training step on the smallest plan")
    args = ap.parse_args()
    sizes = [int(x) for x in args.sizes.split(",")]
    rows, step_s = launch.spawn(worker, args.nproc, args=(sizes, args.repeats, args.step))[0]
    print(f"{args.nproc} processes, gloo, median of {args.repeats}")
    print("| sequences | items | tokens | fingerprint CPU us | check CPU us | check wall us | bare all_gather wall us "
          "| microbatches() wall ms |")
    print("|---:|---:|---:|---:|---:|---:|---:|---:|")
    for n, items, tokens, fp, cpu, check, gather, mbs in rows:
        print(f"| {n:,} | {items:,} | {tokens:,} | {fp * 1e6:,.0f} | {cpu * 1e6:,.0f} | {check * 1e6:,.0f} "
              f"| {gather * 1e6:,.0f} | {mbs * 1e3:,.1f} |")
    if step_s:
        print(f"one training step of the tiny model on the {sizes[0]}-sequence plan ({step_s[1]:,} tokens): "
              f"{step_s[0]:.2f} s")


if __name__ == "__main__":
    main()
