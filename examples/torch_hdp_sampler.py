#!/usr/bin/env python3
"""torch_hdp_sampler.py: Hybrid Data Parallelism in a PyTorch data loader.

Every step, rank 0 draws a global batch of documents, plans it with bytescale (one call into the C
planner), and sends each torch.distributed rank exactly its share: the micro-batches (the plan's
items) it belongs to, in the global order, each as token ranges (document, start, length) of whole
short documents packed on one rank or of the two chunks of a long document a ring of ranks shares
(the symmetric 2D-chunk layout). Each rank then runs its micro-batches in that order; a ring's
members exchange a message at their ring's turn, as ring attention would, and because every rank
walks the same global order no two ranks can wait for each other in a cycle.

The training step here only gathers the tokens: the point is the data path. At the end of every
step the ranks check that each token of the global batch was trained exactly once across all of
them (ring chunks included) and that the token values they assembled sum to the batch's.

    .venv/bin/python examples/torch_hdp_sampler.py     # 2 processes, gloo, CPU (torch.multiprocessing)
    .venv/bin/torchrun --nproc_per_node 2 examples/torch_hdp_sampler.py

Needs PyTorch 2 and the bytescale package: the project's environment after `make python` has both
(docs/python.md, "The environment"); from a checkout without it, put
PYTHONPATH=$PWD/python BYTESCALE_LIB=$PWD/build/libbytescale.so.0 in front.
"""

import argparse
import os
import socket
import sys

import numpy as np
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

import bytescale

VOCAB = 32000


def doc_tokens(doc, start, length):
    """Tokens [start, start + length) of document `doc` of a synthetic corpus: a fixed function of
    (document, position), so any rank can check any token."""
    pos = torch.arange(start, start + length, dtype=torch.int64)
    return (doc * 1000003 + pos * 7919) % VOCAB


class HDPSampler:
    """Each step: this rank's micro-batches, in the global order, as planned by bytescale.

    Rank 0 samples the step's documents (ids and lengths of a long-tailed corpus) and plans them;
    every rank receives the batch's document list and its own micro-batches:
        [(item, ring_ranks, [(doc, start, length), ...]), ...]
    A micro-batch on one rank holds whole documents (a pack); on a ring of D ranks, this rank's
    two chunks of the long document (one range when they touch).
    """

    def __init__(self, capacity, tokens_per_step, context, policy="balance", seed=0, **cost_args):
        self.capacity, self.tokens, self.context, self.policy = capacity, tokens_per_step, context, policy
        self.cost_args = cost_args
        self.rank, self.world = dist.get_rank(), dist.get_world_size()
        self.rng = np.random.default_rng(seed)
        self.next_doc = 0

    def _sample_docs(self):
        """Document lengths until the step's token budget: mostly short, a few longer than a rank holds."""
        lengths = []
        while sum(lengths) < self.tokens:
            if self.rng.random() < 0.05:
                n = int(self.rng.integers(self.capacity, self.context + 1))
            else:
                n = int(min(self.rng.lognormal(6.0, 1.0), self.capacity)) + 1
            lengths.append(min(n, self.tokens - sum(lengths)))
        ids = np.arange(self.next_doc, self.next_doc + len(lengths))
        self.next_doc += len(lengths)
        return ids, np.array(lengths, dtype=np.int64)

    def _plan_step(self):
        """On rank 0: the step's documents and every rank's micro-batches."""
        ids, lengths = self._sample_docs()
        plan = bytescale.plan(lengths, ranks=self.world, capacity=self.capacity, context=self.context,
                              policy=self.policy, **self.cost_args)
        shares = []
        for r in range(self.world):
            c = plan.chunk_arrays(r)  # c.id indexes `lengths`: the caller's sequence order
            micro = {}
            for item, doc_index, start, n in zip(c.item.tolist(), c.id.tolist(), c.id_start.tolist(), c.len.tolist()):
                micro.setdefault(item, []).append((int(ids[doc_index]), start, n))
            members = plan.members
            shares.append([(item, members[plan.item_rank_begin[item]:plan.item_rank_begin[item] +
                                          plan.item_n_ranks[item]].tolist(), ranges)
                           for item, ranges in micro.items()])  # dicts keep the global order
        summary = {"sequences": len(lengths), "tokens": int(lengths.sum()), "items": plan.n_items,
                   "rings": [it.ranks for it in plan.items if len(it.ranks) > 1],
                   "makespan": plan.makespan}
        return (ids.tolist(), lengths.tolist(), summary), shares

    def __iter__(self):
        while True:
            batch, shares = self._plan_step() if self.rank == 0 else (None, None)
            box = [batch]
            dist.broadcast_object_list(box, src=0)  # the document list: every rank checks coverage
            mine = [None]
            dist.scatter_object_list(mine, shares, src=0)  # each rank only its own micro-batches
            yield box[0], mine[0]


