#!/usr/bin/env python3
"""torch_failures.py: how a bytescale.torch job fails (docs/torch.md, "Failures and timeouts"): every
case of bad input or failure, run under torchrun as a user runs a job, with the message each rank
ended on and how long after the failure each rank ended, printed as a table.

    BYTESCALE_LIB=build/libbytescale.so.0 .venv/bin/python bench/torch_failures.py            # every case
    ... bench/torch_failures.py --cases ring_shape,stall --timeout 60

Each case runs in a fresh `torchrun --nproc_per_node N` job (N = 2, 4 where the case needs a layout)
of this script in worker mode. The rank that fails writes the moment it does (its injected error, or
the start of its stall) and every rank writes the exception it ends on and when; a rank killed by
torchrun (a stalled rank, after the others left) writes nothing and shows as "killed". Times are
seconds from the failure to the rank's end (its exception), on one machine's clock.
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "python"))

CASES = {  # name: (processes, what the case does)
    "short_plan": (2, "a plan of lengths 100 tokens shorter than the batch (bytescale.plan, StepPlan.from_plan)"),
    "edited_file": (2, "a plan file whose sequence lengths were each edited by +7"),
    "past_end": (2, "a sequence that runs past its document's end (a hand-made plan)"),
    "past_end_batch": (2, "the same sequence in the batch given to plan_step"),
    "planner_rank0": (2, "a planner failure on rank 0 (capacity too small), raised before broadcast_plan"),
    "planner_lambda": (2, "the same, planned inside broadcast_plan(lambda: plan_step(...))"),
    "ring_shape": (2, "k one row short on rank 1 only, in a ring"),
    "a2a_shape": (2, "k one row short on rank 1 only, in an all-to-all item"),
    "stage_fail": (2, "an error in pipeline stage 1's forward (pp 2)"),
    "tp_fail": (4, "an error on tp rank 1 of HDP rank 0 inside its layers (tp 2 x hdp 2)"),
    "stall": (2, "rank 1 stalls before step 2's plan"),
}


def source():
    import numpy as np
    import bytescale.torch as bt

    lengths = np.random.default_rng(5).integers(40, 400, 64)

    def read(doc, start, n):
        i = np.arange(start, max(start, min(int(lengths[doc]), start + n)), dtype=np.int64)
        return (doc * 7919 + i * 104729) % 256
    return bt.FunctionSource(read, lambda d: int(lengths[d])), lengths


def note(out, rank, **rec):
    """One JSON line of this rank's into the case's file (appended: ranks write their own files)."""
    with open(os.path.join(out, f"rank{rank}.jsonl"), "a") as f:
        f.write(json.dumps(dict(rank=rank, t=time.time(), **rec)) + "\n")


def ring_plan(bt, src, lengths, ulysses=()):
    """A ring (or a2a item) of both ranks and a pack on each."""
    docs = [d for d in range(len(lengths)) if lengths[d] >= 100][:3]
    lens = [90, 30, 40]
    labelled = bt.labelled_tokens(bt.Batch(docs, [0] * 3, lens), src)
    return bt.StepPlan(2, docs, [0] * 3, lens, [((0, 1), ((0, 0, 90),)), ((1,), ((1, 0, 30),)), ((0,), ((2, 0, 40),))],
                       labelled=labelled, ulysses=list(ulysses) + [0, 0] if ulysses else [])


def attention_step(bt, torch, plan, rank, src, out, short_rank):
    """q, k, v through hdp_attention in every micro-batch; k one row short on `short_rank`."""
    for mb in bt.microbatches(plan, rank, src):
        q = torch.randn(mb.T, 4, 8, requires_grad=True)
        k, v = torch.randn(mb.T, 2, 8), torch.randn(mb.T, 2, 8)
        if rank == short_rank and mb.T > 0 and (mb.ring is not None or mb.ulysses is not None):
            k = k[:-1]
            note(out, rank, event="inject")
        with bt.microbatch_context(mb):
            o = bt.hdp_attention(q, k, v)
        o.sum().backward()


def plan_cases(case, bt, rank, world, src, lengths, out):
    """The cases about plans: each raises on every rank (or, planner_rank0, on rank 0 first)."""
    import bytescale
    import numpy as np

    docs = list(range(8))
    lens = [int(lengths[d]) for d in docs]
    batch = bt.Batch(docs, [0] * 8, lens)
    if case == "short_plan":  # made for lengths 100 shorter, paired with the real batch
        def make():
            shorter = np.asarray(lens) - np.where(np.arange(8) == 7, 100, 0)
            p = bytescale.plan(shorter, ranks=world, capacity=512, policy="balance", model="tiny", hardware="cpu",
                               tp=1, offload=False)
            return bt.StepPlan.from_plan(p, batch, bt.labelled_tokens(batch, src))
        note(out, rank, event="inject")
        return bt.broadcast_plan(make)
    if case == "edited_file":  # a plan file's sequences each 7 tokens longer than its items' segments
        plan = bt.plan_step(batch, src, ranks=world, capacity=256, policy="balance")
        d = {"n_ranks": plan.n_ranks, "sequences": [{"id": q, "src": 0, "len": n + 7} for q, n in enumerate(lens)],
             "items": [{"ranks": list(r), "segments": [list(s) for s in segs]} for r, segs in plan.items]}
        note(out, rank, event="inject")
        return bt.StepPlan.from_plan_file(d, [0] * len(lengths), [int(x) for x in lengths])
    if case == "past_end":
        plan = bt.plan_step(batch, src, ranks=world, capacity=256, policy="balance")
        plan.seq_start[3] = lens[3] - plan.seq_len[3] + 5  # its last 5 tokens past the document's end
        note(out, rank, event="inject")
        return plan
    if case == "past_end_batch":
        bad = bt.Batch(docs, [0, 0, 0, 5] + [0] * 4, lens)
        note(out, rank, event="inject")
        return bt.broadcast_plan(lambda: bt.plan_step(bad, src, ranks=world, capacity=256, policy="balance"))
    if case == "planner_rank0":  # the user's own code raises on rank 0 before broadcast_plan
        if rank == 0:
            note(out, rank, event="inject")
        return bt.broadcast_plan(bt.plan_step(batch, src, ranks=world, capacity=8, policy="balance")
                                 if rank == 0 else None)
    note(out, rank, event="inject")
    return bt.broadcast_plan(lambda: bt.plan_step(batch, src, ranks=world, capacity=8, policy="balance"))


def stage_case(bt, torch, rank, src, lengths, out):
    """pp 2 on 2 processes: stage 1's forward raises; stage 0 waits for its gradients."""
    layout = bt.Layout(pp=2)
    cfg = bt.LlamaConfig.named("tiny")
    model = bt.Llama(cfg, parallel=layout, dtype=torch.float32).init_weights(1)
    docs = list(range(6))
    batch = bt.Batch(docs, [0] * 6, [int(lengths[d]) for d in docs])
    plan = bt.broadcast_plan(lambda: bt.plan_step(batch, src, ranks=1, capacity=512, policy="balance", pp=2))
    if layout.stage == 1:
        def boom(*a, **k):
            note(out, rank, event="inject")
            raise RuntimeError("injected failure in pipeline stage 1's forward")
        model.stage_forward = boom
    bt.HDPTrainer(model).step(plan, bt.microbatches(plan, layout.hdp_rank, src, layout=layout))


