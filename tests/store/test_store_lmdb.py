"""The store contract against LMDB, plus LMDB-specific behaviour.

Covers map growth (in-process and across processes), the format version,
reader_check, fork safety, reopen, cross-process locking, shrink and its crash
recovery, and SIGKILL during writes.
"""
from __future__ import annotations

import multiprocessing as mp
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
from pathlib import Path

import pytest
from store_contract import ObjectStoreTests, blob

from mvc.store import (
    FormatTooNewError,
    LmdbStore,
    LockError,
    ObjectStore,
    RefUpdate,
    StoreExistsError,
    StoreFormatError,
    StoreNotFoundError,
)
from mvc.store.lmdb_env import STORE_NEW, STORE_OLD

MiB = 1 << 20


class SmallMapStore(LmdbStore):
    """Starts with a 1 MiB map so tests exercise growth with little data."""

    INITIAL_MAP_SIZE = 1 * MiB
    BATCH_BYTES = 3 * MiB


class TestLmdbStore(ObjectStoreTests):
    def make_store(self) -> ObjectStore:
        self._dirs = getattr(self, "_dirs", [])
        d = tempfile.mkdtemp(prefix="mvc-store-")
        self._dirs.append(d)
        return LmdbStore.create(Path(d) / ".mvc")

    def cleanup_store(self, store: ObjectStore) -> None:
        store.close()
        for d in self._dirs:
            shutil.rmtree(d, ignore_errors=True)


class TestLmdbSmallMap(ObjectStoreTests):
    """The whole contract again with a map that must grow during the tests."""

    def make_store(self) -> ObjectStore:
        self._dirs = getattr(self, "_dirs", [])
        d = tempfile.mkdtemp(prefix="mvc-store-")
        self._dirs.append(d)
        return SmallMapStore.create(Path(d) / ".mvc")

    def cleanup_store(self, store: ObjectStore) -> None:
        store.close()
        for d in self._dirs:
            shutil.rmtree(d, ignore_errors=True)


# ------------------------------------------------------------------ helpers
@pytest.fixture
def root(tmp_path: Path) -> Path:
    return tmp_path / ".mvc"


@pytest.fixture
def store(root: Path):
    s = LmdbStore.create(root)
    yield s
    s.close()


def run_py(code: str, *args: str, timeout: float = 60) -> subprocess.CompletedProcess:
    """Run a Python snippet in a fresh interpreter (no state shared with this process)."""
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code), *args],
                          capture_output=True, text=True, timeout=timeout, check=False)


