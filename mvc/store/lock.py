"""Locks: the repository write lock (threads + processes) and helpers.

* `ThreadLock` -- reentrant per thread, with a timeout; the in-process half.
* `FileLock` -- `ThreadLock` + ``fcntl.flock`` on a lock file; the holder
  writes its pid into the file so a waiter can say who holds it.  One state
  per (file, process) is shared by every `FileLock` on that file, because two
  open file descriptions of one file would flock-conflict with each other
  inside a single process.
* `SharedFileLock` -- a shared flock held by every process that has a store
  open, so maintenance that swaps files under everyone (`LmdbStore.shrink`)
  can prove it is alone by upgrading to exclusive.
* `SharedExclusiveLock` -- an in-process reader/writer lock (no fds).

flock locks belong to an open file description, which `fork()` shares with
the child.  A child that kept the parent's descriptor would keep the parent's
lock alive after the parent released it, so the child closes every inherited
lock descriptor right after fork (`os.register_at_fork`).
"""
from __future__ import annotations

import errno
import fcntl
import os
import threading
import time
import weakref
from collections.abc import Iterator
from contextlib import contextmanager

from mvc.store.base import LockError

_POLL_MIN = 0.001
_POLL_MAX = 0.05


class ThreadLock:
    """A reentrant lock with a timeout that raises `LockError` instead of returning False."""

    def __init__(self) -> None:
        self._cond = threading.Condition(threading.Lock())
        self._owner: int | None = None
        self._depth = 0

    def acquire(self, timeout: float) -> int:
        """Take the lock (waiting up to `timeout` s); return the new depth (1 = first hold)."""
        me = threading.get_ident()
        deadline = time.monotonic() + max(timeout, 0.0)
        with self._cond:
            if self._owner == me:
                self._depth += 1
                return self._depth
            while self._owner is not None:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise LockError(
                        f"repository is locked by another thread of this process (pid {os.getpid()})")
                self._cond.wait(left)
            self._owner = me
            self._depth = 1
            return 1

    def release(self) -> int:
        """Drop one level of the lock; return the remaining depth (0 = released)."""
        with self._cond:
            if self._owner != threading.get_ident():
                raise RuntimeError("release of a lock not held by this thread")
            self._depth -= 1
            if self._depth == 0:
                self._owner = None
                self._cond.notify()
            return self._depth

    def held_by_me(self) -> bool:
        """Whether the calling thread holds the lock."""
        return self._owner == threading.get_ident()

    def depth(self) -> int:
        """How many times the holder has taken the lock (0 when free)."""
        return self._depth

    @contextmanager
    def hold(self, timeout: float = 60.0) -> Iterator[None]:
        """Context manager form of acquire/release."""
        self.acquire(timeout)
        try:
            yield
        finally:
            self.release()


def _poll_flock(fd: int, op: int, timeout: float) -> bool:
    """Try ``flock(fd, op | LOCK_NB)`` until it succeeds (True) or `timeout` passes (False)."""
    deadline = time.monotonic() + max(timeout, 0.0)
    delay = _POLL_MIN
    while True:
        try:
            fcntl.flock(fd, op | fcntl.LOCK_NB)
            return True
        except OSError as e:
            if e.errno not in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                raise
        left = deadline - time.monotonic()
        if left <= 0:
            return False
        time.sleep(min(delay, left))
        delay = min(delay * 2, _POLL_MAX)


def _read_holder_pid(path: str) -> str:
    try:
        with open(path, "rb") as f:
            text = f.read(32).decode("ascii", "replace").strip()
    except OSError:
        return "unknown"
    return text if text.isdigit() else "unknown"


# Every object holding a lock fd, so the fork handler can close inherited ones.
_FD_HOLDERS: weakref.WeakSet[_FdHolder] = weakref.WeakSet()


class _FdHolder:
    """Base for objects owning a lock file descriptor tied to the creating process."""

    def __init__(self) -> None:
        self.pid = os.getpid()
        self.fd: int | None = None
        _FD_HOLDERS.add(self)

    def _close_fd(self) -> None:
        if self.fd is not None:
            fd, self.fd = self.fd, None
            try:
                os.close(fd)
            except OSError:
                pass

    def _drop_inherited(self) -> None:
        """In a forked child: forget (close) the parent's descriptor without unlocking it."""
        if self.pid != os.getpid():
            self._close_fd()


def _after_fork_in_child() -> None:
    global _FILE_LOCKS_GUARD
    # Another parent thread may have held the guard at fork; the child has no such thread.
    _FILE_LOCKS_GUARD = threading.Lock()
    for holder in list(_FD_HOLDERS):
        holder._drop_inherited()


os.register_at_fork(after_in_child=_after_fork_in_child)


class _FileLockState(_FdHolder):
    """The per-(file, process) state behind `FileLock`."""

    def __init__(self, path: str) -> None:
        super().__init__()
        self.path = path
        self.thread_lock = ThreadLock()


_FILE_LOCKS: dict[tuple[str, int], _FileLockState] = {}
_FILE_LOCKS_GUARD = threading.Lock()


