#!/usr/bin/env python3
"""torch_hdp.py: bytescale.torch on 2 processes (gloo, CPU, one thread each), printed as tables.

1. Policies: tokens/s of `balance` against `static` on the SAME global batches and plans the C
   engine ran (`bytescale train --save-plans`), context above the capacity (so static rings every
   micro-batch over both ranks, and balance mixes rings and packs); the two torch trainers take
   their steps in turn (machine noise hits both alike); median of the steps after a warm-up. Beside
   them, the C engine's own figure on the same batches (`mpirun -np 2 bytescale train`, its metrics).
2. Ring overlap: forward + backward of ring attention at D = 2 on one causal sequence against the
   same block work computed locally without any message (each rank computes its queries against
   its own block and the other member's, merges, and runs both blocks' backward): the ratio is what
   the messages cost beyond the compute (the slowest rank's time; median of repeats).
3. Ring against all-to-all: the same sequence on the same 2 ranks as a ring item and as an a2a
   (Ulysses) item, forward + backward of one attention layer, slowest rank, median of repeats, with
   the bytes each rank sends. `--sections a2a` runs only this one (no C engine, no dataset).
4. Kernel (`--sections kernel`, one process): varlen attention of one causal sequence, forward +
   backward, through the attention kernel this process chose (bytescale.torch.attention.KERNEL,
   printed first) against the blockwise kernel. On CPU both are the blockwise kernel.

`--device cuda` runs sections 2-4 on GPUs (2 and 3 with NCCL, one GPU per process, so they need 2
GPUs), `--dtype bf16` or `fp16` in the dtype the fused kernels take.

    make && BYTESCALE_LIB=build/libbytescale.so.0 .venv/bin/python bench/torch_hdp.py \\
        --binary build/bytescale --data data/go-byte
"""

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "python"))

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

import bytescale.torch as bt  # noqa: E402
from bytescale.torch import attention, fused, launch  # noqa: E402
from bytescale.torch.attention import Rows, block_backward, block_forward, merge  # noqa: E402

POLICIES = ("static", "balance")
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


def on(device: str) -> torch.device:
    """This process's device: its GPU (launch.init set it) or the CPU."""
    return torch.device("cuda", torch.cuda.current_device()) if device == "cuda" else torch.device("cpu")


def slowest(t0: float, dev: torch.device) -> float:
    """Seconds since t0 on the slowest rank (the GPU's queued work finished first)."""
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)
    t = torch.tensor([time.perf_counter() - t0], device=dev)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return float(t)


