"""In-memory stores, for tests and throwaway repositories.

`MemoryStore` is an `ObjectStore` composed of three parts that also work
alone: `MemoryBlobStore`, `MemoryRefStore` (transactional) and
`MemoryMaintenance`.  Same semantics as the LMDB store (verify on read, CAS
refs, reflog); each part is guarded by its own mutex, and the write lock only
excludes threads (nothing is shared across processes).
"""
from __future__ import annotations

import time
from collections.abc import Iterable, Iterator, Sequence
from contextlib import AbstractContextManager
from threading import Lock

from mvc.store.base import (
    ANY,
    FORMAT_KEY,
    SUPPORTED_FORMAT,
    BytesLike,
    IntegrityError,
    ObjectMissingError,
    OnCorrupt,
    RefConflictError,
    ReflogEntry,
    RefUpdate,
    StoreClosedError,
    check_oid,
    check_prefix,
    check_ref_name,
    check_update,
    object_id,
)
from mvc.store.contracts import (
    BlobStore,
    ObjectStore,
    StoreMaintenance,
    TransactionalRefStore,
)
from mvc.store.lock import ThreadLock


class _Closable:
    """The closed flag every in-memory part checks before each call."""

    _closed = False

    def _check_open(self) -> None:
        if self._closed:
            raise StoreClosedError("store used after close()")

    def close(self) -> None:
        """Later calls raise `StoreClosedError`."""
        self._closed = True


class MemoryBlobStore(_Closable, BlobStore):
    """Content-addressed objects in a dict, with a running total of their lengths."""

    def __init__(self) -> None:
        self._mutex = Lock()
        self._objects: dict[str, bytes] = {}
        self._object_bytes = 0

    def put(self, data: BytesLike) -> str:
        """Store `data` (idempotent) and return its id."""
        return self.put_many([data])[0]

    def put_many(self, items: Iterable[BytesLike]) -> list[str]:
        """Store many objects; return their ids in order."""
        self._check_open()
        out = []
        for data in items:
            oid = object_id(data)
            with self._mutex:
                if oid not in self._objects:
                    blob = bytes(data)
                    self._objects[oid] = blob
                    self._object_bytes += len(blob)
            out.append(oid)
        return out

    def _raw(self, oid: str) -> bytes:
        check_oid(oid)
        self._check_open()
        with self._mutex:
            blob = self._objects.get(oid)
        if blob is None:
            raise ObjectMissingError(oid)
        return blob

    def get(self, oid: str) -> bytes:
        """Return the verified content of `oid`."""
        blob = self._raw(oid)
        actual = object_id(blob)
        if actual != oid:
            raise IntegrityError(oid, actual)
        return blob

    def has(self, oid: str) -> bool:
        """Whether `oid` is stored."""
        check_oid(oid)
        self._check_open()
        with self._mutex:
            return oid in self._objects

    def size(self, oid: str) -> int:
        """Stored length of `oid`."""
        return len(self._raw(oid))

    def iter_ids(self) -> Iterator[str]:
        """Every stored id, sorted (a snapshot taken at the call)."""
        self._check_open()
        with self._mutex:
            ids = sorted(self._objects)
        return iter(ids)

    def ids_with_prefix(self, prefix: str) -> list[str]:
        """Sorted ids starting with `prefix`."""
        check_prefix(prefix)
        self._check_open()
        with self._mutex:
            return sorted(k for k in self._objects if k.startswith(prefix))

    def delete(self, oids: Iterable[str]) -> int:
        """Remove objects; return bytes removed."""
        self._check_open()
        removed = 0
        for oid in oids:
            check_oid(oid)
            with self._mutex:
                blob = self._objects.pop(oid, None)
                if blob is not None:
                    removed += len(blob)
                    self._object_bytes -= len(blob)
        return removed

    def object_bytes(self) -> int:
        """Sum of stored object lengths."""
        with self._mutex:
            return self._object_bytes

    def compact(self) -> None:
        """Rebuild the dict: a dict keeps its table size after deletions, a copy does not."""
        self._check_open()
        with self._mutex:
            self._objects = dict(self._objects)


