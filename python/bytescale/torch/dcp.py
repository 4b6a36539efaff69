"""Distributed checkpoints of a training job (torch.distributed.checkpoint, DCP): the model, the
optimizer, the step and the data loader's state in one directory, for a model replicated over the
HDP ranks, sharded by FSDP2 (bytescale.torch.fsdp), split over tp ranks (ColumnParallelLinear /
RowParallelLinear) or both (each tp part sharded over its hdp group), with a plain optimizer or
ZeRO-1's (ZeroRedundancyOptimizer), and read back on another world size and layout
(docs/torch-fsdp.md).

    bt.dcp.save("ck/step-5", model, opt, step=5, loader=loader)      # every process
    state = bt.dcp.load("ck/step-5", model, opt, loader=loader)      # any world size, tp, FSDP or not
    first = state["step"] + 1

The tensors are written by sharded.save_tp (one key per parameter, "model.<name>", and per optimizer
state tensor, "optim.<name>.<key>": a TP shard as a DTensor on the tp group, an FSDP shard as the
DTensor FSDP holds, an FSDP piece of a tp part as a DTensor on the (tp, hdp) mesh, a replicated
tensor plain, each piece written once; ZeRO-1's state by the rank whose share holds it): the names
and the whole shapes do not depend on how the job was split, so DCP reads any of them into any
other (ZeRO-1 into any partition, or a plain optimizer, and back). The step,
the loader's state (any object with state_dict() / load_state_dict(), the same on every rank) and
`extra` are one pickled value, written once.

Atomic: every process writes into a temporary directory beside `path` (its name chosen by rank 0);
when all have written, rank 0 adds the manifest (bytescale-dcp.json: every file's size and CRC-32,
the job's world and layout) and renames the directory to `path` (a checkpoint already there is
moved aside first and removed after). A crash before the rename leaves the previous checkpoint as
it was and a temporary directory, which the next save of the same path removes.

Refused, with the same error on every rank (CheckpointError; the ranks agree through one gather on
the control group before any tensor is read): a directory that is missing or holds no manifest, a
manifest of another format, a file missing, of another size or another CRC-32 (checked on rank 0),
a parameter the checkpoint lacks or holds with another whole shape, an optimizer asked for that the
checkpoint does not hold, a loader asked for that it does not hold.
"""

from __future__ import annotations

import json
import os
import pickle
import shutil
import time
import zlib
from typing import Any, Dict, List, Optional

import torch
import torch.distributed as dist
from torch import nn

from . import guard
from .checkpoint import CheckpointError, fsync_dir
from .sharded import load_tp, save_tp

MANIFEST = "bytescale-dcp.json"
FORMAT = "bytescale-dcp 1"
_STATE_KEY = "bytescale_state"  # save_tp's extra: the pickled step, loader state and extra


def _world() -> int:
    return dist.get_world_size() if dist.is_initialized() else 1


def _rank() -> int:
    return dist.get_rank() if dist.is_initialized() else 0


def _gather(value: Any, what: str) -> List[Any]:
    """Every rank's `value` on every rank (one all_gather_object on the control group)."""
    if _world() == 1:
        return [value]
    out = [None] * _world()
    with guard.control(what):
        dist.all_gather_object(out, value, group=guard.control_group())
    return out


def _agree(problem: Optional[str], what: str) -> None:
    """Raise the same CheckpointError on every rank when any rank found a problem."""
    found = [(r, p) for r, p in enumerate(_gather(problem, what)) if p]
    if found:
        ranks = ", ".join(str(r) for r, p in found if p == found[0][1])
        raise CheckpointError(f"bytescale.torch: {found[0][1]} (found by rank{'s' if ',' in ranks else ''} {ranks})")


def _crc(path: str) -> int:
    crc = 0
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            crc = zlib.crc32(block, crc)
    return crc


