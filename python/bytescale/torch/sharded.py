"""A model of one's own spread over TP shards, pipeline stages and HDP ranks: its gradient norm and
its checkpoints (docs/torch.md, "API": "Tensor parallelism").

    bt.all_reduce_gradients(model, layout=layout)          # summed over the HDP ranks
    norm = bt.clip_grad_norm_(model.parameters(), 1.0, layout=layout)
    bt.save_tp("ck/step-5", model, opt)                    # every process; a directory
    bt.load_tp("ck/step-5", model, opt)                    # any TP size, one process too

A parameter says how it lies in the whole model through the attributes ColumnParallelLinear and
RowParallelLinear set (parallel._mark): tp_dim (the dimension split over the tp group, None for a
parameter whole on every tp rank), tp_full_shape, tp_start, tp_layout. A parameter without them is
whole on every tp rank (norm gains, a replicated embedding), as in Megatron. Mark a parameter of
one's own split the same way to have it counted and checkpointed as a shard.

The checkpoint is PyTorch's distributed checkpoint (torch.distributed.checkpoint, DCP): a directory
of one file per writing process and a metadata file. A shard is saved as a DTensor on the tp group
(DeviceMesh.from_group), a whole parameter as a plain tensor; DCP writes each piece once (the HDP
replicas and tp copies of a piece hold the same bytes, and its planner keeps one), and reads a piece
into whatever shards the loading processes hold: the same TP size, another, or one process with the
whole model. Pipeline stages hold different parameters; give them names unique over the stages
(the layer's global index), and every stage's are saved side by side.
"""

from __future__ import annotations

import contextlib
import math
import warnings
from typing import Dict, Iterable, Optional, Union

import torch
import torch.distributed as dist
from torch import Tensor, nn

from . import guard


def _layout_of(params, layout):
    if layout is not None:
        return layout
    for p in params:
        lay = getattr(p, "tp_layout", None)
        if lay is not None:
            return lay
    return None


def _counts(p: Tensor, layout) -> bool:
    """Whether this process adds p's gradient to the norm: each piece of the model once. After the
    HDP all-reduce every HDP rank holds the same gradients, so HDP rank 0 counts; a shard counts on
    its tp rank, a parameter whole on every tp rank on tp rank 0; every stage counts its own."""
    if layout is None:
        return True
    if layout.hdp_rank != 0:
        return False
    return getattr(p, "tp_dim", None) is not None or layout.tp_rank == 0


def clip_grad_norm_(parameters: Union[Tensor, Iterable[Tensor]], max_norm: float, *, layout=None,
                    norm_type: float = 2.0, error_if_nonfinite: bool = False) -> Tensor:
    """torch.nn.utils.clip_grad_norm_ over the whole model when its parameters are TP shards and
    pipeline stages of a Layout, and its gradients are summed over the HDP ranks (all_reduce_gradients
    first): the norm counts every piece of the model once (each shard, each stage's parameters, a
    parameter whole on every tp rank once), gradients are scaled by min(1, max_norm / (norm + 1e-6))
    as torch's, and the norm is returned (the same on every process). One all-reduce of one number
    over the default group; no layout (none given, no parameter marked): torch's own, with no
    collective (HDP alone: the gradients are the same on every rank)."""
    params = [parameters] if isinstance(parameters, Tensor) else list(parameters)
    grads = [p.grad for p in params if p.grad is not None]
    lay = _layout_of(params, layout)
    if lay is None or lay.world == 1:
        return torch.nn.utils.clip_grad_norm_(params, max_norm, norm_type=norm_type,
                                              error_if_nonfinite=error_if_nonfinite)
    device = grads[0].device if grads else torch.device("cpu")
    inf = math.isinf(norm_type)
    acc = torch.zeros((), dtype=torch.float64, device=device)
    for p in params:
        if p.grad is None or not _counts(p, lay):
            continue
        g = p.grad.detach().to(torch.float64)
        acc = torch.maximum(acc, g.abs().max()) if inf else acc + g.abs().pow(norm_type).sum()
    with guard.waiting("the gradient norm's all-reduce"):
        dist.all_reduce(acc, op=dist.ReduceOp.MAX if inf else dist.ReduceOp.SUM)
    total = acc if inf else acc.pow(1.0 / norm_type)
    if error_if_nonfinite and not torch.isfinite(total):
        raise RuntimeError(f"the total norm of order {norm_type} of the gradients is {float(total)}: not finite")
    dtype = grads[0].dtype if grads else torch.float32
    coef = torch.clamp(max_norm / (total + 1e-6), max=1.0)
    for g in grads:
        g.mul_(coef.to(g.dtype))
    return total.to(dtype)


# ---- checkpoints of TP shards (torch.distributed.checkpoint) --------------------------------------------

