"""Maintenance of the LMDB store: metadata, the object-bytes counter, write lock, shrink.

The ``meta`` database holds small values by key: the format version
(`FORMAT_KEY`, checked on every attach), the repository id (`REPO_ID_KEY`),
the object-bytes counter (moved by the blob part in the same transaction as
each put and delete) and whatever the repository layer keeps there.
"""
from __future__ import annotations

import os
from contextlib import AbstractContextManager
from typing import Any

from mvc.store.base import (
    FORMAT_KEY,
    REPO_ID_KEY,
    SUPPORTED_FORMAT,
    FormatTooNewError,
    LockError,
    StoreClosedError,
    StoreExistsError,
    StoreFormatError,
)
from mvc.store.contracts import StoreMaintenance
from mvc.store.lmdb_env import DATA_FILE, STORE_DIR, EnvHandle, LmdbConnection
from mvc.store.lock import FileLock

FORMAT_KEY_B = FORMAT_KEY.encode()
OBJECT_BYTES_KEY = b"store.object_bytes"


# ------------------------------------------------------------ object-bytes counter
def parse_count(raw: Any) -> int | None:
    """The object-bytes counter as stored (ASCII digits), or None if it is missing or garbled."""
    if raw is None:
        return None
    b = bytes(raw)
    return int(b) if 0 < len(b) <= 20 and b.isdigit() else None


def count_object_bytes(txn: Any, h: EnvHandle) -> int:
    """Sum of every object's length, read in `txn` (lengths only: values stay in the map).

    py-lmdb pages each value in as the cursor reaches it: each one is unmapped again
    (`EnvHandle.release`), so a recount (fsck's) does not leave the whole store in this
    process's resident set."""
    cur = txn.cursor(db=h.dbs["objects"])
    total = 0
    for v in cur.iternext(keys=False, values=True):
        total += len(v)
        h.release(v)
    return total


def add_object_bytes(txn: Any, h: EnvHandle, delta: int) -> None:
    """Move the object-bytes counter by `delta` (called after the objects changed in `txn`).

    An unreadable counter is recounted from the objects themselves, never an
    error: it is derived data, and a flipped byte in it must not block every
    later commit.
    """
    meta = h.dbs["meta"]
    total = parse_count(txn.get(OBJECT_BYTES_KEY, db=meta))
    total = count_object_bytes(txn, h) if total is None else max(total + delta, 0)
    txn.put(OBJECT_BYTES_KEY, str(total).encode(), db=meta)


def read_object_bytes(h: EnvHandle) -> int:
    """The counter's value (recounted, not stored, if unreadable)."""
    def fn(txn: Any) -> int:
        total = parse_count(txn.get(OBJECT_BYTES_KEY, db=h.dbs["meta"]))
        return count_object_bytes(txn, h) if total is None else total
    return h.read(fn, buffers=True)


def _printable(raw: bytes | None) -> str:
    return "missing" if raw is None else repr(bytes(raw[:40]))


# --------------------------------------------------------------------- format
def write_initial_meta(txn: Any, h: EnvHandle, repo_id: str) -> None:
    """The metadata of a new store: format version, an empty counter, the repository id."""
    meta = h.dbs["meta"]
    txn.put(FORMAT_KEY_B, str(SUPPORTED_FORMAT).encode(), db=meta, overwrite=False)
    txn.put(OBJECT_BYTES_KEY, b"0", db=meta, overwrite=False)
    txn.put(REPO_ID_KEY.encode(), repo_id.encode(), db=meta, overwrite=False)


def check_format(handle: EnvHandle) -> None:
    """Refuse a store with no readable format version, or a newer one than this mvc reads."""
    raw = handle.read(lambda txn: txn.get(FORMAT_KEY_B, db=handle.dbs["meta"]))
    if raw is None:
        raise StoreFormatError(f"the store at {handle.root} has no format version")
    try:
        found = int(raw.decode("ascii"))
    except ValueError as e:
        raise StoreFormatError(f"unreadable store format version {raw!r}") from e
    if found > SUPPORTED_FORMAT:
        raise FormatTooNewError(found, SUPPORTED_FORMAT)


