"""Is a snapshot replacement honest?  Restore both and compare bits.

A replacement (`mvc.repo.replace`) changes which bytes are read for a snapshot
that a commit names, so it must restore exactly what the original restores.
gc checks its own re-encodings as it writes them (`mvc.repo.compact`); this
module checks one that came from elsewhere (a fetch) or whose origin is not
known, before it is honoured, and fsck uses it on replacements a fetch of an
older mvc adopted without checking.

Which replacements this repository has checked is told by their reflog: gc's
own are written with a "gc..." reason, a fetch's checked ones end in
`VERIFIED`; a replacement adopted by a fetch without that suffix is
*unverified*: gc keeps its original's objects (`mvc.repo.gc`) and fsck checks it.
"""
from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

from mvc.errors import DataError
from mvc.repo.objectdb import ObjectDB
from mvc.repo.objects import Snapshot, TensorRecord
from mvc.repo.replace import REPLACE
from mvc.store import RefStore, RefUpdate, TransactionalRefStore

if TYPE_CHECKING:
    # Only restoring both sides needs torch: which replacements are unverified, and whether
    # an original is whole, are read from refs and snapshots (fsck, fetch and push import
    # this module without loading it).
    import torch

#: The suffix of a fetch's reflog reason for a replacement it restored and compared.
VERIFIED = "(verified)"
#: Tensors restored from each side at a time while comparing (plus their Adam partners).
_BATCH_BYTES = 256 << 20


def unverified_replacements(refs: RefStore) -> dict[str, str]:
    """Original snapshot id -> replacement for every replacement a fetch adopted without
    restoring and comparing it (by the reflog's last reason; no reflog: gc's own, kept
    before reflogs were written for them)."""
    out: dict[str, str] = {}
    for name, value in refs.iter_refs(REPLACE):
        log = refs.reflog(name)
        reason = log[-1].reason if log else ""
        if reason.startswith("fetch") and not reason.endswith(VERIFIED):
            out[name[len(REPLACE):]] = value
    return out


def replacement_differs(odb: ObjectDB, sid: str, new_sid: str) -> str | None:
    """None when snapshot `new_sid` restores the same skeleton and every tensor
    bit-identically to snapshot `sid` read as itself; else why not, in one line.

    Both are read from `odb` (their delta parents through the replacements its refs
    hold), with fresh level caches: levels cached under `sid` may have been decoded
    through the very replacement being checked.  Tensors are restored in batches of
    about 256 MiB a side, each with the second moment that bounds it.
    """
    try:
        old = Snapshot.decode(odb.blobs.get(sid), sid)
        new = Snapshot.decode(odb.blobs.get(new_sid), new_sid)
    except DataError as exc:
        return f"cannot be read ({exc})"
    if old.skeleton != new.skeleton:
        return "its non-tensor state differs"
    old_recs = {r.name: r for r in old.tensors}
    new_recs = {r.name: r for r in new.tensors}
    if list(old_recs) != list(new_recs):
        return "it names other tensors"
    for name, rec in old_recs.items():
        other = new_recs[name]
        if (rec.dtype, list(rec.shape)) != (other.dtype, list(other.shape)):
            return f"tensor {name!r} has another dtype or shape"
    from mvc.repo.reader import TensorReader

    reader = TensorReader(odb)
    compared: set[str] = set()
    try:
        for group in _groups(old.tensors, old_recs):
            before = reader.read_all(sid, [old_recs[n] for n in group])
            after = reader.read_all(new_sid, [new_recs[n] for n in group])
            for n in group:
                if n not in compared and not same_bits(before[n], after[n]):
                    return f"tensor {n!r} restores differently"
                compared.add(n)
    except DataError as exc:
        return f"cannot be restored ({exc})"
    return None


def _groups(records: list[TensorRecord], by_name: dict[str, TensorRecord]) -> Iterator[list[str]]:
    """Names to restore together: consecutive records of about `_BATCH_BYTES`, each with the
    second moment its restore is bounded by (which may then be read in two groups)."""
    group: list[str] = []
    size = 0
    for rec in records:
        for n in (rec.name, moment_partner(rec)):
            if n is not None and n in by_name and n not in group:
                group.append(n)
                size += by_name[n].raw_bytes
        if size >= _BATCH_BYTES:
            yield group
            group, size = [], 0
    if group:
        yield group


def moment_partner(rec: TensorRecord) -> str | None:
    """The second moment that bounds a first moment on restore (None for other records)."""
    moment = rec.meta.get("moment")
    partner = moment.get("partner") if isinstance(moment, dict) else None
    return partner if isinstance(partner, str) else None


def same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Same dtype, shape and bytes (NaN payloads and signed zeros included)."""
    import torch

    def bits(t: torch.Tensor) -> torch.Tensor:
        return t.detach().contiguous().reshape(-1).view(torch.uint8)

    return a.dtype == b.dtype and a.shape == b.shape and torch.equal(bits(a), bits(b))


def original_is_whole(odb: ObjectDB, sid: str) -> bool:
    """Whether snapshot `sid` and every payload chunk of its own records are stored here
    (what checking a replacement of it needs besides its delta parents)."""
    try:
        snap = Snapshot.decode(odb.blobs.get(sid), sid)
    except DataError:
        return False
    return all(odb.blobs.has(c) for rec in snap.tensors for c in rec.chunks)


def settle_unverified(odb: ObjectDB, refs: TransactionalRefStore) -> list[str]:
    """Check every unverified replacement whose original is still whole here: one that
    restores identically is marked verified, one that does not is dropped (the original
    is read again).  Returns a line per replacement dropped.  Those whose original is
    gone stay unverified: they are the only copy of that checkpoint here."""
    dropped: list[str] = []
    for sid, target in sorted(unverified_replacements(refs).items()):
        if not original_is_whole(odb, sid):
            continue
        name = REPLACE + sid
        why = replacement_differs(odb, sid, target)
        if why is None:
            refs.update_refs([RefUpdate(name, target, target)], f"gc: checked {VERIFIED}")
        else:
            refs.update_refs([RefUpdate(name, target, None)],
                             f"gc: dropped an unverified replacement: {why}")
            dropped.append(f"dropped {name} (adopted by a fetch): the replacement {why}; "
                           f"snapshot {sid} is read as itself again")
    return dropped
