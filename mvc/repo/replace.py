"""gc's snapshot replacements: ``refs/replace/<original snapshot id>`` -> a re-encoding.

Commit ids are content hashes, so gc publishes a compacted snapshot as a ref
instead of rewriting the commit (see `compact.py`).  The rule, enforced on
every read and checked by fsck: a replacement names an existing snapshot that
is itself not replaced, so following is exactly one step.  gc only ever writes
one level (`publish_replacement`); a chain (A -> B -> C) or a loop (A -> B -> A)
is damage, and reading through one is a `ReplacementError` naming the refs,
never a hang.  `follow_replacement` is the one place that follows them.
"""
from __future__ import annotations

import re
from itertools import pairwise
from typing import TYPE_CHECKING, Any

from mvc.errors import DataError, MvcError
from mvc.repo.objects import object_kind
from mvc.store import ANY, RefUpdate

if TYPE_CHECKING:
    from mvc.repo.repository import Repo
    from mvc.store import ObjectStore
    from mvc.store.base import OnCorrupt

REPLACE = "refs/replace/"
# Only to name a chain or loop in the error message: following itself is one step.
_DESCRIBE_STEPS = 8
_OID = re.compile(r"[0-9a-f]{32}")


class ReplacementError(DataError):
    """A `refs/replace/` entry breaks the one-level rule (a chain or a loop) or names no snapshot."""

    exit_code = 92


def _describe(store: "ObjectStore", sid: str) -> str:
    """'refs/replace/A -> B, refs/replace/B -> C (a chain)' or '... (a loop)': every ref
    involved, bounded."""
    path = [sid]
    kind = "a chain"
    while len(path) <= _DESCRIBE_STEPS:
        nxt = store.read_ref(REPLACE + path[-1])
        if nxt is None or not _OID.fullmatch(nxt):
            break
        path.append(nxt)
        if nxt in path[:-1]:
            kind = "a loop"
            break
    else:
        kind = "a chain, and more"
    return ", ".join(f"{REPLACE}{a} -> {b}" for a, b in pairwise(path)) + f" ({kind})"


def follow_replacement(store: "ObjectStore", sid: str) -> str:
    """The snapshot actually read for snapshot `sid`: its replacement if gc wrote one, else `sid`.

    Raises `ReplacementError` when the replacement is not an object id or is
    itself replaced (a chain or a loop): one lookup more than the common case,
    and never an unbounded walk.
    """
    target = store.read_ref(REPLACE + sid)
    if target is None:
        return sid
    if not _OID.fullmatch(target):
        raise ReplacementError(f"ref {REPLACE}{sid} names {target!r}, not a snapshot id")
    if target == sid or store.read_ref(REPLACE + target) is not None:
        raise ReplacementError(
            f"replacements {_describe(store, sid)}: a replacement must name a snapshot that is "
            "not itself replaced")
    return target


def publish_replacement(store: "ObjectStore", sid: str, new_sid: str, reason: str) -> None:
    """Make `new_sid` the replacement of snapshot `sid`, keeping every replacement one level deep.

    `new_sid` restores exactly like `sid`.  If `new_sid` is itself replaced, its
    replacement (which restores the same) is named instead, and replacements
    that named `sid` move to the new target, since `sid` is now replaced.  One
    transaction; the caller holds the write lock (gc).
    """
    target = follow_replacement(store, new_sid)
    if target == sid:  # `sid` already restores as itself: drop a replacement it may have
        if store.read_ref(REPLACE + sid) is not None:
            store.update_refs([RefUpdate(REPLACE + sid, ANY, None)], reason)
        return
    updates = [RefUpdate(name, value, target) for name, value in store.iter_refs(REPLACE)
               if value == sid]
    updates.append(RefUpdate(REPLACE + sid, ANY, target))
    store.update_refs(updates, reason)


def check_replacements(repo: "Repo", present: set[str], named: set[str],
                       on_corrupt: "OnCorrupt") -> list[str]:
    """fsck's view of every replacement: the problems found, one line each.

    `present`: every stored object id; `named`: the snapshot ids reachable
    commits name.  Reported: a replacement that is not an object id, missing,
    not a snapshot, part of a chain or loop, a delta chain that loops back
    through it, and one whose original is not a snapshot the store holds.
    An original that exists but no reachable commit names is not damage: the
    next gc drops its replacement with it.
    """
    store = repo.store
    problems: list[str] = []
    for name, value in store.iter_refs(REPLACE, on_corrupt=on_corrupt):
        orig = name[len(REPLACE):]
        if not _OID.fullmatch(orig):
            problems.append(f"ref {name}: does not name a snapshot id")
            continue
        if not _OID.fullmatch(value):
            problems.append(f"ref {name}: replacement {value!r} is not a snapshot id")
            continue
        target_ok = False
        if value not in present:
            problems.append(f"ref {name}: replacement snapshot {value} is missing")
        else:
            kind = _kind(store, value)
            if kind not in (None, "snapshot"):
                problems.append(f"ref {name}: replacement {value} is a {kind}, not a snapshot")
            target_ok = kind == "snapshot"
        if orig not in present:
            why = "a commit names it" if orig in named else "no commit names it"
            problems.append(f"ref {name}: replaces snapshot {orig}, which is missing ({why})")
        else:
            kind = _kind(store, orig)
            if kind not in (None, "snapshot"):
                problems.append(f"ref {name}: replaces {orig}, which is a {kind}, not a snapshot")
        try:
            follow_replacement(store, orig)
        except MvcError as exc:
            problems.append(str(exc))
            continue
        if target_ok:
            problems.extend(_delta_loops(repo, orig))
    return problems


def _kind(store: "ObjectStore", oid: str) -> str | None:
    """'commit', 'snapshot' or 'chunk'; None when unreadable (fsck reports that object itself)."""
    try:
        return object_kind(store.get(oid))
    except MvcError:
        return None


def _delta_loops(repo: "Repo", sid: str) -> list[str]:
    """Delta chains that come back to (snapshot `sid`, tensor): only a bogus replacement of
    `sid` can close such a loop (content ids keep committed chains acyclic)."""
    from mvc.repo.lossy import parent_ref

    problems: list[str] = []
    memo: dict[str, Any] = {}

    def snapshot(s: str) -> Any:
        if s not in memo:
            memo[s] = repo.read_snapshot(s)
        return memo[s]

    try:
        names = [rec.name for rec in snapshot(sid).tensors]
    except MvcError:
        return []  # unreadable: reported by the commit walk
    for name in names:
        seen: set[tuple[str, str]] = set()
        node: tuple[str, str] | None = (sid, name)
        try:
            while node is not None and node not in seen:
                seen.add(node)
                rec = next((r for r in snapshot(node[0]).tensors if r.name == node[1]), None)
                node = parent_ref(rec) if rec is not None else None
        except MvcError:
            continue  # a broken chain: reported by the delta-parent check
        if node is not None:
            problems.append(f"ref {REPLACE}{sid}: tensor {name!r}: its delta chain loops back "
                            f"to snapshot {node[0]}")
    return problems
