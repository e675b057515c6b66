"""One commit transaction: what `Repo.commit` and a sharded save (`mvc.dcp`) share.

Both make a commit the same way: read the ref the commit moves and its head, read that
commit as the parent the tensors are written against, say who commits and from which code
(`CommitInfo`), and publish under the repository write lock with one compare-and-swap.
`CommitTransaction` is that sequence, built from the parts it needs -- the blob store, the
ref store, the store's write lock, the object database, the reader's `read_quantized` and
`read_centroids`, and plain values read from the config -- never from `Repo`.

    Repo.commit    plan outside the lock (the search is the slow part), then `commit`:
                   under the lock, re-plan against the branch as it is, write, publish.
    mvc.dcp        `target` and `parent` on the coordinator, `write` on every rank, then
                   `publish` of every rank's records once, under the lock.
"""
from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

from mvc.errors import MvcError
from mvc.progress import Progress
from mvc.repo import pipeline
from mvc.repo.objectdb import ObjectDB
from mvc.repo.objects import TensorRecord, checked_encoding
from mvc.repo.provenance import author, code_provenance
from mvc.repo.refops import commit_target
from mvc.store import BlobStore, RefStore, StoreMaintenance, object_id


class NothingToCommitError(MvcError):
    """A commit with `allow_empty=False` would record exactly the snapshot its parent (the
    branch's head) has: no commit was made.  `head`: that commit's id.  Nothing new was
    stored either -- chunks are content-addressed, so writing them again added nothing."""

    exit_code = 108

    def __init__(self, head: str) -> None:
        super().__init__(f"nothing to commit: the checkpoint matches HEAD ({head[:12]})")
        self.head = head


@dataclass(frozen=True)
class Published:
    """The outcome of a publish: the commit the branch is at, its snapshot, and whether it
    was already there (a retry of a save whose first attempt landed: no commit was made)."""

    commit: str
    snapshot: str
    reused: bool = False


