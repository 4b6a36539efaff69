#!/usr/bin/env python3
"""torch_hf_train.py: a Hugging Face causal LM (Llama, Qwen2 or Mistral) trained under HDP
(docs/torch-hf.md).

The model is transformers' own, made from a small fixed config (2 layers, hidden 64, 4 query heads,
2 K/V heads, byte vocabulary; no hub access), with attn_implementation="bytescale_hdp"
(bytescale.torch.hf.register). Each step rank 0 draws a global batch by token budget and plans it;
every rank runs its micro-batches (packs, rings, a2a or hybrid items, as planned) as one packed row
each, the loss is the sum of token cross-entropies over the batch's labelled tokens, the gradients
are summed over the ranks, then AdamW. Every --eval-every steps the same module evaluates a held-out
batch twice: as HDP micro-batches under no_grad, and plainly on rank 0 (one packed row, outside
any micro-batch); at the end rank 0 generates greedily (KV cache) from a prompt.

    .venv/bin/torchrun --nproc_per_node 2 examples/torch_hf_train.py --arch llama --steps 10
    .venv/bin/python -m torch.distributed.run --nproc_per_node 2 examples/torch_hf_train.py --arch qwen2
    .venv/bin/python examples/torch_hf_train.py --arch mistral --steps 10           # one process, HDP
    .venv/bin/python examples/torch_hf_train.py --arch llama --steps 10 --plain     # the reference

--plain is the reference: the same model, weights and batches on one process with transformers'
own "sdpa" attention and no bytescale step (each sequence its own forward). Default data: a
synthetic corpus that is the same on every run (a function of the document index, long and short
documents, so rings appear); --data DIR reads a prepared bytescale dataset (bt.Dataset, e.g.
data/go-byte). --metrics FILE: one JSON line per step (step, loss, tokens, tokens_per_s, cpu_s: the
CPU seconds of all ranks, rings, items, and eval where it ran). Without make python, from a checkout, this script imports the package
in python/ beside it, which then needs BYTESCALE_LIB=$PWD/build/libbytescale.so.0 (docs/torch.md).

The batch source (draw_batch) and the step (hdp_step / plain_step) are separate functions: a
loader, FSDP or a checkpoint goes around them without touching the other.
"""

import argparse
import importlib.util
import json
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
if importlib.util.find_spec("bytescale") is None and os.path.isdir(os.path.join(HERE, "..", "python", "bytescale")):
    sys.path.insert(0, os.path.join(HERE, "..", "python"))

import numpy as np  # noqa: E402
import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

import bytescale.torch as bt  # noqa: E402
from bytescale.torch import hf, launch  # noqa: E402

N_DOCS = 4096  # the synthetic corpus


# ---- data -------------------------------------------------------------------------------------------

def synthetic_length(doc: int) -> int:
    """Every 5th document long (300-799 tokens: rings at the default capacity), the others 16-215."""
    return 300 + (doc * 104729) % 500 if doc % 5 == 0 else 16 + (doc * 7919) % 200


def synthetic_read(doc: int, start: int, n: int) -> np.ndarray:
    """Tokens [start, start + n) of a document: a pattern of the document's own period with a little
    deterministic noise, so the model has something to learn."""
    end = min(synthetic_length(doc), start + n)
    i = np.arange(start, max(start, end), dtype=np.int64)
    period = 3 + doc % 11
    return ((doc % 13) * 17 + (i % period) * (1 + doc % 5) + ((i * i + doc) % 7 == 0) * 101) % 256


def make_source(args):
    """The token source and its document count: --data's prepared dataset, or the synthetic corpus."""
    if args.data:
        ds = bt.Dataset(args.data)
        return ds, ds.n_docs
    return bt.FunctionSource(synthetic_read, synthetic_length), N_DOCS


def draw_batch(step: int, seed: int, source, n_docs: int, tokens: int, context: int) -> bt.Batch:
    """The global batch of `step`: documents drawn with a generator of (seed, step) until `tokens`,
    each from its start, cut at `context` tokens. The same on every rank and in --plain (it does not
    depend on the world); step -1 is the held-out eval batch."""
    rng = np.random.default_rng([seed, step + 1])
    docs, lengths, total = [], [], 0
    while total < tokens:
        d = int(rng.integers(0, n_docs))
        n = min(int(source.doc_length(d)), context, tokens - total)
        if n < 1:
            continue
        docs.append(d), lengths.append(n)
        total += n
    return bt.Batch(docs, [0] * len(docs), lengths)