def _layout_of(model: nn.Module, optimizer) -> Dict[str, int]:
    """What the manifest says of the job that wrote it (information only: any layout reads it)."""
    from torch.distributed.optim import ZeroRedundancyOptimizer
    tp = 1
    for p in model.parameters():
        lay = getattr(p, "tp_layout", None) or (getattr(p, "bs_fsdp_tp", None) or (None,) * 3)[2]
        if lay is not None:
            tp = lay.tp
            break
    fsdp = getattr(model, "_bs_fsdp", None) is not None
    return {"world": _world(), "tp": tp, "fsdp": fsdp, "zero": isinstance(optimizer, ZeroRedundancyOptimizer)}


def _publish(tmp: str, path: str, model: nn.Module, optimizer, step) -> None:
    """Rank 0: the manifest into tmp, then tmp renamed to path (an older path moved aside first)."""
    files = {}
    for name in sorted(os.listdir(tmp)):
        full = os.path.join(tmp, name)
        files[name] = {"size": os.path.getsize(full), "crc32": _crc(full)}
    manifest = {"format": FORMAT, "step": step, "job": _layout_of(model, optimizer), "files": files,
                "written": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    with open(os.path.join(tmp, MANIFEST), "w") as f:
        json.dump(manifest, f, indent=1)
        f.flush()
        os.fsync(f.fileno())
    fsync_dir(tmp)
    old = None
    if os.path.exists(path):
        old = f"{path}.old-{os.getpid()}"
        os.rename(path, old)
    os.rename(tmp, path)
    fsync_dir(os.path.dirname(os.path.abspath(path)))
    if old is not None:
        shutil.rmtree(old)


def _fresh_tmp(path: str) -> str:
    """Rank 0: a new temporary directory name beside path, earlier ones of the same path removed (a
    save that crashed)."""
    d, base = os.path.split(os.path.abspath(path))
    os.makedirs(d, exist_ok=True)
    for name in os.listdir(d):
        if name.startswith(base + ".tmp-") or name.startswith(base + ".old-"):
            shutil.rmtree(os.path.join(d, name), ignore_errors=True)
    return os.path.join(d, f"{base}.tmp-{os.getpid()}-{time.time_ns()}")


def save(path, model: nn.Module, optimizer: Optional[torch.optim.Optimizer] = None, *, step: Optional[int] = None,
         loader=None, extra: Optional[Dict] = None) -> None:
    """Write one checkpoint of the job to the directory `path`, atomically (module docstring): the
    model's parameters and buffers, the optimizer's state, `step`, `loader.state_dict()` and `extra`
    (picklable). Every process of the job calls it, at the same point."""
    path = os.fspath(path)
    with guard.failing():
        tmp, problem = None, None
        if _rank() == 0:
            try:
                tmp = _fresh_tmp(path)
            except OSError as e:
                problem = f"checkpoint {path}: cannot write beside it: {e}"
        tmp, problem = _gather((tmp, problem), "the checkpoint's directory")[0]  # rank 0's, on every rank
        if problem:
            raise CheckpointError(f"bytescale.torch: {problem} (found by rank 0)")
        state = {"step": step, "loader": loader.state_dict() if loader is not None else None, "extra": extra}
        save_tp(tmp, model, optimizer, extra={_STATE_KEY: pickle.dumps(state)})
        problem = None
        if _rank() == 0:
            try:
                before_publish(tmp)
                _publish(tmp, path, model, optimizer, step)
            except OSError as e:
                problem = f"checkpoint {path}: publishing it failed: {e}"
        _agree(problem, "the checkpoint's publication")


def before_publish(tmp: str) -> None:
    """Called on rank 0 with the written temporary directory, just before the manifest and the
    rename (nothing by default; the tests make it fail to show what a crash there leaves)."""


def _read_manifest(path: str) -> Dict:
    at = os.path.join(path, MANIFEST)
    if not os.path.isdir(path):
        raise CheckpointError(f"checkpoint {path}: no such directory")
    if not os.path.isfile(at):
        raise CheckpointError(f"checkpoint {path}: no {MANIFEST} (not a bytescale checkpoint, or one whose save "
                              f"did not finish)")
    try:
        with open(at) as f:
            manifest = json.load(f)
    except ValueError as e:
        raise CheckpointError(f"checkpoint {path}: {MANIFEST} is damaged: {e}") from e
    fmt = manifest.get("format") if isinstance(manifest, dict) else None
    if fmt != FORMAT:
        raise CheckpointError(f"checkpoint {path}: format {fmt!r}, this reader's is {FORMAT!r}")
    return manifest


def _check_files(path: str, manifest: Dict) -> None:
    """Every file of the manifest present with its size and CRC-32 (rank 0 reads them all)."""
    for name, want in manifest["files"].items():
        full = os.path.join(path, name)
        if not os.path.isfile(full):
            raise CheckpointError(f"checkpoint {path}: file {name} is missing")
        size = os.path.getsize(full)
        if size != want["size"]:
            raise CheckpointError(f"checkpoint {path}: file {name} holds {size} bytes, the manifest says "
                                  f"{want['size']} (damaged)")
        crc = _crc(full)
        if crc != want["crc32"]:
            raise CheckpointError(f"checkpoint {path}: file {name}: CRC-32 {crc:08x}, the manifest says "
                                  f"{want['crc32']:08x} (damaged)")


def _whole_shape(p) -> tuple:
    """A parameter's shape in the whole model: a TP shard's tp_full_shape, an FSDP piece's whole
    shape, a DTensor's global shape."""
    from .sharded import _whole
    return _whole(p)


def _check_model(path: str, model: nn.Module, optimizer, blob_state: bool) -> None:
    """The checkpoint holds every parameter and buffer of the model with its whole shape, the
    optimizer's state when one is asked for, and the pickled state (step, loader)."""
    from torch.distributed.checkpoint import FileSystemReader
    meta = FileSystemReader(path).read_metadata().state_dict_metadata
    entries = [(n, _whole_shape(p)) for n, p in model.named_parameters()]
    entries += [(n, tuple(b.shape)) for n, b in model.named_buffers()]
    for name, shape in entries:
        m = meta.get("model." + name)
        if m is None:
            raise CheckpointError(f"checkpoint {path}: no {name!r} in it: not this model's checkpoint")
        saved = tuple(getattr(m, "size", ()))
        if saved != shape:
            raise CheckpointError(f"checkpoint {path}: {name!r} has shape {saved} there, {shape} in the model: not "
                                  f"this model's checkpoint")
    if optimizer is not None and not any(k.startswith("optim.") for k in meta):
        raise CheckpointError(f"checkpoint {path}: it holds no optimizer state (saved without the optimizer)")
    if not blob_state:
        raise CheckpointError(f"checkpoint {path}: its state (step, loader) is missing")


def load(path, model: nn.Module, optimizer: Optional[torch.optim.Optimizer] = None, *, loader=None) -> Dict:
    """Read a checkpoint of `save` into the model (and the optimizer, and the loader) in place, on any
    world size and layout: each process reads its shards. Every process calls it. Returns
    {"step": ..., "extra": ..., "manifest": ...}. Refusals: module docstring."""
    from torch.distributed.checkpoint import FileSystemReader
    path = os.fspath(path)
    with guard.failing():
        problem, manifest = None, None
        try:
            manifest = _read_manifest(path)
            if _rank() == 0:
                _check_files(path, manifest)
            meta = FileSystemReader(path).read_metadata().state_dict_metadata
            _check_model(path, model, optimizer, any(k.startswith("extra." + _STATE_KEY) for k in meta))
        except CheckpointError as e:
            problem = str(e)
        except Exception as e:  # noqa: BLE001 - DCP's metadata unreadable: the same words on every rank
            problem = f"checkpoint {path}: unreadable: {type(e).__name__}: {e}"
        _agree(problem, "the checkpoint's check")
        state = pickle.loads(load_tp(path, model, optimizer)[_STATE_KEY])
        if loader is not None:
            if state["loader"] is None:
                raise CheckpointError(f"bytescale.torch: checkpoint {path}: it holds no loader state (saved "
                                      f"without loader=)")
            loader.load_state_dict(state["loader"])
    return {"step": state["step"], "extra": state["extra"], "manifest": manifest}