def _mesh(layout, device_type: str):
    """The tp group as a 1-D DeviceMesh (made from the existing group: no new process group)."""
    from torch.distributed.device_mesh import DeviceMesh
    key = "_bs_tp_mesh_" + device_type
    if getattr(layout, key, None) is None:
        setattr(layout, key, DeviceMesh.from_group(layout.tp_group, device_type))
    return getattr(layout, key)


def _whole(p: Tensor) -> tuple:
    """p's shape in the whole model: a TP shard's tp_full_shape, FSDP-over-TP's (bs_fsdp_tp), a
    DTensor's global shape, a tensor's shape."""
    ft = getattr(p, "bs_fsdp_tp", None)
    return tuple(ft[1] if ft is not None else getattr(p, "tp_full_shape", None) or p.shape)


def _wrap_fsdp_tp(t: Tensor, p: Tensor):
    """An FSDP piece of a tp part (bytescale.torch.fsdp with tp > 1) as a DTensor on the 2-D mesh
    (tp, hdp) of the whole tensor: split on tp_dim over the tp ranks (replicated there when the
    parameter is whole on every tp rank), then on dimension 0 over the hdp ranks as FSDP splits it.
    DTensor applies the placements in the mesh's order, which is how the piece was made."""
    from torch.distributed.device_mesh import DeviceMesh
    from torch.distributed.tensor import DTensor, Replicate, Shard
    dim, full, lay = p.bs_fsdp_tp
    local = _local(t)
    key = "_bs_tp_hdp_mesh_" + local.device.type
    if getattr(lay, key, None) is None:
        ranks = [[lay.world_rank(lay.stage, h, r) for h in range(lay.hdp)] for r in range(lay.tp)]
        setattr(lay, key, DeviceMesh.from_group([lay.tp_group, lay.hdp_group], local.device.type,
                                                torch.tensor(ranks), mesh_dim_names=("tp", "hdp")))
    place = [Shard(dim) if dim is not None else Replicate(), Shard(0)]
    return DTensor.from_local(local, getattr(lay, key), place, run_check=False, shape=torch.Size(full),
                              stride=torch.empty(full, device="meta").stride())


def _wrap(t: Tensor, p: Tensor):
    """t (p's local shape) as DCP should see it: a DTensor on the tp group when p is a shard, else t."""
    if getattr(p, "bs_fsdp_tp", None) is not None and dist.is_initialized():
        return _wrap_fsdp_tp(t, p)
    dim, lay = getattr(p, "tp_dim", None), getattr(p, "tp_layout", None)
    if dim is None or lay is None or lay.tp == 1 or not dist.is_initialized():
        return t
    from torch.distributed.tensor import DTensor, Shard
    full = torch.Size(p.tp_full_shape)
    stride = torch.empty(full, device="meta").stride()
    return DTensor.from_local(t, _mesh(lay, t.device.type), [Shard(dim)], run_check=False, shape=full,
                              stride=stride)


def _is_dtensor(t) -> bool:
    from torch.distributed.tensor import DTensor
    return isinstance(t, DTensor)


def _local(t: Tensor) -> Tensor:
    """A DTensor's local shard (an FSDP or TP piece), a tensor itself."""
    return t.to_local() if _is_dtensor(t) else t


def _state(model: nn.Module, opt: Optional[torch.optim.Optimizer], want: Optional[Dict] = None) -> Dict:
    """The state dict DCP saves or loads into: "model.<name>" per parameter and buffer, and with an
    optimizer "optim.<name>.<key>" per state tensor of a parameter (shards like the parameter) and
    "optim.param_groups" (hyperparameters). want: the saved keys (a load: state the optimizer has not
    made yet is made, zeros of the saved shape, so it can be read)."""
    sd = {}
    names = {}
    for name, p in model.named_parameters():
        sd["model." + name] = _wrap(p.detach(), p)
        names[p] = name
    for name, b in model.named_buffers():
        sd["model." + name] = b
    if opt is None:
        return sd
    state, owned = _share(opt)
    for p, name in names.items():
        if owned is not None and p not in owned:
            continue  # ZeRO-1: another rank's share (its owner saves and loads it)
        st = state.get(p, {})
        keys = set(st) | {k[len(f"optim.{name}."):] for k in (want or {}) if k.startswith(f"optim.{name}.")}
        for k in sorted(keys):
            v = st.get(k)
            if v is None:  # a fresh optimizer: the saved state's tensor, made to load into
                meta = want[f"optim.{name}.{k}"]
                whole = tuple(meta.size) == _whole(p)
                if whole and _is_dtensor(p):  # an FSDP shard (bytescale.torch.fsdp): a DTensor like p
                    v = torch.zeros_like(p.detach(), dtype=meta.properties.dtype)
                else:
                    v = torch.zeros(p.shape if whole else meta.size, dtype=meta.properties.dtype, device=p.device)
                state.setdefault(p, {})[k] = v
            if isinstance(v, Tensor):
                sd[f"optim.{name}.{k}"] = _wrap(v, p) if v.shape == p.shape and v.dim() > 0 else v
    sd["optim.param_groups"] = [{k: v for k, v in g.items() if k != "params"} for g in opt.param_groups]
    return sd


