"""A data loader for HDP: a user's dataset in, each rank's micro-batches of every step out, read ahead
in a background thread (docs/torch-data.md).

    loader = HDPLoader(data, tokens=4096, capacity=512, seed=1)   # every rank, at the same point
    for step in loader:                                           # a LoaderStep per step
        trainer.step(step.plan, step.microbatches)                # or the user's own loop over them
    state = loader.state_dict()                                   # what the trainer consumed

`data` is a map-style torch Dataset of 1-D token tensors, a Hugging Face `datasets.Dataset` (a
token-id column, or a text column and a tokenizer), or a prepared bytescale Dataset (as_source). Each
step rank 0 draws the global batch by a token budget (documents in a seeded order, epoch after
epoch) and plans it for the HDP ranks; every rank gets the plan (broadcast_plan), reads its own
tokens (microbatches) and checks the plan (check_plan), all in the loader's thread, k steps ahead of
the one training. The thread's collectives run on a gloo group of their own, made when the loader
is, so they never interleave with the training thread's. An error there (a bad document, a plan
that cannot be made, a rank that cannot read) is raised by next() on every rank, at the step it
belongs to. The state is a position in the seeded document order, the same on every rank whatever
the world size: a checkpoint of 2 processes resumes on 3 with the same global batches.
"""

from __future__ import annotations

import atexit
import collections
import dataclasses
import datetime
import queue
import threading
import time
import weakref
from collections.abc import Mapping
from typing import Any, Callable, Deque, List, Optional, Tuple

import numpy as np
import torch
import torch.distributed as dist

from . import guard
from .check import Reading, check_plan
from .step import Batch, MicroBatches, PlanError, StepPlan, TokenSource, broadcast_plan, microbatches, plan_step


class DocumentError(ValueError):
    """A document of the user's dataset is not a 1-D sequence of token ids in the vocabulary."""


class LoaderError(PlanError):
    """The loader could not make a step (a rank could not read its tokens, a state that does not fit):
    raised on every rank with the same message (a PlanError: every rank raises it itself)."""


# -- token sources: a user's dataset as read(doc, start, n) / doc_length(doc) -------------------------


def tokens_of(value, where: str, vocab: Optional[int] = None) -> np.ndarray:
    """`value` (a tensor, array or list) as an int64 array of token ids, or DocumentError naming `where`:
    a document must be 1-D, of an integer type, every id >= 0 and below `vocab` (when given). Checked
    once per document read, so a bad id fails where it is drawn, not as an index error in the model."""
    if isinstance(value, torch.Tensor):
        if value.dtype.is_floating_point or value.dtype.is_complex or value.dtype == torch.bool:
            raise DocumentError(f"{where}: a tensor of {value.dtype}: token ids are integers")
        value = value.detach().cpu().numpy()
    arr = np.asarray(value)
    if arr.ndim != 1:
        raise DocumentError(f"{where}: shape {tuple(arr.shape)}: a document is a 1-D sequence of token ids")
    if arr.size == 0:
        return np.zeros(0, np.int64)
    if arr.dtype.kind not in "iu":
        raise DocumentError(f"{where}: values of type {arr.dtype}: token ids are integers")
    if arr.dtype.kind == "i" and int(arr.min()) < 0:
        i = int(np.argmax(arr < 0))
        raise DocumentError(f"{where}: token {int(arr[i])} at offset {i}: token ids are >= 0")
    if vocab is not None and int(arr.max()) >= vocab:
        i = int(np.argmax(arr >= vocab))
        raise DocumentError(f"{where}: token {int(arr[i])} at offset {i} is outside the vocabulary of {vocab} "
                            f"(ids 0..{vocab - 1})")
    return arr.astype(np.int64, copy=False)


