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

A new backend only has to pass the parts it implements.
"""
from __future__ import annotations

import array
import random
import threading
import time
from typing import Any

import pytest
import xxhash

from mvc.errors import DataError, MvcError, UsageError
from mvc.store import (
    ANY,
    BlobStore,
    BufferTooSmallError,
    IntegrityError,
    InvalidIdError,
    InvalidRefError,
    LockError,
    ObjectMissingError,
    RefConflictError,
    RefStore,
    RefUpdate,
    StoreClosedError,
    StoreMaintenance,
    TransactionalRefStore,
    require_transactional,
)

A = "a" * 32
B = "b" * 32
C = "c" * 32


def blob(n: int, seed: int = 0) -> bytes:
    """Deterministic pseudo-random bytes."""
    return random.Random(seed).randbytes(n)


class _StoreFixture:
    """A fresh store per test: subclasses provide `make_store()`."""

    store: Any

    def make_store(self) -> Any:  # pragma: no cover - overridden
        raise NotImplementedError

    def cleanup_store(self, store: Any) -> None:
        store.close()

    def setup_method(self) -> None:
        self.store = self.make_store()

    def teardown_method(self) -> None:
        self.cleanup_store(self.store)


class BlobStoreTests(_StoreFixture):
    """`BlobStore`: put / get / has / size / list / delete / verify of immutable objects."""

    def corrupt(self, oid: str, byte_index: int) -> None:
        """Flip one byte of the stored value of `oid`, keeping its key (override per backend)."""
        self.store._corrupt_for_test(oid, byte_index)

    def test_is_a_blob_store(self) -> None:
        assert isinstance(self.store, BlobStore)

    def test_put_get_roundtrip_and_id(self) -> None:
        data = b"hello checkpoint"
        oid = self.store.put(data)
        assert oid == xxhash.xxh3_128_hexdigest(data)
        assert len(oid) == 32 and oid == oid.lower()
        got = self.store.get(oid)
        assert got == data and isinstance(got, bytes)

    def test_put_accepts_bytes_like(self) -> None:
        floats = array.array("f", [1.0, 2.5, -3.0])
        for data in (bytearray(b"ba"), memoryview(b"mv"), memoryview(floats)):
            oid = self.store.put(data)
            assert self.store.get(oid) == bytes(data)
            assert self.store.size(oid) == len(bytes(data))

    def test_empty_object(self) -> None:
        oid = self.store.put(b"")
        assert self.store.get(oid) == b""
        assert self.store.size(oid) == 0

    def test_put_is_idempotent(self) -> None:
        oid1 = self.store.put(b"same")
        before = self.store.object_bytes()
        oid2 = self.store.put(b"same")
        assert oid1 == oid2
        assert self.store.object_bytes() == before == 4
        assert list(self.store.iter_ids()) == [oid1]

    def test_put_many_keeps_order_and_duplicates(self) -> None:
        items = [b"x", b"y", b"x", b"z"]
        ids = self.store.put_many(items)
        assert ids == [xxhash.xxh3_128_hexdigest(i) for i in items]
        assert [self.store.get(i) for i in ids] == items
        assert self.store.object_bytes() == 3
        assert self.store.put_many([]) == []

    def test_put_many_accepts_generator(self) -> None:
        ids = self.store.put_many(blob(100, s) for s in range(5))
        assert [self.store.get(i) for i in ids] == [blob(100, s) for s in range(5)]

    def test_missing_object(self) -> None:
        with pytest.raises(ObjectMissingError) as ei:
            self.store.get(A)
        assert ei.value.oid == A and A in str(ei.value)
        assert isinstance(ei.value, DataError) and ei.value.exit_code == 8
        assert not self.store.has(A)
        with pytest.raises(ObjectMissingError):
            self.store.size(A)
        with pytest.raises(ObjectMissingError):
            self.store.verify(A)
        with pytest.raises(ObjectMissingError):
            self.store.get_into(A, memoryview(bytearray(10)))

    @pytest.mark.parametrize("bad", ["", "abc", "A" * 32, "g" * 32, "a" * 33, None])
    def test_malformed_ids_rejected(self, bad: object) -> None:
        with pytest.raises(InvalidIdError) as ei:
            self.store.get(bad)  # type: ignore[arg-type]
        assert isinstance(ei.value, UsageError) and isinstance(ei.value, ValueError)
        with pytest.raises(InvalidIdError):
            self.store.has(bad)  # type: ignore[arg-type]

    def test_has_and_size(self) -> None:
        oid = self.store.put(b"12345")
        assert self.store.has(oid)
        assert self.store.size(oid) == 5

    def test_get_into(self) -> None:
        data = blob(1000)
        oid = self.store.put(data)
        out = bytearray(1500)
        assert self.store.get_into(oid, memoryview(out)) == 1000
        assert bytes(out[:1000]) == data and out[1000:] == bytearray(500)
        exact = bytearray(1000)
        assert self.store.get_into(oid, memoryview(exact)) == 1000 and bytes(exact) == data
        with pytest.raises(BufferTooSmallError):
            self.store.get_into(oid, memoryview(bytearray(999)))

    def test_get_into_typed_buffer(self) -> None:
        floats = array.array("f", [0.5] * 8)
        oid = self.store.put(memoryview(floats))
        out = array.array("f", [0.0] * 8)
        assert self.store.get_into(oid, memoryview(out)) == 32
        assert out == floats

    def test_iter_ids_sorted_and_complete(self) -> None:
        ids = self.store.put_many(i.to_bytes(4, "big") for i in range(4200))
        listed = list(self.store.iter_ids())
        assert listed == sorted(set(ids)) and len(listed) == 4200

    def test_ids_with_prefix(self) -> None:
        ids = sorted(self.store.put_many(bytes([i]) for i in range(200)))
        p = ids[0][:1]
        assert self.store.ids_with_prefix(p) == [i for i in ids if i.startswith(p)]
        assert self.store.ids_with_prefix(ids[5]) == [ids[5]]
        assert self.store.ids_with_prefix("") == ids
        missing = next(f"{n:04x}" for n in range(65536)
                       if not any(i.startswith(f"{n:04x}") for i in ids))
        assert self.store.ids_with_prefix(missing) == []
        with pytest.raises(InvalidIdError):
            self.store.ids_with_prefix("ABC")

    def test_delete(self) -> None:
        keep = self.store.put(b"keep")
        gone = self.store.put(b"gone!!")
        assert self.store.object_bytes() == 10
        assert self.store.delete([gone, A, gone]) == 6
        assert not self.store.has(gone) and self.store.has(keep)
        assert self.store.object_bytes() == 4
        assert self.store.delete([]) == 0
        assert list(self.store.iter_ids()) == [keep]
        # a deleted object can be stored again
        assert self.store.put(b"gone!!") == gone and self.store.get(gone) == b"gone!!"

    def test_verify(self) -> None:
        oid = self.store.put(b"fine")
        assert self.store.verify(oid) is None

    def test_corruption_detected(self) -> None:
        good = self.store.put(b"untouched")
        oid = self.store.put(blob(256))
        self.corrupt(oid, 100)
        assert self.store.has(oid) and self.store.size(oid) == 256
        for call in (lambda: self.store.get(oid), lambda: self.store.verify(oid),
                     lambda: self.store.get_into(oid, memoryview(bytearray(256)))):
            with pytest.raises(IntegrityError) as ei:
                call()
            assert ei.value.oid == oid and oid in str(ei.value)
            assert ei.value.exit_code == 7 and isinstance(ei.value, DataError)
        assert self.store.get(good) == b"untouched"
        # repair: delete and put again
        self.store.delete([oid])
        assert self.store.put(blob(256)) == oid
        self.store.verify(oid)

    def test_big_values(self) -> None:
        data = blob(5 * 1024 * 1024 + 3, seed=7)
        oid = self.store.put(data)
        assert self.store.get(oid) == data
        out = bytearray(len(data))
        assert self.store.get_into(oid, memoryview(out)) == len(data) and out == data
        assert self.store.object_bytes() == len(data)

    def test_object_bytes(self) -> None:
        assert self.store.object_bytes() == 0
        self.store.put_many([b"a" * 10, b"b" * 20])
        assert self.store.object_bytes() == 30

    # ------------------------------------------------------ concurrency
    def test_concurrent_writers_and_readers(self) -> None:
        base = self.store.put_many(blob(2000, s) for s in range(20))
        failures: list[BaseException] = []

        def writer(k: int) -> None:
            try:
                for s in range(15):
                    oid = self.store.put(blob(3000, 1000 * k + s))
                    assert self.store.get(oid) == blob(3000, 1000 * k + s)
            except BaseException as e:  # noqa: BLE001
                failures.append(e)

        def reader() -> None:
            try:
                for _ in range(5):
                    for s, oid in enumerate(base):
                        assert self.store.get(oid) == blob(2000, s)
            except BaseException as e:  # noqa: BLE001
                failures.append(e)
        threads = [threading.Thread(target=writer, args=(k,)) for k in range(3)]
        threads += [threading.Thread(target=reader) for _ in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert failures == []
        assert len(list(self.store.iter_ids())) == 20 + 45

    # ---------------------------------------------------------- lifecycle
    def test_use_after_close(self) -> None:
        store = self.make_store()
        oid = store.put(b"x")
        store.close()
        store.close()  # idempotent
        with pytest.raises(StoreClosedError):
            store.get(oid)


class RefStoreTests(_StoreFixture):
    """`RefStore`: refs moved one compare-and-swap at a time (`update_ref`), and the reflog."""

    def test_is_a_ref_store(self) -> None:
        assert isinstance(self.store, RefStore)

    def test_refs_create_read_iterate(self) -> None:
        assert self.store.read_ref("HEAD") is None
        self.store.update_ref("refs/heads/main", None, A, "init")
        self.store.update_ref("HEAD", None, "ref: refs/heads/main", "init")
        self.store.update_ref("refs/tags/v1", None, B, "init")
        assert self.store.read_ref("HEAD") == "ref: refs/heads/main"
        assert self.store.read_ref("refs/heads/main") == A
        assert list(self.store.iter_refs()) == [
            ("HEAD", "ref: refs/heads/main"), ("refs/heads/main", A), ("refs/tags/v1", B)]
        assert list(self.store.iter_refs("refs/heads/")) == [("refs/heads/main", A)]
        assert list(self.store.iter_refs("refs/nothing/")) == []

    def test_ref_compare_and_swap(self) -> None:
        self.store.update_ref("refs/heads/main", None, A, "c1")
        with pytest.raises(RefConflictError) as ei:
            self.store.update_ref("refs/heads/main", None, B, "dup create")
        assert ei.value.name == "refs/heads/main" and "refs/heads/main" in str(ei.value)
        assert ei.value.exit_code == 11 and ei.value.actual == A
        with pytest.raises(RefConflictError):
            self.store.update_ref("refs/heads/main", B, C, "stale")
        self.store.update_ref("refs/heads/main", A, B, "ff")
        assert self.store.read_ref("refs/heads/main") == B
        self.store.update_ref("refs/heads/main", ANY, C, "force")
        assert self.store.read_ref("refs/heads/main") == C
        self.store.update_ref("refs/heads/other", ANY, A, "force create")
        assert self.store.read_ref("refs/heads/other") == A

    def test_ref_delete(self) -> None:
        self.store.update_ref("refs/tags/t", None, A, "tag")
        with pytest.raises(RefConflictError):
            self.store.update_ref("refs/tags/t", B, None, "bad delete")
        self.store.update_ref("refs/tags/t", A, None, "delete")
        assert self.store.read_ref("refs/tags/t") is None
        assert list(self.store.iter_refs()) == []
        # deleting a missing ref with old=None is a no-op that still logs
        self.store.update_ref("refs/tags/t", None, None, "noop")
        assert [e.reason for e in self.store.reflog("refs/tags/t")] == ["tag", "delete", "noop"]

    @pytest.mark.parametrize("name", ["", " HEAD", "a\nb", "a\x00b", "x" * 401])
    def test_invalid_ref_name(self, name: str) -> None:
        with pytest.raises(InvalidRefError) as ei:
            self.store.update_ref(name, None, A, "bad")
        assert isinstance(ei.value, UsageError)

    @pytest.mark.parametrize("value", ["", "abc", "A" * 32, "ref: ", "ref:x", "ref: a\nb"])
    def test_invalid_ref_value(self, value: str) -> None:
        with pytest.raises(InvalidRefError):
            self.store.update_ref("refs/heads/x", None, value, "bad")
        assert self.store.read_ref("refs/heads/x") is None

    # -------------------------------------------------------------- reflog
    def test_reflog_order_and_content(self) -> None:
        t0 = time.time()
        self.store.update_ref("refs/heads/main", None, A, "commit: one")
        self.store.update_ref("refs/heads/main", A, B, "commit: two")
        self.store.update_ref("refs/heads/main", B, C, "reset: back")
        log = self.store.reflog("refs/heads/main")
        assert [(e.old, e.new, e.reason) for e in log] == [
            (None, A, "commit: one"), (A, B, "commit: two"), (B, C, "reset: back")]
        times = [e.time for e in log]
        assert times == sorted(times) and t0 - 1 <= times[0] <= time.time() + 1
        assert all(isinstance(t, float) for t in times)

    def test_reflog_names_and_prefix_isolation(self) -> None:
        names = ["refs/heads/a", "refs/heads/a/b", "refs/heads/ab", "HEAD"]
        for n in names:
            self.store.update_ref(n, None, A, f"create {n}")
        self.store.update_ref("refs/heads/a", A, B, "move a")
        assert self.store.reflog_names() == sorted(names)
        assert [e.reason for e in self.store.reflog("refs/heads/a")] == [
            "create refs/heads/a", "move a"]
        assert len(self.store.reflog("refs/heads/a/b")) == 1
        assert len(self.store.reflog("refs/heads/ab")) == 1
        assert self.store.reflog("refs/heads/zzz") == []
        self.store.delete_reflog("refs/heads/a")
        self.store.delete_reflog("refs/heads/never")
        assert self.store.reflog("refs/heads/a") == []
        assert self.store.reflog_names() == sorted(set(names) - {"refs/heads/a"})
        assert len(self.store.reflog("refs/heads/a/b")) == 1
        # the log restarts cleanly after deletion
        self.store.update_ref("refs/heads/a", B, C, "after")
        assert [e.reason for e in self.store.reflog("refs/heads/a")] == ["after"]

    def test_reflog_long(self) -> None:
        prev = None
        for i in range(150):
            new = f"{i:032x}"
            self.store.update_ref("HEAD", prev, new, f"step {i}")
            prev = new
        log = self.store.reflog("HEAD")
        assert [e.reason for e in log] == [f"step {i}" for i in range(150)]

    # ------------------------------------------------------ concurrency
    def test_concurrent_ref_cas(self) -> None:
        """Threads racing CAS on one ref: each successful move is logged exactly once."""
        self.store.update_ref("refs/heads/main", None, f"{0:032x}", "init")
        wins = [0]
        guard = threading.Lock()

        def racer() -> None:
            for _ in range(30):
                cur = self.store.read_ref("refs/heads/main")
                nxt = f"{int(cur, 16) + 1:032x}"
                try:
                    self.store.update_ref("refs/heads/main", cur, nxt, "inc")
                    with guard:
                        wins[0] += 1
                except RefConflictError:
                    pass
        threads = [threading.Thread(target=racer) for _ in range(3)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert int(self.store.read_ref("refs/heads/main"), 16) == wins[0]
        assert len(self.store.reflog("refs/heads/main")) == wins[0] + 1

    # ---------------------------------------------------------- lifecycle
    def test_use_after_close_refs(self) -> None:
        store = self.make_store()
        store.update_ref("HEAD", None, A, "c")
        store.close()
        store.close()
        with pytest.raises(StoreClosedError):
            store.read_ref("HEAD")


class TransactionalRefTests(_StoreFixture):
    """`TransactionalRefStore`: several compare-and-swaps in one transaction (`update_refs`)."""

    def test_is_transactional(self) -> None:
        assert isinstance(self.store, TransactionalRefStore)
        assert require_transactional(self.store, "a test") is self.store

    def test_batch_creates_refs(self) -> None:
        assert self.store.read_ref("HEAD") is None
        self.store.update_refs([RefUpdate("refs/heads/main", None, A),
                                RefUpdate("HEAD", None, "ref: refs/heads/main"),
                                RefUpdate("refs/tags/v1", None, B)], "init")
        assert self.store.read_ref("HEAD") == "ref: refs/heads/main"
        assert self.store.read_ref("refs/heads/main") == A
        assert list(self.store.iter_refs()) == [
            ("HEAD", "ref: refs/heads/main"), ("refs/heads/main", A), ("refs/tags/v1", B)]
        assert list(self.store.iter_refs("refs/heads/")) == [("refs/heads/main", A)]
        assert list(self.store.iter_refs("refs/nothing/")) == []

    def test_batch_is_atomic(self) -> None:
        self.store.update_refs([RefUpdate("refs/heads/a", None, A)], "a")
        with pytest.raises(RefConflictError) as ei:
            self.store.update_refs([RefUpdate("refs/heads/a", A, B),
                                    RefUpdate("refs/heads/new", None, B),
                                    RefUpdate("refs/heads/a", C, A)], "bad batch")
        assert ei.value.name == "refs/heads/a"
        assert self.store.read_ref("refs/heads/a") == A
        assert self.store.read_ref("refs/heads/new") is None
        assert len(self.store.reflog("refs/heads/a")) == 1
        assert self.store.reflog("refs/heads/new") == []

    def test_batch_updates_apply_in_order(self) -> None:
        self.store.update_refs([RefUpdate("r", None, A), RefUpdate("r", A, B)], "two steps")
        assert self.store.read_ref("r") == B
        assert [(e.old, e.new) for e in self.store.reflog("r")] == [(None, A), (A, B)]

    def test_invalid_update_in_batch_changes_nothing(self) -> None:
        with pytest.raises(InvalidRefError):
            self.store.update_refs([RefUpdate("refs/heads/ok", None, A),
                                    RefUpdate("refs/heads/bad", None, "not a value")], "bad")
        assert self.store.read_ref("refs/heads/ok") is None
        assert self.store.reflog("refs/heads/ok") == []


class MaintenanceTests(_StoreFixture):
    """`StoreMaintenance` of a whole local store (`ObjectStore`): metadata, the write lock,
    disk usage and shrink, which must keep every object, ref and reflog entry."""

    def test_is_maintained(self) -> None:
        assert isinstance(self.store, StoreMaintenance)

    def test_disk_usage(self) -> None:
        self.store.put_many([b"a" * 10, b"b" * 20])
        assert self.store.disk_usage() > 0

    def test_check_meta_finds_nothing_on_a_sound_store(self) -> None:
        gone = self.store.put(b"gone")
        self.store.put_many([b"kept", blob(1000)])
        self.store.delete([gone])
        assert self.store.check_meta(repair=False) == []
        assert self.store.check_meta() == []

    def test_shrink_keeps_everything(self) -> None:
        ids = self.store.put_many(blob(200_000, i) for i in range(10))
        self.store.update_ref("refs/heads/main", None, ids[0], "c")
        self.store.set_meta("k", b"v")
        self.store.delete(ids[2:])
        before, after = self.store.shrink()
        assert isinstance(before, int) and isinstance(after, int) and 0 < after <= before
        assert self.store.disk_usage() == after
        assert self.store.get(ids[0]) == blob(200_000, 0) and self.store.get(ids[1]) == blob(200_000, 1)
        assert not self.store.has(ids[2])
        assert list(self.store.iter_ids()) == sorted(ids[:2])
        assert self.store.read_ref("refs/heads/main") == ids[0]
        assert [e.reason for e in self.store.reflog("refs/heads/main")] == ["c"]
        assert self.store.get_meta("k") == b"v" and self.store.object_bytes() == 400_000
        assert self.store.get(self.store.put(b"after shrink")) == b"after shrink"

    def test_shrink_takes_the_write_lock(self) -> None:
        self.store.put(b"x")
        held, release = threading.Event(), threading.Event()

        def holder() -> None:
            with self.store.write_lock(timeout=5):
                held.set()
                release.wait(10)
        t = threading.Thread(target=holder)
        t.start()
        held.wait(5)
        try:
            with pytest.raises(LockError):
                self.store.shrink(timeout=0.2)
        finally:
            release.set()
            t.join()
        with self.store.write_lock(timeout=5):
            self.store.shrink(timeout=5)  # reentrant for the holder

    def test_use_after_close_maintenance(self) -> None:
        store = self.make_store()
        store.close()
        with pytest.raises(StoreClosedError):
            store.write_lock(timeout=1)
        with pytest.raises(StoreClosedError):
            store.get_meta("format_version")

    def test_meta(self) -> None:
        assert self.store.get_meta("nope") is None
        self.store.set_meta("config", b'{"a": 1}')
        assert self.store.get_meta("config") == b'{"a": 1}'
        self.store.set_meta("config", b"")
        assert self.store.get_meta("config") == b""
        assert self.store.get_meta("format_version") == b"1"

    # --------------------------------------------------------- write lock
    def test_write_lock_reentrant(self) -> None:
        with self.store.write_lock(timeout=1):
            with self.store.write_lock(timeout=1):
                pass
            self._assert_other_thread_blocked()
        self._assert_other_thread_gets_it()

    def _assert_other_thread_blocked(self) -> None:
        errors: list[BaseException] = []

        def other() -> None:
            try:
                with self.store.write_lock(timeout=0.2):
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
            with self.store.write_lock(timeout=2):
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
                with self.store.write_lock(timeout=30):
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
            with self.store.write_lock(timeout=5):
                held.set()
                release.wait(10)
        t = threading.Thread(target=holder)
        t.start()
        held.wait(5)
        with pytest.raises(LockError), self.store.write_lock(timeout=0.1):
            pass
        release.set()
        t.join()
        with self.store.write_lock(timeout=5):
            pass


class ObjectStoreTests(BlobStoreTests, RefStoreTests, TransactionalRefTests, MaintenanceTests):
    """A repository's local store: every part, and the parts wired to one store."""

    def test_parts_share_one_store(self) -> None:
        assert isinstance(self.store.blobs, BlobStore)
        assert isinstance(self.store.refs, TransactionalRefStore)
        assert isinstance(self.store.maintenance, StoreMaintenance)
        oid = self.store.blobs.put(b"through the part")
        assert self.store.get(oid) == b"through the part" and self.store.object_bytes() == 16
        self.store.refs.update_ref("refs/heads/p", None, oid, "part")
        assert self.store.read_ref("refs/heads/p") == oid
        self.store.maintenance.set_meta("k", b"v")
        assert self.store.get_meta("k") == b"v"

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
