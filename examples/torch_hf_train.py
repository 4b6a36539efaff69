#!/usr/bin/env python3
"""torch_hf_train.py: a Hugging Face causal LM (Llama, Qwen2 or Mistral) trained under HDP, with the
rest of a PyTorch 2 user's stack around it: a data loader, FSDP2 or ZeRO-1, distributed checkpoints,
bf16 autocast, torch.compile (docs/torch-hf.md, "The whole stack").

The model is transformers' own, made from a small fixed config (2 layers, hidden 64, 4 query heads,
2 K/V heads, byte vocabulary; no hub access), with attn_implementation="bytescale_hdp"
(bytescale.torch.hf.register). The batches come from bytescale.torch.loader.HDPLoader: each step
rank 0 draws a global batch by token budget from a seeded document order and plans it, in a thread
ahead of the step; every rank runs its micro-batches (packs, rings, a2a or hybrid items, as planned)
as one packed row each, the loss is the sum of token cross-entropies over the batch's labelled
tokens, the gradients are summed over the ranks (or reduce-scattered, under --fsdp), then AdamW.
Every --eval-every steps the same module evaluates a held-out batch twice: as HDP micro-batches
under no_grad, and plainly on rank 0 (one packed row, outside any micro-batch); at the end rank 0
generates greedily (KV cache) from a prompt.

    .venv/bin/torchrun --nproc_per_node 2 examples/torch_hf_train.py --arch llama --steps 10
    .venv/bin/torchrun --nproc_per_node 2 examples/torch_hf_train.py --fsdp --ckpt-dir ck --ckpt-every 5
    .venv/bin/torchrun --nproc_per_node 3 examples/torch_hf_train.py --fsdp --resume ck   # goes on from ck's last
    .venv/bin/torchrun --nproc_per_node 2 examples/torch_hf_train.py --zero --bf16 --compile
    .venv/bin/python examples/torch_hf_train.py --arch llama --steps 10 --plain     # the reference

--plain is the reference: the same model, weights and batches (the same loader, planned for one
rank) on one process with transformers' own "sdpa" attention and no bytescale step (each sequence
its own forward). Data: by default a synthetic corpus that is the same on every run (a map-style
torch Dataset of 1-D token tensors, a function of the document index, long and short documents so
rings appear); --data DIR a prepared bytescale dataset (e.g. data/go-byte); --jsonl FILE a local
JSONL file read through datasets (an "input_ids" column of token ids, or a "text" column, its UTF-8
bytes the tokens). --metrics FILE: one JSON line per step (step, loss, tokens, tokens_per_s, step_s,
the loader's read_s and wait_s, cpu_s: the CPU seconds of all ranks, rings, items, a fingerprint of
the batch, and eval where it ran). Without make python, from a checkout, this script imports the
package in python/ beside it, which then needs BYTESCALE_LIB=$PWD/build/libbytescale.so.0.
"""

import argparse
import contextlib
import importlib.util
import json
import os
import sys
import time
import zlib

HERE = os.path.dirname(os.path.abspath(__file__))
if importlib.util.find_spec("bytescale") is None and os.path.isdir(os.path.join(HERE, "..", "python", "bytescale")):
    sys.path.insert(0, os.path.join(HERE, "..", "python"))

import numpy as np  # noqa: E402
import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

import bytescale.torch as bt  # noqa: E402
from bytescale.torch import hf, launch  # noqa: E402
from bytescale.torch.loader import HDPLoader  # noqa: E402

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


class SyntheticCorpus(torch.utils.data.Dataset):
    """The default data, as a user's map-style Dataset: item i is document i, a 1-D tensor of token ids."""

    def __len__(self):
        return N_DOCS

    def __getitem__(self, doc):
        return torch.from_numpy(synthetic_read(doc, 0, synthetic_length(doc)))


def make_data(args, rank):
    """(data, loader keywords) for HDPLoader: the synthetic corpus, --data's prepared dataset, or --jsonl's
    file through datasets (rank 0 first: it writes the Arrow cache the other ranks then only read)."""
    if args.data:
        return bt.Dataset(args.data), {}
    if not args.jsonl:
        return SyntheticCorpus(), {"vocab": 256}
    import datasets

    for turn in (0, 1):  # rank 0 converts the file, then the others open the cache
        if (rank == 0) == (turn == 0):
            ds = datasets.load_dataset("json", data_files=args.jsonl, split="train")
        if dist.get_world_size() > 1:
            dist.barrier()
    if "input_ids" in ds.column_names:
        return ds, {"column": "input_ids", "vocab": 256}
    if "text" in ds.column_names:
        return ds, {"column": "text", "tokenizer": lambda s: list(s.encode("utf-8")), "vocab": 256}
    raise SystemExit(f"--jsonl {args.jsonl}: no 'input_ids' or 'text' column (it has {ds.column_names})")


