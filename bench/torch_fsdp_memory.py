#!/usr/bin/env python3
"""torch_fsdp_memory.py: memory per rank of FSDP2 (bytescale.torch.fsdp) and ZeRO-1 against
replicated parameters, in a loop of one's own (docs/torch-fsdp.md, "Memory").

The model is examples/torch_user_loop.py's TinyLM made wider (d 512, 4 layers, d_ff 2048: 15.8 M
parameters, 60 MB in fp32) with AdamW; 3 steps of a small batch (4 short made-up documents and a
long one cut at 200 tokens, a ring of 2 at capacity 128) on N processes (gloo, CPU), so that the
model's state, not the activations, is most of the memory. Per rank and mode:

- held: bytes of parameters, gradients and optimizer state this process holds after the optimizer's
  step (the local shards: bytescale.torch.fsdp.local_bytes), and their sum;
- peak: the process's peak resident memory during the 3 steps, less its resident memory before the
  model was made (Linux: VmHWM after writing 5 to /proc/self/clear_refs, which resets it). torch's
  CPU allocator keeps no statistics, and glibc's malloc keeps freed memory of a process (its mmap
  threshold grows with the blocks freed), so the script runs itself again with
  MALLOC_MMAP_THRESHOLD_=65536: every tensor over 64 KiB is its own mapping, returned to the system
  when freed, and the resident size follows the tensors alive.

    BYTESCALE_LIB=build/libbytescale.so.0 .venv/bin/python bench/torch_fsdp_memory.py --procs 2 4
"""

import argparse
import importlib.util
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "python"))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

import bytescale.torch as bt  # noqa: E402
from bytescale.torch import fsdp, launch  # noqa: E402

MODES = ("replicated", "zero1", "fsdp2")
SIZE = dict(d=512, layers=4, heads=4, kv_heads=2, d_ff=2048)


def user_loop():
    spec = importlib.util.spec_from_file_location("torch_user_loop", os.path.join(HERE, "..", "examples",
                                                                                   "torch_user_loop.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def status_kb(field):
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise KeyError(field)


def reset_peak():
    """Reset VmHWM to the current resident size (Linux clear_refs 5); False where not allowed."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def batch_of(ex, step):
    """4 short documents and a long one's first 200 tokens."""
    docs = [d for d in range(10 * step, 400) if d % 7 != 3 and ex.doc_length(d) < 100][:4] + [3 + 7 * step]
    return bt.Batch(docs, [0] * 5, [ex.doc_length(d) for d in docs[:4]] + [200])


def worker(rank, world, mode, steps):
    ex = user_loop()
    layout = bt.Layout()
    source = bt.FunctionSource(ex.read, ex.doc_length)
    reset_peak()
    base = status_kb("VmRSS")
    model = ex.TinyLM(layout, 3, **SIZE)
    if mode == "fsdp2":
        fsdp.shard(model, layout, blocks="blocks")
    if mode == "zero1":
        opt = fsdp.zero_optimizer(model, layout, lr=1e-3, weight_decay=0.0)
    else:
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.0)
    held = None
    for step in range(steps):
        plan = bt.broadcast_plan(lambda: bt.plan_step(batch_of(ex, step), source, ranks=world, capacity=128,
                                                      policy="balance"))
        mbs = bt.microbatches(plan, rank, source)
        with fsdp.step(model) if mode == "fsdp2" else _Nothing():
            for mb in mbs:
                with bt.microbatch_context(mb):
                    logits = model(mb.tokens, mb.pos)
                (F.cross_entropy(logits, mb.targets, ignore_index=-1, reduction="sum") / plan.labelled).backward()
        if mode != "fsdp2":
            bt.all_reduce_gradients(model)
        opt.step()
        held = fsdp.local_bytes(model, opt)
        opt.zero_grad(set_to_none=True)
    held["peak"] = (status_kb("VmHWM") - base) * 1024
    held["n_params"] = sum(p.numel() for p in model.parameters())
    return held


class _Nothing:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def mb(x):
    return f"{x / 2**20:.1f}"


def main():
    if os.environ.get("MALLOC_MMAP_THRESHOLD_") is None:  # before the forkserver starts (docstring)
        os.environ["MALLOC_MMAP_THRESHOLD_"] = "65536"
        os.execv(sys.executable, [sys.executable] + sys.argv)
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--procs", type=int, nargs="+", default=[2, 4])
    ap.add_argument("--steps", type=int, default=3)
    args = ap.parse_args()
    print(f"torch {torch.__version__}; TinyLM {SIZE}; AdamW fp32; {args.steps} steps; MB = 2^20 bytes; "
          f"the largest rank's figures")
    print("| processes | mode | params MB | grads MB | optimizer MB | held MB | peak RSS delta MB |")
    print("|---:|---|---:|---:|---:|---:|---:|")
    for n in args.procs:
        for mode in MODES:
            res = launch.spawn(worker, n, args=(mode, args.steps))
            top = max(res, key=lambda r: r["params"] + r["grads"] + r["optimizer"])
            held = top["params"] + top["grads"] + top["optimizer"]
            print(f"| {n} | {mode} | {mb(top['params'])} | {mb(top['grads'])} | {mb(top['optimizer'])} | "
                  f"{mb(held)} | {mb(max(r['peak'] for r in res))} |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
