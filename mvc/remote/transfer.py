"""Push and fetch: move the objects the other side lacks, then its refs, by compare-and-swap.

What to send is one call of the reachability walker (`ObjectDB.reachable`)
from the refs being sent, with `have` = what the other side already holds:

* **push**: `have` is the history of the remote's branch and tag values that
  this repository knows -- a side that has a commit has its whole history,
  because objects are always stored before the ref that reaches them (here as
  everywhere) -- found by `mvc.remote.negotiate` without walking all of it, plus
  the snapshots and chunks the new commits sit on.  The remote is asked only
  about what the walk then yields (`mvc.store.objstore.presence`: the packs of
  unfinished pushes, a HEAD per loose candidate), so the objects of a killed
  push are not sent again and a push costs what it sends, whatever the remote
  holds.
* **fetch**: `have` is the local store itself (`has`), for the same reason:
  fetched objects are stored chunks first, then snapshots, then commits
  parents first, so a commit stored here always has its history.

The walk follows delta parents and gc's replacement snapshots; a replacement
travels with its ``refs/replace/`` ref, written after the objects.  A fetch does
not trust what it reads (`mvc.remote.remote_refs`): bad refs are skipped with a
warning, and a remote's replacement or pruned mark never changes what a commit
already readable here restores.

Consistency on storage without transactions: every object is uploaded (and
every upload has finished) before any ref moves; each ref then moves by one
compare-and-swap from the value read before the upload.  A push killed at any
moment leaves the remote's refs pointing at complete histories; a pusher that
lost a race gets `NonFastForwardError` and nothing of its own is referenced.
"""
from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field

from mvc.errors import MvcError, UsageError
from mvc.progress import NO_PROGRESS, Progress
from mvc.remote.config import REMOTES
from mvc.remote.negotiate import known_chunks, remote_history
from mvc.repo import refs as R
from mvc.repo.objectdb import ObjectDB, Reached
from mvc.repo.pruned import PRUNED, pruned_ids
from mvc.remote.remote_refs import (
    RemoteRefs,
    plan_replacements,
    read_remote_refs,
    usable_head,
    walk_heads,
    walk_view,
)
from mvc.remote.shallow import (
    FETCH_HEAD,
    Want,
    boundary,
    check_walked,
    exact_reads,
    record_fetch_head,
    select,
    settle_after,
)
from mvc.repo import shallow
from mvc.repo.replace import REPLACE
from mvc.repo.replace_verify import VERIFIED, replacement_differs
from mvc.store import ANY, BlobStore, RefConflictError, RefStore
from mvc.store.base import BytesLike
from mvc.store.objstore import Remote
from mvc.store.objstore.presence import begin_upload, end_upload, forgettable, present

#: Objects are read and sent in batches of about this many bytes (bounded memory).
BATCH_BYTES = 256 << 20


class NonFastForwardError(MvcError):
    """A push or pull that would drop commits: the remote branch moved on (fetch first, or
    push --force), or the branches diverged."""

    exit_code = 142


class ShallowPushError(UsageError):
    """A push from a shallow repository that would leave the remote a commit without its
    history (the remote lacks a commit at this repository's shallow boundary)."""

    exit_code = 183


@dataclass
class RefResult:
    """What happened to one ref: `status` is "up to date", "new", "fast-forward" or "forced"."""

    ref: str
    old: str | None
    new: str | None
    status: str


@dataclass
class TransferReport:
    """Objects and bytes moved (`sent` / `fetched`), objects already there, and the refs."""

    objects: int = 0
    bytes: int = 0
    skipped: int = 0
    refs: list[RefResult] = field(default_factory=list)
    #: Remote refs a fetch left out, and why (`mvc.remote.remote_refs`).
    skipped_refs: dict[str, str] = field(default_factory=dict)
    #: A fetch's: the shallow boundary after it (empty: the history is complete), and the
    #: commits whose parents it brought (their marks removed).
    shallow: set[str] = field(default_factory=set)
    unshallowed: set[str] = field(default_factory=set)
    #: The commit a fetch of one revision took (`FETCH_HEAD`).
    fetch_head: str | None = None


def is_ancestor(odb: ObjectDB, old: str, new: str) -> bool:
    """Whether commit `old` is `new` or in its history (through `odb`'s one walker)."""
    return any(c.id == old for c in odb.walk_commits([new]))


