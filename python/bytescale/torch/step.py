"""One step's work for this rank: the global batch, its plan (made on rank 0, broadcast), and the
rank's micro-batches in the plan's global order.

    batch = Batch(docs, starts, lengths)               # sequence k: tokens [starts[k], +lengths[k]) of docs[k]
    plan = broadcast_plan(lambda: plan_step(batch, source, ranks=world, capacity=C, policy="elastic"))
                                                       # rank 0 plans; every rank: the same StepPlan (or PlanError)
    for mb in microbatches(plan, rank, source):        # checks the plan (check.py), then this rank's items
        with microbatch_context(mb):
            loss = model.loss_sum(mb.tokens, mb.targets, mb.pos) / plan.labelled
        loss.backward()

A **pack** is whole segments on one rank: rows segment by segment, positions restarting per planned
sequence, `cu_seqlens` for varlen attention. A **ring member** holds chunks m and 2D-1-m of every
segment of its item (the symmetric 2D-chunk layout, `plan_chunk` in src/plan/plan.c), each row with
its global position (RoPE, the causal mask) and its segment's index in the item; `mb.ring` knows
every member's rows, so ring attention can mask any block it receives. A member of an **a2a** or
**hybrid** item holds the same layout (D = the item's ranks); `mb.ulysses` knows its Ulysses group
and, for a hybrid, the ring across the groups (ulysses.py). Every row's label is the
next token of its document (read one token past every piece), -1 at the document's end, exactly as
the C engine's `mb_read` does (src/runtime/microbatch.c).
"""

from __future__ import annotations

import dataclasses
from typing import Callable, List, Optional, Sequence, Tuple

import numpy as np
import torch
import torch.distributed as dist
from torch import Tensor

from .attention import Rows
from .check import READ_PAST_END, READ_SHORT, Reading, check_plan, plan_problem
from .ring import Ring, RingStats
from .ulysses import Ulysses


def plan_chunk(length: int, D: int, j: int) -> Tuple[int, int]:
    """(start, n) of chunk j of 2D of a segment of `length` tokens: sizes differ by at most one, the
    first length % 2D chunks one token longer (src/plan/plan.c plan_chunk)."""
    parts = 2 * D
    base, rem = divmod(length, parts)
    return j * base + min(j, rem), base + (1 if j < rem else 0)


def member_pieces(length: int, D: int, m: int) -> List[Tuple[int, int]]:
    """The (start, n) pieces member m of a ring of D holds of a segment: chunk m, then chunk 2D-1-m;
    the whole segment on a pack (D = 1)."""
    if D == 1:
        return [(0, length)]
    return [plan_chunk(length, D, m), plan_chunk(length, D, 2 * D - 1 - m)]


class TokenSource:
    """Where tokens come from: `read(doc, start, n)` returns up to n tokens of document `doc` from
    offset `start` (fewer when the document ends first), `doc_length(doc)` its length. Wrap two
    callables with FunctionSource, or use bytescale.torch.Dataset (a prepared dataset)."""

    def read(self, doc: int, start: int, n: int) -> np.ndarray:
        raise NotImplementedError

    def doc_length(self, doc: int) -> int:
        raise NotImplementedError


class FunctionSource(TokenSource):
    """A TokenSource from two callables: read(doc, start, n) -> array-like, doc_length(doc) -> int."""

    def __init__(self, read: Callable[[int, int, int], Sequence[int]], doc_length: Callable[[int], int]):
        self._read, self._len = read, doc_length

    def read(self, doc, start, n):
        return np.asarray(self._read(doc, start, n), dtype=np.int64)

    def doc_length(self, doc):
        return int(self._len(doc))


@dataclasses.dataclass
class Batch:
    """A global batch: sequence k is tokens [starts[k], starts[k] + lengths[k]) of document docs[k]."""

    docs: Sequence[int]
    starts: Sequence[int]
    lengths: Sequence[int]

    def __post_init__(self):
        if not len(self.docs) == len(self.starts) == len(self.lengths):
            raise ValueError("docs, starts and lengths must have one entry per sequence")


