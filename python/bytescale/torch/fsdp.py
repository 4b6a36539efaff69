"""FSDP2 (torch.distributed.fsdp.fully_shard) over the HDP ranks, with HDP's uneven micro-batch
counts (docs/torch-fsdp.md).

    model = bt.fsdp.shard(model, layout, blocks=model.blocks)     # or blocks="model.layers" (HF)
    opt = torch.optim.AdamW(model.parameters(), ...)               # after shard: the sharded parameters
    for step in ...:
        plan = bt.broadcast_plan(...)
        with bt.fsdp.step(model):                                   # every rank, also one without items
            for mb in bt.microbatches(plan, layout.hdp_rank, source, layout=layout):
                with bt.microbatch_context(mb):
                    loss = loss_fn(model(mb.tokens, mb.pos), mb.targets) / plan.labelled
                loss.backward()
        opt.step(); opt.zero_grad()

Why not FSDP's own schedule. FSDP2 all-gathers a unit's parameters in its forward (and again in its
backward when it resharded after the forward) and reduce-scatters its gradients at the end of its
backward, every micro-batch. Under HDP a rank runs 0, 1 or 5 micro-batches in a step, so the ranks
would call those collectives different numbers of times: the rank with more waits forever in a
reduce-scatter the others never start. And a ring's members exchange messages inside every layer's
forward and backward: a collective started by one member between two of its ring messages, while a
rank not in the ring is already waiting in it, deadlocks too.

So the collectives leave the micro-batches altogether:

- `shard` applies fully_shard to each named block and to the root with reshard_after_forward=False,
  and turns FSDP's gradient sync off for good (set_requires_gradient_sync(False),
  set_reshard_after_backward(False)): inside a step FSDP never communicates, it accumulates each
  micro-batch's gradients into the unsharded parameters' .grad.
- `step` (entering) unshards every unit, in one order on every rank: one all-gather per unit, before
  the first micro-batch. FSDP's own pre-forward unshard then finds the parameters unsharded and does
  nothing, and so does its backward prefetch.
- `step` (leaving) runs exactly one reduce-scatter (SUM) per unit, in the same order on every rank,
  of the accumulated unsharded gradients, laid out as FSDP lays out its shards (dimension 0 in
  chunks of ceil(rows / ranks)), then reshards every unit and gives each sharded parameter its shard
  of the summed gradient. A rank that ran no micro-batch has no gradient at all and sends zeros.

Every rank thus runs 2 x units collectives per step, all of them outside the micro-batches, whatever
the plan. The sum is exact arithmetic of the same kind as all_reduce_gradients: no division by the
rank count (the loss is already scaled by 1 / plan.labelled of the whole batch), so each shard is the
gradient of the batch's mean token loss.

What it costs: during the micro-batches every rank holds the whole parameters and gradients (as a
replicated model does); the optimizer state and, between steps, the parameters and gradients are
sharded. Beside tensor parallelism (a Layout with tp > 1) each tp part is sharded over its own hdp
group. Refused: pp > 1 (not built: pipeline.run_stage drives the stages' forwards and backwards itself),
a block that is not a submodule of the model.
"""

from __future__ import annotations

import contextlib
import math
from typing import Dict, Iterable, Iterator, List, Optional, Sequence, Tuple, Union

import torch
import torch.distributed as dist
from torch import Tensor, nn

from . import guard


class FSDPError(ValueError):
    """A model or layout bt.fsdp does not shard (raised on every rank: the checks need no message)."""


class _Units:
    """What shard() made: the FSDP units (modules) in one order, each with the names of the
    parameters it owns (relative to the unit), the hdp group and its DeviceMesh."""

    def __init__(self, units: List[Tuple[nn.Module, List[str]]], group, mesh, size: int, rank: int, layout,
                 tp_split: set):
        self.units, self.group, self.mesh, self.size, self.rank = units, group, mesh, size, rank
        self.layout, self.tp_split = layout, tp_split  # names of the parameters that are TP shards
        self.open = False


