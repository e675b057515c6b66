"""A copy-on-write view of a store for `gc --dry-run`: the run's own steps, nothing changed.

A dry run of gc used to skip what it could not count without doing it -- the
re-encoding of kept commits' tensors that were deltas on pruned ones, and the
compaction of deep chains -- so it reported less than the run removed. Instead,
the dry run runs every step of the real one against `OverlayBlobs` and
`OverlayRefs`: reads fall through to the store, writes (re-encoded chunks,
replacement snapshots, pruned marks, replacement refs, dropped reflogs) stay in
memory, and deletions are refused. What it reports -- objects removed, objects
written, tensors re-encoded -- is then what the run does, by construction (for
the store as it is now: a commit landing in between changes both).

The cost is the run's: the re-encodings are computed (and verified) and held in
memory until the dry run ends.
"""
from __future__ import annotations

import time
from collections.abc import Iterable, Iterator, Sequence

from mvc.errors import InternalError
from mvc.store import (
    ANY,
    BlobStore,
    OnCorrupt,
    RefConflictError,
    ReflogEntry,
    RefUpdate,
    TransactionalRefStore,
    object_id,
)
from mvc.store.base import BytesLike, byte_view, check_ref_name, check_update


class OverlayBlobs(BlobStore):
    """`real`'s objects plus the ones written through this view (kept in memory)."""

    def __init__(self, real: BlobStore) -> None:
        self.real = real
        #: Objects written here that `real` does not hold: id -> content.
        self.written: dict[str, bytes] = {}

    def put(self, data: BytesLike) -> str:
        view = byte_view(data)
        oid = object_id(view)
        if oid not in self.written and not self.real.has(oid):
            self.written[oid] = bytes(view)
        return oid

    def get(self, oid: str) -> bytes:
        data = self.written.get(oid)
        return data if data is not None else self.real.get(oid)

    def has(self, oid: str) -> bool:
        return oid in self.written or self.real.has(oid)

    def size(self, oid: str) -> int:
        data = self.written.get(oid)
        return len(data) if data is not None else self.real.size(oid)

    def iter_ids(self) -> Iterator[str]:
        return iter(sorted(set(self.real.iter_ids()) | set(self.written)))

    def delete(self, oids: Iterable[str]) -> int:
        raise InternalError("a gc dry run tried to delete objects")

    def close(self) -> None:
        pass


class OverlayRefs(TransactionalRefStore):
    """`real`'s refs and reflogs with the moves made through this view applied on top."""

    def __init__(self, real: TransactionalRefStore) -> None:
        self.real = real
        self._refs: dict[str, str | None] = {}  # moved here: the value now (None: deleted)
        self._logs: dict[str, list[ReflogEntry]] = {}  # entries appended here
        self._dropped: set[str] = set()  # reflogs deleted here (with what `real` holds)

    def read_ref(self, name: str) -> str | None:
        check_ref_name(name)
        return self._refs[name] if name in self._refs else self.real.read_ref(name)

    def iter_refs(self, prefix: str = "", *,
                  on_corrupt: OnCorrupt | None = None) -> Iterator[tuple[str, str]]:
        merged = dict(self.real.iter_refs(prefix, on_corrupt=on_corrupt))
        for name, value in self._refs.items():
            if not name.startswith(prefix):
                continue
            if value is None:
                merged.pop(name, None)
            else:
                merged[name] = value
        return iter(sorted(merged.items()))

    def update_refs(self, updates: Sequence[RefUpdate], reason: str) -> None:
        updates = list(updates)
        for u in updates:
            check_update(u)
        now = time.time()
        staged: dict[str, str | None] = {}
        entries: list[tuple[str, ReflogEntry]] = []
        for u in updates:
            current = staged[u.name] if u.name in staged else self.read_ref(u.name)
            if u.old is not ANY and current != u.old:
                raise RefConflictError(u.name, u.old, current)
            staged[u.name] = u.new
            entries.append((u.name, ReflogEntry(current, u.new, now, reason)))
        self._refs.update(staged)
        for name, entry in entries:
            self._logs.setdefault(name, []).append(entry)

    def reflog(self, name: str, *, on_corrupt: OnCorrupt | None = None) -> list[ReflogEntry]:
        check_ref_name(name)
        before = [] if name in self._dropped else self.real.reflog(name, on_corrupt=on_corrupt)
        return before + list(self._logs.get(name, ()))

    def reflog_names(self, *, on_corrupt: OnCorrupt | None = None) -> list[str]:
        names = set(self.real.reflog_names(on_corrupt=on_corrupt)) - self._dropped
        return sorted(names | {n for n, log in self._logs.items() if log})

    def delete_reflog(self, name: str) -> None:
        check_ref_name(name)
        self._dropped.add(name)
        self._logs.pop(name, None)

    def close(self) -> None:
        pass

