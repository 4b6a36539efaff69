"""A prepared dataset (`bytescale prepare`, docs/data-format.md) read with NumPy, and a sampler.

    ds = Dataset("data/go-byte")               # index.bin + shards, checksums verified
    ds.read(doc, start, n)                     # up to n tokens of document doc from offset start
    sampler = Sampler(ds, tokens=32768, context=16384, seed=1337)
    batch = sampler.next()                     # a Batch of whole documents, long ones cut

The reader checks what docs/data-format.md says readers check (magic, version, sizes, header and
body CRC-32s, shard counts and checksums against the index, documents inside their shards) and
refuses with a message naming the file. Shards are memory-mapped; reading a range copies only it.
"""

from __future__ import annotations

import os
import struct
import zlib
from typing import List

import numpy as np

from .step import Batch, TokenSource

_WIDTH_DTYPE = {1: np.uint8, 2: np.uint16, 4: np.uint32}


class DatasetError(ValueError):
    pass


def _header(path: str, raw: bytes, magic: bytes) -> None:
    if len(raw) < 64:
        raise DatasetError(f"{path}: truncated: expected at least 64 bytes, got {len(raw)}")
    if raw[:8] != magic:
        raise DatasetError(f"{path}: bad magic number (not a bytescale {'index' if b'INDEX' in magic else 'shard'})")
    version = struct.unpack_from("<I", raw, 8)[0]
    if version != 1:
        raise DatasetError(f"{path}: unsupported version {version} (this reader reads 1)")
    if zlib.crc32(raw[:60]) != struct.unpack_from("<I", raw, 60)[0]:
        raise DatasetError(f"{path}: header checksum mismatch")


class Dataset(TokenSource):
    """A prepared dataset: `n_docs` documents, `doc_len`, `doc_offset` (global token offsets, the
    `src` of a batch sequence), `vocab`, `tokenizer` (1 byte, 2 gpt2, 3 cl100k, 4 o200k, 5 hf:
    TOKENIZERS names them); read(doc, start, n)."""

    TOKENIZERS = {1: "byte", 2: "gpt2", 3: "cl100k", 4: "o200k", 5: "hf"}

    def __init__(self, path: str, verify: bool = True):
        self.path = os.fspath(path)
        ipath = os.path.join(self.path, "index.bin")
        if not os.path.exists(ipath):
            raise DatasetError(f"{self.path}: no index.bin: prepare the dataset first (bytescale prepare --out "
                               f"{self.path})")
        with open(ipath, "rb") as f:
            raw = f.read()
        _header(ipath, raw, b"BSINDEX\0")
        tok, vocab, width, n_shards, flags = struct.unpack_from("<IIIII", raw, 12)
        n_docs, n_tokens, body_bytes = struct.unpack_from("<QQQ", raw, 32)
        if len(raw) != 64 + body_bytes:
            raise DatasetError(f"{ipath}: truncated: expected {64 + body_bytes} bytes, got {len(raw)}")
        if verify and zlib.crc32(raw[64:]) != struct.unpack_from("<I", raw, 56)[0]:
            raise DatasetError(f"{ipath}: index body checksum mismatch")
        if width not in _WIDTH_DTYPE:
            raise DatasetError(f"{ipath}: token width {width} (1, 2 or 4)")
        self.tokenizer, self.vocab, self.width = tok, vocab, width
        self.n_docs, self.n_tokens = n_docs, n_tokens
        at = 64
        self.shards: List[np.ndarray] = []
        shard_base = [0]
        for s in range(n_shards):
            name = raw[at:at + 48].split(b"\0", 1)[0].decode()
            count, crc = struct.unpack_from("<QI", raw, at + 48)
            at += 64
            spath = os.path.join(self.path, name)
            with open(spath, "rb") as f:
                head = f.read(64)
            _header(spath, head, b"BSSHARD\0")
            stok, svocab, swidth, scount, scrc = struct.unpack_from("<IIIQI", head, 12)
            if (stok, svocab, swidth, scount, scrc) != (tok, vocab, width, count, crc):
                raise DatasetError(f"{spath}: does not match the index (tokenizer, vocabulary, width, token count "
                                   "or checksum): a shard left over from another prepare run?")
            if os.path.getsize(spath) != 64 + count * width:
                raise DatasetError(f"{spath}: truncated: expected {64 + count * width} bytes, got "
                                   f"{os.path.getsize(spath)}")
            mm = np.memmap(spath, dtype=_WIDTH_DTYPE[width], mode="r", offset=64, shape=(count,)) if count else \
                np.zeros(0, _WIDTH_DTYPE[width])
            if verify and zlib.crc32(mm) != crc:
                raise DatasetError(f"{spath}: payload checksum mismatch")
            self.shards.append(mm)
            shard_base.append(shard_base[-1] + count)
        table = np.frombuffer(raw, dtype=np.dtype([("shard", "<u4"), ("zero", "<u4"), ("start", "<u8"),
                                                   ("len", "<u8")]), count=n_docs, offset=at)
        self.doc_shard = table["shard"].astype(np.int64)
        self.doc_start = table["start"].astype(np.int64)  # in its shard
        self.doc_len = table["len"].astype(np.int64)
        if n_docs and (self.doc_shard.max() >= n_shards):
            raise DatasetError(f"{ipath}: a document names shard {int(self.doc_shard.max())} of {n_shards}")
        ends = self.doc_start + self.doc_len
        counts = np.array([len(s) for s in self.shards], np.int64)
        if n_docs and (ends > counts[self.doc_shard]).any():
            bad = int(np.nonzero(ends > counts[self.doc_shard])[0][0])
            raise DatasetError(f"{ipath}: document {bad} points past the end of its shard")
        self.doc_offset = np.asarray(shard_base, np.int64)[self.doc_shard] + self.doc_start  # global offsets

    def read(self, doc: int, start: int, n: int) -> np.ndarray:
        """Tokens [start, start + n) of document doc, clipped to the document (int64)."""
        if not 0 <= doc < self.n_docs:
            raise IndexError(f"{self.path}: document {doc} of {self.n_docs}")
        end = min(int(self.doc_len[doc]), start + n)
        s = self.shards[int(self.doc_shard[doc])]
        base = int(self.doc_start[doc])
        return np.asarray(s[base + start:base + max(start, end)], dtype=np.int64)

    def doc_length(self, doc: int) -> int:
        return int(self.doc_len[doc])

    def max_token(self) -> int:
        """The highest token id in the shards (-1 when there are none): below `vocab` in a sound
        dataset (prepare checks every id it writes)."""
        return max((int(s.max()) for s in self.shards if len(s)), default=-1)