def draw_batch(seed: int, source, n_docs: int, tokens: int, context: int) -> bt.Batch:
    """The held-out eval batch: documents drawn with a generator of (seed, 0) until `tokens`, each from
    its start, cut at `context` tokens. The same on every rank and in --plain."""
    rng = np.random.default_rng([seed, 0])
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
    """(tokens, targets) of each sequence: targets the document's next token, -1 past its end (what the
    loader's micro-batches carry, read here without it, for the plain path)."""
    out = []
    for doc, start, n in zip(batch.docs, batch.starts, batch.lengths):
        ids = np.asarray(source.read(doc, start, n + 1), np.int64)
        tgt = np.full(n, -1, np.int64)
        tgt[:len(ids) - 1] = ids[1:n + 1]
        out.append((torch.from_numpy(ids[:n].copy()), torch.from_numpy(tgt)))
    return out


def fingerprint(batch: bt.Batch) -> int:
    """CRC-32 of the batch's (document, start, length) triples: equal batches, equal fingerprints."""
    return zlib.crc32(np.asarray([batch.docs, batch.starts, batch.lengths], np.int64).tobytes())


# ---- the steps ------------------------------------------------------------------------------------------

def autocast(args):
    """bf16 autocast around a forward under --bf16 (the loss and the backward stay outside it)."""
    return torch.autocast("cpu", dtype=torch.bfloat16) if args.bf16 else contextlib.nullcontext()


def grads_context(model, args):
    """Under --fsdp every rank unshards once before its micro-batches and reduce-scatters once after
    them (bt.fsdp.step), whatever their count: FSDP's own per-micro-batch collectives would hang the
    ranks that run fewer (docs/torch-fsdp.md). Without it the gradients are summed after the step."""
    return bt.fsdp.step(model) if args.fsdp else contextlib.nullcontext()


def hdp_step(model, opt, step, args) -> float:
    """One HDP step of the loader's `step`: this rank's micro-batches in the plan's order, the loss over
    the global batch, the gradients summed over the ranks, AdamW. Returns the batch's mean token loss
    (every rank)."""
    opt.zero_grad(set_to_none=True)
    total = torch.zeros((), dtype=torch.float64)
    with grads_context(model, args):
        for mb in step:
            with bt.microbatch_context(mb), autocast(args):
                logits = hf.logits(model, mb)
            loss = hf.loss_sum(logits, mb.targets) / step.labelled
            loss.backward()
            total += loss.detach().double()
    if not args.fsdp:
        bt.all_reduce_gradients(model)  # SUM over the ranks (ZeRO-1's step then updates each rank's share)
    opt.step()
    dist.all_reduce(total)
    return float(total)


def plain_step(model, opt, batch, source, args) -> float:
    """The reference step: each sequence its own forward (position_ids from 0), the same loss."""
    seqs = sequences(batch, source)
    labelled = sum(int((t >= 0).sum()) for _, t in seqs)
    opt.zero_grad(set_to_none=True)
    total = 0.0
    for s, t in seqs:
        with autocast(args):
            logits = model(input_ids=s[None], use_cache=False).logits
        loss = hf.loss_sum(logits, t) / labelled
        loss.backward()
        total += float(loss.detach())
    opt.step()
    return total


def hdp_eval(model, plan, rank, source, args) -> float:
    """The eval loss of the plan's batch as HDP micro-batches, no gradients (every rank)."""
    total = torch.zeros((), dtype=torch.float64)
    with torch.no_grad():
        for mb in bt.microbatches(plan, rank, source):
            with bt.microbatch_context(mb), autocast(args):
                total += hf.loss_sum(hf.logits(model, mb), mb.targets).double()
    dist.all_reduce(total)
    return float(total) / plan.labelled


def plain_eval(model, batch, source, args) -> float:
    """The eval loss of the batch on this process, outside any micro-batch: one packed row, positions
    restarting at each document (use_cache=False: transformers finds packed documents only without a
    cache)."""
    seqs = sequences(batch, source)
    ids = torch.cat([s for s, _ in seqs])[None]
    pos = torch.cat([torch.arange(len(s)) for s, _ in seqs])[None]
    with torch.no_grad(), autocast(args):
        logits = model(input_ids=ids, position_ids=pos, use_cache=False).logits
    return float(hf.loss_sum(logits, torch.cat([t for _, t in seqs])).double()) / sum(int((t >= 0).sum())
                                                                                    for _, t in seqs)


