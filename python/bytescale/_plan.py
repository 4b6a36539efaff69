"""Plans: bytescale.plan(), bytescale.read_plan() and the Plan they return."""

from __future__ import annotations

import collections
import weakref
from typing import Any, Dict, List, Optional, Sequence as SequenceOf, Union

import numpy as np

from . import _lib
from ._cost import CostModel, PathLike, cost_arg
from ._lib import Error, lib

Sequence = collections.namedtuple("Sequence", "id len src")
Segment = collections.namedtuple("Segment", "seq start len")
Item = collections.namedtuple("Item", "ranks segments offload tokens est_time a2a owners ulysses",
                              defaults=(False, None, 0))
Chunk = collections.namedtuple("Chunk", "item seq start len id id_start")
Chunks = collections.namedtuple("Chunks", "rank item seq start len id id_start")

# The plan's arrays: name -> (group, dtype). A group is fetched with one call (api.h).
_ARRAYS = {
    "seq_id": ("sequences", np.int64), "seq_len": ("sequences", np.int64), "seq_src": ("sequences", np.int64),
    "item_seg_begin": ("items", np.int32), "item_n_segs": ("items", np.int32),
    "item_rank_begin": ("items", np.int32), "item_n_ranks": ("items", np.int32),
    "item_offload": ("items", np.float64), "item_tokens": ("items", np.int64), "item_est_time": ("items", np.float64),
    "seg_seq": ("segments", np.int32), "seg_start": ("segments", np.int64), "seg_len": ("segments", np.int64),
    "members": ("members", np.int32),
    "rank_begin": ("schedules", np.int32), "rank_items": ("schedules", np.int32), "rank_busy": ("schedules", np.float64),
    "barriers": ("peers", np.int32), "delayed": ("peers", np.int32), "item_a2a": ("peers", np.int32),
    "seg_owner": ("owners", np.int32),
    "item_ulysses": ("ulysses", np.int32),
}


