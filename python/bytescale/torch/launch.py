"""Starting a torch.distributed job on one machine: under torchrun, or N processes of our own.

    from bytescale.torch import launch
    results = launch.spawn(worker, 4, args=(x,))   # worker(rank, world, x) in 4 processes, gloo

`spawn` starts the processes with torch.multiprocessing's forkserver method: a server process
imports torch once, and each worker is forked from it (nothing of the caller's torch state, threads
or process groups is shared, as with the spawn method, but torch is not imported again per worker:
on a 2-core machine that import takes 2-3 s a process, most of a short job), initialises the
default process group in each (gloo, or NCCL when `backend="nccl"`), runs the worker, and returns every rank's return value (rank 0
first). A worker that raises fails the whole call with its traceback; the collectives time out
instead of hanging forever (`timeout`). Where the OpenBLAS of this machine would fall back to kernels
older than the CPU, the workers get OPENBLAS_CORETYPE as `bytescale train` gives it to itself
(bytescale.blas_coretype; docs/training.md, "BLAS kernels").
"""

from __future__ import annotations

import datetime
import os
import pickle
import socket
import tempfile
from typing import Any, Callable, List, Optional, Sequence

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from .. import blas_coretype
from . import guard


def free_port() -> int:
    """A TCP port that was free a moment ago on the loopback interface."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def default_backend() -> str:
    """NCCL when CUDA and NCCL are available, else gloo."""
    return "nccl" if torch.cuda.is_available() and dist.is_nccl_available() else "gloo"


def init(rank: int, world: int, backend: str = "gloo", port: Optional[int] = None, timeout_s: float = 300.0,
         threads: Optional[int] = 1, store_port: Optional[int] = None) -> None:
    """Initialise the default process group for this process (rank of world). Under torchrun the
    environment already names the rendezvous; otherwise `port` on 127.0.0.1 does (rank 0 then holds
    the job's store), or `store_port`, a store another process holds (spawn's parent: it outlives the
    ranks, so a failure rank 0 records still reaches the others). threads: torch's intra-op threads
    (1: one core per rank, as the C engine's timing runs use). timeout_s: the process group's timeout,
    and the control collectives' unless BYTESCALE_TIMEOUT says otherwise (guard.py). The control
    groups are made here, so a rank that never arrives at the first step is named too."""
    if port is not None:
        os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world))
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")  # one machine: the loopback interface
    if threads is not None:
        torch.set_num_threads(threads)
    if backend == "nccl":
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", rank)) % torch.cuda.device_count())
    timeout = datetime.timedelta(seconds=timeout_s)
    if store_port is not None:
        store = dist.TCPStore("127.0.0.1", store_port, world, is_master=False, timeout=timeout)
        dist.init_process_group(backend, store=store, rank=rank, world_size=world, timeout=timeout)
    else:
        dist.init_process_group(backend, rank=rank, world_size=world, timeout=timeout)
    guard.reset()
    guard.control_group()
    guard.install()


def finish() -> None:
    """Destroy the default process group (and every other group with it): every rank at the end of a
    job that went well. A process that exits with its groups alive may abort at exit (guard._at_exit,
    which does this at exit where the script did not). After an error, leave without it: it would wait
    for the collectives the failed step left pending."""
    if dist.is_initialized():
        dist.destroy_process_group()
    guard.reset()


def _entry(rank, fn, world, backend, store_port, timeout_s, out_dir, env, args):
    # a forkserver child has the server's environment, from when it started: the caller's is this one
    os.environ.clear()
    os.environ.update(env)
    init(rank, world, backend, None, timeout_s, store_port=store_port)
    with guard.failing():  # recorded before this process leaves: its peers name it (guard.py)
        result = fn(rank, world, *args)
    with open(os.path.join(out_dir, f"rank{rank}.pkl"), "wb") as f:
        pickle.dump(result, f)
    finish()  # not after an error (finish's docstring): the process leaves, its peers' waits end


def host_store(nprocs: int, timeout_s: float):
    """A TCPStore server in this process for nprocs ranks on 127.0.0.1 (a free port): the ranks
    connect to it (init(store_port=)), and it outlives them."""
    return dist.TCPStore("127.0.0.1", 0, nprocs, is_master=True, wait_for_workers=False,
                         timeout=datetime.timedelta(seconds=timeout_s))


def spawn(fn: Callable[..., Any], nprocs: int, args: tuple = (), backend: str = "gloo",
          timeout_s: float = 300.0, preload: Sequence[str] = ()) -> List[Any]:
    """Run fn(rank, world, *args) in `nprocs` new processes (forked from the forkserver) with the
    default process group initialised; return their results, rank 0 first. fn must be importable by
    name (a module-level function) and its results picklable. This process holds the job's store
    (host_store). preload: more modules the forkserver imports beside torch, this package and fn's
    module (transformers' models take seconds a process to import); it takes them only where this
    process starts it, at its first spawn."""
    # the forkserver loads libbytescale when it starts (below, with this environment), and its OpenBLAS
    # (the system one; torch's pip wheel brings its own BLAS, on x86-64 MKL, which ignores the variable)
    # reads OPENBLAS_CORETYPE when it loads: where it would fall back to kernels older than this CPU, the
    # workers get the ones `bytescale train` picks for itself (docs/training.md, "BLAS kernels")
    coretype = blas_coretype()
    if coretype and "OPENBLAS_CORETYPE" not in os.environ:
        os.environ["OPENBLAS_CORETYPE"] = coretype
    store = host_store(nprocs, timeout_s)
    # the server imports torch once (it starts at the first spawn and serves this process's later
    # ones); the workers take this process's environment as it is now (_entry), not the server's. It
    # imports this package and fn's module too (where its sys.path, the environment's PYTHONPATH,
    # finds it; an ImportError is left to the worker): else every worker imports them again when it
    # unpickles fn (half a second a worker for a pytest module: pytest, numpy, bytescale.torch). And
    # torch._dynamo: torch.optim's optimizers import it when the first one is made (2-3 s a process,
    # compiling.py), which a worker that trains does
    own = [fn.__module__] if fn.__module__ != "__main__" else []
    mp.set_forkserver_preload(["torch", "torch.distributed", "bytescale.torch", "torch._dynamo", *own, *preload])
    with tempfile.TemporaryDirectory(prefix="bytescale-torch-") as out_dir:
        mp.start_processes(_entry, nprocs=nprocs, join=True, start_method="forkserver",
                           args=(fn, nprocs, backend, store.port, timeout_s, out_dir, dict(os.environ), args))
        results = []
        for r in range(nprocs):
            with open(os.path.join(out_dir, f"rank{r}.pkl"), "rb") as f:
                results.append(pickle.load(f))
        return results
