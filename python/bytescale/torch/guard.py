"""Failures end a job on every rank with their cause (docs/torch.md, "Failures and timeouts").

A distributed step fails badly by default: the rank that raises leaves, and its peers, blocked in a
message it will never send, get the transport's error ("Connection closed by peer") or wait for the
process group's timeout (30 minutes) and then name no rank. Three things here make every rank raise
the cause instead:

- **The failure is written down before the rank leaves.** An exception that escapes a micro-batch
  (`microbatch_context`), ring, all-to-all or pipeline stage, `HDPTrainer.step`, `launch.spawn`'s
  worker or the script (`sys.excepthook`) is written to the job's store (the key-value store of the
  default process group: torchrun's agent holds it, or `spawn`'s parent) as "rank r failed: Type:
  message", before the process exits. When it exits, its connections close and every peer's wait
  fails at once; each wait of bytescale.torch (ring and all-to-all messages, stage activations, the
  gradient all-reduce, the plan's broadcast and check) then reads the store and raises PeerError with
  that text. Nothing is sent on the way of a good step.
- **The control collectives have their own timeout.** The plan's broadcast and the plan check run on
  a gloo group of their own (made once, `control_group`), whose timeout is `timeout()`:
  BYTESCALE_TIMEOUT (seconds) if set, else `set_timeout`, else the default group's. gloo is CPU only,
  so this works the same on an NCCL job.
- **A stall is named.** When a control collective times out, the ranks that did arrive meet in gloo's
  monitored barrier on a second group; rank 0 learns which ranks never came and writes them to the
  store; every arrived rank raises StallError naming them.
"""

from __future__ import annotations

import atexit
import contextlib
import datetime
import os
import sys
import time
import traceback
from typing import Iterator, List, Optional, Sequence

import torch
import torch.distributed as dist

# the store keys (the default store is per job; torchrun prefixes it per restart)
_KEY_FAILURE = "bytescale/failure"
_KEY_STALL = "bytescale/stalled/"

# how long a wait that failed looks for the failed rank's record: the record is written before that
# rank's connections close, so it is there at once unless the store itself is slow
_RECORD_WAIT_S = 3.0
# the monitored barrier that names stalled ranks waits at most this long for each rank (gloo waits for
# the ranks one after the other: a rank that never comes costs this much)
_NAMING_MAX_S = 5.0


class PeerError(RuntimeError):
    """Another rank failed (or did not arrive) and this rank cannot go on: raised on every rank that
    waited for it, with the failed rank's own error in the message. `ranks`: the ranks named."""

    def __init__(self, message: str, ranks: Sequence[int] = ()):
        super().__init__(message)
        self.ranks = [int(r) for r in ranks]


class StallError(PeerError):
    """Ranks did not arrive at a control collective within the timeout (`ranks` names them)."""


# timeout: set_timeout's; groups: (control, naming); seq: control collectives so far (the same count on
# every rank); hook: the excepthook and atexit handler installed; failed: this process is leaving on
# an error (its exit then skips destroy_process_group, which would wait for the peers, see _at_exit)
_state = {"timeout": None, "groups": None, "seq": 0, "hook": False, "failed": False}


def set_timeout(seconds: Optional[float]) -> None:
    """How long a control collective (the plan's broadcast, the plan check) waits for the slowest rank
    before the ranks that arrived raise StallError. Call it before the first step on every rank (the
    groups take it when they are made). None: back to BYTESCALE_TIMEOUT or the default group's."""
    _state["timeout"] = None if seconds is None else float(seconds)


def timeout() -> float:
    """The control collectives' timeout in seconds: BYTESCALE_TIMEOUT, else set_timeout's, else the
    default process group's (init_process_group(timeout=...); torch's default is 30 minutes)."""
    env = os.environ.get("BYTESCALE_TIMEOUT")
    if env:
        try:
            value = float(env)
        except ValueError:
            raise ValueError(f"BYTESCALE_TIMEOUT={env!r}: a number of seconds") from None
        if value <= 0:
            raise ValueError(f"BYTESCALE_TIMEOUT={env!r}: a number of seconds above 0")
        return value
    if _state["timeout"] is not None:
        return _state["timeout"]
    try:
        pg = dist.distributed_c10d._get_default_group()
        return pg._get_backend(torch.device("cpu")).options._timeout.total_seconds()
    except (AttributeError, RuntimeError, ValueError):
        return 1800.0


def _world() -> int:
    return dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1


def _rank() -> int:
    return dist.get_rank() if dist.is_available() and dist.is_initialized() else 0


def control_group():
    """The gloo group of the control collectives (None in a world of 1). Made on the first call with
    the timeout of `timeout()`, together with the naming group: `new_group` is collective, so every
    process must make the first call at the same point (broadcast_plan and check_plan do, on every
    rank each step; launch.init does right after init_process_group)."""
    if _world() == 1:
        return None
    if _state["groups"] is None:
        t = datetime.timedelta(seconds=timeout())
        naming = datetime.timedelta(seconds=min(timeout(), _NAMING_MAX_S))
        _state["groups"] = (dist.new_group(backend="gloo", timeout=t), dist.new_group(backend="gloo", timeout=naming))
        install()
    return _state["groups"][0]


