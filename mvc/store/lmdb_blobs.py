"""The blob part of the LMDB store: the ``objects`` database.

Keys are the 32-char hex ids, values the immutable bytes.  Every put and
delete moves the object-bytes counter (`lmdb_meta`) in the same transaction,
and every read hashes the value in place in the map before handing it out.

A value read in place stays mapped, and counted in this process's resident set, until the
map closes: reading a whole store (a commit's presence checks, a checkout, fsck) would add
the store's size.  So every value read has its pages unmapped once it is consumed
(`_consume`, `EnvHandle.release`; the page cache keeps them); a value outside the map (a
write transaction's own dirty pages, on the heap) is left alone.
"""
from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from typing import Any, TypeVar

from mvc.store.base import (
    BufferTooSmallError,
    BytesLike,
    IntegrityError,
    ObjectMissingError,
    byte_view,
    check_oid,
    check_prefix,
    object_id,
)
from mvc.store.contracts import BlobStore
from mvc.store.lmdb_env import EnvHandle, LmdbConnection
from mvc.store.lmdb_meta import add_object_bytes, read_object_bytes

_ITER_BATCH = 4096
_DELETE_BATCH = 4096

T = TypeVar("T")


def _key(oid: str) -> bytes:
    return check_oid(oid).encode("ascii")


def _consume(h: EnvHandle, txn: Any, db: Any, key: bytes,
             use: Callable[[memoryview], T]) -> tuple[bool, T | None]:
    """(found, use(value)) for `key` in a buffers=True transaction of `h`, the value's map
    pages unmapped from this process afterwards (`EnvHandle.release`)."""
    buf = txn.get(key, db=db)
    if buf is None:
        return False, None
    try:
        return True, use(buf)
    finally:
        h.release(buf)


def _length(h: EnvHandle, txn: Any, db: Any, key: bytes) -> int | None:
    """The stored length of `key` (None: absent) in a buffers=True transaction.  py-lmdb
    pages a value in on any read of it (a cursor's too), so it is unmapped again."""
    found, n = _consume(h, txn, db, key, len)
    return n if found else None


