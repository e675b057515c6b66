"""Garbage collection (`mvc gc`): bound delta chains, then delete what no ref or reflog reaches.

The service receives the parts it works on -- the object database (which walks
history), the tensor reader (compaction re-encodes through it), the ref store
(replacements are published and dropped in one transaction each), the store's
maintenance part (write lock, shrink) -- and plain settings; never a `Repo`.
"""
from __future__ import annotations

import time
import warnings
from collections.abc import Iterable
from dataclasses import dataclass, field

from mvc.errors import DataError, MvcWarning, UsageError
from mvc.progress import Progress, phase
from mvc.repo.compact import compact_chains
from mvc.repo.gc_overlay import OverlayBlobs, OverlayRefs
from mvc.repo.objectdb import Damage, ObjectDB
from mvc.repo.reader import TensorReader
from mvc.repo.pruned import PRUNED
from mvc.repo.replace import REPLACE
from mvc.repo import shallow
from mvc.repo.replace_verify import settle_unverified, unverified_replacements
from mvc.repo.retention import RetentionPolicy, apply_retention, plan_retention
from mvc.repo.unreadable import UNREADABLE_HELP, is_intact, salvage, split_damage
from mvc.store import InvalidIdError, MemoryRefStore, RefUpdate, StoreMaintenance, TransactionalRefStore
from mvc.store.base import check_oid


#: Objects deleted per store transaction: progress moves between batches; any prefix of the
#: deletions leaves a consistent store (only unreachable objects go).
_DELETE_BATCH = 256


class UnsafeGcError(DataError):
    """gc refused to run because stored data is damaged (reachable history, an object key):
    deleting could lose reachable data."""

    exit_code = 25


@dataclass
class GcReport:
    """What one gc did (or, with `dry_run`, would do)."""

    removed_objects: int
    freed_bytes: int
    kept_objects: int
    dry_run: bool
    snapshots_rewritten: int = 0
    tensors_rebased: int = 0
    max_chain_before: int = 0
    max_chain_after: int = 0
    #: The store's size before and after `shrink` (None without it).
    disk_before: int | None = None
    disk_after: int | None = None
    #: Commits a retention policy pruned now (or would), newest first; and the tensors of
    #: kept commits re-encoded as bases because they were deltas on a pruned snapshot.
    pruned: list[str] = field(default_factory=list)
    retention_rebased: int = 0
    #: Reflogs of deleted refs dropped now (or that would be): past `reflog_expire_days`.
    expired_reflogs: list[str] = field(default_factory=list)
    #: Reflogs of deleted refs still in their grace period (their commits are kept).
    deleted_refs_kept: list[str] = field(default_factory=list)
    #: Level-cache files deleted after the objects: stale (their snapshot or encoding gone),
    #: corrupt or foreign -- what `fsck` would warn about.
    cache_files_removed: int = 0
    #: Intact objects this version cannot decode that only reflogs reach: kept unread, with
    #: every object their bytes name (`mvc.repo.unreadable`); one line each.
    unreadable_kept: list[str] = field(default_factory=list)
    #: Replacements a fetch adopted unchecked that gc found to restore differently, and
    #: dropped (`mvc.repo.replace_verify.settle_unverified`): one line each.
    replacements_dropped: list[str] = field(default_factory=list)
    #: Objects gc wrote (or, dry, would write): the bases it re-encoded and the snapshots
    #: holding them. `freed_bytes - written_bytes` is what the store's objects shrink by.
    written_objects: int = 0
    written_bytes: int = 0
    #: After the run (without `shrink`): the store file's size and the free pages in it,
    #: which later commits reuse and `shrink` gives back (None: unknown, or a dry run).
    disk_bytes: int | None = None
    reclaimable_bytes: int | None = None

    @property
    def shrink_pays(self) -> bool:
        """Whether `shrink` would give back a worthwhile share of the store file: at least
        `SHRINK_SUGGESTED` of it is free pages."""
        return bool(self.disk_bytes and self.reclaimable_bytes
                    and self.reclaimable_bytes >= SHRINK_SUGGESTED * self.disk_bytes)


#: The share of the store file in free pages above which gc suggests `--shrink`: below it, the
#: next commits refill the free pages anyway, and a shrink rewrites the whole file for little.
SHRINK_SUGGESTED = 0.25


@dataclass(frozen=True)
class GcSettings:
    """gc's configuration, read by the caller (`gc.max_chain`, `commit.chain_budget`, ...)."""

    #: Re-encode tensors whose delta chain is deeper than this as bases (0: no depth bound).
    max_chain: int
    #: ... or whose chain costs more than this many passes to walk (0: no budget).
    chain_budget: float
    #: Payload chunk size of re-encoded tensors, bytes.
    chunk_size: int
    #: Seconds to wait for the repository write lock.
    lock_timeout: float
    #: Days a deleted ref's reflog is kept after the deletion (inf: forever; 0: none).
    reflog_expire_days: float = 30.0


