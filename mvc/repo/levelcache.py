"""The level caches: in memory (`LevelCache`), and on disk (`.mvc/cache/levels/`, `DiskLevelCache`)
with what binds an entry to the data it stands for.

`TensorReader` owns both. The in-memory one holds recently materialized tensors
of this process; the rest of this page is about the on-disk one.

Each lossy commit leaves the base encoding of every quantized tensor it wrote in
one file, ``<snapshot id>.levels``, so a fresh process (the next CLI commit, a
resume) decodes one base instead of walking a delta chain. The cache is
disposable: deleting it is always safe, and an entry that does not prove it
belongs to the tensor being read is a miss, never data.

File layout (little-endian)::

    magic     8 bytes   b"MVCLVL02"
    length    8 bytes   N, the header's byte length
    digest   16 bytes   xxh3-128 of the header bytes
    header    N bytes   canonical JSON, below
    blobs               the entries' base encodings, back to back

The header binds the file to a repository and a snapshot, and each entry to the
record it caches::

    {"repo": <repository id>, "snapshot": <snapshot id>,
     "tensors": {<name>: {"dtype", "shape", "chunks": [<payload chunk ids of the record>],
                          "meta": <codec meta of the base encoding>,
                          "offset", "length", "xxh3": <xxh3-128 of the blob>}}}

An entry serves a read of tensor `name` of snapshot `sid` only when the header
digest verifies, `repo` is this repository's id, `snapshot` is `sid` (the file
name is not trusted), and dtype, shape and chunk ids equal those of the record
the snapshot holds now (after gc's replacements: a tensor gc re-encoded no
longer matches). Its blob must match its digest before it is decoded. Lengths
are checked against the file's size before anything is allocated. A file that
fails a file-level check (magic, digest, repository, snapshot) is removed when
read; `check_level_cache` (run by fsck) reports every unusable entry.

The repository id is 32 hex digits in the store's metadata (`repo.id`), written
when the store is created. A repository made before ids existed gets a random
one on first use, so its id is as stable as any new repository's; an id derived
from the repository instead (its path, its first commit) would change when the
directory moves or not tell apart two clones whose caches can differ. If the id
cannot be written (a read-only repository) the disk cache is simply not used.
"""
from __future__ import annotations

import json
import os
import struct
import threading
import uuid
from collections import OrderedDict
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import xxhash

from mvc.codecs.base import Encoded
from mvc.codecs.quantized import decode_base
from mvc.errors import MvcError
from mvc.quant import QuantizedTensor
from mvc.repo.objects import Snapshot, TensorRecord
from mvc.repo.tensors import dtype_name, parse_dtype
from mvc.store import REPO_ID_KEY, BlobStore, InvalidIdError, StoreMaintenance
from mvc.store.base import check_oid

#: What a commit leaves in the disk cache: tensor name -> (base encoding, dtype, shape).
BaseEntries = dict[str, tuple[Encoded, torch.dtype, tuple[int, ...]]]

MAGIC = b"MVCLVL02"
_PREFIX = struct.Struct("<8sQ16s")
SUFFIX = ".levels"


class CorruptEntry(Exception):
    """A cache file that fails a check (internal: every caller turns it into a miss)."""


def repository_id(meta: StoreMaintenance) -> str | None:
    """This repository's id from the store's metadata, made on first use (None if it cannot be
    stored: then nothing is cached). A malformed stored id is replaced."""
    rid = _valid_id(meta.get_meta(REPO_ID_KEY))
    if rid is not None:
        return rid
    try:
        meta.set_meta(REPO_ID_KEY, uuid.uuid4().hex.encode())
        # Read back: of two processes racing here, both use the id that was stored last.
        return _valid_id(meta.get_meta(REPO_ID_KEY))
    except (MvcError, OSError):
        return None


def _valid_id(raw: bytes | None) -> str | None:
    try:
        return check_oid(bytes(raw).decode("ascii")) if raw is not None else None
    except (InvalidIdError, UnicodeDecodeError):
        return None


def _digest(data: Any) -> bytes:
    return xxhash.xxh3_128_digest(data)