class Plan:
    """A finalized, validated plan (include/bytescale/plan.h; docs/plan-format.md).

    Scalars: policy, n_ranks, pp, capacity, n_seqs, n_tokens, n_items, makespan, lower_bound, hdp_bound.
    NumPy arrays (read-only, in the C layout: items point into segments and members):
      sequences  seq_id, seq_len, seq_src, seq_offset
      items      item_seg_begin, item_n_segs, item_rank_begin, item_n_ranks, item_offload, item_tokens,
                 item_est_time
      segments   seg_seq, seg_start, seg_len
      members    members (every item's ranks in ring order)
      schedules  rank_begin (n_ranks + 1), rank_items, rank_busy
      peers      barriers (item indices where a wave starts: megatron-hcp), delayed (sequence indices this
                 step does not train: wlb), item_a2a (1: a Ulysses all-to-all group, flexsp); empty / all 0
                 for bytescale's own policies (docs/peers.md)
      owners     seg_owner (per segment: its owner, a member index, in a block item (blocks); else -1)
      ulysses    item_ulysses (per item: u >= 2 for a hybrid item, a ring of item_n_ranks / u Ulysses
                 groups of u consecutive members; else 0)
    Plain Python: items, sequences, schedule(rank), schedules, chunks(rank); chunk_arrays(rank) as NumPy.
    """

    def __init__(self) -> None:
        raise TypeError("plans come from bytescale.plan() or bytescale.read_plan()")

    @classmethod
    def _adopt(cls, h, cost):
        self = cls.__new__(cls)
        self._h = h
        self._cost = cost  # kept alive with the plan: stats use it
        self._finalizer = weakref.finalize(self, lib.bs_plan_free, h)
        info = _lib.PlanInfo()
        _lib.check(lib.bs_plan_info(h, info, _lib.ctypes.sizeof(info)))
        self._info = info
        self.policy = info.policy.decode()
        for name in ("n_ranks", "pp", "capacity", "n_seqs", "n_tokens", "n_items", "makespan", "lower_bound",
                     "hdp_bound"):
            setattr(self, name, getattr(info, name))
        self._arrays = {}
        self._stats = None
        return self

    # ---- NumPy ---------------------------------------------------------------------------------

    def _fetch(self, group):
        i = self._info
        sizes = {"sequences": i.n_seqs, "items": i.n_items, "segments": i.n_segs, "members": i.n_refs,
                 "owners": i.n_segs, "ulysses": i.n_items}
        names = [n for n, (g, _) in _ARRAYS.items() if g == group]
        if group == "schedules":
            arrs = [_lib.new(i.n_ranks + 1, np.int32), _lib.new(i.n_refs, np.int32), _lib.new(i.n_ranks, np.float64)]
        elif group == "peers":
            arrs = [_lib.new(i.n_barriers, np.int32), _lib.new(i.n_delayed, np.int32), _lib.new(i.n_items, np.int32)]
        else:
            arrs = [_lib.new(sizes[group], _ARRAYS[n][1]) for n in names]
        fn = getattr(lib, "bs_plan_" + group)
        _lib.check(fn(self._h, *[_lib.ptr(a) for a in arrs]))
        for n, a in zip(names, arrs):
            a.setflags(write=False)
            self._arrays[n] = a

    def __getattr__(self, name):
        # the arrays, fetched on first use (planning alone stays as fast as the C call)
        if name in _ARRAYS:
            if name not in self._arrays:
                self._fetch(_ARRAYS[name][0])
            return self._arrays[name]
        if name == "seq_offset":
            self._arrays[name] = _seq_offset(self.seq_id, self.seq_len)
            return self._arrays[name]
        raise AttributeError(f"'Plan' object has no attribute '{name}'")

    def __dir__(self):
        return sorted(set(super().__dir__()) | set(_ARRAYS) | {"seq_offset"})

    def _rank(self, rank: int) -> int:
        """rank as an index of the plan's ranks: TypeError for a non-integer, bytescale.Error outside
        [0, n_ranks) (negative ranks too: no Python-style indexing from the end)."""
        r = _lib.integer(rank, "rank")
        if not 0 <= r < self.n_ranks:
            raise Error(f"rank: {r} is out of range [0, {self.n_ranks})")
        return r

    def chunk_arrays(self, rank: Optional[int] = None) -> Chunks:
        """The token ranges a rank holds, in the order it runs them (api.h bs_plan_chunks), as NumPy
        arrays: for each of its items in the global order, for each segment, the whole segment on a
        pack, or the member's chunks i and 2D-1-i on a ring of D (one range when they touch). A range
        is tokens [start, start + len) of the plan's sequence seq, which is tokens [id_start,
        id_start + len) of the caller's sequence id. rank: 0 to n_ranks - 1 (anything else raises
        bytescale.Error), or None: every rank's, rank 0 first."""
        r = -1 if rank is None else self._rank(rank)
        n = _lib.check(lib.bs_plan_chunks(self._h, r, None, None, None, None, None, 0))
        out = [_lib.new(n, np.int32), _lib.new(n, np.int32), _lib.new(n, np.int32), _lib.new(n, np.int64),
               _lib.new(n, np.int64)]
        _lib.check(lib.bs_plan_chunks(self._h, r, *[_lib.ptr(a) for a in out], n))
        rank_of, item, seq, start, length = out
        return Chunks(rank_of, item, seq, start, length, self.seq_id[seq], self.seq_offset[seq] + start)

    # ---- plain Python --------------------------------------------------------------------------

    @property
    def sequences(self) -> List[Sequence]:
        """[Sequence(id, len, src)]: the batch as planned (pieces of sequences the context cut share an id)."""
        return [Sequence(*t) for t in zip(self.seq_id.tolist(), self.seq_len.tolist(), self.seq_src.tolist())]

    @property
    def items(self) -> List[Item]:
        """[Item(ranks, segments, offload, tokens, est_time, a2a, owners, ulysses)] in the global order;
        ranks in ring order, segments as Segment(seq, start, len), a2a True for a Ulysses all-to-all group
        (flexsp), owners None or, for a block item (blocks), each segment's owner (an index into ranks),
        ulysses u >= 2 for a hybrid item (a ring of len(ranks) / u groups of u consecutive ranks), else 0."""
        members, seq, start, length = (self.members.tolist(), self.seg_seq.tolist(), self.seg_start.tolist(),
                                       self.seg_len.tolist())
        owner = self.seg_owner.tolist()
        out = []
        for sb, ns, rb, nr, off, tok, est, a2a, uly in zip(
                self.item_seg_begin.tolist(), self.item_n_segs.tolist(), self.item_rank_begin.tolist(),
                self.item_n_ranks.tolist(), self.item_offload.tolist(), self.item_tokens.tolist(),
                self.item_est_time.tolist(), self.item_a2a.tolist(), self.item_ulysses.tolist()):
            segs = tuple(Segment(seq[j], start[j], length[j]) for j in range(sb, sb + ns))
            own = tuple(owner[sb:sb + ns]) if ns and owner[sb] >= 0 else None
            out.append(Item(tuple(members[rb:rb + nr]), segs, off, tok, est, bool(a2a), own, uly))
        return out

    def schedule(self, rank: int) -> List[int]:
        """The items rank `rank` (0 to n_ranks - 1; anything else raises bytescale.Error) runs, in the
        order it runs them (the global order)."""
        r = self._rank(rank)
        return self.rank_items[self.rank_begin[r]:self.rank_begin[r + 1]].tolist()

    @property
    def schedules(self) -> List[List[int]]:
        """Every rank's schedule: schedules[r] == schedule(r)."""
        b, items = self.rank_begin.tolist(), self.rank_items.tolist()
        return [items[b[r]:b[r + 1]] for r in range(self.n_ranks)]

    def chunks(self, rank: int) -> List[Chunk]:
        """chunk_arrays(rank) as a list of Chunk(item, seq, start, len, id, id_start): the token ranges
        rank `rank` (0 to n_ranks - 1; anything else raises bytescale.Error) holds, in the order it
        runs them."""
        if rank is None:
            raise TypeError("rank must be an integer, got NoneType None (chunk_arrays(None) lists every rank's)")
        c = self.chunk_arrays(rank)
        return [Chunk(*t) for t in zip(c.item.tolist(), c.seq.tolist(), c.start.tolist(), c.len.tolist(),
                                       c.id.tolist(), c.id_start.tolist())]

    @property
    def stats(self) -> Dict[str, Union[int, float]]:
        """What `bytescale plan` prints about the plan (plan.h PlanStats): packs, rings, idle ranks,
        busy time per rank, ring traffic (needs the cost model: 0 for a plan read without one), offload
        ratios."""
        if self._stats is None:  # computed on first use: planning alone stays the C call
            st = _lib.PlanStats()
            _lib.check(lib.bs_plan_stats(self._h, self._cost._h if self._cost else None, st, _lib.ctypes.sizeof(st)))
            self._stats = {name: getattr(st, name) for name, _ in st._fields_}
        return dict(self._stats)

    @property
    def cost(self) -> Optional[CostModel]:
        """The CostModel the plan was made or read with (None: a file read without one)."""
        return self._cost

    # ---- files ---------------------------------------------------------------------------------

    def write(self, path: PathLike) -> None:
        """Write the plan file (docs/plan-format.md), atomically: the library's own writer, so the file
        is the one `bytescale plan --out` writes for the same plan."""
        _lib.check(lib.bs_plan_write(self._h, _lib.text(path, "path")))

    def to_dict(self) -> Dict[str, Any]:
        """The plan in the plan file's JSON form (docs/plan-format.md), as Python objects: the peers'
        "a2a", "owners" and "ulysses" (per item), "barriers" and "delayed" only where the file has them
        (set, non-empty)."""
        out = {
            "format": "bytescale-plan", "version": 1, "policy": self.policy, "n_ranks": self.n_ranks, "pp": self.pp,
            "capacity": self.capacity, "makespan": self.makespan, "lower_bound": self.lower_bound,
            "sequences": [{"id": s.id, "len": s.len, "src": s.src} for s in self.sequences],
            "items": [dict({"ranks": list(it.ranks), "offload": it.offload,
                            "segments": [list(s) for s in it.segments], "est_time": it.est_time},
                           **({"a2a": 1} if it.a2a else {}),
                           **({"owners": list(it.owners)} if it.owners is not None else {}),
                           **({"ulysses": it.ulysses} if it.ulysses else {})) for it in self.items],
        }
        for name in ("barriers", "delayed"):
            if getattr(self, name).size:
                out[name] = getattr(self, name).tolist()
        return out

    def __len__(self) -> int:
        return self.n_items

    def __repr__(self) -> str:
        return (f"<bytescale.Plan {self.policy}: {self.n_seqs} sequences ({self.n_tokens} tokens), {self.n_items} items "
                f"on {self.n_ranks} ranks (pp {self.pp}), C = {self.capacity}, makespan {self.makespan:.4g} s>")