class LmdbBlobStore(BlobStore):
    """Content-addressed objects in the ``objects`` database of an LMDB store."""

    def __init__(self, conn: LmdbConnection, batch_bytes: int, batch_items: int) -> None:
        self._conn = conn
        #: Upper bounds on what one put_many transaction writes (tests lower them).
        self.batch_bytes = batch_bytes
        self.batch_items = batch_items

    def close(self) -> None:
        """Close the store this part belongs to (its parts share one connection)."""
        self._conn.close()

    def put(self, data: BytesLike) -> str:
        """Store `data` (idempotent) and return its id."""
        return self.put_many([data])[0]

    def put_many(self, items: Iterable[BytesLike]) -> list[str]:
        """Store objects in transactions of at most `batch_bytes`; return ids in order."""
        ids: list[str] = []
        batch: list[tuple[bytes, memoryview]] = []
        batch_bytes = 0
        for data in items:
            mv = byte_view(data)
            oid = object_id(mv)
            ids.append(oid)
            batch.append((oid.encode("ascii"), mv))
            batch_bytes += mv.nbytes
            if batch_bytes >= self.batch_bytes or len(batch) >= self.batch_items:
                self._write_objects(batch)
                batch, batch_bytes = [], 0
        if batch:
            self._write_objects(batch)
        return ids

    def _write_objects(self, batch: list[tuple[bytes, memoryview]]) -> None:
        h = self._conn.handle()
        objects = h.dbs["objects"]
        # Deduplicated commits re-put everything: a read txn spares them a write+fsync.
        present = h.read(lambda txn: {k for k, _ in batch
                                      if _length(h, txn, objects, k) is not None}, buffers=True)
        todo = [(k, mv) for k, mv in batch if k not in present]
        if not todo:
            return

        def fn(txn: Any) -> None:
            added = 0
            for key, mv in todo:
                if txn.put(key, mv, db=objects, overwrite=False):
                    added += mv.nbytes
            if added:
                add_object_bytes(txn, h, added)
        h.write(fn, need=sum(mv.nbytes for _, mv in todo))

    def get(self, oid: str) -> bytes:
        """Return the verified content of `oid`."""
        key = _key(oid)
        h = self._conn.handle()
        found, got = h.read(lambda txn: _consume(h, txn, h.dbs["objects"], key,
                                                 lambda buf: (object_id(buf), bytes(buf))),
                            buffers=True)
        if not found or got is None:
            raise ObjectMissingError(oid)
        actual, blob = got
        if actual != oid:
            raise IntegrityError(oid, actual)
        return blob

    def get_into(self, oid: str, out: memoryview) -> int:
        """Verify `oid` in place in the map and copy it into `out`; return its length."""
        key = _key(oid)
        dest = byte_view(out)
        h = self._conn.handle()

        def copy(buf: memoryview) -> int:
            # raised in the read txn: `_consume` still unmaps the value on the way out
            n = len(buf)
            if n > len(dest):
                raise BufferTooSmallError(f"object {oid} has {n} bytes; buffer holds {len(dest)}")
            actual = object_id(buf)
            if actual != oid:
                raise IntegrityError(oid, actual)
            dest[:n] = buf
            return n
        found, n = h.read(lambda txn: _consume(h, txn, h.dbs["objects"], key, copy), buffers=True)
        if not found or n is None:
            raise ObjectMissingError(oid)
        return n

    def _stored_len(self, oid: str) -> int | None:
        key = _key(oid)
        h = self._conn.handle()
        return h.read(lambda txn: _length(h, txn, h.dbs["objects"], key), buffers=True)

    def has(self, oid: str) -> bool:
        """Whether `oid` is stored."""
        return self._stored_len(oid) is not None

    def size(self, oid: str) -> int:
        """Stored length of `oid` (no verification)."""
        n = self._stored_len(oid)
        if n is None:
            raise ObjectMissingError(oid)
        return n

    def iter_ids(self) -> Iterator[str]:
        """Every id, sorted; reads in batches so no transaction spans a yield."""
        h = self._conn.handle()
        last: bytes | None = None
        while True:
            def fn(txn: Any, after: bytes | None = last) -> list[bytes]:
                cur = txn.cursor(db=h.dbs["objects"])
                ok = cur.first() if after is None else cur.set_range(after)
                if ok and after is not None and cur.key() == after:
                    ok = cur.next()
                keys: list[bytes] = []
                while ok and len(keys) < _ITER_BATCH:
                    keys.append(cur.key())
                    ok = cur.next()
                return keys
            keys = h.read(fn)
            for k in keys:
                # A damaged key still comes out (as text that is no object id), so that
                # fsck reports it instead of failing on the decode.
                yield k.decode("ascii", "backslashreplace")
            if len(keys) < _ITER_BATCH:
                return
            last = keys[-1]

    def ids_with_prefix(self, prefix: str) -> list[str]:
        """Sorted ids starting with `prefix` (a cursor range scan)."""
        p = check_prefix(prefix).encode("ascii")
        h = self._conn.handle()

        def fn(txn: Any) -> list[str]:
            cur = txn.cursor(db=h.dbs["objects"])
            out: list[str] = []
            if cur.set_range(p):
                for k in cur.iternext(keys=True, values=False):
                    if not k.startswith(p):
                        break
                    out.append(k.decode("ascii"))
            return out
        return h.read(fn)

    def delete(self, oids: Iterable[str]) -> int:
        """Remove objects; return the content bytes removed (missing ids ignored)."""
        keys = [_key(o) for o in oids]
        h = self._conn.handle()
        if keys:
            h.check_deep_once()
        removed = 0
        for i in range(0, len(keys), _DELETE_BATCH):
            chunk = keys[i:i + _DELETE_BATCH]

            def fn(txn: Any, chunk: list[bytes] = chunk) -> int:
                n = 0
                objects = h.dbs["objects"]
                for key in chunk:
                    size = _length(h, txn, objects, key)
                    if size is not None:
                        n += size
                        txn.delete(key, db=objects)
                if n:
                    add_object_bytes(txn, h, -n)
                return n
            removed += h.write(fn)
        return removed

    def verify(self, oid: str) -> None:
        """Hash the stored value in place; raise unless it matches `oid`."""
        key = _key(oid)
        h = self._conn.handle()

        found, actual = h.read(lambda txn: _consume(h, txn, h.dbs["objects"], key, object_id),
                               buffers=True)
        if not found or actual is None:
            raise ObjectMissingError(oid)
        if actual != oid:
            raise IntegrityError(oid, actual)

    def object_bytes(self) -> int:
        """Sum of stored object lengths (a counter kept in meta; recounted if unreadable)."""
        return read_object_bytes(self._conn.handle())