def reset() -> None:
    """Forget the control groups (after destroy_process_group, before a new one is made)."""
    _state["groups"] = None
    _state["seq"] = 0


def _store():
    try:
        return dist.distributed_c10d._get_default_store()
    except (ValueError, RuntimeError, AttributeError, KeyError):
        return None


def _is_ours(exc: BaseException) -> bool:
    """Errors every rank raises alike (a plan check, a peer's failure, a stall): not a rank's own
    failure, so never written down as one."""
    from .check import PlanCheckError
    from .step import PlanError
    return isinstance(exc, (PeerError, PlanCheckError, PlanError))


def describe(exc: BaseException) -> str:
    """'Type: message' of an exception, on one line."""
    text = " ".join(str(exc).split())
    if len(text) > 2000:
        text = text[:2000] + " ..."
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def record(exc: BaseException) -> None:
    """Write "rank r failed: Type: message" to the job's store, once per exception and only the first
    failure of the job (a later one is a consequence); nothing for PeerError, PlanCheckError and
    PlanError (every rank raises those itself) nor outside a process group."""
    # a plan check or plan error is raised before any message of the step (a peer's failure: waiting()
    # marks the exit); one process has no peers to wait for: its exit may destroy its group
    if _is_ours(exc) or _world() == 1:
        return
    _state["failed"] = True
    if getattr(exc, "_bytescale_recorded", False):
        return
    store = _store()
    if store is None:
        return
    try:
        exc._bytescale_recorded = True
    except AttributeError:
        pass
    try:
        store.compare_set(_KEY_FAILURE, "", f"{_rank()}\n{describe(exc)}")
    except Exception:  # a store that is gone: the peers get the transport's error, nothing more to do
        pass


def failure(wait_s: float = 0.0) -> Optional[tuple]:
    """The job's first recorded failure, (rank, 'Type: message'), looking for up to wait_s seconds;
    None if there is none."""
    store = _store()
    if store is None:
        return None
    end = time.monotonic() + wait_s
    while True:
        try:
            if store.check([_KEY_FAILURE]):
                rank, text = store.get(_KEY_FAILURE).decode("utf-8", "replace").split("\n", 1)
                return int(rank), text
        except Exception:  # the store went with its host: nothing to read
            return None
        if time.monotonic() >= end:
            return None
        time.sleep(0.05)


def _transport(exc: BaseException) -> bool:
    """An error of the transport under a collective or message (gloo, NCCL, the store): a peer left or
    timed out. torch raises these as RuntimeError or its DistError subclasses."""
    if isinstance(exc, getattr(dist, "DistError", ())):
        return True
    text = str(exc)
    return isinstance(exc, RuntimeError) and any(
        s in text for s in ("gloo", "Connection closed", "Connection reset", "Timed out", "timed out", "NCCL",
                            "Broken pipe", "pair closure"))


def peer_error(exc: BaseException, what: str, peers: Sequence[int] = ()) -> Optional[PeerError]:
    """The PeerError for a wait that failed with the transport error `exc`: the failed rank and its
    error when one is recorded, else (no record: a peer stalled or vanished without a word) the peers
    waited for. None when `exc` is no transport error (it is then this rank's own failure)."""
    if _is_ours(exc) or not _transport(exc):
        return None
    f = failure(_RECORD_WAIT_S)
    me = _rank()
    if f is not None and f[0] != me:
        return PeerError(f"bytescale.torch: rank {me}, {what}: rank {f[0]} failed: {f[1]}", [f[0]])
    who = ", ".join(map(str, peers)) if peers else "a peer"
    return PeerError(f"bytescale.torch: rank {me}, {what}: the wait for rank {who} failed and no rank recorded "
                     f"a failure (a rank that stalled, was killed, or lost its connection): {describe(exc)}",
                     list(peers))


@contextlib.contextmanager
def waiting(what: str, peers: Sequence[int] = ()) -> Iterator[None]:
    """Around a wait for peers: a transport error becomes the PeerError naming the rank that failed
    (and its error); any other exception is this rank's own and is recorded for the peers."""
    try:
        yield
    except BaseException as e:
        err = peer_error(e, what, peers)
        if err is not None:
            _state["failed"] = True
            raise err from e
        record(e)
        raise


@contextlib.contextmanager
def failing() -> Iterator[None]:
    """Record any exception that leaves the block as this rank's failure (then re-raise it)."""
    try:
        yield
    except BaseException as e:
        if isinstance(e, KeyboardInterrupt):
            _state["failed"] = _world() > 1  # leaving mid-step, but no failure for the peers to name
        elif not isinstance(e, (GeneratorExit, SystemExit)):
            record(e)
        raise