def evaluate(model, opt, args, rank, world, source):
    """The held-out batch's loss: HDP micro-batches and (rank 0) the plain forward of the same module;
    in --plain the plain one only. Under --fsdp inside one bt.fsdp.step, so the parameters are whole
    for rank 0's plain forward and every rank gathers them once (its zero gradients then dropped)."""
    batch = draw_batch(args.seed, source, source.n_docs, args.tokens // 2, args.context)
    model.eval()
    if args.plain:
        out = {"eval": plain_eval(model, batch, source, args)}
    else:
        plan = bt.broadcast_plan(lambda: bt.plan_step(batch, source, ranks=world, capacity=args.capacity,
                                                      policy=args.policy))
        with grads_context(model, args):
            out = {"eval": hdp_eval(model, plan, rank, source, args)}
            if rank == 0:
                out["eval_plain"] = plain_eval(model, batch, source, args)
        opt.zero_grad(set_to_none=True)
    model.train()
    return out


def generate(model, args, rank, source):
    """Greedy decoding (KV cache) on rank 0 by the model being trained; under --fsdp inside a
    bt.fsdp.step on every rank (rank 0's forward finds the parameters whole, no collective)."""
    model.eval()
    # the compiled layers run eagerly here: each decoding step's KV cache would make a new graph
    eager = torch.compiler.set_stance("force_eager") if args.compile else contextlib.nullcontext()
    with grads_context(model, args), eager:
        if rank == 0:
            prompt = torch.as_tensor(source.read(0, 0, 8), dtype=torch.int64)[None]
            with torch.no_grad(), autocast(args):
                # synced_gpus=False: transformers would otherwise see an FSDP module and make every
                # decoding step a collective, which the other ranks (not generating) never join
                out = model.generate(prompt, max_new_tokens=args.gen_tokens, do_sample=False, pad_token_id=0,
                                     synced_gpus=False)
            say(f"greedy from {prompt[0].tolist()}: {out[0, prompt.shape[1]:].tolist()}")


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


def latest_checkpoint(path):
    """--resume's checkpoint: `path` itself when it is one (it holds bytescale-dcp.json), else the
    step-N directory in it with the largest N (what --ckpt-dir writes)."""
    if os.path.exists(os.path.join(path, "bytescale-dcp.json")) or not os.path.isdir(path):
        return path  # (a missing or foreign directory: bt.dcp.load names the problem on every rank)
    steps = [int(d[5:]) for d in os.listdir(path) if d.startswith("step-") and d[5:].isdigit()]
    return os.path.join(path, f"step-{max(steps)}") if steps else path


def build(args, rank, world):
    """The model (sharded under --fsdp, a layer-wise compile under --compile), the optimizer (ZeRO-1
    under --zero), the loader; then, under --resume, all three as the checkpoint left them. Returns
    (model, opt, loader, first step)."""
    data, kw = make_data(args, rank)
    model = hf.small_model(args.arch, attn_implementation="sdpa" if args.plain else hf.NAME, seed=args.seed,
                           vocab_size=max(256, int(kw.get("vocab") or getattr(data, "vocab", 256))))
    if args.fsdp:  # before the optimizer: it must hold the sharded parameters
        bt.fsdp.shard(model, blocks="model.layers")
    if args.compile:
        # each decoder layer on its own: its graph breaks cleanly at the attention (hdp_attention is
        # left to eager code by design), dynamic shapes since every micro-batch has its own length
        for layer in model.model.layers:
            layer.compile(dynamic=True, backend=args.compile_backend)
    if args.zero:
        opt = bt.fsdp.zero_optimizer(model, lr=args.lr, eps=1e-6)
    else:
        opt = torch.optim.AdamW(model.parameters(), lr=args.lr, eps=1e-6)  # eps: docs/torch-hf.md, "Why eps 1e-6"
    loader = HDPLoader(data, tokens=args.tokens, capacity=args.capacity, context=args.context, seed=args.seed,
                       policy=args.policy, steps=args.steps, prefetch=2, **kw)
    first = 1
    if args.resume:
        path = latest_checkpoint(args.resume)
        state = bt.dcp.load(path, model, opt, loader=loader)  # any world size: each rank reads its shards
        first = int(state["step"]) + 1
        if rank == 0:
            say(f"resumed from {path} (saved by {state['manifest']['job']['world']} processes) at step {first}")
    loader.start()  # the first steps are read while the first step's code is set up
    return model, opt, loader, first


def run_step(model, opt, loader, args, rank):
    """One step from the loader: HDP or plain; the row of metrics."""
    t0, c0 = time.perf_counter(), time.process_time()
    step = next(loader)
    t1 = time.perf_counter()
    if args.plain:
        loss, rings, items = plain_step(model, opt, step.batch, loader.source, args), 0, len(step.batch.docs)
    else:
        loss, rings, items = hdp_step(model, opt, step, args), step.plan.n_rings, len(step.plan.items)
    t2 = time.perf_counter()
    cpu = torch.tensor(time.process_time() - c0, dtype=torch.float64)
    dist.all_reduce(cpu)  # the CPU seconds of every rank: steadier than wall time on a shared machine
    tokens = int(sum(step.batch.lengths))
    return {"step": step.step + 1, "loss": loss, "tokens": tokens, "tokens_per_s": tokens / (t2 - t0),
            "step_s": t2 - t1, "read_s": step.read_s, "wait_s": step.wait_s, "cpu_s": float(cpu),
            "rings": rings, "items": items, "batch": fingerprint(step.batch)}


def train(rank, world, args):
    model, opt, loader, first = build(args, rank, world)
    rows = []
    for n in range(first, args.steps + 1):
        row = run_step(model, opt, loader, args, rank)
        assert row["step"] == n, (row["step"], n)  # the loader's step is the run's
        if args.eval_every and (n % args.eval_every == 0 or n == args.steps):
            row.update(evaluate(model, opt, args, rank, world, loader.source))
        rows.append(row)
        if args.ckpt_dir and n % args.ckpt_every == 0:
            # one atomic checkpoint: model, optimizer, step, the loader's position (every rank)
            bt.dcp.save(os.path.join(args.ckpt_dir, f"step-{n}"), model, opt, step=n, loader=loader)
        if rank == 0:
            ev = "".join(f"  {k} {row[k]:.6f}" for k in ("eval", "eval_plain") if k in row)
            say(f"step {n}  loss {row['loss']:.6f}  {row['tokens_per_s']:,.0f} tokens/s  wait {row['wait_s']:.4f} s  "
                f"items {row['items']}  rings {row['rings']}{ev}")
            if args.metrics:
                write_metrics(args.metrics, rows)
    s = loader.summary()
    # the slowest rank's figures: the largest mean read, the longest wait, the smallest share ready
    worst = torch.tensor([s["read_s"], s["wait_s"], s["wait_max_s"], -s["ready"]], dtype=torch.float64)
    dist.all_reduce(worst, op=dist.ReduceOp.MAX)
    if rank == 0:
        read, wait, wait_max, ready = worst.tolist()
        say(f"loader, slowest rank: read {read:.4f} s a step (in its thread), wait in next() {wait:.5f} s "
            f"(max {wait_max:.5f}) after the first, {-ready:.0%} of the steps ready")
        if args.compile:  # dynamo's own count: graphs made, and why it broke them (the attention, by design)
            from torch._dynamo.utils import counters
            breaks = sorted({k.split("\n")[0][:80] for k in counters["graph_break"]})
            say(f"compile: {counters['stats']['unique_graphs']} graphs, graph breaks at: {breaks}")
    loader.close()  # before launch.finish: its thread's group goes with the default group
    if args.gen_tokens:
        generate(model, args, rank, loader.source)


def parse():
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
    ap.add_argument("--jsonl", default=None, help="a JSONL file: an input_ids (token ids) or a text column")
    ap.add_argument("--metrics", default=None, help="one JSON line per step (rank 0)")
    ap.add_argument("--plain", action="store_true", help="the reference: one process, transformers' sdpa, no HDP")
    ap.add_argument("--fsdp", action="store_true", help="FSDP2 over the HDP ranks, model.model.layers as units")
    ap.add_argument("--zero", action="store_true", help="ZeRO-1: AdamW's state sharded over the ranks")
    ap.add_argument("--bf16", action="store_true", help="forwards under bf16 autocast (parameters stay fp32)")
    ap.add_argument("--compile", action="store_true", help="torch.compile each decoder layer (dynamic shapes)")
    ap.add_argument("--compile-backend", default="inductor",
                    help="torch.compile's backend (aot_eager: dynamo and AOTAutograd without code generation)")
    ap.add_argument("--ckpt-dir", default=None, help="write DIR/step-N, a bt.dcp checkpoint, every --ckpt-every")
    ap.add_argument("--ckpt-every", type=int, default=0)
    ap.add_argument("--resume", default=None, help="a checkpoint, or a --ckpt-dir (its last step-N)")
    ap.add_argument("--eval-every", type=int, default=5, help="an eval every N steps and at the end (0: none)")
    ap.add_argument("--gen-tokens", type=int, default=16, help="tokens of the greedy generation at the end")
    args = ap.parse_args()
    # what cannot combine, refused on every rank before any process group (each rank parses the same argv)
    if args.fsdp and args.zero:
        ap.error("--fsdp and --zero: FSDP2 shards the optimizer state already; pick one")
    if args.plain and (args.fsdp or args.zero):
        ap.error("--plain is one process without HDP: nothing to shard (drop --fsdp / --zero)")
    if bool(args.ckpt_dir) != (args.ckpt_every > 0):
        ap.error("--ckpt-dir DIR and --ckpt-every N go together (N >= 1)")
    if args.data and args.jsonl:
        ap.error("--data and --jsonl: one data source")
    return args


def main():
    args = parse()
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
