"""`RemoteBlobStore`: the `BlobStore` contract on object storage, small objects packed.

Layout under the remote's root:

* ``objects/<2 hex>/<id>`` -- a *loose* object (anything of `PACK_MAX_OBJECT`
  bytes or more, and whatever `put` stores one at a time);
* ``packs/<pack id>.pack`` -- small objects concatenated, up to
  `PACK_TARGET` bytes (so a push of a thousand small snapshots and commits is
  a few PUTs, not a thousand);
* ``packs/<pack id>.idx`` -- the pack's index: ``MVCIDX1\\n`` then per object
  its id (16 bytes), offset and length (two little-endian u64).  The index is
  written after its pack, so a pack without an index (a killed upload) is
  never read; a later push writes the objects again;
* ``packs/<upload>/<pack id>.pack`` / ``.idx`` -- the same, written by one push
  (`mvc.store.objstore.presence`: a resumed push finds them without reading every index).

Every read verifies content against the id (`IntegrityError`), in bounded memory: a remote is
untrusted, and its objects can be GBs.  An object is read in ranges of at most `READ_RANGE`
bytes and hashed as they come; one larger than a range is spooled to a temporary file (in
`spool_dir`) and handed out only once all of it hashed to its id -- as bytes, or, from
``get_many(..., views=True)``, as a read-only view of that file mapped into memory.  What an
index declares is checked before anything is downloaded: an entry longer than `PACK_MAX_OBJECT`
or past the end of its pack is `CorruptRemoteError`.  Packs are read per run of adjacent objects
(at most one range), never whole; a single read also brings the objects around the one asked
for (`window`), kept (verified) in a cache of `_CACHE_BYTES`, so a history walk over packed
commits and snapshots makes few requests.  Pack indexes are loaded once and reloaded when an id
is not found in them.
"""
from __future__ import annotations

import bisect
import struct
import threading
from collections import OrderedDict
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Literal, overload

from mvc.store.base import (
    BytesLike,
    IntegrityError,
    ObjectMissingError,
    StoreClosedError,
    byte_view,
    check_oid,
    check_prefix,
    object_id,
)
from mvc.store.contracts import BlobStore
from mvc.store.objstore.storage import READ_RANGE, CorruptRemoteError, ObjectStorage
from mvc.store.objstore.streaming import Budget, hash_ranges, read_verified, run_bounded, verify_bytes

#: Objects smaller than this go into packs.
PACK_MAX_OBJECT = 1 << 20
#: A pack is closed once it holds this many bytes.
PACK_TARGET = 32 << 20
#: What `get_many` holds at once: ranges being downloaded plus verified objects the caller has
#: not taken yet (a spooled object costs one range while it downloads, nothing once mapped).
IN_FLIGHT_BYTES = 64 << 20
_IDX_MAGIC = b"MVCIDX1\n"
_ENTRY = struct.Struct("<16sQQ")
#: A pack index larger than this is refused unread (1.6 million entries; a full pack of
#: commits has tens of thousands).
_IDX_MAX_BYTES = 64 << 20
#: How much of a pack one single read brings in around the object asked for.
_WINDOW = 4 << 20
_WINDOW_OBJECTS = 4096
#: Verified packed objects kept for later single reads (a history walk reads them one by one).
_CACHE_BYTES = 32 << 20
#: Requested packed objects this close to each other share one ranged read.
_GAP = 256 << 10

#: (offset, length, id) of one object in a pack; a pack's are kept sorted by offset.
_Member = tuple[int, int, str]
#: A `get_many` job: one loose object, or a run of objects of one pack read as one range.
_Job = str | tuple[str, list[_Member]]


def loose_key(oid: str) -> str:
    """Where the loose object `oid` lives."""
    return f"objects/{oid[:2]}/{oid}"


#: Where packs live; a pack id may hold a folder (``<upload>/<hash>``: what one push wrote).
_PACKS = "packs/"