@dataclasses.dataclass
class StepPlan:
    """A plan as every rank needs it (plain Python, small enough to broadcast): the batch as planned
    and the items in the global order.

    seq_doc, seq_start, seq_len   planned sequence k: tokens [seq_start[k], +seq_len[k]) of document
                                  seq_doc[k] (a piece cut by the context is a sequence of its own)
    items                         [(ranks in ring order, ((seq, start, len), ...))] in the global order
    labelled                      the loss's denominator: tokens of the whole batch with a label
    ulysses                       per item, its Ulysses group size u: 0 for a ring or a pack, the item's
                                  rank count for an a2a item, 2 <= u < D dividing D for a hybrid (a ring
                                  of D / u groups); empty: every item is a ring or a pack
    barriers                      item indices where a wave starts (megatron-hcp's plans), for the
                                  pipeline order (pipeline_slots); empty: none
    """

    n_ranks: int
    seq_doc: List[int]
    seq_start: List[int]
    seq_len: List[int]
    items: List[Tuple[Tuple[int, ...], Tuple[Tuple[int, int, int], ...]]]
    labelled: int
    policy: str = ""
    capacity: int = 0
    makespan: float = 0.0
    ulysses: List[int] = dataclasses.field(default_factory=list)
    barriers: List[int] = dataclasses.field(default_factory=list)

    def __post_init__(self):
        if self.ulysses and len(self.ulysses) != len(self.items):
            raise ValueError(f"ulysses has {len(self.ulysses)} entries for {len(self.items)} items")
        for k, u in enumerate(self.ulysses):
            D = len(self.items[k][0])
            if u != 0 and not (2 <= u <= D and D % u == 0):
                raise ValueError(f"item {k}: Ulysses group size {u} on {D} ranks: 0 (ring or pack), {D} (a2a) "
                                 f"or 2..{D - 1} dividing {D} (hybrid)")

    def item_ulysses(self, k: int) -> int:
        """Item k's Ulysses group size (0: a ring or a pack)."""
        return int(self.ulysses[k]) if self.ulysses else 0

    @property
    def n_tokens(self) -> int:
        return int(sum(self.seq_len))

    @property
    def n_rings(self) -> int:
        return sum(1 for r, _ in self.items if len(r) > 1)

    def schedule(self, rank: int) -> List[int]:
        """The items `rank` runs, in the global order."""
        return [k for k, (ranks, _) in enumerate(self.items) if rank in ranks]

    def member_rows(self, k: int, m: int) -> Tuple[np.ndarray, np.ndarray]:
        """(pos, seg) of the rows member m holds of item k (mb_layout)."""
        ranks, segs = self.items[k]
        pos, seg = [], []
        for j, (_, start, length) in enumerate(segs):
            for s, n in member_pieces(length, len(ranks), m):
                pos.append(np.arange(start + s, start + s + n, dtype=np.int64))
                seg.append(np.full(n, j, dtype=np.int64))
        if not pos:
            return np.zeros(0, np.int64), np.zeros(0, np.int64)
        return np.concatenate(pos), np.concatenate(seg)

    def rank_tokens(self, rank: int) -> int:
        """Rows `rank` holds over the step."""
        return sum(len(self.member_rows(k, self.items[k][0].index(rank))[0]) for k in self.schedule(rank))

    @classmethod
    def from_plan(cls, plan, batch: Batch, labelled: int) -> "StepPlan":
        """From a bytescale.Plan of batch.lengths (made with any `context`: pieces map back to their
        documents through the plan's seq_id / seq_offset)."""
        ids, off = np.asarray(plan.seq_id, np.int64), np.asarray(plan.seq_offset, np.int64)
        docs, starts = np.asarray(batch.docs, np.int64), np.asarray(batch.starts, np.int64)
        _same_lengths(plan, ids, batch)
        return cls(n_ranks=plan.n_ranks, seq_doc=docs[ids].tolist(), seq_start=(starts[ids] + off).tolist(),
                   seq_len=plan.seq_len.tolist(),
                   items=[(tuple(it.ranks), tuple(tuple(s) for s in it.segments)) for it in plan.items],
                   labelled=int(labelled), policy=plan.policy, capacity=plan.capacity, makespan=plan.makespan,
                   ulysses=[_item_ulysses(len(it.ranks), getattr(it, "a2a", False), getattr(it, "ulysses", 0))
                            for it in plan.items],
                   barriers=[int(b) for b in getattr(plan, "barriers", [])])

    @classmethod
    def from_plan_file(cls, d: dict, doc_offsets: Sequence[int], doc_lengths: Sequence[int]) -> "StepPlan":
        """From a plan file's JSON (docs/plan-format.md) written by `bytescale train --save-plans`,
        whose sequences carry id = document and src = global token offset: doc_offsets / doc_lengths
        are the dataset's (Dataset.doc_offset / doc_len). The labelled count follows the C trainer:
        every token but a sequence's last when its document ends there."""
        seqs = d["sequences"]
        doc = [int(s["id"]) for s in seqs]
        start = [int(s["src"]) - int(doc_offsets[i]) for s, i in zip(seqs, doc)]
        length = [int(s["len"]) for s in seqs]
        labelled = sum(n - (1 if st + n >= int(doc_lengths[i]) else 0) for i, st, n in zip(doc, start, length))
        items = [(tuple(int(r) for r in it["ranks"]), tuple(tuple(int(x) for x in s) for s in it["segments"]))
                 for it in d["items"]]
        return cls(n_ranks=int(d["n_ranks"]), seq_doc=doc, seq_start=start, seq_len=length, items=items,
                   labelled=labelled, policy=str(d.get("policy", "")), capacity=int(d.get("capacity", 0)),
                   makespan=float(d.get("makespan", 0.0)),
                   ulysses=[_item_ulysses(len(it["ranks"]), it.get("a2a", 0), it.get("ulysses", 0))
                            for it in d["items"]],
                   barriers=[int(b) for b in d.get("barriers", [])])