class CommitTransaction:
    """Plan against the branch's head, write, publish under the write lock (see the module
    docstring).  `settings`: the `commit.*` values; `user_name` / `user_email`: the
    configured author (None: from the environment, `mvc.repo.provenance.author`)."""

    def __init__(self, *, blobs: BlobStore, refs: RefStore, maintenance: StoreMaintenance,
                 odb: ObjectDB, read_quantized: pipeline.ReadQuantized,
                 read_centroids: pipeline.ReadCentroids,
                 settings: pipeline.CommitSettings, lock_timeout: float,
                 user_name: str | None = None, user_email: str | None = None) -> None:
        self.blobs = blobs
        self.refs = refs
        self.maintenance = maintenance
        self.odb = odb
        self.read_quantized = read_quantized
        self.read_centroids = read_centroids
        self.settings = settings
        self.lock_timeout = lock_timeout
        self.user_name = user_name
        self.user_email = user_email

    # ------------------------------------------------------------------ before the lock
    def target(self) -> tuple[str, str | None]:
        """(the ref the commit moves, its current value): the parent a plan starts from.
        Only a hint outside the lock: `commit` reads it again under it."""
        return commit_target(self.refs)

    def parent(self, cid: str | None, records: bool = True) -> pipeline.ParentInfo:
        """The commit `cid` as a parent (None: an unborn branch); `records=False` skips reading
        its snapshot (an exact commit needs only the id)."""
        if cid is None:
            return pipeline.ParentInfo()
        if not records:
            return pipeline.ParentInfo(cid)
        c = self.odb.read_commit(cid)
        return pipeline.ParentInfo.of(cid, c, c.snapshot, self.odb.read_snapshot(c.snapshot))

    def info(self, message: str, *, step: int | None = None,
             metrics: Mapping[str, float] | None = None) -> pipeline.CommitInfo:
        """What the commit object says besides its tensors: `message`, `step`, `metrics`, the
        author and the code's provenance (the git state of the working directory), read now."""
        return pipeline.CommitInfo(
            message=message, author=author(self.user_name, self.user_email), step=step,
            metrics=dict(metrics or {}), provenance=code_provenance(os.getcwd()))

    def write(self, plan: pipeline.WritePlan, names: Iterable[str], *,
              bases: pipeline.Bases | None = None,
              progress: Progress | None = None) -> list[TensorRecord]:
        """`pipeline.write` into this repository's blob store (no lock: idempotent)."""
        return pipeline.write(plan, names, blobs=self.blobs, read_quantized=self.read_quantized,
                              bases=bases, progress=progress)

    # ------------------------------------------------------------------ under the lock
    def commit(self, plan: pipeline.CommitPlan, info: pipeline.CommitInfo, *,
               bases: pipeline.Bases | None = None, progress: Progress | None = None,
               allow_empty: bool = True) -> Published:
        """Write `plan` and publish it on the branch as it is once the write lock is held.

        The plan was made against the branch's head read before the lock (a hint); under
        the lock the head is read again, and a lossy plan (or any plan whose parent moved)
        is written against the records read then: deltas are made against them.

        `allow_empty=False`: when the snapshot would be exactly the head's, nothing is
        published and `NothingToCommitError` is raised (git's "nothing to commit")."""
        with self.maintenance.write_lock(self.lock_timeout):
            ref, parent = self.target()
            lossy = bool(plan.write.quantized)
            if lossy or parent != plan.manifest.parent:
                plan = plan.against(self.parent(parent, lossy))
            records = self.write(plan.write, plan.write.names, bases=bases, progress=progress)
            # Compared under the lock, against the head read under it: a commit landing
            # meanwhile cannot make an unchanged state look changed, or the reverse.
            if not allow_empty and parent is not None and self._is_snapshot_of(parent, plan.manifest, records):
                raise NothingToCommitError(parent)
            cid, sid = pipeline.publish(plan.manifest, records, info, blobs=self.blobs,
                                        refs=self.refs, ref=ref)
        return Published(cid, sid)

    def publish(self, manifest: pipeline.Manifest, records: Iterable[TensorRecord],
                info: pipeline.CommitInfo, *, ref: str, again: bool = False,
                landed: Callable[[Published], None] | None = None,
                allow_empty: bool = True) -> Published:
        """Publish records written earlier (by any number of writers) under the write lock:
        `ref` moves from the manifest's parent to the new commit, or `RefConflictError`.

        `again`: the parent may be an earlier attempt of this very commit (its outcome was
        lost): when `ref` is still at it and its snapshot is exactly the one this would
        write, no commit is made (`Published.reused`).  `landed` is called under the lock
        the moment the commit point has passed, before anything else can fail.
        `allow_empty=False`: a snapshot exactly the parent's (and not a retry's, above) is
        `NothingToCommitError`, as for `commit`."""
        records = list(records)
        with self.maintenance.write_lock(self.lock_timeout):
            head = manifest.parent
            sid = self._same_as(head, ref, manifest, records) if again else None
            if head is not None and sid is not None:
                out = Published(head, sid, reused=True)
            elif not allow_empty and head is not None and self.refs.read_ref(ref) == head \
                    and self._is_snapshot_of(head, manifest, records):
                raise NothingToCommitError(head)
            else:
                out = Published(*pipeline.publish(manifest, records, info, blobs=self.blobs,
                                                  refs=self.refs, ref=ref))
            if landed is not None:
                landed(out)
        return out

    def _is_snapshot_of(self, head: str, manifest: pipeline.Manifest,
                        records: list[TensorRecord]) -> bool:
        """Whether `publish` would write exactly `head`'s snapshot (the one its commit names,
        or the identical re-encoding gc replaced it by, which a plan against it reuses)."""
        sid = object_id(checked_encoding(pipeline.snapshot_of(manifest, records)))
        named = self.odb.read_commit(head).snapshot
        return sid in (named, self.odb.resolve_snapshot_id(named))

    def _same_as(self, head: str | None, ref: str, manifest: pipeline.Manifest,
                 records: list[TensorRecord]) -> str | None:
        """`head`'s snapshot id when `ref` is still at `head` and that snapshot is exactly the
        one `publish` would write; else None (call under the write lock)."""
        if head is None or self.refs.read_ref(ref) != head:
            return None   # publish then refuses, or makes the commit, with its own checks
        try:
            snap = pipeline.snapshot_of(manifest, records)
        except pipeline.IncompleteCommitError:
            return None
        sid = self.odb.read_commit(head).snapshot
        return sid if object_id(snap.encode()) == sid else None