def _share(opt: torch.optim.Optimizer):
    """(state, owned) of an optimizer: its own state and None (every parameter), or for torch's
    ZeroRedundancyOptimizer (ZeRO-1) its inner optimizer's state and the parameters of this rank's
    share: each piece of the state is saved by its owner under the parameter's name, so the
    checkpoint is the one a plain optimizer writes and loads into any partition."""
    from torch.distributed.optim import ZeroRedundancyOptimizer
    if isinstance(opt, ZeroRedundancyOptimizer):
        return opt.optim.state, {p for g in opt.optim.param_groups for p in g["params"]}
    return opt.state, None


@contextlib.contextmanager
def _alone():
    """DCP warns that it runs in one process when there is no process group: here that is the intent
    (one process saving or loading alone), so the warning is dropped."""
    with warnings.catch_warnings():
        if not dist.is_initialized():
            warnings.filterwarnings("ignore", message="torch.distributed is disabled")
        yield


def save_tp(path, model: nn.Module, optimizer: Optional[torch.optim.Optimizer] = None,
            extra: Optional[Dict] = None) -> None:
    """Save the model's parameters and buffers (and the optimizer's state and hyperparameters, and
    `extra`: picklable values such as the step) to the directory `path` with
    torch.distributed.checkpoint: every process of the job calls it (DCP's planning is collective over
    the default group); TP shards are saved as pieces of the whole tensor (module docstring). One
    process without a process group saves alone."""
    import torch.distributed.checkpoint as dcp
    with guard.failing():
        sd = _state(model, optimizer)
        for k, v in (extra or {}).items():
            sd["extra." + k] = v
        with _alone():
            dcp.save(sd, checkpoint_id=str(path), no_dist=not dist.is_initialized())


def load_tp(path, model: nn.Module, optimizer: Optional[torch.optim.Optimizer] = None) -> Dict:
    """Load what save_tp wrote into the model (and the optimizer) in place: each process reads its own
    shards, whatever TP size the checkpoint was written with (or the whole tensors, on one process
    or for parameters whole on every tp rank). Every process calls it. A checkpoint without the
    optimizer's state leaves the optimizer as it is. Returns save_tp's `extra`."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint import FileSystemReader
    with guard.failing():
        meta = FileSystemReader(str(path)).read_metadata().state_dict_metadata
        missing = [k for k in _state(model, None) if k not in meta]
        if missing:
            raise KeyError(f"{path}: no {missing[0]!r} in the checkpoint ({len(missing)} of the model's entries "
                           f"missing): not this model's checkpoint")
        use_opt = optimizer if optimizer is not None and any(k.startswith("optim.param_groups") for k in meta) else None
        sd = _state(model, use_opt, meta if use_opt is not None else None)
        extra_keys = [k for k in meta if k.startswith("extra.")]
        for k in extra_keys:
            sd[k] = None  # replaced by the saved value
        with _alone():
            dcp.load(sd, checkpoint_id=str(path), no_dist=not dist.is_initialized())
        with torch.no_grad():
            for name, p in model.named_parameters():
                t = _local(sd["model." + name])
                if t.data_ptr() != _local(p).data_ptr():
                    _local(p).copy_(t)
        if use_opt is not None:
            _restore_optimizer(model, use_opt, sd)
    return {k[len("extra."):]: sd[k] for k in extra_keys}


def _restore_optimizer(model: nn.Module, opt: torch.optim.Optimizer, sd: Dict) -> None:
    """Put the loaded optimizer tensors and hyperparameters back into `opt` (DTensors as their local
    shard)."""
    state, _ = _share(opt)
    for name, p in model.named_parameters():
        st = state.get(p)
        if not st:
            continue
        for k in list(st):
            v = sd.get(f"optim.{name}.{k}")
            if v is not None:
                v = _local(v)
                if v.data_ptr() != _local(st[k]).data_ptr():
                    _local(st[k]).copy_(v)
    groups = sd["optim.param_groups"]
    if len(groups) != len(opt.param_groups):
        raise ValueError(f"the checkpoint's optimizer has {len(groups)} parameter groups, this one "
                         f"{len(opt.param_groups)}")
    for g, saved in zip(opt.param_groups, groups):
        g.update(saved)
    inner = getattr(opt, "optim", None)  # ZeRO-1: its inner optimizer's groups too (as its load_state_dict)
    if state is not opt.state and inner is not None:
        for g, saved in zip(inner.param_groups, groups):
            g.update(saved)