def _seq_offset(ids, lengths):
    """Where each sequence starts within the caller's sequence: 0, or for a piece that `context` cut,
    the tokens of the pieces before it (a cut keeps the pieces of one sequence together, in order)."""
    if ids.size == 0:
        return np.zeros(0, dtype=np.int64)
    before = np.cumsum(lengths) - lengths  # tokens before each sequence in the batch
    first = np.ones(ids.size, dtype=bool)
    first[1:] = ids[1:] != ids[:-1]
    group = np.cumsum(first) - 1  # which run of equal ids each sequence is in
    out = before - before[first][group]
    out.setflags(write=False)
    return out


def _lengths(lengths):
    return _lib.int_array(lengths, "lengths")  # each >= 1: the library checks and names the first that is not


def _derived_cost(cost, model, hardware, tp, pp, ranks, capacity):
    """The cost= argument, or the cost model model / hardware / tp derive (as `bytescale plan`)."""
    if cost is None:
        return CostModel("llama-7b" if model is None else model, "h800-sxm" if hardware is None else hardware,
                         tp=2 if tp is None else tp, pp=pp, ranks=ranks, capacity=capacity)
    for name, value in (("model", model), ("hardware", hardware), ("tp", tp)):
        if value is not None:
            raise Error(f"{name} has no effect with cost= (the cost model holds what it would derive); leave it out")
    return cost