class DocumentSource(TokenSource):
    """A TokenSource over a dataset whose item `doc` is one whole document (`_item(doc)`, subclasses):
    a document is fetched and checked (tokens_of) when it is first needed, its length kept (8 bytes a
    document), its tokens kept in a small LRU cache (`cache` documents: the planning rank asks a
    document's length and then reads it), never the whole corpus."""

    def __init__(self, n_docs: int, vocab: Optional[int], name: str, cache: int = 256):
        if n_docs < 1:
            raise DocumentError(f"{name}: an empty dataset (no documents)")
        self.n_docs, self.vocab, self.name = int(n_docs), vocab, name
        self._lengths = np.full(self.n_docs, -1, np.int64)  # -1: not read yet
        self._cache: "collections.OrderedDict[int, np.ndarray]" = collections.OrderedDict()
        self._cache_size = max(1, int(cache))

    def _item(self, doc: int):
        raise NotImplementedError

    def document(self, doc: int) -> np.ndarray:
        """Document `doc`'s tokens (int64), checked."""
        if not 0 <= doc < self.n_docs:
            raise IndexError(f"{self.name}: document {doc} of {self.n_docs}")
        got = self._cache.get(doc)
        if got is not None:
            self._cache.move_to_end(doc)
            return got
        got = tokens_of(self._item(doc), f"{self.name}, document {doc}", self.vocab)
        self._lengths[doc] = len(got)
        self._cache[doc] = got
        if len(self._cache) > self._cache_size:
            self._cache.popitem(last=False)
        return got

    def read(self, doc: int, start: int, n: int) -> np.ndarray:
        return self.document(int(doc))[int(start):int(start) + int(n)]

    def doc_length(self, doc: int) -> int:
        doc = int(doc)
        if 0 <= doc < self.n_docs and self._lengths[doc] >= 0:
            return int(self._lengths[doc])
        return len(self.document(doc))


def _pick(item, column: Optional[str], where: str):
    """A dataset item's tokens: the item itself, or its `column` when it is a mapping (a dict item)."""
    if isinstance(item, Mapping):
        key = column or "input_ids"
        if key not in item:
            raise DocumentError(f"{where}: the item has no {key!r} (it has {sorted(map(str, item))}): name the "
                                f"token column with column=")
        return item[key]
    if isinstance(item, (tuple, list)) and item and isinstance(item[0], torch.Tensor):
        return item[0]  # (tokens, ...) tuples of a TensorDataset
    return item


class TorchSource(DocumentSource):
    """A map-style torch.utils.data.Dataset whose item i is document i: a 1-D tensor (or array, or list)
    of token ids, or a dict holding one under `column` (default "input_ids")."""

    def __init__(self, dataset, *, column: Optional[str] = None, vocab: Optional[int] = None, cache: int = 256):
        if isinstance(dataset, torch.utils.data.IterableDataset) or not hasattr(dataset, "__len__"):
            raise TypeError(f"{type(dataset).__name__}: the loader draws documents in a seeded order, so it needs "
                            f"a map-style dataset (__getitem__ and __len__), not an iterable one")
        self.dataset, self.column = dataset, column
        super().__init__(len(dataset), vocab, f"the dataset ({type(dataset).__name__})", cache)

    def _item(self, doc: int):
        return _pick(self.dataset[doc], self.column, f"{self.name}, item {doc}")


class HFSource(DocumentSource):
    """A Hugging Face datasets.Dataset (for example datasets.load_dataset("json" | "parquet",
    data_files=..., split="train"): Arrow files mapped, not loaded): row i is document i, its token ids
    in `column` (default "input_ids"), or, with a `tokenizer` (a callable: text -> token ids, or a
    mapping with "input_ids" as a Hugging Face tokenizer returns), its text in `column` (default
    "text"). The lengths of a token column come from Arrow's list lengths without reading a token."""

    def __init__(self, dataset, *, column: Optional[str] = None, tokenizer: Optional[Callable] = None,
                 vocab: Optional[int] = None, cache: int = 256):
        name = "the Hugging Face dataset"
        if isinstance(getattr(dataset, "column_names", None), dict):  # a DatasetDict: {split: columns}
            raise TypeError(f"a DatasetDict with splits {list(dataset.keys())}: pass one split (ds['train'])")
        if not hasattr(dataset, "column_names") or not hasattr(dataset, "__len__"):
            raise TypeError(f"{type(dataset).__name__}: a map-style datasets.Dataset (an IterableDataset has no "
                            f"seeded order to draw from)")
        self.tokenizer = tokenizer
        self.column = column or ("text" if tokenizer is not None else "input_ids")
        if self.column not in dataset.column_names:
            hint = "" if tokenizer is not None else "; a text column needs tokenizer="
            raise DocumentError(f"{name}: no column {self.column!r} (its columns: {dataset.column_names}): name "
                                f"the token column with column={hint}")
        self._rows = dataset.with_format("numpy", columns=[self.column]) if tokenizer is None else dataset
        super().__init__(len(dataset), vocab, name, cache)
        if tokenizer is None:
            self._check_feature(dataset.features[self.column])
            if getattr(dataset, "_indices", None) is None:  # no index mapping: lengths straight from Arrow
                import pyarrow.compute as pc
                lengths = pc.list_value_length(dataset.data.column(self.column)).to_numpy(zero_copy_only=False)
                if np.isnan(np.asarray(lengths, dtype=np.float64)).any():
                    raise DocumentError(f"{name}: column {self.column!r} has missing (null) rows")
                self._lengths[:] = np.asarray(lengths, np.int64)

    def _check_feature(self, feature) -> None:
        """A token column is a list of integers: say so at once for a column of another type."""
        inner = getattr(feature, "feature", None)
        dtype = str(getattr(inner, "dtype", getattr(feature, "dtype", "")))
        if inner is None:
            raise DocumentError(f"{self.name}: column {self.column!r} holds {dtype or type(feature).__name__}, not "
                                f"lists of token ids (a text column needs tokenizer=)")
        if dtype and not dtype.startswith(("int", "uint")):
            raise DocumentError(f"{self.name}: column {self.column!r} holds lists of {dtype}: token ids are "
                                f"integers")

    def _item(self, doc: int):
        value = self._rows[doc][self.column]
        if self.tokenizer is None:
            return value
        if not isinstance(value, str):
            raise DocumentError(f"{self.name}, row {doc}: column {self.column!r} holds {type(value).__name__}, not "
                                f"text to tokenize")
        out = self.tokenizer(value)
        return out["input_ids"] if isinstance(out, Mapping) else out


