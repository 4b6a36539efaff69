"""Plans: bytescale.plan(), bytescale.read_plan() and the Plan they return."""

import collections
import weakref

import numpy as np

from . import _lib
from ._cost import CostModel, cost_arg
from ._lib import Error, lib

Sequence = collections.namedtuple("Sequence", "id len src")
Segment = collections.namedtuple("Segment", "seq start len")
Item = collections.namedtuple("Item", "ranks segments offload tokens est_time")
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
    Plain Python: items, sequences, schedule(rank), schedules, chunks(rank); chunk_arrays(rank) as NumPy.
    """

    def __init__(self):
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
        sizes = {"sequences": i.n_seqs, "items": i.n_items, "segments": i.n_segs, "members": i.n_refs}
        names = [n for n, (g, _) in _ARRAYS.items() if g == group]
        if group == "schedules":
            arrs = [_lib.new(i.n_ranks + 1, np.int32), _lib.new(i.n_refs, np.int32), _lib.new(i.n_ranks, np.float64)]
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

    def chunk_arrays(self, rank=None):
        """The token ranges a rank holds, in the order it runs them (api.h bs_plan_chunks), as NumPy
        arrays: for each of its items in the global order, for each segment, the whole segment on a
        pack, or the member's chunks i and 2D-1-i on a ring of D (one range when they touch). A range
        is tokens [start, start + len) of the plan's sequence seq, which is tokens [id_start,
        id_start + len) of the caller's sequence id. rank=None: every rank's, rank 0 first."""
        r = -1 if rank is None else _lib.integer(rank, "rank")
        n = _lib.check(lib.bs_plan_chunks(self._h, r, None, None, None, None, None, 0))
        out = [_lib.new(n, np.int32), _lib.new(n, np.int32), _lib.new(n, np.int32), _lib.new(n, np.int64),
               _lib.new(n, np.int64)]
        _lib.check(lib.bs_plan_chunks(self._h, r, *[_lib.ptr(a) for a in out], n))
        rank_of, item, seq, start, length = out
        return Chunks(rank_of, item, seq, start, length, self.seq_id[seq], self.seq_offset[seq] + start)

    # ---- plain Python --------------------------------------------------------------------------

    @property
    def sequences(self):
        """[Sequence(id, len, src)]: the batch as planned (pieces of sequences the context cut share an id)."""
        return [Sequence(*t) for t in zip(self.seq_id.tolist(), self.seq_len.tolist(), self.seq_src.tolist())]

    @property
    def items(self):
        """[Item(ranks, segments, offload, tokens, est_time)] in the global order; ranks in ring order,
        segments as Segment(seq, start, len)."""
        members, seq, start, length = (self.members.tolist(), self.seg_seq.tolist(), self.seg_start.tolist(),
                                       self.seg_len.tolist())
        out = []
        for sb, ns, rb, nr, off, tok, est in zip(self.item_seg_begin.tolist(), self.item_n_segs.tolist(),
                                                 self.item_rank_begin.tolist(), self.item_n_ranks.tolist(),
                                                 self.item_offload.tolist(), self.item_tokens.tolist(),
                                                 self.item_est_time.tolist()):
            segs = tuple(Segment(seq[j], start[j], length[j]) for j in range(sb, sb + ns))
            out.append(Item(tuple(members[rb:rb + nr]), segs, off, tok, est))
        return out

    def schedule(self, rank):
        """The items rank `rank` runs, in the order it runs them (the global order)."""
        r = _lib.integer(rank, "rank")
        if not 0 <= r < self.n_ranks:
            raise Error(f"rank: {r} is out of range [0, {self.n_ranks})")
        return self.rank_items[self.rank_begin[r]:self.rank_begin[r + 1]].tolist()

    @property
    def schedules(self):
        """Every rank's schedule: schedules[r] == schedule(r)."""
        b, items = self.rank_begin.tolist(), self.rank_items.tolist()
        return [items[b[r]:b[r + 1]] for r in range(self.n_ranks)]

    def chunks(self, rank):
        """chunk_arrays(rank) as a list of Chunk(item, seq, start, len, id, id_start)."""
        c = self.chunk_arrays(rank)
        return [Chunk(*t) for t in zip(c.item.tolist(), c.seq.tolist(), c.start.tolist(), c.len.tolist(),
                                       c.id.tolist(), c.id_start.tolist())]

    @property
    def stats(self):
        """What `bytescale plan` prints about the plan (plan.h PlanStats): packs, rings, idle ranks,
        busy time per rank, ring traffic (needs the cost model: 0 for a plan read without one), offload
        ratios."""
        if self._stats is None:  # computed on first use: planning alone stays the C call
            st = _lib.PlanStats()
            _lib.check(lib.bs_plan_stats(self._h, self._cost._h if self._cost else None, st, _lib.ctypes.sizeof(st)))
            self._stats = {name: getattr(st, name) for name, _ in st._fields_}
        return dict(self._stats)

    @property
    def cost(self):
        """The CostModel the plan was made or read with (None: a file read without one)."""
        return self._cost

    # ---- files ---------------------------------------------------------------------------------

    def write(self, path):
        """Write the plan file (docs/plan-format.md), atomically: the library's own writer, so the file
        is the one `bytescale plan --out` writes for the same plan."""
        _lib.check(lib.bs_plan_write(self._h, _lib.text(path, "path")))

    def to_dict(self):
        """The plan in the plan file's JSON form (docs/plan-format.md), as Python objects."""
        return {
            "format": "bytescale-plan", "version": 1, "policy": self.policy, "n_ranks": self.n_ranks, "pp": self.pp,
            "capacity": self.capacity, "makespan": self.makespan, "lower_bound": self.lower_bound,
            "sequences": [{"id": s.id, "len": s.len, "src": s.src} for s in self.sequences],
            "items": [{"ranks": list(it.ranks), "offload": it.offload,
                       "segments": [list(s) for s in it.segments], "est_time": it.est_time} for it in self.items],
        }

    def __len__(self):
        return self.n_items

    def __repr__(self):
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
    a = np.asarray(lengths)
    if a.ndim != 1:
        raise TypeError(f"lengths must be a one-dimensional sequence of integers, got {a.ndim} dimensions")
    if a.size == 0:
        return np.zeros(0, dtype=np.int64)
    if a.dtype.kind == "u" and a.max() > np.iinfo(np.int64).max:
        raise Error(f"lengths: {a.max()} is out of range")
    if a.dtype.kind not in "iu":
        raise TypeError(f"lengths must be integers (that fit 64 bits), got {a.dtype} values")
    return np.ascontiguousarray(a, dtype=np.int64)


