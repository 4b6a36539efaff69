"""The C engine's checkpoint files (docs/model.md "Checkpoint files", docs/training.md "Checkpoints"):
read them into the torch model, and write files of the same layout.

A checkpoint is a set of named byte sections, each with a CRC-32, behind a checksummed table:

    0   8  magic "BSCKPT\\r\\n"        16  4  CRC-32 of the count * 80 table bytes
    8   4  version 1                  20  4  zero
    12  4  count of sections          24 + 80 i: name (64, NUL-padded), size (u64), CRC-32 (u32), zero (u32)
    then the sections' bytes in table order, back to back; the file ends there.

`bytescale train` writes the sections config (JSON: model shape, settings, dataset, run, step),
state (8 little-endian u64: step, Adam t, sampler seed, epoch, position, taken, n_docs, dataset
fingerprint), params, adam.m, adam.v (fp32, the model's flat layout, whole whatever the rank count).

    ck = read_checkpoint("run/ckpt-000100.bin")
    model = Llama(LlamaConfig.from_dict(ck.config["model"]))
    load_params(model, ck)                      # params -> model.flat
"""

from __future__ import annotations

import dataclasses
import json
import os
import struct
import tempfile
import zlib
from typing import Dict, List, Sequence, Tuple

import numpy as np
import torch

MAGIC = b"BSCKPT\r\n"
VERSION = 1
STATE_WORDS = ("step", "adam_t", "sampler_seed", "epoch", "position", "taken", "n_docs", "fingerprint")


class CheckpointError(ValueError):
    pass


@dataclasses.dataclass
class Checkpoint:
    """A checkpoint file's sections (name -> bytes, in file order), with views of the trainer's."""

    path: str
    sections: Dict[str, bytes]

    @property
    def config(self) -> dict:
        """The `config` section as JSON."""
        return json.loads(self.sections["config"].decode())

    @property
    def state(self) -> Dict[str, int]:
        """The `state` section's words by name."""
        raw = self.sections["state"]
        words = struct.unpack(f"<{len(raw) // 8}Q", raw)
        return dict(zip(STATE_WORDS, words))

    def floats(self, name: str) -> np.ndarray:
        """An fp32 section (params, adam.m, adam.v) as a NumPy array."""
        raw = self.sections[name]
        if len(raw) % 4:
            raise CheckpointError(f"{self.path}: section {name!r} holds {len(raw)} bytes, not fp32 values")
        return np.frombuffer(raw, dtype="<f4")


def read_checkpoint(path: str, required: Sequence[str] = ()) -> Checkpoint:
    """Read and verify a whole checkpoint file; refuses, naming the file, what `ckpt_load` refuses
    (truncation, magic, version, table and section checksums, names, trailing data, missing sections)."""
    path = os.fspath(path)
    with open(path, "rb") as f:
        raw = f.read()
    if len(raw) < 24:
        raise CheckpointError(f"{path}: truncated at byte {len(raw)}")
    if raw[:8] != MAGIC:
        raise CheckpointError(f"{path}: bad magic number")
    version, count, table_crc, _ = struct.unpack_from("<IIII", raw, 8)
    if version != VERSION:
        raise CheckpointError(f"{path}: unknown checkpoint version {version}")
    table_end = 24 + 80 * count
    if len(raw) < table_end:
        raise CheckpointError(f"{path}: truncated at byte {len(raw)}")
    if zlib.crc32(raw[24:table_end]) != table_crc:
        raise CheckpointError(f"{path}: checksum mismatch in the section table")
    entries: List[Tuple[str, int, int]] = []
    for i in range(count):
        at = 24 + 80 * i
        name_raw = raw[at:at + 64]
        name = name_raw.split(b"\0", 1)[0].decode("utf-8", "replace")
        size, crc = struct.unpack_from("<QI", raw, at + 64)
        if not name or any(name_raw[len(name):]) or name in {e[0] for e in entries}:
            raise CheckpointError(f"{path}: bad or duplicate section name {name!r}")
        entries.append((name, size, crc))
    expected = table_end + sum(s for _, s, _ in entries)
    if len(raw) < expected:
        raise CheckpointError(f"{path}: truncated at byte {len(raw)} (expected {expected} bytes)")
    if len(raw) > expected:
        raise CheckpointError(f"{path}: trailing data")
    sections, at = {}, table_end
    for name, size, crc in entries:
        blob = raw[at:at + size]
        if zlib.crc32(blob) != crc:
            raise CheckpointError(f"{path}: checksum mismatch in section \"{name}\"")
        sections[name] = blob
        at += size
    for name in required:
        if name not in sections:
            raise CheckpointError(f"{path}: missing required section \"{name}\"")
    return Checkpoint(path, sections)


def write_checkpoint(path: str, sections: Sequence[Tuple[str, bytes]]) -> None:
    """Write sections [(name, bytes)] in the same layout, atomically: a temporary file beside the
    target, fsync'ed, then renamed over it (a crash leaves the previous checkpoint whole)."""
    path = os.fspath(path)
    table = b""
    for name, blob in sections:
        nb = name.encode()
        if not 1 <= len(nb) <= 63:
            raise CheckpointError(f"section name {name!r}: 1 to 63 bytes")
        table += nb.ljust(64, b"\0") + struct.pack("<QII", len(blob), zlib.crc32(blob), 0)
    head = MAGIC + struct.pack("<IIII", VERSION, len(sections), zlib.crc32(table), 0)
    d = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(prefix=os.path.basename(path) + ".tmp.", dir=d)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(head)
            f.write(table)
            for _, blob in sections:
                f.write(blob)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    fsync_dir(d)  # the rename itself durable


def fsync_dir(d: str) -> None:
    """fsync directory d, so a rename into it survives a crash (where the file system lets a directory
    be opened; elsewhere nothing)."""
    try:
        fd = os.open(d, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
    except OSError:
        pass


def load_params(model, ck: Checkpoint) -> None:
    """Copy the checkpoint's `params` (the C engine's flat fp32 layout of the whole model) into
    model.flat; a part of the model (Llama(parallel=...)) takes its own pieces (full_index)."""
    p = ck.floats("params")
    whole = model.cfg.n_params
    if p.size != whole:
        raise CheckpointError(f"{ck.path}: {p.size} parameters, the model has {whole} "
                              f"({model.cfg.name or 'its shape'}): not this model's checkpoint")
    t = torch.from_numpy(p.copy())
    if model.flat.numel() != whole:
        t = t[model.full_index()]
    with torch.no_grad():
        model.flat.copy_(t.to(model.flat.dtype))


def model_config_json(cfg) -> dict:
    """The `config` section's model object for a LlamaConfig (the C trainer's fields)."""
    return {"name": cfg.name, "n_layers": cfg.n_layers, "n_heads": cfg.n_heads, "n_kv_heads": cfg.n_kv_heads,
            "d_model": cfg.d_model, "head_dim": cfg.head_dim, "d_ff": cfg.d_ff, "vocab_size": cfg.vocab_size,
            "n_experts": 1, "top_k": 1, "rope_theta": cfg.rope_theta, "norm_eps": cfg.norm_eps,
            "n_params": cfg.n_params}


def f32(t: torch.Tensor) -> bytes:
    """A tensor's values as little-endian fp32 bytes."""
    return t.detach().to("cpu", torch.float32).contiguous().numpy().astype("<f4").tobytes()
