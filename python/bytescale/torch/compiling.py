"""torch.compile and bytescale.torch: a clean graph break at the attention, without dynamo's import.

A compiled model must not trace into HDP attention: its Python control flow (tile plans, ring
messages, all-to-alls) is not a graph. `torch.compiler.disable` says so, but it imports torch._dynamo
at once, which costs about as long as torch's own import, in every process that imports
bytescale.torch (every test worker, every torchrun rank), and most of them never compile. So
`not_traced(fn)` returns a function that calls fn, and, while dynamo traces it
(torch.compiler.is_compiling()), calls fn's disabled copy instead: dynamo breaks its graph there
("Skip calling torch.compiler.disable()d function") and runs fn eagerly with dynamo off inside. The
disabled copy is made when torch._dynamo loads: at once where it is loaded already (transformers'
models import it), else by a one-time import hook, so it exists before dynamo traces anything.
"""

from __future__ import annotations

import functools
import importlib.abc
import importlib.util
import sys
from typing import Callable, List

import torch

DYNAMO = "torch._dynamo"

_waiting: List[tuple] = []  # [(fn, box)] whose disabled copies wait for dynamo to load


def _disable_all(dynamo) -> None:
    while _waiting:
        fn, box = _waiting.pop()
        box[0] = dynamo.disable(fn, reason="bytescale.torch's HDP attention runs eagerly")


class _WhenDynamoLoads(importlib.abc.MetaPathFinder):
    """Finds nothing itself: at the import of torch._dynamo it removes itself, takes the real spec and
    makes the disabled copies right after the module has run."""

    def find_spec(self, name, path=None, target=None):
        if name != DYNAMO:
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(name)  # the real finders' (this one is gone)
        loader = getattr(spec, "loader", None)
        if loader is None or not hasattr(loader, "exec_module"):
            return spec
        run = loader.exec_module

        def exec_module(module):
            run(module)
            _disable_all(module)

        loader.exec_module = exec_module
        return spec


_hook = _WhenDynamoLoads()


def not_traced(fn: Callable) -> Callable:
    """fn, but a graph break for torch.compile (the module docstring); fn's result either way."""
    box = [None]  # fn's disabled copy, once dynamo has loaded

    @functools.wraps(fn)
    def call(*args, **kwargs):
        if torch.compiler.is_compiling() and box[0] is not None:
            return box[0](*args, **kwargs)
        return fn(*args, **kwargs)

    _waiting.append((fn, box))
    if DYNAMO in sys.modules:
        _disable_all(sys.modules[DYNAMO])
    elif _hook not in sys.meta_path:
        sys.meta_path.insert(0, _hook)
    return call