def collect_garbage(odb: ObjectDB, reader: TensorReader, refs: TransactionalRefStore,
                    maintenance: StoreMaintenance, settings: GcSettings, *,
                    dry_run: bool = False, shrink: bool = False,
                    progress: Progress | None = None,
                    retention: RetentionPolicy | None = None) -> GcReport:
    """Compact delta chains deeper than `settings.max_chain` or costlier than
    `settings.chain_budget`, then delete every object no ref or reflog entry reaches.

    Holds the write lock for its whole run, so a concurrent commit (which
    writes its objects before its ref) can never have them collected.
    Refuses (`UnsafeGcError`) to change anything when stored data is damaged:
    an unreadable object anywhere in reachable history (a commit, a snapshot,
    a replacement, a delta's parent) or a damaged object key in the store. With
    `shrink`, the store then gives the freed space back. `progress` hears of the commits
    compaction visits and of the objects deleted.

    `retention`: first prune the commits the policy does not keep (`mvc.repo.retention`).

    `dry_run`: every step runs as in the real run -- retention's re-encodings, compaction,
    the check of unverified replacements -- but against a copy-on-write view of the store
    (`mvc.repo.gc_overlay`) whose writes stay in memory, and nothing is deleted: the report
    (objects removed and written, tensors re-encoded) is what the run would do now, at the
    cost of the run's re-encoding work.
    """
    if settings.max_chain < 0:
        raise UsageError(f"max_chain must be >= 0 (0: no depth bound), got {settings.max_chain}")
    with maintenance.write_lock(settings.lock_timeout):
        stored = _stored_ids(odb.blobs.iter_ids())
        if dry_run:
            odb, reader, refs = _dry_run_view(odb, refs)
        blobs = odb.blobs
        expired, in_grace = _deleted_ref_logs(refs, time.time() - settings.reflog_expire_days * 86400.0)
        for name in expired:
            refs.delete_reflog(name)
        roots = odb.root_ids(ignore_reflogs=expired)
        # Before anything is kept or re-encoded on the strength of a replacement nobody here
        # checked: check it.
        dropped = settle_unverified(odb, refs)
        for line in dropped:
            warnings.warn(f"gc: {'(dry run) would have ' if dry_run else ''}{line}", MvcWarning, stacklevel=2)
        plan = plan_retention(odb, retention) if retention is not None else None
        rebased = 0
        if plan is not None:
            rebased = apply_retention(odb, reader, refs, plan, settings.chunk_size, progress)
        unreadable: list[Damage] = []
        keep = _reachable(odb, roots, unreadable=unreadable)
        if unreadable:
            warnings.warn(MvcWarning(
                f"gc: kept {len(unreadable)} object(s) this version cannot read, which only "
                f"reflogs reach, and all they name: {unreadable[0]} ({UNREADABLE_HELP})"), stacklevel=2)
        compacted = None
        if settings.max_chain > 0 or settings.chain_budget > 0:
            # Compaction reads every snapshot it walks: with unreadable ones in reflog-only
            # history, it bounds the chains of what refs reach and leaves the rest as it is.
            walked = odb.root_ids(reflogs=False) if unreadable else roots
            with phase(progress, "bounding delta chains", unit="commits") as p:
                compacted = compact_chains(odb, reader, refs, walked, max_chain=settings.max_chain,
                                           budget=settings.chain_budget, chunk_size=settings.chunk_size,
                                           progress=p)
            if compacted.snapshots_rewritten:
                keep = _reachable(odb, roots)
        # Replacements of snapshots nothing reaches any more go too.
        stale = [RefUpdate(n, v, None) for n, v in refs.iter_refs(REPLACE)
                 if n[len(REPLACE):] not in keep]
        if stale:
            refs.update_refs(stale, "gc: drop replacements of unreachable snapshots")
            for u in stale:
                refs.delete_reflog(u.name)
        # Shallow marks on commits gone (or never stored: a killed fetch's) mark nothing.
        shallow.drop_stale(refs, keep.__contains__, "gc: drop marks of unreachable commits")
        # Objects retention and compaction wrote are not in `stored`: all of them are reachable.
        doomed = [oid for oid in stored if oid not in keep]
        sizes = {oid: blobs.size(oid) for oid in doomed}
        freed = sum(sizes.values())
        before = set(stored)
        written = [oid for oid in keep if oid not in before]
        if not dry_run and doomed:
            with phase(progress, "deleting", total_bytes=freed, total_items=len(doomed), unit="objects") as p:
                for i in range(0, len(doomed), _DELETE_BATCH):
                    batch = doomed[i:i + _DELETE_BATCH]
                    blobs.delete(batch)
                    p.advance(sum(sizes[oid] for oid in batch), len(batch))
        report = GcReport(removed_objects=len(doomed), freed_bytes=freed,
                          kept_objects=len(keep), dry_run=dry_run,
                          pruned=[c.id for c in plan.prune] if plan else [], retention_rebased=rebased,
                          expired_reflogs=expired, deleted_refs_kept=in_grace,
                          replacements_dropped=dropped, written_objects=len(written),
                          written_bytes=sum(blobs.size(oid) for oid in written))
        report.unreadable_kept = [str(d) for d in unreadable]
        if compacted is not None:
            report.snapshots_rewritten = compacted.snapshots_rewritten
            report.tensors_rebased = compacted.tensors_rebased
            report.max_chain_before = compacted.max_depth_before
            report.max_chain_after = compacted.max_depth_after
        if shrink and not dry_run:
            report.disk_before, report.disk_after = maintenance.shrink(settings.lock_timeout)
        elif not dry_run:
            report.disk_bytes = maintenance.disk_usage()
            report.reclaimable_bytes = maintenance.reclaimable_bytes()
        return report


