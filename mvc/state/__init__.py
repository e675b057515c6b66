"""Nested checkpoint states <-> named tensors plus a JSON skeleton.

`flatten` splits a state (model and optimizer state dicts, scalars, RNG states,
any nesting of containers) into uniquely named tensors and a skeleton that
rebuilds the exact structure; `unflatten` inverts it.  Pure torch: it knows
nothing of storage, so the repository (which stores the tensors and the
skeleton) and the checkpoint-file and training-loop code above it all use it.
"""
from mvc.state.leaves import UnsupportedStateError
from mvc.state.nested import (
    MAX_SKELETON_DEPTH,
    FlatState,
    SkeletonTooDeepError,
    flatten,
    skeleton_depth,
    unflatten,
)
from mvc.state.select import OPTIMIZER_KEYS, prune

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
