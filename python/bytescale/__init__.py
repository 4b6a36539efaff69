"""bytescale: Hybrid Data Parallelism (ByteScale): the planner, the policies and the cluster simulator,
from Python, over the C library libbytescale.so (docs/python.md).

    import bytescale
    p = bytescale.plan(lengths, ranks=16, capacity=8192, policy="elastic")
    for c in p.chunks(rank):          # what rank `rank` trains this step, in the global order
        ...                           # c.id, c.id_start, c.len: tokens of the caller's sequence c.id
    s = bytescale.simulate(p)         # one step on a modelled cluster
    p.write("plan.json")              # the plan file `bytescale simulate --plan` reads

Every failure the library reports raises bytescale.Error with the library's message.
"""

from typing import Optional

from ._lib import Error, path as library_path, lib as _clib
from ._cost import CostModel, hardware_profiles, models, no_train, policies, sample_lengths
from ._plan import Chunk, Chunks, Item, Plan, Segment, Sequence, plan, read_plan
from ._sim import Simulation, simulate

# the loaded library's version (the C project's, CMakeLists.txt); pip records the same one
__version__ = _clib.bs_version().decode()


def blas_coretype() -> Optional[str]:
    """The OPENBLAS_CORETYPE this machine should run ("SkylakeX" or "Haswell") when the OpenBLAS the
    library loaded fell back to kernels older than the CPU (a CPU model newer than its table), else
    None. OpenBLAS reads the variable only when it is loaded: set it for processes yet to start, as
    bytescale.torch.launch.spawn does (docs/training.md, "BLAS kernels")."""
    better = _clib.bs_blas_coretype()
    return better.decode() if better else None


__all__ = ["Error", "CostModel", "Plan", "Simulation", "Item", "Segment", "Sequence", "Chunk", "Chunks", "plan",
           "read_plan", "simulate", "sample_lengths", "policies", "no_train", "models", "hardware_profiles", "library_path",
           "blas_coretype", "__version__"]
