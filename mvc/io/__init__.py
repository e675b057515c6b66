"""Checkpoints in and out of mvc: checkpoint files, and (from `mvc.state`) nested states <-> named tensors.

The names below are loaded on first use: importing a submodule that needs no torch (the
errors of `mvc.io.checkpoint_errors`, which the CLI raises before it loads anything) does
not pay for `mvc.io.files` and torch.
"""
from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from mvc.io.files import (
        CheckpointFileError,
        CheckpointNotFoundError,
        CorruptCheckpointError,
        UnsafeCheckpointError,
        UnsupportedCheckpointError,
        detect_format,
        load_checkpoint,
        save_checkpoint,
    )
    from mvc.state import FlatState, UnsupportedStateError, flatten, unflatten

__all__ = [
    "CheckpointFileError",
    "CheckpointNotFoundError",
    "CorruptCheckpointError",
    "FlatState",
    "UnsafeCheckpointError",
    "UnsupportedCheckpointError",
    "UnsupportedStateError",
    "detect_format",
    "flatten",
    "load_checkpoint",
    "save_checkpoint",
    "unflatten",
]

_FROM_STATE = {"FlatState", "UnsupportedStateError", "flatten", "unflatten"}


def __getattr__(name: str) -> Any:
    if name not in __all__:
        # Not ours: `from mvc.io import torch_zip` then imports the submodule.
        raise AttributeError(f"module 'mvc.io' has no attribute {name!r}")
    value = getattr(importlib.import_module("mvc.state" if name in _FROM_STATE else "mvc.io.files"), name)
    globals()[name] = value
    return value
