#!/usr/bin/env python3
"""torch_user_loop.py: HDP in a training loop of one's own (docs/torch.md, "Putting HDP into an
existing training loop").

The model is written here with torch.nn, not bytescale's reference Llama: a small LLaMA-style
decoder over packed rows (no batch dimension), whose only HDP-specific line is the attention call.
The loop is a plain one with the four changes docs/torch.md lists: plan on rank 0 and broadcast,
`hdp_attention` inside `microbatch_context`, the micro-batches in the plan's order with the loss over
the global batch, gradients summed over the ranks. No dataset: the documents are made up from their
index (a repeating pattern with noise, so the loss has something to learn).

    make python                                                # .venv with the package
    .venv/bin/torchrun --nproc_per_node 2 examples/torch_user_loop.py --steps 5
    .venv/bin/torchrun --nproc_per_node 4 examples/torch_user_loop.py --steps 5 --tp 2   # tp 2 x 2 HDP ranks
    .venv/bin/python examples/torch_user_loop.py --steps 5     # one process, no launcher

Without make python, from a checkout, this script imports the package in python/ beside it, which
holds no copy of the library: then give BYTESCALE_LIB=$PWD/build/libbytescale.so.0 (docs/torch.md).
With --tp T the model's linear layers are bytescale's column- and row-parallel layers (bias, the
weights nn.Linear would draw from the same seeds, each tp rank keeping its part), the gradients are
summed over the HDP ranks, clipped by the norm of the whole model (bytescale.torch.clip_grad_norm_),
and --ckpt-dir writes TP checkpoints (bytescale.torch.save_tp: PyTorch's distributed checkpoint) that
--resume reads back, on any tp. Rank 0 prints one line per step; --dump writes the losses and (tp 1)
the final parameters (torch.save), which the tests compare between 1 and 2 or 4 processes.
"""

import argparse
import importlib.util
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
# the installed package (make python) when there is one; else, in a checkout, the package beside us
# (which then needs BYTESCALE_LIB: only pip copies the library into the package)
if importlib.util.find_spec("bytescale") is None and os.path.isdir(os.path.join(HERE, "..", "python", "bytescale")):
    sys.path.insert(0, os.path.join(HERE, "..", "python"))

import numpy as np  # noqa: E402
import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from torch import nn  # noqa: E402

import bytescale.torch as bt  # noqa: E402
from bytescale.torch import launch  # noqa: E402

VOCAB = 64


# ---- the user's model -----------------------------------------------------------------------------

