"""The LMDB-backed `ObjectStore`: the on-disk store of an mvc repository.

Layout of the ``.mvc`` directory this class manages::

    .mvc/store/        LMDB environment (data.mdb, lock.mdb) with the named
                       databases objects, refs, reflog and meta
    .mvc/lock          repository write lock (flock; holds the holder's pid)
    .mvc/store.users   shared flock of every process with the store open

`LmdbStore` is the composition of three parts sharing one `LmdbConnection`
(see `lmdb_env` for map growth, fork safety and thread safety; every call is
one short transaction): `LmdbBlobStore` (``objects``, `lmdb_blobs`),
`LmdbRefStore` (``refs`` and ``reflog``, `lmdb_refs`) and `LmdbMaintenance`
(``meta``, the write lock, shrink, `lmdb_meta`).  This module creates and
opens stores.
"""
from __future__ import annotations

import os
import uuid
from typing import Any

from mvc.store.base import (
    REPO_ID_KEY,
    SUPPORTED_FORMAT,
    StoreExistsError,
    StoreNotFoundError,
)
from mvc.store.contracts import ObjectStore
from mvc.store.lmdb_blobs import LmdbBlobStore
from mvc.store.lmdb_env import (
    DATA_FILE,
    LOCK_FILE,
    STORE_DIR,
    STORE_OLD,
    EnvHandle,
    LmdbConnection,
    MiB,
)
from mvc.store.lmdb_meta import LmdbMaintenance, check_format, write_initial_meta
from mvc.store.lmdb_refs import LmdbRefStore
from mvc.store.lock import FileLock

# Re-exported: the repository layer and older callers import them from here.
__all__ = ["REPO_ID_KEY", "SUPPORTED_FORMAT", "LmdbStore"]


class LmdbStore(ObjectStore):
    """Objects, refs, reflog and metadata in one LMDB environment under a ``.mvc`` directory."""

    #: First map size; tests lower it to exercise growth.
    INITIAL_MAP_SIZE = 256 * MiB
    #: Defaults of the blob part's `batch_bytes` / `batch_items`: the most one put_many
    #: transaction writes.
    BATCH_BYTES = 256 * MiB
    BATCH_ITEMS = 10_000

    def __init__(self, path: str | os.PathLike[str]) -> None:
        """Bind to the ``.mvc`` directory `path`; the environment opens on first use."""
        self.path = os.path.realpath(os.fspath(path))
        self._conn = LmdbConnection(self.path, self.INITIAL_MAP_SIZE, check_format)
        self._lmdb_maintenance = LmdbMaintenance(
            self._conn, FileLock(os.path.join(self.path, LOCK_FILE)))
        super().__init__(LmdbBlobStore(self._conn, self.BATCH_BYTES, self.BATCH_ITEMS),
                         LmdbRefStore(self._conn), self._lmdb_maintenance)

    # ------------------------------------------------------------ lifecycle
    @classmethod
    def create(cls, path: str | os.PathLike[str]) -> LmdbStore:
        """Create a new, empty store in the ``.mvc`` directory `path` (made if missing)."""
        root = os.path.realpath(os.fspath(path))
        os.makedirs(root, exist_ok=True)
        if (os.path.exists(os.path.join(root, STORE_DIR, DATA_FILE))
                or os.path.exists(os.path.join(root, STORE_OLD))):
            raise StoreExistsError(f"an mvc store already exists at {root}")
        store = cls(root)
        h = store._conn.attach(create=True)
        repo_id = uuid.uuid4().hex

        def init(txn: Any) -> None:
            write_initial_meta(txn, h, repo_id)
        h.write(init)
        return store

    @classmethod
    def open(cls, path: str | os.PathLike[str]) -> LmdbStore:
        """Open the existing store in `path` (StoreNotFoundError / FormatTooNewError)."""
        root = os.path.realpath(os.fspath(path))
        if not os.path.isdir(root):
            raise StoreNotFoundError(f"no mvc store at {root}")
        store = cls(root)
        store._h()
        return store

    def _h(self) -> EnvHandle:
        """This process's handle on the environment (tests reach into it)."""
        return self._conn.handle()

    # --------------------------------------------------------- LMDB-specific
    def map_size(self) -> int:
        """Current LMDB map size of this process (for diagnostics and tests)."""
        return self._lmdb_maintenance.map_size()

    def compact_copy(self, dest_dir: str | os.PathLike[str]) -> None:
        """Write a compacted, consistent copy of the environment into the empty `dest_dir`."""
        self._lmdb_maintenance.compact_copy(dest_dir)