def _hdp_group(layout):
    """(group, size, rank) of the HDP ranks: the layout's hdp group (the processes holding the same
    tp part), or the default group."""
    if layout is not None:
        if layout.pp != 1:
            raise FSDPError(f"bytescale.torch.fsdp: a layout of tp {layout.tp} x pp {layout.pp}: FSDP2 over the HDP "
                            f"dimension runs on one pipeline stage (pp 1); use all_reduce_gradients and ZeRO-1 "
                            f"(fsdp.zero_optimizer) beside pipeline stages")
        if layout.hdp == 1:
            raise FSDPError(f"bytescale.torch.fsdp: the layout has one HDP rank (tp {layout.tp} on {layout.world} "
                            f"processes): FSDP over it would shard nothing")
        group = layout.hdp_group if layout.hdp < layout.world else None
        return group, layout.hdp, layout.hdp_rank
    if not dist.is_initialized():
        raise FSDPError("bytescale.torch.fsdp: no process group: call launch.init (or init_process_group) first")
    return None, dist.get_world_size(), dist.get_rank()


def _blocks(model: nn.Module, blocks) -> List[nn.Module]:
    """The blocks as modules: a dotted attribute name ("blocks", "model.layers"), a module list, or an
    iterable of submodules; each must lie inside the model."""
    if blocks is None:
        return []
    if isinstance(blocks, str):
        try:
            blocks = model.get_submodule(blocks)
        except AttributeError as e:
            raise FSDPError(f"bytescale.torch.fsdp: blocks={blocks!r}: the model has no such submodule") from e
    mods = list(blocks.children()) if isinstance(blocks, (nn.ModuleList, nn.Sequential)) else list(blocks)
    inside = {id(m) for m in model.modules()}
    for i, m in enumerate(mods):
        if not isinstance(m, nn.Module) or id(m) not in inside or m is model:
            raise FSDPError(f"bytescale.torch.fsdp: block {i} ({type(m).__name__}) is not a submodule of the model")
    return mods


def _owned(unit: nn.Module, others: Sequence[nn.Module]) -> List[str]:
    """The names (relative to unit) of unit's parameters that no nested unit owns."""
    inner = set()
    for o in others:
        if o is not unit:
            inner.update(id(p) for p in o.parameters())
    return [n for n, p in unit.named_parameters() if id(p) not in inner]


def shard(model: nn.Module, layout=None, *, blocks=None, device_type: str = "cpu", **fully_shard_args) -> nn.Module:
    """Shard `model` with FSDP2 over the HDP ranks (the layout's hdp group, or every rank of the
    default group): fully_shard on each of `blocks` (a ModuleList, an iterable of submodules, or a
    dotted name such as "blocks" or "model.layers"), then on the model, on a 1-D DeviceMesh of the
    HDP ranks, with FSDP's own gradient sync off (module docstring). Returns the model (FSDP2 shards
    in place). Make the optimizer afterwards, over model.parameters(): the sharded ones. Run every
    step inside `step(model)`. fully_shard_args go to fully_shard (mp_policy= is refused)."""
    from torch.distributed.device_mesh import DeviceMesh
    from torch.distributed.fsdp import fully_shard
    group, size, rank = _hdp_group(layout)
    if getattr(model, "_bs_fsdp", None) is not None:
        raise FSDPError("bytescale.torch.fsdp: the model is sharded already")
    for key in ("reshard_after_forward", "mesh"):
        if key in fully_shard_args:
            raise FSDPError(f"bytescale.torch.fsdp: {key}= is bytescale's to set (the HDP ranks' mesh; no reshard "
                            f"between micro-batches: docs/torch-fsdp.md)")
    if "mp_policy" in fully_shard_args:  # FSDP would keep the gradients where end() does not read them
        raise FSDPError("bytescale.torch.fsdp: mp_policy= is not supported (FSDP accumulates gradients of another "
                        "reduce dtype outside .grad); train in the parameters' dtype, or under torch.autocast")
    mods = _blocks(model, blocks)
    owned = [(m, _owned(m, mods)) for m in mods] + [(model, _owned(model, mods))]
    # TP shards (parallel._mark) lose their marks when FSDP makes its parameters: their names are kept
    tp_split = {n for n, p in model.named_parameters() if getattr(p, "tp_dim", None) is not None}
    tp_whole = {n: (getattr(p, "tp_dim", None), tuple(getattr(p, "tp_full_shape", None) or p.shape))
                for n, p in model.named_parameters()}
    mesh = DeviceMesh.from_group(group if group is not None else dist.group.WORLD, device_type)
    for m in mods + [model]:
        fully_shard(m, mesh=mesh, reshard_after_forward=False, **fully_shard_args)
    model.set_requires_gradient_sync(False)
    model.set_reshard_after_backward(False)
    for m in mods + [model]:
        m.set_gradient_divide_factor(1.0)  # (FSDP never reduces here; if it did, a SUM)
    model._bs_fsdp = _Units(owned, group, mesh, size, rank, layout, tp_split)
    if layout is not None and layout.tp > 1:  # where each FSDP piece lies in the whole model (sharded.py's DCP)
        for n, p in model.named_parameters():
            p.bs_fsdp_tp = tp_whole[n] + (layout,)
    return model


