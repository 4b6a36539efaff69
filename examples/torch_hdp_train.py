#!/usr/bin/env python3
"""torch_hdp_train.py: train the reference LLaMA with Hybrid Data Parallelism in PyTorch.

The same job as `bytescale train` (docs/training.md), executed by bytescale.torch (docs/torch.md):
every step rank 0 samples a global batch from a prepared dataset (`bytescale prepare`, the Go
corpus by default), plans it with an HDP policy over the job's HDP ranks (the C planner, one call),
and broadcasts the plan; every rank reads only its own rows and runs its micro-batches in the
plan's global order: packs of short documents with blockwise varlen attention, long ones as rings
of ranks with ring attention, all-to-all and hybrid items; the loss is token-level over the whole
global batch; gradients are all-reduced bucket by bucket as the backward finishes them; clipped
AdamW. With --tp T and --pp P every HDP rank is T x P processes (tensor parallelism inside a stage,
pipeline stages), as `bytescale train --tp --pp`.

    make python                                                # .venv with the package (docs/torch.md)
    .venv/bin/torchrun --nproc_per_node 2 examples/torch_hdp_train.py --context 16K --capacity 8K --tokens 32K
    .venv/bin/torchrun --nproc_per_node 4 examples/torch_hdp_train.py --tp 2 ...   # 2 HDP ranks of 2 tp ranks
    .venv/bin/python examples/torch_hdp_train.py --nproc 2 --context 16K --capacity 8K --tokens 32K --steps 50

gloo on CPU; NCCL on CUDA when available (--backend to choose). The flags and their defaults are
`bytescale train`'s (the ones that apply here; --nproc, --backend, --timeout and --zero are this
script's own). A progress line on stderr (BS_QUIET=1 hides it), one JSON line per step with
--metrics (loss, tokens/s, every rank's compute / wait / sync seconds), checkpoints in the C engine's
file layout with --ckpt-dir (DIR/ckpt-NNNNNN.bin, the step in six digits, as `bytescale train` names
them; the whole model whatever --tp / --pp), --resume to continue from one.
"""

import argparse
import json
import math
import importlib.util
import os
import re
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
# the installed package (make python) when there is one; else, in a checkout, the package beside us
# (which then needs BYTESCALE_LIB: only pip copies the library into the package)
if importlib.util.find_spec("bytescale") is None and os.path.isdir(os.path.join(HERE, "..", "python", "bytescale")):
    sys.path.insert(0, os.path.join(HERE, "..", "python"))

import numpy as np  # noqa: E402
import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

import bytescale  # noqa: E402
import bytescale.torch as bt  # noqa: E402
from bytescale.torch import launch  # noqa: E402
from bytescale.torch.checkpoint import f32, model_config_json  # noqa: E402

# the policies `bytescale train` runs (the library's table), and its dataset (or BYTESCALE_DATA)
TRAINS = [p for p in bytescale.policies() if p not in bytescale.no_train()]
DATA = os.environ.get("BYTESCALE_DATA") or "data/go-byte"


def size(text):
    """An integer with an optional K, M or G suffix (powers of 1024), as bytescale's flags take."""
    m = re.fullmatch(r"(\d+)([KMG]?)", text.strip(), re.I)
    if not m:
        raise argparse.ArgumentTypeError(f"'{text}' is not an integer (suffixes K M G)")
    return int(m.group(1)) << {"": 0, "K": 10, "M": 20, "G": 30}[m.group(2).upper()]