class LevelCache:
    """Recently materialized quantized tensors, keyed by (snapshot id, tensor name), in memory.

    Keeps a live training process from re-walking delta chains on every
    commit, and makes consecutive checkouts cheap. Bounded by level bytes.
    """

    def __init__(self, max_bytes: int = 2 << 30):
        self.max_bytes = max_bytes
        self._items: OrderedDict[tuple[str, str], QuantizedTensor] = OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()  # checkout fills it from several threads

    @staticmethod
    def _size(q: QuantizedTensor) -> int:
        return q.levels.numel() * q.levels.element_size() + q.protected.numel() * q.protected.element_size()

    def get(self, key: tuple[str, str]) -> QuantizedTensor | None:
        """The cached tensor for `key`, or None."""
        with self._lock:
            q = self._items.get(key)
            if q is not None:
                self._items.move_to_end(key)
            return q

    def put(self, key: tuple[str, str], q: QuantizedTensor) -> None:
        """Cache `q` under `key`, dropping the least recently used beyond `max_bytes`."""
        with self._lock:
            if key in self._items:
                self._bytes -= self._size(self._items.pop(key))
            size = self._size(q)
            if size > self.max_bytes:
                return
            self._items[key] = q
            self._bytes += size
            while self._bytes > self.max_bytes:
                _, old = self._items.popitem(last=False)
                self._bytes -= self._size(old)

    def clear(self) -> None:
        """Forget everything."""
        with self._lock:
            self._items.clear()
            self._bytes = 0


class DiskLevelCache:
    """Base encodings of the newest snapshots' quantized tensors, one file per snapshot.

    `blobs` holds the snapshots whose records entries are bound to; `meta` (the
    store's metadata) supplies the repository id. Without them nothing is cached.
    Thread-safe; any failure to read is a miss.
    """

    def __init__(self, directory: Path, keep: int = 4, *, blobs: BlobStore | None = None,
                 meta: StoreMaintenance | None = None) -> None:
        self.dir = Path(directory)
        self.keep = keep
        self.blobs = blobs
        self.meta = meta
        self._rid: str | None = None
        self._rid_lock = threading.Lock()
        self._parsed = _ParseMemo(max(keep, 1) * 2)

    def repository_id(self) -> str | None:
        """The id entries are bound to (None: no store, or no id can be kept; cache unused)."""
        if self._rid is None and self.meta is not None:
            with self._rid_lock:
                if self._rid is None:
                    self._rid = repository_id(self.meta)
        return self._rid

    def path(self, sid: str) -> Path:
        """The file that caches snapshot `sid`."""
        return self.dir / f"{sid}{SUFFIX}"

    def files(self) -> list[Path]:
        """Every cache file now in the directory."""
        try:
            return sorted(self.dir.glob(f"*{SUFFIX}"))
        except OSError:
            return []

    # ------------------------------------------------------------------ write
    def save(self, sid: str, entries: BaseEntries) -> None:
        """Cache the base encodings `entries` (name -> (encoding, dtype, shape)) of snapshot `sid`,
        which must already be stored; then keep only the newest `keep` files."""
        rid = self.repository_id()
        if not entries or rid is None or self.blobs is None:
            return
        records = {r.name: r for r in Snapshot.decode(self.blobs.get(sid), sid).tensors}
        index: dict[str, Any] = {}
        blobs: list[bytes] = []
        off = 0
        for name, (enc, dtype, shape) in entries.items():
            rec = records.get(name)
            if rec is None or rec.dtype != dtype_name(dtype) or list(rec.shape) != list(shape):
                continue  # not what the snapshot stores under this name: nothing to bind to
            data = b"".join(bytes(memoryview(p).cast("B")) for p in enc.parts)
            index[name] = {"dtype": rec.dtype, "shape": list(rec.shape), "chunks": list(rec.chunks),
                           "meta": enc.meta, "offset": off, "length": len(data),
                           "xxh3": _digest(data).hex()}
            blobs.append(data)
            off += len(data)
        if not index:
            return
        header = json.dumps({"repo": rid, "snapshot": sid, "tensors": index},
                            sort_keys=True, separators=(",", ":")).encode()
        self.dir.mkdir(parents=True, exist_ok=True)
        tmp = self.dir / f".{sid}.{os.getpid()}.{threading.get_ident()}.tmp"
        try:
            with open(tmp, "wb") as fh:
                fh.write(_PREFIX.pack(MAGIC, len(header), _digest(header)))
                fh.write(header)
                fh.writelines(blobs)
            os.replace(tmp, self.path(sid))
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise
        self._rotate()

    def _rotate(self) -> None:
        dated = []
        for p in self.files():
            try:
                dated.append((p.stat().st_mtime, p))
            except OSError:  # removed meanwhile by another process
                continue
        dated.sort(reverse=True)
        for _, old in dated[self.keep:]:
            try:
                old.unlink(missing_ok=True)
            except OSError:
                pass

    # ------------------------------------------------------------------ read
    def load(self, sid: str, rec: TensorRecord) -> QuantizedTensor | None:
        """The cached levels of `rec` (tensor `rec.name` of snapshot `sid`, as stored now), or None.

        A file that fails its checks is removed; an entry bound to another record is left alone."""
        rid = self.repository_id()
        if rid is None:
            return None
        path = self.path(sid)
        try:
            with open(path, "rb") as fh:
                return self._load(fh, path, sid, rec, rid)
        except OSError:  # missing (the common miss) or unreadable
            return None

    def _load(self, fh: Any, path: Path, sid: str, rec: TensorRecord, rid: str) -> QuantizedTensor | None:
        try:
            header, start, size = self._header(fh)
            if header["repo"] != rid or header["snapshot"] != sid:
                raise CorruptEntry("belongs to another repository or snapshot")
            e = header["tensors"].get(rec.name)
            if e is None or not binds(e, rec):
                return None
            data = read_blob(fh, start, size, e)
            return decode_base(e["meta"], data, parse_dtype(e["dtype"]), tuple(e["shape"]))
        except (CorruptEntry, MvcError, OSError, ValueError):
            _discard(path, fh)
            return None

    def _header(self, fh: Any) -> tuple[dict[str, Any], int, int]:
        """`read_header`, with the parsed header memoized by its digest: a checkout reads one
        file once per tensor, and the digest is still checked on every read."""
        return read_header(fh, self._parsed)