def plan(lengths: SequenceOf[int], *, ranks: int = 512, capacity: int = 8192, policy: str = "elastic",
         offload: bool = True, context: Optional[int] = None, pp: int = 1, model: Optional[str] = None,
         hardware: Optional[PathLike] = None, tp: Optional[int] = None,
         cost: Optional[Union[CostModel, PathLike]] = None) -> Plan:
    """Plan one global batch with a policy, as `bytescale plan --lengths FILE` does.

    lengths   the sequences' lengths in tokens: a one-dimensional list or NumPy array of integers,
              each >= 1; sequence k has id k
    ranks     HDP ranks (each a tp x pp group of devices), 1 to 2^20
    capacity  C: tokens one rank holds in a micro-batch without offloading, 1 to 2^24
    policy    one of bytescale.policies() (bytescale's own and the peers', docs/peers.md; the default
              elastic is bytescale's best); one plan per call, so not a list nor the words own, peers,
              all of `bytescale plan`: compare policies with a loop over bytescale.policies()
    offload   allow selective offloading (naive, balance, elastic)
    context   longest sequence, >= 1: longer ones are cut into context-long pieces that keep their id
              (None: nothing is cut; the static mesh then sizes its rings for the longest sequence)
    pp        pipeline stages per rank, 1 to 1024
    model, hardware, tp
              the cost model: a catalogue model (default llama-7b), a hardware profile or profile JSON
              file (default h800-sxm), tensor-parallel degree (default 2); or instead
    cost      a CostModel or a cost-model file's path
    Returns a Plan; raises bytescale.Error with the library's message when it refuses a value
    (a length < 1, ranks out of range, an unknown policy, a sequence no ring holds...), TypeError for
    an argument of the wrong type.
    """
    a = _lengths(lengths)
    if isinstance(policy, str) and ("," in policy or policy in ("own", "peers", "all")):
        raise Error(f"policy: {policy!r}: bytescale.plan makes one plan; lists and the words own, peers and all "
                    f"are `bytescale plan`'s comparison table: loop over bytescale.policies() instead")
    if not isinstance(offload, (bool, np.bool_)):
        raise TypeError(f"offload must be True or False, got {type(offload).__name__}")
    ranks, capacity, pp = _lib.integer(ranks, "ranks"), _lib.integer(capacity, "capacity"), _lib.integer(pp, "pp")
    ctx = 0 if context is None else _lib.integer(context, "context")
    if context is not None and ctx < 1:
        raise Error(f"context: {ctx} must be >= 1 (None: no cut)")
    cm = _derived_cost(cost_arg(cost), model, hardware, tp, pp, ranks, capacity)
    h = lib.bs_plan_lengths(_lib.ptr(a), a.size, _lib.text(policy, "policy"), ranks, capacity, ctx, pp,
                            int(bool(offload)), cm._h)
    return Plan._adopt(_lib.check(h), cm)


def read_plan(path: PathLike, cost: Optional[Union[CostModel, PathLike]] = None) -> Plan:
    """Read a plan file (docs/plan-format.md). With cost (a CostModel or a cost-model file), estimates
    and bounds are recomputed and offloading rings checked against Eq. 3; without, the file's
    estimates stand (plan_read_json). bytescale.Error names the file, the place in it and what is
    wrong when the library refuses it."""
    cm = cost_arg(cost)
    h = lib.bs_plan_read(_lib.text(path, "path"), cm._h if cm else None)
    return Plan._adopt(_lib.check(h), cm)
