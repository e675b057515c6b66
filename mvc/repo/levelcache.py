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
import threading
from collections import OrderedDict
from pathlib import Path
from typing import Any, Callable

import torch

from mvc.codecs.base import Encoded
from mvc.codecs.quantized import decode_base
from mvc.errors import MvcError
from mvc.quant import QuantizedTensor
# The file format and its checks need no torch (fsck uses them alone): `mvc.repo.levelfile`,
# re-exported here where callers have always found them.
from mvc.repo.levelfile import MAGIC as MAGIC
from mvc.repo.levelfile import (PREFIX, LevelFiles, ParseMemo, checksum, checksum_parts, discard, read_blob,
                                 read_header)
from mvc.repo.levelfile import SUFFIX as SUFFIX
from mvc.repo.levelfile import CorruptEntry as CorruptEntry
from mvc.repo.levelfile import binds as binds
from mvc.repo.levelfile import cache_bytes as cache_bytes
from mvc.repo.levelfile import check_level_cache as check_level_cache
from mvc.repo.levelfile import repository_id as repository_id
from mvc.repo.lossy import on_host
from mvc.repo.objects import Snapshot, TensorRecord
from mvc.repo.tensors import dtype_name, parse_dtype
from mvc.store import BlobStore, StoreMaintenance

#: What a commit leaves in the disk cache: tensor name -> (base encoding, dtype, shape).
BaseEntries = dict[str, tuple[Encoded, torch.dtype, tuple[int, ...]]]


class LevelCache:
    """Recently materialized quantized tensors, keyed by (snapshot id, tensor name), in memory.

    Keeps a live training process from re-walking delta chains on every
    commit, and makes consecutive checkouts cheap. Bounded by level bytes.
    Entries live in host memory whatever device a commit quantized on (`put` copies them
    there): what reads them (the next commit's comparison and delta, the chain walker, a
    checkout) works on the host, and a hit must come back on the same device as a miss.
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
        """Cache `q` (a host copy of it, when it is on another device) under `key`, dropping
        the least recently used beyond `max_bytes`."""
        q = on_host(q)  # outside the lock: a device-to-host copy may take a while
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

    def drop_snapshot(self, snapshot_id: str) -> None:
        """Forget every tensor cached for `snapshot_id`."""
        self._drop(lambda sid: sid == snapshot_id)

    def retain(self, snapshot_id: str) -> None:
        """Forget every tensor cached for any snapshot but `snapshot_id`."""
        self._drop(lambda sid: sid != snapshot_id)

    def _drop(self, which: Callable[[str], bool]) -> None:
        with self._lock:
            for key in [k for k in self._items if which(k[0])]:
                self._bytes -= self._size(self._items.pop(key))

    def __len__(self) -> int:
        """How many tensors are cached."""
        with self._lock:
            return len(self._items)

    def clear(self) -> None:
        """Forget everything."""
        with self._lock:
            self._items.clear()
            self._bytes = 0


class DiskLevelCache(LevelFiles):
    """Base encodings of the newest snapshots' quantized tensors, one file per snapshot.

    `blobs` holds the snapshots whose records entries are bound to; `meta` (the
    store's metadata) supplies the repository id. Without them nothing is cached.
    Thread-safe; any failure to read is a miss.
    """

    def __init__(self, directory: Path, keep: int = 4, *, blobs: BlobStore | None = None,
                 meta: StoreMaintenance | None = None) -> None:
        super().__init__(directory, meta)
        self.keep = keep
        self.blobs = blobs
        self._rid: str | None = None
        self._rid_lock = threading.Lock()
        self._parsed = ParseMemo(max(keep, 1) * 2)

    def repository_id(self) -> str | None:
        """The id entries are bound to (None: no store, or no id can be kept; cache unused)."""
        if self._rid is None and self.meta is not None:
            with self._rid_lock:
                if self._rid is None:
                    self._rid = repository_id(self.meta)
        return self._rid

    # ------------------------------------------------------------------ write
    def save(self, sid: str, entries: BaseEntries) -> None:
        """Cache the base encodings `entries` (name -> (encoding, dtype, shape)) of snapshot `sid`,
        which must already be stored; then keep only the newest `keep` files."""
        rid = self.repository_id()
        if not entries or rid is None or self.blobs is None:
            return
        records = {r.name: r for r in Snapshot.decode(self.blobs.get(sid), sid).tensors}
        index: dict[str, Any] = {}
        blobs: list[memoryview] = []
        off = 0
        for name, (enc, dtype, shape) in entries.items():
            rec = records.get(name)
            if rec is None or rec.dtype != dtype_name(dtype) or list(rec.shape) != list(shape):
                continue  # not what the snapshot stores under this name: nothing to bind to
            # views of the encoding's parts, written as they are: a commit's base encodings are
            # all in memory at this point, and a joined copy of each would double them
            parts = [memoryview(p).cast("B") for p in enc.parts]
            length = sum(len(p) for p in parts)
            index[name] = {"dtype": rec.dtype, "shape": list(rec.shape), "chunks": list(rec.chunks),
                           "meta": enc.meta, "offset": off, "length": length,
                           "xxh3": checksum_parts(parts).hex()}
            blobs.extend(parts)
            off += length
        if not index:
            return
        header = json.dumps({"repo": rid, "snapshot": sid, "tensors": index},
                            sort_keys=True, separators=(",", ":")).encode()
        self.dir.mkdir(parents=True, exist_ok=True)
        tmp = self.dir / f".{sid}.{os.getpid()}.{threading.get_ident()}.tmp"
        try:
            with open(tmp, "wb") as fh:
                fh.write(PREFIX.pack(MAGIC, len(header), checksum(header)))
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
            discard(path, fh)
            return None

    def _header(self, fh: Any) -> tuple[dict[str, Any], int, int]:
        """`read_header`, with the parsed header memoized by its digest: a checkout reads one
        file once per tensor, and the digest is still checked on every read."""
        return read_header(fh, self._parsed)
