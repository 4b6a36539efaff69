"""Cost models, the catalogues (policies, models, hardware profiles) and sampled batches."""

from __future__ import annotations

import os
import weakref
from typing import Dict, List, Optional, Sequence, Union

import numpy as np

from . import _lib
from ._lib import Error, lib


PathLike = Union[str, "os.PathLike[str]"]


def policies() -> Dict[str, str]:
    """{name: one-line summary} of every planning policy, in the library's order (the names
    bytescale.plan's `policy=` takes)."""
    out = {}
    for i in range(lib.bs_policy_count()):
        summary = _lib.c_str()
        name = lib.bs_policy_name(i, summary)
        out[name.decode()] = summary.value.decode()
    return out


def no_train() -> Dict[str, str]:
    """{name: why} of the policies whose plans `bytescale train` cannot run (the others it trains with):
    the library's own table, the one `train --help` lists from."""
    out = {}
    for i in range(lib.bs_policy_count()):
        why = lib.bs_policy_no_train(i)
        if why:
            out[lib.bs_policy_name(i, None).decode()] = why.decode()
    return out


def models() -> List[str]:
    """The model catalogue's names (include/bytescale/model.h): what `model=` takes."""
    return [lib.bs_model_name(i).decode() for i in range(lib.bs_model_count())]


def hardware_profiles() -> List[str]:
    """The built-in hardware profiles' names (include/bytescale/hw.h); `hardware=` also takes a profile
    JSON file."""
    return [lib.bs_hardware_name(i).decode() for i in range(lib.bs_hardware_count())]


class CostModel:
    """The cost model every planner and the simulator share (docs/cost-model.md).

    CostModel(model, hardware, tp=, pp=, ranks=, capacity=) derives it as `bytescale plan` does;
    CostModel.load(path) reads a cost-model file (`bytescale profile`, `--cost FILE`).
    """

    def __init__(self, model: str = "llama-7b", hardware: PathLike = "h800-sxm", *, tp: int = 2, pp: int = 1,
                 ranks: int = 512, capacity: int = 8192) -> None:
        """Derive the cost model as `bytescale plan` does (cost_derive): a catalogue model
        (bytescale.models()), a hardware profile (bytescale.hardware_profiles()) or a profile JSON
        file, tp devices per pipeline stage and pp stages per rank (1 to 1024 each), ranks HDP ranks
        (1 to 2^20) for the gradient sync, capacity C tokens per rank (1 to 2^24). Raises
        bytescale.Error naming what the library refuses, TypeError for a wrong type."""
        h = lib.bs_cost_derive(_lib.text(model, "model"), _lib.text(hardware, "hardware"), _lib.integer(tp, "tp"),
                               _lib.integer(pp, "pp"), _lib.integer(ranks, "ranks"),
                               _lib.integer(capacity, "capacity"))
        self._adopt(_lib.check(h), f"CostModel({model!r}, {hardware!r}, tp={tp}, pp={pp}, ranks={ranks}, "
                                   f"capacity={capacity})")

    @classmethod
    def load(cls, path: PathLike) -> "CostModel":
        """Read a cost-model file (JSON, docs/profile.md); bytescale.Error names the file and the
        field when it cannot be read."""
        self = cls.__new__(cls)
        self._adopt(_lib.check(lib.bs_cost_load(_lib.text(path, "cost"))), f"CostModel.load({os.fspath(path)!r})")
        return self

    def _adopt(self, h, desc):
        self._h = h
        self._desc = desc
        # freed with the object, whoever drops the last reference (plans keep theirs)
        self._finalizer = weakref.finalize(self, lib.bs_cost_free, h)

    def save(self, path: PathLike) -> None:
        """Write the coefficients as a cost-model file (JSON) that CostModel.load and `--cost` read."""
        _lib.check(lib.cost_save(self._h, _lib.text(path, "path")))

    def item_time(self, segments: Sequence[int], ranks: int = 1, offload: float = 0.0) -> float:
        """The planner's estimate of one item's time per member rank, seconds (cost_item_time).

        segments  the lengths of the item's segments in tokens: a one-dimensional sequence of 1 to
                  2^31-1 integers, each >= 1 (bytescale.Error names the first that is not)
        ranks     the ranks it runs on: 1 a pack, more a ring (1 to 2^20)
        offload   the offload ratio, 0 to 1
        """
        segs = _lib.positive_lengths(_lib.int_array(segments, "segments"), "segments")
        if segs.size < 1 or segs.size > 2**31 - 1:
            raise Error(f"segments: {segs.size} lengths; an item has 1 to 2^31-1 segments")
        d = _lib.integer(ranks, "ranks")
        if not 1 <= d <= 1 << 20:
            raise Error(f"ranks: {d} is out of range [1, 1048576]")
        off = _lib.number(offload, "offload", 0.0, 1.0)
        return lib.cost_item_time(self._h, _lib.ptr(segs), segs.size, d, off)

    def __repr__(self) -> str:
        return self._desc


def cost_arg(cost: Optional[Union[CostModel, PathLike]]) -> Optional[CostModel]:
    """`cost=`: a CostModel, a cost-model file's path, or None."""
    if cost is None or isinstance(cost, CostModel):
        return cost
    if isinstance(cost, (str, os.PathLike)):
        return CostModel.load(cost)
    raise TypeError(f"cost must be a CostModel or a cost-model file's path, got {type(cost).__name__}")


def sample_lengths(dist: str = "byted", *, tokens: int = 32 << 20, context: int = 2 << 20,
                   seed: int = 1) -> np.ndarray:
    """A batch's sequence lengths sampled from a length distribution as `bytescale plan --dist` samples
    them (docs/datasets.md): "byted", "github", "uniform:LO:HI", "lognormal:MU:SIGMA", "fixed:LEN";
    sequences until `tokens` (1 to 2^40) are reached, then cut to `context` (0: no cut; at most
    2^40). `seed` is any integer (taken modulo 2^64). A NumPy int64 array."""
    args = (_lib.text(dist, "dist"), _lib.integer(seed, "seed") % 2**64, _lib.integer(tokens, "tokens"),
            _lib.integer(context, "context"))
    n = _lib.check(lib.bs_batch_sample(*args, None, 0))
    out = _lib.new(n, np.int64)
    _lib.check(lib.bs_batch_sample(*args, _lib.ptr(out), n))
    return out
