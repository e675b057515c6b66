"""Reachability, garbage collection and consistency checks (`mvc gc`, `mvc fsck`)."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from mvc.codecs.base import registered
from mvc.errors import DataError, MvcError, UsageError
from mvc.repo import refs as R
from mvc.repo.objects import Commit, Snapshot, object_kind
from mvc.repo.tensors import payload_size_problems
from mvc.store import RefUpdate
from mvc.store.base import CorruptRefError, OnCorrupt, ReflogEntry

if TYPE_CHECKING:
    from mvc.repo.repository import Repo
    from mvc.store import ObjectStore


class UnsafeGcError(MvcError):
    """gc refused to run because history is damaged: deleting could lose reachable data."""

    exit_code = 25


@dataclass
class GcReport:
    removed_objects: int
    freed_bytes: int
    kept_objects: int
    dry_run: bool
    snapshots_rewritten: int = 0
    tensors_rebased: int = 0
    max_chain_before: int = 0
    max_chain_after: int = 0
    disk_before: int | None = None
    disk_after: int | None = None


@dataclass
class FsckReport:
    objects_checked: int
    commits_checked: int
    problems: list[str] = field(default_factory=list)
    #: Disposable or derived data found wrong (level-cache entries that reads skip, an object
    #: byte counter fsck recounted): reported, but the repository itself is intact.
    warnings: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems


def root_ids(repo: "Repo", on_corrupt: OnCorrupt | None = None) -> set[str]:
    """Every commit id a ref or a reflog entry names: what gc must keep.

    An unreadable ref or reflog record raises (gc must not guess), unless
    `on_corrupt` takes it (fsck reports it and goes on).
    """
    from mvc.repo.repository import REPLACE

    roots: set[str] = set()
    store = repo.store
    for name, value in store.iter_refs("", on_corrupt=on_corrupt):
        if value and not R.is_symbolic(value) and not name.startswith(REPLACE):
            roots.add(value)
    for name in store.reflog_names(on_corrupt=on_corrupt):
        if name.startswith(REPLACE):
            continue
        for entry in store.reflog(name, on_corrupt=on_corrupt):
            for v in (entry.old, entry.new):
                if v and not R.is_symbolic(v):
                    roots.add(v)
    return roots


def reachable_objects(repo: "Repo", roots: set[str]) -> tuple[set[str], list[str]]:
    """(every object reachable from `roots`, problems met on the way)."""
    keep: set[str] = set()
    problems: list[str] = []
    stack = list(roots)
    while stack:
        cid = stack.pop()
        if cid in keep:
            continue
        keep.add(cid)
        try:
            commit = repo.read_commit(cid)
        except DataError as exc:
            problems.append(f"commit {cid}: {exc}")
            continue
        keep.add(commit.snapshot)
        keep.add(repo.resolve_snapshot_id(commit.snapshot))
        try:
            snap = repo.read_snapshot(commit.snapshot)
        except DataError as exc:
            problems.append(f"snapshot {commit.snapshot} of commit {cid}: {exc}")
        else:
            for rec in snap.tensors:
                keep.update(rec.chunks)
                keep.update(rec.meta.get("refs", []))
        stack.extend(p for p in commit.parents if p not in keep)
    return keep, problems


def gc(repo: "Repo", *, dry_run: bool = False, max_chain: int | None = None,
       shrink: bool = False) -> GcReport:
    """Compact delta chains deeper than `max_chain` (default gc.max_chain) or costlier than
    commit.chain_budget, then delete every object no ref or reflog entry reaches.

    Holds the write lock for its whole run, so a concurrent commit (which
    writes its objects before its ref) can never have them collected.
    Refuses to delete anything if reachable history is damaged. With
    `shrink`, the LMDB file is then rewritten compactly to return disk space.
    """
    from mvc.repo.compact import compact_chains
    from mvc.repo.repository import REPLACE

    store = repo.store
    if max_chain is None:
        max_chain = int(repo.config.get("gc.max_chain"))
    if max_chain < 0:
        raise UsageError(f"max_chain must be >= 0 (0: no depth bound), got {max_chain}")
    with store.write_lock(repo._lock_timeout()):
        roots = root_ids(repo)
        keep, problems = reachable_objects(repo, roots)
        if problems:
            raise UnsafeGcError(
                "gc refused: reachable history is damaged, run `mvc fsck`: " + problems[0])
        compacted = None
        budget = float(repo.config.get("commit.chain_budget"))
        if not dry_run and (max_chain > 0 or budget > 0):
            compacted = compact_chains(repo, roots, max_chain, budget)
            if compacted.snapshots_rewritten:
                keep, problems = reachable_objects(repo, roots)
        # Replacements of snapshots nothing reaches any more go too.
        stale = [RefUpdate(n, v, None) for n, v in store.iter_refs(REPLACE)
                 if n[len(REPLACE):] not in keep]
        if stale and not dry_run:
            store.update_refs(stale, "gc: drop replacements of unreachable snapshots")
            for u in stale:
                store.delete_reflog(u.name)
        doomed = [oid for oid in store.iter_ids() if oid not in keep]
        freed = sum(store.size(oid) for oid in doomed)
        if not dry_run and doomed:
            store.delete(doomed)
        report = GcReport(removed_objects=len(doomed), freed_bytes=freed,
                          kept_objects=len(keep), dry_run=dry_run)
        if compacted is not None:
            report.snapshots_rewritten = compacted.snapshots_rewritten
            report.tensors_rebased = compacted.tensors_rebased
            report.max_chain_before = compacted.max_depth_before
            report.max_chain_after = compacted.max_depth_after
        if shrink and not dry_run:
            report.disk_before, report.disk_after = store.shrink()
        return report


def fsck(repo: "Repo") -> FsckReport:
    """Verify every stored object against its id, and every ref, reflog entry and snapshot link.

    Never stops at the first damage: every unreadable record (object, ref,
    reflog entry, commit, snapshot) is one problem in the report.
    """
    from mvc.repo.lossy import QUANT_CODECS
    from mvc.repo.replace import check_replacements

    store = repo.store
    problems: list[str] = []
    unreadable: set[str] = set()  # names of refs whose record could not be decoded

    def corrupt(exc: MvcError) -> None:
        problems.append(str(exc))
        if isinstance(exc, CorruptRefError):
            unreadable.add(exc.name)

    n_objects = 0
    present: set[str] = set()
    for oid in store.iter_ids():
        n_objects += 1
        present.add(oid)
        try:
            store.verify(oid)
        except MvcError as exc:
            problems.append(f"object {oid}: {exc}")
    refs = dict(store.iter_refs("", on_corrupt=corrupt))
    for name, value in refs.items():
        if R.is_symbolic(value):
            target = R.symbolic_target(value)
            try:
                if store.read_ref(target) is None and name != R.HEAD:
                    problems.append(f"ref {name}: points to missing ref {target}")
            except MvcError as exc:
                corrupt(exc)
        elif value not in present:
            problems.append(f"ref {name}: points to missing object {value}")
    _check_reflogs(store, refs, corrupt, unreadable, problems)

    known = set(registered()) | set(QUANT_CODECS)
    commits = 0
    roots = root_ids(repo, on_corrupt=corrupt)
    problems.extend(f"reflog: names missing commit {cid}" for cid in sorted(roots)
                    if cid not in present)
    seen: set[str] = set()
    named: set[str] = set()  # snapshot ids that reachable commits name
    stack = [c for c in roots if c in present]
    while stack:
        cid = stack.pop()
        if cid in seen:
            continue
        seen.add(cid)
        try:
            data = store.get(cid)
            if object_kind(data) != "commit":
                problems.append(f"{cid}: referenced as a commit but is a {object_kind(data)}")
                continue
            commit = Commit.decode(data, cid)
        except MvcError as exc:
            problems.append(f"commit {cid}: {exc}")
            continue
        commits += 1
        named.add(commit.snapshot)
        for p in commit.parents:
            if p not in present:
                problems.append(f"commit {cid}: parent {p} is missing")
            else:
                stack.append(p)
        try:
            snap = repo.read_snapshot(commit.snapshot)
        except MvcError as exc:
            problems.append(f"commit {cid}: snapshot {commit.snapshot}: {exc}")
            continue
        for rec in snap.tensors:
            if rec.codec not in known:
                problems.append(f"commit {cid}: tensor {rec.name!r} uses unknown codec {rec.codec}")
            for oid in rec.chunks:
                if oid not in present:
                    problems.append(f"commit {cid}: tensor {rec.name!r}: chunk {oid} is missing")
            problems.extend(f"commit {cid}: {p}" for p in payload_size_problems(store, rec, present))
            problems.extend(f"commit {cid}: {p}" for p in _check_delta_parent(repo, rec))
    problems.extend(check_replacements(repo, present, named, corrupt))
    from mvc.repo.levelcache import check_level_cache

    warnings = store.check_meta(repair=True) + check_level_cache(repo)
    # One line per problem object, however many commits share it.
    return FsckReport(objects_checked=n_objects, commits_checked=commits,
                      problems=list(dict.fromkeys(problems)), warnings=warnings)


def _ref_and_log(store: "ObjectStore", name: str,
                 on_corrupt: OnCorrupt) -> tuple[str | None, list[ReflogEntry] | None]:
    """(value of ref `name`, its reflog) read consistently, or (.., None) if the log is damaged.

    Ref and reflog move in one transaction but are read in two: read the ref on
    both sides of the log and retry while a concurrent commit moves it.
    """
    errors: list[MvcError] = []
    for _ in range(3):
        errors.clear()
        value = store.read_ref(name)
        log = store.reflog(name, on_corrupt=errors.append)
        if store.read_ref(name) == value:
            break
    for exc in errors:
        on_corrupt(exc)
    return value, (None if errors else log)


def _check_reflogs(store: "ObjectStore", refs: dict[str, str], on_corrupt: OnCorrupt,
                   unreadable: set[str], problems: list[str]) -> None:
    """Every ref and its reflog agree: `update_refs` moves a ref and appends its entry, which
    records the value it found, in one transaction. So a reflog starts from nothing, each
    entry starts where the previous one ended, and the last one holds the ref's value (None
    once deleted). A renamed, reordered or rewritten record breaks that, even where every
    record still decodes."""
    names = set(store.reflog_names(on_corrupt=on_corrupt))
    for name in sorted(names | refs.keys()):
        if name in unreadable:
            continue  # reported already
        try:
            value, log = _ref_and_log(store, name, on_corrupt)
        except MvcError as exc:
            on_corrupt(exc)
            continue
        if log is None:
            continue
        before = None
        for i, entry in enumerate(log):
            if entry.old != before:
                problems.append(f"reflog of {name}: entry {i} moves it from {entry.old}, "
                                f"but it was {before}")
            before = entry.new
        last = log[-1].new if log else None
        if not log and value is not None:
            problems.append(f"ref {name}: has no reflog (every ref move is logged)")
        elif last != value:
            now = "is missing" if value is None else f"is {value}"
            problems.append(f"ref {name}: {now}, but its reflog's last entry set it to {last}")


def _check_delta_parent(repo: "Repo", rec) -> list[str]:
    from mvc.repo.lossy import QUANT_CODECS, parent_ref

    try:
        ref = parent_ref(rec)
        if ref is None:
            return []
        parent = repo.read_snapshot(ref[0])
    except DataError as exc:
        return [f"tensor {rec.name!r}: delta parent unreadable: {exc}"]
    if not any(r.name == ref[1] and r.codec in QUANT_CODECS for r in parent.tensors):
        return [f"tensor {rec.name!r}: delta parent {ref[1]!r} missing in snapshot {ref[0]}"]
    return []
