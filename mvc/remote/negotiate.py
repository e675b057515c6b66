"""What a push may take the remote to hold, from this repository alone (no request).

The remote's branch and tag values this repository knows are on the remote with their whole
history (objects go before the ref that reaches them).  `remote_history` finds which of the
commits a push's walk will meet are in that history, walking both sides newest first, as
git's negotiation does, and stopping as soon as every commit still queued is one the remote
holds: the cost is the commits since the two sides forked, not the history.  A push of one
commit on top of the remote's branch reads two commits.

`known_chunks` then names the chunks of the snapshots the new commits sit on (their parents'),
so that the walk does not even ask the remote about a tensor that did not change.
"""
from __future__ import annotations

import heapq
from collections.abc import Collection
from dataclasses import dataclass, field
from datetime import datetime

from mvc.errors import DataError
from mvc.repo.objectdb import ObjectDB
from mvc.repo.objects import Commit
from mvc.repo.pruned import PRUNED
from mvc.repo.replace import REPLACE
from mvc.store import RefStore
from mvc.store.base import ObjectMissingError

_NEW, _HAVE = 1, 2


@dataclass
class History:
    """`have`: commits met that the remote holds; `boundary`: those of them that are a parent
    of a commit it lacks (what the new commits are built on)."""

    have: set[str] = field(default_factory=set)
    boundary: set[str] = field(default_factory=set)


def _when(c: Commit) -> float:
    try:
        return datetime.fromisoformat(c.time).timestamp()
    except ValueError:
        return 0.0


def remote_history(odb: ObjectDB, heads: Collection[str], tips: Collection[str]) -> History:
    """Which commits met walking back from `tips` (and from `heads`, the remote's values known
    here) are in the history of `heads`.  A commit wrongly left out (clocks out of order) is
    only walked and checked again by the push, never taken as held when it is not: a commit
    is marked held only when reached from a head."""
    flags: dict[str, int] = {}
    commits: dict[str, Commit] = {}
    heap: list[tuple[float, str]] = []
    queued: set[str] = set()
    new_only = 0  # queued commits that only the tips reach: the walk ends when there are none

    def mark(cid: str, flag: int) -> None:
        nonlocal new_only
        old = flags.get(cid, 0)
        if old | flag == old:
            return
        if cid not in commits:
            try:
                commits[cid] = odb.read_commit(cid)
            except (DataError, ObjectMissingError):
                return  # not here (or unreadable): the push's own walk reports it
        flags[cid] = old | flag
        if cid in queued:
            if old == _NEW:
                new_only -= 1
            return
        queued.add(cid)
        heapq.heappush(heap, (-_when(commits[cid]), cid))
        if flags[cid] == _NEW:
            new_only += 1

    for h in sorted(set(heads)):
        mark(h, _HAVE)
    for t in sorted(set(tips)):
        mark(t, _NEW)
    new: set[str] = set()
    while heap and new_only:
        _, cid = heapq.heappop(heap)
        queued.discard(cid)
        f = flags[cid]
        if f == _NEW:
            new_only -= 1
            new.add(cid)
        for p in commits[cid].parents:
            mark(p, f)
    out = History(have={c for c, f in flags.items() if f & _HAVE})
    out.boundary = {p for c in new if flags[c] == _NEW for p in commits[c].parents if p in out.have}
    return out


def known_chunks(odb: ObjectDB, remote_refs: RefStore, boundary: Collection[str]) -> set[str]:
    """The snapshots of the `boundary` commits and their chunks, where the remote surely holds
    them: the commit not pruned there (its snapshot stays behind) and its snapshot replaced
    neither here nor there (the original's chunks need not have travelled).  Two small reads
    on the remote per commit."""
    out: set[str] = set()
    for cid in sorted(boundary):
        try:
            sid = odb.read_commit(cid).snapshot
            if odb.resolve_snapshot_id(sid) != sid or odb.refs.read_ref(PRUNED + cid) is not None:
                continue
            if remote_refs.read_ref(PRUNED + cid) is not None or remote_refs.read_ref(REPLACE + sid) is not None:
                continue
            snap = odb.read_snapshot(sid)
        except (DataError, ObjectMissingError):
            continue
        out.add(sid)
        out.update(c for rec in snap.tensors for c in rec.chunks)
    return out