def ring_turn(item, ring, rank, n_tokens):
    """A ring's members meet at its turn: pass this member's token count to the next member and
    receive the previous one's (what ring attention's first K/V step does, in miniature)."""
    i = ring.index(rank)
    send = torch.tensor([n_tokens, item], dtype=torch.int64)
    recv = torch.zeros(2, dtype=torch.int64)
    req = dist.isend(send, dst=ring[(i + 1) % len(ring)])
    dist.recv(recv, src=ring[(i - 1) % len(ring)])
    req.wait()
    if int(recv[1]) != item:
        raise RuntimeError(f"rank {rank}: ring of item {item} met item {int(recv[1])}: the global order broke")


def train(rank, world, port, args):
    if port is not None:  # started by torch.multiprocessing; torchrun sets these itself
        os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    torch.set_num_threads(1)
    sampler = HDPSampler(capacity=args.capacity, tokens_per_step=args.tokens, context=args.context,
                         policy=args.policy, seed=args.seed, model="tiny", hardware="cpu", tp=1)
    for step, ((ids, lengths, summary), micro) in enumerate(sampler, 1):
        # where each document's tokens sit in the global batch, for the coverage count
        offset = dict(zip(ids, np.cumsum([0] + lengths[:-1]).tolist()))
        covered = torch.zeros(sum(lengths), dtype=torch.int32)
        checksum = torch.zeros(1, dtype=torch.int64)
        last = -1
        for item, ring, ranges in micro:
            if item <= last:
                raise RuntimeError(f"rank {rank}: item {item} after item {last}: not the global order")
            last = item
            if len(ring) > 1:
                ring_turn(item, ring, rank, sum(n for _, _, n in ranges))
            # the micro-batch as a model would take it: tokens, their positions in their documents
            # (RoPE, causal mask) and the boundaries between documents
            tokens = torch.cat([doc_tokens(d, s, n) for d, s, n in ranges])
            positions = torch.cat([torch.arange(s, s + n) for d, s, n in ranges])
            assert tokens.numel() == positions.numel()
            checksum += tokens.sum()
            for d, s, n in ranges:
                covered[offset[d] + s:offset[d] + s + n] += 1
        dist.all_reduce(covered)
        dist.all_reduce(checksum)
        expected = sum(int(doc_tokens(d, 0, n).sum()) for d, n in zip(ids, lengths))
        trained = torch.tensor([sum(n for _, _, ranges in micro for _, _, n in ranges), len(micro)])
        per_rank = [torch.zeros(2, dtype=torch.int64) for _ in range(world)]
        dist.all_gather(per_rank, trained)
        if rank == 0:
            ok = bool((covered == 1).all()) and int(checksum) == expected
            print(f"step {step}: {summary['sequences']} sequences, {summary['tokens']} tokens, {summary['items']} "
                  f"micro-batches, rings {summary['rings']}, planned makespan {summary['makespan']:.3g} s; "
                  + "; ".join(f"rank {r}: {int(t[1])} micro-batches, {int(t[0])} tokens"
                              for r, t in enumerate(per_rank))
                  + ("; every token trained once" if ok else ""), flush=True)
        if not bool((covered == 1).all()):
            bad = torch.nonzero(covered != 1).flatten()
            raise RuntimeError(f"step {step}: {bad.numel()} tokens trained {covered[bad[0]].item()} times "
                               f"(first: batch token {bad[0].item()})")
        if int(checksum) != expected:
            raise RuntimeError(f"step {step}: token checksum {int(checksum)}, expected {expected}")
        if step == args.steps:
            break
    dist.barrier()
    dist.destroy_process_group()


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--ranks", type=int, default=2, help="processes when not under torchrun (default 2)")
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--capacity", type=int, default=4096, help="tokens per rank per micro-batch (default 4096)")
    ap.add_argument("--context", type=int, default=8192, help="longest document (default 8192)")
    ap.add_argument("--tokens", type=int, default=32768, help="tokens per global batch (default 32768)")
    ap.add_argument("--policy", default="balance")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")  # one machine: the loopback interface
    if "RANK" in os.environ and "WORLD_SIZE" in os.environ:  # torchrun
        train(int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"]), None, args)
    else:
        # forkserver: the ranks fork from one process that imported torch once (a spawned rank is a
        # fresh interpreter, seconds of torch's import each)
        mp.set_forkserver_preload(["torch", "torch.distributed", "bytescale"])
        mp.start_processes(train, args=(args.ranks, free_port(), args), nprocs=args.ranks, join=True,
                           start_method="forkserver")
    return 0


if __name__ == "__main__":
    sys.exit(main())