def tp_case(bt, torch, rank, src, lengths, out):
    """tp 2 x hdp 2: process 1 (tp rank 1 of HDP rank 0) raises inside its layers."""
    layout = bt.Layout(tp=2)
    model = bt.Llama(bt.LlamaConfig.named("tiny"), parallel=layout).init_weights(1)
    docs = list(range(6))
    batch = bt.Batch(docs, [0] * 6, [int(lengths[d]) for d in docs])
    plan = bt.broadcast_plan(lambda: bt.plan_step(batch, src, ranks=2, capacity=256, policy="balance"))
    if rank == 1:
        def boom(*a, **k):
            note(out, rank, event="inject")
            raise RuntimeError("injected failure on tp rank 1")
        model.stage_forward = boom
    bt.HDPTrainer(model).step(plan, bt.microbatches(plan, layout.hdp_rank, src, layout=layout))


def stall_case(bt, rank, world, src, lengths, out):
    """Two steps of a plan; rank 1 sleeps before step 2's broadcast."""
    docs = list(range(8))
    batch = bt.Batch(docs, [0] * 8, [int(lengths[d]) for d in docs])
    for step in (1, 2):
        if step == 2 and rank == 1:
            note(out, rank, event="inject")
            time.sleep(3600)
        plan = bt.broadcast_plan(lambda: bt.plan_step(batch, src, ranks=world, capacity=256, policy="balance"))
        bt.microbatches(plan, rank, src)


