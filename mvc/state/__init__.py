"""Nested checkpoint states <-> named tensors plus a JSON skeleton.

`flatten` splits a state (model and optimizer state dicts, scalars, RNG states,
any nesting of containers) into uniquely named tensors and a skeleton that
rebuilds the exact structure; `unflatten` inverts it.  Pure torch: it knows
nothing of storage, so the repository (which stores the tensors and the
skeleton) and the checkpoint-file and training-loop code above it all use it.

The torch parts are imported on first use of one of their names, so the repository's
object decoding (which needs only `skeleton_depth`) does not load torch.
"""
from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from mvc.state.skeleton import MAX_SKELETON_DEPTH, skeleton_depth

if TYPE_CHECKING:
    from mvc.state.leaves import UnsupportedStateError
    from mvc.state.nested import FlatState, SkeletonTooDeepError, flatten, unflatten
    from mvc.state.select import OPTIMIZER_KEYS, prune

#: Name -> the submodule defining it (imported, with torch, when the name is first asked for).
_LAZY = {
    "UnsupportedStateError": "leaves",
    "FlatState": "nested", "SkeletonTooDeepError": "nested", "flatten": "nested", "unflatten": "nested",
    "OPTIMIZER_KEYS": "select", "prune": "select",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'mvc.state' has no attribute {name!r}")
    return getattr(importlib.import_module(f"mvc.state.{module}"), name)


__all__ = [
    "MAX_SKELETON_DEPTH",
    "OPTIMIZER_KEYS",
    "FlatState",
    "SkeletonTooDeepError",
    "UnsupportedStateError",
    "flatten",
    "prune",
    "skeleton_depth",
    "unflatten",
]
