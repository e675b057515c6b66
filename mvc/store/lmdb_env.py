"""One process's handle on the LMDB environment under ``.mvc/store``.

Everything LMDB-specific about lifetime lives here, so the store's parts
(`lmdb_blobs`, `lmdb_refs`, `lmdb_meta`) only deal with keys and values:

* **One handle per (directory, process).**  LMDB forbids opening the same
  files twice in one process (its fcntl locks are per process), so every
  `LmdbStore` on a directory shares one `EnvHandle` through a refcounted
  registry.
* **Retryable transactions.**  `read` and `write` run a function of a fresh,
  short transaction.  On ``MapFullError`` the aborted write is retried after
  the map is enlarged; on ``MapResizedError`` (another process grew the file
  beyond our map) the persisted size is adopted.  ``set_mapsize`` needs "no
  transaction of this process open", which the in-process reader/writer lock
  guarantees: every transaction holds it shared, resizing holds it exclusive.
* **Per store object.**  An `LmdbConnection` is one store object's reference
  on the shared handle: attached lazily, re-attached in a forked child.
* **Fork.**  Handles are keyed by pid; a child never uses its parent's
  environment.  Before ``fork()`` every handle of the process is quiesced (no
  transaction in flight), so the child inherits no reader slot of the parent.
  The child then closes its inherited copy -- py-lmdb >= 3 refuses to open
  files that an Environment object in the same process still has open, and
  with no inherited transactions closing touches only the child's own
  mapping and descriptors -- and opens a fresh environment on first use.
* **Shrink exclusion.**  While its environment is open a process holds a
  shared flock on ``.mvc/store.users``; `LmdbStore.shrink` swaps the files only
  after upgrading that to exclusive, i.e. when no other process has them open.
"""
from __future__ import annotations

import mmap
import os
import shutil
import threading
from collections.abc import Callable
from typing import Any, TypeVar

import lmdb

from mvc.errors import DiskFullError, InternalError, MvcError, free_bytes, is_disk_full
from mvc.native.heap import buffer_span, release_mapped, shared_read_only_mapping
from mvc.native.lmdb_pages import HEAD_BYTES, LmdbFileDamagedError, check_header, check_snapshot
from mvc.store.base import StoreClosedError, StoreFormatError, StoreNotFoundError
from mvc.store.lock import SharedExclusiveLock, SharedFileLock

T = TypeVar("T")

MiB = 1 << 20
GiB = 1 << 30
DB_NAMES = ("objects", "refs", "reflog", "meta")
STORE_DIR = "store"
STORE_OLD = "store.old"
STORE_NEW = "store.new"
USERS_FILE = "store.users"
LOCK_FILE = "lock"
DATA_FILE = "data.mdb"
# Each doubling is capped so a huge map does not jump by terabytes at once.
MAX_GROW_STEP = 64 * GiB
_MAX_RETRIES = 64


class MapGrowthError(InternalError):
    """The map could not be grown enough to fit a write (should not happen)."""

    exit_code = 67


class StoreIOError(MvcError):
    """LMDB reported an operating-system level failure (permissions, I/O; a full disk is DiskFullError)."""

    exit_code = 68


#: Below this much free space an LMDB write error is taken to mean "disk full": LMDB
#: reports a failed write of its pages as EIO, whatever the cause.
FULL_BELOW_BYTES = 64 * MiB


#: What LMDB raises when its own pages make no sense (a damaged file), not for an I/O failure.
_DAMAGED = (lmdb.CorruptedError, lmdb.PageNotFoundError, lmdb.InvalidError,
            lmdb.IncompatibleError, lmdb.VersionMismatchError)


def io_error(where: str, exc: BaseException, need: int = 0) -> MvcError:
    """The typed error for an LMDB / OS failure at `where`: a damaged store file, disk full or
    another I/O error."""
    if isinstance(exc, lmdb.BadValsizeError):
        # a key or value LMDB cannot hold (a value of 4 GiB or more): asked of it by mvc, not
        # found in the file
        return InternalError(f"store {where}: a key or value of a size LMDB cannot hold "
                             f"({exc}); nothing was changed")
    if isinstance(exc, _DAMAGED):
        return StoreFormatError(f"the mvc store at {where} is damaged ({exc}); nothing was "
                                "changed: restore .mvc from a backup or clone it again from a "
                                "remote")
    if is_disk_full(exc, where, below=max(FULL_BELOW_BYTES, 2 * need)):
        free = free_bytes(where)
        shown = f" ({free >> 20} MiB free)" if free is not None else ""
        return DiskFullError(f"no space left on device for {where}{shown}; nothing stored was "
                             "changed: free some space and retry")
    return StoreIOError(f"store {where}: {exc}")


