"""The store contracts (blobs, refs, local maintenance) and the local store composed of them.

* `BlobStore` -- immutable content-addressed objects (put / get / has / list /
  delete).  Every call stands alone (no transaction spans two calls), so object
  storage (S3-compatible, a ``file://`` directory) can implement it.
* `RefStore` -- refs moved one at a time by compare-and-swap, each move
  appended to that ref's reflog in the same step.  Object storage implements it
  with conditional writes (e.g. one object per ref holding its value and log).
* `TransactionalRefStore` -- a `RefStore` that can also apply several
  compare-and-swaps in one transaction (`update_refs`).  Local stores only
  (LMDB, memory): object storage has no multi-object transactions.
* `StoreMaintenance` -- what only a local store has: the repository write lock,
  shrink, disk usage and small metadata (format version, repository id).

`ObjectStore`, a repository's local store, has one of each, as `blobs`,
`refs` and `maintenance`; it is none of them and forwards nothing, so every
caller names the part it uses and a service can be handed just that part.

**Asking for a ref batch.**  Code that moves several refs atomically (gc's
replacement publishing, a branch switch) says so in its signature: it takes a
`TransactionalRefStore`, never a bare `RefStore`.  Code handed a `RefStore`
whose kind is only known at run time (a remote, later) calls
`require_transactional`, which raises `RefBatchUnsupportedError` before
anything moved instead of an ``AttributeError`` halfway through.
"""
from __future__ import annotations

import abc
from collections.abc import Iterable, Iterator, Sequence
from contextlib import AbstractContextManager
from typing import TypeVar

from mvc.errors import UsageError
from mvc.store.base import (
    BufferTooSmallError,
    BytesLike,
    OnCorrupt,
    RefExpect,
    ReflogEntry,
    RefUpdate,
    byte_view,
    check_prefix,
)

_P = TypeVar("_P", bound="StorePart")
_S = TypeVar("_S", bound="ObjectStore")


class RefBatchUnsupportedError(UsageError):
    """A ref store that can only move one ref at a time was asked for an atomic batch."""

    exit_code = 122


class StorePart(abc.ABC):
    """What every store part has: `close()`, and use as a context manager."""

    @abc.abstractmethod
    def close(self) -> None:
        """Release resources (idempotent); the part must not be used afterwards."""

    def __enter__(self: _P) -> _P:  # noqa: PYI019 - typing.Self needs Python 3.11
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


# ------------------------------------------------------------------- blobs
class BlobStore(StorePart):
    """Immutable objects addressed by the xxh3-128 hex digest of their content.

    Implementations are safe to share between threads.  Reads verify content
    against the id (`IntegrityError`); a missing object is `ObjectMissingError`;
    a malformed id is `InvalidIdError`.  The non-abstract methods have correct
    (if slower) defaults built on the abstract ones.
    """

    @abc.abstractmethod
    def put(self, data: BytesLike) -> str:
        """Store `data` (idempotent) and return its id."""

    @abc.abstractmethod
    def get(self, oid: str) -> bytes:
        """Return the verified content of `oid` (IntegrityError / ObjectMissingError)."""

    @abc.abstractmethod
    def has(self, oid: str) -> bool:
        """Whether an object with id `oid` is stored (content not verified)."""

    @abc.abstractmethod
    def size(self, oid: str) -> int:
        """Stored length of `oid` without verification (ObjectMissingError)."""

    @abc.abstractmethod
    def iter_ids(self) -> Iterator[str]:
        """Every stored object id, sorted."""

    @abc.abstractmethod
    def delete(self, oids: Iterable[str]) -> int:
        """Remove objects; return the number of content bytes removed. Missing ids are ignored."""

    def put_many(self, items: Iterable[BytesLike]) -> list[str]:
        """Store many objects (in few write transactions where the backend has them);
        return their ids in order."""
        return [self.put(data) for data in items]

    def get_into(self, oid: str, out: memoryview) -> int:
        """Copy the verified content of `oid` into the start of `out`; return its length.

        Raises `BufferTooSmallError` (a `ValueError`) if `out` is too small.
        """
        data = self.get(oid)
        dest = byte_view(out)
        if len(dest) < len(data):
            raise BufferTooSmallError(
                f"object {oid} has {len(data)} bytes; buffer holds {len(dest)}")
        dest[:len(data)] = data
        return len(data)

    def ids_with_prefix(self, prefix: str) -> list[str]:
        """Sorted ids starting with the hex string `prefix`."""
        check_prefix(prefix)
        return [oid for oid in self.iter_ids() if oid.startswith(prefix)]

    def verify(self, oid: str) -> None:
        """Check one object against its id (IntegrityError / ObjectMissingError)."""
        self.get(oid)

    def object_bytes(self) -> int:
        """Sum of the lengths of all stored objects (local stores keep a counter)."""
        return sum(self.size(oid) for oid in self.iter_ids())


