"""torchrun, made to work where the installed torch's own fails, and given the workers' OpenBLAS pick.

    python3 -m bytescale.torch.run --nproc_per_node 2 train.py --my-flags ...

takes exactly torchrun's arguments (torch.distributed.run) and hands them to torchrun's own main
in this process, after two things:

1. **Std.from_str.** torch.distributed.elastic reads `--redirects` and `--tee` (default "0") with
   `Std.from_str`, which looks the number up by iterating over the `Std` IntFlag. From Python 3.11
   on, iterating a Flag yields only its single-bit members, so NONE (0) and ALL (3) are never found
   and `from_str("0")` returns None; the agent then fails before starting any worker with
   `AttributeError: 'NoneType' object has no attribute 'get'` (in `to_map`). This is Debian 12's
   torch 1.13 on its Python 3.11, whatever the script. Where (and only where) the installed torch
   shows it, `from_str` is replaced by the same parse done with `Std(int(v))`; a torch that reads
   "0" as Std.NONE is left alone. (Plain torchrun works there with `--redirects 1 --tee 1`, which
   avoids the lookup of 0: each worker's stdout goes to a file and is copied, prefixed, to ours.)
2. **OPENBLAS_CORETYPE.** Where this machine's OpenBLAS would fall back to kernels older than the
   CPU, the workers get the variable as `spawn` gives it (bytescale.blas_coretype; docs/training.md,
   "BLAS kernels"), unless it is set already.

The workers run `sys.executable script.py ...` (torchrun's default), so they are this interpreter
and find bytescale as this process did (an installed package, or PYTHONPATH and BYTESCALE_LIB,
which they inherit).
"""

from __future__ import annotations

import os
import re
import sys
from typing import List, Optional


def std_from_str_broken() -> bool:
    """True when the installed torch's Std.from_str cannot read "0" or "3" (Python 3.11's Flag
    iteration, above)."""
    from torch.distributed.elastic.multiprocessing.api import Std

    return Std.from_str("0") is not Std.NONE or Std.from_str("3") is not Std.ALL


def patch_std_from_str() -> bool:
    """Replace Std.from_str by a parse that builds the member from its value, where the installed one
    is broken; returns whether it did. Accepts and refuses what the original does: "0".."3", or a
    mapping "local_rank:value,..." (ValueError otherwise, with the original's message)."""
    from torch.distributed.elastic.multiprocessing import api

    if not std_from_str_broken():
        return False
    Std, original = api.Std, api.Std.from_str
    value_re = getattr(api, "_VALUE_REGEX", r"^[0123]$")
    mapping_re = getattr(api, "_MAPPING_REGEX", r"^(\d:[0123],)*(\d:[0123])$")

    def from_str(vm: str):
        if re.match(value_re, vm):
            return Std(int(vm))
        if re.match(mapping_re, vm):
            return {int(i): Std(int(v)) for i, v in (m.split(":") for m in vm.split(","))}
        return original(vm)  # raises the original's ValueError

    Std.from_str = staticmethod(from_str)
    return True


def main(argv: Optional[List[str]] = None) -> int:
    """torchrun with argv (default sys.argv[1:]): patch where needed, set OPENBLAS_CORETYPE, run."""
    argv = sys.argv[1:] if argv is None else argv
    patch_std_from_str()
    if "OPENBLAS_CORETYPE" not in os.environ:
        from .. import blas_coretype

        coretype = blas_coretype()
        if coretype:
            os.environ["OPENBLAS_CORETYPE"] = coretype
    from torch.distributed import run as torchrun

    sys.argv = ["torchrun", *argv]  # torchrun's help and errors name it as the user knows it
    torchrun.main(argv)
    return 0


if __name__ == "__main__":
    sys.exit(main())
