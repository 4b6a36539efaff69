"""Plan checks: before a step sends anything, every rank checks that all ranks run the same plan,
that the plan fits the world, that the plan is whole, and that what the rank read for it is what the
plan says (docs/torch.md, "Plan checks").

    check_plan(plan, rank)              # every rank, every step; microbatches() calls it for you

A rank that runs another plan than its peers would wait in a ring or all-to-all message nobody sends,
or meet a gradient all-reduce of another size (gloo aborts the process); a plan for more ranks than
the world names ranks that do not exist; a plan for fewer leaves ranks idle while their share of the
batch is never trained; a plan whose items miss or repeat tokens of a sequence, or whose sequences do
not match the documents, trains on other tokens than it divides by. So each rank puts a few integers
(its rank, the plan's rank count, the rank count it expects, a 64-bit fingerprint of the plan, the
plan's items, tokens and labelled count, the labelled rows it read, and the first problem it met
reading them) into one all_gather on the control group (guard.py: gloo, with the job's timeout), and
every rank judges the same gathered table the same way: all pass, or all raise the same
PlanCheckError naming the ranks, the sequence and the values that disagree. No rank raises before
the collective, so no rank is left waiting for one that has.
"""

from __future__ import annotations

import dataclasses
import hashlib
from typing import List, Optional, Tuple

import numpy as np
import torch
import torch.distributed as dist

from . import guard

# one row per rank: what each rank says about its plan and itself (problem: a READ_* code, 0 none)
_FIELDS = ("rank", "n_ranks", "expected", "fingerprint", "items", "tokens", "labelled", "counted", "problem",
           "seq", "want", "got")

# what a rank can meet reading its share of a plan (Reading.problem)
READ_PAST_END = 1  # a sequence runs past its document's end: want = the document's length, got = start + length
READ_SHORT = 2  # the source returned fewer tokens than the document's length promises: want, got = tokens


class PlanCheckError(RuntimeError):
    """The ranks do not run the same plan, the plan does not fit the world, is not whole, or does not
    match the tokens the ranks read. Raised on every rank with the same message."""


@dataclasses.dataclass
class Reading:
    """What a rank found reading its share of a plan (microbatches()): the labelled rows of its
    micro-batches, and the first problem met (a READ_* code, the sequence, the values wanted and got;
    code 0: none)."""

    labelled: int = -1  # -1: not counted (a check without micro-batches)
    problem: int = 0
    seq: int = -1
    want: int = 0
    got: int = 0

    def note(self, problem: int, seq: int, want: int, got: int) -> None:
        """Keep the first problem only: the one the message names."""
        if self.problem == 0:
            self.problem, self.seq, self.want, self.got = problem, int(seq), int(want), int(got)


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


def _gather(row: List[int], group=None) -> np.ndarray:
    """Every rank's row, (world, len(row)) int64, rank order: one all_gather on the control group
    (gloo, CPU: the same on an NCCL job; its timeout is the job's, guard.timeout()), or on `group`
    (check_plan's)."""
    on = guard.control_group() if group is None else group
    mine = torch.tensor(row, dtype=torch.int64)
    rows = [torch.empty_like(mine) for _ in range(dist.get_world_size())]
    with guard.control("the plan check") if group is None else guard.waiting("the plan check"):
        dist.all_gather(rows, mine, group=on)
    return torch.stack(rows).numpy()


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


def _seq(plan, q: int) -> str:
    """'sequence 3 (document 12, tokens [0, 600))' for the messages."""
    st, n = int(plan.seq_start[q]), int(plan.seq_len[q])
    return f"sequence {q} (document {int(plan.seq_doc[q])}, tokens [{st}, {st + n}))"