def _pack_key(pid: str) -> str:
    return f"{_PACKS}{pid}.pack"


def encode_index(entries: list[tuple[str, int, int]]) -> bytes:
    """A pack index: (id, offset, length) per object."""
    return _IDX_MAGIC + b"".join(_ENTRY.pack(bytes.fromhex(o), off, n) for o, off, n in entries)


def decode_index(data: bytes, where: str) -> list[tuple[str, int, int]]:
    """The entries of a pack index (`CorruptRemoteError` if it is malformed)."""
    if not data.startswith(_IDX_MAGIC) or (len(data) - len(_IDX_MAGIC)) % _ENTRY.size:
        raise CorruptRemoteError(f"pack index {where} is malformed")
    body = memoryview(data)[len(_IDX_MAGIC):]
    return [(raw.hex(), off, n) for raw, off, n in _ENTRY.iter_unpack(body)]


def _spans(members: list[_Member], gap: int = _GAP) -> list[list[_Member]]:
    """`members` (sorted by offset) grouped into runs that one ranged read of at most
    `READ_RANGE` bytes covers (gaps of up to `gap` read and dropped)."""
    spans: list[list[_Member]] = []
    cur: list[_Member] = []
    start = end = 0
    for m in members:
        off, n, _ = m
        if cur and off - end <= gap and max(end, off + n) - start <= READ_RANGE:
            cur.append(m)
            end = max(end, off + n)
            continue
        if cur:
            spans.append(cur)
        cur, start, end = [m], off, off + n
    if cur:
        spans.append(cur)
    return spans