class LmdbMaintenance(StoreMaintenance):
    """The ``meta`` database, the ``.mvc/lock`` write lock, disk usage and shrink."""

    def __init__(self, conn: LmdbConnection, lock: FileLock) -> None:
        self._conn = conn
        self._lock = lock

    def close(self) -> None:
        """Close the store this part belongs to (its parts share one connection)."""
        self._conn.close()

    # ------------------------------------------------------------------ meta
    def get_meta(self, key: str) -> bytes | None:
        """Metadata value or None."""
        k = key.encode("utf-8")
        h = self._conn.handle()
        return h.read(lambda txn: txn.get(k, db=h.dbs["meta"]))

    def set_meta(self, key: str, value: bytes) -> None:
        """Set a metadata value."""
        k = key.encode("utf-8")
        v = bytes(value)
        h = self._conn.handle()
        h.write(lambda txn: txn.put(k, v, db=h.dbs["meta"]))

    def check_meta(self, repair: bool = True) -> list[str]:
        """Check every page of the store file (`EnvHandle.check_pages`: raises StoreFormatError
        for a damaged one), then recount the object-bytes counter; one line if it was wrong
        (and, with `repair`, fixed)."""
        h = self._conn.handle()
        h.check_pages()

        def fn(txn: Any) -> tuple[bytes | None, int]:
            raw = txn.get(OBJECT_BYTES_KEY, db=h.dbs["meta"])
            return (None if raw is None else bytes(raw)), count_object_bytes(txn, h)

        def fix(txn: Any) -> tuple[bytes | None, int]:
            found = fn(txn)
            txn.put(OBJECT_BYTES_KEY, str(found[1]).encode(), db=h.dbs["meta"])
            return found
        raw, actual = h.read(fn, buffers=True)
        if parse_count(raw) == actual:
            return []
        if repair:
            raw, actual = h.write(fix)
        what = "repaired" if repair else "not repaired"
        return [f"store metadata: object byte counter {_printable(raw)} != {actual} stored ({what})"]

    # ----------------------------------------------------------- maintenance
    def write_lock(self, timeout: float = 60.0) -> AbstractContextManager[None]:
        """Exclusive repository lock across threads and processes (reentrant per thread)."""
        if self._conn.closed:
            raise StoreClosedError("store used after close()")
        return self._lock.hold(timeout)

    def disk_usage(self) -> int:
        """Size of the LMDB data file in bytes."""
        return os.path.getsize(os.path.join(self._conn.root, STORE_DIR, DATA_FILE))

    def reclaimable_bytes(self) -> int:
        """The data file's bytes outside every database's pages: LMDB's free pages (later
        writes reuse them; `shrink`, a compacting copy, leaves them out)."""
        h = self._conn.handle()

        def used_pages(env: Any) -> int:
            def pages(s: dict) -> int:
                return int(s["branch_pages"] + s["leaf_pages"] + s["overflow_pages"])

            with env.begin() as txn:  # the main database holds the named ones' records
                return pages(env.stat()) + sum(pages(txn.stat(db)) for db in h.dbs.values())

        def measure(env: Any) -> tuple[int, int]:
            return used_pages(env), int(env.stat()["psize"])

        used, page = h.with_env(measure)
        # Two meta pages open every LMDB file.
        return max(0, self.disk_usage() - (used + 2) * page)

    def map_size(self) -> int:
        """Current LMDB map size of this process (for diagnostics and tests)."""
        return self._conn.handle().with_env(lambda env: env.info()["map_size"])

    def compact_copy(self, dest_dir: str | os.PathLike[str]) -> None:
        """Write a compacted, consistent copy of the environment into the empty `dest_dir`."""
        dest = os.fspath(dest_dir)
        os.makedirs(dest, exist_ok=True)
        if os.listdir(dest):
            raise StoreExistsError(f"compact_copy destination is not empty: {dest}")
        self._conn.handle().with_env(lambda env: env.copy(dest, compact=True))

    def shrink(self, timeout: float = 60.0) -> tuple[int, int]:
        """Replace the data file by a compacted copy; return (bytes before, bytes after).

        Crash safety: the copy is written and fsynced in ``store.new`` while the
        live ``store`` is untouched; then ``store -> store.old`` and
        ``store.new -> store`` (each rename fsynced) and ``store.old`` is removed.
        A crash before the first rename leaves ``store`` intact (``store.new`` is
        discarded on open); between the renames ``store`` is missing and
        ``store.old`` is complete, so open renames it back; after the second
        rename ``store`` is the complete compacted copy and leftovers are
        removed.  Holds the write lock, and refuses (`LockError`) while another
        process has the store open, since its mapping would keep the old file.
        """
        with self.write_lock(timeout):
            h = self._conn.handle()
            with h.rw.exclusive():
                if h.env is None:
                    h.open_env()
                if not h.users.try_exclusive():
                    raise LockError("cannot shrink: the repository is open in another process")
                try:
                    return h.swap_in_compacted()
                finally:
                    h.users.downgrade()
