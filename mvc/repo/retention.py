"""Retention policies for gc: `--keep-last N` per branch and `--keep-every K` in older history.

Which commits a policy prunes (`plan_retention`), and pruning them
(`apply_retention`): the commits stay in history with their ids, marked
(`mvc.repo.pruned`); gc then frees the snapshots nothing kept reaches.

What is kept, for each branch's first-parent line (its tip first):
* the `keep_last` newest commits (at least the tip);
* with `keep_every` K, every commit whose distance from the line's root is a multiple
  of K: anchored at the root, so the same commits stay kept as the branch grows and
  repeated gcs never thin the history further;
* whatever any ref names (tags, every branch tip, a detached HEAD, remote-tracking
  refs), and commits on no branch's first-parent line (reached only through a reflog
  or a second parent: reflog expiry, not retention, decides those).
A commit on several branches' lines is kept if any of them keeps it.

Crash safety (a kill at any moment): first the kept commits whose tensors are
deltas on a snapshot about to be pruned are re-encoded as bases, each snapshot
through compaction's verified replacement (`compact.rebase_tensors`: published
only after restoring bit-identically); then every mark is written in one ref
transaction. Before the marks nothing is pruned; after them the kept commits
no longer need the pruned snapshots. Only then does gc delete.
"""
from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from mvc.errors import UsageError
from mvc.progress import Progress, phase
from mvc.repo import refs as R
from mvc.repo.compact import rebase_tensors
from mvc.repo.lossy import parent_ref
from mvc.repo.objectdb import ObjectDB
from mvc.repo.objects import Commit, TensorRecord
from mvc.repo.pruned import PRUNED, mark_pruned, pruned_ids
from mvc.repo.reader import TensorReader
from mvc.repo.replace import REPLACE
from mvc.store import TransactionalRefStore


@dataclass(frozen=True)
class RetentionPolicy:
    """`keep_last`: newest commits kept per branch (None: only the tip unless `keep_every`
    keeps more); `keep_every`: also keep every K-th commit counted from the root."""

    keep_last: int | None = None
    keep_every: int | None = None

    def __post_init__(self) -> None:
        if self.keep_last is not None and self.keep_last < 1:
            raise UsageError(f"--keep-last must be >= 1 (branch tips are always kept), got {self.keep_last}")
        if self.keep_every is not None and self.keep_every < 1:
            raise UsageError(f"--keep-every must be >= 1, got {self.keep_every}")


@dataclass
class RetentionPlan:
    """What a policy does to the history as it is now."""

    #: Commits to mark pruned now, newest first.
    prune: list[Commit] = field(default_factory=list)
    #: Snapshots no kept commit names once `prune` (and the earlier marks) are applied.
    freed_snapshots: set[str] = field(default_factory=set)
    #: Kept snapshot id -> indices of its records (as read) encoded against a freed snapshot.
    rebase: dict[str, list[int]] = field(default_factory=dict)


def plan_retention(odb: ObjectDB, policy: RetentionPolicy) -> RetentionPlan:
    """The commits `policy` prunes and the re-encodings that keeps every other one whole."""
    refs = odb.refs
    already = pruned_ids(refs)
    tips: set[str] = set()
    branches: list[str] = []
    for name, value in refs.iter_refs(""):
        if not value or R.is_symbolic(value) or name.startswith((REPLACE, PRUNED)):
            continue
        tips.add(value)
        if name.startswith(R.HEADS):
            branches.append(value)
    keep_last = policy.keep_last or 1
    kept: set[str] = set()
    candidates: dict[str, Commit] = {}
    for tip in branches:
        line = _first_parent_line(odb, tip)
        root_distance = len(line) - 1
        for i, c in enumerate(line):
            if i < keep_last or (policy.keep_every and (root_distance - i) % policy.keep_every == 0):
                kept.add(c.id)
            else:
                candidates.setdefault(c.id, c)
    prune = [c for cid, c in candidates.items() if cid not in kept and cid not in tips and cid not in already]
    prune.sort(key=lambda c: (c.time, c.id), reverse=True)
    plan = RetentionPlan(prune=prune)
    gone = already | {c.id for c in prune}
    every = list(odb.walk_commits(odb.root_ids()))
    kept_snaps = {c.snapshot for c in every if c.id not in gone}
    plan.freed_snapshots = {c.snapshot for c in every if c.id in gone} - kept_snaps
    if plan.freed_snapshots:
        for sid in sorted(kept_snaps):
            snap = odb.read_snapshot(sid)
            idx = [i for i, rec in enumerate(snap.tensors) if _needs(rec, plan.freed_snapshots)]
            if idx:
                plan.rebase[sid] = idx
    return plan


def apply_retention(odb: ObjectDB, reader: TensorReader, refs: TransactionalRefStore,
                    plan: RetentionPlan, chunk_size: int, progress: Progress | None = None) -> int:
    """Re-encode what `plan.rebase` names as bases (verified), then mark `plan.prune` pruned
    in one transaction. The caller holds the write lock. Returns the tensors re-encoded."""
    rebased = 0
    with phase(progress, "re-basing kept commits", total_items=len(plan.rebase), unit="snapshots") as p:
        for sid, idx in plan.rebase.items():
            rebase_tensors(odb, reader, refs, sid, odb.read_snapshot(sid), idx, chunk_size,
                           "gc: re-base on a pruned commit's snapshot")
            rebased += len(idx)
            p.advance(items=1)
    mark_pruned(refs, (c.id for c in plan.prune), "gc: retention")
    return rebased


def _first_parent_line(odb: ObjectDB, tip: str) -> list[Commit]:
    """`tip` and its first-parent ancestors, tip first."""
    line: list[Commit] = []
    seen: set[str] = set()
    cid: str | None = tip
    while cid is not None and cid not in seen:
        seen.add(cid)
        c = odb.read_commit(cid)
        line.append(c)
        cid = c.parents[0] if c.parents else None
    return line


def _needs(rec: TensorRecord, snapshots: Iterable[str] | set[str]) -> bool:
    """Whether `rec` is encoded against one of `snapshots` (its delta parent, or an older
    record's `meta.refs`)."""
    ref = parent_ref(rec)
    named = [ref[0]] if ref is not None else []
    named += [r for r in rec.meta.get("refs", []) if isinstance(r, str)]
    return any(s in snapshots for s in named)
