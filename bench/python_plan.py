#!/usr/bin/env python3
"""python_plan.py: what planning costs from Python (the bytescale package) against the same plan
from C: the binding's overhead. docs/python.md ("Overhead") quotes its output.

    OPENBLAS_NUM_THREADS=1 BYTESCALE_LIB=build/libbytescale.so.0 PYTHONPATH=python \
        .venv/bin/python bench/python_plan.py build/bench_plan_api [--repeats 51] [--ranks 16384] [--dist byted]

The batch, the cost model and the policy are bench_plan_api's (32M tokens sampled from byted, seed 1,
2M context, C = 8K, LLaMA-7B on h800-sxm, TP 2, balance, offloading on). Timed:
  C                   bench_plan_api, run first: the same calls from a C program (bs_cost_derive,
                      bs_plan_lengths, bs_plan_info), and the planner alone (policy_plan)
  raw call            those C functions called straight through ctypes with ready arguments: the C
                      work as seen from this process
  plan()              bytescale.plan(lengths, ...): lengths -> int64 array, a CostModel, the call, a Plan
  plan(cost=)         the same with a CostModel made once (what a data loader does each step)
  plan() + arrays     plan(cost=) and every NumPy array of the plan (sequences, items, segments,
                      members, schedules) and every rank's chunk ranges (chunk_arrays())
In each repetition the four Python-side variants run back to back (each first in turn), so a busy
machine slows them alike; the overhead is the median over repetitions of (variant - raw call) from the same repetition,
wall clock and the thread's CPU time.
"""

import argparse
import ctypes
import json
import statistics
import subprocess
import sys
import time

import numpy as np

import bytescale
from bytescale import _lib

CAPACITY, CONTEXT = 8192, 2 << 20


def clock():
    return time.perf_counter(), time.thread_time()


def main():
    ap = argparse.ArgumentParser(description="planning from Python vs from C")
    ap.add_argument("bench_plan_api", help="path to build/bench_plan_api")
    ap.add_argument("--repeats", type=int, default=51)
    ap.add_argument("--ranks", type=int, default=16384)
    ap.add_argument("--dist", default="byted")
    args = ap.parse_args()

    c_out = subprocess.run([args.bench_plan_api, "--repeats", str(args.repeats), "--ranks", str(args.ranks),
                            "--dist", args.dist], capture_output=True, text=True, check=True).stdout
    print(c_out.rstrip().rsplit("\n", 1)[0])
    c = json.loads(c_out.strip().splitlines()[-1])

    lengths = bytescale.sample_lengths(args.dist, tokens=32 << 20, context=CONTEXT, seed=1)
    kw = dict(ranks=args.ranks, capacity=CAPACITY, context=CONTEXT, policy="balance")
    cost = bytescale.CostModel("llama-7b", "h800-sxm", tp=2, ranks=args.ranks, capacity=CAPACITY)
    assert bytescale.plan(lengths, **kw).n_items == c["items"]
    lib, a = _lib.lib, np.ascontiguousarray(lengths, dtype=np.int64)

    def raw():
        cm = lib.bs_cost_derive(b"llama-7b", b"h800-sxm", 2, 1, args.ranks, CAPACITY)
        p = lib.bs_plan_lengths(a.ctypes.data, a.size, b"balance", args.ranks, CAPACITY, CONTEXT, 1, 1, cm)
        info = _lib.PlanInfo()
        lib.bs_plan_info(p, info, ctypes.sizeof(info))
        lib.bs_plan_free(p)
        lib.bs_cost_free(cm)

    def with_arrays():
        q = bytescale.plan(lengths, cost=cost, **kw)
        for name in ("seq_len", "item_seg_begin", "seg_seq", "members", "rank_begin"):
            getattr(q, name)  # one call per group fetches the whole group
        q.chunk_arrays()

    variants = [("raw call", raw), ("plan()", lambda: bytescale.plan(lengths, **kw)),
                ("plan(cost=)", lambda: bytescale.plan(lengths, cost=cost, **kw)), ("plan() + arrays", with_arrays)]
    wall = {name: [] for name, _ in variants}
    cpu = {name: [] for name, _ in variants}
    for r in range(args.repeats):
        for name, fn in variants[r % 4:] + variants[:r % 4]:  # each variant first in turn
            w0, c0 = clock()
            fn()
            w1, c1 = clock()
            wall[name].append(w1 - w0)
            cpu[name].append(c1 - c0)

    ms = lambda x: f"{1e3 * x:.3f}"
    print(f"Python {sys.version.split()[0]}, bytescale {bytescale.__version__} ({bytescale.library_path}): "
          f"median (min) of {args.repeats} runs; overhead = median of (variant - raw call) per repetition")
    for name, _ in variants:
        w, t = wall[name], cpu[name]
        line = f"  {name:16s} wall {ms(statistics.median(w))} ms ({ms(min(w))}), CPU {ms(statistics.median(t))} ms"
        if name != "raw call":
            dw = statistics.median(x - y for x, y in zip(w, wall["raw call"]))
            dc = statistics.median(x - y for x, y in zip(t, cpu["raw call"]))
            line += (f"; overhead wall {ms(dw)} ms, CPU {ms(dc)} ms = {dc / statistics.median(cpu['raw call']):.1%} "
                     f"of the call")
        print(line)
    print(f"  C (bench_plan_api) bs_plan_lengths: wall {ms(c['plan_lengths_wall'])} ms, CPU "
          f"{ms(c['plan_lengths_cpu'])} ms; policy_plan alone: CPU {ms(c['policy_plan_cpu'])} ms")


if __name__ == "__main__":
    main()
