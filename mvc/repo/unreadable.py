"""History this version cannot decode: what gc keeps unread and fsck warns about.

An intact object -- its bytes verify against its id -- that the reader refuses
(`MalformedObjectError`: past a limit, a field this version does not know) is
not damage like a missing or corrupt one: it can be named, kept and moved away
from.  An older mvc published such commits (its writer accepted what its reader
refuses).  Once no ref reaches one -- the branch moved off it, only reflog
entries name it -- gc keeps it, with every object its bytes name, and goes on;
fsck warns about it instead of failing.  Anything a ref reaches must be readable:
there it still stops gc.  The way out is told in docs/cli.md, 'Unreadable commits'.
"""
from __future__ import annotations

from mvc.errors import DataError
from mvc.repo.objectdb import Damage, ObjectDB
from mvc.repo.objects import MalformedObjectError, ids_named, object_kind
from mvc.repo.replace import OID, REPLACE
from mvc.store import ObjectMissingError

#: Where the way out of an unreadable commit is told (gc's and fsck's messages point there).
UNREADABLE_HELP = "docs/cli.md, 'Unreadable commits'"


def is_intact(d: Damage) -> bool:
    """Whether `d` is a commit or snapshot whose bytes verify against its id but which this
    version's reader refuses: intact, just unreadable here."""
    return d.kind in ("commit", "snapshot") and isinstance(d.error, MalformedObjectError)


def split_damage(odb: ObjectDB, damage: list[Damage]) -> tuple[list[Damage], list[Damage]]:
    """(unread, damage): what a walk of all history (refs and reflogs) could not read, split.

    Unread: intact objects (`is_intact`) that no ref reaches, only reflog entries.  Damage:
    the rest -- missing or corrupt objects, and anything a ref reaches."""
    live: set[str] = set()
    if any(is_intact(d) for d in damage):
        for _ in odb.reachable(odb.root_ids(reflogs=False), on_damage=lambda d: live.add(d.oid)):
            pass
    unread = [d for d in damage if is_intact(d) and d.oid not in live]
    return unread, [d for d in damage if not (is_intact(d) and d.oid not in live)]


def salvage(odb: ObjectDB, oids: list[str], keep: set[str]) -> tuple[set[str], str | None]:
    """(ids, problem): `oids` and every stored object their bytes name, transitively
    (`ids_named`, a superset of what they refer to), with the replacements of the snapshots
    among them, less `keep` (a closed set: what a walk reached).  What gc keeps for objects
    it cannot decode, so that nothing they may need is deleted.  `problem` says why that
    cannot be known (an object among them is corrupt, or its text does not inflate)."""
    out: set[str] = set()
    work = list(oids)
    while work:
        oid = work.pop()
        if oid in keep or oid in out:
            continue
        try:
            data = odb.blobs.get(oid)
        except ObjectMissingError:
            continue  # named but not stored (or no id at all, just hex in a string)
        except DataError as exc:
            return out, f"{oid}, named by an object this version cannot read: {exc}"
        named = ids_named(data)
        if named is None:
            return out, f"what object {oid} names cannot be read (it does not inflate)"
        out.add(oid)
        work.extend(named)
        if object_kind(data) == "snapshot":
            replacement = odb.refs.read_ref(REPLACE + oid)
            if replacement is not None and OID.fullmatch(replacement):
                work.append(replacement)
    return out, None