def _dry_run_view(odb: ObjectDB, refs: TransactionalRefStore) -> tuple[ObjectDB, TensorReader,
                                                                        TransactionalRefStore]:
    """The object database, a reader and the refs of a copy-on-write view of the store
    (`mvc.repo.gc_overlay`): the dry run's writes stay in memory, its reader caches apart."""
    view_refs = OverlayRefs(refs)
    view = ObjectDB(OverlayBlobs(odb.blobs), view_refs)
    return view, TensorReader(view), view_refs


def _reachable(odb: ObjectDB, roots: set[str], *, unreadable: list[Damage] | None = None) -> set[str]:
    """Every object reachable from `roots`; `UnsafeGcError` if any of it cannot be read,
    except intact objects only reflogs reach, kept unread (`mvc.repo.unreadable`; told to
    `unreadable`)."""
    damage: list[Damage] = []
    keep = {r.oid for r in odb.reachable(roots, on_damage=damage.append)}
    if damage:
        unread, damage = split_damage(odb, damage)
        salvaged, problem = salvage(odb, [d.oid for d in unread], keep)
        if problem is not None:
            raise UnsafeGcError(f"gc refused: {problem}, run `mvc fsck`")
        keep |= salvaged
        if unreadable is not None:
            unreadable[:] = unread
    if damage:
        more = f" (and {len(damage) - 1} more)" if len(damage) > 1 else ""
        hint = (f"; a ref names a commit this version cannot read: {UNREADABLE_HELP}"
                if any(is_intact(d) for d in damage) else "")
        raise UnsafeGcError(f"gc refused: reachable history is damaged, run `mvc fsck`: "
                            f"{damage[0]}{more}{hint}")
    return keep | _unverified_originals(odb, keep)


def _unverified_originals(odb: ObjectDB, keep: set[str]) -> set[str]:
    """What the originals of unverified replacements (`mvc.repo.replace_verify`) reach, read
    as themselves: a replacement nobody here checked must not be why their data goes."""
    untrusted = unverified_replacements(odb.refs)
    originals = [sid for sid in untrusted if sid in keep]
    if not originals:
        return set()
    view = MemoryRefStore()
    for name, value in odb.refs.iter_refs(REPLACE):
        if name[len(REPLACE):] not in untrusted:
            view.update_ref(name, None, value, "gc: trusted replacements")
    # Damage here (say, a delta parent already gone) only means less to keep.
    walk = ObjectDB(odb.blobs, view).snapshot_closure(originals, on_damage=lambda _d: None)
    return {r.oid for r in walk}


def _deleted_ref_logs(refs: TransactionalRefStore, cutoff: float) -> tuple[list[str], list[str]]:
    """(expired, in grace): the reflogs of deleted refs whose deletion is older than `cutoff`
    (epoch seconds), and the others. gc's own replacement logs are not the user's."""
    expired: list[str] = []
    grace: list[str] = []
    for name in refs.reflog_names():
        if name.startswith((REPLACE, PRUNED, shallow.SHALLOW)) or refs.read_ref(name) is not None:
            continue
        log = refs.reflog(name)
        if not log or log[-1].new is not None:
            continue  # not a deletion: fsck reports the disagreement, gc keeps it all
        (expired if log[-1].time <= cutoff else grace).append(name)
    return expired, grace


def _stored_ids(ids: Iterable[str]) -> list[str]:
    """Every stored id; `UnsafeGcError` on one that is no object id (a damaged key): what it
    named cannot be told, so nothing may be deleted."""
    out: list[str] = []
    for oid in ids:
        try:
            out.append(check_oid(oid))
        except InvalidIdError:
            raise UnsafeGcError(f"gc refused: the store holds a damaged object key {oid!r}, "
                                "run `mvc fsck`") from None
    return out