class PreparedSource(TokenSource):
    """A prepared bytescale Dataset (data.py; `bytescale prepare` checked every id below its vocabulary):
    read straight from its memory-mapped shards, lengths from its index. A `vocab` smaller than the
    dataset's is checked against the largest id in the shards once."""

    def __init__(self, ds, vocab: Optional[int] = None):
        if ds.n_docs < 1:
            raise DocumentError(f"{ds.path}: an empty dataset (no documents)")
        if vocab is not None and ds.vocab > vocab and ds.max_token() >= vocab:
            raise DocumentError(f"{ds.path}: token {ds.max_token()} is outside the vocabulary of {vocab} (the "
                                f"dataset's tokenizer has {ds.vocab})")
        self.ds, self.n_docs, self.vocab = ds, int(ds.n_docs), vocab if vocab is not None else int(ds.vocab)

    def read(self, doc, start, n):
        return self.ds.read(int(doc), int(start), int(n))

    def doc_length(self, doc):
        if not 0 <= int(doc) < self.n_docs:
            raise IndexError(f"{self.ds.path}: document {doc} of {self.n_docs}")
        return self.ds.doc_length(int(doc))


def as_source(data, *, column: Optional[str] = None, tokenizer: Optional[Callable] = None,
              vocab: Optional[int] = None) -> TokenSource:
    """The TokenSource of `data` (with `n_docs`): a prepared bytescale Dataset, a Hugging Face
    datasets.Dataset, a map-style torch Dataset, or a TokenSource that has `n_docs` already."""
    from .data import Dataset as Prepared

    if isinstance(data, Prepared):
        return PreparedSource(data, vocab)
    if isinstance(data, TokenSource):
        if not hasattr(data, "n_docs"):
            raise TypeError(f"{type(data).__name__}: a TokenSource for the loader needs n_docs (its documents are "
                            f"0..n_docs-1)")
        return data
    if type(data).__module__.startswith("datasets") or hasattr(data, "column_names"):
        return HFSource(data, column=column, tokenizer=tokenizer, vocab=vocab)
    if tokenizer is not None:
        raise TypeError("tokenizer= is for a Hugging Face dataset's text column; a torch Dataset gives token ids")
    return TorchSource(data, column=column, vocab=vocab)


# -- global batches by a token budget ----------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Cursor:
    """A position in the seeded document order: `epoch`, the index `pos` in that epoch's order, and the
    tokens `taken` of the document there (a document split by the budget goes on in the next batch).
    Nothing of the world: the same position draws the same batches on any number of processes."""

    epoch: int = 0
    pos: int = 0
    taken: int = 0


