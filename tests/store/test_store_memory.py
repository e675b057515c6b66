"""The store contract against the in-memory store, its parts alone, and minimal backends.

`MemoryStore` passes the whole suite; `MemoryBlobStore` and `MemoryRefStore`
pass their parts on their own.  Two test-only backends show what a new backend
has to implement: `MinimalBlobStore` writes only `BlobStore`'s abstract
methods (the defaults do the rest), and `OneRefAtATime` is a `RefStore`
without batches, which passes `RefStoreTests` and is refused where a batch is
needed.
"""
from __future__ import annotations

from collections.abc import Iterable, Iterator

import pytest
from store_contract import (
    BlobStoreTests,
    ObjectStoreTests,
    RefStoreTests,
    TransactionalRefTests,
)

from mvc.store import (
    BlobStore,
    IntegrityError,
    MemoryBlobStore,
    MemoryRefStore,
    MemoryStore,
    ObjectMissingError,
    OnCorrupt,
    RefBatchUnsupportedError,
    RefExpect,
    ReflogEntry,
    RefStore,
    StoreClosedError,
    object_id,
    require_transactional,
)
from mvc.store.base import BytesLike, check_oid


class TestMemoryStore(ObjectStoreTests):
    def make_store(self) -> MemoryStore:
        return MemoryStore()


class TestMemoryBlobStoreAlone(BlobStoreTests):
    def make_store(self) -> MemoryBlobStore:
        return MemoryBlobStore()


class TestMemoryRefStoreAlone(RefStoreTests, TransactionalRefTests):
    def make_store(self) -> MemoryRefStore:
        return MemoryRefStore()


# ------------------------------------------------------- minimal backends
class MinimalBlobStore(BlobStore):
    """Only the abstract methods of `BlobStore`: put_many, get_into, ids_with_prefix,
    verify and object_bytes come from the contract's defaults."""

    def __init__(self) -> None:
        self._objects: dict[str, bytes] = {}
        self._closed = False

    def _open(self) -> dict[str, bytes]:
        if self._closed:
            raise StoreClosedError("store used after close()")
        return self._objects

    def put(self, data: BytesLike) -> str:
        oid = object_id(data)
        self._open().setdefault(oid, bytes(data))
        return oid

    def get(self, oid: str) -> bytes:
        data = self._open().get(check_oid(oid))
        if data is None:
            raise ObjectMissingError(oid)
        if object_id(data) != oid:
            raise IntegrityError(oid, object_id(data))
        return data

    def has(self, oid: str) -> bool:
        return check_oid(oid) in self._open()

    def size(self, oid: str) -> int:
        if not self.has(oid):
            raise ObjectMissingError(oid)
        return len(self._objects[oid])

    def iter_ids(self) -> Iterator[str]:
        return iter(sorted(self._open()))

    def delete(self, oids: Iterable[str]) -> int:
        return sum(len(self._open().pop(check_oid(o), b"")) for o in oids)

    def close(self) -> None:
        self._closed = True


class TestMinimalBlobStore(BlobStoreTests):
    def make_store(self) -> MinimalBlobStore:
        return MinimalBlobStore()

    def corrupt(self, oid: str, byte_index: int) -> None:
        data = bytearray(self.store._objects[oid])
        data[byte_index] ^= 0xFF
        self.store._objects[oid] = bytes(data)


class OneRefAtATime(RefStore):
    """A ref store that moves one ref per call (as object storage does): no `update_refs`."""

    def __init__(self) -> None:
        self._inner = MemoryRefStore()

    def read_ref(self, name: str) -> str | None:
        return self._inner.read_ref(name)

    def iter_refs(self, prefix: str = "", *,
                  on_corrupt: OnCorrupt | None = None) -> Iterator[tuple[str, str]]:
        return self._inner.iter_refs(prefix, on_corrupt=on_corrupt)

    def update_ref(self, name: str, old: RefExpect, new: str | None, reason: str) -> None:
        self._inner.update_ref(name, old, new, reason)

    def reflog(self, name: str, *, on_corrupt: OnCorrupt | None = None) -> list[ReflogEntry]:
        return self._inner.reflog(name, on_corrupt=on_corrupt)

    def reflog_names(self, *, on_corrupt: OnCorrupt | None = None) -> list[str]:
        return self._inner.reflog_names(on_corrupt=on_corrupt)

    def delete_reflog(self, name: str) -> None:
        self._inner.delete_reflog(name)

    def close(self) -> None:
        self._inner.close()


class TestOneRefAtATime(RefStoreTests):
    def make_store(self) -> OneRefAtATime:
        return OneRefAtATime()

    def test_a_batch_is_refused_before_anything_moves(self) -> None:
        assert not hasattr(self.store, "update_refs")
        with pytest.raises(RefBatchUnsupportedError) as ei:
            require_transactional(self.store, "publishing a replacement")
        assert ei.value.exit_code == 122
        assert "publishing a replacement" in str(ei.value) and "OneRefAtATime" in str(ei.value)


def test_memory_shrink_compacts_the_object_dict() -> None:
    store = MemoryStore()
    ids = store.blobs.put_many(bytes([i]) * 100 for i in range(50))
    store.blobs.delete(ids[1:])
    blobs = store.blobs
    assert isinstance(blobs, MemoryBlobStore)
    table = blobs._objects
    assert store.maintenance.shrink() == (100, 100)
    assert blobs._objects is not table and blobs._objects == {ids[0]: bytes([0]) * 100}
