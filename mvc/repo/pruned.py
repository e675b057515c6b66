"""Pruned commits: history kept, checkpoint dropped by a retention policy (`mvc gc --keep-last`).

A commit id is a content hash, so pruning cannot rewrite the commit: it stays,
with its parents, message, step, metrics and quality record, and a mark
``refs/pruned/<commit id>`` (valued with that id) says its snapshot is no longer
kept.  The reachability walk (`ObjectDB.reachable`) does not enter a marked
commit's snapshot, so gc frees it (unless a kept commit names the same
snapshot); `log` shows the commit as pruned and checking it out is a
`CommitPrunedError`.  Marks are never removed: a pruned checkpoint cannot come
back.
"""
from __future__ import annotations

from collections.abc import Iterable

from mvc.errors import UsageError
from mvc.store import RefStore, RefUpdate, TransactionalRefStore

PRUNED = "refs/pruned/"


class CommitPrunedError(UsageError):
    """The commit's checkpoint was dropped by a retention policy (`gc --keep-last/--keep-every`);
    its history and metadata remain."""

    exit_code = 170


def pruned_ids(refs: RefStore) -> set[str]:
    """Every commit marked pruned."""
    return {name[len(PRUNED):] for name, _ in refs.iter_refs(PRUNED)}


def is_pruned(refs: RefStore, cid: str) -> bool:
    return refs.read_ref(PRUNED + cid) is not None


def check_not_pruned(refs: RefStore, cid: str) -> None:
    """`CommitPrunedError` when commit `cid` is marked pruned."""
    if is_pruned(refs, cid):
        raise CommitPrunedError(
            f"commit {cid[:12]} was pruned by a retention policy (gc --keep-last/--keep-every): "
            "its history and metadata remain, its checkpoint is no longer stored")


def mark_pruned(refs: TransactionalRefStore, cids: Iterable[str], reason: str) -> None:
    """Mark `cids` pruned, all in one ref transaction (a crash marks all or none)."""
    updates = [RefUpdate(PRUNED + cid, None, cid) for cid in sorted(set(cids))]
    if updates:
        refs.update_refs(updates, reason)