def parse(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[1], formatter_class=argparse.RawTextHelpFormatter)
    s = ap.add_argument_group("settings (kept by a resumed run)")
    s.add_argument("--model", default="small", help="tiny, small or base (default small)")
    s.add_argument("--tokens", type=size, default=32 << 10, help="tokens per step, the global batch (default 32K)")
    s.add_argument("--context", type=size, default=4 << 10, help="longest sequence; longer documents are cut (4K)")
    s.add_argument("--capacity", type=size, default=0,
                   help="C: most tokens one rank holds in a micro-batch (default: the context)")
    s.add_argument("--policy", default="elastic", help=f"{', '.join(TRAINS)} (default elastic), as `bytescale train`")
    s.add_argument("--lr", type=float, default=1e-3, help="peak learning rate (default 1e-3)")
    s.add_argument("--min-lr", type=float, default=None, help="final learning rate (default lr / 10)")
    s.add_argument("--warmup", type=int, default=20, help="linear warmup steps (default 20)")
    s.add_argument("--weight-decay", type=float, default=0.1, help="AdamW weight decay on matrices (default 0.1)")
    s.add_argument("--clip", type=float, default=1.0, help="global gradient norm limit, 0 = none (default 1)")
    s.add_argument("--seed", type=int, default=1337, help="initial weights and data order (default 1337)")
    r = ap.add_argument_group("the run")
    r.add_argument("--data", default=DATA, help=f"prepared dataset (default {DATA}: $BYTESCALE_DATA, else "
                                                 f"`bytescale train`'s data/go-byte in the working directory)")
    r.add_argument("--steps", type=int, default=300, help="train until N steps are done (default 300)")
    r.add_argument("--ckpt-dir", default=None, help="write checkpoints DIR/ckpt-NNNNNN.bin (the step in six digits, "
                                                    "ckpt-000100.bin: `bytescale train`'s names)")
    r.add_argument("--ckpt-every", type=int, default=0, help="a checkpoint every N steps and at the end")
    r.add_argument("--ckpt-keep", type=int, default=2, help="newest checkpoints of this run to keep, 0 = all")
    r.add_argument("--metrics", default=None, help="one JSON line per step")
    r.add_argument("--cost", default=None, help="plan with this cost-model file (default: the model on `cpu`)")
    r.add_argument("--resume", default=None, help="continue from a checkpoint of this script (a file "
                                                  "DIR/ckpt-NNNNNN.bin)")
    j = ap.add_argument_group("the job (this script's own)")
    j.add_argument("--nproc", type=int, default=1, help="processes to spawn when not under torchrun (default 1)")
    j.add_argument("--backend", choices=("gloo", "nccl"), default=None, help="default: nccl with CUDA, else gloo")
    j.add_argument("--zero", action="store_true", help="ZeRO-1: torch's ZeroRedundancyOptimizer (not with --tp / --pp)")
    j.add_argument("--tp", type=int, default=1, help="tensor parallelism: processes per pipeline stage (default 1)")
    j.add_argument("--pp", type=int, default=1, help="pipeline stages per HDP rank (default 1); the job's processes "
                                                   "are tp x pp x HDP ranks")
    j.add_argument("--timeout", type=float, default=300.0,
                   help="seconds a collective waits for the slowest rank before the job fails naming the ranks "
                        "that did not arrive (default 300; BYTESCALE_TIMEOUT overrides it)")
    a = ap.parse_args(argv)
    a.capacity = a.capacity or a.context
    if a.min_lr is None:
        a.min_lr = a.lr / 10
    if not 0 < a.lr <= 1:
        ap.error(f"--lr {a.lr}: in (0, 1]")
    if a.policy not in TRAINS:
        why = bytescale.no_train().get(a.policy)
        ap.error(f"--policy {a.policy}: " + (f"not one `bytescale train` runs: {why}; " if why else "") +
                 f"one of {', '.join(TRAINS)}")
    if a.tp < 1 or a.pp < 1:
        ap.error(f"--tp {a.tp}, --pp {a.pp}: both at least 1")
    if a.zero and (a.tp > 1 or a.pp > 1):
        ap.error("--zero runs with tp 1 and pp 1 only here")
    return a


class Progress:
    """The progress line on stderr (rank 0): steps, ETA, loss, lr, the run's tokens/s."""

    def __init__(self, total, first):
        self.total, self.first, self.t0, self.tokens = total, first, time.perf_counter(), 0
        self.quiet = os.environ.get("BS_QUIET") == "1" or not sys.stderr.isatty()

    def update(self, step, loss, lr, tokens):
        self.tokens += tokens
        el = time.perf_counter() - self.t0
        done = step - self.first
        eta = el / max(1, done) * (self.total - step)
        line = (f"step {step}/{self.total}  loss {loss:.4f}  lr {lr:.2e}  {self.tokens / max(el, 1e-9):,.0f} tokens/s  "
                f"ETA {eta:.0f}s")
        if self.quiet:
            if step == self.total or step % 10 == 0:
                print(line, file=sys.stderr, flush=True)
        else:
            print("\r" + line + "   ", end="\n" if step == self.total else "", file=sys.stderr, flush=True)


