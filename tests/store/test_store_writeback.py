"""mvc.store.writeback.BackgroundWriter: ids at once, bytes stored by close, errors surfaced."""
from __future__ import annotations

import threading

import pytest

from mvc.errors import InternalError
from mvc.store import LmdbStore, MemoryStore, object_id
from mvc.store.writeback import BackgroundWriter


class FailingStore:
    """A blob sink whose n-th put_many raises (a full disk, say)."""

    def __init__(self, inner: MemoryStore, fail_at: int) -> None:
        self.inner = inner
        self.fail_at = fail_at
        self.calls = 0
        self.threads: set[str] = set()

    def put_many(self, items):
        self.calls += 1
        self.threads.add(threading.current_thread().name)
        if self.calls == self.fail_at:
            raise OSError(28, "No space left on device")
        return self.inner.blobs.put_many(items)


def _payloads(n: int, size: int) -> list[bytes]:
    return [bytes([i % 251]) * size + i.to_bytes(4, "little") for i in range(n)]


def test_everything_is_stored_with_the_same_ids_once_closed(tmp_path):
    store = LmdbStore.create(tmp_path / ".mvc")
    try:
        data = _payloads(40, 5000)
        with BackgroundWriter(store.blobs, batch_bytes=20_000) as w:
            ids = [w.put(d) for d in data[:10]] + w.put_many(data[10:])
        assert ids == [object_id(d) for d in data]
        for oid, d in zip(ids, data):
            assert store.blobs.get(oid) == d
        # Re-putting stored objects is idempotent and changes nothing.
        before = store.blobs.object_bytes()
        with BackgroundWriter(store.blobs, batch_bytes=1) as w:
            assert w.put_many(data) == ids
        assert store.blobs.object_bytes() == before
    finally:
        store.close()


def test_memoryviews_into_a_larger_buffer_are_stored_as_their_bytes():
    store = MemoryStore()
    buf = bytearray(range(256)) * 100
    view = memoryview(buf)
    with BackgroundWriter(store.blobs, batch_bytes=1000) as w:
        ids = [w.put(view[i:i + 700]) for i in range(0, 20_000, 700)]
    for oid, i in zip(ids, range(0, 20_000, 700)):
        assert store.blobs.get(oid) == bytes(buf[i:i + 700])


def test_writes_happen_on_the_writer_thread():
    sink = FailingStore(MemoryStore(), fail_at=0)
    with BackgroundWriter(sink, batch_bytes=100) as w:
        w.put_many(_payloads(10, 100))
    assert sink.calls == 10
    assert sink.threads == {"mvc-writeback"}


def test_a_writer_error_is_raised_to_the_caller_and_nothing_later_is_written():
    sink = FailingStore(MemoryStore(), fail_at=2)
    data = _payloads(50, 1000)
    with pytest.raises(OSError, match="No space"):
        with BackgroundWriter(sink, batch_bytes=1000, max_batches=1) as w:
            for d in data:
                w.put(d)
    # The first batch landed, the failing one did not, and the writer stopped writing.
    assert sink.inner.blobs.has(object_id(data[0]))
    assert not sink.inner.blobs.has(object_id(data[1]))
    assert not any(sink.inner.blobs.has(object_id(d)) for d in data[3:])


def test_an_error_in_the_caller_drops_what_is_queued_and_stops_the_thread():
    store = MemoryStore()
    before = threading.active_count()
    with pytest.raises(RuntimeError, match="encoder failed"):
        with BackgroundWriter(store.blobs, batch_bytes=10**9) as w:
            w.put(b"never written")
            raise RuntimeError("encoder failed")
    assert not store.blobs.has(object_id(b"never written"))
    assert threading.active_count() == before


def test_close_is_idempotent_and_use_after_close_is_refused():
    store = MemoryStore()
    w = BackgroundWriter(store.blobs)
    w.put(b"x")
    w.close()
    w.close()
    assert store.blobs.has(object_id(b"x"))
    with pytest.raises(InternalError, match="after close"):
        w.put(b"y")
