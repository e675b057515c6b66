"""Checkpoints in and out of mvc: checkpoint files, and (from `mvc.state`) nested states <-> named tensors."""
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
