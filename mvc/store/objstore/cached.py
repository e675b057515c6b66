"""`ReadThroughBlobs`: a remote's objects read through a local cache (read-only).

Reading a revision straight from a remote (`mvc.remote.readonly`) fetches each object it
needs; with a cache directory, what was fetched once is kept in a local LMDB store there and
read from it afterwards.  Objects are content-addressed, so a cached copy can never be stale:
the cache needs no invalidation, and every read from it is verified against the id as any
local read is.  Nothing is ever written to the remote through this store.
"""
from __future__ import annotations

import os
from collections.abc import Iterable, Iterator

from mvc.errors import UsageError
from mvc.store.base import BytesLike
from mvc.store.contracts import BlobStore
from mvc.store.lmdb_store import LmdbStore
from mvc.store.lmdb_env import STORE_DIR


class ReadOnlyRemoteError(UsageError):
    """A write to a remote opened for reading only (`mvc.remote.readonly`)."""

    exit_code = 184


def open_cache(path: str | os.PathLike[str]) -> LmdbStore:
    """The object cache at `path` (a directory, created if needed): an LMDB store, of which
    only the blobs are used."""
    p = os.fspath(path)
    if os.path.isdir(os.path.join(p, STORE_DIR)):
        return LmdbStore.open(p)
    os.makedirs(p, exist_ok=True)
    return LmdbStore.create(p)


class ReadThroughBlobs(BlobStore):
    """`remote`'s objects, each kept in `cache` the first time it is read (`cache`: None
    reads the remote every time).  Writes are refused (`ReadOnlyRemoteError`)."""

    def __init__(self, remote: BlobStore, cache: BlobStore | None = None) -> None:
        self.remote = remote
        self.cache = cache

    def get(self, oid: str) -> bytes:
        if self.cache is not None and self.cache.has(oid):
            return self.cache.get(oid)
        data = self.remote.get(oid)
        if self.cache is not None:
            self.cache.put(data)
        return data

    def has(self, oid: str) -> bool:
        return (self.cache is not None and self.cache.has(oid)) or self.remote.has(oid)

    def size(self, oid: str) -> int:
        if self.cache is not None and self.cache.has(oid):
            return self.cache.size(oid)
        return self.remote.size(oid)

    def iter_ids(self) -> Iterator[str]:
        return self.remote.iter_ids()

    def ids_with_prefix(self, prefix: str) -> list[str]:
        return self.remote.ids_with_prefix(prefix)

    def put(self, data: BytesLike) -> str:
        raise ReadOnlyRemoteError("this remote is open for reading only")

    def delete(self, oids: Iterable[str]) -> int:
        raise ReadOnlyRemoteError("this remote is open for reading only")

    def close(self) -> None:
        self.remote.close()  # (the cache's store is its opener's to close)
