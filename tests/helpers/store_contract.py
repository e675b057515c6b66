"""The behaviour every store must have, one mixin test class per contract.

In the style of dulwich's ``ObjectStoreTests``: a backend's test module
subclasses the parts its store implements, with a `make_store()` that returns
a fresh, empty store (and optionally `cleanup_store(store)`):

* `BlobStoreTests` -- a `BlobStore` (objects; any backend, remotes included);
* `RefStoreTests` -- a `RefStore` (one compare-and-swap at a time, reflog);
* `TransactionalRefTests` -- a `TransactionalRefStore` (atomic batches);
* `MaintenanceTests` -- a whole local store (`ObjectStore`): metadata, the
  write lock, disk usage, shrink;
* `ObjectStoreTests` -- all of the above plus the parts' wiring
  (`StoreContract` is its old name).

Each contract's tests reach the part they test as `self.blobs`, `self.refs` or
`self.maintenance`: a suite of one part alone (a remote's blobs, `MemoryRefStore`)
makes that part, a suite of a whole local store (`MaintenanceTests`,
`ObjectStoreTests`) makes the store and hands each contract its part.  A new
backend only has to pass the parts it implements.

The shared fixture and `blob` / `corrupt_object` (which flips a stored byte in any of the
stores) live in `store_fixture`; the ref contracts in `ref_contract`.
"""
from __future__ import annotations

import array
import threading
import time

import pytest
import xxhash

from mvc.errors import DataError, MvcError, UsageError
from mvc.store import (
    BlobStore,
    BufferTooSmallError,
    IntegrityError,
    InvalidIdError,
    LockError,
    ObjectMissingError,
    RefConflictError,
    RefStore,
    StoreClosedError,
    StoreMaintenance,
    TransactionalRefStore,
)

from ref_contract import RefStoreTests, TransactionalRefTests
from store_fixture import A, StoreFixture, WholeStore, blob, corrupt_object

__all__ = ["BlobStoreTests", "MaintenanceTests", "ObjectStoreTests", "RefStoreTests",
           "TransactionalRefTests", "blob", "corrupt_object"]