def _derived_cost(cost, model, hardware, tp, pp, ranks, capacity):
    """The cost= argument, or the cost model model / hardware / tp derive (as `bytescale plan`)."""
    if cost is None:
        return CostModel("llama-7b" if model is None else model, "h800-sxm" if hardware is None else hardware,
                         tp=2 if tp is None else tp, pp=pp, ranks=ranks, capacity=capacity)
    for name, value in (("model", model), ("hardware", hardware), ("tp", tp)):
        if value is not None:
            raise Error(f"{name} has no effect with cost= (the cost model holds what it would derive); leave it out")
    return cost


def plan(lengths, *, ranks=512, capacity=8192, policy="balance", offload=True, context=None, pp=1, model=None,
         hardware=None, tp=None, cost=None):
    """Plan one global batch with a policy, as `bytescale plan --lengths FILE` does.

    lengths   the sequences' lengths in tokens (integers >= 1); sequence k has id k
    ranks     HDP ranks (each a tp x pp group of devices)
    capacity  C: tokens one rank holds in a micro-batch without offloading
    policy    one of bytescale.policies(): static, naive, naive-eq3min, balance, elastic
    offload   allow selective offloading (naive, balance, elastic)
    context   longest sequence: longer ones are cut into context-long pieces that keep their id (None:
              nothing is cut; the static mesh then sizes its rings for the longest sequence)
    pp        pipeline stages per rank
    model, hardware, tp
              the cost model: a catalogue model (default llama-7b), a hardware profile or profile JSON
              file (default h800-sxm), tensor-parallel degree (default 2); or instead
    cost      a CostModel or a cost-model file's path
    Returns a Plan; raises bytescale.Error with the library's message when it refuses.
    """
    a = _lengths(lengths)
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


def read_plan(path, cost=None):
    """Read a plan file (docs/plan-format.md). With cost (a CostModel or a cost-model file), estimates
    and bounds are recomputed and offloading rings checked against Eq. 3; without, the file's
    estimates stand (plan_read_json)."""
    cm = cost_arg(cost)
    h = lib.bs_plan_read(_lib.text(path, "path"), cm._h if cm else None)
    return Plan._adopt(_lib.check(h), cm)