def c_engine(args, policy, out):
    """`mpirun -np 2 bytescale train` with the bench's settings: its plans and metrics."""
    plans = os.path.join(out, f"plans-{policy}")
    os.makedirs(plans)
    metrics = os.path.join(out, f"c-{policy}.jsonl")
    env = dict(os.environ, BS_QUIET="1", OPENBLAS_NUM_THREADS="1", OMPI_ALLOW_RUN_AS_ROOT="1",
               OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
    mpirun = shutil.which("mpirun") or shutil.which("mpiexec")
    cmd = [mpirun, "-np", "2", "--bind-to", "core", args.binary, "train", "--data", args.data, "--model", args.model,
           "--context", str(args.context), "--capacity", str(args.capacity), "--tokens", str(args.tokens),
           "--steps", str(args.steps), "--policy", policy, "--seed", "1", "--save-plans", plans, "--metrics", metrics]
    r = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if r.returncode != 0:  # --bind-to core can be refused where cores are shared: try without
        cmd.remove("--bind-to"), cmd.remove("core")
        shutil.rmtree(plans), os.makedirs(plans)
        r = subprocess.run(cmd, capture_output=True, text=True, env=env)
        if r.returncode != 0:
            sys.exit(f"C engine failed: {' '.join(cmd)}\n{r.stderr}")
    with open(metrics) as f:
        rows = [json.loads(line) for line in f]
    return plans, rows, " ".join(cmd)


def policies_worker(rank, world, args, plan_dirs):
    """Both policies' trainers from the same weights, taking their steps in turn over the C plans."""
    ds = bt.Dataset(args.data)
    cfg = bt.LlamaConfig.named(args.model)
    trainers = {}
    for p in POLICIES:
        model = bt.Llama(cfg).init_weights(1)
        trainers[p] = bt.HDPTrainer(model, lr=1e-3, warmup=1, schedule_steps=args.steps)
    times = {p: [] for p in POLICIES}
    detail = {p: [] for p in POLICIES}
    for step in range(1, args.steps + 1):
        for p in POLICIES:
            with open(os.path.join(plan_dirs[p], f"plan-{step:06d}.json")) as f:
                plan = bt.StepPlan.from_plan_file(json.load(f), ds.doc_offset, ds.doc_len)
            tr = trainers[p]
            mbs = bt.microbatches(plan, rank, ds, ring_stats=tr.ring_stats)
            dist.barrier()  # both ranks start the step together: the step time is the slowest rank's
            t0 = time.perf_counter()
            res = tr.step(plan, mbs)
            t = torch.tensor([time.perf_counter() - t0])
            dist.all_reduce(t, op=dist.ReduceOp.MAX)
            times[p].append((float(t), plan.n_tokens, plan.n_rings, len(plan.items)))
            detail[p].append((res.compute, res.wait, res.sync))
    return times, detail


def overlap_worker(rank, world, lengths, heads, repeats, device="cpu", dtype="fp32"):
    """Ring attention (D = 2, one sequence) vs the same blocks computed locally, per length."""
    H, G, hd = heads
    dev, dt = on(device), DTYPES[dtype]
    out = []
    for s in lengths:
        plan = bt.StepPlan(2, [0], [0], [s], [((0, 1), ((0, 0, s),))], labelled=0)
        rows = [Rows(*map(torch.from_numpy, plan.member_rows(0, m))) for m in range(2)]
        g = torch.Generator().manual_seed(rank)
        n = rows[rank].n
        q = torch.randn(n, H, hd, generator=g)
        k, v = torch.randn(n, G, hd, generator=g), torch.randn(n, G, hd, generator=g)
        ko, vo = torch.randn(rows[1 - rank].n, G, hd), torch.randn(rows[1 - rank].n, G, hd)
        dout = torch.randn(n, H, hd, generator=g)
        q, k, v, ko, vo, dout = (x.to(dev, dt) for x in (q, k, v, ko, vo, dout))
        ring = bt.Ring([0, 1], rank, rows)
        ring_t, local_t = [], []
        for _ in range(repeats):
            # the ring: forward + backward through autograd, as the model runs it
            qq, kk, vv = (x.clone().requires_grad_() for x in (q, k, v))
            dist.barrier()
            t0 = time.perf_counter()
            bt.ring_attention(qq, kk, vv, ring).backward(dout)
            ring_t.append(slowest(t0, dev))
            # the same blocks without messages: own block, the other member's, merge, both backwards
            dist.barrier()
            t0 = time.perf_counter()
            o1, l1 = block_forward(q, k, v, rows[rank], rows[rank])
            o2, l2 = block_forward(q, ko, vo, rows[rank], rows[1 - rank])
            o, lse = merge(o1, l1, o2, l2)
            delta = (dout.to(lse.dtype) * o.to(lse.dtype)).sum(-1)
            block_backward(dout, q, k, v, lse, delta, rows[rank], rows[rank])
            block_backward(dout, q, ko, vo, lse, delta, rows[rank], rows[1 - rank])
            local_t.append(slowest(t0, dev))
        out.append((s, statistics.median(ring_t), statistics.median(local_t)))
    return out


def a2a_worker(rank, world, lengths, heads, repeats, device="cpu", dtype="fp32"):
    """One sequence on 2 ranks as a ring and as an a2a item: (tokens, ring s, a2a s, ring bytes,
    a2a bytes) per length, seconds of the slowest rank, bytes this rank sent per repeat."""
    H, G, hd = heads
    dev, dt = on(device), DTYPES[dtype]
    out = []
    for s in lengths:
        plan = bt.StepPlan(2, [0], [0], [s], [((0, 1), ((0, 0, s),))], labelled=0)
        rows = [Rows(*map(torch.from_numpy, plan.member_rows(0, m))) for m in range(2)]
        g = torch.Generator().manual_seed(rank)
        n = rows[rank].n
        q, dout = torch.randn(n, H, hd, generator=g), torch.randn(n, H, hd, generator=g)
        k, v = torch.randn(n, G, hd, generator=g), torch.randn(n, G, hd, generator=g)
        q, dout, k, v = (x.to(dev, dt) for x in (q, dout, k, v))
        stats = {"ring": bt.RingStats(), "a2a": bt.RingStats()}
        fns = {"ring": lambda a, b, c: bt.ring_attention(a, b, c, bt.Ring([0, 1], rank, rows, stats["ring"])),
               "a2a": lambda a, b, c: bt.ulysses_attention(a, b, c, bt.Ulysses([0, 1], rank, rows, 2, stats["a2a"]))}
        times = {"ring": [], "a2a": []}
        for _ in range(repeats):
            for kind, fn in fns.items():  # alternating, so the machine's noise hits both alike
                qq, kk, vv = (x.clone().requires_grad_() for x in (q, k, v))
                dist.barrier()
                t0 = time.perf_counter()
                fn(qq, kk, vv).backward(dout)
                times[kind].append(slowest(t0, dev))
        out.append((s, statistics.median(times["ring"]), statistics.median(times["a2a"]),
                    stats["ring"].bytes_sent // repeats, stats["a2a"].bytes_sent // repeats))
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--binary", default=os.path.join(HERE, "..", "build", "bytescale"))
    ap.add_argument("--data", default="data/go-byte")
    ap.add_argument("--model", default="tiny")
    ap.add_argument("--context", type=int, default=4096)
    ap.add_argument("--capacity", type=int, default=2048)
    ap.add_argument("--tokens", type=int, default=16384)
    ap.add_argument("--steps", type=int, default=7, help="steps per policy; the first is a warm-up")
    ap.add_argument("--lengths", default="2048,4096,8192", help="ring overlap: sequence lengths")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--overlap-models", default="tiny,small", help="ring overlap: attention shapes of these models")
    ap.add_argument("--sections", default="policies,overlap,a2a",
                    help="which tables: policies, overlap, a2a, kernel")
    ap.add_argument("--device", default="cpu", choices=("cpu", "cuda"),
                    help="overlap, a2a, kernel: on the CPU (gloo) or GPUs (NCCL, one per process)")
    ap.add_argument("--dtype", default="fp32", choices=tuple(DTYPES), help="overlap, a2a, kernel: the tensors' dtype")
    args = ap.parse_args()
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    sections = set(args.sections.split(","))
    if sections - {"policies", "overlap", "a2a", "kernel"}:
        ap.error(f"--sections {args.sections}: a comma-separated list of policies, overlap, a2a, kernel")
    if args.device == "cuda":
        if not torch.cuda.is_available():
            ap.error("--device cuda: torch sees no CUDA device here")
        if "policies" in sections:
            ap.error("--device cuda: the policies table runs the CPU trainer beside the C engine; "
                     "pick --sections overlap,a2a,kernel")
        if sections & {"overlap", "a2a"} and torch.cuda.device_count() < 2:
            ap.error(f"--device cuda: overlap and a2a run 2 processes on one GPU each (NCCL allows no two ranks "
                     f"on one GPU); this machine has {torch.cuda.device_count()}: pick --sections kernel")
    elif args.dtype != "fp32":
        ap.error(f"--dtype {args.dtype}: on the CPU the bench runs fp32")
    print(f"torch {torch.__version__} (Python {sys.version.split()[0]}), {torch.get_num_threads()} intra-op threads here; "
          f"{os.cpu_count()} cores")
    print(f"attention kernel: {attention.KERNEL.name} (bytescale.torch.attention.KERNEL; "
          f"BYTESCALE_ATTN_KERNEL=reference forces the blockwise kernel); device {args.device}, dtype {args.dtype}")
    if "policies" in sections:
        policies_table(args)
    lengths = [int(x) for x in args.lengths.split(",")]
    if "overlap" in sections:
        overlap_table(args, lengths)
    if "a2a" in sections:
        a2a_table(args, lengths)
    if "kernel" in sections:
        kernel_table(args, lengths)
    return 0


def policies_table(args):
    with tempfile.TemporaryDirectory(prefix="bench-torch-hdp-") as tmp:
        c_rows, dirs, cmds = {}, {}, {}
        for p in POLICIES:
            dirs[p], c_rows[p], cmds[p] = c_engine(args, p, tmp)
        times, detail = launch.spawn(policies_worker, 2, args=(args, dirs), timeout_s=1800)[0]
    print(f"\n## Policies: {args.model}, context {args.context}, capacity {args.capacity}, {args.tokens} tokens/step, "
          f"2 processes x 1 thread, the C engine's batches and plans, median of steps 2..{args.steps}\n")
    print("| policy | torch tokens/s | vs static | rings/items per step | torch compute / ring wait / sync s "
          "(rank 0) | C engine tokens/s | vs static |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    base_t = base_c = None
    for p in POLICIES:
        rows = times[p][1:]
        tps = statistics.median(n / t for t, n, _, _ in rows)
        comp = statistics.median(c for c, _, _ in detail[p][1:])
        wait = statistics.median(w for _, w, _ in detail[p][1:])
        sync = statistics.median(s for _, _, s in detail[p][1:])
        ctps = statistics.median(r["tokens_per_s"] for r in c_rows[p][1:])
        base_t, base_c = base_t or tps, base_c or ctps
        rr = statistics.median(r for _, _, r, _ in rows)
        it = statistics.median(i for _, _, _, i in rows)
        print(f"| {p} | {tps:,.0f} | {tps / base_t:.2f}x | {rr:g}/{it:g} | {comp:.3f} / {wait:.3f} / {sync:.3f} | "
              f"{ctps:,.0f} | {ctps / base_c:.2f}x |")
    print(f"\nC engine: `{cmds['balance']}` (and --policy static)")


def overlap_table(args, lengths):
    overlap = {}
    for name in args.overlap_models.split(","):
        c = bt.LlamaConfig.named(name)
        overlap[name] = launch.spawn(overlap_worker, 2, args=(lengths, (c.n_heads, c.n_kv_heads, c.head_dim),
                                                              args.repeats, args.device, args.dtype),
                                     backend=backend(args))[0]
    print(f"\n## Ring overlap: D = 2, one causal sequence, forward + backward of one attention layer, slowest rank, "
          f"median of {args.repeats}\n")
    print("| attention shape | tokens | ring s | same blocks locally s | ratio |")
    print("|---|---:|---:|---:|---:|")
    for name, rows in overlap.items():
        c = bt.LlamaConfig.named(name)
        for s, r, l in rows:
            print(f"| {name} (H {c.n_heads}, G {c.n_kv_heads}, hd {c.head_dim}) | {s} | {r:.4f} | {l:.4f} | "
                  f"{r / l:.3f} |")


def a2a_table(args, lengths):
    print(f"\n## Ring against all-to-all: D = 2, one causal sequence, forward + backward of one attention layer, "
          f"slowest rank, median of {args.repeats}\n")
    print("| attention shape | tokens | ring s | a2a s | a2a / ring | ring KiB sent | a2a KiB sent |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for name in args.overlap_models.split(","):
        c = bt.LlamaConfig.named(name)
        rows = launch.spawn(a2a_worker, 2, args=(lengths, (c.n_heads, c.n_kv_heads, c.head_dim), args.repeats,
                                                 args.device, args.dtype), backend=backend(args))[0]
        for s, r, a, rb, ab in rows:
            print(f"| {name} (H {c.n_heads}, G {c.n_kv_heads}, hd {c.head_dim}) | {s} | {r:.4f} | {a:.4f} | "
                  f"{a / r:.3f} | {rb / 1024:,.0f} | {ab / 1024:,.0f} |")


def backend(args) -> str:
    return "nccl" if args.device == "cuda" else "gloo"


def kernel_time(fn, q, k, v, dout, repeats: int) -> float:
    """Median seconds of forward + backward of fn(q, k, v) (the device's queue drained each time)."""
    times = []
    for _ in range(repeats):
        qq, kk, vv = (x.clone().requires_grad_() for x in (q, k, v))
        if q.is_cuda:
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        fn(qq, kk, vv).backward(dout)
        if q.is_cuda:
            torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def kernel_table(args, lengths):
    """One process: varlen attention of one causal sequence through KERNEL and through the blockwise
    kernel, forward + backward (the backward is the blockwise kernel's in both)."""
    dev, dt = on(args.device), DTYPES[args.dtype]
    chosen = attention.KERNEL
    print(f"\n## Kernel: one causal sequence, forward + backward of one attention layer, one process, "
          f"{args.device} {args.dtype}, median of {args.repeats}\n")
    print(f"KERNEL = {chosen.name}\n")
    print("| attention shape | tokens | KERNEL s | fused on these tensors | blockwise s | blockwise / KERNEL |")
    print("|---|---:|---:|---|---:|---:|")
    for name in args.overlap_models.split(","):
        c = bt.LlamaConfig.named(name)
        H, G, hd = c.n_heads, c.n_kv_heads, c.head_dim
        for s in lengths:
            g = torch.Generator().manual_seed(s)
            q, dout = (torch.randn(s, H, hd, generator=g).to(dev, dt) for _ in range(2))
            k, v = (torch.randn(s, G, hd, generator=g).to(dev, dt) for _ in range(2))
            cu = torch.tensor([0, s])
            fn = lambda a, b, c_: bt.varlen_attention(a, b, c_, cu)  # noqa: E731
            kernel_time(fn, q, k, v, dout, 1)  # warm-up (kernel compilation, allocator)
            t_chosen = kernel_time(fn, q, k, v, dout, args.repeats)
            attention.KERNEL = fused.Kernel()
            try:
                t_ref = kernel_time(fn, q, k, v, dout, args.repeats)
            finally:
                attention.KERNEL = chosen
            print(f"| {name} (H {H}, G {G}, hd {hd}) | {s} | {t_chosen:.4f} | "
                  f"{'yes' if chosen.fused and chosen.accepts(q) else 'no (blockwise)'} | {t_ref:.4f} | "
                  f"{t_ref / t_chosen:.2f} |")


if __name__ == "__main__":
    sys.exit(main())
