"""The object database: commits and snapshots over a blob store and a ref store, and the one
commit-graph walker every service uses.

`ObjectDB` reads commits and snapshots (following gc's replacement of a
snapshot, `mvc.repo.replace`), tells commits from other objects, names the
roots of history (every ref and every reflog entry) and walks history:

* `walk_commits` -- the commits reachable from some roots, in any order, parents
  first (`"topo"`: gc's compaction) or newest first (`"date"`: log);
* `reachable` -- every object reachable from some roots: commits, the snapshots
  they name (and the replacements gc wrote for them), the snapshots delta
  records are encoded against, and payload chunks.  gc keeps what it yields,
  fsck checks it, and a push sends it.

Both take `have`: objects the caller does not want, *with everything they
reach* -- what the other side of a push already holds (git's rule: a side that
has a commit has its whole history, because objects are always stored before
what refers to them).  The walk does not enter them.  And both take
`on_damage`: without it an unreadable object raises; with it the walk reports
the object (`Damage`) and goes on without it, which is how gc learns that it
must not delete anything and how fsck lists every problem.

This module is the only one that walks the commit graph.
"""
from __future__ import annotations

import heapq
from collections.abc import Callable, Collection, Iterable, Iterator
from dataclasses import dataclass
from datetime import datetime
from typing import Literal

from mvc.errors import DataError
from mvc.repo import refs as R
from mvc.repo.objects import Commit, MalformedObjectError, Snapshot, object_kind
from mvc.repo.pruned import PRUNED, pruned_ids
# A delta's parent is read from its record, without torch (stats, fsck, push and fetch walk
# snapshots with it).
from mvc.repo.records import parent_ref
from mvc.repo.replace import REPLACE, ReplacementError, follow_replacement
from mvc.repo.shallow import SHALLOW, is_shallow, shallow_ids
from mvc.store import BlobStore, ObjectMissingError, OnCorrupt, RefStore

#: Largest object `is_commit` reads to look at its header: commits are small, and a
#: revision lookup must not load a multi-GB chunk to learn it is none.
_MAX_COMMIT_BYTES = 1 << 20

#: What `have` may be: a set-like of ids, or a predicate on an id.
Have = Collection[str] | Callable[[str], bool] | None
Order = Literal["any", "topo", "date"]
Kind = Literal["commit", "snapshot", "chunk"]


@dataclass(frozen=True)
class Reached:
    """One object `ObjectDB.reachable` found.

    `obj` is the decoded `Commit`, or the `Snapshot` as read (for a replaced
    snapshot that is its replacement's content, yielded under the replacement's
    id), or None (a chunk; a replaced original snapshot, which is kept but not
    read).  `via` names what led to it: the child commit of a parent, the commit
    of its snapshot, the original of a replacement, the snapshot whose delta
    record is encoded against it, the snapshot naming a chunk.
    """

    oid: str
    kind: Kind
    obj: Commit | Snapshot | None = None
    via: str | None = None
    #: For a replacement snapshot: the original snapshot id it stands in for.
    replaces: str | None = None


@dataclass(frozen=True)
class Damage:
    """An object the walk could not read: what it was reached as, from where, and why."""

    oid: str
    #: "commit", "snapshot" (named by a commit, or a delta's parent) or "record" (a tensor
    #: record whose delta parent cannot even be named).
    kind: str
    via: str | None
    error: DataError
    #: How the walk reached it, for the message ("parent of", "snapshot of", ...).
    role: str = ""

    def __str__(self) -> str:
        if self.kind == "commit":
            if self.via is not None and isinstance(self.error, ObjectMissingError):
                return f"commit {self.via}: parent {self.oid} is missing"
            return f"commit {self.oid}: {self.error}"
        if self.kind == "snapshot" and self.role == "delta":
            return f"snapshot {self.via}: delta parent snapshot {self.oid}: {self.error}"
        if self.kind == "snapshot":
            return f"commit {self.via}: snapshot {self.oid}: {self.error}"
        return f"snapshot {self.via}: {self.error}"


OnDamage = Callable[[Damage], None]


def _predicate(have: Have) -> Callable[[str], bool]:
    if have is None:
        return lambda _oid: False
    if callable(have):
        return have
    return have.__contains__


def _neg_time(c: Commit) -> float:
    try:
        return -datetime.fromisoformat(c.time).timestamp()
    except ValueError:
        return 0.0


