"""The LMDB-backed `ObjectStore`: the on-disk store of an mvc repository.

Layout of the ``.mvc`` directory this class manages::

    .mvc/store/        LMDB environment (data.mdb, lock.mdb) with the named
                       databases objects, refs, reflog and meta
    .mvc/lock          repository write lock (flock; holds the holder's pid)
    .mvc/store.users   shared flock of every process with the store open

Keys: objects by their 32-char hex id; refs by name; reflog entries by
``name NUL seq(8 bytes big-endian)`` so one ref's entries are contiguous and
ordered; meta by key.  Every call is one short transaction (see `lmdb_env`
for map growth, fork safety and thread safety).
"""
from __future__ import annotations

import json
import os
import threading
import time
import uuid
from contextlib import AbstractContextManager
from typing import Any, Iterable, Iterator, Sequence

from mvc.store.base import (
    ANY, BufferTooSmallError, BytesLike, CorruptRefError, CorruptReflogError, IntegrityError,
    InvalidRefError, LockError, ObjectMissingError, ObjectStore, OnCorrupt, RefConflictError,
    RefUpdate, ReflogEntry, StoreClosedError, StoreExistsError, StoreFormatError,
    StoreNotFoundError, FormatTooNewError, check_oid, check_prefix, check_ref_name,
    check_ref_value, check_update, object_id)
from mvc.store.lmdb_env import (
    DATA_FILE, LOCK_FILE, STORE_DIR, STORE_OLD, EnvHandle, MiB, acquire_handle, release_handle)
from mvc.store.lock import FileLock

SUPPORTED_FORMAT = 1
_FORMAT_KEY = b"format_version"
_OBJECT_BYTES_KEY = b"store.object_bytes"
#: Meta key of the repository id (32 hex digits), written when the store is created; the
#: level cache binds its entries to it (`mvc.repo.levelcache`).
REPO_ID_KEY = "repo.id"
_ITER_BATCH = 4096
_DELETE_BATCH = 4096


def _view(data: BytesLike) -> memoryview:
    """A flat byte view of `data` without copying."""
    mv = data if isinstance(data, memoryview) else memoryview(data)
    if mv.format != "B" or mv.ndim != 1:
        mv = mv.cast("B")
    return mv


def _parse_count(raw: Any) -> int | None:
    """The object-bytes counter as stored (ASCII digits), or None if it is missing or garbled."""
    if raw is None:
        return None
    b = bytes(raw)
    return int(b) if 0 < len(b) <= 20 and b.isdigit() else None


def _count_object_bytes(txn: Any, h: EnvHandle) -> int:
    """Sum of every object's length, read in `txn` (lengths only: values stay in the map)."""
    cur = txn.cursor(db=h.dbs["objects"])
    return sum(len(v) for v in cur.iternext(keys=False, values=True))


def _printable(raw: bytes | None) -> str:
    return "missing" if raw is None else repr(bytes(raw[:40]))


def _reflog_key(name_b: bytes, seq: int) -> bytes:
    return name_b + b"\x00" + seq.to_bytes(8, "big")


# ------------------------------------------------- ref and reflog records
# Every record is decoded and validated here, so a flipped byte in the ref or reflog
# database surfaces as one typed error naming the ref, never as a UnicodeDecodeError,
# a JSONDecodeError or a KeyError further up.
def _shown(raw: bytes, limit: int = 80) -> str:
    """A key or value as printable text: undecodable bytes and control characters escaped."""
    text = bytes(raw[:limit]).decode("utf-8", "backslashreplace")
    text = "".join(c if c.isprintable() else c.encode("unicode_escape").decode("ascii")
                   for c in text)
    return text + ("..." if len(raw) > limit else "")


def _decode_ref_name(key: bytes) -> str:
    try:
        return check_ref_name(bytes(key).decode("utf-8"))
    except (UnicodeDecodeError, InvalidRefError):
        raise CorruptRefError(_shown(key), "the name is not a valid ref name") from None


def _decode_ref_value(name: str, raw: bytes) -> str:
    try:
        return check_ref_value(bytes(raw).decode("utf-8"))
    except (UnicodeDecodeError, InvalidRefError):
        raise CorruptRefError(
            name, f"value {_shown(raw)!r} is not an object id or 'ref: <name>'") from None