class RemoteBlobStore(BlobStore):
    """Content-addressed objects on `storage` (loose and packed); safe to share between threads.

    `workers` uploads / downloads run in parallel in `put_many` and `get_many`.  Objects
    larger than one read range are spooled to temporary files in `spool_dir` (default: the
    system's temporary directory) while they are verified.  `window` / `gap`: what a read
    brings besides the objects asked for (0 / 0: nothing, `mvc.store.objstore.sparse`)."""
    window, gap = _WINDOW, _GAP

    def __init__(self, storage: ObjectStorage, workers: int = 8, spool_dir: str | None = None) -> None:
        self.storage = storage
        self.workers = workers
        self.spool_dir = spool_dir
        self._lock = threading.Lock()
        self._packed: dict[str, tuple[str, int, int]] = {}
        self._members: dict[str, list[_Member]] = {}
        self._pack_sizes: dict[str, int] = {}
        self._packs_loaded: set[str] = set()
        self._cache: OrderedDict[str, bytes] = OrderedDict()
        self._cache_bytes = 0
        self._closed = False

    # ------------------------------------------------------------ bookkeeping
    def _check(self) -> None:
        if self._closed:
            raise StoreClosedError("remote blob store is closed")

    def refresh_packs(self, under: str = "") -> None:
        """Load the index of every pack not seen yet (`under`: only those in that folder of
        ``packs/``, e.g. one push's, `mvc.store.objstore.presence`)."""
        listing = dict(self.storage.list(_PACKS + under))
        for key, size in listing.items():
            if not key.endswith(".idx"):
                continue
            pid = key[len(_PACKS):-len(".idx")]
            with self._lock:
                if pid in self._packs_loaded:
                    continue
            if size > _IDX_MAX_BYTES:
                raise CorruptRemoteError(f"pack index {key} is too large ({size} bytes)")
            try:
                data = b"".join(self.storage.iter_range(key, 0, size))
            except KeyError:
                continue  # gone since the listing: a delete rewrote its pack
            self._add_pack(pid, decode_index(data, key), listing.get(_pack_key(pid)))

    def pack_ids(self, under: str) -> set[str]:
        """The ids in the packs of folder `under` of ``packs/`` (loaded first: one listing of
        that folder, one read per index not seen yet)."""
        self.refresh_packs(under)
        with self._lock:
            return {o for pid, members in self._members.items() if pid.startswith(under)
                    for _, _, o in members}

    def loaded_ids(self, oids: Iterable[str]) -> set[str]:
        """Those of `oids` in a pack index this store has loaded already (no request)."""
        with self._lock:
            return {o for o in oids if o in self._packed}

    def _add_pack(self, pid: str, entries: list[tuple[str, int, int]], size: int | None) -> None:
        with self._lock:
            for oid, off, n in entries:
                self._packed.setdefault(oid, (pid, off, n))
            self._members[pid] = sorted((off, n, oid) for oid, off, n in entries)
            if size is not None:
                self._pack_sizes[pid] = size
            self._packs_loaded.add(pid)

    def _where(self, oid: str, refresh: bool = True) -> tuple[str, int, int] | None:
        with self._lock:
            hit = self._packed.get(oid)
        if hit is None and refresh:
            self.refresh_packs()
            with self._lock:
                hit = self._packed.get(oid)
        return hit

    def _pack_size(self, pid: str) -> int:
        with self._lock:
            size = self._pack_sizes.get(pid)
        if size is None:
            size = self.storage.head(_pack_key(pid))
            if size is None:
                raise CorruptRemoteError(f"pack {pid} has an index but no pack")
            with self._lock:
                self._pack_sizes[pid] = size
        return size

    def _check_entry(self, oid: str, pid: str, off: int, n: int) -> None:
        """Refuse an index entry no writer makes, before reading any of it."""
        if n > PACK_MAX_OBJECT:
            raise CorruptRemoteError(f"pack {pid}: the index gives object {oid} {n} bytes "
                                     f"(packed objects are under {PACK_MAX_OBJECT})")
        if off + n > self._pack_size(pid):
            raise CorruptRemoteError(f"pack {pid} is shorter than its index says (object {oid})")

    def _read_span(self, pid: str, span: list[_Member]) -> list[bytes]:
        """The unverified bytes of each member of `span` (checked entries), by one ranged read."""
        start = min(off for off, _, _ in span)
        end = max(off + n for off, n, _ in span)
        try:
            data = b"".join(self.storage.iter_range(_pack_key(pid), start, end))
        except KeyError:
            raise CorruptRemoteError(f"pack {pid} has an index but no pack") from None
        if len(data) < end - start:
            raise CorruptRemoteError(f"pack {pid} is shorter than its index says")
        mv = memoryview(data)
        # Copies: a kept object must not pin the whole range.
        return [bytes(mv[off - start:off - start + n]) for off, n, _ in span]

    def _window(self, pid: str, off: int, n: int, oid: str) -> list[_Member]:
        """The object at `off` and its neighbours in the pack, within `_WINDOW` bytes."""
        me = (off, n, oid)
        size = self._pack_size(pid)
        with self._lock:
            members = self._members.get(pid, [])
        i = bisect.bisect_left(members, me)
        if i >= len(members) or members[i] != me:
            return [me]
        lo, hi, start, end = i, i + 1, off, off + n

        def fits(m: _Member) -> bool:
            return (m[1] <= PACK_MAX_OBJECT and m[0] + m[1] <= size
                    and max(end, m[0] + m[1]) - min(start, m[0]) <= self.window)
        grew = True
        while grew and hi - lo < _WINDOW_OBJECTS:
            grew = False
            if hi < len(members) and fits(members[hi]):
                end = max(end, members[hi][0] + members[hi][1])
                hi, grew = hi + 1, True
            if lo > 0 and fits(members[lo - 1]):
                start = min(start, members[lo - 1][0])
                end = max(end, members[lo - 1][0] + members[lo - 1][1])
                lo, grew = lo - 1, True
        return members[lo:hi]

    def _cached(self, oid: str) -> bytes | None:
        with self._lock:
            data = self._cache.get(oid)
            if data is not None:
                self._cache.move_to_end(oid)
            return data

    def _cache_put(self, oid: str, data: bytes) -> None:
        with self._lock:
            if oid in self._cache:
                return
            self._cache[oid] = data
            self._cache_bytes += len(data)
            while self._cache_bytes > _CACHE_BYTES:
                self._cache_bytes -= len(self._cache.popitem(last=False)[1])

    # ------------------------------------------------------------ reads
    def _read_packed(self, oid: str, pid: str, off: int, n: int) -> bytes:
        """One packed object, verified; its neighbours read with it go to the cache."""
        self._check_entry(oid, pid, off, n)
        window = self._window(pid, off, n, oid)
        found: bytes | None = None
        for (o_off, o_n, o), data in zip(window, self._read_span(pid, window)):
            if (o_off, o_n, o) == (off, n, oid):
                found = data
            elif object_id(data) == o:
                self._cache_put(o, data)
        assert found is not None  # `window` always holds the object asked for
        verify_bytes(oid, found)
        self._cache_put(oid, found)
        return found

    def _read_loose(self, oid: str, size: int, views: bool, budget: Budget | None = None) -> BytesLike:
        """The loose object `oid` of declared `size`, verified (`read_verified`)."""
        try:
            return read_verified(self.storage, loose_key(oid), oid, size, views=views,
                                 spool_dir=self.spool_dir, budget=budget)
        except KeyError:
            raise ObjectMissingError(oid) from None

    @overload
    def _read(self, oid: str, views: Literal[False]) -> bytes: ...
    @overload
    def _read(self, oid: str, views: bool) -> BytesLike: ...

    def _read(self, oid: str, views: bool) -> BytesLike:
        with self._lock:
            packed = self._packed.get(oid)
        if packed is None:
            size = self.storage.head(loose_key(oid))
            if size is not None:
                return self._read_loose(oid, size, views)
            packed = self._where(oid)
            if packed is None:
                raise ObjectMissingError(oid)
        cached = self._cached(oid)
        return cached if cached is not None else self._read_packed(oid, *packed)

    def get(self, oid: str) -> bytes:
        check_oid(oid)
        self._check()
        return self._read(oid, False)

    def verify(self, oid: str) -> None:
        """Check one object against its id, hashing it range by range (nothing kept)."""
        check_oid(oid)
        self._check()
        size = self.storage.head(loose_key(oid))
        if size is None:
            self.get(oid)
            return
        try:
            actual = hash_ranges(self.storage, loose_key(oid), size)
        except KeyError:
            raise ObjectMissingError(oid) from None
        if actual != oid:
            raise IntegrityError(oid, actual)

    @overload
    def get_many(self, oids: Iterable[str], views: Literal[False] = False) -> Iterator[tuple[str, bytes]]: ...
    @overload
    def get_many(self, oids: Iterable[str], views: bool) -> Iterator[tuple[str, BytesLike]]: ...

    def get_many(self, oids: Iterable[str], views: bool = False) -> Iterator[tuple[str, BytesLike]]:
        """(id, verified content) for each of `oids`, in any order: loose objects one at a
        time, packed ones by runs of adjacent objects, `workers` reads in parallel, and at
        most `IN_FLIGHT_BYTES` downloading or waiting for the caller (objects larger than a
        range are spooled to disk while they are verified).  `views`: such a spooled object
        comes as a read-only memoryview of its mapped spool file instead of bytes read back."""
        self._check()
        todo = [check_oid(o) for o in dict.fromkeys(oids)]
        self.refresh_packs()
        jobs: list[_Job] = []
        ready: list[tuple[str, bytes]] = []
        by_pack: dict[str, list[_Member]] = {}
        for oid in todo:
            with self._lock:
                hit = self._packed.get(oid)
            if hit is None:
                jobs.append(oid)
                continue
            cached = self._cached(oid)
            if cached is not None:
                ready.append((oid, cached))
                continue
            pid, off, n = hit
            self._check_entry(oid, pid, off, n)
            by_pack.setdefault(pid, []).append((off, n, oid))
        for pid, members in by_pack.items():
            jobs.extend((pid, span) for span in _spans(sorted(members), self.gap))
        yield from ready
        del ready
        yield from run_bounded(jobs, lambda job, budget: self._job(job, budget, views),
                               self.workers, IN_FLIGHT_BYTES)

    def _job(self, job: _Job, budget: Budget, views: bool) -> tuple[list[tuple[str, BytesLike]], int]:
        if isinstance(job, str):
            return self._loose_job(job, views, budget)
        pid, span = job
        weight = budget.take(max(off + n for off, n, _ in span) - min(off for off, _, _ in span))
        try:
            out: list[tuple[str, BytesLike]] = []
            for (_, _, oid), data in zip(span, self._read_span(pid, span)):
                verify_bytes(oid, data)
                out.append((oid, data))
        except BaseException:
            budget.give(weight)
            raise
        return out, weight

    def _loose_job(self, oid: str, views: bool, budget: Budget) -> tuple[list[tuple[str, BytesLike]], int]:
        size = self.storage.head(loose_key(oid))
        if size is None:
            packed = self._where(oid)
            if packed is None:
                raise ObjectMissingError(oid)
            weight = budget.take(packed[2])
            try:
                return [(oid, self._read_packed(oid, *packed))], weight
            except BaseException:
                budget.give(weight)
                raise
        # A spooled object holds one range while it downloads; read back as bytes, all of it.
        weight = budget.take(READ_RANGE if views and size > READ_RANGE else size)
        try:
            data = self._read_loose(oid, size, views, budget)
        except BaseException:
            budget.give(weight)
            raise
        if isinstance(data, memoryview):
            budget.give(weight)
            weight = 0
        return [(oid, data)], weight

    def has(self, oid: str) -> bool:
        check_oid(oid)
        self._check()
        if self._where(oid, refresh=False) is not None:
            return True
        return self.storage.head(loose_key(oid)) is not None or self._where(oid) is not None

    def size(self, oid: str) -> int:
        check_oid(oid)
        self._check()
        n = self.storage.head(loose_key(oid))
        if n is not None:
            return n
        packed = self._where(oid)
        if packed is None:
            raise ObjectMissingError(oid)
        return packed[2]

    def iter_ids(self) -> Iterator[str]:
        self._check()
        return iter(sorted(self.known_ids()))

    def known_ids(self) -> set[str]:
        """Every id stored (one listing of loose objects and the pack indexes)."""
        self._check()
        ids = {k.rsplit("/", 1)[1] for k, _ in self.storage.list("objects/")}
        self.refresh_packs()
        with self._lock:
            ids.update(self._packed)
        return ids

    def ids_with_prefix(self, prefix: str) -> list[str]:
        check_prefix(prefix)
        return [o for o in self.iter_ids() if o.startswith(prefix)]

    # ------------------------------------------------------------ writes
    def put(self, data: BytesLike) -> str:
        self._check()
        mv = byte_view(data)
        oid = object_id(mv)
        self.storage.put(loose_key(oid), mv)
        return oid

    def put_many(self, items: Iterable[BytesLike], *,
                 on_stored: Callable[[int, int], object] | None = None,
                 upload: str | None = None) -> list[str]:
        """Store objects: big ones loose, small ones in packs, `workers` uploads in parallel.

        `on_stored(nbytes, objects)` is called (from the upload threads) as each upload
        completes: a progress bar moves with the bytes, not once per call.  `upload`: the
        packs go in that folder of ``packs/`` (a push's, `mvc.store.objstore.presence`),
        where a resumed push finds them without reading every pack index."""
        self._check()
        ids: list[str] = []
        seen: set[str] = set()
        loose: list[tuple[str, memoryview]] = []
        packs: list[list[tuple[str, memoryview]]] = []
        pack: list[tuple[str, memoryview]] = []
        pack_bytes = 0
        for data in items:
            mv = byte_view(data)
            oid = object_id(mv)
            ids.append(oid)
            if oid in seen:
                continue
            seen.add(oid)
            if mv.nbytes >= PACK_MAX_OBJECT:
                loose.append((oid, mv))
                continue
            pack.append((oid, mv))
            pack_bytes += mv.nbytes
            if pack_bytes >= PACK_TARGET:
                packs.append(pack)
                pack, pack_bytes = [], 0
        if len(pack) == 1:
            loose.append(pack[0])
        elif pack:
            packs.append(pack)

        def run(job: tuple[str, memoryview] | list[tuple[str, memoryview]]) -> None:
            if isinstance(job, tuple):
                self.storage.put(loose_key(job[0]), job[1])
                done = [job]
            else:
                self._write_pack(job, upload)
                done = job
            if on_stored is not None:
                on_stored(sum(mv.nbytes for _, mv in done), len(done))
        jobs: list[tuple[str, memoryview] | list[tuple[str, memoryview]]] = [*loose, *packs]
        with ThreadPoolExecutor(self.workers) as pool:
            for _ in pool.map(run, jobs):
                pass
        return ids

    def _write_pack(self, objs: list[tuple[str, memoryview]], folder: str | None = None) -> str:
        entries: list[tuple[str, int, int]] = []
        off = 0
        for oid, mv in objs:
            entries.append((oid, off, mv.nbytes))
            off += mv.nbytes
        body = b"".join(mv for _, mv in objs)
        pid = object_id(body) if folder is None else f"{folder}/{object_id(body)}"
        # The pack before its index: an index always names a complete pack.
        self.storage.put(_pack_key(pid), body)
        self.storage.put(f"{_PACKS}{pid}.idx", encode_index(entries))
        self._add_pack(pid, entries, len(body))
        return pid

    def delete(self, oids: Iterable[str]) -> int:
        """Remove objects: loose ones directly, packed ones by rewriting their packs without
        them (the new pack is complete before the old one goes)."""
        self._check()
        wanted = {check_oid(o) for o in oids}
        if not wanted:
            return 0
        freed = 0
        for oid in sorted(wanted):
            n = self.storage.head(loose_key(oid))
            if n is not None:
                self.storage.delete(loose_key(oid))
                freed += n
        self.refresh_packs()
        with self._lock:
            for oid in wanted:
                if oid in self._cache:
                    self._cache_bytes -= len(self._cache.pop(oid))
            by_pack: dict[str, set[str]] = {}
            for oid in wanted:
                hit = self._packed.get(oid)
                if hit is not None:
                    by_pack.setdefault(hit[0], set()).add(oid)
        for pid, gone in by_pack.items():
            with self._lock:
                members = sorted((off, n, o) for o, (p, off, n) in self._packed.items() if p == pid)
            kept = [m for m in members if m[2] not in gone]
            for off, n, o in kept:
                self._check_entry(o, pid, off, n)
            keep: list[tuple[str, memoryview]] = []
            for span in _spans(kept):
                keep.extend((o, memoryview(data)) for (_, _, o), data in zip(span, self._read_span(pid, span)))
            with self._lock:
                for _, _, o in members:
                    del self._packed[o]
            if keep:
                self._write_pack(keep)
            self.storage.delete(f"{_PACKS}{pid}.idx")
            self.storage.delete(_pack_key(pid))
            freed += sum(n for _, n, o in members if o in gone)
            with self._lock:
                self._packs_loaded.discard(pid)
                self._members.pop(pid, None)
                self._pack_sizes.pop(pid, None)
        return freed

    def close(self) -> None:
        self._closed = True
        with self._lock:
            self._cache.clear()
            self._cache_bytes = 0
        self.storage.close()
