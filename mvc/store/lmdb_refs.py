"""The ref part of the LMDB store: the ``refs`` and ``reflog`` databases.

Refs are keyed by name; reflog entries by ``name NUL seq(8 bytes big-endian)``
so one ref's entries are contiguous and ordered.  A batch of compare-and-swaps
and their reflog entries is one write transaction (`update_refs`).

Every record is decoded and validated here, so a flipped byte in the ref or
reflog database surfaces as one typed error naming the ref, never as a
UnicodeDecodeError, a JSONDecodeError or a KeyError further up.
"""
from __future__ import annotations

import json
import time
from collections.abc import Iterator, Sequence
from typing import Any

from mvc.store.base import (
    ANY,
    CorruptRefError,
    CorruptReflogError,
    InvalidRefError,
    OnCorrupt,
    RefConflictError,
    ReflogEntry,
    RefUpdate,
    check_ref_name,
    check_ref_value,
    check_update,
)
from mvc.store.contracts import TransactionalRefStore
from mvc.store.lmdb_env import LmdbConnection


# ------------------------------------------------------------------ records
def reflog_key(name_b: bytes, seq: int) -> bytes:
    """The reflog key of entry `seq` of the ref whose encoded name is `name_b`."""
    return name_b + b"\x00" + seq.to_bytes(8, "big")


def _shown(raw: bytes, limit: int = 80) -> str:
    """A key or value as printable text: undecodable bytes and control characters escaped."""
    text = bytes(raw[:limit]).decode("utf-8", "backslashreplace")
    text = "".join(c if c.isprintable() else c.encode("unicode_escape").decode("ascii")
                   for c in text)
    return text + ("..." if len(raw) > limit else "")


def decode_ref_name(key: bytes) -> str:
    """A stored ref name, validated (`CorruptRefError` otherwise)."""
    try:
        return check_ref_name(bytes(key).decode("utf-8"))
    except (UnicodeDecodeError, InvalidRefError):
        raise CorruptRefError(_shown(key), "the name is not a valid ref name") from None


def decode_ref_value(name: str, raw: bytes) -> str:
    """The stored value of ref `name`, validated (`CorruptRefError` otherwise)."""
    try:
        return check_ref_value(bytes(raw).decode("utf-8"))
    except (UnicodeDecodeError, InvalidRefError):
        raise CorruptRefError(
            name, f"value {_shown(raw)!r} is not an object id or 'ref: <name>'") from None


def encode_reflog_entry(old: str | None, new: str | None, when: float, reason: str) -> bytes:
    """The stored form of one reflog entry (compact JSON)."""
    return json.dumps({"old": old, "new": new, "time": when, "reason": reason},
                      separators=(",", ":")).encode("utf-8")


def decode_reflog_entry(name: str, seq: int, raw: bytes) -> ReflogEntry:
    """Entry `seq` of the reflog of `name`, validated (`CorruptReflogError` otherwise)."""
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


def _deliver(errors: Sequence[CorruptRefError], on_corrupt: OnCorrupt | None) -> None:
    """Hand every error to `on_corrupt`, or raise the first when there is none."""
    if errors and on_corrupt is None:
        raise errors[0]
    for exc in errors:
        on_corrupt(exc)  # type: ignore[misc]


def _next_seq(txn: Any, reflog: Any, name_b: bytes, name: str) -> int:
    """The sequence number of the next reflog entry of `name` (0 for its first)."""
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


def _reflog_records(txn: Any, reflog: Any, name_b: bytes) -> list[tuple[bytes, bytes]]:
    """Every reflog record under `name_b`, corrupt keys of the wrong length included."""
    cur = txn.cursor(db=reflog)
    start = name_b + b"\x00"
    out = []
    if cur.set_range(start):
        for k, v in cur.iternext():
            k = bytes(k)  # write txns hand out memoryviews
            if not k.startswith(start):
                break
            out.append((k, bytes(v)))
    return out


class LmdbRefStore(TransactionalRefStore):
    """Refs and their reflog in an LMDB store; a batch of moves is one transaction."""

    def __init__(self, conn: LmdbConnection) -> None:
        self._conn = conn

    def close(self) -> None:
        """Close the store this part belongs to (its parts share one connection)."""
        self._conn.close()

    def read_ref(self, name: str) -> str | None:
        """Raw value of ref `name`, or None (CorruptRefError if the stored value is unreadable)."""
        key = check_ref_name(name).encode("utf-8")
        h = self._conn.handle()
        raw = h.read(lambda txn: txn.get(key, db=h.dbs["refs"]))
        return None if raw is None else decode_ref_value(name, raw)

    def iter_refs(self, prefix: str = "", *,
                  on_corrupt: OnCorrupt | None = None) -> Iterator[tuple[str, str]]:
        """(name, value) of refs whose name starts with `prefix`, sorted by name."""
        p = prefix.encode("utf-8")
        h = self._conn.handle()

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
                name = decode_ref_name(k)
                out.append((name, decode_ref_value(name, v)))
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
        h = self._conn.handle()

        def fn(txn: Any) -> None:
            refs, reflog = h.dbs["refs"], h.dbs["reflog"]
            for u in updates:
                key = u.name.encode("utf-8")
                raw = txn.get(key, db=refs)
                current = None if raw is None else decode_ref_value(u.name, raw)
                if u.old is not ANY and current != u.old:
                    raise RefConflictError(u.name, u.old, current)
                if u.new is None:
                    if raw is not None:
                        txn.delete(key, db=refs)
                else:
                    txn.put(key, u.new.encode("utf-8"), db=refs)
                txn.put(reflog_key(key, _next_seq(txn, reflog, key, u.name)),
                        encode_reflog_entry(current, u.new, now, reason), db=reflog)
        h.write(fn)

    def reflog(self, name: str, *, on_corrupt: OnCorrupt | None = None) -> list[ReflogEntry]:
        """Every recorded move of `name`, oldest first."""
        key = check_ref_name(name).encode("utf-8")
        h = self._conn.handle()
        rows = h.read(lambda txn: _reflog_records(txn, h.dbs["reflog"], key))
        out: list[ReflogEntry] = []
        errors: list[CorruptRefError] = []
        for k, v in rows:
            tail = k[len(key) + 1:]
            if len(tail) != 8:
                errors.append(CorruptReflogError(name, f"malformed key {_shown(k)!r}"))
                continue
            try:
                out.append(decode_reflog_entry(name, int.from_bytes(tail, "big"), v))
            except CorruptRefError as exc:
                errors.append(exc)
        _deliver(errors, on_corrupt)
        return out

    def reflog_names(self, *, on_corrupt: OnCorrupt | None = None) -> list[str]:
        """Sorted names that have reflog entries (skips from one name to the next)."""
        h = self._conn.handle()

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
                names.append(decode_ref_name(raw))
            except CorruptRefError as exc:
                if not isinstance(exc, CorruptReflogError):
                    exc = CorruptReflogError(exc.name, "the name is not a valid ref name")
                errors.append(exc)
        _deliver(errors, on_corrupt)
        return names

    def delete_reflog(self, name: str) -> None:
        """Forget the reflog of `name`."""
        key = check_ref_name(name).encode("utf-8")
        h = self._conn.handle()

        def fn(txn: Any) -> None:
            reflog = h.dbs["reflog"]
            for k, _ in _reflog_records(txn, reflog, key):
                txn.delete(k, db=reflog)
        h.write(fn)