def _encode_reflog_entry(old: str | None, new: str | None, when: float, reason: str) -> bytes:
    return json.dumps({"old": old, "new": new, "time": when, "reason": reason},
                      separators=(",", ":")).encode("utf-8")


def _decode_reflog_entry(name: str, seq: int, raw: bytes) -> ReflogEntry:
    def bad(detail: str) -> CorruptReflogError:
        return CorruptReflogError(name, detail, seq)

    try:
        d = json.loads(bytes(raw).decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError):
        raise bad(f"not a JSON entry: {_shown(raw)!r}") from None
    if not isinstance(d, dict) or not {"old", "new", "time", "reason"} <= d.keys():
        raise bad(f"fields missing: {_shown(raw)!r}")
    try:
        old, new = (check_ref_value(v) if v is not None else None for v in (d["old"], d["new"]))
    except InvalidRefError as exc:
        raise bad(str(exc)) from None
    when, reason = d["time"], d["reason"]
    if isinstance(when, bool) or not isinstance(when, (int, float)):
        raise bad(f"time {when!r} is not a number")
    if not isinstance(reason, str):
        raise bad(f"reason {reason!r} is not a string")
    try:
        reason.encode("utf-8")  # a lone surrogate (from a \u escape) cannot be printed
    except UnicodeEncodeError:
        raise bad("reason is not valid text") from None
    return ReflogEntry(old, new, float(when), reason)


def _deliver(errors: list[CorruptRefError], on_corrupt: OnCorrupt | None) -> None:
    """Hand every error to `on_corrupt`, or raise the first when there is none."""
    if errors and on_corrupt is None:
        raise errors[0]
    for exc in errors:
        on_corrupt(exc)  # type: ignore[misc]


