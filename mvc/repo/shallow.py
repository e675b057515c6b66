"""Shallow history: commits whose parents this repository does not hold (`mvc clone --depth N`,
`mvc fetch REMOTE REV`), as git's ``.git/shallow`` records them.

A shallow fetch brings a few commits and every object their snapshots need -- delta parents
included, so each commit held restores exactly -- but not the commits before them.  Each commit
at that boundary carries a mark ``refs/shallow/<commit id>`` (valued with that id).  A marked
commit reads as having no parents (`ObjectDB.read_commit` grafts it, as git does), so every walk
of history -- log, gc, fsck, push's negotiation, retention -- stops there instead of taking the
missing parents for damage; `mvc log` shows the commit as ``grafted``.  A revision that steps
past the boundary (``HEAD~5`` of a depth-1 clone) is a `BeyondShallowError`.

Marks are written before the commits they mark (a fetch killed between the two leaves a mark on
a commit not stored yet, which marks nothing: gc drops it, the next fetch settles it) and are
removed once a fetch has stored the commit's parents (`mvc fetch --unshallow`, or a plain
`mvc fetch`); `settle` is that rule.
"""
from __future__ import annotations

from collections.abc import Callable, Iterable

from mvc.errors import UsageError
from mvc.store import RefStore

SHALLOW = "refs/shallow/"


class BeyondShallowError(UsageError):
    """A revision this shallow repository cannot reach: its history stops at a commit whose
    parents were not fetched (`mvc fetch --unshallow` brings them)."""

    exit_code = 180


def shallow_ids(refs: RefStore) -> set[str]:
    """Every commit marked as a shallow boundary (its parents not held)."""
    return {name[len(SHALLOW):] for name, _ in refs.iter_refs(SHALLOW)}


def is_shallow(refs: RefStore, cid: str) -> bool:
    """Whether commit `cid` is a shallow boundary (one ref lookup)."""
    return refs.read_ref(SHALLOW + cid) is not None


def beyond(cid: str, what: str) -> BeyondShallowError:
    """The error for `what` (a revision) reaching past shallow boundary commit `cid`."""
    return BeyondShallowError(
        f"{what}: this repository is shallow and its history stops at {cid[:12]} (the "
        "commits before it were not fetched); `mvc fetch --unshallow` brings them")


def mark(refs: RefStore, cids: Iterable[str], reason: str) -> None:
    """Mark `cids` as shallow boundaries (each one ref; one already marked is left alone)."""
    for cid in sorted(set(cids)):
        if refs.read_ref(SHALLOW + cid) is None:
            refs.update_ref(SHALLOW + cid, None, cid, reason)


def unmark(refs: RefStore, cids: Iterable[str], reason: str) -> None:
    """Remove the marks of `cids` with their reflogs (a mark is bookkeeping, not history)."""
    for cid in sorted(set(cids)):
        value = refs.read_ref(SHALLOW + cid)
        if value is not None:
            refs.update_ref(SHALLOW + cid, value, None, reason)
        refs.delete_reflog(SHALLOW + cid)


def settle(refs: RefStore, commits: Iterable[tuple[str, list[str]]], has: Callable[[str], bool],
           reason: str) -> tuple[set[str], set[str]]:
    """Mark or unmark `commits` ((id, parents) of commits held here) by the rule: a commit is
    a boundary exactly when one of its parents is not held.  Returns (marked, unmarked).

    Sound because of the order of every fetch: a parent is stored only once its own history
    is (or it is marked itself), so a held parent is always a complete one."""
    boundary: set[str] = set()
    complete: set[str] = set()
    for cid, parents in commits:
        (boundary if any(not has(p) for p in parents) else complete).add(cid)
    was = shallow_ids(refs)
    unmark(refs, complete & was, reason)
    mark(refs, boundary - was, reason)
    return boundary - was, complete & was


def drop_stale(refs: RefStore, keep: Callable[[str], bool], reason: str) -> list[str]:
    """Remove the marks of commits `keep` rejects (gc: commits it deletes, or never stored)."""
    stale = [cid for cid in shallow_ids(refs) if not keep(cid)]
    unmark(refs, stale, reason)
    return stale