def _same_lengths(plan, ids: np.ndarray, batch: Batch) -> None:
    """The plan's pieces of each batch sequence add up to its length: a plan made for other lengths
    than the batch it is paired with would train other tokens than the batch's (and divide by the
    batch's labelled count). Raises ValueError naming the first sequence that differs."""
    lengths = np.asarray(batch.lengths, np.int64)
    if len(ids) and (ids.min() < 0 or ids.max() >= len(lengths)):
        raise ValueError(f"the plan names sequence {int(ids.max())} but the batch has {len(lengths)} sequences: "
                         f"a plan of another batch")
    planned = np.bincount(ids, weights=np.asarray(plan.seq_len, np.int64), minlength=len(lengths)).astype(np.int64)
    bad = np.nonzero(planned != lengths)[0]
    if len(bad):
        q = int(bad[0])
        raise ValueError(f"sequence {q} of the batch (document {int(batch.docs[q])}) has {int(lengths[q])} tokens, "
                         f"the plan {int(planned[q])}: a plan made for other lengths than the batch's"
                         f"{f' ({len(bad)} sequences differ)' if len(bad) > 1 else ''}")


def _item_ulysses(D: int, a2a, ulysses) -> int:
    """An item's Ulysses group size from the plan's fields: `ulysses` (a hybrid), else D for an a2a
    item (a single group), else 0."""
    u = int(ulysses or 0)
    if u == 0 and a2a and D > 1:
        u = D
    return u


def check_batch(batch: Batch, source: TokenSource) -> None:
    """Every sequence of the batch lies within its document (start >= 0, at least one token, ending at
    or before the document's end); raises ValueError naming the first that does not, so a bad batch
    fails where it is planned (rank 0; broadcast_plan carries the error to every rank) instead of
    where a rank reads its tokens."""
    for q, (doc, start, n) in enumerate(zip(batch.docs, batch.starts, batch.lengths)):
        doc, start, n = int(doc), int(start), int(n)
        if start < 0 or n < 1:
            raise ValueError(f"sequence {q} (document {doc}): start {start}, length {n}: a start >= 0 and at "
                             f"least one token")
        end = source.doc_length(doc)
        if start + n > end:
            raise ValueError(f"sequence {q} (document {doc}, tokens [{start}, {start + n})) runs past its "
                             f"document's end: it ends at token {start + n}, the document has {end}")


def labelled_tokens(batch: Batch, source: TokenSource) -> int:
    """Tokens of the batch that have a label: all but a sequence's last when its document ends there."""
    total = 0
    for doc, start, n in zip(batch.docs, batch.starts, batch.lengths):
        total += int(n) - (1 if int(start) + int(n) >= source.doc_length(int(doc)) else 0)
    return total


def plan_step(batch: Batch, source: TokenSource, *, ranks: int, capacity: int, policy: str = "elastic",
              context: Optional[int] = None, **plan_args) -> StepPlan:
    """Plan the batch with bytescale's C planner (bytescale.plan; rank 0 only) for `ranks` ranks.
    plan_args go to bytescale.plan (offload, cost, model, hardware, tp, ...); the default cost model
    is the C trainer's: the `tiny` model on the `cpu` hardware profile, tp 1."""
    import bytescale  # the C library: only the planning rank needs it loaded

    check_batch(batch, source)
    if "cost" not in plan_args:
        plan_args.setdefault("model", "tiny")
        plan_args.setdefault("hardware", "cpu")
        plan_args.setdefault("tp", 1)
    plan_args.setdefault("offload", False)
    p = bytescale.plan(np.asarray(batch.lengths, np.int64), ranks=ranks, capacity=capacity, policy=policy,
                       context=context, **plan_args)
    return StepPlan.from_plan(p, batch, labelled_tokens(batch, source))