def _batches(oids: Iterable[str], read: Callable[[str], bytes]) -> Iterator[list[bytes]]:
    batch: list[bytes] = []
    size = 0
    for oid in oids:
        data = read(oid)
        batch.append(data)
        size += len(data)
        if size >= BATCH_BYTES:
            yield batch
            batch, size = [], 0
    if batch:
        yield batch


def _dependency_order(reached: list[Reached]) -> tuple[list[str], list[str], list[str]]:
    """(chunks, snapshots, commits) of a walk: snapshots in reverse walk order (a delta
    parent before the snapshot encoded against it), commits parents first."""
    chunks = [r.oid for r in reached if r.kind == "chunk"]
    snaps = [r.oid for r in reversed(reached) if r.kind == "snapshot"]
    commits = {r.oid: r.obj for r in reached if r.kind == "commit"}
    order: list[str] = []
    done: set[str] = set()
    for cid in sorted(commits):
        stack = [(cid, False)]
        while stack:
            c, expanded = stack.pop()
            if c in done:
                continue
            if expanded:
                done.add(c)
                order.append(c)
                continue
            stack.append((c, True))
            obj = commits[c]
            for p in getattr(obj, "parents", ()):
                if p in commits and p not in done:
                    stack.append((p, False))
    return chunks, snaps, order


# ---------------------------------------------------------------------------- push
def push(odb: ObjectDB, remote: Remote, updates: dict[str, str], *, force: bool = False,
         progress: Progress = NO_PROGRESS) -> TransferReport:
    """Send `updates` (remote ref name -> local commit id) to `remote`.

    A ref that exists on the remote moves only forward (its value in the new
    commit's history; a tag not at all) unless `force`; otherwise
    `NonFastForwardError` is raised before anything is sent.  The objects the
    remote lacks go first, then the refs, each by compare-and-swap from the
    value seen at the start (`force`: whatever it holds then).
    """
    remote.ensure_format()
    # Branches and tags only: refs/replace/ and refs/pruned/ grow with the history.
    remote_refs = {n: v for prefix in (R.HEADS, R.TAGS) for n, v in remote.refs.iter_refs(prefix)}
    for ref in updates:
        if ref not in remote_refs and not ref.startswith((R.HEADS, R.TAGS)):
            value = remote.refs.read_ref(ref)
            if value is not None:
                remote_refs[ref] = value
    report = TransferReport()
    todo: dict[str, tuple[str | None, str]] = {}
    rejected: list[str] = []
    for ref, new in sorted(updates.items()):
        old = remote_refs.get(ref)
        if old == new:
            report.refs.append(RefResult(ref, old, new, "up to date"))
            continue
        if old is not None and not force:
            if ref.startswith(R.TAGS) or not odb.is_commit(old) or not is_ancestor(odb, old, new):
                rejected.append(ref)
                continue
        todo[ref] = (old, new)
    if rejected:
        raise NonFastForwardError(
            f"rejected {', '.join(rejected)}: the remote holds commits this repository does not "
            "have there (fetch and look, or push --force to overwrite)")
    if not todo:
        return report
    had = {v for n, v in remote_refs.items() if usable_head(n, v) and odb.is_commit(v)}
    # The snapshots of those commits too: a new commit's deltas are encoded against its
    # parent's snapshot, and the walk need not go down that delta chain again. (Objects merely
    # present on the remote are no `have`: a killed push may have left a snapshot there without
    # its delta parents; they are only not sent again.)
    tips = [new for _, new in todo.values()]
    history = remote_history(odb, had, tips)
    have = (history.have | {odb.read_commit(c).snapshot for c in had}
            | known_chunks(odb, remote.refs, history.boundary))
    progress.phase("finding objects to send", unit="objects")
    reached = []
    for r in odb.reachable(tips, have=have):
        reached.append(r)
        progress.advance(items=1)
    there = present(remote.blobs, {r.oid: odb.blobs.size(r.oid) for r in reached})
    progress.end()
    missing = [r for r in reached if r.oid not in there.found]
    cut = sorted(odb.shallow_ids() & {r.oid for r in missing if r.kind == "commit"})
    if cut:
        raise ShallowPushError(
            f"push to {remote.url}: commit {cut[0][:12]} is a shallow boundary here (its parents "
            "were never fetched) and the remote lacks it, so it would get a commit without its "
            "history; `mvc fetch --unshallow` first, or push to the remote this was fetched from")
    report.skipped = len(reached) - len(missing)
    chunks, snaps, commits = _dependency_order(missing)
    total = sum(odb.blobs.size(o) for o in chunks + snaps + commits)
    progress.phase(f"pushing to {remote.url}", total_bytes=total,
                   total_items=len(missing), unit="objects")
    # The marker before any object: a resumed push finds this one's packs by it.
    upload = begin_upload(remote.storage) if missing else None
    # Chunks, then snapshots, then commits, each group's uploads all finished before the next.
    for group in (chunks, snaps, commits):
        for batch in _batches(group, odb.blobs.get):
            # The bar moves as each upload lands, not once per (up to 256 MiB) batch.
            remote.blobs.put_many(batch, on_stored=progress.advance, upload=upload)
            report.objects += len(batch)
            report.bytes += sum(len(b) for b in batch)
    progress.end()
    # Every replacement and pruned mark the walk passed, sent or not: a killed push may have
    # left the objects there without them, and a branch must not reach a commit before they
    # say how to read it.
    for ref, value in _side_refs(reached, pruned_ids(odb.refs)):
        if remote.refs.read_ref(ref) is None:
            try:
                remote.refs.update_ref(ref, None, value, "push")
            except RefConflictError:
                pass  # a replacement of its own there: an equally valid re-encoding
    for ref, (old, new) in todo.items():
        try:
            remote.refs.update_ref(ref, ANY if force else old, new, "push")
        except RefConflictError as exc:
            raise NonFastForwardError(
                f"rejected {ref}: it changed on the remote while pushing (now {exc.actual}); "
                "fetch and look, then push again") from None
        status = "new" if old is None else ("forced" if force and old is not None
                                            and not (odb.is_commit(old) and is_ancestor(odb, old, new))
                                            else "fast-forward")
        report.refs.append(RefResult(ref, old, new, status))
    # The refs reach all of it now. (Kept on a failure: the retry finds the packs by it.)
    for uid in ([upload] if upload else []) + forgettable(there, [r.oid for r in reached]):
        end_upload(remote.storage, uid)
    return report