def round_up(n: int, unit: int) -> int:
    """Smallest multiple of `unit` that is >= `n`."""
    return -(-n // unit) * unit


def fsync_dir(path: str) -> None:
    """Make a directory's entries (renames, creations) durable."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class EnvHandle:
    """The environment of one ``.mvc`` directory as opened by this process."""

    def __init__(self, root: str, initial_map_size: int) -> None:
        self.root = root
        self.store_dir = os.path.join(root, STORE_DIR)
        self.pid = os.getpid()
        self.initial_map_size = initial_map_size
        self.rw = SharedExclusiveLock()
        self.users = SharedFileLock(os.path.join(root, USERS_FILE))
        self.env: Any = None  # lmdb.Environment once opened
        self.dbs: dict[str, Any] = {}
        self.refcount = 0
        self.abandoned = False
        self.stale_readers_cleared = 0
        self._map_span: tuple[int, int] | None = None
        self.deep_checked = False

    def in_map(self, buf: Any) -> bool:
        """Whether `buf` lies inside this environment's map (LMDB's read-only shared mapping of
        its data file): the only memory that `mvc.native.heap.release_mapped` may unmap.  A
        write transaction's dirty pages, on the heap, never are.  The span is looked up once
        per map: every step that moves it (open, close, a resize) forgets it."""
        span = self._map_span
        if span is None:
            span = self._map_span = shared_read_only_mapping(
                os.path.join(self.store_dir, DATA_FILE))
        lo, hi = buffer_span(buf)
        return span is not None and span[0] <= lo and hi <= span[1]

    def release(self, buf: Any) -> None:
        """Unmap a value this process has read from the map, once it is consumed (py-lmdb pages
        in every value it reads, and a mapped page stays in the resident set until the map
        closes; the page cache keeps it).  Anything not inside the map -- a write
        transaction's own dirty pages, on the heap, where unmapping would zero them -- is left
        alone, so this is safe on any value of any transaction."""
        if self.in_map(buf):
            release_mapped(buf)

    # ----------------------------------------------------------- open/close
    def open_env(self, create: bool = False) -> None:
        """Open the environment (caller holds `rw` exclusively or is alone)."""
        self.users.acquire_shared(timeout=60.0)
        try:
            self._recover_interrupted_shrink()
            if not create and not os.path.exists(os.path.join(self.store_dir, DATA_FILE)):
                raise StoreNotFoundError(f"no mvc store at {self.root}")
            self._open_lmdb(create)
        except BaseException:
            self.users.release()
            raise

    def _open_lmdb(self, create: bool) -> None:
        data = os.path.join(self.store_dir, DATA_FILE)
        exists = os.path.exists(data)
        size = os.path.getsize(data) if exists else 0
        if exists:   # an empty one too: LMDB would take it for a new store
            self._check_header(data)
        map_size = max(self.initial_map_size, round_up(size, self.initial_map_size)
                       + self.initial_map_size)
        kwargs: dict[str, Any] = {
            "map_size": map_size, "subdir": True, "max_dbs": len(DB_NAMES) + 4, "create": create,
            "max_spare_txns": 0,
            # LMDB 0.9's data format, which `mvc.native.lmdb_pages` checks and every tool reads:
            # a py-lmdb with both engines would otherwise pick one by the file's version word.
            "lib_version": 0}
        try:
            env = lmdb.open(self.store_dir, **kwargs)
        except TypeError:  # older py-lmdb without lib_version: it has only LMDB 0.9
            kwargs.pop("lib_version", None)
            env = lmdb.open(self.store_dir, **kwargs)
        except lmdb.Error as e:
            raise io_error(self.root, e) from e
        try:
            if size:
                self._check_pages(env, data)
            # Free reader slots left by dead processes: a stale slot would pin
            # old pages forever and make the file grow.
            self.stale_readers_cleared = env.reader_check()
            self.dbs = {}
            for name in DB_NAMES:
                self.dbs[name] = self._open_db(env, name, create)
        except BaseException:
            env.close()
            raise
        self.env = env
        self._map_span = None
        self.deep_checked = False

    def _damaged(self, exc: LmdbFileDamagedError) -> StoreFormatError:
        return StoreFormatError(f"the mvc store at {self.root} is damaged ({exc}); nothing was "
                                "changed: restore .mvc from a backup or clone it again from a "
                                "remote")

    def _check_header(self, data: str) -> None:
        """Refuse a data file whose meta pages LMDB cannot safely open (see `lmdb_pages`)."""
        try:
            with open(data, "rb") as fh:
                head = fh.read(HEAD_BYTES)
        except OSError as e:
            raise io_error(self.root, e) from e
        try:
            check_header(head, what=DATA_FILE)
        except LmdbFileDamagedError as e:
            raise self._damaged(e) from e

    def check_pages(self) -> None:
        """Check the current snapshot's pages again, each big value's first overflow page
        too: its page count is what deleting the value frees (a damaged one would hand pages
        of other values to the next write).  fsck runs it, and the first delete of an open
        environment (`check_deep_once`)."""
        data = self.data_file()
        self.with_env(lambda env: self._check_pages(env, data, deep=True))
        self.deep_checked = True

    def check_deep_once(self) -> None:
        """`check_pages` unless it ran since the environment opened."""
        if not self.deep_checked:
            self.check_pages()

    def _check_pages(self, env: Any, data: str, deep: bool = False) -> None:
        """Check every page of the current snapshot before LMDB walks it: a damaged page
        would make LMDB read past the end of the file (SIGBUS) or abort, not raise.  Once per
        open; what this process writes afterwards it wrote itself.  The read transaction pins
        the snapshot's pages while they are checked."""
        for _ in range(_MAX_RETRIES):
            with env.begin() as txn, open(data, "rb") as fh:
                try:
                    view = mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ)
                except (OSError, ValueError) as e:
                    raise io_error(self.root, e) from e
                try:
                    if check_snapshot(view, txn.id(), deep, what=DATA_FILE):
                        return
                except LmdbFileDamagedError as e:
                    raise self._damaged(e) from e
                finally:
                    view.close()
        raise StoreIOError(f"store {self.root}: kept changing while its pages were checked")

    @staticmethod
    def _open_db(env: Any, name: str, create: bool) -> Any:
        for _ in range(_MAX_RETRIES):
            try:
                # py-lmdb opens the DBI in its own write txn; a handle opened in a
                # read txn would be dropped when that txn ends.
                return env.open_db(name.encode(), create=create)
            except lmdb.MapResizedError:
                env.set_mapsize(0)
            except lmdb.NotFoundError as e:
                raise StoreFormatError(f"store is missing its {name!r} database") from e
            except lmdb.Error as e:  # e.g. a damaged page on the way to the database's root
                raise io_error(env.path(), e) from e
        raise MapGrowthError("could not open databases: map kept being resized")

    def close_env(self) -> None:
        """Close the environment and drop the shared users lock (caller holds `rw` exclusively)."""
        if self.env is not None:
            env, self.env = self.env, None
            self.dbs = {}
            self._map_span = None
            env.close()
        self.users.release()

    def _recover_interrupted_shrink(self) -> None:
        """Undo or finish a shrink that crashed (see `LmdbStore.shrink`).

        The caller holds the users lock shared, and a running shrink holds it
        exclusively from its copy to its reopen, so anything found here is
        left over from a crash.  Concurrent openers may race: each step
        tolerates the other having done it already.
        """
        old = os.path.join(self.root, STORE_OLD)
        new = os.path.join(self.root, STORE_NEW)
        if not os.path.exists(old) and not os.path.exists(new):
            return
        if not os.path.exists(self.store_dir) and os.path.exists(old):
            # Crashed between the two renames: the original is complete.
            try:
                os.rename(old, self.store_dir)
                fsync_dir(self.root)
            except OSError:
                if not os.path.exists(self.store_dir):
                    raise
        if os.path.exists(self.store_dir):
            for leftover in (old, new):
                shutil.rmtree(leftover, ignore_errors=True)

    # --------------------------------------------------------- transactions
    def _run(self, body: Callable[[Any], T], need: int) -> T:
        """Run `body(env)` under the shared lock, resizing and retrying as LMDB asks."""
        for _ in range(_MAX_RETRIES):
            action = None
            seen = 0
            with self.rw.shared():
                env = self.env
                if env is not None:
                    info = env.info()
                    seen = info["map_size"]
                    if need and self._used(env, info) + need + need // 8 + MiB > seen:
                        action = "grow"  # a doomed attempt would cost a full write
                if env is not None and action is None:
                    try:
                        return body(env)
                    except lmdb.MapFullError:
                        action = "grow"
                    except lmdb.MapResizedError:
                        action = "adopt"
                    except lmdb.Error as e:
                        raise io_error(self.store_dir, e, need) from e
            with self.rw.exclusive():
                if self.env is None:
                    self.open_env()
                elif action == "grow":
                    self._grow(seen, need)
                elif action == "adopt":
                    self._map_span = None   # the map moves: what `in_map` knows is stale
                    self.env.set_mapsize(0)
        raise MapGrowthError("LMDB map could not be grown to fit the write")

    def read(self, fn: Callable[[Any], T], buffers: bool = False) -> T:
        """Run `fn(txn)` in a read transaction; buffers=True yields memoryviews into the map."""
        def body(env: Any) -> T:
            with env.begin(buffers=buffers) as txn:
                return fn(txn)
        return self._run(body, 0)

    def write(self, fn: Callable[[Any], T], need: int = 0) -> T:
        """Run `fn(txn)` in a write transaction committed on return; retried on a full map.

        `fn` may run several times, so it must only touch the transaction.
        `need` estimates the bytes the write adds, to size the map growth.
        """
        def body(env: Any) -> T:
            with env.begin(write=True, buffers=True) as txn:
                return fn(txn)
        return self._run(body, need)

    def with_env(self, fn: Callable[[Any], T]) -> T:
        """Run `fn(env)` with the environment open and no resize in progress."""
        return self._run(fn, 0)

    @staticmethod
    def _used(env: Any, info: dict[str, int]) -> int:
        """Bytes of the map in use (pages up to the last allocated one)."""
        return (info["last_pgno"] + 1) * env.stat()["psize"]

    def _grow(self, seen: int, need: int) -> None:
        info = self.env.info()
        current = info["map_size"]
        if current > seen:
            return  # another thread already grew it since our write failed
        used = self._used(self.env, info)
        doubled = current + min(current, MAX_GROW_STEP)
        target = max(doubled, used + 2 * need + 64 * MiB)
        self._map_span = None   # the map moves: what `in_map` knows is stale
        self.env.set_mapsize(round_up(target, MiB))

    def swap_in_compacted(self) -> tuple[int, int]:
        """Replace the files by a compacted copy; return (bytes before, after).

        The caller holds the write lock, `rw` exclusively and `users`
        exclusively; see `LmdbStore.shrink` for the crash-safety argument.
        """
        old = os.path.join(self.root, STORE_OLD)
        new = os.path.join(self.root, STORE_NEW)
        before = os.path.getsize(self.data_file())
        shutil.rmtree(new, ignore_errors=True)
        try:
            os.mkdir(new)
            self.env.copy(new, compact=True)
            fd = os.open(os.path.join(new, DATA_FILE), os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
            fsync_dir(new)
        except (lmdb.Error, OSError) as e:
            # The live store is untouched until the renames below: drop the partial copy.
            shutil.rmtree(new, ignore_errors=True)
            raise io_error(self.root, e) from e
        env, self.env, self.dbs = self.env, None, {}
        self._map_span = None   # the map goes with the environment
        env.close()
        try:
            os.rename(self.store_dir, old)
            fsync_dir(self.root)
            os.rename(new, self.store_dir)
            fsync_dir(self.root)
        except BaseException:
            if not os.path.exists(self.store_dir) and os.path.exists(old):
                os.rename(old, self.store_dir)
            self._open_lmdb(create=False)
            raise
        shutil.rmtree(old, ignore_errors=True)
        self._open_lmdb(create=False)
        return before, os.path.getsize(self.data_file())

    # --------------------------------------------------------------- files
    def data_file(self) -> str:
        """Path of the LMDB data file."""
        return os.path.join(self.store_dir, DATA_FILE)


# ---------------------------------------------------------------- registry
_HANDLES: dict[tuple[str, int], EnvHandle] = {}
_GUARD = threading.Lock()


def acquire_handle(root: str, initial_map_size: int, create: bool = False) -> EnvHandle:
    """The shared handle for `root` in this process, opened, with one more reference."""
    pid = os.getpid()
    with _GUARD:
        _abandon_inherited(pid)
        handle = _HANDLES.get((root, pid))
        if handle is None:
            handle = EnvHandle(root, initial_map_size)
            with handle.rw.exclusive():
                handle.open_env(create=create)
            _HANDLES[(root, pid)] = handle
        handle.refcount += 1
        return handle


def release_handle(handle: EnvHandle) -> None:
    """Drop one reference; the last one closes the environment."""
    if handle.pid != os.getpid():
        return
    with _GUARD:
        handle.refcount -= 1
        if handle.refcount > 0:
            return
        _HANDLES.pop((handle.root, handle.pid), None)
        with handle.rw.exclusive():
            handle.close_env()


class LmdbConnection:
    """One store object's use of this process's shared `EnvHandle` for a ``.mvc`` directory.

    Attaches lazily, and afresh in a forked child (a handle is per process);
    refuses use after `close`.  `check` vets an existing store on every attach
    (its format version) and may raise; the handle is then released again.
    The parts of one `LmdbStore` share one connection, so they share its lifetime.
    """

    def __init__(self, root: str, initial_map_size: int,
                 check: Callable[[EnvHandle], None]) -> None:
        self.root = root
        self.initial_map_size = initial_map_size
        self._check = check
        self._handle: EnvHandle | None = None
        self._handle_pid = -1
        self._mutex = threading.Lock()
        self._mutex_pid = os.getpid()
        self.closed = False

    def attach(self, create: bool = False) -> EnvHandle:
        """Take a reference on the shared handle (creating the environment with `create`)."""
        handle = acquire_handle(self.root, self.initial_map_size, create=create)
        if not create:
            try:
                self._check(handle)
            except BaseException:
                release_handle(handle)
                raise
        self._handle, self._handle_pid = handle, os.getpid()
        return handle

    def handle(self) -> EnvHandle:
        """This process's handle, attaching (lazily, and afresh after fork) when needed."""
        if self.closed:
            raise StoreClosedError("store used after close()")
        pid = os.getpid()
        handle = self._handle
        if handle is not None and self._handle_pid == pid:
            return handle
        if self._mutex_pid != pid:  # a lock copied by fork may be held by a dead thread
            self._mutex, self._mutex_pid = threading.Lock(), pid
        with self._mutex:
            if self._handle is not None and self._handle_pid == pid:
                return self._handle
            return self.attach()

    def close(self) -> None:
        """Release this connection's reference to the environment; later use raises."""
        if self.closed:
            return
        self.closed = True
        handle, self._handle = self._handle, None
        if handle is not None and self._handle_pid == os.getpid():
            release_handle(handle)


def _abandon_inherited(pid: int) -> None:
    """In a forked child, close the environments inherited from the parent (see module doc)."""
    for handle in list(_HANDLES.values()):
        if handle.pid != pid and not handle.abandoned:
            handle.abandoned = True
            env, handle.env = handle.env, None
            if env is not None:
                env.close()


def _quiesce_before_fork() -> None:
    """Hold every handle of this process exclusively so no transaction is in flight at fork."""
    _GUARD.acquire()
    pid = os.getpid()
    held = []
    for handle in _HANDLES.values():
        if handle.pid == pid:
            cm = handle.rw.exclusive()
            cm.__enter__()
            held.append(cm)
    _QUIESCED.append(held)


def _resume_in_parent() -> None:
    held = _QUIESCED.pop() if _QUIESCED else []
    for cm in reversed(held):
        cm.__exit__(None, None, None)
    _GUARD.release()


def _resume_in_child() -> None:
    # The parent's handle locks stay as copied: the child never uses those
    # handles again.  The registry guard is fresh for the child.
    global _GUARD
    _QUIESCED.clear()
    _GUARD = threading.Lock()


_QUIESCED: list[list[Any]] = []
os.register_at_fork(before=_quiesce_before_fork, after_in_parent=_resume_in_parent,
                    after_in_child=_resume_in_child)
