"""Fetching part of a remote's history: `mvc clone --depth N`, `mvc fetch REMOTE REV`, and
completing a shallow repository again (`mvc fetch --unshallow`, or any full fetch).

What a shallow fetch takes is one call of the walker, `ObjectDB.reachable(tips, depth=N)`:
the newest N commits (N generations) of each ref it takes and, for each, everything its
snapshot needs to restore -- its chunks, gc's replacement of it, and the snapshots its delta
records are encoded against, with theirs, down to the bases.  Those delta parents are older
commits' snapshots: they always come along, so a commit held here restores exactly as it
does on the remote, and fsck and gc find every object a held snapshot names.  The commits
before the N are not fetched; the oldest ones fetched are marked as the boundary
(`mvc.repo.shallow`), which every walk of history stops at.

Reads are exact (`exact_reads`): a shallow fetch asks for the bytes of the objects it
takes, not the neighbours a full fetch reads along in one request.

The rest of `fetch` (trust in the remote's refs, replacements, the order objects are
stored in) is `mvc.remote.transfer`'s, unchanged: this module chooses the refs, sizes the
walk and keeps the boundary marks.
"""
from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from mvc.errors import UsageError
from mvc.repo import refs as R
from mvc.repo import shallow
from mvc.repo.objectdb import ObjectDB, Reached
from mvc.repo.refops import RefOps
from mvc.repo.revparse import UnknownRevisionError
from mvc.repo.shallow import BeyondShallowError
from mvc.remote.remote_refs import BadRemoteRefError, RemoteRefs, check_named
from mvc.store import ANY, BlobStore, MemoryRefStore, ObjectMissingError, RefStore
from mvc.store.objstore import Remote

#: The ref a fetch of one revision leaves its commit in (as git's), so that gc keeps it and
#: `mvc checkout FETCH_HEAD` finds it.
FETCH_HEAD = R.FETCH_HEAD


class BadDepthError(UsageError):
    """A shallow fetch's depth that is not a whole number of commits, 1 or more."""

    exit_code = 181


class UnknownRemoteRevisionError(UsageError):
    """A revision the remote has no branch, tag or commit of."""

    exit_code = 182


@dataclass(frozen=True)
class Want:
    """What a fetch takes of a remote: every branch and tag (the default), the remote's
    default branch only (`default_branch`: ``main``, else its first; `clone --depth`), or
    one revision (`rev`: a branch, a tag, a full ref name or a full commit id); and how
    deep (`depth` commits of each; None: the whole history)."""

    depth: int | None = None
    rev: str | None = None
    default_branch: bool = False

    def __post_init__(self) -> None:
        check_depth(self.depth)

    @property
    def partial(self) -> bool:
        """Whether the fetch may leave history out (and so reads exactly)."""
        return self.depth is not None


def check_depth(depth: int | None) -> None:
    """`BadDepthError` unless `depth` is None or a whole number >= 1."""
    if depth is not None and (isinstance(depth, bool) or not isinstance(depth, int) or depth < 1):
        raise BadDepthError(f"--depth {depth!r}: a shallow fetch takes 1 or more commits "
                            "(the newest N of each branch it fetches)")


def exact_reads(remote: Remote) -> None:
    """Make `remote`'s reads bring only the objects asked for: no neighbouring objects of a
    pack in the same request (a full fetch reads them along, saving requests; a shallow one
    wants none of them)."""
    remote.blobs.window = 0
    remote.blobs.gap = 0


def default_branch(heads: Iterable[str]) -> str | None:
    """The branch a clone puts HEAD on: ``main``, else the first by name (a full ref name)."""
    branches = sorted(h for h in heads if h.startswith(R.HEADS))
    if R.HEADS + "main" in branches:
        return R.HEADS + "main"
    return branches[0] if branches else None