class ObjectDB:
    """Commits and snapshots over `blobs` (content-addressed objects) and `refs` (refs, reflog).

    Every read verifies the object against its id (the blob store does), and
    decodes it with every field checked (`mvc.repo.objects`).
    """

    def __init__(self, blobs: BlobStore, refs: RefStore) -> None:
        self.blobs = blobs
        self.refs = refs

    # ------------------------------------------------------------------ objects
    def read_commit(self, oid: str, *, shallow: Collection[str] | None = None,
                    graft: bool = True) -> Commit:
        """The commit `oid` (MalformedObjectError if it is another kind of object).

        A shallow boundary (`mvc.repo.shallow`) reads with no parents, as git grafts it, so
        that no walk goes where this repository holds nothing; `graft=False` reads the
        parents it names.  `shallow`: the boundary set, when the caller read it already."""
        data = self.blobs.get(oid)
        kind = object_kind(data)
        if kind != "commit":
            raise MalformedObjectError(f"{oid}: referenced as a commit but is a {kind}")
        commit = Commit.decode(data, oid)
        if graft and commit.parents and (
                oid in shallow if shallow is not None else is_shallow(self.refs, oid)):
            commit.parents = []
        return commit

    def shallow_ids(self) -> set[str]:
        """The shallow boundary: commits held here without their parents (`mvc.repo.shallow`)."""
        return shallow_ids(self.refs)

    def resolve_snapshot_id(self, oid: str) -> str:
        """The snapshot actually read for `oid`: gc may have replaced it by an identical
        re-encoding. One step, by the one-level rule of `mvc.repo.replace`."""
        return follow_replacement(self.refs, oid)

    def read_snapshot(self, oid: str) -> Snapshot:
        """The snapshot a commit names, following gc's replacement of it, if any."""
        real = self.resolve_snapshot_id(oid)
        return self._read_snapshot_as(oid, real)

    def _read_snapshot_as(self, oid: str, real: str) -> Snapshot:
        data = self.blobs.get(real)
        if real != oid and object_kind(data) != "snapshot":
            raise ReplacementError(f"ref {REPLACE}{oid} names {real}, which is a "
                                   f"{object_kind(data)}, not a snapshot")
        return Snapshot.decode(data, real)

    def is_commit(self, oid: str) -> bool:
        """Whether `oid` is a stored commit. A missing object (removed by a concurrent gc) is
        none; a corrupt one raises its integrity error, never reading as 'no commit'."""
        try:
            if self.blobs.size(oid) > _MAX_COMMIT_BYTES:
                return False
            return self.blobs.get(oid).startswith(b"mvc-commit ")
        except ObjectMissingError:
            return False

    # ------------------------------------------------------------------ roots
    def root_ids(self, on_corrupt: OnCorrupt | None = None,
                 ignore_reflogs: Collection[str] = (), *, reflogs: bool = True) -> set[str]:
        """Every commit id a ref or a reflog entry names: what history is, for gc and fsck.

        `refs/replace/` is not history (it names snapshots), nor `refs/pruned/` and
        `refs/shallow/` (marks on commits history reaches anyway), nor the reflogs named in `ignore_reflogs` (those gc
        expires); `reflogs=False`: what refs alone name. An unreadable ref or
        reflog record raises (gc must not guess), unless `on_corrupt` takes it
        (fsck reports it and goes on).
        """
        roots: set[str] = set()
        for name, value in self.refs.iter_refs("", on_corrupt=on_corrupt):
            if value and not R.is_symbolic(value) and not name.startswith((REPLACE, PRUNED, SHALLOW)):
                roots.add(value)
        if not reflogs:
            return roots
        for name in self.refs.reflog_names(on_corrupt=on_corrupt):
            if name.startswith((REPLACE, PRUNED, SHALLOW)) or name in ignore_reflogs:
                continue
            for entry in self.refs.reflog(name, on_corrupt=on_corrupt):
                for v in (entry.old, entry.new):
                    if v and not R.is_symbolic(v):
                        roots.add(v)
        return roots

    # ------------------------------------------------------------------ the walker
    def _load(self, cid: str, via: str | None, on_damage: OnDamage | None,
              shallow: Collection[str] = ()) -> Commit | None:
        try:
            return self.read_commit(cid, shallow=shallow)
        except DataError as exc:
            if on_damage is None:
                raise
            on_damage(Damage(cid, "commit", via, exc, "parent" if via else "root"))
            return None

    def walk_commits(self, roots: Iterable[str], *, order: Order = "any", have: Have = None,
                     on_damage: OnDamage | None = None, depth: int | None = None) -> Iterator[Commit]:
        """Every commit reachable from `roots` (commit ids) through parents, each once.

        `order`: "any" (cheapest), "topo" (every commit after all its parents) or
        "date" (newest first by commit time, ties by id; a commit is read when its
        child is yielded, so taking the first n reads about n commits).
        `have`: commits not wanted, with their history (not entered).
        `on_damage`: see the module doc; an unreadable commit is skipped with its
        history behind it.  A shallow boundary's parents are not walked (`read_commit`).
        `depth` (with order "any"): only the commits fewer than `depth` parent steps from a
        root (a shallow fetch's `--depth`), nearest first.
        """
        had = _predicate(have)
        shallow = self.shallow_ids()
        if depth is not None:
            if order != "any":
                raise ValueError("a walk limited by depth is in order 'any'")
            yield from self._walk_depth(roots, had, on_damage, shallow, depth)
        elif order == "date":
            yield from self._walk_by_date(roots, had, on_damage, shallow)
        elif order == "topo":
            yield from self._walk_topo(roots, had, on_damage, shallow)
        elif order == "any":
            yield from self._walk_any(roots, had, on_damage, shallow)
        else:
            raise ValueError(f"unknown order {order!r}")

    def _walk_depth(self, roots: Iterable[str], had: Callable[[str], bool],
                    on_damage: OnDamage | None, shallow: Collection[str],
                    depth: int) -> Iterator[Commit]:
        # Breadth first, so a commit is counted at its nearest distance from a root.
        seen: set[str] = set()
        level: list[tuple[str, str | None]] = [(r, None) for r in sorted(set(roots))]
        for _ in range(depth):
            nxt: list[tuple[str, str | None]] = []
            for cid, via in level:
                if cid in seen or had(cid):
                    continue
                seen.add(cid)
                commit = self._load(cid, via, on_damage, shallow)
                if commit is None:
                    continue
                yield commit
                nxt.extend((p, cid) for p in commit.parents if p not in seen)
            level = nxt

    def _walk_any(self, roots: Iterable[str], had: Callable[[str], bool],
                  on_damage: OnDamage | None, shallow: Collection[str]) -> Iterator[Commit]:
        seen: set[str] = set()
        stack: list[tuple[str, str | None]] = [(r, None) for r in sorted(set(roots))]
        while stack:
            cid, via = stack.pop()
            if cid in seen or had(cid):
                continue
            seen.add(cid)
            commit = self._load(cid, via, on_damage, shallow)
            if commit is None:
                continue
            yield commit
            stack.extend((p, cid) for p in reversed(commit.parents) if p not in seen)

    def _walk_topo(self, roots: Iterable[str], had: Callable[[str], bool],
                   on_damage: OnDamage | None, shallow: Collection[str]) -> Iterator[Commit]:
        # Depth-first, emitting a commit once every parent is out: an explicit stack, since
        # histories are far deeper than Python's recursion limit.
        seen: set[str] = set()
        for root in sorted(set(roots)):
            if root in seen or had(root):
                continue
            seen.add(root)
            first = self._load(root, None, on_damage, shallow)
            if first is None:
                continue
            stack: list[tuple[Commit, int]] = [(first, 0)]
            while stack:
                commit, i = stack.pop()
                if i < len(commit.parents):
                    stack.append((commit, i + 1))
                    p = commit.parents[i]
                    if p in seen or had(p):
                        continue
                    seen.add(p)
                    parent = self._load(p, commit.id, on_damage, shallow)
                    if parent is not None:
                        stack.append((parent, 0))
                    continue
                yield commit

    def _walk_by_date(self, roots: Iterable[str], had: Callable[[str], bool],
                      on_damage: OnDamage | None, shallow: Collection[str]) -> Iterator[Commit]:
        seen: set[str] = set()
        heap: list[tuple[float, str, Commit]] = []

        def push(cid: str, via: str | None) -> None:
            if cid in seen or had(cid):
                return
            seen.add(cid)
            commit = self._load(cid, via, on_damage, shallow)
            if commit is not None:
                heapq.heappush(heap, (_neg_time(commit), cid, commit))

        for r in sorted(set(roots)):
            push(r, None)
        while heap:
            _, cid, commit = heapq.heappop(heap)
            yield commit
            for p in commit.parents:
                push(p, cid)

    def reachable(self, roots: Iterable[str], *, have: Have = None,
                  on_damage: OnDamage | None = None,
                  also_pruned: Collection[str] = (), depth: int | None = None) -> Iterator[Reached]:
        """Every object reachable from `roots` (commit ids), each once, minus `have`.

        Yields each commit, then the snapshot it names (`Reached.obj` is the
        snapshot as read, unless it is replaced), the replacement gc wrote for it
        (`Reached.replaces`), the snapshots its delta records are encoded
        against (normally the parent commit's, reached here first), and the
        payload chunks of the snapshots read. A referrer is yielded before what it
        refers to; an uploader that must store referenced objects first collects
        the walk and reverses it.

        `have` (ids, or a predicate) names objects not wanted, with all they
        reach: the walk does not enter a commit or snapshot in it, and skips chunks
        in it.  A replacement is looked at even when its original is had: the
        replacement is a separate object a holder of the original may lack.
        `on_damage`: as in `walk_commits`; an unreadable snapshot is skipped, with
        the chunks it would name.

        A commit marked pruned (`mvc.repo.pruned`) is yielded, its snapshot is not
        entered: the walk reaches it only through a kept commit naming it (or a
        delta encoded against it). `also_pruned`: more commits to treat so (gc's
        dry run of a retention policy).

        `depth`: only the commits fewer than `depth` parent steps from a root, each with
        everything its snapshot needs -- the delta parents too, which are older commits'
        snapshots: what a shallow fetch brings (`walk_commits`).
        """
        had = _predicate(have)
        snapshots: set[str] = set()
        chunks: set[str] = set()
        pruned = pruned_ids(self.refs) | set(also_pruned)
        for commit in self.walk_commits(roots, have=had, on_damage=on_damage, depth=depth):
            yield Reached(commit.id, "commit", commit)
            if commit.id in pruned:
                continue
            yield from self._snapshot_closure(commit.snapshot, commit.id, "commit", had,
                                              snapshots, chunks, on_damage)

    def snapshot_closure(self, sids: Iterable[str], *, have: Have = None,
                         on_damage: OnDamage | None = None) -> Iterator[Reached]:
        """What `reachable` yields for snapshots `sids` named directly rather than by a
        commit: each, its replacement, the snapshots its deltas need, and their chunks.
        A fetch walks so a replacement it has yet to check, and gc the original of one
        it must not trust."""
        had = _predicate(have)
        snapshots: set[str] = set()
        chunks: set[str] = set()
        for sid in sorted(set(sids)):
            yield from self._snapshot_closure(sid, sid, "snapshot", had, snapshots, chunks,
                                              on_damage)

    def _snapshot_closure(self, sid: str, via: str, role: str, had: Callable[[str], bool],
                          snapshots: set[str], chunks: set[str],
                          on_damage: OnDamage | None) -> Iterator[Reached]:
        """Snapshot `sid`, its replacement, the snapshots its deltas need, and their chunks."""

        stack: list[tuple[str, str, str]] = [(sid, via, role)]
        while stack:
            sid, via, role = stack.pop()
            if sid in snapshots:
                continue
            snapshots.add(sid)
            try:
                real = self.resolve_snapshot_id(sid)
                wanted = real if real != sid else None
                want_orig = not had(sid)
                want_real = not had(real)
                snap = self._read_snapshot_as(sid, real) if want_real else None
            except DataError as exc:
                if on_damage is None:
                    raise
                on_damage(Damage(sid, "snapshot", via, exc, role))
                continue
            if want_orig:
                yield Reached(sid, "snapshot", snap if wanted is None else None, via)
            if wanted is not None and want_real:
                yield Reached(real, "snapshot", snap, sid, replaces=sid)
            if snap is None:
                continue
            for rec in snap.tensors:
                for c in rec.chunks:
                    if c not in chunks and not had(c):
                        chunks.add(c)
                        yield Reached(c, "chunk", None, real)
                try:
                    parent = parent_ref(rec)
                except DataError as exc:
                    if on_damage is None:
                        raise
                    on_damage(Damage(real, "record", real, exc, "delta"))
                    parent = None
                # A delta needs the snapshot it is encoded against; `meta.refs` lists it too
                # (and is what older gcs kept): both are followed as snapshots.
                needed = [parent[0]] if parent is not None else []
                needed += [r for r in rec.meta.get("refs", []) if isinstance(r, str)]
                stack.extend((s, real, "delta") for s in needed if s not in snapshots)
