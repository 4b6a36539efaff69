"""Cost models, the catalogues (policies, models, hardware profiles) and sampled batches."""

import os
import weakref

import numpy as np

from . import _lib
from ._lib import Error, lib


def policies():
    """{name: one-line summary} of every planning policy, in the library's order."""
    out = {}
    for i in range(lib.bs_policy_count()):
        summary = _lib.c_str()
        name = lib.bs_policy_name(i, summary)
        out[name.decode()] = summary.value.decode()
    return out


def models():
    """The model catalogue's names (include/bytescale/model.h)."""
    return [lib.bs_model_name(i).decode() for i in range(lib.bs_model_count())]


def hardware_profiles():
    """The built-in hardware profiles' names (include/bytescale/hw.h); `hardware=` also takes a profile
    JSON file."""
    return [lib.bs_hardware_name(i).decode() for i in range(lib.bs_hardware_count())]


class CostModel:
    """The cost model every planner and the simulator share (docs/cost-model.md).

    CostModel(model, hardware, tp=, pp=, ranks=, capacity=) derives it as `bytescale plan` does;
    CostModel.load(path) reads a cost-model file (`bytescale profile`, `--cost FILE`).
    """

    def __init__(self, model="llama-7b", hardware="h800-sxm", *, tp=2, pp=1, ranks=512, capacity=8192):
        h = lib.bs_cost_derive(_lib.text(model, "model"), _lib.text(hardware, "hardware"), _lib.integer(tp, "tp"),
                               _lib.integer(pp, "pp"), _lib.integer(ranks, "ranks"),
                               _lib.integer(capacity, "capacity"))
        self._adopt(_lib.check(h), f"CostModel({model!r}, {hardware!r}, tp={tp}, pp={pp}, ranks={ranks}, "
                                   f"capacity={capacity})")

    @classmethod
    def load(cls, path):
        """Read a cost-model file (JSON, docs/profile.md)."""
        self = cls.__new__(cls)
        self._adopt(_lib.check(lib.bs_cost_load(_lib.text(path, "cost"))), f"CostModel.load({os.fspath(path)!r})")
        return self

    def _adopt(self, h, desc):
        self._h = h
        self._desc = desc
        # freed with the object, whoever drops the last reference (plans keep theirs)
        self._finalizer = weakref.finalize(self, lib.bs_cost_free, h)

    def save(self, path):
        """Write the coefficients as a cost-model file (JSON) that CostModel.load and `--cost` read."""
        _lib.check(lib.cost_save(self._h, _lib.text(path, "path")))

    def item_time(self, segments, ranks=1, offload=0.0):
        """The planner's estimate of one item's time per member rank, seconds (cost_item_time): the
        lengths of its segments, on `ranks` ranks (1: a pack), at offload ratio `offload`."""
        segs = np.ascontiguousarray(segments, dtype=np.int64).reshape(-1)
        if segs.size < 1 or segs.size > 2**31 - 1:
            raise Error(f"segments: {segs.size} lengths; an item has 1 to 2^31-1 segments")
        d = _lib.integer(ranks, "ranks")
        if not 1 <= d <= 1 << 20:
            raise Error(f"ranks: {d} is out of range [1, 1048576]")
        if not 0.0 <= float(offload) <= 1.0:
            raise Error(f"offload: {offload} is out of range [0, 1]")
        return lib.cost_item_time(self._h, _lib.ptr(segs), segs.size, d, float(offload))

    def __repr__(self):
        return self._desc


def cost_arg(cost):
    """`cost=`: a CostModel, a cost-model file's path, or None."""
    if cost is None or isinstance(cost, CostModel):
        return cost
    if isinstance(cost, (str, os.PathLike)):
        return CostModel.load(cost)
    raise TypeError(f"cost must be a CostModel or a cost-model file's path, got {type(cost).__name__}")


def sample_lengths(dist="byted", *, tokens=32 << 20, context=2 << 20, seed=1):
    """A batch's sequence lengths sampled from a length distribution as `bytescale plan --dist` samples
    them (docs/datasets.md): "byted", "github", "uniform:LO:HI", "lognormal:MU:SIGMA", "fixed:LEN";
    sequences until `tokens` are reached, then cut to `context` (0: no cut). A NumPy int64 array."""
    args = (_lib.text(dist, "dist"), _lib.integer(seed, "seed") % 2**64, _lib.integer(tokens, "tokens"),
            _lib.integer(context, "context"))
    n = _lib.check(lib.bs_batch_sample(*args, None, 0))
    out = _lib.new(n, np.int64)
    _lib.check(lib.bs_batch_sample(*args, _lib.ptr(out), n))
    return out