class LmdbStore(ObjectStore):
    """Objects, refs, reflog and metadata in one LMDB environment under a ``.mvc`` directory."""

    #: First map size; tests lower it to exercise growth.
    INITIAL_MAP_SIZE = 256 * MiB
    #: Upper bound on the object bytes written by one put_many transaction.
    BATCH_BYTES = 256 * MiB
    BATCH_ITEMS = 10_000

    def __init__(self, path: str | os.PathLike[str]) -> None:
        """Bind to the ``.mvc`` directory `path`; the environment opens on first use."""
        self.path = os.path.realpath(os.fspath(path))
        self._handle: EnvHandle | None = None
        self._handle_pid = -1
        self._mutex = threading.Lock()
        self._mutex_pid = os.getpid()
        self._closed = False
        self._lock = FileLock(os.path.join(self.path, LOCK_FILE))

    # ------------------------------------------------------------ lifecycle
    @classmethod
    def create(cls, path: str | os.PathLike[str]) -> "LmdbStore":
        """Create a new, empty store in the ``.mvc`` directory `path` (made if missing)."""
        root = os.path.realpath(os.fspath(path))
        os.makedirs(root, exist_ok=True)
        if (os.path.exists(os.path.join(root, STORE_DIR, DATA_FILE))
                or os.path.exists(os.path.join(root, STORE_OLD))):
            raise StoreExistsError(f"an mvc store already exists at {root}")
        store = cls(root)
        store._attach(create=True)

        def init(txn: Any) -> None:
            meta = store._db("meta")
            txn.put(_FORMAT_KEY, str(SUPPORTED_FORMAT).encode(), db=meta, overwrite=False)
            txn.put(_OBJECT_BYTES_KEY, b"0", db=meta, overwrite=False)
            txn.put(REPO_ID_KEY.encode(), uuid.uuid4().hex.encode(), db=meta, overwrite=False)
        store._h().write(init)
        return store

    @classmethod
    def open(cls, path: str | os.PathLike[str]) -> "LmdbStore":
        """Open the existing store in `path` (StoreNotFoundError / FormatTooNewError)."""
        root = os.path.realpath(os.fspath(path))
        if not os.path.isdir(root):
            raise StoreNotFoundError(f"no mvc store at {root}")
        store = cls(root)
        store._h()
        return store

    def _attach(self, create: bool = False) -> EnvHandle:
        handle = acquire_handle(self.path, self.INITIAL_MAP_SIZE, create=create)
        if not create:
            try:
                self._check_format(handle)
            except BaseException:
                release_handle(handle)
                raise
        self._handle, self._handle_pid = handle, os.getpid()
        return handle

    def _h(self) -> EnvHandle:
        """This process's handle, attaching (lazily, and afresh after fork) when needed."""
        if self._closed:
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
            return self._attach()

    @staticmethod
    def _check_format(handle: EnvHandle) -> None:
        raw = handle.read(lambda txn: txn.get(_FORMAT_KEY, db=handle.dbs["meta"]))
        if raw is None:
            raise StoreFormatError(f"the store at {handle.root} has no format version")
        try:
            found = int(raw.decode("ascii"))
        except ValueError as e:
            raise StoreFormatError(f"unreadable store format version {raw!r}") from e
        if found > SUPPORTED_FORMAT:
            raise FormatTooNewError(found, SUPPORTED_FORMAT)

    def _db(self, name: str) -> Any:
        return self._h().dbs[name]

    def close(self) -> None:
        """Release this store's reference to the environment; later use raises."""
        if self._closed:
            return
        self._closed = True
        handle, self._handle = self._handle, None
        if handle is not None and self._handle_pid == os.getpid():
            release_handle(handle)

    # --------------------------------------------------------------- objects
    def put(self, data: BytesLike) -> str:
        """Store `data` (idempotent) and return its id."""
        return self.put_many([data])[0]

    def put_many(self, items: Iterable[BytesLike]) -> list[str]:
        """Store objects in transactions of at most `BATCH_BYTES`; return ids in order."""
        ids: list[str] = []
        batch: list[tuple[bytes, memoryview]] = []
        batch_bytes = 0
        for data in items:
            mv = _view(data)
            oid = object_id(mv)
            ids.append(oid)
            batch.append((oid.encode("ascii"), mv))
            batch_bytes += mv.nbytes
            if batch_bytes >= self.BATCH_BYTES or len(batch) >= self.BATCH_ITEMS:
                self._write_objects(batch)
                batch, batch_bytes = [], 0
        if batch:
            self._write_objects(batch)
        return ids

    def _write_objects(self, batch: list[tuple[bytes, memoryview]]) -> None:
        h = self._h()
        objects = h.dbs["objects"]
        # Deduplicated commits re-put everything: a read txn spares them a write+fsync.
        present = h.read(lambda txn: {k for k, _ in batch
                                      if txn.get(k, db=objects) is not None}, buffers=True)
        todo = [(k, mv) for k, mv in batch if k not in present]
        if not todo:
            return

        def fn(txn: Any) -> None:
            added = 0
            for key, mv in todo:
                if txn.put(key, mv, db=objects, overwrite=False):
                    added += mv.nbytes
            if added:
                self._add_object_bytes(txn, h, added)
        h.write(fn, need=sum(mv.nbytes for _, mv in todo))

    @staticmethod
    def _add_object_bytes(txn: Any, h: EnvHandle, delta: int) -> None:
        """Move the object-bytes counter by `delta` (called after the objects changed in `txn`).
        An unreadable counter is recounted from the objects themselves, never an error: it is
        derived data, and a flipped byte in it must not block every later commit."""
        meta = h.dbs["meta"]
        total = _parse_count(txn.get(_OBJECT_BYTES_KEY, db=meta))
        total = _count_object_bytes(txn, h) if total is None else max(total + delta, 0)
        txn.put(_OBJECT_BYTES_KEY, str(total).encode(), db=meta)

    def get(self, oid: str) -> bytes:
        """Return the verified content of `oid`."""
        key = check_oid(oid).encode("ascii")
        h = self._h()
        blob = h.read(lambda txn: txn.get(key, db=h.dbs["objects"]))
        if blob is None:
            raise ObjectMissingError(oid)
        actual = object_id(blob)
        if actual != oid:
            raise IntegrityError(oid, actual)
        return blob

    def get_into(self, oid: str, out: memoryview) -> int:
        """Verify `oid` in place in the map and copy it into `out`; return its length."""
        key = check_oid(oid).encode("ascii")
        dest = _view(out)
        h = self._h()

        def fn(txn: Any) -> tuple[str, Any]:
            buf = txn.get(key, db=h.dbs["objects"])
            if buf is None:
                return "missing", None
            n = len(buf)
            if n > len(dest):
                return "small", n
            actual = object_id(buf)
            if actual != oid:
                return "corrupt", actual
            dest[:n] = buf
            return "ok", n
        status, value = h.read(fn, buffers=True)
        if status == "missing":
            raise ObjectMissingError(oid)
        if status == "small":
            raise BufferTooSmallError(f"object {oid} has {value} bytes; buffer holds {len(dest)}")
        if status == "corrupt":
            raise IntegrityError(oid, value)
        return value

    def _stored_len(self, oid: str) -> int | None:
        key = check_oid(oid).encode("ascii")
        h = self._h()

        def fn(txn: Any) -> int | None:
            buf = txn.get(key, db=h.dbs["objects"])
            return None if buf is None else len(buf)
        return h.read(fn, buffers=True)

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
        h = self._h()
        last: bytes | None = None
        while True:
            def fn(txn: Any, after: bytes | None = last) -> list[bytes]:
                cur = txn.cursor(db=h.dbs["objects"])
                ok = cur.first() if after is None else cur.set_range(after)
                if ok and after is not None and cur.key() == after:
                    ok = cur.next()
                keys = []
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
        h = self._h()

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
        keys = [check_oid(o).encode("ascii") for o in oids]
        h = self._h()
        removed = 0
        for i in range(0, len(keys), _DELETE_BATCH):
            chunk = keys[i:i + _DELETE_BATCH]

            def fn(txn: Any, chunk: list[bytes] = chunk) -> int:
                n = 0
                objects = h.dbs["objects"]
                for key in chunk:
                    buf = txn.get(key, db=objects)
                    if buf is not None:
                        n += len(buf)
                        txn.delete(key, db=objects)
                if n:
                    self._add_object_bytes(txn, h, -n)
                return n
            removed += h.write(fn)
        return removed

    def verify(self, oid: str) -> None:
        """Hash the stored value in place; raise unless it matches `oid`."""
        key = check_oid(oid).encode("ascii")
        h = self._h()

        def fn(txn: Any) -> str | None:
            buf = txn.get(key, db=h.dbs["objects"])
            return None if buf is None else object_id(buf)
        actual = h.read(fn, buffers=True)
        if actual is None:
            raise ObjectMissingError(oid)
        if actual != oid:
            raise IntegrityError(oid, actual)

    def _corrupt_for_test(self, oid: str, byte_index: int) -> None:
        """Flip one byte of a stored value, keeping its key (tests only)."""
        key = check_oid(oid).encode("ascii")
        h = self._h()

        def fn(txn: Any) -> None:
            value = bytearray(txn.get(key, db=h.dbs["objects"]))
            value[byte_index] ^= 0xFF
            txn.put(key, bytes(value), db=h.dbs["objects"])
        h.write(fn)

    # ------------------------------------------------------------------ refs
    def read_ref(self, name: str) -> str | None:
        """Raw value of ref `name`, or None (CorruptRefError if the stored value is unreadable)."""
        key = check_ref_name(name).encode("utf-8")
        h = self._h()
        raw = h.read(lambda txn: txn.get(key, db=h.dbs["refs"]))
        return None if raw is None else _decode_ref_value(name, raw)

    def iter_refs(self, prefix: str = "", *,
                  on_corrupt: OnCorrupt | None = None) -> Iterator[tuple[str, str]]:
        """(name, value) of refs whose name starts with `prefix`, sorted by name."""
        p = prefix.encode("utf-8")
        h = self._h()

        def fn(txn: Any) -> list[tuple[bytes, bytes]]:
            cur = txn.cursor(db=h.dbs["refs"])
            rows = []
            if cur.set_range(p):
                for k, v in cur.iternext():
                    if not k.startswith(p):
                        break
                    rows.append((k, v))
            return rows
        out, errors = [], []
        for k, v in h.read(fn):
            try:
                name = _decode_ref_name(k)
                out.append((name, _decode_ref_value(name, v)))
            except CorruptRefError as exc:
                errors.append(exc)
        _deliver(errors, on_corrupt)
        return iter(out)

    def update_refs(self, updates: Sequence[RefUpdate], reason: str) -> None:
        """Atomic compare-and-swap of several refs plus their reflog entries, in one txn."""
        updates = list(updates)
        for u in updates:
            check_update(u)
        now = time.time()
        h = self._h()

        def fn(txn: Any) -> None:
            refs, reflog = h.dbs["refs"], h.dbs["reflog"]
            for u in updates:
                key = u.name.encode("utf-8")
                raw = txn.get(key, db=refs)
                current = None if raw is None else _decode_ref_value(u.name, raw)
                if u.old is not ANY and current != u.old:
                    raise RefConflictError(u.name, u.old, current)
                if u.new is None:
                    if raw is not None:
                        txn.delete(key, db=refs)
                else:
                    txn.put(key, u.new.encode("utf-8"), db=refs)
                txn.put(_reflog_key(key, self._next_seq(txn, reflog, key, u.name)),
                        _encode_reflog_entry(current, u.new, now, reason), db=reflog)
        h.write(fn)

    @staticmethod
    def _next_seq(txn: Any, reflog: Any, name_b: bytes, name: str) -> int:
        # Names hold no control characters, so b"\x01" sorts after every
        # "name\0<seq>" key of this name and before any longer name.
        cur = txn.cursor(db=reflog)
        ok = cur.set_range(name_b + b"\x01")
        ok = cur.prev() if ok else cur.last()
        start = name_b + b"\x00"
        while ok:
            k = bytes(cur.key())
            if not k.startswith(start):
                break
            if len(k) == len(start) + 8:  # skip a corrupt key of another length
                seq = int.from_bytes(k[-8:], "big") + 1
                if seq >= 1 << 64:
                    raise CorruptReflogError(name, "sequence number out of range")
                return seq
            ok = cur.prev()
        return 0

    def _reflog_keys_values(self, txn: Any, name_b: bytes) -> list[tuple[bytes, bytes]]:
        """Every reflog record under `name_b`, corrupt keys of the wrong length included."""
        cur = txn.cursor(db=self._h().dbs["reflog"])
        start = name_b + b"\x00"
        out = []
        if cur.set_range(start):
            for k, v in cur.iternext():
                k = bytes(k)  # write txns hand out memoryviews
                if not k.startswith(start):
                    break
                out.append((k, bytes(v)))
        return out

    def reflog(self, name: str, *, on_corrupt: OnCorrupt | None = None) -> list[ReflogEntry]:
        """Every recorded move of `name`, oldest first."""
        key = check_ref_name(name).encode("utf-8")
        rows = self._h().read(lambda txn: self._reflog_keys_values(txn, key))
        out, errors = [], []
        for k, v in rows:
            tail = k[len(key) + 1:]
            if len(tail) != 8:
                errors.append(CorruptReflogError(name, f"malformed key {_shown(k)!r}"))
                continue
            try:
                out.append(_decode_reflog_entry(name, int.from_bytes(tail, "big"), v))
            except CorruptRefError as exc:
                errors.append(exc)
        _deliver(errors, on_corrupt)
        return out

    def reflog_names(self, *, on_corrupt: OnCorrupt | None = None) -> list[str]:
        """Sorted names that have reflog entries (skips from one name to the next)."""
        h = self._h()

        def fn(txn: Any) -> list[tuple[bytes, bool]]:
            cur = txn.cursor(db=h.dbs["reflog"])
            found = []
            ok = cur.first()
            while ok:
                k = bytes(cur.key())
                if b"\x00" not in k:  # no "name NUL seq" structure at all
                    found.append((k, False))
                    ok = cur.next()
                    continue
                name_b = k.split(b"\x00", 1)[0]
                found.append((name_b, True))
                ok = cur.set_range(name_b + b"\x01")
            return found
        names, errors = [], []
        for raw, keyed in h.read(fn):
            try:
                if not keyed:
                    raise CorruptReflogError(_shown(raw), "malformed key")
                names.append(_decode_ref_name(raw))
            except CorruptRefError as exc:
                if not isinstance(exc, CorruptReflogError):
                    exc = CorruptReflogError(exc.name, "the name is not a valid ref name")
                errors.append(exc)
        _deliver(errors, on_corrupt)
        return names

    def delete_reflog(self, name: str) -> None:
        """Forget the reflog of `name`."""
        key = check_ref_name(name).encode("utf-8")
        h = self._h()

        def fn(txn: Any) -> None:
            for k, _ in self._reflog_keys_values(txn, key):
                txn.delete(k, db=h.dbs["reflog"])
        h.write(fn)

    # ------------------------------------------------------------------ meta
    def get_meta(self, key: str) -> bytes | None:
        """Metadata value or None."""
        k = key.encode("utf-8")
        h = self._h()
        return h.read(lambda txn: txn.get(k, db=h.dbs["meta"]))

    def set_meta(self, key: str, value: bytes) -> None:
        """Set a metadata value."""
        k = key.encode("utf-8")
        v = bytes(value)
        h = self._h()
        h.write(lambda txn: txn.put(k, v, db=h.dbs["meta"]))

    # ----------------------------------------------------------- maintenance
    def write_lock(self, timeout: float = 60.0) -> AbstractContextManager[None]:
        """Exclusive repository lock across threads and processes (reentrant per thread)."""
        if self._closed:
            raise StoreClosedError("store used after close()")
        return self._lock.hold(timeout)

    def disk_usage(self) -> int:
        """Size of the LMDB data file in bytes."""
        return os.path.getsize(os.path.join(self.path, STORE_DIR, DATA_FILE))

    def object_bytes(self) -> int:
        """Sum of stored object lengths (a counter kept in meta; recounted if unreadable)."""
        h = self._h()

        def fn(txn: Any) -> int:
            total = _parse_count(txn.get(_OBJECT_BYTES_KEY, db=h.dbs["meta"]))
            return _count_object_bytes(txn, h) if total is None else total
        return h.read(fn, buffers=True)

    def check_meta(self, repair: bool = True) -> list[str]:
        """Recount the object-bytes counter; one line if it was wrong (and, with `repair`, fixed)."""
        h = self._h()

        def fn(txn: Any) -> tuple[bytes | None, int]:
            raw = txn.get(_OBJECT_BYTES_KEY, db=h.dbs["meta"])
            return (None if raw is None else bytes(raw)), _count_object_bytes(txn, h)

        def fix(txn: Any) -> tuple[bytes | None, int]:
            found = fn(txn)
            txn.put(_OBJECT_BYTES_KEY, str(found[1]).encode(), db=h.dbs["meta"])
            return found
        raw, actual = h.read(fn, buffers=True)
        if _parse_count(raw) == actual:
            return []
        if repair:
            raw, actual = h.write(fix)
        what = "repaired" if repair else "not repaired"
        return [f"store metadata: object byte counter {_printable(raw)} != {actual} stored ({what})"]

    def map_size(self) -> int:
        """Current LMDB map size of this process (for diagnostics and tests)."""
        return self._h().with_env(lambda env: env.info()["map_size"])

    def compact_copy(self, dest_dir: str | os.PathLike[str]) -> None:
        """Write a compacted, consistent copy of the environment into the empty `dest_dir`."""
        dest = os.fspath(dest_dir)
        os.makedirs(dest, exist_ok=True)
        if os.listdir(dest):
            raise StoreExistsError(f"compact_copy destination is not empty: {dest}")
        self._h().with_env(lambda env: env.copy(dest, compact=True))

    def shrink(self, timeout: float = 60.0) -> tuple[int, int]:
        """Replace the data file by a compacted copy; return (bytes before, bytes after).

        Crash safety: the copy is written and fsynced in ``store.new`` while the
        live ``store`` is untouched; then ``store -> store.old`` and
        ``store.new -> store`` (each rename fsynced) and ``store.old`` is removed.
        A crash before the first rename leaves ``store`` intact (``store.new`` is
        discarded on open); between the renames ``store`` is missing and
        ``store.old`` is complete, so open renames it back; after the second
        rename ``store`` is the complete compacted copy and leftovers are
        removed.  Holds the write lock, and refuses (`LockError`) while another
        process has the store open, since its mapping would keep the old file.
        """
        with self.write_lock(timeout):
            h = self._h()
            with h.rw.exclusive():
                if h.env is None:
                    h.open_env()
                if not h.users.try_exclusive():
                    raise LockError("cannot shrink: the repository is open in another process")
                try:
                    return h.swap_in_compacted()
                finally:
                    h.users.downgrade()