def spawn_py(code: str, *args: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", textwrap.dedent(code), *args],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


# ---------------------------------------------------------------- map growth
def test_map_grows_for_many_puts(root: Path) -> None:
    s = SmallMapStore.create(root)
    try:
        start = s.map_size()
        ids = [s.blobs.put(blob(MiB, i)) for i in range(6)]
        assert s.map_size() > start
        assert [s.blobs.get(o) for o in ids] == [blob(MiB, i) for i in range(6)]
    finally:
        s.close()


def test_map_grows_for_one_big_transaction(root: Path) -> None:
    s = SmallMapStore.create(root)
    s.blobs.batch_bytes = 64 * MiB  # type: ignore[attr-defined]  # one txn far bigger than the initial map
    try:
        ids = s.blobs.put_many(blob(MiB, i) for i in range(10))
        assert [s.blobs.get(o) for o in ids] == [blob(MiB, i) for i in range(10)]
        assert s.blobs.object_bytes() == 10 * MiB
    finally:
        s.close()


def test_map_grown_by_other_process(root: Path) -> None:
    s = SmallMapStore.create(root)
    try:
        s.blobs.put(b"before")
        # Another process with the same tiny initial map writes 6 MiB.
        r = run_py("""
            import sys, random
            from mvc.store import LmdbStore
            LmdbStore.INITIAL_MAP_SIZE = 1 << 20
            s = LmdbStore.open(sys.argv[1])
            ids = [s.blobs.put(random.Random(i).randbytes(1 << 20)) for i in range(6)]
            print(" ".join(ids))
            s.close()
        """, str(root))
        assert r.returncode == 0, r.stderr
        ids = r.stdout.split()
        # Our map is now smaller than the data: reads and writes adopt the new size.
        assert [s.blobs.get(o) for o in ids] == [blob(MiB, i) for i in range(6)]
        more = s.blobs.put_many(blob(MiB, 100 + i) for i in range(3))
        assert [s.blobs.get(o) for o in more] == [blob(MiB, 100 + i) for i in range(3)]
        assert len(list(s.blobs.iter_ids())) == 10
    finally:
        s.close()


# ------------------------------------------------------- create / open / format
def test_open_missing(tmp_path: Path) -> None:
    with pytest.raises(StoreNotFoundError) as ei:
        LmdbStore.open(tmp_path / "nothing")
    assert ei.value.exit_code == 60
    (tmp_path / "empty").mkdir()
    with pytest.raises(StoreNotFoundError):
        LmdbStore.open(tmp_path / "empty")


def test_create_twice_refused(store: LmdbStore, root: Path) -> None:
    with pytest.raises(StoreExistsError):
        LmdbStore.create(root)


def test_reopen_persists_everything(store: LmdbStore, root: Path) -> None:
    oid = store.blobs.put(b"persist me")
    store.refs.update_refs([RefUpdate("refs/heads/main", None, oid)], "c")
    store.maintenance.set_meta("k", b"v")
    store.close()
    s2 = LmdbStore.open(root)
    try:
        assert s2.blobs.get(oid) == b"persist me"
        assert s2.refs.read_ref("refs/heads/main") == oid
        assert [e.reason for e in s2.refs.reflog("refs/heads/main")] == ["c"]
        assert s2.maintenance.get_meta("k") == b"v" and s2.blobs.object_bytes() == 10
    finally:
        s2.close()


def test_two_instances_share_the_environment(store: LmdbStore, root: Path) -> None:
    other = LmdbStore.open(root)  # py-lmdb forbids a second env on the same files
    oid = other.blobs.put(b"shared")
    assert store.blobs.get(oid) == b"shared"
    other.close()
    assert store.blobs.get(oid) == b"shared"  # closing one leaves the other working


def test_format_too_new(store: LmdbStore, root: Path) -> None:
    store.maintenance.set_meta("format_version", b"2")
    store.close()
    with pytest.raises(FormatTooNewError) as ei:
        LmdbStore.open(root)
    msg = str(ei.value)
    assert ei.value.exit_code == 9 and "2" in msg and "1" in msg
    assert ei.value.found == 2 and ei.value.supported == 1


def test_format_missing_or_garbage(store: LmdbStore, root: Path) -> None:
    store.maintenance.set_meta("format_version", b"banana")
    store.close()
    with pytest.raises(StoreFormatError):
        LmdbStore.open(root)


# --------------------------------------------------------------- reader_check
def test_reader_check_clears_dead_readers(store: LmdbStore, root: Path) -> None:
    store.blobs.put(b"x")
    store.close()
    # A live process keeps the environment open: otherwise the next opener
    # re-initialises the lock file and the dead reader vanishes without reader_check.
    keeper = subprocess.Popen([sys.executable, "-c", textwrap.dedent("""
        import sys
        from mvc.store import LmdbStore
        s = LmdbStore.open(sys.argv[1])
        print("open", flush=True)
        sys.stdin.readline()
    """), str(root)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert keeper.stdout.readline().strip() == "open"
        dead = spawn_py("""
            import sys, time
            from mvc.store import LmdbStore
            s = LmdbStore.open(sys.argv[1])
            txn = s._h().env.begin()   # a reader slot, never released
            print("ready", flush=True)
            time.sleep(60)
        """, str(root))
        assert dead.stdout.readline().strip() == "ready"
        dead.send_signal(signal.SIGKILL)
        dead.wait()
        s = LmdbStore.open(root)
        try:
            assert s._h().stale_readers_cleared >= 1
            assert str(dead.pid) not in s._h().env.readers()
        finally:
            s.close()
    finally:
        keeper.stdin.write("\n")
        keeper.stdin.flush()
        keeper.wait(30)


# ------------------------------------------------------------------- fork
def _child_uses_store(store: LmdbStore, oid: str, q, k: int) -> None:
    try:
        assert store.blobs.get(oid) == b"from parent"
        new = store.blobs.put(b"from child")
        store.refs.update_refs([RefUpdate(f"refs/heads/child{k}", None, new)], "child")
        q.put(("ok", new, store._h().pid == os.getpid()))
    except BaseException as e:  # noqa: BLE001
        q.put(("error", repr(e), False))


def test_fork_child_opens_fresh_environment(store: LmdbStore) -> None:
    oid = store.blobs.put(b"from parent")
    ctx = mp.get_context("fork")
    q = ctx.Queue()
    # A background thread keeps reading while we fork.
    stop = threading.Event()
    errors: list[BaseException] = []

    def reader() -> None:
        try:
            while not stop.is_set():
                assert store.blobs.get(oid) == b"from parent"
        except BaseException as e:  # noqa: BLE001
            errors.append(e)
    t = threading.Thread(target=reader)
    t.start()
    try:
        procs = [ctx.Process(target=_child_uses_store, args=(store, oid, q, k)) for k in range(2)]
        for p in procs:
            p.start()
        results = [q.get(timeout=60) for _ in procs]
        for p in procs:
            p.join(30)
    finally:
        stop.set()
        t.join()
    assert errors == []
    assert [r[0] for r in results] == ["ok", "ok"], results
    assert all(r[2] for r in results)
    assert all(p.exitcode == 0 for p in procs)
    # The parent's environment still works, and sees the children's writes.
    new = results[0][1]
    assert store.blobs.get(new) == b"from child"
    assert store.refs.read_ref("refs/heads/child0") == new == store.refs.read_ref("refs/heads/child1")
    assert store.blobs.put(b"parent again") and store.blobs.get(oid) == b"from parent"
    assert len(store.refs.reflog("refs/heads/child1")) == 1


# ------------------------------------------------------- cross-process lock
LOCK_HOLDER = """
    import sys, time
    from mvc.store import LmdbStore
    s = LmdbStore.open(sys.argv[1])
    with s.maintenance.write_lock(timeout=10):
        print("held", flush=True)
        sys.stdin.readline()
    print("released", flush=True)
    s.close()
"""


def test_write_lock_across_processes(store: LmdbStore, root: Path) -> None:
    child = subprocess.Popen([sys.executable, "-c", textwrap.dedent(LOCK_HOLDER), str(root)],
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout.readline().strip() == "held"
        with pytest.raises(LockError) as ei, store.maintenance.write_lock(timeout=0.3):
            pass
        assert f"pid {child.pid}" in str(ei.value)
        child.stdin.write("\n")
        child.stdin.flush()
        assert child.stdout.readline().strip() == "released"
        with store.maintenance.write_lock(timeout=10):
            pass
    finally:
        child.kill()
        child.wait()


def test_lock_released_when_holder_dies(store: LmdbStore, root: Path) -> None:
    child = subprocess.Popen([sys.executable, "-c", textwrap.dedent(LOCK_HOLDER), str(root)],
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert child.stdout.readline().strip() == "held"
    child.send_signal(signal.SIGKILL)
    child.wait()
    with store.maintenance.write_lock(timeout=5):
        pass


def _sleeping_child(q) -> None:
    q.put("started")
    time.sleep(30)


def test_forked_child_does_not_keep_parents_lock(store: LmdbStore, root: Path) -> None:
    """flock locks live in the open file description fork shares; the child must drop it."""
    ctx = mp.get_context("fork")
    q = ctx.Queue()
    with store.maintenance.write_lock(timeout=5):
        child = ctx.Process(target=_sleeping_child, args=(q,))
        child.start()
        assert q.get(timeout=30) == "started"
    try:
        r = run_py("""
            import sys
            from mvc.store import LmdbStore
            s = LmdbStore.open(sys.argv[1])
            with s.maintenance.write_lock(timeout=5):
                print("got it")
        """, str(root))
        assert r.returncode == 0 and r.stdout.strip() == "got it", r.stderr
    finally:
        child.kill()
        child.join()


def test_processes_serialize_under_write_lock(store: LmdbStore, root: Path) -> None:
    store.refs.update_refs([RefUpdate("refs/heads/main", None, f"{0:032x}")], "init")
    code = """
        import sys
        from mvc.store import LmdbStore, RefUpdate
        s = LmdbStore.open(sys.argv[1])
        for i in range(15):
            with s.maintenance.write_lock(timeout=30):
                cur = s.refs.read_ref("refs/heads/main")
                oid = s.blobs.put(f"{sys.argv[2]}-{i}".encode())
                nxt = f"{int(cur, 16) + 1:032x}"
                s.refs.update_refs([RefUpdate("refs/heads/main", cur, nxt)], sys.argv[2])
        s.close()
    """
    procs = [spawn_py(code, str(root), f"p{k}") for k in range(2)]
    outs = [p.communicate(timeout=60) for p in procs]
    assert all(p.returncode == 0 for p in procs), outs
    assert store.refs.read_ref("refs/heads/main") == f"{30:032x}"
    assert len(store.refs.reflog("refs/heads/main")) == 31
    assert len(list(store.blobs.iter_ids())) == 30


# ------------------------------------------------------------------ shrink
def test_shrink_compacts_and_keeps_data(store: LmdbStore) -> None:
    ids = store.blobs.put_many(blob(200_000, i) for i in range(20))
    store.refs.update_refs([RefUpdate("refs/heads/main", None, ids[0])], "c")
    store.blobs.delete(ids[2:])
    before, after = store.maintenance.shrink()
    assert after < before and before - after > 2_000_000
    assert store.maintenance.disk_usage() == after
    assert store.blobs.get(ids[0]) == blob(200_000, 0) and store.blobs.get(ids[1]) == blob(200_000, 1)
    assert store.refs.read_ref("refs/heads/main") == ids[0]
    assert len(store.refs.reflog("refs/heads/main")) == 1
    assert store.blobs.object_bytes() == 400_000
    store.blobs.put(b"after shrink")  # still writable
    assert not (store.path and os.path.exists(os.path.join(store.path, STORE_OLD)))


def test_shrink_refused_while_open_elsewhere(store: LmdbStore, root: Path) -> None:
    store.blobs.put(b"x")
    child = subprocess.Popen([sys.executable, "-c", textwrap.dedent("""
        import sys
        from mvc.store import LmdbStore
        s = LmdbStore.open(sys.argv[1])
        s.blobs.has("a" * 32)
        print("open", flush=True)
        sys.stdin.readline()
        s.close()
    """), str(root)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout.readline().strip() == "open"
        with pytest.raises(LockError):
            store.maintenance.shrink(timeout=5)
        assert store.blobs.get(store.blobs.put(b"y")) == b"y"  # still usable after the refusal
    finally:
        child.stdin.write("\n")
        child.stdin.flush()
        child.wait(30)
    store.maintenance.shrink(timeout=5)


def test_open_recovers_crash_between_renames(store: LmdbStore, root: Path) -> None:
    oid = store.blobs.put(b"survives")
    store.close()
    os.rename(root / "store", root / STORE_OLD)      # crash after the first rename
    (root / STORE_NEW).mkdir()
    (root / STORE_NEW / "data.mdb").write_bytes(b"partial")
    s = LmdbStore.open(root)
    try:
        assert s.blobs.get(oid) == b"survives"
        assert not (root / STORE_OLD).exists() and not (root / STORE_NEW).exists()
    finally:
        s.close()


def test_open_cleans_leftovers(store: LmdbStore, root: Path) -> None:
    oid = store.blobs.put(b"current")
    store.close()
    (root / STORE_OLD).mkdir()            # crash while removing the old copy
    (root / STORE_NEW).mkdir()            # or while writing the copy
    s = LmdbStore.open(root)
    try:
        assert s.blobs.get(oid) == b"current"
        assert not (root / STORE_OLD).exists() and not (root / STORE_NEW).exists()
    finally:
        s.close()


def test_compact_copy_opens_as_store(store: LmdbStore, tmp_path: Path) -> None:
    oid = store.blobs.put(b"copied")
    store.refs.update_refs([RefUpdate("HEAD", None, oid)], "c")
    dest = tmp_path / "copy" / ".mvc"
    store.compact_copy(dest / "store")
    s = LmdbStore.open(dest)
    try:
        assert s.blobs.get(oid) == b"copied" and s.refs.read_ref("HEAD") == oid
    finally:
        s.close()
    with pytest.raises(StoreExistsError):
        store.compact_copy(dest / "store")


# ------------------------------------------------------------- crash safety
def test_sigkill_during_writes_leaves_valid_store(store: LmdbStore, root: Path) -> None:
    store.close()
    code = """
        import sys, random
        from mvc.store import LmdbStore, RefUpdate
        s = LmdbStore.open(sys.argv[1])
        i = 0
        while True:
            data = [random.randbytes(300_000) for _ in range(3)]
            ids = s.blobs.put_many(data)
            head = s.refs.read_ref("HEAD")
            s.refs.update_refs([RefUpdate("HEAD", head, ids[-1])], f"w{i}")
            print(ids[-1], flush=True)
            i += 1
    """
    rng = random.Random(1)
    acknowledged: list[str] = []
    for _ in range(5):
        child = spawn_py(code, str(root))
        time.sleep(0.3 + rng.random() * 0.5)
        child.send_signal(signal.SIGKILL)
        out, _ = child.communicate()
        acknowledged += out.split()
    s = LmdbStore.open(root)
    try:
        for oid in s.blobs.iter_ids():
            s.blobs.verify(oid)
        for oid in acknowledged:
            s.blobs.verify(oid)
        head = s.refs.read_ref("HEAD")
        assert head is not None and s.blobs.has(head)
        log = s.refs.reflog("HEAD")
        assert [e.new for e in log][-1] == head
        assert s.blobs.object_bytes() == sum(s.blobs.size(o) for o in s.blobs.iter_ids())
    finally:
        s.close()