def rope(x, pos, theta=10000.0):
    """Rotate pairs (2i, 2i+1) of every head of x (T, heads, hd) by pos * theta^(-2i/hd); angles in
    double from the rows' positions in their sequences (mb.pos under HDP)."""
    hd = x.shape[-1]
    freq = theta ** (-2.0 * torch.arange(hd // 2, dtype=torch.float64) / hd)
    a = pos.to(torch.float64)[:, None] * freq[None, :]
    c, s = torch.cos(a).to(x.dtype)[:, None, :], torch.sin(a).to(x.dtype)[:, None, :]
    x0, x1 = x[..., 0::2], x[..., 1::2]
    return torch.stack((x0 * c - x1 * s, x0 * s + x1 * c), dim=-1).flatten(-2)


class RMSNorm(nn.Module):
    def __init__(self, d, eps=1e-5):
        super().__init__()
        self.w, self.eps = nn.Parameter(torch.ones(d)), eps

    def forward(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.w


def linear(kind, d_in, d_out, layout, seed):
    """A linear layer with bias, initialised as nn.Linear from its own seed: plain nn.Linear in one
    tensor-parallel rank, else bytescale's column- or row-parallel layer (the same whole weights,
    each tp rank keeping its rows or columns)."""
    if layout.tp == 1:
        torch.manual_seed(seed)
        return nn.Linear(d_in, d_out)
    cls = bt.ColumnParallelLinear if kind == "column" else bt.RowParallelLinear
    return cls(d_in, d_out, layout, seed=seed)


class Block(nn.Module):
    def __init__(self, d, heads, kv_heads, d_ff, layout, seed):
        super().__init__()
        T = layout.tp
        self.h, self.g, self.hd = heads // T, kv_heads // T, d // heads  # this tp rank's heads
        self.norm1, self.norm2 = RMSNorm(d), RMSNorm(d)
        self.wq = linear("column", d, heads * self.hd, layout, seed)
        self.wk = linear("column", d, kv_heads * self.hd, layout, seed + 1)
        self.wv = linear("column", d, kv_heads * self.hd, layout, seed + 2)
        self.wo = linear("row", heads * self.hd, d, layout, seed + 3)
        self.gate = linear("column", d, d_ff, layout, seed + 4)
        self.up = linear("column", d, d_ff, layout, seed + 5)
        self.down = linear("row", d_ff, d, layout, seed + 6)

    def forward(self, x, pos):  # x (T, d), pos (T,)
        T = x.shape[0]
        n = self.norm1(x)
        q = rope(self.wq(n).view(T, self.h, self.hd), pos)
        k = rope(self.wk(n).view(T, self.g, self.hd), pos)
        v = self.wv(n).view(T, self.g, self.hd)
        # before HDP this was the model's own causal attention of one sequence; now the micro-batch's
        att = bt.hdp_attention(q, k, v)  # (T, heads here, hd): a pack's segments, or this rank's part of a ring
        x = x + self.wo(att.reshape(T, -1))
        n = self.norm2(x)
        return x + self.down(F.silu(self.gate(n)) * self.up(n))


class TinyLM(nn.Module):
    def __init__(self, layout, seed, d=32, layers=2, heads=4, kv_heads=2, d_ff=64):
        super().__init__()
        torch.manual_seed(seed)
        self.emb = nn.Embedding(VOCAB, d)
        self.blocks = nn.ModuleList(Block(d, heads, kv_heads, d_ff, layout, seed + 10 * (i + 1))
                                    for i in range(layers))
        self.norm = RMSNorm(d)
        torch.manual_seed(seed + 1)
        self.head = nn.Linear(d, VOCAB, bias=False)

    def forward(self, tokens, pos):  # (T,) -> logits (T, VOCAB)
        x = self.emb(tokens)
        for b in self.blocks:
            x = b(x, pos)
        return self.head(self.norm(x))


# ---- made-up documents ----------------------------------------------------------------------------

def doc_length(doc):
    """Mostly short documents, every 7th a long one (rings when the capacity is below it)."""
    return 600 + 37 * (doc % 5) if doc % 7 == 3 else 20 + (doc * 53) % 180


def read(doc, start, n):
    """Tokens [start, start + n) of document `doc` (fewer at its end): a pattern with 1 in 8 noisy."""
    end = min(doc_length(doc), start + n)
    i = np.arange(start, end)
    noise = np.random.default_rng(doc).integers(0, VOCAB, doc_length(doc))[start:end]
    return np.where(i % 8 == 7, noise, (doc + 3 * i) % VOCAB)


def draw_batch(step, tokens):
    """The global batch of a step: documents in a seeded order until `tokens` are taken."""
    rng = np.random.default_rng(1000 + step)
    docs, total = [], 0
    for d in rng.permutation(400):
        if total >= tokens:
            break
        docs.append(int(d))
        total += doc_length(int(d))
    return bt.Batch(docs, [0] * len(docs), [doc_length(d) for d in docs])


# ---- the loop -------------------------------------------------------------------------------------

def say(line):
    """One line in one write: the ranks share the terminal (or torchrun's pipe), and print's two
    writes (text, then newline) can interleave with another rank's."""
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


def hdp_sum(t, layout):
    """Sum a number over the HDP ranks (the tp ranks of one HDP rank hold the same loss)."""
    if layout.hdp > 1:
        dist.all_reduce(t, group=layout.hdp_group)
    return t


def train(rank, world, args):
    dtype = getattr(torch, args.dtype)
    layout = bt.Layout(tp=args.tp)  # world = tp x hdp; the plan's ranks are the HDP ranks
    model = TinyLM(layout, args.seed).to(dtype)  # the same initial weights on every rank
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.0)
    source = bt.FunctionSource(read, doc_length)
    first = 0
    if args.resume:  # the TP checkpoint of an earlier run: every process reads its shards
        first = bt.load_tp(args.resume, model, opt)["step"]
    losses, n_mb, n_rows = [], 0, 0
    for step in range(first + 1, args.steps + 1):
        # 1. plan on rank 0, broadcast (a planning error reaches every rank)
        plan = bt.broadcast_plan(lambda: bt.plan_step(draw_batch(step, args.tokens), source, ranks=layout.hdp,
                                                      capacity=args.capacity, policy=args.policy))
        # 2 and 3. this rank's micro-batches in the plan's order, the loss over the global batch
        opt.zero_grad(set_to_none=False)  # zeros, not None: a rank may run no micro-batch at all
        total = torch.zeros((), dtype=torch.float64)
        for mb in bt.microbatches(plan, layout.hdp_rank, source, layout=layout):
            with bt.microbatch_context(mb):
                logits = model(mb.tokens, mb.pos)
            loss = F.cross_entropy(logits, mb.targets, ignore_index=-1, reduction="sum") / plan.labelled
            loss.backward()
            total += loss.detach().double()
            n_mb, n_rows = n_mb + 1, n_rows + len(mb.tokens)
        # 4. gradients summed over the HDP ranks (no division by their number; a rank that ran no
        # micro-batch joins with zeros), clipped by the norm of the whole model, then the optimizer
        bt.all_reduce_gradients(model, layout=layout)
        if args.clip > 0:
            bt.clip_grad_norm_(model.parameters(), args.clip, layout=layout)
        opt.step()
        losses.append(float(hdp_sum(total, layout)))
        if rank == 0:
            say(f"step {step}  loss {losses[-1]:.6f}  ranks {world} (tp {layout.tp} x hdp {layout.hdp})  items "
                f"{len(plan.items)}  rings {plan.n_rings}  tokens {plan.n_tokens}")
        if args.ckpt_dir and args.ckpt_every and (step % args.ckpt_every == 0 or step == args.steps):
            bt.save_tp(os.path.join(args.ckpt_dir, f"step-{step}"), model, opt, extra={"step": step})
    say(f"rank {rank}/{world} done: {n_mb} micro-batches, {n_rows} rows in {args.steps - first} steps")
    if rank == 0 and args.dump:
        params = {k: v.detach().clone() for k, v in model.state_dict().items()} if layout.tp == 1 else None
        torch.save({"losses": losses, "params": params}, args.dump)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--tokens", type=int, default=2048, help="tokens per step (default 2048)")
    ap.add_argument("--capacity", type=int, default=0,
                    help="tokens a rank holds in a micro-batch (default: 512 on 2 or more HDP ranks, so the "
                         "long documents run as rings; 1024 on one)")
    ap.add_argument("--policy", default="balance")
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--clip", type=float, default=1.0, help="gradient norm limit, 0 = none (default 1)")
    ap.add_argument("--tp", type=int, default=1, help="tensor parallelism: processes per HDP rank (default 1)")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--dtype", default="float32", choices=("float32", "float64"))
    ap.add_argument("--ckpt-dir", default=None, help="TP checkpoints DIR/step-<step> (bytescale.torch.save_tp)")
    ap.add_argument("--ckpt-every", type=int, default=0, help="a checkpoint every N steps and at the end")
    ap.add_argument("--resume", default=None, help="continue from a checkpoint DIR/step-<step> of this script")
    ap.add_argument("--dump", default=None, help="torch.save the losses and final parameters here (rank 0)")
    args = ap.parse_args()
    if "RANK" in os.environ and "WORLD_SIZE" in os.environ:  # torchrun: the environment names the rendezvous
        rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
        launch.init(rank, world)
    else:
        rank, world = 0, 1
        launch.init(0, 1, port=launch.free_port())
    if args.tp < 1 or world % args.tp:
        raise SystemExit(f"--tp {args.tp}: it must divide the {world} processes (tp x HDP ranks)")
    args.capacity = args.capacity or (512 if world // args.tp > 1 else 1024)
    train(rank, world, args)
    # every rank, once the job went well: a process that leaves with its process group may abort at
    # exit (docs/torch.md, "Failures and timeouts"); after an error it leaves without, so its peers'
    # waits end at once
    launch.finish()
    return 0


if __name__ == "__main__":
    sys.exit(main())