def _units(model: nn.Module) -> _Units:
    st = getattr(model, "_bs_fsdp", None)
    if st is None:
        raise FSDPError("bytescale.torch.fsdp: the model was not sharded by bytescale.torch.fsdp.shard")
    return st


def begin(model: nn.Module) -> None:
    """Unshard every unit (one all-gather each, in shard's order): every rank, before its first
    micro-batch of the step, also a rank that runs none."""
    st = _units(model)
    if st.open:
        raise FSDPError("bytescale.torch.fsdp: begin twice without end (one step at a time)")
    with guard.waiting("FSDP's all-gather of the parameters"):
        for unit, _ in st.units:
            unit.unshard()
    st.open = True


def _chunk_rows(rows: int, size: int) -> int:
    """FSDP2's shard rows on dimension 0: torch.chunk's ceil(rows / ranks) (the last ranks fewer, or none)."""
    return max(1, math.ceil(rows / size))


def _reduce_unit(st: _Units, unit: nn.Module, names: List[str]) -> Dict[str, Tensor]:
    """One reduce-scatter (SUM) of the unit's accumulated unsharded gradients: returns name -> this
    rank's rows of the summed gradient. The unsharded gradients are released."""
    params = [unit.get_parameter(n) for n in names]
    cols, pieces = [], []
    for p in params:
        g = p.grad if p.grad is not None else torch.zeros_like(p)
        g = g.detach().reshape(p.shape[0] if p.dim() else 1, -1)
        c = _chunk_rows(g.shape[0], st.size)
        if c * st.size != g.shape[0]:
            g = torch.cat([g, g.new_zeros(c * st.size - g.shape[0], g.shape[1])])
        pieces.append(g.reshape(st.size, c * g.shape[1]))
        cols.append((c, g.shape[1]))
        p.grad = None
    flat = torch.cat(pieces, dim=1).reshape(-1)
    out = flat.new_empty(flat.numel() // st.size)
    dist.reduce_scatter_single(out, flat, op=dist.ReduceOp.SUM, group=st.group)
    got, at = {}, 0
    for n, p, (c, w) in zip(names, params, cols):
        rows = max(0, min(c, (p.shape[0] if p.dim() else 1) - st.rank * c))
        got[n] = out[at:at + rows * w].reshape((rows,) + tuple(p.shape[1:]))
        at += c * w
    return got


def end(model: nn.Module) -> None:
    """Reduce-scatter the step's gradients (one per unit, in shard's order), reshard, and give each
    sharded parameter its shard of the summed gradient (added to a gradient it holds already): every
    rank, after its last micro-batch's backward."""
    from torch.distributed.tensor import DTensor
    st = _units(model)
    if not st.open:
        raise FSDPError("bytescale.torch.fsdp: end without begin")
    grads = []
    with guard.waiting("FSDP's reduce-scatter of the gradients"):
        for unit, names in st.units:
            grads.append(_reduce_unit(st, unit, names))
    for unit, _ in st.units:
        unit.reshard()
    st.open = False
    for (unit, names), got in zip(st.units, grads):
        for n in names:
            p = unit.get_parameter(n)
            if not isinstance(p, DTensor):
                raise FSDPError(f"bytescale.torch.fsdp: {n} is not a sharded parameter after reshard")
            local = got[n].to(p.dtype)
            if tuple(local.shape) != tuple(p.to_local().shape):
                raise FSDPError(f"bytescale.torch.fsdp: {n}: FSDP holds a shard of shape {tuple(p.to_local().shape)},"
                                f" bytescale computed {tuple(local.shape)} (FSDP's shard layout changed?)")
            g = DTensor.from_local(local.contiguous(), p.device_mesh, p.placements, run_check=False,
                                   shape=p.shape, stride=p.stride())
            p.grad = g if p.grad is None else p.grad + g


@contextlib.contextmanager
def step(model: nn.Module) -> Iterator[None]:
    """One training step of a model sharded by `shard`: begin (all-gathers), the block (this rank's
    micro-batches, forward and backward), end (reduce-scatters). Every rank enters it once per step,
    also a rank the plan gives nothing. An exception inside leaves without the reduce-scatters (the
    peers may be inside a ring; guard names this rank's failure to them)."""
    begin(model)
    with guard.failing():
        yield
    end(model)


def clip_grad_norm_(model: nn.Module, max_norm: float) -> Tensor:
    """torch.nn.utils.clip_grad_norm_ (order 2) of a model sharded by `shard`, also beside tensor
    parallelism: the norm of the whole model's gradients, each piece counted once (an FSDP shard by
    the HDP rank holding it; a TP shard on its tp rank; a parameter whole on every tp rank on tp rank
    0), then every gradient scaled by min(1, max_norm / (norm + 1e-6)). One all-reduce of one number
    over the default group; returns the norm (the same on every process). At tp 1,
    torch.nn.utils.clip_grad_norm_ on the DTensor gradients gives the same."""
    st = _units(model)
    tp_rank = st.layout.tp_rank if st.layout is not None else 0
    grads, acc = [], torch.zeros((), dtype=torch.float64)
    for name, p in model.named_parameters():
        if p.grad is None:
            continue
        g = p.grad.to_local() if hasattr(p.grad, "to_local") else p.grad
        grads.append(g)
        if name in st.tp_split or tp_rank == 0:
            acc = acc + g.detach().double().pow(2).sum().to(acc.device)
    if dist.is_initialized() and dist.get_world_size() > 1:
        with guard.waiting("the gradient norm's all-reduce"):
            dist.all_reduce(acc)
    norm = acc.sqrt()
    coef = torch.clamp(max_norm / (norm + 1e-6), max=1.0)
    for g in grads:
        g.mul_(coef.to(g.dtype))
    return norm


def local_bytes(model: nn.Module, optimizer: Optional[torch.optim.Optimizer] = None) -> Dict[str, int]:
    """Bytes this process holds of the parameters, their gradients and the optimizer's state (local
    shards of DTensors; ZeroRedundancyOptimizer: its own share's state): the per-rank memory FSDP or
    ZeRO-1 saves against replicated parameters."""
    def nbytes(t) -> int:
        if not isinstance(t, Tensor):
            return 0
        t = t.to_local() if hasattr(t, "to_local") else t
        return t.numel() * t.element_size()
    params = list(model.parameters())
    out = {"params": sum(nbytes(p) for p in params), "grads": sum(nbytes(p.grad) for p in params)}
    if optimizer is not None:
        inner = getattr(optimizer, "optim", optimizer)  # ZeroRedundancyOptimizer's local optimizer
        out["optimizer"] = sum(nbytes(v) for s in inner.state.values() for v in s.values())
    return out


def zero_optimizer(parameters: Union[nn.Module, Iterable[Tensor]], layout=None,
                   optimizer_class=torch.optim.AdamW, **kwargs):
    """torch's ZeroRedundancyOptimizer (ZeRO-1) over the HDP ranks, for a loop of one's own: each HDP
    rank keeps the optimizer state of its share of the parameters and broadcasts what it updated.
    Sum the gradients over the HDP ranks first (all_reduce_gradients(model, layout=layout)); its step
    runs the same broadcasts on every rank, outside the micro-batches. kwargs go to optimizer_class."""
    from torch.distributed.optim import ZeroRedundancyOptimizer
    if isinstance(parameters, nn.Module):
        parameters = parameters.parameters()
    group = None
    if layout is not None:
        if layout.pp != 1:
            raise FSDPError(f"bytescale.torch.fsdp: ZeRO-1 with pp {layout.pp}: one pipeline stage only")
        group = layout.hdp_group if layout.hdp < layout.world else None
    kw = {"process_group": group} if group is not None else {}
    return ZeroRedundancyOptimizer(list(parameters), optimizer_class=optimizer_class, **kw, **kwargs)
