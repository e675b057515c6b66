"""The root of mvc's error hierarchy.

Each layer defines its own errors next to the code that raises them, all
subclassing `MvcError`.  Every concrete class carries a distinct `exit_code`
that the CLI uses, so scripts can tell "not a repository" from "corrupt data"
from "a bug in mvc".  `DataError` marks stored data that is missing or corrupt;
`InternalError` marks a broken invariant inside mvc itself (a bug).
"""
from __future__ import annotations

import errno
import os


class MvcError(Exception):
    """Base of every error mvc raises on purpose."""

    exit_code: int = 1


class UsageError(MvcError):
    """The caller asked for something that cannot be done as asked."""

    exit_code = 2


class DataError(MvcError):
    """Stored data is missing or corrupt (not a bug in mvc, not a user mistake)."""

    exit_code = 6


class InternalError(MvcError):
    """An invariant inside mvc broke: this is a bug, please report it."""

    exit_code = 70


class DiskFullError(MvcError):
    """The disk (or quota) holding the repository or an output file ran out of space.

    Defined at the root because every layer that writes can hit it (the store,
    the level cache, checkpoint files); nothing already stored is lost when it is
    raised, and the operation can be retried once space is freed.
    """

    exit_code = 75


DISK_FULL_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT})


def free_bytes(path: str | os.PathLike) -> int | None:
    """Bytes available to this user on the filesystem holding `path` (None if unknown)."""
    try:
        st = os.statvfs(path)
    except OSError:
        return None
    return st.f_bavail * st.f_frsize


def is_disk_full(exc: BaseException, path: str | os.PathLike | None = None,
                 below: int = 1 << 20) -> bool:
    """True when `exc` means the disk or quota is full.

    An OSError says so by its errno.  Libraries that wrap the failed write (LMDB
    reports EIO, torch's zip writer a RuntimeError) do not, so with `path` the
    filesystem is asked: less than `below` bytes free right after the failure
    means the write ran out of space.
    """
    if isinstance(exc, OSError) and exc.errno in DISK_FULL_ERRNOS:
        return True
    if path is None:
        return False
    free = free_bytes(path)
    return free is not None and free < below


class MvcWarning(UserWarning):
    """Something went wrong after the point of no return and was worked around.

    Example: a commit landed but its level cache could not be written.  The
    CLI prints these as one `mvc: warning:` line; the API leaves them to the
    `warnings` machinery.
    """