def _at_exit() -> None:
    """atexit: destroy the process groups the script left, while the interpreter is whole. A process
    that exits with its default group alive aborts now and then ("terminate called without an
    active exception"; the report: once in three runs): a gloo worker thread drops its last finished work, whose tensors
    belong to Python objects, while the main thread is already in Py_FinalizeEx; acquiring the GIL
    there ends the worker thread with pthread_exit, whose unwinding crosses a noexcept frame
    (docs/torch.md, "Failures and timeouts"). destroy_process_group shuts the workers down first. Not
    on the way out of an error: it would wait for collectives the failed step left pending, which
    wait for the peers, which wait for this process to leave."""
    if _state["failed"]:
        return
    try:
        if dist.is_available() and dist.is_initialized():
            dist.destroy_process_group()
    except Exception:
        pass
    reset()


def install() -> None:
    """Make sys.excepthook record an uncaught exception before the process exits (and turn an
    uncaught transport error into the recorded cause), and destroy the process groups at exit
    (_at_exit). Once per process."""
    if _state["hook"]:
        return
    _state["hook"] = True
    atexit.register(_at_exit)
    previous = sys.excepthook

    def hook(kind, value, tb):
        if not _is_ours(value) and _world() > 1:  # else nothing is left pending: the exit may destroy
            _state["failed"] = True
        if value is not None and not isinstance(value, (KeyboardInterrupt, SystemExit)):
            err = peer_error(value, "a collective of the script")
            if err is not None and err.ranks:
                sys.stderr.write(f"{err}\n")  # the cause, beside the transport's own error below
            else:
                record(value)
        previous(kind, value, tb)

    sys.excepthook = hook


def _naming_barrier(what: str, exc: BaseException) -> StallError:
    """After a control collective timed out: gloo's monitored barrier on the naming group among the
    ranks that arrived; rank 0 (its root) learns which never did and writes them to the store, the
    others read them there. Returns the StallError to raise."""
    seq = _state["seq"]
    naming = _state["groups"][1]
    me, world = _rank(), _world()
    missing: Optional[List[int]] = None
    try:
        dist.monitored_barrier(group=naming, timeout=datetime.timedelta(seconds=min(timeout(), _NAMING_MAX_S)),
                               wait_all_ranks=True)
    except RuntimeError as e:
        if me == 0:
            missing = _ranks_in(str(e), world)
    store = _store()
    key = f"{_KEY_STALL}{seq}"
    if me == 0 and store is not None:
        try:
            store.set(key, ",".join(map(str, missing or [])))
        except Exception:
            pass
    elif store is not None:
        end = time.monotonic() + _RECORD_WAIT_S
        while missing is None and time.monotonic() < end:
            try:
                if store.check([key]):
                    missing = [int(x) for x in store.get(key).decode().split(",") if x]
                    break
            except Exception:
                break
            time.sleep(0.05)
    t = timeout()
    if missing is None:  # rank 0 did not answer: it is (at least) one of them
        missing, note = [0], " (rank 0, which names the others, did not answer: more may be missing)"
    else:
        note = ""
    f = failure()
    if f is not None and f[0] != me:
        return PeerError(f"bytescale.torch: rank {me}, {what}: rank {f[0]} failed: {f[1]}", [f[0]])
    names = ("rank " if len(missing) == 1 else "ranks ") + ", ".join(map(str, missing))
    return StallError(f"bytescale.torch: rank {me}, {what}: {names} did not arrive within {t:g} s{note} "
                      f"(the timeout: BYTESCALE_TIMEOUT, or init_process_group's; docs/torch.md, \"Failures "
                      f"and timeouts\")", missing)


def _ranks_in(text: str, world: int) -> List[int]:
    """The ranks gloo's monitored barrier names ("Ranks 1, 3 failed to pass monitoredBarrier ...")."""
    import re
    m = re.search(r"Ranks? ([\d, ]+) failed to pass monitoredBarrier", text)
    if not m:
        return []
    return sorted({int(x) for x in m.group(1).replace(" ", "").split(",") if x and int(x) < world})


@contextlib.contextmanager
def control(what: str) -> Iterator[None]:
    """Around a control collective on control_group(): a timeout names the ranks that did not arrive
    (StallError, on every rank that did), a closed connection the rank that failed (PeerError)."""
    _state["seq"] += 1
    try:
        yield
    except BaseException as e:
        if _is_ours(e) or not _transport(e):
            record(e)
            raise
        f = failure(0.5 if "Timed out" in str(e) else _RECORD_WAIT_S)
        if f is not None and f[0] != _rank():
            raise PeerError(f"bytescale.torch: rank {_rank()}, {what}: rank {f[0]} failed: {f[1]}", [f[0]]) from e
        if _state["groups"] is None:
            raise
        raise _naming_barrier(what, e) from e