def worker(case, out, store_port=None):
    import torch
    import bytescale.torch as bt
    from bytescale.torch import launch

    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    launch.init(rank, world, store_port=store_port)  # torchrun's rendezvous, or a store the caller holds
    torch.manual_seed(rank)
    src, lengths = source()
    try:
        if case in ("ring_shape", "a2a_shape"):
            plan = ring_plan(bt, src, lengths, [2] if case == "a2a_shape" else ())
            attention_step(bt, torch, plan, rank, src, out, 1)
        elif case == "stage_fail":
            stage_case(bt, torch, rank, src, lengths, out)
        elif case == "tp_fail":
            tp_case(bt, torch, rank, src, lengths, out)
        elif case == "stall":
            stall_case(bt, rank, world, src, lengths, out)
        else:
            plan = plan_cases(case, bt, rank, world, src, lengths, out)
            bt.microbatches(plan, rank, src)
        note(out, rank, event="end", kind="ok", message="finished")
    except BaseException as e:
        note(out, rank, event="end", kind=type(e).__name__, message=" ".join(str(e).split()))
        raise
    launch.finish()


def run_case(case, timeout_s, py):
    """Run one case under torchrun; returns (seconds the job took, its records)."""
    nproc = CASES[case][0]
    out = tempfile.mkdtemp(prefix=f"bs-fail-{case}-")
    env = dict(os.environ, BYTESCALE_TIMEOUT=str(timeout_s), BS_QUIET="1", OMP_NUM_THREADS="1")
    env["PYTHONPATH"] = os.path.join(HERE, "..", "python") + os.pathsep + env.get("PYTHONPATH", "")
    torchrun = os.path.join(os.path.dirname(py), "torchrun")
    from bytescale.torch import launch
    cmd = [torchrun, "--nproc_per_node", str(nproc), "--master_port", str(launch.free_port()), os.path.abspath(__file__),
           "--worker", case, "--out", out]
    t0 = time.time()
    subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout_s * 4 + 600)
    took = time.time() - t0
    recs = []
    for r in range(nproc):
        path = os.path.join(out, f"rank{r}.jsonl")
        recs.append([json.loads(x) for x in open(path)] if os.path.exists(path) else [])
    return took, recs


def table_rows(case, recs):
    """One markdown row per rank: its end (exception and message) and seconds after the failure."""
    inject = [x["t"] for rs in recs for x in rs if x.get("event") == "inject"]
    t_fail = min(inject) if inject else None
    rows = []
    for r, rs in enumerate(recs):
        end = [x for x in rs if x.get("event") == "end"]
        if not end:
            rows.append(f"| `{case}` | {r} | killed by torchrun after the others ended (no message) | |")
            continue
        e = end[-1]
        dt = f"{e['t'] - t_fail:.2f}" if t_fail is not None else ""
        msg = e["message"].replace("|", "\\|")
        rows.append(f"| `{case}` | {r} | `{e['kind']}`: {msg} | {dt} |")
    return rows


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cases", default=",".join(CASES), help="comma-separated, of: " + ", ".join(CASES))
    ap.add_argument("--timeout", type=float, default=20.0, help="BYTESCALE_TIMEOUT for the jobs (seconds, default 20)")
    ap.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--out", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--store-port", type=int, default=None, help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.worker:
        return worker(a.worker, a.out, a.store_port)
    print("| case | rank | message the rank ended on | seconds after the failure |")
    print("|---|---:|---|---:|")
    for case in a.cases.split(","):
        took, recs = run_case(case, a.timeout, sys.executable)
        for row in table_rows(case, recs):
            print(row, flush=True)
        print(f"<!-- {case}: {CASES[case][1]}; the job took {took:.1f} s -->", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