class PlanError(RuntimeError):
    """The planning rank could not plan the step: raised on every rank by broadcast_plan, with the
    planning rank's error (`cause`: 'Type: message'; on the planning rank the exception is chained)."""

    def __init__(self, message: str, cause: str = ""):
        super().__init__(message)
        self.cause = cause


def broadcast_plan(plan, src: int = 0, group=None) -> StepPlan:
    """Every rank gets rank `src`'s plan. `plan` is, on rank src, the StepPlan, an Exception (the
    step could not be planned), or a callable that makes the plan (called on rank src only; what it
    raises goes to every rank); the other ranks pass None (or the same callable, not called there):

        plan = broadcast_plan(lambda: plan_step(batch, source, ranks=world, capacity=C))

    A failure on rank src raises PlanError on every rank with its reason (type and message), so no
    rank is left waiting and none sees only a transport error. The broadcast runs on the control
    group (guard.py: gloo, the job's timeout; a rank that never arrives is named), or on `group`, a
    gloo group of every process the caller made (the loader's thread: its collectives must not
    interleave with the training thread's on one group; a rank that fails is named, one that stalls
    meets the group's timeout)."""
    from . import guard

    me = dist.get_rank() if dist.is_initialized() else 0
    err = None
    if callable(plan) and not isinstance(plan, StepPlan):
        if me == src:
            try:
                plan = plan()
            except Exception as e:  # every rank stops with this reason
                err, plan = e, e
        else:
            plan = None
    if isinstance(plan, BaseException):
        err = plan
        plan = ("failed", guard.describe(plan))  # the reason, not the object: it may not pickle
    box = [plan]
    if dist.is_initialized() and dist.get_world_size() > 1:
        on = guard.control_group() if group is None else group
        with guard.control("the plan's broadcast") if group is None else guard.waiting("the plan's broadcast"):
            dist.broadcast_object_list(box, src=src, group=on)
    got = box[0]
    if isinstance(got, tuple) and len(got) == 2 and got[0] == "failed":
        raise PlanError(f"bytescale.torch: rank {src} could not plan the step: {got[1]}", got[1]) from err
    if not isinstance(got, StepPlan):
        raise PlanError(f"bytescale.torch: rank {src} gave broadcast_plan {type(got).__name__}, not a StepPlan "
                        f"(or an exception, or a callable making one)", type(got).__name__)
    return got


@dataclasses.dataclass
class MicroBatch:
    """One item of the plan as this rank runs it.

    tokens, targets, pos, seg   (T,) int64: the rows, their labels (-1: none), global positions in
                                their sequences, and segment indices within the item
    rows                        the same pos / seg for the attention kernels (Rows)
    ring                        the Ring for a ring member, None for a pack and an a2a / hybrid item
    cu_seqlens                  packs: segment boundaries [0, l0, l0+l1, ...] (varlen attention)
    labelled                    rows with a label
    ulysses                     the Ulysses group of an a2a or hybrid item (its ring across groups
                                inside), None otherwise
    """

    item: int
    tokens: Tensor
    targets: Tensor
    pos: Tensor
    seg: Tensor
    rows: Rows
    ring: Optional[Ring]
    cu_seqlens: Optional[Tensor]
    labelled: int
    ulysses: Optional[Ulysses] = None

    @property
    def T(self) -> int:
        return int(self.tokens.shape[0])

    @property
    def position_ids(self) -> Tensor:
        """pos as (1, T): the `position_ids` Hugging Face models take (restarting at each sequence)."""
        return self.pos.unsqueeze(0)


class MicroBatches(list):
    """microbatches()'s list of MicroBatch; `checked` is the plan that check_plan passed for it (None:
    not checked), so HDPTrainer.step does not check the same plan twice."""

    checked: Optional[StepPlan] = None