class BlobStoreTests(StoreFixture):
    """`BlobStore`: put / get / has / size / list / delete / verify of immutable objects."""

    def corrupt(self, oid: str, byte_index: int) -> None:
        """Flip one byte of the stored value of `oid`, keeping its key (override per backend)."""
        corrupt_object(self.blobs, oid, byte_index)

    def test_is_a_blob_store(self) -> None:
        assert isinstance(self.blobs, BlobStore)

    def test_put_get_roundtrip_and_id(self) -> None:
        data = b"hello checkpoint"
        oid = self.blobs.put(data)
        assert oid == xxhash.xxh3_128_hexdigest(data)
        assert len(oid) == 32 and oid == oid.lower()
        got = self.blobs.get(oid)
        assert got == data and isinstance(got, bytes)

    def test_put_accepts_bytes_like(self) -> None:
        floats = array.array("f", [1.0, 2.5, -3.0])
        for data in (bytearray(b"ba"), memoryview(b"mv"), memoryview(floats)):
            oid = self.blobs.put(data)
            assert self.blobs.get(oid) == bytes(data)
            assert self.blobs.size(oid) == len(bytes(data))

    def test_empty_object(self) -> None:
        oid = self.blobs.put(b"")
        assert self.blobs.get(oid) == b""
        assert self.blobs.size(oid) == 0

    def test_put_is_idempotent(self) -> None:
        oid1 = self.blobs.put(b"same")
        before = self.blobs.object_bytes()
        oid2 = self.blobs.put(b"same")
        assert oid1 == oid2
        assert self.blobs.object_bytes() == before == 4
        assert list(self.blobs.iter_ids()) == [oid1]

    def test_put_many_keeps_order_and_duplicates(self) -> None:
        items = [b"x", b"y", b"x", b"z"]
        ids = self.blobs.put_many(items)
        assert ids == [xxhash.xxh3_128_hexdigest(i) for i in items]
        assert [self.blobs.get(i) for i in ids] == items
        assert self.blobs.object_bytes() == 3
        assert self.blobs.put_many([]) == []

    def test_put_many_accepts_generator(self) -> None:
        ids = self.blobs.put_many(blob(100, s) for s in range(5))
        assert [self.blobs.get(i) for i in ids] == [blob(100, s) for s in range(5)]

    def test_missing_object(self) -> None:
        with pytest.raises(ObjectMissingError) as ei:
            self.blobs.get(A)
        assert ei.value.oid == A and A in str(ei.value)
        assert isinstance(ei.value, DataError) and ei.value.exit_code == 8
        assert not self.blobs.has(A)
        with pytest.raises(ObjectMissingError):
            self.blobs.size(A)
        with pytest.raises(ObjectMissingError):
            self.blobs.verify(A)
        with pytest.raises(ObjectMissingError):
            self.blobs.get_into(A, memoryview(bytearray(10)))

    @pytest.mark.parametrize("bad", ["", "abc", "A" * 32, "g" * 32, "a" * 33, None])
    def test_malformed_ids_rejected(self, bad: object) -> None:
        with pytest.raises(InvalidIdError) as ei:
            self.blobs.get(bad)  # type: ignore[arg-type]
        assert isinstance(ei.value, UsageError) and isinstance(ei.value, ValueError)
        with pytest.raises(InvalidIdError):
            self.blobs.has(bad)  # type: ignore[arg-type]

    def test_has_and_size(self) -> None:
        oid = self.blobs.put(b"12345")
        assert self.blobs.has(oid)
        assert self.blobs.size(oid) == 5

    def test_get_into(self) -> None:
        data = blob(1000)
        oid = self.blobs.put(data)
        out = bytearray(1500)
        assert self.blobs.get_into(oid, memoryview(out)) == 1000
        assert bytes(out[:1000]) == data and out[1000:] == bytearray(500)
        exact = bytearray(1000)
        assert self.blobs.get_into(oid, memoryview(exact)) == 1000 and bytes(exact) == data
        with pytest.raises(BufferTooSmallError):
            self.blobs.get_into(oid, memoryview(bytearray(999)))

    def test_get_into_typed_buffer(self) -> None:
        floats = array.array("f", [0.5] * 8)
        oid = self.blobs.put(memoryview(floats))
        out = array.array("f", [0.0] * 8)
        assert self.blobs.get_into(oid, memoryview(out)) == 32
        assert out == floats

    def test_iter_ids_sorted_and_complete(self) -> None:
        ids = self.blobs.put_many(i.to_bytes(4, "big") for i in range(4200))
        listed = list(self.blobs.iter_ids())
        assert listed == sorted(set(ids)) and len(listed) == 4200

    def test_ids_with_prefix(self) -> None:
        ids = sorted(self.blobs.put_many(bytes([i]) for i in range(200)))
        p = ids[0][:1]
        assert self.blobs.ids_with_prefix(p) == [i for i in ids if i.startswith(p)]
        assert self.blobs.ids_with_prefix(ids[5]) == [ids[5]]
        assert self.blobs.ids_with_prefix("") == ids
        missing = next(f"{n:04x}" for n in range(65536)
                       if not any(i.startswith(f"{n:04x}") for i in ids))
        assert self.blobs.ids_with_prefix(missing) == []
        with pytest.raises(InvalidIdError):
            self.blobs.ids_with_prefix("ABC")

    def test_delete(self) -> None:
        keep = self.blobs.put(b"keep")
        gone = self.blobs.put(b"gone!!")
        assert self.blobs.object_bytes() == 10
        assert self.blobs.delete([gone, A, gone]) == 6
        assert not self.blobs.has(gone) and self.blobs.has(keep)
        assert self.blobs.object_bytes() == 4
        assert self.blobs.delete([]) == 0
        assert list(self.blobs.iter_ids()) == [keep]
        # a deleted object can be stored again
        assert self.blobs.put(b"gone!!") == gone and self.blobs.get(gone) == b"gone!!"

    def test_verify(self) -> None:
        oid = self.blobs.put(b"fine")
        assert self.blobs.verify(oid) is None

    def test_corruption_detected(self) -> None:
        good = self.blobs.put(b"untouched")
        oid = self.blobs.put(blob(256))
        self.corrupt(oid, 100)
        assert self.blobs.has(oid) and self.blobs.size(oid) == 256
        for call in (lambda: self.blobs.get(oid), lambda: self.blobs.verify(oid),
                     lambda: self.blobs.get_into(oid, memoryview(bytearray(256)))):
            with pytest.raises(IntegrityError) as ei:
                call()
            assert ei.value.oid == oid and oid in str(ei.value)
            assert ei.value.exit_code == 7 and isinstance(ei.value, DataError)
        assert self.blobs.get(good) == b"untouched"
        # repair: delete and put again
        self.blobs.delete([oid])
        assert self.blobs.put(blob(256)) == oid
        self.blobs.verify(oid)

    def test_big_values(self) -> None:
        data = blob(5 * 1024 * 1024 + 3, seed=7)
        oid = self.blobs.put(data)
        assert self.blobs.get(oid) == data
        out = bytearray(len(data))
        assert self.blobs.get_into(oid, memoryview(out)) == len(data) and out == data
        assert self.blobs.object_bytes() == len(data)

    def test_object_bytes(self) -> None:
        assert self.blobs.object_bytes() == 0
        self.blobs.put_many([b"a" * 10, b"b" * 20])
        assert self.blobs.object_bytes() == 30

    # ------------------------------------------------------ concurrency
    def test_concurrent_writers_and_readers(self) -> None:
        base = self.blobs.put_many(blob(2000, s) for s in range(20))
        failures: list[BaseException] = []

        def writer(k: int) -> None:
            try:
                for s in range(15):
                    oid = self.blobs.put(blob(3000, 1000 * k + s))
                    assert self.blobs.get(oid) == blob(3000, 1000 * k + s)
            except BaseException as e:  # noqa: BLE001
                failures.append(e)

        def reader() -> None:
            try:
                for _ in range(5):
                    for s, oid in enumerate(base):
                        assert self.blobs.get(oid) == blob(2000, s)
            except BaseException as e:  # noqa: BLE001
                failures.append(e)
        threads = [threading.Thread(target=writer, args=(k,)) for k in range(3)]
        threads += [threading.Thread(target=reader) for _ in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert failures == []
        assert len(list(self.blobs.iter_ids())) == 20 + 45

    # ---------------------------------------------------------- lifecycle
    def test_use_after_close(self) -> None:
        store = self.make_store()
        blobs = self.blobs_of(store)
        oid = blobs.put(b"x")
        store.close()
        store.close()  # idempotent
        with pytest.raises(StoreClosedError):
            blobs.get(oid)


class MaintenanceTests(WholeStore):
    """`StoreMaintenance` of a whole local store (`ObjectStore`): metadata, the write lock,
    disk usage and shrink, which must keep every object, ref and reflog entry."""

    def test_is_maintained(self) -> None:
        assert isinstance(self.maintenance, StoreMaintenance)

    def test_disk_usage(self) -> None:
        self.blobs.put_many([b"a" * 10, b"b" * 20])
        assert self.maintenance.disk_usage() > 0

    def test_check_meta_finds_nothing_on_a_sound_store(self) -> None:
        gone = self.blobs.put(b"gone")
        self.blobs.put_many([b"kept", blob(1000)])
        self.blobs.delete([gone])
        assert self.maintenance.check_meta(repair=False) == []
        assert self.maintenance.check_meta() == []

    def test_shrink_keeps_everything(self) -> None:
        ids = self.blobs.put_many(blob(200_000, i) for i in range(10))
        self.refs.update_ref("refs/heads/main", None, ids[0], "c")
        self.maintenance.set_meta("k", b"v")
        self.blobs.delete(ids[2:])
        before, after = self.maintenance.shrink()
        assert isinstance(before, int) and isinstance(after, int) and 0 < after <= before
        assert self.maintenance.disk_usage() == after
        assert self.blobs.get(ids[0]) == blob(200_000, 0) and self.blobs.get(ids[1]) == blob(200_000, 1)
        assert not self.blobs.has(ids[2])
        assert list(self.blobs.iter_ids()) == sorted(ids[:2])
        assert self.refs.read_ref("refs/heads/main") == ids[0]
        assert [e.reason for e in self.refs.reflog("refs/heads/main")] == ["c"]
        assert self.maintenance.get_meta("k") == b"v" and self.blobs.object_bytes() == 400_000
        assert self.blobs.get(self.blobs.put(b"after shrink")) == b"after shrink"

    def test_shrink_takes_the_write_lock(self) -> None:
        self.blobs.put(b"x")
        held, release = threading.Event(), threading.Event()

        def holder() -> None:
            with self.maintenance.write_lock(timeout=5):
                held.set()
                release.wait(10)
        t = threading.Thread(target=holder)
        t.start()
        held.wait(5)
        try:
            with pytest.raises(LockError):
                self.maintenance.shrink(timeout=0.2)
        finally:
            release.set()
            t.join()
        with self.maintenance.write_lock(timeout=5):
            self.maintenance.shrink(timeout=5)  # reentrant for the holder

    def test_use_after_close_maintenance(self) -> None:
        store = self.make_store()
        store.close()
        with pytest.raises(StoreClosedError):
            store.maintenance.write_lock(timeout=1)
        with pytest.raises(StoreClosedError):
            store.maintenance.get_meta("format_version")

    def test_meta(self) -> None:
        assert self.maintenance.get_meta("nope") is None
        self.maintenance.set_meta("config", b'{"a": 1}')
        assert self.maintenance.get_meta("config") == b'{"a": 1}'
        self.maintenance.set_meta("config", b"")
        assert self.maintenance.get_meta("config") == b""
        assert self.maintenance.get_meta("format_version") == b"1"

    # --------------------------------------------------------- write lock
    def test_write_lock_reentrant(self) -> None:
        with self.maintenance.write_lock(timeout=1):
            with self.maintenance.write_lock(timeout=1):
                pass
            self._assert_other_thread_blocked()
        self._assert_other_thread_gets_it()

    def _assert_other_thread_blocked(self) -> None:
        errors: list[BaseException] = []

        def other() -> None:
            try:
                with self.maintenance.write_lock(timeout=0.2):
                    pass
            except BaseException as e:  # noqa: BLE001 - collected for the assert
                errors.append(e)
        t = threading.Thread(target=other)
        t.start()
        t.join()
        assert len(errors) == 1 and isinstance(errors[0], LockError)
        assert errors[0].exit_code == 10 and "locked" in str(errors[0])

    def _assert_other_thread_gets_it(self) -> None:
        got = []

        def other() -> None:
            with self.maintenance.write_lock(timeout=2):
                got.append(True)
        t = threading.Thread(target=other)
        t.start()
        t.join()
        assert got == [True]

    def test_write_lock_excludes_threads(self) -> None:
        inside = [0]
        overlaps = [0]
        counter = [0]

        def worker() -> None:
            for _ in range(20):
                with self.maintenance.write_lock(timeout=30):
                    inside[0] += 1
                    if inside[0] > 1:
                        overlaps[0] += 1
                    value = counter[0]
                    time.sleep(0.0005)
                    counter[0] = value + 1
                    inside[0] -= 1
        threads = [threading.Thread(target=worker) for _ in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert overlaps[0] == 0 and counter[0] == 80

    def test_write_lock_timeout_then_release(self) -> None:
        release = threading.Event()
        held = threading.Event()

        def holder() -> None:
            with self.maintenance.write_lock(timeout=5):
                held.set()
                release.wait(10)
        t = threading.Thread(target=holder)
        t.start()
        held.wait(5)
        with pytest.raises(LockError), self.maintenance.write_lock(timeout=0.1):
            pass
        release.set()
        t.join()
        with self.maintenance.write_lock(timeout=5):
            pass


class ObjectStoreTests(BlobStoreTests, RefStoreTests, TransactionalRefTests, MaintenanceTests):
    """A repository's local store: every part, and the parts wired to one store (a
    `MaintenanceTests`, so each contract is handed its part)."""

    def test_parts_share_one_store(self) -> None:
        assert isinstance(self.store.blobs, BlobStore)
        assert isinstance(self.store.refs, TransactionalRefStore)
        assert isinstance(self.store.maintenance, StoreMaintenance)
        # a composition of its parts, not a union of them: callers name the part they use
        assert not isinstance(self.store, (BlobStore, RefStore, StoreMaintenance))
        oid = self.store.blobs.put(b"through the part")
        assert self.blobs.get(oid) == b"through the part" and self.blobs.object_bytes() == 16
        self.store.refs.update_ref("refs/heads/p", None, oid, "part")
        assert self.refs.read_ref("refs/heads/p") == oid
        self.store.maintenance.set_meta("k", b"v")
        assert self.maintenance.get_meta("k") == b"v"

    def test_error_classes(self) -> None:
        codes = [c.exit_code for c in (IntegrityError, ObjectMissingError, LockError,
                                       RefConflictError)]
        assert codes == [7, 8, 10, 11]
        assert all(issubclass(c, MvcError) for c in (LockError, RefConflictError))
        import mvc.store as st
        classes = [getattr(st, n) for n in st.__all__
                   if isinstance(getattr(st, n), type) and issubclass(getattr(st, n), MvcError)]
        all_codes = [c.exit_code for c in classes]
        assert len(set(all_codes)) == len(all_codes) == 19
        # 90-91: unreadable ref / reflog records (CorruptRefError, CorruptReflogError);
        # 120-122: store locations (UnsupportedLocationError, RemoteNotSupportedError) and
        # ref batches asked of a ref store without them (RefBatchUnsupportedError)
        assert all(c in (7, 8, 9, 10, 11, 90, 91) or 60 <= c <= 69 or 120 <= c <= 124
                   for c in all_codes)


#: The old name of the whole suite.
StoreContract = ObjectStoreTests
