"""Checkpoints in and out of mvc: nested states <-> named tensors, and checkpoint files."""
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
from mvc.io.remainder import UnsupportedStateError
from mvc.io.state import FlatState, flatten, unflatten

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