def _item_problem(plan, k: int, held: List[List[Tuple[int, int, int]]]) -> Optional[str]:
    """Item k's ranks and segments, each segment noted in `held` (per sequence: start, end, item)."""
    ranks, segs = plan.items[k]
    S = len(plan.seq_len)
    if not ranks or len(set(ranks)) != len(ranks) or not all(0 <= int(r) < plan.n_ranks for r in ranks):
        return f"item {k}: ranks {list(ranks)}: distinct ranks of 0..{plan.n_ranks - 1}, at least one"
    for seg in segs:
        if len(seg) != 3:
            return f"item {k}: segment {tuple(seg)}: (sequence, start, length)"
        q, start, n = (int(x) for x in seg)
        if not 0 <= q < S:
            return f"item {k}: segment {(q, start, n)} names sequence {q}; the plan has {_n(S, 'sequence')}"
        if start < 0 or n < 1 or start + n > int(plan.seq_len[q]):
            return (f"item {k}: segment {(q, start, n)} lies outside {_seq(plan, q)}: tokens [{start}, {start + n}) "
                    f"of its {int(plan.seq_len[q])}")
        held[q].append((start, start + n, k))
    return None


def _whole(plan) -> bool:
    """The common case at NumPy speed (every step checks the plan): True when the plan is whole, False
    when _problem must find what is wrong and say it."""
    S = len(plan.seq_len)
    seq_len = np.asarray(plan.seq_len, np.int64)
    if not (len(plan.seq_doc) == len(plan.seq_start) == S) or (S and (seq_len.min() < 1 or min(plan.seq_start) < 0
                                                                     or min(plan.seq_doc) < 0)):
        return False
    segs = [seg for _, item_segs in plan.items for seg in item_segs]
    for ranks, _ in plan.items:
        if not ranks or len(set(ranks)) != len(ranks) or min(ranks) < 0 or max(ranks) >= plan.n_ranks:
            return False
    if S == 0 or not segs:
        return S == 0 and not segs and plan.labelled == 0
    a = np.asarray(segs, np.int64)
    if a.ndim != 2 or a.shape[1] != 3:
        return False
    q, start, n = a[:, 0], a[:, 1], a[:, 2]
    if q.min() < 0 or q.max() >= S or start.min() < 0 or n.min() < 1 or (start + n > seq_len[q]).any():
        return False
    order = np.lexsort((start, q))  # by sequence, then start: each sequence's segments must tile it
    q, start, end = q[order], start[order], (start + n)[order]
    first = np.r_[True, q[1:] != q[:-1]]
    last = np.r_[q[1:] != q[:-1], True]
    tiled = np.where(first, start == 0, start == np.r_[0, end[:-1]]).all()
    if not tiled or len(np.unique(q)) != S or not (end[last] == seq_len[q[last]]).all():
        return False
    tokens = int(seq_len.sum())
    return tokens - S <= int(plan.labelled) <= tokens


def plan_problem(plan) -> Optional[str]:
    """What is wrong with the plan itself, else None: every sequence's tokens in exactly one item's
    segments, every segment within its sequence, items of distinct ranks of the plan, and the sums
    (tokens, the labelled count) right. The same on every rank for the same plan (no collective)."""
    if _whole(plan):
        return None
    return _problem(plan)


def _problem(plan) -> Optional[str]:
    """plan_problem's message, found segment by segment (a plan _whole refused)."""
    S = len(plan.seq_len)
    if not len(plan.seq_doc) == len(plan.seq_start) == S:
        return (f"seq_doc, seq_start and seq_len have {len(plan.seq_doc)}, {len(plan.seq_start)} and {S} entries: "
                f"one per sequence")
    for q in range(S):
        if int(plan.seq_len[q]) < 1 or int(plan.seq_start[q]) < 0 or int(plan.seq_doc[q]) < 0:
            return f"{_seq(plan, q)}: a sequence is at least 1 token from a start >= 0 of a document >= 0"
    held: List[List[Tuple[int, int, int]]] = [[] for _ in range(S)]
    for k in range(len(plan.items)):
        msg = _item_problem(plan, k, held)
        if msg:
            return msg
    for q in range(S):
        at = 0
        for start, end, k in sorted(held[q]):
            if start < at:
                return f"{_seq(plan, q)}: tokens [{start}, {min(at, end)}) are in two items' segments (item {k} and an earlier one)"
            if start > at:
                return f"{_seq(plan, q)}: tokens [{at}, {start}) are in no item's segment"
            at = end
        if at != int(plan.seq_len[q]):
            return (f"{_seq(plan, q)}: the plan gives it {int(plan.seq_len[q])} tokens, its items' segments hold "
                    f"{at}")
    tokens = plan.n_tokens
    if not tokens - S <= int(plan.labelled) <= tokens:
        return (f"the labelled count (the loss's denominator) is {int(plan.labelled)}, but {_n(tokens, 'token')} "
                f"in {_n(S, 'sequence')} have between {tokens - S} and {tokens} labels")
    return None


