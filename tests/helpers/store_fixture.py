"""What the store contracts share: a fresh store per test, the part each contract tests, and
helpers (`blob`, `corrupt_object`: it flips a stored byte in any of the stores, reaching into
their internals from here so that no production class carries a test-only method)."""
from __future__ import annotations

import random
from typing import Any

from mvc.store import MemoryBlobStore, ObjectStore
from mvc.store.lmdb_blobs import LmdbBlobStore
from mvc.store.objstore import Remote, RemoteBlobStore
from mvc.store.objstore.blobs import loose_key

A = "a" * 32
B = "b" * 32
C = "c" * 32


def blob(n: int, seed: int = 0) -> bytes:
    """Deterministic pseudo-random bytes."""
    return random.Random(seed).randbytes(n)


def _flip(data: bytes, byte_index: int) -> bytes:
    out = bytearray(data)
    out[byte_index] ^= 0xFF
    return bytes(out)


def corrupt_object(store: Any, oid: str, byte_index: int) -> None:
    """Flip byte `byte_index` of the stored value of `oid`, keeping its key.

    `store` is a blob part (in-memory, LMDB or a remote's) or something that has one
    (a local `ObjectStore`, a `Remote`).  A remote's object must be stored loose.
    """
    blobs = store.blobs if isinstance(store, (ObjectStore, Remote)) else store
    if isinstance(blobs, MemoryBlobStore):
        with blobs._mutex:
            blobs._objects[oid] = _flip(blobs._objects[oid], byte_index)
    elif isinstance(blobs, LmdbBlobStore):
        key = oid.encode("ascii")  # how lmdb_blobs keys an object
        h = blobs._conn.handle()

        def flip(txn: Any) -> None:
            txn.put(key, _flip(txn.get(key, db=h.dbs["objects"]), byte_index), db=h.dbs["objects"])
        h.write(flip)
    elif isinstance(blobs, RemoteBlobStore):
        got = blobs.storage.get(loose_key(oid))
        assert got is not None, f"{oid} is not stored loose"
        blobs.storage.put(loose_key(oid), _flip(got.data, byte_index))
    else:
        raise TypeError(f"corrupt_object does not know {type(blobs).__name__}")


class StoreFixture:
    """A fresh store per test: subclasses provide `make_store()`.

    `blobs_of` / `refs_of` pick the part a contract tests out of what `make_store()`
    made: by default that is the part itself.
    """

    store: Any

    def make_store(self) -> Any:  # pragma: no cover - overridden
        raise NotImplementedError

    def cleanup_store(self, store: Any) -> None:
        store.close()

    def setup_method(self) -> None:
        self.store = self.make_store()

    def teardown_method(self) -> None:
        self.cleanup_store(self.store)

    def blobs_of(self, store: Any) -> Any:
        """The blob part of `store` (a store of one part: itself)."""
        return store

    def refs_of(self, store: Any) -> Any:
        """The ref part of `store` (a store of one part: itself)."""
        return store

    @property
    def blobs(self) -> Any:
        """The blob part under test."""
        return self.blobs_of(self.store)

    @property
    def refs(self) -> Any:
        """The ref part under test."""
        return self.refs_of(self.store)


class WholeStore(StoreFixture):
    """`make_store()` makes a whole local store (`ObjectStore`): each contract gets its part."""

    def blobs_of(self, store: Any) -> Any:
        return store.blobs

    def refs_of(self, store: Any) -> Any:
        return store.refs

    @property
    def maintenance(self) -> Any:
        """The maintenance part under test."""
        return self.store.maintenance