class BudgetSampler:
    """Global batches of exactly `tokens` tokens: documents 0..n_docs-1 in a seeded random order (a
    fresh one each epoch, from numpy's generator seeded with (seed, epoch)), empty ones skipped; the
    document that crosses the budget is split and its rest starts the next batch; with a `context`,
    pieces longer than it are cut into context-long sequences (positions restart in each). The
    scheme of data.Sampler and the C sampler (docs/training.md), over any TokenSource: a document's
    length is asked only when the order reaches it."""

    def __init__(self, source: TokenSource, n_docs: int, tokens: int, context: Optional[int], seed: int):
        self.source, self.n_docs, self.tokens, self.context, self.seed = source, int(n_docs), int(tokens), context, int(seed)
        self.cursor = Cursor()
        self._order: Tuple[int, Optional[np.ndarray]] = (-1, None)

    def order(self, epoch: int) -> np.ndarray:
        """Epoch `epoch`'s document order (kept for the current epoch)."""
        if self._order[0] != epoch:
            self._order = (epoch, np.random.default_rng([self.seed, epoch]).permutation(self.n_docs))
        return self._order[1]

    def next(self) -> Batch:
        docs, starts, lengths = [], [], []
        need = self.tokens
        epoch, pos, taken = self.cursor.epoch, self.cursor.pos, self.cursor.taken
        empty = 0  # documents skipped in a row for having no tokens
        while need > 0:
            if pos >= self.n_docs:
                epoch, pos = epoch + 1, 0
            d = int(self.order(epoch)[pos])
            size = self.source.doc_length(d)
            n = min(size - taken, need)
            if n <= 0:
                empty += 1
                if empty >= self.n_docs:
                    raise DocumentError(f"every one of the {self.n_docs} documents is empty: nothing to draw")
                pos, taken = pos + 1, 0
                continue
            empty, at = 0, taken
            while n > 0:  # cut to the context
                piece = n if self.context is None else min(n, self.context)
                docs.append(d), starts.append(at), lengths.append(piece)
                at, n, need = at + piece, n - piece, need - piece
            taken = at
            if taken >= size:
                pos, taken = pos + 1, 0
        self.cursor = Cursor(epoch, pos, taken)
        return Batch(docs, starts, lengths)


# -- what the thread makes, what a step yields ------------------------------------------------------


@dataclasses.dataclass
class LoaderPlan(StepPlan):
    """A StepPlan as the loader broadcasts it: with the step's index, the global batch it plans, and
    the cursor after it (what every rank's state becomes once the step is consumed). The check's
    fingerprint covers the StepPlan's fields only: the same plan whichever loader made it."""

    step: int = 0
    cursor: Cursor = Cursor()
    batch: Optional[Batch] = None


@dataclasses.dataclass
class LoaderStep:
    """One step of this rank: `plan` (every rank's), `microbatches` (this rank's, in the global order,
    checked: HDPTrainer.step takes them as they are), the global `batch`. Each MicroBatch has tokens,
    targets (the next token of the document, -1 at its end), pos and position_ids (1, T), cu_seqlens
    (a pack's segment boundaries). Iterating a LoaderStep iterates its micro-batches."""

    step: int
    plan: LoaderPlan
    microbatches: MicroBatches
    read_s: float
    wait_s: float

    @property
    def batch(self) -> Batch:
        return self.plan.batch

    @property
    def labelled(self) -> int:
        """The loss's denominator: labelled tokens of the whole global batch."""
        return self.plan.labelled

    def __iter__(self):
        return iter(self.microbatches)

    def __len__(self):
        return len(self.microbatches)


@dataclasses.dataclass
class StepStats:
    """The loader's record of one step consumed: read_s, the seconds its thread took to make it (draw,
    plan, broadcast, read, check); wait_s, the seconds next() waited for it; ready, whether it was
    already made when next() was called (then wait_s is only the hand-over)."""

    step: int
    read_s: float
    wait_s: float
    ready: bool


@dataclasses.dataclass
class _Made:
    step: int
    plan: LoaderPlan
    mbs: MicroBatches
    read_s: float


@dataclasses.dataclass
class _Failed:
    step: int
    error: BaseException


_END = object()  # the thread made the last step (steps=)
_open: "weakref.WeakSet[HDPLoader]" = weakref.WeakSet()  # closed at interpreter exit
_EXIT_JOIN_S = 5.0  # at exit a thread still in a collective (a peer gone) is left behind after this
_POLL_S = 0.05


def _close_all() -> None:
    for loader in list(_open):
        loader.close(join_s=_EXIT_JOIN_S)


# -- the loader -----------------------------------------------------------------------------------------