def _reading_problem(plan, table: np.ndarray, hdp_ranks: bool) -> Optional[str]:
    """The message for what ranks met reading their share (the same table on every rank), else None."""
    col = {f: table[:, i] for i, f in enumerate(_FIELDS)}
    bad = [r for r in range(len(table)) if col["problem"][r] != 0]
    if bad:
        r = bad[0]
        q, want, got = int(col["seq"][r]), int(col["want"][r]), int(col["got"][r])
        same = [x for x in bad if tuple(table[x, 8:]) == tuple(table[r, 8:])]
        if col["problem"][r] == READ_PAST_END:
            what = (f"{_seq(plan, q)} runs past its document's end: the plan reads to token {got}, the "
                    f"document has {want}")
        else:
            what = f"{_seq(plan, q)}: the source returned {got} of its {want} tokens"
        return (f"bytescale.torch: reading the plan's tokens, {'process' if len(same) == 1 else 'processes'} "
                f"{', '.join(map(str, same))} found: {what}")
    counted = col["counted"]
    if (counted < 0).any():
        return None
    per = {}  # plan rank -> its labelled rows (a layout's replicas of an HDP rank report the same)
    for r in range(len(table)):
        per.setdefault(int(col["rank"][r]), int(counted[r]))
    total = sum(per.values())
    if total != int(plan.labelled):
        parts = ", ".join(f"{k}: {v}" for k, v in sorted(per.items()))
        return (f"bytescale.torch: the plan's labelled count (the loss's denominator) is {int(plan.labelled)}, but "
                f"its micro-batches hold {total} labelled tokens ({'HDP ' if hdp_ranks else ''}rank {parts}): "
                f"labelled must count every token of the plan's sequences but a sequence's last where its "
                f"document ends (labelled_tokens)")
    return None


def check_plan(plan, rank: int, *, hdp: Optional[int] = None, reading: Optional[Reading] = None,
               group=None) -> None:
    """Check, with one small collective on the control group, that every rank runs the same plan and
    that it fits: its rank count equals the world (or `hdp`, the HDP dimension of a TP x PP x HDP layout,
    where `rank` is this process's HDP rank), the ranks passed cover the plan, the plan is whole
    (plan_problem), and, with `reading` (what microbatches() read for this rank), that the tokens
    exist and the labelled rows of all ranks add up to plan.labelled. Every rank must call it at the
    same point of the step, before any message of the step; each raises the same PlanCheckError, or
    none does. Without a process group (one process) the world is 1. `group`: a gloo group of every
    process to gather on instead of the control group (the loader's thread, loader.py)."""
    distributed = dist.is_available() and dist.is_initialized()
    world = dist.get_world_size() if distributed else 1
    expected = int(hdp) if hdp is not None else world
    rd = reading if reading is not None else Reading()
    row = [int(rank), int(plan.n_ranks), expected, plan_fingerprint(plan), len(plan.items), plan.n_tokens,
           int(plan.labelled), rd.labelled, rd.problem, rd.seq, rd.want, rd.got]
    if distributed and world > 1:
        table = _gather(row, group)
    else:
        table = np.asarray([row], dtype=np.int64)
    msg = _disagreement(table) or _misfit(table, world, hdp is not None)
    if not msg:
        msg = plan_problem(plan)
        msg = f"bytescale.torch: the plan is not whole: {msg}" if msg else _reading_problem(plan, table, hdp is not None)
    if msg:
        raise PlanCheckError(msg)