def sequences(batch: bt.Batch, source):
    """(tokens, targets) of each sequence: targets the document's next token, -1 past its end."""
    out = []
    for doc, start, n in zip(batch.docs, batch.starts, batch.lengths):
        ids = np.asarray(source.read(doc, start, n + 1), np.int64)
        tgt = np.full(n, -1, np.int64)
        tgt[:len(ids) - 1] = ids[1:n + 1]
        out.append((torch.from_numpy(ids[:n].copy()), torch.from_numpy(tgt)))
    return out


# ---- the steps ------------------------------------------------------------------------------------------

def hdp_step(model, opt, plan, rank, source) -> float:
    """One HDP step: this rank's micro-batches in the plan's order, the loss over the global batch,
    the gradients summed over the ranks, AdamW. Returns the batch's mean token loss (every rank)."""
    opt.zero_grad(set_to_none=True)
    total = torch.zeros((), dtype=torch.float64)
    for mb in bt.microbatches(plan, rank, source):
        with bt.microbatch_context(mb):
            logits = hf.logits(model, mb)
        loss = hf.loss_sum(logits, mb.targets) / plan.labelled
        loss.backward()
        total += loss.detach().double()
    bt.all_reduce_gradients(model)
    opt.step()
    dist.all_reduce(total)
    return float(total)


def plain_step(model, opt, batch, source) -> float:
    """The reference step: each sequence its own forward (position_ids from 0), the same loss."""
    seqs = sequences(batch, source)
    labelled = sum(int((t >= 0).sum()) for _, t in seqs)
    opt.zero_grad(set_to_none=True)
    total = 0.0
    for s, t in seqs:
        loss = hf.loss_sum(model(input_ids=s[None], use_cache=False).logits, t) / labelled
        loss.backward()
        total += float(loss.detach())
    opt.step()
    return total


def hdp_eval(model, plan, rank, source) -> float:
    """The eval loss of the plan's batch as HDP micro-batches, no gradients (every rank)."""
    total = torch.zeros((), dtype=torch.float64)
    with torch.no_grad():
        for mb in bt.microbatches(plan, rank, source):
            with bt.microbatch_context(mb):
                total += hf.loss_sum(hf.logits(model, mb), mb.targets).double()
    dist.all_reduce(total)
    return float(total) / plan.labelled


def plain_eval(model, batch, source) -> float:
    """The eval loss of the batch on this process, outside any micro-batch: one packed row, positions
    restarting at each document (use_cache=False: transformers finds packed documents only without a
    cache)."""
    seqs = sequences(batch, source)
    ids = torch.cat([s for s, _ in seqs])[None]
    pos = torch.cat([torch.arange(len(s)) for s, _ in seqs])[None]
    with torch.no_grad():
        logits = model(input_ids=ids, position_ids=pos, use_cache=False).logits
    return float(hf.loss_sum(logits, torch.cat([t for _, t in seqs])).double()) / sum(int((t >= 0).sum())
                                                                                    for _, t in seqs)


# ---- the run --------------------------------------------------------------------------------------------

def say(line):
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


def write_metrics(path, rows):
    """The whole file under a temporary name, then renamed: never half-written."""
    tmp = f"{path}.tmp"
    with open(tmp, "w") as f:
        f.writelines(json.dumps(r) + "\n" for r in rows)
    os.replace(tmp, path)