def binds(entry: dict[str, Any], rec: TensorRecord) -> bool:
    """Whether a cache entry was made for exactly this record (dtype, shape, payload chunks)."""
    return (entry["dtype"] == rec.dtype and entry["shape"] == list(rec.shape)
            and entry["chunks"] == list(rec.chunks))


class _ParseMemo:
    """Checked headers by their digest (bounded; thread-safe)."""

    def __init__(self, size: int) -> None:
        self.size = size
        self._items: dict[tuple[bytes, int], dict[str, Any]] = {}
        self._lock = threading.Lock()

    def get(self, key: tuple[bytes, int]) -> dict[str, Any] | None:
        with self._lock:
            return self._items.get(key)

    def put(self, key: tuple[bytes, int], header: dict[str, Any]) -> None:
        with self._lock:
            if len(self._items) >= self.size:
                self._items.clear()
            self._items[key] = header


def read_header(fh: Any, memo: _ParseMemo | None = None) -> tuple[dict[str, Any], int, int]:
    """(header, offset of the first blob, file size) of an open cache file; `CorruptEntry`
    unless the prefix, the header digest and every field's type and range check out.
    `memo` skips re-parsing a header whose digest (and blob area size) was seen before."""
    size = os.fstat(fh.fileno()).st_size
    prefix = fh.read(_PREFIX.size)
    if len(prefix) != _PREFIX.size:
        raise CorruptEntry("truncated prefix")
    magic, n, digest = _PREFIX.unpack(prefix)
    if magic != MAGIC:
        raise CorruptEntry("not a level cache file of this version")
    if n > size - _PREFIX.size:  # before allocating: a flipped length is no MemoryError
        raise CorruptEntry(f"header length {n} exceeds the file's {size} bytes")
    raw = fh.read(n)
    if len(raw) != n or _digest(raw) != digest:
        raise CorruptEntry("header checksum mismatch")
    start = _PREFIX.size + n
    key = (digest, size - start)  # the bounds check depends on the blob area's size too
    header = memo.get(key) if memo is not None else None
    if header is None:
        try:
            header = json.loads(raw)
        except (ValueError, RecursionError):
            raise CorruptEntry("header is not JSON") from None
        _check_header(header, size - start)
        if memo is not None:
            memo.put(key, header)
    return header, start, size


def _check_header(h: Any, data_bytes: int) -> None:
    """Every field a reader uses, by type and range (the digest catches accidents, this the rest)."""
    if (not isinstance(h, dict) or not isinstance(h.get("repo"), str)
            or not isinstance(h.get("snapshot"), str) or not isinstance(h.get("tensors"), dict)):
        raise CorruptEntry("header lacks repo / snapshot / tensors")
    for name, e in h["tensors"].items():
        ok = (isinstance(e, dict) and isinstance(e.get("dtype"), str) and isinstance(e.get("meta"), dict)
              and isinstance(e.get("shape"), list) and all(type(d) is int and d >= 0 for d in e["shape"])
              and isinstance(e.get("chunks"), list) and all(isinstance(c, str) for c in e["chunks"])
              and type(e.get("offset")) is int and type(e.get("length")) is int
              and isinstance(e.get("xxh3"), str)
              and 0 <= e["offset"] and 0 <= e["length"] and e["offset"] + e["length"] <= data_bytes)
        if not ok:
            raise CorruptEntry(f"entry {name!r} is malformed or lies outside the file")