def select(want: Want, found: RemoteRefs, remote_odb: ObjectDB, name: str) -> None:
    """Narrow `found.heads` (the remote's good branches and tags) to what `want` takes; a
    revision given as a commit id is taken as `FETCH_HEAD`.  `UnknownRemoteRevisionError`
    for a revision the remote does not have, `BadRemoteRefError` for one it skipped."""
    if want.rev is None:
        if want.default_branch:
            ref = default_branch(found.heads)
            found.heads = {} if ref is None else {ref: found.heads[ref]}
        return
    rev = want.rev
    candidates = [rev] if rev.startswith("refs/") else [R.HEADS + rev, R.TAGS + rev]
    for ref in candidates:
        check_named(found.skipped, ref, name)
        if ref in found.heads:
            found.heads = {ref: found.heads[ref]}
            return
    found.heads = {FETCH_HEAD: resolve_remote(found, remote_odb, rev, name)}


def resolve_remote(found: RemoteRefs, remote_odb: ObjectDB, rev: str, name: str) -> str:
    """The commit `rev` names on the remote, spelled as in a repository (``main~3``, a full id
    or a prefix -- which lists the remote's objects --, ``v1^``); ``HEAD`` is the remote's
    default branch.  `UnknownRemoteRevisionError` if it names none."""
    refs = MemoryRefStore()
    for ref, value in sorted(found.heads.items()):
        if ref.startswith((R.HEADS, R.TAGS)):
            refs.update_ref(ref, None, value, "remote")
    branch = default_branch(found.heads)
    if branch is not None:
        refs.update_ref(R.HEAD, None, R.SYMREF + branch, "remote")
    try:
        return RefOps(refs, ObjectDB(remote_odb.blobs, refs)).resolve(rev)
    except (UnknownRevisionError, BeyondShallowError, ObjectMissingError):
        pass
    raise UnknownRemoteRevisionError(
        f"the remote {name!r} has no branch, tag or commit {rev!r} (`mvc branch -r` lists the "
        "branches a fetch saw there)")


def check_walked(want: Want, chosen: Iterable[str], found: RemoteRefs, name: str) -> None:
    """`BadRemoteRefError` when the revision a fetch was asked for (`chosen`: the ref `select`
    took for it) was skipped by the walk: its history on the remote cannot be read."""
    for ref in chosen:
        if want.rev is not None and ref in found.skipped:
            raise BadRemoteRefError(f"{want.rev!r} on the remote {name!r} cannot be fetched: "
                                    f"{found.skipped[ref]}")


def boundary(walked: list[Reached], has: BlobStore) -> set[str]:
    """The commits of a walk whose parents neither the walk nor `has` holds: the shallow
    boundary a fetch of them leaves (marked before they are stored)."""
    commits = {r.oid: r.obj for r in walked if r.kind == "commit"}
    return {cid for cid, c in commits.items()
            if any(p not in commits and not has.has(p) for p in getattr(c, "parents", ()))}


def settle_after(local: ObjectDB, refs: RefStore, walked: list[Reached],
                 reason: str) -> tuple[set[str], set[str]]:
    """After a fetch stored `walked`: the boundary marks as the stored commits now say
    (`mvc.repo.shallow.settle`), for the commits fetched and those marked before.
    Returns (marked, unmarked)."""
    raw = {r.oid: list(getattr(r.obj, "parents", ())) for r in walked if r.kind == "commit"}
    for cid in local.shallow_ids() - raw.keys():
        if local.blobs.has(cid):
            raw[cid] = local.read_commit(cid, graft=False).parents
    return shallow.settle(refs, raw.items(), local.blobs.has, reason)


def record_fetch_head(refs: RefStore, want: Want, found: RemoteRefs, reason: str) -> str | None:
    """Point `FETCH_HEAD` at the commit a fetch of one revision took (None: no such fetch)."""
    if want.rev is None or not found.heads:
        return None
    [value] = found.heads.values()
    if refs.read_ref(FETCH_HEAD) != value:
        refs.update_ref(FETCH_HEAD, ANY, value, reason)
    return value