def adam_state(trainer, model):
    """AdamW's moments of every parameter as flat vectors in the model's layout (zeros before the
    first step), and its step count; with ZeRO they are gathered to rank 0 first
    (consolidate_state_dict), and the other ranks get None. A part of the model (--tp / --pp) gives its
    own part's moments (save gathers the parts)."""
    opt = trainer.opt
    if hasattr(opt, "consolidate_state_dict"):
        opt.consolidate_state_dict(to=0)
        if dist.get_rank() != 0:
            return None
        sd = opt.state_dict()
        state = {}
        params = [p for g in opt.param_groups for p in g["params"]]
        for i, p in enumerate(params):
            if i in sd["state"]:
                state[p] = sd["state"][i]
    else:
        state = opt.state
    m, v = torch.zeros_like(model.flat), torch.zeros_like(model.flat)
    t = 0
    for name, off, shape, _ in model.layout:
        st = state.get(model.param(name), {})
        n = math.prod(shape)
        if "exp_avg" in st:
            m[off:off + n] = st["exp_avg"].reshape(-1)
            v[off:off + n] = st["exp_avg_sq"].reshape(-1)
            t = int(st["step"])
    return m, v, t


def set_adam_state(trainer, model, m, v, t):
    """Seed AdamW's state from the whole model's flat moments (a resumed run); a part of the model
    takes its pieces (full_index). Not with --zero (ZeRO shards state)."""
    if model.flat.numel() != m.numel():
        index = model.full_index().to(m.device)
        m, v = m[index], v[index]
    for name, off, shape, _ in model.layout:
        p = model.param(name)
        n = math.prod(shape)
        trainer.opt.state[p] = {"step": torch.tensor(float(t)), "exp_avg": m[off:off + n].view(shape).clone(),
                                "exp_avg_sq": v[off:off + n].view(shape).clone()}


def save(args, path, model, trainer, sampler, step, n_docs):
    """A checkpoint of the whole model in the C engine's layout, written by rank 0: the parts of a
    --tp / --pp job (parameters and moments) gathered first (gather_whole; every rank takes part)."""
    st = adam_state(trainer, model)
    m, v, t = st if st is not None else (None, None, 0)
    params = bt.gather_whole(model, model.flat)
    if model.parallel is not None:
        m, v = bt.gather_whole(model, m), bt.gather_whole(model, v)
        t = torch.tensor([t], dtype=torch.int64)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)  # every part has taken the same steps
        t = int(t)
    if dist.get_rank() != 0:
        return
    config = {"format": "bytescale-torch-train", "version": 1, "step": step, "model": model_config_json(model.cfg),
              "settings": {k: getattr(args, k) for k in ("policy", "tokens", "context", "capacity", "lr", "min_lr",
                                                         "warmup", "weight_decay", "clip", "seed")}
              | {"schedule_steps": trainer.schedule_steps, "beta1": 0.9, "beta2": 0.95, "eps": 1e-8},
              "dataset": {"dir": args.data}, "run": {"steps": args.steps}}
    ss = sampler.state()
    state = np.array([step, t, ss["seed"], ss["epoch"], ss["pos"], ss["taken"], n_docs, 0], dtype="<u8").tobytes()
    bt.write_checkpoint(path, [("config", json.dumps(config, indent=2).encode()), ("state", state),
                               ("params", f32(params)), ("adam.m", f32(m)), ("adam.v", f32(v))])


def ckpt_name(step):
    """`bytescale train`'s checkpoint name: the step in six digits (src/runtime/train_ckpt.c)."""
    return f"ckpt-{step:06d}.bin"


def check_resume(path):
    """A --resume that names no checkpoint file: the checkpoints beside it, by name, in the error."""
    if os.path.isfile(path):
        return
    d = path if os.path.isdir(path) else (os.path.dirname(path) or ".")
    found = sorted(f for f in os.listdir(d) if re.fullmatch(r"ckpt-\d{6,}\.bin", f)) if os.path.isdir(d) else []
    where = (f"{d} holds {', '.join(found)}: --resume {os.path.join(d, found[-1])} continues from the newest"
             if found else f"{d} holds no checkpoint (ckpt-NNNNNN.bin, the step in six digits)"
             if os.path.isdir(d) else f"no directory {d}")
    what = "a directory, not a checkpoint file" if os.path.isdir(path) else "no such file"
    raise SystemExit(f"torch_hdp_train: --resume {path}: {what}; {where}")


