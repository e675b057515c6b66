"""Consistency checks (`mvc fsck`): every object, ref, reflog entry, link and replacement.

The service receives the object database (its blob and ref parts are what it
checks, its walker what it walks), the store's maintenance part (whose derived
counters it recounts) and the on-disk level cache (whose unusable entries it
warns about); never a `Repo`.  It never stops at the first damage: every
unreadable record is one reported problem.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from mvc.errors import DataError, MvcError
from mvc.progress import Progress, phase
from mvc.repo import refs as R
from mvc.repo.levelfile import LevelFiles, check_level_cache
from mvc.repo.objectdb import Damage, ObjectDB, Reached
from mvc.repo.objects import Snapshot, TensorRecord, object_kind
from mvc.repo.records import is_known_codec, is_quantized, parent_ref, payload_size_problems
from mvc.repo.replace import OID, REPLACE, follow_replacement
from mvc.repo.shallow import SHALLOW
from mvc.repo.replace_verify import original_is_whole, replacement_differs, unverified_replacements
from mvc.repo.unreadable import UNREADABLE_HELP, split_damage
from mvc.store import CorruptRefError, ReflogEntry, RefStore, StoreMaintenance
from mvc.store.base import OnCorrupt


@dataclass
class FsckReport:
    """What fsck found: `problems` is damage (exit status non-zero), `warnings` is not."""

    objects_checked: int
    commits_checked: int
    problems: list[str] = field(default_factory=list)
    #: Disposable or derived data found wrong (level-cache entries that reads skip, an object
    #: byte counter fsck recounted): reported, but the repository itself is intact.
    warnings: list[str] = field(default_factory=list)
    #: The snapshots reachable commits name (what `mvc.repo.fsck_decode` decodes).
    snapshots: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems


def check_repository(odb: ObjectDB, maintenance: StoreMaintenance,
                     level_cache: LevelFiles, progress: Progress | None = None) -> FsckReport:
    """Verify every stored object against its id, and every ref, reflog entry, snapshot link and
    replacement; recount the store's derived counters (repaired) and check the level cache.
    `progress` hears of each object verified, then of each commit walked.

    Every check reads metadata (object ids, refs, commits, snapshots, the cache's headers):
    torch is imported only to restore the two sides of a replacement a fetch adopted
    unchecked (`_unverified`)."""
    blobs, refs = odb.blobs, odb.refs
    problems: list[str] = []
    unreadable: set[str] = set()  # names of refs whose record could not be decoded

    def corrupt(exc: MvcError) -> None:
        problems.append(str(exc))
        if isinstance(exc, CorruptRefError):
            unreadable.add(exc.name)

    n_objects = 0
    present: set[str] = set()
    ids = list(blobs.iter_ids())
    with phase(progress, "verifying objects", total_items=len(ids), unit="objects") as p:
        for oid in ids:
            n_objects += 1
            present.add(oid)
            try:
                blobs.verify(oid)
            except MvcError as exc:
                problems.append(f"object {oid}: {exc}")
            p.advance(items=1)
    all_refs = dict(refs.iter_refs("", on_corrupt=corrupt))
    for name, value in all_refs.items():
        if R.is_symbolic(value):
            target = R.symbolic_target(value)
            try:
                if refs.read_ref(target) is None and name != R.HEAD:
                    problems.append(f"ref {name}: points to missing ref {target}")
            except MvcError as exc:
                corrupt(exc)
        elif value not in present and not name.startswith(SHALLOW):
            # (A shallow mark on a commit not stored marks nothing: what a killed fetch leaves.)
            problems.append(f"ref {name}: points to missing object {value}")
    _check_reflogs(refs, all_refs, corrupt, unreadable, problems)

    roots = odb.root_ids(on_corrupt=corrupt)
    problems.extend(f"reflog: names missing commit {cid}" for cid in sorted(roots)
                    if cid not in present)
    commits = 0
    named: set[str] = set()  # snapshot ids that reachable commits name
    records = _RecordChecks(odb, present)
    damage: list[Damage] = []
    with phase(progress, "checking history", unit="commits") as p:
        for reached in odb.reachable([c for c in roots if c in present], on_damage=damage.append):
            if reached.kind == "commit":
                commits += 1
                named.add(reached.obj.snapshot)  # type: ignore[union-attr]
                p.advance(items=1)
            elif reached.kind == "snapshot" and reached.obj is not None:
                problems.extend(records.check(reached))
    # An intact object this version cannot decode that only reflogs reach is what gc keeps
    # unread (`mvc.repo.unreadable`): a warning, not damage; anything else is a problem.
    kept, damage = split_damage(odb, damage) if damage else ([], [])
    problems.extend(str(d) for d in damage)
    unread = [f"{d} (only reflogs reach it: gc keeps it, unread; {UNREADABLE_HELP})" for d in kept]
    problems.extend(check_replacements(odb, present, named, corrupt))
    warnings = unread + maintenance.check_meta(repair=True) + check_level_cache(level_cache, odb.read_snapshot)
    # One line per problem object, however many commits share it.
    return FsckReport(objects_checked=n_objects, commits_checked=commits,
                      problems=list(dict.fromkeys(problems)), warnings=warnings,
                      snapshots=sorted(named & present))


class _RecordChecks:
    """The checks of every tensor record of a snapshot the walk read."""

    def __init__(self, odb: ObjectDB, present: set[str]) -> None:
        self.odb = odb
        self.present = present
        self._snapshots: dict[str, Snapshot | None] = {}

    def check(self, reached: Reached) -> list[str]:
        snap = reached.obj
        assert isinstance(snap, Snapshot)
        where = f"snapshot {reached.oid}"
        out: list[str] = []
        for rec in snap.tensors:
            if not is_known_codec(rec.codec):
                out.append(f"{where}: tensor {rec.name!r} uses unknown codec {rec.codec}")
            for oid in rec.chunks:
                if oid not in self.present:
                    out.append(f"{where}: tensor {rec.name!r}: chunk {oid} is missing")
            out.extend(f"{where}: {p}" for p in payload_size_problems(self.odb.blobs, rec, self.present))
            out.extend(f"{where}: {p}" for p in self._delta_parent(rec))
        return out

    def _delta_parent(self, rec: TensorRecord) -> list[str]:
        """A delta's parent snapshot holds the quantized tensor it names. (A delta naming no
        parent, or a parent snapshot that cannot be read, is reported by the walk.)"""
        try:
            ref = parent_ref(rec)
        except DataError:
            return []
        if ref is None:
            return []
        parent = self._snapshot(ref[0])
        if parent is None:
            return []
        if not any(r.name == ref[1] and is_quantized(r) for r in parent.tensors):
            return [f"tensor {rec.name!r}: delta parent {ref[1]!r} missing in snapshot {ref[0]}"]
        return []

    def _snapshot(self, sid: str) -> Snapshot | None:
        if sid not in self._snapshots:
            try:
                self._snapshots[sid] = self.odb.read_snapshot(sid)
            except DataError:
                self._snapshots[sid] = None
        return self._snapshots[sid]


# ---------------------------------------------------------------------- refs and reflogs

def _ref_and_log(refs: RefStore, name: str,
                 on_corrupt: OnCorrupt) -> tuple[str | None, list[ReflogEntry] | None]:
    """(value of ref `name`, its reflog) read consistently, or (.., None) if the log is damaged.

    Ref and reflog move in one transaction but are read in two: read the ref on
    both sides of the log and retry while a concurrent commit moves it.
    """
    errors: list[MvcError] = []
    for _ in range(3):
        errors.clear()
        value = refs.read_ref(name)
        log = refs.reflog(name, on_corrupt=errors.append)
        if refs.read_ref(name) == value:
            break
    for exc in errors:
        on_corrupt(exc)  # type: ignore[arg-type]
    return value, (None if errors else log)


def _check_reflogs(refs: RefStore, all_refs: dict[str, str], on_corrupt: Callable[[MvcError], None],
                   unreadable: set[str], problems: list[str]) -> None:
    """Every ref and its reflog agree: a ref store moves a ref and appends its entry, which
    records the value it found, in one step. So a reflog starts from nothing, each entry
    starts where the previous one ended, and the last one holds the ref's value (None once
    deleted). A renamed, reordered or rewritten record breaks that, even where every record
    still decodes."""
    names = set(refs.reflog_names(on_corrupt=on_corrupt))
    for name in sorted(names | all_refs.keys()):
        if name in unreadable:
            continue  # reported already
        try:
            value, log = _ref_and_log(refs, name, on_corrupt)
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


# ---------------------------------------------------------------------- replacements

def check_replacements(odb: ObjectDB, present: set[str], named: set[str],
                       on_corrupt: Callable[[MvcError], None]) -> list[str]:
    """fsck's view of every replacement (`mvc.repo.replace`): the problems found, one line each.

    `present`: every stored object id; `named`: the snapshot ids reachable
    commits name.  Reported: a replacement that is not an object id, missing,
    not a snapshot, part of a chain or loop, a delta chain that loops back
    through it, and one whose original is not a snapshot the store holds.
    An original that exists but no reachable commit names is not damage: the
    next gc drops its replacement with it.
    """
    problems: list[str] = []
    for name, value in odb.refs.iter_refs(REPLACE, on_corrupt=on_corrupt):
        orig = name[len(REPLACE):]
        if not OID.fullmatch(orig):
            problems.append(f"ref {name}: does not name a snapshot id")
            continue
        if not OID.fullmatch(value):
            problems.append(f"ref {name}: replacement {value!r} is not a snapshot id")
            continue
        target_ok = False
        if value not in present:
            problems.append(f"ref {name}: replacement snapshot {value} is missing")
        else:
            kind = _kind(odb, value)
            if kind not in (None, "snapshot"):
                problems.append(f"ref {name}: replacement {value} is a {kind}, not a snapshot")
            target_ok = kind == "snapshot"
        if orig not in present:
            why = "a commit names it" if orig in named else "no commit names it"
            problems.append(f"ref {name}: replaces snapshot {orig}, which is missing ({why})")
        else:
            kind = _kind(odb, orig)
            if kind not in (None, "snapshot"):
                problems.append(f"ref {name}: replaces {orig}, which is a {kind}, not a snapshot")
        try:
            follow_replacement(odb.refs, orig)
        except MvcError as exc:
            problems.append(str(exc))
            continue
        if target_ok:
            problems.extend(_delta_loops(odb, orig))
    problems.extend(_unverified(odb))
    return problems


def _unverified(odb: ObjectDB) -> list[str]:
    """Replacements a fetch adopted unchecked (an older mvc did) that restore differently
    from the snapshot they replace, where that snapshot is still whole here."""
    problems: list[str] = []
    for sid, target in sorted(unverified_replacements(odb.refs).items()):
        if original_is_whole(odb, sid):
            why = replacement_differs(odb, sid, target)
            if why is not None:
                problems.append(f"ref {REPLACE}{sid}: adopted by a fetch and never checked: the "
                                f"replacement {why}; the next `mvc gc` drops it")
    return problems


def _kind(odb: ObjectDB, oid: str) -> str | None:
    """'commit', 'snapshot' or 'chunk'; None when unreadable (fsck reports that object itself)."""
    try:
        return object_kind(odb.blobs.get(oid))
    except MvcError:
        return None


def _delta_loops(odb: ObjectDB, sid: str) -> list[str]:
    """Delta chains that come back to (snapshot `sid`, tensor): only a bogus replacement of
    `sid` can close such a loop (content ids keep committed chains acyclic)."""
    problems: list[str] = []
    memo: dict[str, Snapshot] = {}

    def snapshot(s: str) -> Snapshot:
        if s not in memo:
            memo[s] = odb.read_snapshot(s)
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