class HDPLoader:
    """Each rank's micro-batches of every step, read `prefetch` steps ahead in a background thread.

    data        a map-style torch Dataset, a Hugging Face datasets.Dataset, a prepared bytescale
                Dataset or a TokenSource with n_docs (as_source; `column`, `tokenizer`, `vocab` go there)
    tokens      the global batch's token budget (exactly this many tokens a step)
    capacity    tokens per rank per micro-batch, the planner's capacity
    context     cut pieces longer than this into sequences of their own (None: documents whole)
    seed        the document order's seed (epoch e: numpy's generator seeded with (seed, e))
    policy, plan_args   the planner's (plan_step)
    prefetch    steps made ahead of the one consumed (>= 1)
    steps       stop after this many steps in all (None: go on, epoch after epoch)
    layout      a parallel.Layout: plan for its HDP ranks, read this process's HDP rank's share
    device, ring_stats  where the micro-batches' tensors go; the RingStats their rings count into
                (HDPTrainer's ring_stats)

    Every rank makes it at the same point (it makes a process group, a collective) and consumes the
    same steps; close() (or `with`, or the interpreter's exit) stops the thread."""

    def __init__(self, data, *, tokens: int, capacity: int, context: Optional[int] = None, seed: int = 0,
                 policy: str = "elastic", prefetch: int = 2, steps: Optional[int] = None,
                 column: Optional[str] = None, tokenizer: Optional[Callable] = None, vocab: Optional[int] = None,
                 layout=None, device=None, ring_stats=None, **plan_args):
        for name, v, low in (("tokens", tokens, 1), ("capacity", capacity, 1), ("prefetch", prefetch, 1),
                             ("context", context, 1), ("steps", steps, 0)):
            if v is not None and (not isinstance(v, (int, np.integer)) or isinstance(v, bool) or v < low):
                raise ValueError(f"HDPLoader: {name}={v!r}: an integer >= {low}")
        self.source = as_source(data, column=column, tokenizer=tokenizer, vocab=vocab)
        self.n_docs = int(self.source.n_docs)
        self.tokens, self.capacity, self.context, self.seed = int(tokens), int(capacity), context, int(seed)
        self.policy, self.prefetch, self.steps, self.plan_args = policy, int(prefetch), steps, plan_args
        self.layout, self.device, self.ring_stats = layout, device, ring_stats
        self._distributed = dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1
        world = dist.get_world_size() if self._distributed else 1
        self.hdp = int(layout.hdp) if layout is not None else world
        self.rank = int(layout.hdp_rank) if layout is not None else (dist.get_rank() if self._distributed else 0)
        self.group = None
        guard.install()  # first: its exit handler (destroying the groups) runs after ours (last in, first out)
        if self._distributed:  # the thread's collectives: a group of their own (collective: every rank, now)
            self.group = dist.new_group(backend="gloo", timeout=datetime.timedelta(seconds=guard.timeout()))
        self.stats: Deque[StepStats] = collections.deque(maxlen=100_000)
        self._step, self._cursor = 0, Cursor()  # what the trainer consumed
        self._thread: Optional[threading.Thread] = None
        self._failed: Optional[_Failed] = None
        self._closed = False
        if not getattr(_close_all, "registered", False):
            atexit.register(_close_all)
            _close_all.registered = True
        _open.add(self)

    # -- the thread ----------------------------------------------------------------------------------

    def start(self) -> None:
        """Start reading ahead now (the first next() does it otherwise): after load_state_dict, so the
        first steps are made while the model is set up. Every rank, like next()."""
        if self._closed:
            raise RuntimeError("HDPLoader: closed")
        if self._thread is not None:
            return
        self._stop, self._slots, self._queue = threading.Event(), threading.Semaphore(self.prefetch), queue.Queue()
        self._failed = None
        self._thread = threading.Thread(target=self._run, name="bytescale-loader", daemon=True,
                                        args=(self._step, self._cursor, self._stop, self._slots, self._queue))
        self._thread.start()

    def _run(self, step: int, cursor: Cursor, stop: threading.Event, slots: threading.Semaphore,
             out: "queue.Queue") -> None:
        """Make steps `step`, `step` + 1, ... into `out`, at most `prefetch` ahead of the consumer (a
        slot per step). A stop is obeyed only while no slot is free: every rank's thread, with the
        same steps consumed, has then made the same steps, so none is left alone in a collective."""
        sampler = BudgetSampler(self.source, self.n_docs, self.tokens, self.context, self.seed)
        sampler.cursor = cursor
        while self.steps is None or step < self.steps:
            while not slots.acquire(timeout=_POLL_S):
                if stop.is_set():
                    return
            t0 = time.perf_counter()
            try:
                plan, mbs = self._make(step, sampler)
            except BaseException as e:  # next() raises it, on every rank (the errors below are agreed)
                out.put(_Failed(step, e))
                return
            out.put(_Made(step, plan, mbs, time.perf_counter() - t0))
            step += 1
        out.put(_END)

    def _make(self, step: int, sampler: BudgetSampler) -> Tuple[LoaderPlan, MicroBatches]:
        """One step, on every rank: rank 0 draws and plans it (its error: PlanError everywhere), every
        rank reads its share (an error reading: LoaderError everywhere), then the plan check."""

        def draw_and_plan() -> LoaderPlan:
            batch = sampler.next()
            p = plan_step(batch, self.source, ranks=self.hdp, capacity=self.capacity, policy=self.policy,
                          **self.plan_args)
            fields = {f.name: getattr(p, f.name) for f in dataclasses.fields(StepPlan)}
            return LoaderPlan(**fields, step=step, cursor=sampler.cursor, batch=batch)

        plan = broadcast_plan(draw_and_plan, group=self.group)
        sampler.cursor = plan.cursor  # rank 0's: every rank's thread goes on from the same place
        err, mbs = "", MicroBatches()
        try:
            mbs = microbatches(plan, self.rank, self.source, self.device, self.ring_stats, check=False,
                               layout=self.layout)
        except Exception as e:  # not raised alone: the peers would wait in the check for this rank
            err = guard.describe(e)
        self._agree(step, plan.step, err)
        check_plan(plan, self.rank, hdp=self.hdp if self.layout is not None else None,
                   reading=Reading(labelled=sum(mb.labelled for mb in mbs)), group=self.group)
        mbs.checked = plan
        return plan, mbs

    def _agree(self, step: int, planned: int, err: str) -> None:
        """Every rank's reading error and step count, gathered on the loader's group: a rank that could not
        read its tokens, or ranks at different steps (different states loaded), raise LoaderError on
        every rank with the same message."""
        rows: List[Any] = [(step, err)]
        if self._distributed:
            rows = [None] * dist.get_world_size()
            with guard.waiting("the loader's read check"):
                dist.all_gather_object(rows, (step, err), group=self.group)
        bad = [(r, e) for r, (_, e) in enumerate(rows) if e]
        if bad:
            more = f" (and {len(bad) - 1} more ranks)" if len(bad) > 1 else ""
            raise LoaderError(f"bytescale.torch.loader: step {planned}: rank {bad[0][0]} could not read its tokens: "
                              f"{bad[0][1]}{more}")
        at = sorted({(s, r) for r, (s, _) in enumerate(rows)})
        if len({s for s, _ in at}) > 1 or at[0][0] != planned:
            per = ", ".join(f"rank {r}: {s}" for s, r in at)
            raise LoaderError(f"bytescale.torch.loader: the ranks' loaders are at different steps ({per}; rank 0 "
                              f"planned step {planned}): load the same state on every rank and consume the same "
                              f"steps")

    # -- the training thread's side -----------------------------------------------------------------

    def __iter__(self):
        return self

    def __next__(self) -> LoaderStep:
        """The next step's micro-batches; waits only if the thread has not made it yet (StepStats). An
        error the thread met making it is raised here, on every rank; StopIteration after `steps`."""
        if self._closed:
            raise RuntimeError("HDPLoader: closed")
        if self._failed is not None:
            raise self._failed.error
        if self._thread is None:
            self.start()
        t0 = time.perf_counter()
        ready = not self._queue.empty()
        while True:
            try:
                got = self._queue.get(timeout=_POLL_S)
                break
            except queue.Empty:
                if not self._thread.is_alive() and self._queue.empty():
                    raise RuntimeError("HDPLoader: the loader's thread ended without a step or an error") from None
        wait = time.perf_counter() - t0
        if got is _END:
            self._queue.put(_END)
            raise StopIteration
        if isinstance(got, _Failed):
            self._failed = got
            raise got.error
        self._slots.release()
        self._step, self._cursor = got.plan.step + 1, got.plan.cursor
        self.stats.append(StepStats(got.step, got.read_s, wait, ready))
        return LoaderStep(got.step, got.plan, got.mbs, got.read_s, wait)

    @property
    def prefetched(self) -> int:
        """Steps made and not consumed yet (at most `prefetch`)."""
        if self._thread is None:
            return 0
        with self._queue.mutex:  # the thread appends meanwhile
            return sum(1 for x in self._queue.queue if isinstance(x, _Made))

    @property
    def step(self) -> int:
        """The index of the next step next() returns (steps consumed so far, a resumed run's included)."""
        return self._step

    def summary(self) -> dict:
        """The record so far: steps, the read time per step (mean, max), the wait in next() (mean, max;
        the first step's apart: nothing could be read ahead of it), the share of the later steps that
        were ready when asked."""
        rows = list(self.stats)
        later = rows[1:]
        mean = lambda xs: float(np.mean(xs)) if xs else 0.0
        return {"steps": len(rows), "read_s": mean([r.read_s for r in rows]),
                "read_max_s": max((r.read_s for r in rows), default=0.0),
                "first_wait_s": rows[0].wait_s if rows else 0.0, "wait_s": mean([r.wait_s for r in later]),
                "wait_max_s": max((r.wait_s for r in later), default=0.0),
                "ready": mean([float(r.ready) for r in later])}

    # -- state ------------------------------------------------------------------------------------------

    def state_dict(self) -> dict:
        """What the trainer consumed: the next step's index and the cursor after the last step consumed
        (steps made ahead are not in it: a resume makes them again), with what the order depends on
        (seed, budget, context, document count), checked by load_state_dict. Plain integers, the same
        on every rank and for any world size."""
        c = self._cursor
        return {"version": 1, "seed": self.seed, "tokens": self.tokens, "context": self.context or 0,
                "n_docs": self.n_docs, "step": self._step, "epoch": c.epoch, "pos": c.pos, "taken": c.taken}

    def load_state_dict(self, state: dict) -> None:
        """Go on from `state` (state_dict's, of a run with any world size): the next step is its `step`,
        drawn from its cursor. Every rank loads the same state at the same point; steps already made
        ahead are dropped (the thread stops and starts again from the state)."""
        want = {"seed": self.seed, "tokens": self.tokens, "context": self.context or 0, "n_docs": self.n_docs}
        missing = [k for k in ("version", "step", "epoch", "pos", "taken", *want) if k not in state]
        if missing:
            raise ValueError(f"HDPLoader.load_state_dict: the state has no {', '.join(missing)}: not a loader's "
                             f"state_dict()")
        differ = [f"{k} {int(state[k])} (this loader: {v})" for k, v in want.items() if int(state[k]) != v]
        if differ:
            raise ValueError(f"HDPLoader.load_state_dict: the state is of another order: {'; '.join(differ)}; "
                             f"make the loader with the state's seed, tokens and context, over the same dataset")
        if int(state["version"]) != 1:
            raise ValueError(f"HDPLoader.load_state_dict: state version {state['version']} (this loader reads 1)")
        self._halt(join_s=None)
        self._step = int(state["step"])
        self._cursor = Cursor(int(state["epoch"]), int(state["pos"]), int(state["taken"]))
        if not (0 <= self._cursor.pos <= self.n_docs and self._cursor.epoch >= 0 and self._cursor.taken >= 0):
            raise ValueError(f"HDPLoader.load_state_dict: cursor {self._cursor} outside the {self.n_docs} documents")

    # -- the end ------------------------------------------------------------------------------------------

    def _halt(self, join_s: Optional[float]) -> None:
        """Stop the thread (it leaves once every slot is taken: see _run) and drop what it made."""
        if self._thread is not None:
            self._stop.set()
            self._thread.join(timeout=join_s if join_s is not None else guard.timeout() + 5.0)
            self._thread = None
        self._failed = None

    def close(self, join_s: Optional[float] = None) -> None:
        """Stop the thread (every rank, after the same steps). The loader's group stays until the default
        group is destroyed (launch.finish, or at exit)."""
        if self._closed:
            return
        self._halt(join_s)
        self._closed = True
        _open.discard(self)

    def __enter__(self) -> "HDPLoader":
        return self

    def __exit__(self, kind, value, tb) -> None:
        # after an error the peers may be gone: do not wait long for a thread caught in a collective
        self.close(join_s=None if kind is None else _EXIT_JOIN_S)