def read_blob(fh: Any, start: int, size: int, e: dict[str, Any]) -> bytearray:
    """One entry's verified blob (its bounds were checked against the file size by `read_header`)."""
    fh.seek(start + e["offset"])
    data = bytearray(e["length"])
    if fh.readinto(data) != len(data) or _digest(data).hex() != e["xxh3"]:
        raise CorruptEntry("levels checksum mismatch")
    return data


def _discard(path: Path, fh: Any) -> None:
    """Remove a bad cache file, unless another process has meanwhile replaced it by a new one."""
    try:
        mine, now = os.fstat(fh.fileno()), os.stat(path)
        if (mine.st_dev, mine.st_ino) == (now.st_dev, now.st_ino):
            path.unlink()
    except OSError:
        pass


# ---------------------------------------------------------------------- fsck and stats

def cache_bytes(directory: Path) -> int:
    """Bytes every file under `directory` (`.mvc/cache/`: the level cache and anything left
    beside it) occupies."""
    total = 0
    for root, _, names in os.walk(directory):
        for n in names:
            try:
                total += os.lstat(os.path.join(root, n)).st_size
            except OSError:
                continue
    return total


def check_level_cache(cache: DiskLevelCache, read_snapshot: Callable[[str], Snapshot], *,
                      remove: bool = False) -> list[str]:
    """One line per unusable level-cache file or entry: corrupt (fails a checksum or a bound),
    foreign (made by another repository, or for another snapshot than its name says) or stale
    (its snapshot is gone, or its tensor is no longer stored as it was cached: gc re-encoded it).

    None of these is repository damage: reads skip such entries. With `remove`, the files
    holding them are deleted. `read_snapshot` reads a snapshot as checkouts do (following
    gc's replacements).
    """
    rid = repository_id(cache.meta) if cache.meta is not None else None
    out: list[str] = []
    for path in cache.files():
        found = _check_file(read_snapshot, path, rid)
        out.extend(f"level cache {path.name}: {p}" for p in found)
        if found and remove:
            path.unlink(missing_ok=True)
    for tmp in sorted(cache.dir.glob(".*.tmp")) if cache.dir.is_dir() else []:
        if not _writer_alive(tmp.name):
            out.append(f"level cache {tmp.name}: stale (temporary file of an interrupted write)")
            if remove:
                tmp.unlink(missing_ok=True)
    return out


def _check_file(read_snapshot: Callable[[str], Snapshot], path: Path, rid: str | None
                ) -> list[str]:
    sid = path.name[:-len(SUFFIX)]
    try:
        with open(path, "rb") as fh:
            header, start, size = read_header(fh)
            if header["repo"] != rid:
                return [f"foreign (made by repository {header['repo'][:40]!r})"]
            if header["snapshot"] != sid:
                return [f"foreign (holds snapshot {header['snapshot'][:40]!r})"]
            try:
                records = {r.name: r for r in read_snapshot(sid).tensors}
            except MvcError:
                return ["stale (its snapshot is no longer in the repository)"]
            out = []
            for name, e in header["tensors"].items():
                try:
                    read_blob(fh, start, size, e)
                except CorruptEntry as exc:
                    out.append(f"corrupt (tensor {name!r}: {exc})")
                    continue
                rec = records.get(name)
                if rec is None or not binds(e, rec):
                    out.append(f"stale (tensor {name!r} is no longer stored as cached)")
            return out
    except CorruptEntry as exc:
        return [f"corrupt ({exc})"]
    except OSError as exc:
        return [f"unreadable ({exc.strerror or exc})"]


def _writer_alive(name: str) -> bool:
    """Whether the process named in a temporary file's name (`.sid.pid.thread.tmp`) still runs."""
    parts = name.split(".")
    try:
        pid = int(parts[2])
        if pid <= 0:
            return False
        os.kill(pid, 0)
    except (IndexError, ValueError, ProcessLookupError):
        return False
    except OSError:  # exists, owned by someone else
        return True
    return True