class MemoryRefStore(_Closable, TransactionalRefStore):
    """Refs and reflog in dicts; a batch of updates is applied to a copy and swapped in."""

    def __init__(self) -> None:
        self._mutex = Lock()
        self._refs: dict[str, str] = {}
        self._reflog: dict[str, list[ReflogEntry]] = {}

    def read_ref(self, name: str) -> str | None:
        """Raw value of ref `name`, or None."""
        check_ref_name(name)
        self._check_open()
        with self._mutex:
            return self._refs.get(name)

    def iter_refs(self, prefix: str = "", *,
                  on_corrupt: OnCorrupt | None = None) -> Iterator[tuple[str, str]]:
        """(name, value) of refs starting with `prefix`, sorted.

        Values are kept as validated Python strings, so nothing here can be
        unreadable and `on_corrupt` is never called (it is accepted for the contract).
        """
        self._check_open()
        with self._mutex:
            items = sorted((k, v) for k, v in self._refs.items() if k.startswith(prefix))
        return iter(items)

    def update_refs(self, updates: Sequence[RefUpdate], reason: str) -> None:
        """Atomic compare-and-swap of several refs, with reflog entries."""
        self._check_open()
        updates = list(updates)
        for u in updates:
            check_update(u)
        now = time.time()
        with self._mutex:
            refs = dict(self._refs)
            log: list[tuple[str, ReflogEntry]] = []
            for u in updates:
                current = refs.get(u.name)
                if u.old is not ANY and current != u.old:
                    raise RefConflictError(u.name, u.old, current)
                if u.new is None:
                    refs.pop(u.name, None)
                else:
                    refs[u.name] = u.new
                log.append((u.name, ReflogEntry(current, u.new, now, reason)))
            self._refs = refs
            for name, entry in log:
                self._reflog.setdefault(name, []).append(entry)

    def reflog(self, name: str, *, on_corrupt: OnCorrupt | None = None) -> list[ReflogEntry]:
        """Moves of `name`, oldest first (entries are kept decoded: never corrupt)."""
        check_ref_name(name)
        self._check_open()
        with self._mutex:
            return list(self._reflog.get(name, ()))

    def reflog_names(self, *, on_corrupt: OnCorrupt | None = None) -> list[str]:
        """Names with reflog entries, sorted."""
        self._check_open()
        with self._mutex:
            return sorted(k for k, v in self._reflog.items() if v)

    def delete_reflog(self, name: str) -> None:
        """Forget the reflog of `name`."""
        check_ref_name(name)
        self._check_open()
        with self._mutex:
            self._reflog.pop(name, None)


class MemoryMaintenance(_Closable, StoreMaintenance):
    """Metadata in a dict, a thread-only write lock, and shrink as a compaction of `blobs`."""

    def __init__(self, blobs: MemoryBlobStore) -> None:
        self._mutex = Lock()
        self._blobs = blobs
        self._meta: dict[str, bytes] = {FORMAT_KEY: str(SUPPORTED_FORMAT).encode()}
        self._write_lock = ThreadLock()

    def get_meta(self, key: str) -> bytes | None:
        """Metadata value or None."""
        self._check_open()
        with self._mutex:
            return self._meta.get(key)

    def set_meta(self, key: str, value: bytes) -> None:
        """Set a metadata value."""
        self._check_open()
        with self._mutex:
            self._meta[key] = bytes(value)

    def write_lock(self, timeout: float = 60.0) -> AbstractContextManager[None]:
        """Hold this store's write lock (threads only: nothing is shared across processes)."""
        self._check_open()
        return self._write_lock.hold(timeout)

    def disk_usage(self) -> int:
        """In memory: the object bytes stand in for the footprint."""
        return self._blobs.object_bytes()

    def shrink(self, timeout: float = 60.0) -> tuple[int, int]:
        """Compact the object dict under the write lock; return (usage before, after)."""
        with self.write_lock(timeout):
            before = self.disk_usage()
            self._blobs.compact()
            return before, self.disk_usage()


class MemoryStore(ObjectStore):
    """Objects, refs, reflog and metadata held in Python dicts (`memory:` in `open_store`)."""

    def __init__(self) -> None:
        blobs = MemoryBlobStore()
        super().__init__(blobs, MemoryRefStore(), MemoryMaintenance(blobs))