def one_rank_capacity(args, hdp):
    """On one HDP rank no ring can form: plan with the context as the capacity (what a sequence cut at
    the context needs), so the flags of an N-rank job run as they are; say so once."""
    if hdp > 1 or args.capacity >= args.context:
        return args.capacity
    if dist.get_rank() == 0:
        print(f"torch_hdp_train: one HDP rank: capacity {args.capacity} raised to the context {args.context} (a "
              f"sequence above the capacity needs a ring of 2 or more HDP ranks)", file=sys.stderr, flush=True)
    return args.context


def setup(rank, world, args):
    """The layout, model, trainer, sampler and first step (from --resume or 0)."""
    device = torch.device("cuda", torch.cuda.current_device()) if dist.get_backend() == "nccl" else torch.device("cpu")
    ds = bt.Dataset(args.data)
    # the vocabulary is the dataset's tokenizer's, rounded up to a multiple of tp (as bytescale train)
    cfg = bt.LlamaConfig.for_dataset(args.model, ds, tp=args.tp)
    if world % (args.tp * args.pp):
        raise SystemExit(f"torch_hdp_train: {world} processes do not divide into --tp {args.tp} x --pp {args.pp}: "
                         f"run tp x pp x H processes (H HDP ranks)")
    layout = bt.Layout(tp=args.tp, pp=args.pp) if args.tp * args.pp > 1 else None
    model = bt.Llama(cfg, device=device, parallel=layout).init_weights(args.seed)
    trainer = bt.HDPTrainer(model, lr=args.lr, min_lr=args.min_lr, warmup=args.warmup, schedule_steps=args.steps,
                            weight_decay=args.weight_decay, clip=args.clip, zero=args.zero)
    sampler = bt.Sampler(ds, tokens=args.tokens, context=args.context, seed=args.seed)
    first = 0
    if args.resume:
        check_resume(args.resume)
        ck = bt.read_checkpoint(args.resume, required=("config", "state", "params", "adam.m", "adam.v"))
        bt.load_params(model, ck)
        st, conf = ck.state, ck.config
        first = int(st["step"])
        trainer.step_count = first
        trainer.schedule_steps = int(conf.get("settings", {}).get("schedule_steps", args.steps))
        if st["adam_t"] > 0:
            if args.zero:
                raise SystemExit("--resume with --zero is not supported: resume without --zero")
            set_adam_state(trainer, model, torch.from_numpy(ck.floats("adam.m").copy()).to(device),
                           torch.from_numpy(ck.floats("adam.v").copy()).to(device), st["adam_t"])
        sampler.restore({"seed": st["sampler_seed"], "epoch": st["epoch"], "pos": st["position"], "taken": st["taken"]})
    return device, ds, layout, model, trainer, sampler, first


def open_metrics(args, first):
    """Rank 0's metrics file: a resumed run keeps the lines up to the checkpoint's step (a crash may
    have left later ones, or half a line), rewritten through a temporary file, then appends, as
    `bytescale train` does."""
    os.makedirs(os.path.dirname(os.path.abspath(args.metrics)), exist_ok=True)
    if args.resume and os.path.exists(args.metrics):
        keep = []
        with open(args.metrics) as f:
            for line in f:
                try:
                    if json.loads(line)["step"] <= first:
                        keep.append(line if line.endswith("\n") else line + "\n")
                except (ValueError, KeyError, TypeError):
                    pass
        tmp = args.metrics + ".tmp"
        with open(tmp, "w") as f:
            f.writelines(keep)
        os.replace(tmp, args.metrics)
    return open(args.metrics, "a" if args.resume else "w", buffering=1)


