"""Plan checks: before a step sends anything, every rank checks that all ranks run the same plan and
that the plan fits the world (docs/torch.md, "Plan checks").

    check_plan(plan, rank)              # every rank, every step; microbatches() calls it for you

A rank that runs another plan than its peers would wait in a ring or all-to-all message nobody sends,
or meet a gradient all-reduce of another size (gloo aborts the process); a plan for more ranks than
the world names ranks that do not exist; a plan for fewer leaves ranks idle while their share of the
batch is never trained. So each rank puts a few integers (its rank, the plan's rank count, the rank
count it expects, a 64-bit fingerprint of the plan, the plan's items and tokens) into one all_gather
on the default group, and every rank judges the same gathered table the same way: all pass, or all
raise the same PlanCheckError naming the ranks that disagree and what differs. No rank raises before
the collective, so no rank is left waiting for one that has.
"""

from __future__ import annotations

import hashlib
from typing import List, Optional

import numpy as np
import torch
import torch.distributed as dist

# one row per rank: what each rank says about its plan and itself
_FIELDS = ("rank", "n_ranks", "expected", "fingerprint", "items", "tokens")


class PlanCheckError(RuntimeError):
    """The ranks do not run the same plan, or the plan does not fit the world. Raised on every rank with
    the same message."""


def plan_fingerprint(plan) -> int:
    """A 64-bit fingerprint (BLAKE2b) of everything a step executes from the plan: the rank count, the
    planned sequences (documents, starts, lengths), the items (ranks in order, segments) in the
    global order, each item's Ulysses group size and the labelled-token count. The same plan gives the
    same number in every process (no per-process hash seed); returned as a signed int64."""
    # one int64 stream; every variable-length part follows its length, so two plans give the same
    # stream only if they are the same plan
    words = [plan.n_ranks, plan.labelled, len(plan.seq_len), len(plan.items)]
    words += plan.seq_doc
    words += plan.seq_start
    words += plan.seq_len
    for k, (ranks, segs) in enumerate(plan.items):
        words += [len(ranks), *ranks, plan.item_ulysses(k), len(segs)]
        for seg in segs:
            words += seg
    h = hashlib.blake2b(np.asarray(words, dtype="<i8").tobytes(), digest_size=8)
    return int(np.frombuffer(h.digest(), dtype="<i8")[0])


def _device():
    """Where the default group's collectives take their tensors (NCCL: this rank's GPU)."""
    if dist.get_backend() == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def _gather(row: List[int]) -> np.ndarray:
    """Every rank's row, (world, len(row)) int64, rank order: one all_gather on the default group."""
    mine = torch.tensor(row, dtype=torch.int64, device=_device())
    rows = [torch.empty_like(mine) for _ in range(dist.get_world_size())]
    dist.all_gather(rows, mine)
    return torch.stack(rows).cpu().numpy()


def _n(count: int, what: str) -> str:
    """'1 rank', '2 ranks', '2 processes'."""
    return f"{count} {what}" if count == 1 else f"{count} {what}{'es' if what.endswith('s') else 's'}"


def _ranks(rs) -> str:
    rs = [int(r) for r in rs]
    return ("rank " if len(rs) == 1 else "ranks ") + ", ".join(map(str, rs))


def _disagreement(table: np.ndarray) -> Optional[str]:
    """The message for ranks that hold different plans, else None."""
    col = {f: table[:, i] for i, f in enumerate(_FIELDS)}
    groups = {}
    for r in range(len(table)):
        groups.setdefault((int(col["n_ranks"][r]), int(col["fingerprint"][r])), []).append(r)
    if len(groups) == 1:
        return None
    lines = []
    for (n, fp), rs in groups.items():
        r = rs[0]
        lines.append(f"  {_ranks(rs)}: a plan of {_n(n, 'rank')}, {_n(int(col['items'][r]), 'item')}, "
                     f"{_n(int(col['tokens'][r]), 'token')}, fingerprint {fp & (2**64 - 1):016x}")
    return ("bytescale.torch: the ranks run different plans (every rank must run the same StepPlan each "
            "step; broadcast_plan gives every rank rank 0's):\n" + "\n".join(lines))


def _misfit(table: np.ndarray, world: int, layout: bool) -> Optional[str]:
    """The message for a plan (the same on every rank) that does not fit the world, else None."""
    n, ranks = int(table[0, 1]), table[:, 0]
    expected = sorted(set(int(e) for e in table[:, 2]))
    if len(expected) > 1:
        per = "; ".join(f"{_ranks(np.nonzero(table[:, 2] == e)[0])}: {e}" for e in expected)
        return f"bytescale.torch: the ranks were given different HDP dimensions (hdp=): {per}"
    e = expected[0]
    if e < 1:
        return f"bytescale.torch: an HDP dimension of {e} (hdp=): it counts ranks, at least 1"
    if n != e and not layout:
        return (f"bytescale.torch: the plan is for {_n(n, 'rank')} but the world has {_n(world, 'process')}: "
                f"plan with ranks={world} (or run the plan on {_n(n, 'process')})")
    if n != e:
        return (f"bytescale.torch: the plan is for {_n(n, 'rank')} but the layout's HDP dimension is {e} "
                f"({_n(world, 'process')}): plan with ranks={e}")
    if world % n:
        return f"bytescale.torch: the HDP dimension {n} does not divide the world of {_n(world, 'process')}"
    # without a layout process r runs plan rank r (rings address ranks of the default group); with one,
    # every plan rank is run by world / n processes (its TP x PP replicas)
    if not layout:
        bad = [r for r in range(world) if ranks[r] != r]
        want = "each process its own rank, dist.get_rank()"
    else:
        counts = {int(x): int((ranks == x).sum()) for x in ranks}
        bad = [r for r in range(world) if not 0 <= ranks[r] < n or counts[int(ranks[r])] != world // n]
        want = f"each HDP rank 0..{n - 1} on {world // n} processes"
    if bad:
        said = ", ".join(f"process {r} runs plan rank {int(ranks[r])}" for r in bad)
        return f"bytescale.torch: the ranks given to microbatches do not cover the plan ({said}; want {want})"
    return None


def check_plan(plan, rank: int, *, hdp: Optional[int] = None) -> None:
    """Check, with one small collective on the default group, that every rank runs the same plan and
    that it fits: its rank count equals the world (or `hdp`, the HDP dimension of a TP x PP x HDP layout,
    where `rank` is this process's HDP rank), and the ranks passed cover the plan. Every rank must call
    it at the same point of the step, before any message of the step; each raises the same
    PlanCheckError, or none does. Without a process group (one process) the world is 1."""
    distributed = dist.is_available() and dist.is_initialized()
    world = dist.get_world_size() if distributed else 1
    expected = int(hdp) if hdp is not None else world
    row = [int(rank), int(plan.n_ranks), expected, plan_fingerprint(plan), len(plan.items), plan.n_tokens]
    if distributed and world > 1:
        table = _gather(row)
    else:
        table = np.asarray([row], dtype=np.int64)
    msg = _disagreement(table) or _misfit(table, world, hdp is not None)
    if msg:
        raise PlanCheckError(msg)