def _read_item(plan: StepPlan, k: int, m: int, source: TokenSource, reading: Reading):
    """Member m's tokens and labels of item k: for each piece the tokens plus one past it (the label of
    its last row; -1 at the document's end). What does not match the plan (a sequence past its
    document's end, a source that returns too few tokens) is noted in `reading`, not raised: the
    plan check reports it on every rank."""
    ranks, segs = plan.items[k]
    D = len(ranks)
    toks, tgts = [], []
    for q, start, length in segs:
        doc, base = plan.seq_doc[q], plan.seq_start[q] + start
        end = plan.seq_start[q] + plan.seq_len[q]
        doc_len = int(source.doc_length(doc))
        if end > doc_len:
            reading.note(READ_PAST_END, q, doc_len, end)
        for s, n in member_pieces(length, D, m):
            if n == 0:
                continue
            got = np.asarray(source.read(doc, base + s, n + 1), dtype=np.int64)[:n + 1]
            if len(got) < n:
                reading.note(READ_SHORT if end <= doc_len else READ_PAST_END, q,
                             n if end <= doc_len else doc_len, len(got) if end <= doc_len else end)
                got = np.concatenate([got, np.zeros(n - len(got), np.int64)])  # the check raises before use
            toks.append(got[:n])
            tgt = np.full(n, -1, dtype=np.int64)
            tgt[:len(got) - 1] = got[1:]
            tgts.append(tgt)
    tokens = np.concatenate(toks) if toks else np.zeros(0, np.int64)
    targets = np.concatenate(tgts) if tgts else np.zeros(0, np.int64)
    return tokens, targets


def _build(plan: StepPlan, k: int, m: int, tokens, targets, device, stats: RingStats, layout) -> "MicroBatch":
    """The MicroBatch of member m of item k (its Ring or Ulysses group from the plan's rows)."""
    ranks, segs = plan.items[k]
    D = len(ranks)
    pos, seg = plan.member_rows(k, m)
    t = lambda a: torch.from_numpy(np.ascontiguousarray(a)).to(device)
    rows = Rows(torch.from_numpy(pos), torch.from_numpy(seg))
    ring, cu, group = None, None, None
    if D > 1:
        members = [Rows(*map(torch.from_numpy, plan.member_rows(k, j))) if j != m else rows for j in range(D)]
        u = plan.item_ulysses(k)
        peers = layout.hdp_to_world(ranks) if layout is not None else ranks
        pg = layout.hdp_group if layout is not None else None
        if u:
            group = Ulysses(peers, m, members, u, stats, pg)
        else:
            ring = Ring(peers, m, members, stats, pg)
    else:
        cu = torch.from_numpy(np.concatenate([[0], np.cumsum([n for _, _, n in segs])]).astype(np.int64))
    return MicroBatch(k, t(tokens), t(targets), t(pos), t(seg), rows, ring, cu, int((targets >= 0).sum()), group)


def microbatches(plan: StepPlan, rank: int, source: TokenSource, device=None,
                 ring_stats: Optional[RingStats] = None, *, check: bool = True,
                 hdp: Optional[int] = None, layout=None) -> List[MicroBatch]:
    """This rank's micro-batches in the global order, with their tokens read from `source`: for each
    piece the tokens plus one past it (the label of its last row; -1 at the document's end).

    Every rank calls it once per step, also a rank without items, before any message of the step:
    it reads its tokens, then checks (check.py, one all_gather of a few integers on the control
    group) that every rank holds the same plan, that the plan fits the world (`hdp`: the HDP dimension
    of a TP x PP x HDP layout, `rank` then this process's HDP rank; a `layout` gives it), that the plan
    is whole, that every rank found the tokens the plan names, and that the labelled rows of all ranks
    add up to plan.labelled (the loss's denominator); if not, every rank raises the same
    PlanCheckError. check=False skips that (one process looking at any rank's share; a problem
    reading is then raised here).

    With a 3D `layout` (parallel.Layout) `rank` is the HDP rank (layout.hdp_rank; the plan's ranks
    are HDP ranks), and rings and all-to-alls run on the layout's hdp group with this process's
    stage and tp rank of the item's HDP ranks as peers."""
    out = MicroBatches()
    reading = Reading(labelled=0)
    read = []
    if check:  # the plan's own faults first, so reading does not trip over them (the check reports them)
        broken = plan_problem(plan) is not None
    else:
        broken = False
    for k in ([] if broken else plan.schedule(rank)):
        tokens, targets = _read_item(plan, k, plan.items[k][0].index(rank), source, reading)
        reading.labelled += int((targets >= 0).sum())
        read.append((k, tokens, targets))
    if check:
        check_plan(plan, rank, hdp=layout.hdp if layout is not None and hdp is None else hdp, reading=reading)
        out.checked = plan
    elif reading.problem:
        raise RuntimeError(f"plan sequence {reading.seq}: the plan reads to token {reading.got} of document "
                           f"{plan.seq_doc[reading.seq]}, which has {reading.want}" if reading.problem == READ_PAST_END
                           else f"plan sequence {reading.seq}: the source returned {reading.got} of {reading.want} "
                           f"tokens")
    stats = ring_stats if ring_stats is not None else RingStats()
    for k, tokens, targets in read:
        out.append(_build(plan, k, plan.items[k][0].index(rank), tokens, targets, device, stats, layout))
    return out