def evaluate(model, args, rank, world, source, n_docs):
    """The held-out batch's loss: HDP micro-batches and (rank 0) the plain forward of the same module;
    in --plain the plain one only."""
    batch = draw_batch(-1, args.seed, source, n_docs, args.tokens // 2, args.context)
    model.eval()
    if args.plain:
        out = {"eval": plain_eval(model, batch, source)}
    else:
        plan = bt.broadcast_plan(lambda: bt.plan_step(batch, source, ranks=world, capacity=args.capacity,
                                                      policy=args.policy))
        out = {"eval": hdp_eval(model, plan, rank, source)}
        if rank == 0:
            out["eval_plain"] = plain_eval(model, batch, source)
    model.train()
    return out


def train(rank, world, args):
    source, n_docs = make_source(args)
    vocab = max(256, int(getattr(source, "vocab", 256)))
    model = hf.small_model(args.arch, attn_implementation="sdpa" if args.plain else hf.NAME, seed=args.seed,
                           vocab_size=vocab)
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr)
    rows = []
    for step in range(1, args.steps + 1):
        batch = draw_batch(step, args.seed, source, n_docs, args.tokens, args.context)
        t0, c0 = time.perf_counter(), time.process_time()
        if args.plain:
            loss, rings, items = plain_step(model, opt, batch, source), 0, len(batch.docs)
        else:
            plan = bt.broadcast_plan(lambda: bt.plan_step(batch, source, ranks=world, capacity=args.capacity,
                                                          policy=args.policy))
            loss, rings, items = hdp_step(model, opt, plan, rank, source), plan.n_rings, len(plan.items)
        dt = time.perf_counter() - t0
        cpu = torch.tensor(time.process_time() - c0, dtype=torch.float64)
        dist.all_reduce(cpu)  # the CPU seconds of every rank: steadier than wall time on a shared machine
        row = {"step": step, "loss": loss, "tokens": int(sum(batch.lengths)), "tokens_per_s": sum(batch.lengths) / dt,
               "cpu_s": float(cpu), "rings": rings, "items": items}
        if args.eval_every and (step % args.eval_every == 0 or step == args.steps):
            row.update(evaluate(model, args, rank, world, source, n_docs))
        rows.append(row)
        if rank == 0:
            ev = "".join(f"  {k} {row[k]:.6f}" for k in ("eval", "eval_plain") if k in row)
            say(f"step {step}  loss {loss:.6f}  {row['tokens_per_s']:,.0f} tokens/s  items {items}  rings {rings}{ev}")
            if args.metrics:
                write_metrics(args.metrics, rows)
    if rank == 0 and args.gen_tokens:
        model.eval()
        prompt = torch.as_tensor(source.read(0, 0, 8), dtype=torch.int64)[None]
        out = model.generate(prompt, max_new_tokens=args.gen_tokens, do_sample=False, pad_token_id=0)
        say(f"greedy from {prompt[0].tolist()}: {out[0, prompt.shape[1]:].tolist()}")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--arch", default="llama", choices=hf.ARCHS)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--tokens", type=int, default=2048, help="tokens per step (default 2048)")
    ap.add_argument("--context", type=int, default=512, help="longest sequence, tokens (default 512)")
    ap.add_argument("--capacity", type=int, default=0,
                    help="tokens a rank holds in a micro-batch (default: half the context on 2 or more processes, "
                         "so the long documents run as rings of 2; the context on one)")
    ap.add_argument("--policy", default="balance")
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--data", default=None, help="a prepared bytescale dataset (default: the synthetic corpus)")
    ap.add_argument("--metrics", default=None, help="one JSON line per step (rank 0)")
    ap.add_argument("--plain", action="store_true", help="the reference: one process, transformers' sdpa, no HDP")
    ap.add_argument("--eval-every", type=int, default=5, help="an eval every N steps and at the end (0: none)")
    ap.add_argument("--gen-tokens", type=int, default=16, help="tokens of the greedy generation at the end")
    args = ap.parse_args()
    if "RANK" in os.environ and "WORLD_SIZE" in os.environ:  # torchrun: the environment names the rendezvous
        rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
        launch.init(rank, world)
    else:
        rank, world = 0, 1
        launch.init(0, 1, port=launch.free_port())
    args.capacity = args.capacity or (args.context if world == 1 else -(-args.context // 2))
    if args.plain and world != 1:
        raise SystemExit("--plain is the one-process reference: run it without torchrun (or on 1 process)")
    train(rank, world, args)
    launch.finish()  # every rank, once the job went well (docs/torch.md, "Failures and timeouts")
    return 0


if __name__ == "__main__":
    sys.exit(main())