# ---------------------------------------------------------------------------- fetch
def fetch(blobs: BlobStore, refs: RefStore, remote: Remote, name: str, *,
          lock: AbstractContextManager[None] | None = None,
          progress: Progress = NO_PROGRESS, want: Want = Want()) -> TransferReport:
    """Copy what `remote`'s branches and tags reach into `blobs`, then set
    ``refs/remotes/<name>/<branch>`` to each remote branch and create each remote tag
    that is not here (an existing tag is never moved).  `lock`: held while writing.

    The remote is not trusted (`mvc.remote.remote_refs`): a bad ref is skipped with a
    warning (`TransferReport.skipped_refs`), a replacement is adopted only once it is
    checked to restore what it replaces (or is the only copy of a checkpoint not held
    here), and a pruned mark only for a commit not held here.

    `want` (`mvc.remote.shallow.Want`): only the default branch or one revision (a commit
    id is kept as `FETCH_HEAD`), and only the newest `want.depth` commits of each, with
    every object their snapshots need; the commits left without their parents are marked
    as this repository's shallow boundary.  Any fetch that brings a marked commit's parents
    removes its mark (a full fetch completes a shallow repository)."""
    report = TransferReport()
    remote.storage.check_exists()  # a mistyped directory or bucket is an error, not "empty"
    if not remote.check_format():
        if want.rev is not None:
            select(want, RemoteRefs(), ObjectDB(remote.blobs, refs), name)  # says: no such rev
        return report  # an empty remote
    if want.partial:
        exact_reads(remote)
    local = ObjectDB(blobs, refs)
    # The remote's refs read once (a listing and parallel GETs) into memory: the walk looks
    # up refs/replace/<snapshot> for every snapshot, which would be a request each.
    found = read_remote_refs(remote, refs, blobs)
    view = walk_view(found, refs)
    remote_odb = ObjectDB(remote.blobs, view)
    select(want, found, remote_odb, name)
    chosen = list(found.heads)
    progress.phase(f"finding objects in {remote.url}", unit="objects")
    walked = walk_heads(remote_odb, local, found, depth=want.depth)
    check_walked(want, chosen, found, name)
    plan = plan_replacements(remote, view, local, found, walked)
    progress.end()
    chunks, snaps, commits = _dependency_order(walked)
    more_chunks, more_snaps, _ = _dependency_order(plan.reached)
    chunks = [c for c in chunks if c not in plan.unavailable] + more_chunks
    reached = walked + plan.reached
    with lock if lock is not None else nullcontext():
        progress.phase(f"fetching from {remote.url}", total_items=len(reached), unit="objects")
        # In bounded batches, in any order: nothing refers to a chunk yet. A chunk larger
        # than one read range comes as a view of its verified spool file, not as bytes.
        batch: list[BytesLike] = []
        size = 0
        for _, data in remote.blobs.get_many(chunks, views=True):
            batch.append(data)
            size += len(data)
            if size >= BATCH_BYTES:
                _store(blobs, batch, report, progress)
                batch, size = [], 0
        _store(blobs, batch, report, progress)
        # Then in dependency order: snapshots (an original whose replacement is the only
        # copy after that replacement's ref), the replacements checked, pruned marks,
        # commits. A snapshot or commit stored here is complete, which is what makes
        # `have=blobs.has` sound for the next fetch after a killed one.
        got = dict(remote.blobs.get_many(snaps + more_snaps + commits))
        _store(blobs, [got[o] for o in snaps if o not in plan.only_copy], report, progress)
        _store(blobs, [got[o] for o in more_snaps], report, progress)
        for sid, target in plan.only_copy.items():
            refs.update_ref(REPLACE + sid, None, target,
                            f"fetch: {name} (its original is not on the remote: unverified)")
        _store(blobs, [got[o] for o in snaps if o in plan.only_copy], report, progress)
        for sid, target in plan.to_verify.items():
            why = replacement_differs(local, sid, target)
            if why is None:
                refs.update_ref(REPLACE + sid, None, target, f"fetch: {name} {VERIFIED}")
            else:
                found.skip(REPLACE + sid, f"refused: replacement {target} {why}")
        fetched = set(commits)
        for cid in sorted(found.pruned & fetched):
            if refs.read_ref(PRUNED + cid) is None:
                refs.update_ref(PRUNED + cid, None, cid, f"fetch: {name}")
        # The boundary's marks before its commits: a commit stored here either has its
        # history or says it does not (mvc.repo.shallow).
        shallow.mark(refs, boundary(walked, blobs), f"fetch: {name} (shallow)")
        _store(blobs, [got[o] for o in commits if not blobs.has(o)], report, progress)
        report.unshallowed = settle_after(local, refs, walked, f"fetch: {name}")[1]
        report.shallow = local.shallow_ids()
        progress.end()
        report.fetch_head = record_fetch_head(refs, want, found, f"fetch: {name} {want.rev}")
        for ref, value in sorted(found.heads.items()):
            if ref == FETCH_HEAD:
                continue
            if ref.startswith(R.HEADS):
                tracking = f"{REMOTES}{name}/{ref[len(R.HEADS):]}"
                old = refs.read_ref(tracking)
                if old != value:
                    refs.update_ref(tracking, ANY, value, f"fetch: {name}")
                    report.refs.append(RefResult(tracking, old, value, "new" if old is None else "updated"))
            elif refs.read_ref(ref) is None:
                try:
                    refs.update_ref(ref, None, value, f"fetch: {name}")
                    report.refs.append(RefResult(ref, None, value, "new"))
                except RefConflictError:
                    pass
    report.skipped_refs = dict(found.skipped)
    return report


def _side_refs(reached: list[Reached], pruned: set[str]) -> list[tuple[str, str]]:
    """The refs that say how to read what a walk reached: gc's replacements
    (``refs/replace/<original>`` -> replacement) and retention's marks on pruned commits."""
    out = [(REPLACE + r.replaces, r.oid) for r in reached if r.replaces is not None]
    out += [(PRUNED + r.oid, r.oid) for r in reached if r.kind == "commit" and r.oid in pruned]
    return out


def _store(blobs: BlobStore, batch: Sequence[BytesLike], report: TransferReport, progress: Progress) -> None:
    if not batch:
        return
    blobs.put_many(batch)
    n = sum(len(b) for b in batch)
    report.objects += len(batch)
    report.bytes += n
    progress.advance(n, len(batch))
