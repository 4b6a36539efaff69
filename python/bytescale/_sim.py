"""The simulator: bytescale.simulate() and the Simulation it returns."""

from __future__ import annotations

import weakref
from typing import Any, Dict, Optional, Sequence, Union

import numpy as np

from . import _lib
from ._cost import CostModel, PathLike, cost_arg
from ._lib import lib
from ._plan import Plan, plan as make_plan

_SCALARS = ("n_gpus", "n_ranks", "pp", "n_res", "n_rings", "n_ops", "step_time", "compute_end", "sync_time",
            "optimizer_time", "tokens", "tokens_per_s", "model_flops", "mfu", "ring_bytes", "offload_bytes",
            "exposed_comm", "exposed_offload")


class Simulation:
    """One simulated training step (include/bytescale/sim.h; docs/simulator.md).

    Scalars (seconds, bytes, tokens): step_time, compute_end, sync_time, optimizer_time, tokens,
    tokens_per_s, model_flops, mfu, ring_bytes, offload_bytes, exposed_comm, exposed_offload, n_gpus,
    n_ranks, pp, n_res, n_rings, n_ops.
    NumPy arrays per resource (res = rank * pp + stage): busy, comm, wait (busy + comm + wait =
    step_time on every resource) and offload (the part of comm that is offload copies).
    plan: the Plan simulated.
    """

    def __init__(self) -> None:
        raise TypeError("simulations come from bytescale.simulate()")

    @classmethod
    def _adopt(cls, h, plan):
        self = cls.__new__(cls)
        self._h = h
        self._finalizer = weakref.finalize(self, lib.bs_sim_free, h)
        self.plan = plan
        info = _lib.SimInfo()
        _lib.check(lib.bs_sim_info(h, info, _lib.ctypes.sizeof(info)))
        for name in _SCALARS:
            setattr(self, name, getattr(info, name))
        arrs = [_lib.new(self.n_res, np.float64) for _ in range(4)]
        _lib.check(lib.bs_sim_resources(h, *[_lib.ptr(a) for a in arrs]))
        for name, a in zip(("busy", "comm", "wait", "offload"), arrs):
            a.setflags(write=False)
            setattr(self, name, a)
        return self

    def trace(self, path: PathLike, max_ranks: int = 64) -> None:
        """Write a Chrome trace of the step (open it in Perfetto): max_ranks ranks (>= 1), evenly
        spaced."""
        n = _lib.integer(max_ranks, "max_ranks")
        if n < 1:  # (the C call would take 0 as its default, 64)
            raise _lib.Error(f"max_ranks: {n} must be >= 1")
        _lib.check(lib.bs_sim_trace(self._h, _lib.text(path, "path"), n))

    def to_dict(self) -> Dict[str, Any]:
        """The scalars as a dict."""
        return {name: getattr(self, name) for name in _SCALARS}

    def __repr__(self) -> str:
        return (f"<bytescale.Simulation {self.plan.policy}: step {self.step_time:.4g} s on {self.n_gpus} GPUs, "
                f"{self.tokens_per_s:.4g} tokens/s, MFU {100 * self.mfu:.1f}%>")


def simulate(plan_or_lengths: Union[Plan, Sequence[int]], *, model: str = "llama-7b", hardware: PathLike = "h800-sxm",
             tp: int = 2, gpus: Optional[int] = None, cost: Optional[Union[CostModel, PathLike]] = None,
             **plan_args: Any) -> Simulation:
    """Simulate one training step of a plan on a modelled cluster, as `bytescale simulate --plan FILE`:
    gpus devices of `hardware` (None: the plan's ranks x tp x pp), tp devices per pipeline stage,
    the plan's pp; the cost model `cost` (a CostModel or file), or derived from model and hardware.

    Given lengths instead of a Plan, plans them first with bytescale.plan(lengths, **plan_args) and
    the same model, hardware, tp and cost. The plan is not changed (the simulator finalizes its own
    copy with its cost model). Returns a Simulation.
    """
    cm = cost_arg(cost)
    if isinstance(plan_or_lengths, Plan):
        if plan_args:
            raise TypeError(f"simulate: {', '.join(sorted(plan_args))}: planning arguments with a plan given")
        p = plan_or_lengths
    elif cm is not None:
        p = make_plan(plan_or_lengths, cost=cm, **plan_args)
    else:
        p = make_plan(plan_or_lengths, model=model, hardware=hardware, tp=tp, **plan_args)
    g = 0 if gpus is None else _lib.integer(gpus, "gpus")
    if gpus is not None and g < 1:
        raise _lib.Error(f"gpus: {g} must be >= 1 (None: the plan's ranks x tp x pp)")
    h = lib.bs_simulate(p._h, _lib.text(model, "model"), _lib.text(hardware, "hardware"), _lib.integer(tp, "tp"), g,
                        cm._h if cm else None)
    return Simulation._adopt(_lib.check(h), p)
