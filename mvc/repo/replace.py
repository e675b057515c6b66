"""gc's snapshot replacements: ``refs/replace/<original snapshot id>`` -> a re-encoding.

Commit ids are content hashes, so gc publishes a compacted snapshot as a ref
instead of rewriting the commit (see `compact.py`).  The rule, enforced on
every read and checked by fsck: a replacement names an existing snapshot that
is itself not replaced, so following is exactly one step.  gc only ever writes
one level (`publish_replacement`); a chain (A -> B -> C) or a loop (A -> B -> A)
is damage, and reading through one is a `ReplacementError` naming the refs,
never a hang.  `follow_replacement` is the one place that follows them; fsck
checks every replacement (`mvc.repo.fsck`).
"""
from __future__ import annotations

import re
from itertools import pairwise

from mvc.errors import DataError
from mvc.store import ANY, RefStore, RefUpdate, TransactionalRefStore

REPLACE = "refs/replace/"
# Only to name a chain or loop in the error message: following itself is one step.
_DESCRIBE_STEPS = 8
OID = re.compile(r"[0-9a-f]{32}")


class ReplacementError(DataError):
    """A `refs/replace/` entry breaks the one-level rule (a chain or a loop) or names no snapshot."""

    exit_code = 92


def _describe(store: RefStore, sid: str) -> str:
    """'refs/replace/A -> B, refs/replace/B -> C (a chain)' or '... (a loop)': every ref
    involved, bounded."""
    path = [sid]
    kind = "a chain"
    while len(path) <= _DESCRIBE_STEPS:
        nxt = store.read_ref(REPLACE + path[-1])
        if nxt is None or not OID.fullmatch(nxt):
            break
        path.append(nxt)
        if nxt in path[:-1]:
            kind = "a loop"
            break
    else:
        kind = "a chain, and more"
    return ", ".join(f"{REPLACE}{a} -> {b}" for a, b in pairwise(path)) + f" ({kind})"


def follow_replacement(store: RefStore, sid: str) -> str:
    """The snapshot actually read for snapshot `sid`: its replacement if gc wrote one, else `sid`.

    Raises `ReplacementError` when the replacement is not an object id or is
    itself replaced (a chain or a loop): one lookup more than the common case,
    and never an unbounded walk.
    """
    target = store.read_ref(REPLACE + sid)
    if target is None:
        return sid
    if not OID.fullmatch(target):
        raise ReplacementError(f"ref {REPLACE}{sid} names {target!r}, not a snapshot id")
    if target == sid or store.read_ref(REPLACE + target) is not None:
        raise ReplacementError(
            f"replacements {_describe(store, sid)}: a replacement must name a snapshot that is "
            "not itself replaced")
    return target


def publish_replacement(store: TransactionalRefStore, sid: str, new_sid: str, reason: str) -> None:
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
