"""No deadlock: 200 random plans (every policy, random batches with rings of every size beside packs;
a third of the multi-rank items turned into a2a items and, on 4 ranks, a third into hybrids of 2
groups of 2) run on 4 processes, every rank walking its items in the global order with ring or
Ulysses attention (forward and backward) on one process group and no barrier, then a gradient
all-reduce. A deadlock would
hang until gloo's timeout, which fails the test; every token must be trained exactly once."""

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import bytescale.torch as bt  # noqa: E402
from bytescale.torch import launch  # noqa: E402

PLANS = 200
CAPACITY = 32


def worker(rank, world, n_plans):
    rng = np.random.default_rng(1234)  # the same stream on every rank; only rank 0 uses the plan from it
    policies = ("static", "naive", "balance", "elastic")
    done, rings, sizes, kinds = 0, 0, set(), set()
    for i in range(n_plans):
        n = int(rng.integers(2, 16))
        lengths = rng.integers(1, CAPACITY, n)
        longs = rng.integers(CAPACITY + 1, world * CAPACITY + 1, n)
        lengths = np.where(rng.random(n) < 0.3, longs, lengths)
        policy = policies[i % 4]
        plan = None
        if rank == 0:
            src = bt.FunctionSource(lambda d, s, k: np.zeros(0), lambda d: 1 << 30)
            plan = bt.plan_step(bt.Batch(list(range(n)), [0] * n, lengths.tolist()), src, ranks=world,
                                capacity=CAPACITY, policy=policy)
            pick = np.random.default_rng(i).random(len(plan.items))  # ring, a2a or hybrid
            plan.ulysses = [0 if len(r) < 2 or p < 1 / 3 else len(r) if p < 2 / 3 or len(r) != 4 else 2
                            for (r, _), p in zip(plan.items, pick)]
        plan = bt.broadcast_plan(plan)
        covered = torch.zeros(int(sum(plan.seq_len)), dtype=torch.int64)
        first = np.concatenate([[0], np.cumsum(plan.seq_len)])
        g = torch.Generator().manual_seed(i * 10 + rank)
        for k in plan.schedule(rank):
            ranks, segs = plan.items[k]
            m = ranks.index(rank)
            pos, seg = plan.member_rows(k, m)
            seqs = np.array([segs[j][0] for j in seg], dtype=np.int64)
            np.add.at(covered.numpy(), first[seqs] + pos, 1)
            T = len(pos)
            q = torch.randn(T, 4, 4, generator=g, requires_grad=True)
            kv = torch.randn(T, 2, 4, generator=g, requires_grad=True)
            u = plan.item_ulysses(k)
            if len(ranks) > 1:
                rows = [bt.Rows(*map(torch.from_numpy, plan.member_rows(k, j))) for j in range(len(ranks))]
                if u:
                    out = bt.ulysses_attention(q, kv, kv, bt.Ulysses(ranks, m, rows, u))
                else:
                    out = bt.ring_attention(q, kv, kv, bt.Ring(ranks, m, rows))
                rings += 1
                sizes.add(len(ranks))
                kinds.add("ring" if not u else "a2a" if u == len(ranks) else "hybrid")
            else:
                out = bt.local_attention(q, kv, kv, torch.from_numpy(pos), torch.from_numpy(seg))
            out.sum().backward()
        torch.distributed.all_reduce(covered)  # the gradient sync's place in the step
        if not bool((covered == 1).all()):
            raise RuntimeError(f"plan {i}: tokens trained {covered.min().item()}..{covered.max().item()} times")
        done += 1
    return done, rings, sorted(sizes), kinds


def test_random_plans_finish_on_4_processes():
    results = launch.spawn(worker, 4, args=(PLANS,), timeout_s=120)
    assert all(r[0] == PLANS for r in results)
    sizes = set().union(*(r[2] for r in results))
    assert {2, 3, 4} <= sizes, f"ring sizes seen: {sorted(sizes)}"
    kinds = set().union(*(r[3] for r in results))
    assert kinds == {"ring", "a2a", "hybrid"}, kinds
