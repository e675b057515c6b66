"""The on-disk level cache's files (`.mvc/cache/levels/<snapshot id>.levels`), read and checked
without torch: the prefix and header checks, an entry's blob check, what binds an entry to a
record, the repository id, and fsck's check of every file (`check_level_cache`).

The layout and why each check exists: `mvc.repo.levelcache`, whose `DiskLevelCache` writes
these files and decodes their entries (the part that needs torch).
"""
from __future__ import annotations

import json
import os
import struct
import threading
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import xxhash

from mvc.errors import MvcError
from mvc.repo.objects import Snapshot, TensorRecord
from mvc.store import REPO_ID_KEY, InvalidIdError, StoreMaintenance
from mvc.store.base import check_oid

MAGIC = b"MVCLVL02"
PREFIX = struct.Struct("<8sQ16s")
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


def checksum(data: Any) -> bytes:
    """The xxh3-128 digest the file's header and blobs are checked by."""
    return xxhash.xxh3_128_digest(data)


def checksum_parts(parts: Any) -> bytes:
    """`checksum` of the parts' concatenation, without making it."""
    h = xxhash.xxh3_128()
    for p in parts:
        h.update(p)
    return h.digest()


class LevelFiles:
    """The cache directory's files (`DiskLevelCache` reads and writes them; fsck checks them
    through this alone). `meta`: the store's metadata, which holds the repository id."""

    def __init__(self, directory: Path, meta: StoreMaintenance | None = None) -> None:
        self.dir = Path(directory)
        self.meta = meta

    def path(self, sid: str) -> Path:
        """The file that caches snapshot `sid`."""
        return self.dir / f"{sid}{SUFFIX}"

    def files(self) -> list[Path]:
        """Every cache file now in the directory."""
        try:
            return sorted(self.dir.glob(f"*{SUFFIX}"))
        except OSError:
            return []


def binds(entry: dict[str, Any], rec: TensorRecord) -> bool:
    """Whether a cache entry was made for exactly this record (dtype, shape, payload chunks)."""
    return (entry["dtype"] == rec.dtype and entry["shape"] == list(rec.shape)
            and entry["chunks"] == list(rec.chunks))


class ParseMemo:
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


def read_header(fh: Any, memo: ParseMemo | None = None) -> tuple[dict[str, Any], int, int]:
    """(header, offset of the first blob, file size) of an open cache file; `CorruptEntry`
    unless the prefix, the header digest and every field's type and range check out.
    `memo` skips re-parsing a header whose digest (and blob area size) was seen before."""
    size = os.fstat(fh.fileno()).st_size
    prefix = fh.read(PREFIX.size)
    if len(prefix) != PREFIX.size:
        raise CorruptEntry("truncated prefix")
    magic, n, digest = PREFIX.unpack(prefix)
    if magic != MAGIC:
        raise CorruptEntry("not a level cache file of this version")
    if n > size - PREFIX.size:  # before allocating: a flipped length is no MemoryError
        raise CorruptEntry(f"header length {n} exceeds the file's {size} bytes")
    raw = fh.read(n)
    if len(raw) != n or checksum(raw) != digest:
        raise CorruptEntry("header checksum mismatch")
    start = PREFIX.size + n
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
    if fh.readinto(data) != len(data) or checksum(data).hex() != e["xxh3"]:
        raise CorruptEntry("levels checksum mismatch")
    return data


def discard(path: Path, fh: Any) -> None:
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


def check_level_cache(cache: LevelFiles, read_snapshot: Callable[[str], Snapshot], *,
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