# -------------------------------------------------------------------- refs
class RefStore(StorePart):
    """Refs, each moved by compare-and-swap together with its reflog entry.

    Ref names and values are validated (`InvalidRefError`); a stored record
    that cannot be decoded is `CorruptRefError` / `CorruptReflogError`, or,
    where a method takes `on_corrupt`, handed to that callback and skipped
    (fsck reports every one).
    """

    @abc.abstractmethod
    def read_ref(self, name: str) -> str | None:
        """The raw value of ref `name` (symbolic refs are not resolved), or None.

        A stored value that is not a valid ref value raises `CorruptRefError`.
        """

    @abc.abstractmethod
    def iter_refs(self, prefix: str = "", *,
                  on_corrupt: OnCorrupt | None = None) -> Iterator[tuple[str, str]]:
        """(name, value) for every ref whose name starts with `prefix`, sorted by name.

        An unreadable record raises `CorruptRefError`; with `on_corrupt` it is
        handed to that callback instead and skipped.
        """

    @abc.abstractmethod
    def update_ref(self, name: str, old: RefExpect, new: str | None,
                   reason: str) -> None:
        """Compare-and-swap one ref and append its reflog entry, as one step.

        `old` is the value the ref must hold now (None: must not exist; `ANY`:
        not checked); `new` the value to set (None: delete the ref).  On a
        mismatch `RefConflictError` is raised and nothing changes.  The entry
        records the value found, so each ref's log is an unbroken chain.
        """

    @abc.abstractmethod
    def reflog(self, name: str, *, on_corrupt: OnCorrupt | None = None) -> list[ReflogEntry]:
        """Every recorded move of ref `name`, oldest first.

        An unreadable entry raises `CorruptReflogError`; with `on_corrupt` it is
        handed to that callback instead and skipped.
        """

    @abc.abstractmethod
    def reflog_names(self, *, on_corrupt: OnCorrupt | None = None) -> list[str]:
        """Sorted names of refs that have reflog entries (unreadable keys: as in `reflog`)."""

    @abc.abstractmethod
    def delete_reflog(self, name: str) -> None:
        """Forget the reflog of `name` (no error if there is none)."""


class TransactionalRefStore(RefStore):
    """A `RefStore` that also moves several refs in one transaction (local stores)."""

    @abc.abstractmethod
    def update_refs(self, updates: Sequence[RefUpdate], reason: str) -> None:
        """Apply compare-and-swap ref updates atomically and log each in the reflog.

        Updates apply in order within one transaction, so a later update of the
        same name sees the earlier one.  If any check fails, `RefConflictError`
        is raised and nothing changes.
        """

    def update_ref(self, name: str, old: RefExpect, new: str | None,
                   reason: str) -> None:
        """One compare-and-swap: a batch of one."""
        self.update_refs([RefUpdate(name, old, new)], reason)


def require_transactional(refs: RefStore, purpose: str) -> TransactionalRefStore:
    """`refs` as a `TransactionalRefStore`, or `RefBatchUnsupportedError` naming `purpose`."""
    if not isinstance(refs, TransactionalRefStore):
        raise RefBatchUnsupportedError(
            f"{purpose} moves several refs atomically, which {type(refs).__name__} cannot do "
            "(it moves one ref at a time)")
    return refs


# ------------------------------------------------------------- maintenance
class StoreMaintenance(StorePart):
    """What only a local store has: the write lock, shrink, disk usage, metadata."""

    @abc.abstractmethod
    def write_lock(self, timeout: float = 60.0) -> AbstractContextManager[None]:
        """Context manager holding the repository write lock (reentrant per thread).

        Exclusive across threads and (for on-disk stores) processes; raises
        `LockError` if it cannot be taken within `timeout` seconds.
        """

    @abc.abstractmethod
    def disk_usage(self) -> int:
        """Bytes the store occupies (on disk; in memory, what stands in for it)."""

    def reclaimable_bytes(self) -> int | None:
        """Bytes of `disk_usage` that `shrink` would give back (space freed by deletions,
        which later writes reuse), or None where the store cannot tell."""
        return None

    @abc.abstractmethod
    def shrink(self, timeout: float = 60.0) -> tuple[int, int]:
        """Give back space freed by deletions; return (`disk_usage` before, after).

        Takes the write lock (`LockError` after `timeout` seconds); everything
        stored stays as it was.
        """

    @abc.abstractmethod
    def get_meta(self, key: str) -> bytes | None:
        """Value of metadata `key`, or None."""

    @abc.abstractmethod
    def set_meta(self, key: str, value: bytes) -> None:
        """Set metadata `key`."""

    def check_meta(self, repair: bool = True) -> list[str]:
        """Check metadata derived from the objects (counters) against them; one line per
        mismatch, fixed when `repair`. Stores that keep nothing derived find nothing."""
        return []


# ------------------------------------------------------------- local store
class ObjectStore:
    """A repository's local store: a blob part, a transactional ref part and a maintenance part.

    A composition, not a union: callers name the part they use
    (``store.blobs.put``, ``store.refs.read_ref``, ``store.maintenance.write_lock``)
    and services are handed only that part.  Closing the store closes every part.
    """

    def __init__(self, blobs: BlobStore, refs: TransactionalRefStore,
                 maintenance: StoreMaintenance) -> None:
        self._blobs = blobs
        self._refs = refs
        self._maintenance = maintenance

    @property
    def blobs(self) -> BlobStore:
        """The blob part."""
        return self._blobs

    @property
    def refs(self) -> TransactionalRefStore:
        """The ref part (transactional: a local store can batch ref moves)."""
        return self._refs

    @property
    def maintenance(self) -> StoreMaintenance:
        """The maintenance part."""
        return self._maintenance

    def close(self) -> None:
        """Close every part (each close is idempotent)."""
        for part in (self._maintenance, self._refs, self._blobs):
            part.close()

    def __enter__(self: _S) -> _S:  # noqa: PYI019 - typing.Self needs Python 3.11
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