class FileLock:
    """Exclusive lock across threads and processes on one lock file (reentrant per thread)."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = os.path.realpath(os.fspath(path))

    def _state(self) -> _FileLockState:
        key = (self.path, os.getpid())
        with _FILE_LOCKS_GUARD:
            state = _FILE_LOCKS.get(key)
            if state is None:
                state = _FILE_LOCKS[key] = _FileLockState(self.path)
            return state

    def acquire(self, timeout: float = 60.0) -> None:
        """Take the lock or raise `LockError` after `timeout` seconds."""
        state = self._state()
        start = time.monotonic()
        if state.thread_lock.acquire(timeout) > 1:
            return
        try:
            fd = os.open(state.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
            state.fd = fd
            left = timeout - (time.monotonic() - start)
            if not _poll_flock(fd, fcntl.LOCK_EX, left):
                raise LockError(f"repository is locked by another process "
                                f"(pid {_read_holder_pid(state.path)})")
            os.ftruncate(fd, 0)
            os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        except BaseException:
            state._close_fd()
            state.thread_lock.release()
            raise

    def release(self) -> None:
        """Release one level; the file lock goes when the outermost hold ends."""
        state = self._state()
        if not state.thread_lock.held_by_me():
            raise RuntimeError("release of a lock not held by this thread")
        if state.thread_lock.depth() == 1:
            try:
                if state.fd is not None:
                    os.ftruncate(state.fd, 0)  # so a stale pid is never reported
                    fcntl.flock(state.fd, fcntl.LOCK_UN)
            finally:
                state._close_fd()
        state.thread_lock.release()

    def held_by_me(self) -> bool:
        """Whether the calling thread holds this lock."""
        return self._state().thread_lock.held_by_me()

    @contextmanager
    def hold(self, timeout: float = 60.0) -> Iterator[None]:
        """Context manager: hold the lock for the body."""
        self.acquire(timeout)
        try:
            yield
        finally:
            self.release()


class SharedFileLock(_FdHolder):
    """A shared flock held while a resource is in use, upgradable to exclusive.

    Not thread-safe on its own: callers serialize calls (the LMDB handle does it
    under its own lock).
    """

    def __init__(self, path: str | os.PathLike[str]) -> None:
        super().__init__()
        self.path = os.fspath(path)

    def acquire_shared(self, timeout: float) -> None:
        """Hold the lock shared; `LockError` if an exclusive holder keeps it past `timeout`."""
        if self.fd is None:
            self.fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        if not _poll_flock(self.fd, fcntl.LOCK_SH, timeout):
            self._close_fd()
            raise LockError("repository is being maintained by another process "
                            "(timed out waiting for it)")

    def try_exclusive(self, restore_timeout: float = 60.0) -> bool:
        """Upgrade to exclusive without waiting; on failure keep (re-take) the shared lock.

        Linux drops the old flock before trying the new one, hence the re-take.
        """
        if self.fd is None:
            raise RuntimeError("shared lock not held")
        try:
            fcntl.flock(self.fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return True
        except OSError as e:
            if e.errno not in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                raise
        self.acquire_shared(restore_timeout)
        return False

    def downgrade(self) -> None:
        """Exclusive back to shared (never blocks: we are the only holder)."""
        if self.fd is not None:
            fcntl.flock(self.fd, fcntl.LOCK_SH)

    def release(self) -> None:
        """Drop the lock and its descriptor."""
        self._close_fd()


class SharedExclusiveLock:
    """In-process reader/writer lock, writer-preferring, not reentrant.

    Safe against an exception raised asynchronously in its holder (Ctrl-C's
    KeyboardInterrupt, which Python raises in the main thread wherever it is): a count is
    changed only inside the ``try`` whose ``finally`` undoes it, in one statement with the
    flag that says so (no call, hence no point where the interrupt can land, between the
    two), and waiters re-check the state every `_POLL` seconds, so a notification an
    interrupt cut short delays a waiter rather than leaving it waiting for ever. Before,
    an interrupt between the count and its ``try`` left a reader counted for good, and
    the process's next commit waited for it for ever (a notebook user's Ctrl-C during a
    checkout).
    """

    #: Seconds a waiter sleeps before it looks at the state again without a notification.
    _POLL = 0.05

    def __init__(self) -> None:
        self._cond = threading.Condition(threading.Lock())
        self._readers = 0
        self._writer = False
        self._writers_waiting = 0

    @contextmanager
    def shared(self) -> Iterator[None]:
        """Hold the lock shared (many holders at once)."""
        counted = False
        try:
            with self._cond:
                while self._writer or self._writers_waiting:
                    self._cond.wait(self._POLL)
                self._readers, counted = self._readers + 1, True
            yield
        finally:
            interrupted: BaseException | None = None
            while counted:   # again if interrupted before the count went back
                try:
                    with self._cond:
                        if counted:
                            self._readers, counted = self._readers - 1, False
                        self._cond.notify_all()
                except BaseException as exc:  # noqa: BLE001 - raised below, once undone
                    interrupted = exc
            if interrupted is not None:
                raise interrupted

    @contextmanager
    def exclusive(self) -> Iterator[None]:
        """Hold the lock alone."""
        waiting = owner = False
        try:
            with self._cond:
                self._writers_waiting, waiting = self._writers_waiting + 1, True
                while self._writer or self._readers:
                    self._cond.wait(self._POLL)
                self._writers_waiting, waiting, self._writer, owner = (
                    self._writers_waiting - 1, False, True, True)
            yield
        finally:
            interrupted: BaseException | None = None
            while waiting or owner:   # again if interrupted before the state went back
                try:
                    with self._cond:
                        if waiting:
                            self._writers_waiting, waiting = self._writers_waiting - 1, False
                        if owner:
                            self._writer, owner = False, False
                        self._cond.notify_all()
                except BaseException as exc:  # noqa: BLE001 - raised below, once undone
                    interrupted = exc
            if interrupted is not None:
                raise interrupted
