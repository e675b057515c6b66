"""`RemoteRefStore`: the `RefStore` contract on object storage, by conditional writes.

Each ref is one object, ``refs/<name, percent-encoded>``, holding JSON
``{"value": ..., "log": [[old, new, time, reason], ...]}``: its value and its
whole reflog, so a move and its log entry are one write.  A move reads the
object with its etag, checks the expected value, and writes the new record
with ``If-Match: <etag>`` (``If-None-Match: *`` when there is no object yet).
When another writer got in between, the write fails and the move starts over
from a fresh read: the expected value is checked again, so of two racing
moves from the same value exactly one succeeds and the other raises
`RefConflictError`.  A deleted ref keeps its object (value null) so that its
reflog survives, as in the local stores.

The names are encoded into one path component so that ``refs/heads/a`` and
``refs/heads/a/b`` can both exist on a directory remote.
"""
from __future__ import annotations

import json
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any
from urllib.parse import quote, unquote

from mvc.store.base import (
    ANY,
    CorruptRefError,
    CorruptReflogError,
    OnCorrupt,
    RefConflictError,
    RefExpect,
    ReflogEntry,
    RefUpdate,
    StoreClosedError,
    check_ref_name,
    check_ref_value,
    check_update,
)
from mvc.store.contracts import RefStore
from mvc.store.objstore.storage import CREATE, ObjectStorage, PreconditionFailed, Stored

_PREFIX = "refs/"
#: A move that keeps losing races to other writers gives up (they are making progress).
_MAX_ATTEMPTS = 64


def ref_key(name: str) -> str:
    """The key of ref `name`'s object."""
    return _PREFIX + quote(name, safe="")


class RemoteRefStore(RefStore):
    """Refs on `storage`, one object per ref, moved by compare-and-swap."""

    def __init__(self, storage: ObjectStorage) -> None:
        self.storage = storage
        self._closed = False

    def _check(self) -> None:
        if self._closed:
            raise StoreClosedError("remote ref store is closed")

    def _record(self, name: str, got: Stored | None) -> dict[str, Any]:
        if got is None:
            return {"value": None, "log": []}
        try:
            rec = json.loads(got.data)
            if not isinstance(rec, dict) or not isinstance(rec.get("log"), list):
                raise ValueError("not a ref record")
            value = rec.get("value")
            if value is not None:
                check_ref_value(value)
        except Exception as exc:  # noqa: BLE001 - any decoding failure is a corrupt record
            raise CorruptRefError(name, f"{type(exc).__name__}: {exc}") from None
        return rec

    def read_ref(self, name: str) -> str | None:
        check_ref_name(name)
        self._check()
        value = self._record(name, self.storage.get(ref_key(name)))["value"]
        return value if isinstance(value, str) else None

    def _names(self) -> list[str]:
        return sorted(unquote(k[len(_PREFIX):]) for k, _ in self.storage.list(_PREFIX))

    def iter_refs(self, prefix: str = "", *,
                  on_corrupt: OnCorrupt | None = None) -> Iterator[tuple[str, str]]:
        self._check()
        names = [n for n in self._names() if n.startswith(prefix)]
        # One GET per ref, several at a time: a remote may hold many refs/replace/ entries.
        with ThreadPoolExecutor(8) as pool:
            got = list(pool.map(lambda n: self.storage.get(ref_key(n)), names))
        out: list[tuple[str, str]] = []
        for name, stored in zip(names, got):
            try:
                value = self._record(name, stored)["value"]
            except CorruptRefError as exc:
                if on_corrupt is None:
                    raise
                on_corrupt(exc)
                continue
            if value is not None:
                out.append((name, value))
        return iter(out)

    def update_ref(self, name: str, old: RefExpect, new: str | None, reason: str) -> None:
        check_update(RefUpdate(name, old, new))
        self._check()
        key = ref_key(name)
        for _ in range(_MAX_ATTEMPTS):
            got = self.storage.get(key)
            rec = self._record(name, got)
            current = rec["value"]
            if old is not ANY and current != old:
                raise RefConflictError(name, old, current)
            rec = {"value": new, "log": [*rec["log"], [current, new, time.time(), reason]]}
            body = json.dumps(rec, separators=(",", ":")).encode()
            try:
                self.storage.put(key, body, CREATE if got is None else got.etag)
                return
            except PreconditionFailed:
                # A write whose answer was lost and was retried fails its own condition:
                # finding exactly what it wrote means it took effect.
                now = self.storage.get(key)
                if now is not None and now.data == body:
                    return
        raise RefConflictError(name, old, self.read_ref(name))

    def reflog(self, name: str, *, on_corrupt: OnCorrupt | None = None) -> list[ReflogEntry]:
        check_ref_name(name)
        self._check()
        try:
            rec = self._record(name, self.storage.get(ref_key(name)))
        except CorruptRefError as exc:
            err = CorruptReflogError(name, exc.detail)
            if on_corrupt is None:
                raise err from None
            on_corrupt(err)
            return []
        out: list[ReflogEntry] = []
        for i, e in enumerate(rec["log"]):
            try:
                o, n, t, r = e
                out.append(ReflogEntry(o, n, float(t), str(r)))
            except (TypeError, ValueError) as exc:
                err = CorruptReflogError(name, str(exc), i)
                if on_corrupt is None:
                    raise err from None
                on_corrupt(err)
        return out

    def reflog_names(self, *, on_corrupt: OnCorrupt | None = None) -> list[str]:
        self._check()
        out = []
        for name in self._names():
            try:
                if self._record(name, self.storage.get(ref_key(name)))["log"]:
                    out.append(name)
            except CorruptRefError as exc:
                if on_corrupt is None:
                    raise CorruptReflogError(name, exc.detail) from None
                on_corrupt(CorruptReflogError(name, exc.detail))
        return out

    def delete_reflog(self, name: str) -> None:
        check_ref_name(name)
        self._check()
        key = ref_key(name)
        for _ in range(_MAX_ATTEMPTS):
            got = self.storage.get(key)
            if got is None:
                return
            rec = self._record(name, got)
            if not rec["log"]:
                return
            body = json.dumps({"value": rec["value"], "log": []}, separators=(",", ":")).encode()
            try:
                self.storage.put(key, body, got.etag)
                return
            except PreconditionFailed:
                continue
        raise RefConflictError(name, ANY, self.read_ref(name))

    def close(self) -> None:
        self._closed = True
