"""One step's work for this rank: the global batch, its plan (made on rank 0, broadcast), and the
rank's micro-batches in the plan's global order.

    batch = Batch(docs, starts, lengths)               # sequence k: tokens [starts[k], +lengths[k]) of docs[k]
    plan = plan_step(batch, source, ranks=world, capacity=C, policy="elastic") if rank == 0 else None
    plan = broadcast_plan(plan)                        # every rank: the same StepPlan
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
from .check import check_plan
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
        ids, off = plan.seq_id, plan.seq_offset
        docs, starts = np.asarray(batch.docs, np.int64), np.asarray(batch.starts, np.int64)
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


def _item_ulysses(D: int, a2a, ulysses) -> int:
    """An item's Ulysses group size from the plan's fields: `ulysses` (a hybrid), else D for an a2a
    item (a single group), else 0."""
    u = int(ulysses or 0)
    if u == 0 and a2a and D > 1:
        u = D
    return u


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

    if "cost" not in plan_args:
        plan_args.setdefault("model", "tiny")
        plan_args.setdefault("hardware", "cpu")
        plan_args.setdefault("tp", 1)
    plan_args.setdefault("offload", False)
    p = bytescale.plan(np.asarray(batch.lengths, np.int64), ranks=ranks, capacity=capacity, policy=policy,
                       context=context, **plan_args)
    return StepPlan.from_plan(p, batch, labelled_tokens(batch, source))


def broadcast_plan(plan: Optional[StepPlan], src: int = 0) -> StepPlan:
    """Every rank gets rank `src`'s plan (broadcast_object_list on the default group). If the planning
    rank passes an Exception instead, every rank raises it (no rank is left waiting)."""
    box = [plan]
    if dist.is_initialized() and dist.get_world_size() > 1:
        if dist.get_backend() == "nccl":
            dist.broadcast_object_list(box, src=src, device=torch.device("cuda", torch.cuda.current_device()))
        else:
            dist.broadcast_object_list(box, src=src)
    if isinstance(box[0], BaseException):
        raise RuntimeError(f"rank {src} could not plan the step: {box[0]}")
    return box[0]


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


class MicroBatches(list):
    """microbatches()'s list of MicroBatch; `checked` is the plan that check_plan passed for it (None:
    not checked), so HDPTrainer.step does not check the same plan twice."""

    checked: Optional[StepPlan] = None


def microbatches(plan: StepPlan, rank: int, source: TokenSource, device=None,
                 ring_stats: Optional[RingStats] = None, *, check: bool = True,
                 hdp: Optional[int] = None, layout=None) -> List[MicroBatch]:
    """This rank's micro-batches in the global order, with their tokens read from `source`: for each
    piece the tokens plus one past it (the label of its last row; -1 at the document's end).

    Every rank calls it once per step, also a rank without items, before any message of the step:
    first it checks (check.py, one all_gather of a few integers on the default group) that every
    rank holds the same plan and that the plan fits the world (`hdp`: the HDP dimension of a
    TP x PP x HDP layout, `rank` then this process's HDP rank; a `layout` gives it); if not, every
    rank raises the same PlanCheckError. check=False skips that (one process looking at any rank's
    share).

    With a 3D `layout` (parallel.Layout) `rank` is the HDP rank (layout.hdp_rank; the plan's ranks
    are HDP ranks), and rings and all-to-alls run on the layout's hdp group with this process's
    stage and tp rank of the item's HDP ranks as peers."""
    out = MicroBatches()
    if check:
        check_plan(plan, rank, hdp=layout.hdp if layout is not None and hdp is None else hdp)
        out.checked = plan
    stats = ring_stats if ring_stats is not None else RingStats()
    for k in plan.schedule(rank):
        ranks, segs = plan.items[k]
        D, m = len(ranks), ranks.index(rank)
        toks, tgts = [], []
        for q, start, length in segs:
            doc, base = plan.seq_doc[q], plan.seq_start[q] + start
            for s, n in member_pieces(length, D, m):
                if n == 0:
                    continue
                got = np.asarray(source.read(doc, base + s, n + 1), dtype=np.int64)
                if len(got) < n:
                    raise RuntimeError(f"plan item {k}: document {doc} ends {n - len(got)} tokens before its "
                                       f"sequence {q}'s chunk does")
                toks.append(got[:n])
                tgt = np.full(n, -1, dtype=np.int64)
                tgt[:len(got) - 1] = got[1:]
                tgts.append(tgt)
        pos, seg = plan.member_rows(k, m)
        tokens = np.concatenate(toks) if toks else np.zeros(0, np.int64)
        targets = np.concatenate(tgts) if tgts else np.zeros(0, np.int64)
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
        out.append(MicroBatch(k, t(tokens), t(targets), t(pos), t(seg), rows, ring, cu,
                              int((targets >= 0).sum()), group))
    return out
