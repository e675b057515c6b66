"""Reading untrusted remote objects in bounded memory: verified spooling and budgeted parallel reads.

* `read_verified` reads one object range by range (`ObjectStorage.iter_range`),
  hashing as it goes; an object larger than one range goes to a temporary file
  and is handed out only once all of it hashed to its id -- as bytes read back,
  or as a read-only memoryview of the mapped file.  A bad object costs one
  range of memory and a temporary file, never its declared size.
* `run_bounded` runs download jobs on a thread pool while a `Budget` bounds the
  bytes held by jobs in flight and by results the caller has not taken yet.
"""
from __future__ import annotations

import itertools
import mmap
import tempfile
import threading
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from typing import TypeVar

from mvc.store.base import BytesLike, IntegrityError, id_hasher, object_id
from mvc.store.objstore.storage import READ_RANGE, ObjectStorage

_J = TypeVar("_J")
_R = TypeVar("_R")


class Stopped(Exception):
    """The reads were abandoned (a failed job, a caller that stopped reading): jobs end early."""


class Budget:
    """Bytes that parallel reads may hold: taken before a download, given back once the caller
    has the result (or, for a spooled object, once it is on disk)."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self._free = limit
        self._cond = threading.Condition()
        self.stopped = False

    def take(self, n: int) -> int:
        """Wait until `n` bytes (at most the whole budget) are free, take them, return how many
        were taken; `Stopped` once `stop` was called."""
        # Clipped to the whole budget: an object bigger than that still goes, alone.
        n = min(n, self.limit)
        with self._cond:
            while self._free < n and not self.stopped:
                self._cond.wait()
            if self.stopped:
                raise Stopped
            self._free -= n
        return n

    def give(self, n: int) -> None:
        """Return `n` bytes taken earlier."""
        if n:
            with self._cond:
                self._free += n
                self._cond.notify_all()

    def stop(self) -> None:
        """Wake every waiting `take` (they raise `Stopped`) and tell spooling reads to end."""
        with self._cond:
            self.stopped = True
            self._cond.notify_all()


def verify_bytes(oid: str, data: BytesLike) -> None:
    """`IntegrityError` unless `data` hashes to `oid`."""
    actual = object_id(data)
    if actual != oid:
        raise IntegrityError(oid, actual)


def read_verified(storage: ObjectStorage, key: str, oid: str, size: int, *, views: bool = False,
                  spool_dir: str | None = None, budget: Budget | None = None) -> BytesLike:
    """The object `oid` stored at `key` with declared `size`, verified against its id
    (`IntegrityError`; `KeyError` if the key is gone).  Up to `READ_RANGE` bytes: read in one
    piece, as bytes.  Larger: spooled to a temporary file in `spool_dir` range by range, then
    bytes read back, or with `views` a read-only memoryview of the mapped file."""
    if size <= READ_RANGE:
        data = b"".join(storage.iter_range(key, 0, size))
        verify_bytes(oid, data)
        return data
    h = id_hasher()
    with tempfile.TemporaryFile(dir=spool_dir, prefix="mvc-fetch-") as fh:
        got = 0
        for piece in storage.iter_range(key, 0, size):
            if budget is not None and budget.stopped:
                raise Stopped
            h.update(piece)
            fh.write(piece)
            got += len(piece)
            del piece  # not held while the next range downloads
        actual = h.hexdigest()
        if actual != oid:
            raise IntegrityError(oid, actual)
        if not views or got == 0:
            fh.seek(0)
            return fh.read()
        fh.flush()
        mapped = mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ)
    # The map keeps the (already unlinked) file alive until the last view of it is dropped.
    return memoryview(mapped)


def hash_ranges(storage: ObjectStorage, key: str, size: int) -> str:
    """The id of the object at `key`, hashed range by range (nothing kept; `KeyError` if gone)."""
    h = id_hasher()
    for piece in storage.iter_range(key, 0, size):
        h.update(piece)
        del piece
    return h.hexdigest()


def run_bounded(jobs: Iterable[_J], run: Callable[[_J, Budget], tuple[list[_R], int]], workers: int,
                limit: int) -> Iterator[_R]:
    """The results of `run(job, budget)` for each of `jobs`, in completion order, `workers` at a
    time.  `run` takes from the budget (of `limit` bytes) what it downloads and returns its
    results with the bytes it still holds; those are given back as the results are handed to
    the caller.  On a failure or when the caller stops, waiting and spooling jobs end early."""
    budget = Budget(limit)
    pool = ThreadPoolExecutor(workers)
    pending: set[Future[tuple[list[_R], int]]] = set()
    queue = iter(jobs)
    try:
        while True:
            for job in itertools.islice(queue, 2 * workers - len(pending)):
                pending.add(pool.submit(run, job, budget))
            if not pending:
                return
            done, pending = wait(pending, return_when=FIRST_COMPLETED)
            for fut in done:
                out, weight = fut.result()
                budget.give(weight)  # from here on the caller owns that memory
                yield from out
                del out
    finally:
        budget.stop()
        pool.shutdown(wait=True, cancel_futures=True)
