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
  never read; a later push writes the objects again.

Every read verifies content against the id (`IntegrityError`).  Pack indexes
are loaded once and reloaded when an id is not found in them; the contents of
the last few packs read are kept, so a history walk that reads many small
commits and snapshots downloads each pack once.
"""
from __future__ import annotations

import struct
import threading
from collections import OrderedDict, deque
from collections.abc import Iterable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor

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
from mvc.store.objstore.storage import CorruptRemoteError, ObjectStorage

#: Objects smaller than this go into packs.
PACK_MAX_OBJECT = 1 << 20
#: A pack is closed once it holds this many bytes.
PACK_TARGET = 32 << 20
_IDX_MAGIC = b"MVCIDX1\n"
_ENTRY = struct.Struct("<16sQQ")
_PACK_CACHE = 4


def loose_key(oid: str) -> str:
    """Where the loose object `oid` lives."""
    return f"objects/{oid[:2]}/{oid}"


def encode_index(entries: list[tuple[str, int, int]]) -> bytes:
    """A pack index: (id, offset, length) per object."""
    return _IDX_MAGIC + b"".join(_ENTRY.pack(bytes.fromhex(o), off, n) for o, off, n in entries)


def decode_index(data: bytes, where: str) -> list[tuple[str, int, int]]:
    """The entries of a pack index (`CorruptRemoteError` if it is malformed)."""
    if not data.startswith(_IDX_MAGIC) or (len(data) - len(_IDX_MAGIC)) % _ENTRY.size:
        raise CorruptRemoteError(f"pack index {where} is malformed")
    body = memoryview(data)[len(_IDX_MAGIC):]
    return [(raw.hex(), off, n) for raw, off, n in _ENTRY.iter_unpack(body)]


class RemoteBlobStore(BlobStore):
    """Content-addressed objects on `storage` (loose and packed); safe to share between threads.

    `workers` uploads / downloads run in parallel in `put_many` and `get_many`.
    """

    def __init__(self, storage: ObjectStorage, workers: int = 8) -> None:
        self.storage = storage
        self.workers = workers
        self._lock = threading.Lock()
        self._packed: dict[str, tuple[str, int, int]] = {}
        self._packs_loaded: set[str] = set()
        self._pack_data: OrderedDict[str, bytes] = OrderedDict()
        self._closed = False

    # ------------------------------------------------------------ bookkeeping
    def _check(self) -> None:
        if self._closed:
            raise StoreClosedError("remote blob store is closed")

    def refresh_packs(self) -> None:
        """Load the index of every pack not seen yet."""
        names = [k for k, _ in self.storage.list("packs/") if k.endswith(".idx")]
        for key in names:
            pid = key[len("packs/"):-len(".idx")]
            if pid in self._packs_loaded:
                continue
            got = self.storage.get(key)
            if got is None:
                continue
            entries = decode_index(got.data, key)
            with self._lock:
                for oid, off, n in entries:
                    self._packed.setdefault(oid, (pid, off, n))
                self._packs_loaded.add(pid)

    def _where(self, oid: str, refresh: bool = True) -> tuple[str, int, int] | None:
        with self._lock:
            hit = self._packed.get(oid)
        if hit is None and refresh:
            self.refresh_packs()
            with self._lock:
                hit = self._packed.get(oid)
        return hit

    def _pack_bytes(self, pid: str) -> bytes:
        with self._lock:
            data = self._pack_data.get(pid)
            if data is not None:
                self._pack_data.move_to_end(pid)
                return data
        got = self.storage.get(f"packs/{pid}.pack")
        if got is None:
            raise CorruptRemoteError(f"pack {pid} has an index but no pack")
        with self._lock:
            self._pack_data[pid] = got.data
            while len(self._pack_data) > _PACK_CACHE:
                self._pack_data.popitem(last=False)
        return got.data

    # ------------------------------------------------------------ reads
    def _raw(self, oid: str) -> bytes:
        with self._lock:
            packed = self._packed.get(oid)
        if packed is None:
            got = self.storage.get(loose_key(oid))
            if got is not None:
                return got.data
            packed = self._where(oid)
            if packed is None:
                raise ObjectMissingError(oid)
        pid, off, n = packed
        data = self._pack_bytes(pid)
        if off + n > len(data):
            raise CorruptRemoteError(f"pack {pid} is shorter than its index says")
        return data[off:off + n]

    def get(self, oid: str) -> bytes:
        check_oid(oid)
        self._check()
        data = self._raw(oid)
        actual = object_id(data)
        if actual != oid:
            raise IntegrityError(oid, actual)
        return data

    def get_many(self, oids: Iterable[str]) -> Iterator[tuple[str, bytes]]:
        """(id, verified content) for each of `oids`, in any order: loose objects one request
        each, packed ones one request per pack, `workers` requests in flight (so memory stays
        bounded by about twice that many objects or packs)."""
        self._check()
        todo = [check_oid(o) for o in dict.fromkeys(oids)]
        self.refresh_packs()
        by_pack: dict[str, list[tuple[str, int, int]]] = {}
        jobs: list[str | tuple[str, list[tuple[str, int, int]]]] = []
        with self._lock:
            for oid in todo:
                hit = self._packed.get(oid)
                if hit is None:
                    jobs.append(oid)
                else:
                    by_pack.setdefault(hit[0], []).append((oid, hit[1], hit[2]))
        jobs.extend(by_pack.items())

        def run(job: str | tuple[str, list[tuple[str, int, int]]]) -> list[tuple[str, bytes]]:
            if isinstance(job, str):
                return [(job, self.get(job))]
            pid, members = job
            pack = self._pack_bytes(pid)
            out = []
            for oid, off, n in members:
                data = pack[off:off + n]
                actual = object_id(data)
                if actual != oid:
                    raise IntegrityError(oid, actual)
                out.append((oid, data))
            return out
        with ThreadPoolExecutor(self.workers) as pool:
            pending: deque[Future[list[tuple[str, bytes]]]] = deque()
            for job in jobs:
                pending.append(pool.submit(run, job))
                if len(pending) >= 2 * self.workers:
                    yield from pending.popleft().result()
            while pending:
                yield from pending.popleft().result()

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

    def put_many(self, items: Iterable[BytesLike]) -> list[str]:
        """Store objects: big ones loose, small ones in packs, `workers` uploads in parallel."""
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
            else:
                self._write_pack(job)
        jobs: list[tuple[str, memoryview] | list[tuple[str, memoryview]]] = [*loose, *packs]
        with ThreadPoolExecutor(self.workers) as pool:
            for _ in pool.map(run, jobs):
                pass
        return ids

    def _write_pack(self, objs: list[tuple[str, memoryview]]) -> str:
        entries: list[tuple[str, int, int]] = []
        off = 0
        for oid, mv in objs:
            entries.append((oid, off, mv.nbytes))
            off += mv.nbytes
        body = b"".join(mv for _, mv in objs)
        pid = object_id(body)
        # The pack before its index: an index always names a complete pack.
        self.storage.put(f"packs/{pid}.pack", body)
        self.storage.put(f"packs/{pid}.idx", encode_index(entries))
        with self._lock:
            for oid, o, n in entries:
                self._packed.setdefault(oid, (pid, o, n))
            self._packs_loaded.add(pid)
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
            by_pack: dict[str, set[str]] = {}
            for oid in wanted:
                hit = self._packed.get(oid)
                if hit is not None:
                    by_pack.setdefault(hit[0], set()).add(oid)
        for pid, gone in by_pack.items():
            data = self._pack_bytes(pid)
            with self._lock:
                members = [(o, off, n) for o, (p, off, n) in self._packed.items() if p == pid]
                for o, _, _ in members:
                    del self._packed[o]
            keep = [(o, memoryview(data)[off:off + n]) for o, off, n in members if o not in gone]
            if keep:
                self._write_pack(keep)
            self.storage.delete(f"packs/{pid}.idx")
            self.storage.delete(f"packs/{pid}.pack")
            freed += sum(n for o, _, n in members if o in gone)
            with self._lock:
                self._packs_loaded.discard(pid)
                self._pack_data.pop(pid, None)
        return freed

    def close(self) -> None:
        self._closed = True
        with self._lock:
            self._pack_data.clear()
        self.storage.close()

    def _corrupt_for_test(self, oid: str, byte_index: int) -> None:
        """Flip one byte of a loose object (tests of integrity checking)."""
        got = self.storage.get(loose_key(oid))
        assert got is not None
        data = bytearray(got.data)
        data[byte_index] ^= 0xFF
        self.storage.put(loose_key(oid), bytes(data))
