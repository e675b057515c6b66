"""Errors about checkpoint files given to mvc (each with its own exit code)."""
from __future__ import annotations

from mvc.errors import MvcError


class CheckpointFileError(MvcError):
    """Base of errors about a checkpoint file given to mvc."""


class CheckpointNotFoundError(CheckpointFileError):
    """The checkpoint path does not exist, is a directory, or cannot be opened."""

    exit_code = 20


class CorruptCheckpointError(CheckpointFileError):
    """The file is truncated, damaged, or not a checkpoint at all."""

    exit_code = 21


class UnsafeCheckpointError(CheckpointFileError):
    """The file's pickle needs globals outside torch's weights-only allowlist (it was not run)."""

    exit_code = 22


class UnsupportedCheckpointError(CheckpointFileError):
    """The file's extension or format is not one mvc reads or writes."""

    exit_code = 23