class Sampler:
    """Global batches of exactly `tokens` tokens: documents in a seeded random order (a fresh order
    each epoch, empty documents skipped); the document that crosses the budget is split and its rest
    starts the next batch; pieces longer than `context` are cut into context-long sequences. The
    same scheme as the C sampler (docs/training.md), not its exact order. `state()` / `restore()` for
    checkpoints."""

    def __init__(self, ds: Dataset, tokens: int, context: int, seed: int = 1337):
        self.ds, self.tokens, self.context, self.seed = ds, int(tokens), int(context), int(seed)
        self.epoch, self.pos, self.taken = 0, 0, 0
        self._order = self._make_order()

    def _make_order(self) -> np.ndarray:
        rng = np.random.default_rng([self.seed, self.epoch])
        docs = np.nonzero(self.ds.doc_len > 0)[0]
        return docs[rng.permutation(len(docs))]

    def next(self) -> Batch:
        docs, starts, lengths = [], [], []
        need = self.tokens
        while need > 0:
            if self.pos >= len(self._order):
                self.epoch, self.pos = self.epoch + 1, 0
                self._order = self._make_order()
            d = int(self._order[self.pos])
            left = int(self.ds.doc_len[d]) - self.taken
            n = min(left, need)
            at = self.taken
            while n > 0:  # cut to the context
                piece = min(n, self.context)
                docs.append(d), starts.append(at), lengths.append(piece)
                at, n, need = at + piece, n - piece, need - piece
            self.taken = at
            if self.taken >= int(self.ds.doc_len[d]):
                self.pos, self.taken = self.pos + 1, 0
        return Batch(docs, starts, lengths)

    def state(self) -> dict:
        return {"seed": self.seed, "epoch": self.epoch, "pos": self.pos, "taken": self.taken}

    def restore(self, st: dict) -> None:
        self.seed, self.epoch, self.pos, self.taken = int(st["seed"]), int(st["epoch"]), int(st["pos"]), int(st["taken"])
        self._order = self._make_order()
