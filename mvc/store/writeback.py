"""Objects written by a background thread while the caller produces the next ones.

A commit encodes tensor after tensor and stores each one's chunks.  Writing
them synchronously makes the encoder wait for every write transaction: the
copy of the payload into the store and its fsync.  `BackgroundWriter` is a
`put` / `put_many` front of a blob store that returns the ids at once (they
are content hashes) and hands the bytes, in batches of about `batch_bytes`,
to one writer thread, so the disk works while the CPU encodes.

Durability is the store's, unchanged: each batch is one `put_many` of the
store (for LMDB, transactions with their fsync), and `close` returns only
once every batch is stored, raising the first error the writer met.  Nothing
may refer to an object before `close` returned: a commit publishes its
snapshot after it.  At most `max_batches` batches wait behind the one being
written, so the bytes held in memory stay bounded.
"""
from __future__ import annotations

import queue
import threading
from collections.abc import Iterable
from types import TracebackType
from typing import Protocol

from mvc.errors import InternalError
from mvc.store.base import BytesLike, object_id

#: The bytes one batch (one `put_many` of the store) gathers before it is handed over.
BATCH_BYTES = 64 << 20


class BlobWriter(Protocol):
    """The writing half of a blob store."""

    def put_many(self, items: Iterable[BytesLike]) -> list[str]: ...


_STOP = None


class BackgroundWriter:
    """`put` / `put_many` that store through `store.put_many` on one background thread.

    Use as a context manager: leaving the block normally waits until everything is
    stored (and raises the writer's error, if any); leaving it by an exception stops
    the writer after its current batch and drops what was not written yet.  Callers
    must not modify a buffer they passed until then.
    """

    def __init__(self, store: BlobWriter, batch_bytes: int = BATCH_BYTES,
                 max_batches: int = 1) -> None:
        self.store = store
        self.batch_bytes = batch_bytes
        self._batch: list[BytesLike] = []
        self._batch_size = 0
        self._queue: queue.Queue[list[BytesLike] | None] = queue.Queue(maxsize=max(1, max_batches))
        self._error: BaseException | None = None
        self._abandon = threading.Event()
        self._closed = False
        self._thread = threading.Thread(target=self._run, name="mvc-writeback", daemon=True)
        self._thread.start()

    # ------------------------------------------------------------------ caller side
    def put(self, data: BytesLike) -> str:
        """Queue one object; returns its id (stored once `close` returned)."""
        return self.put_many([data])[0]

    def put_many(self, items: Iterable[BytesLike]) -> list[str]:
        """Queue objects; returns their ids in order (stored once `close` returned)."""
        if self._closed:
            raise InternalError("BackgroundWriter used after close()")
        ids = []
        for data in items:
            ids.append(object_id(data))
            self._batch.append(data)
            self._batch_size += len(memoryview(data).cast("B"))
            if self._batch_size >= self.batch_bytes:
                self._hand_over()
        return ids

    def close(self) -> None:
        """Store what is still queued and wait for it; raises the writer's first error."""
        if self._closed:
            self._raise_error()
            return
        self._closed = True
        try:
            if self._batch:
                self._hand_over()
        finally:
            self._post(_STOP)
            self._thread.join()
        self._raise_error()

    def abandon(self) -> None:
        """Stop after the batch being written; queued objects are dropped (never referenced)."""
        self._closed = True
        self._abandon.set()
        self._batch, self._batch_size = [], 0
        self._post(_STOP)
        self._thread.join()

    def __enter__(self) -> BackgroundWriter:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        if exc_type is None:
            self.close()
        else:
            self.abandon()

    def _hand_over(self) -> None:
        batch, self._batch, self._batch_size = self._batch, [], 0
        self._raise_error()  # the writer failed: stop producing now, not at close
        self._post(batch)

    def _post(self, item: list[BytesLike] | None) -> None:
        # A bounded queue: the caller waits here while the writer is behind, which bounds
        # the memory held; once the writer is dead nothing drains it, so stop waiting.
        while True:
            try:
                self._queue.put(item, timeout=0.1)
                return
            except queue.Full:
                if not self._thread.is_alive():
                    return

    def _raise_error(self) -> None:
        if self._error is not None:
            raise self._error

    # ------------------------------------------------------------------ writer thread
    def _run(self) -> None:
        while True:
            batch = self._queue.get()
            if batch is _STOP:
                return
            if self._error is not None or self._abandon.is_set():
                continue  # drain without writing: the caller gets the error or left
            try:
                self.store.put_many(batch)
            except BaseException as e:  # noqa: BLE001 - re-raised on the caller's thread
                self._error = e