def record(rank, world, step, plan, res, trainer, seconds, plan_s):
    """Every rank's share of the step (one all_gather_object); rank 0 gets the JSON record."""
    mine = {"rank": rank, "compute": res.compute, "wait": res.wait, "sync": res.sync, "items": res.items,
            "rings": res.rings, "tokens": res.tokens, "tokens_per_s": res.tokens / seconds,
            "ring_bytes": trainer.ring_stats.bytes_sent}
    ranks = [None] * world
    dist.all_gather_object(ranks, mine) if world > 1 else ranks.__setitem__(0, mine)
    return {"step": step, "loss": res.loss if math.isfinite(res.loss) else None, "lr": res.lr,
            "grad_norm": res.grad_norm, "clip_scale": res.clip_scale, "tokens": plan.n_tokens,
            "targets": plan.labelled, "seqs": len(plan.seq_len), "longest": max(plan.seq_len),
            "items": res.items, "plan_items": len(plan.items), "plan_rings": plan.n_rings,
            "est_seconds": plan.makespan, "seconds": seconds, "tokens_per_s": plan.n_tokens / seconds,
            "plan_seconds": plan_s, "ranks": ranks}


def train(rank, world, args):
    device, ds, layout, model, trainer, sampler, first = setup(rank, world, args)
    hdp = layout.hdp if layout is not None else world
    hdp_rank = layout.hdp_rank if layout is not None else rank
    capacity = one_rank_capacity(args, hdp)
    plan_args = {"cost": args.cost} if args.cost else {"model": args.model, "hardware": "cpu", "tp": args.tp}
    metrics = open_metrics(args, first) if rank == 0 and args.metrics else None
    if rank == 0 and args.ckpt_dir:
        os.makedirs(args.ckpt_dir, exist_ok=True)
    if rank == 0:
        print(f"torch_hdp_train: model {args.model} ({model.cfg.n_params / 1e6:.2f}M parameters), data {args.data} "
              f"({ds.n_docs} documents), {world} process(es) on {dist.get_backend()} (tp {args.tp} x pp {args.pp} x "
              f"{hdp} HDP ranks), {args.tokens} tokens/step, context {args.context}, capacity {capacity}, policy "
              f"{args.policy}", file=sys.stderr, flush=True)
    progress = Progress(args.steps, first)
    written = []
    for step in range(first + 1, args.steps + 1):
        t0 = time.perf_counter()
        batch = sampler.next()  # every rank keeps the sampler's position (for checkpoints); rank 0 plans
        plan = bt.broadcast_plan(lambda: bt.plan_step(batch, ds, ranks=hdp, capacity=capacity, policy=args.policy,
                                                      pp=args.pp, **plan_args))
        plan_s = time.perf_counter() - t0
        mbs = bt.microbatches(plan, hdp_rank, ds, device=device, ring_stats=trainer.ring_stats, layout=layout)
        res = trainer.step(plan, mbs)
        rec = record(rank, world, step, plan, res, trainer, time.perf_counter() - t0, plan_s)
        if rank == 0:
            if metrics:
                metrics.write(json.dumps(rec) + "\n")
            progress.update(step, res.loss, res.lr, plan.n_tokens)
        if args.ckpt_dir and (step == args.steps or (args.ckpt_every and step % args.ckpt_every == 0)):
            path = os.path.join(args.ckpt_dir, ckpt_name(step))
            save(args, path, model, trainer, sampler, step, ds.n_docs)
            written.append(path)
            if rank == 0 and args.ckpt_keep:
                for old in written[:-args.ckpt_keep]:
                    if os.path.exists(old):
                        os.unlink(old)
                written = written[-args.ckpt_keep:]
    if metrics:
        metrics.close()


def main(argv=None):
    args = parse(argv)
    backend = args.backend or launch.default_backend()
    # before any process starts: the error once, at once
    if not os.path.isdir(args.data):
        raise SystemExit(f"torch_hdp_train: --data {args.data}: no prepared dataset there (`bytescale prepare --out "
                         f"{args.data}`, or --data DIR / BYTESCALE_DATA=DIR)")
    if args.resume:
        check_resume(args.resume)
    if "RANK" in os.environ and "WORLD_SIZE" in os.environ:  # torchrun: the environment names the rendezvous
        rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
        launch.init(rank, world, backend, timeout_s=args.timeout)
        train(rank, world, args)
        # once the job went well; after an error the process leaves without it, so its peers' waits
        # end at once (docs/torch.md, "Failures and timeouts")
        launch.finish()
    else:  # this process holds the job's store and starts the ranks (launch.spawn)
        launch.spawn(train, args.nproc, args=(args,), backend=backend, timeout_s=args.timeout)
    return 0


if __name__ == "__main__":
    sys.exit(main())
