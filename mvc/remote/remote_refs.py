"""What a fetch takes of a remote's refs: a remote is untrusted (DESIGN.md, invariant 8).

* **Bad refs are skipped, one by one.** A ref record that does not decode, a name
  this repository cannot hold, a branch or tag whose history cannot be read (a
  missing or corrupt commit, a tag naming a snapshot) is left out with a warning
  naming it; the good refs are fetched.  Only a ref the user asked for by name
  (`mvc pull BRANCH`) makes its command fail (`BadRemoteRefError`).
* **A replacement changes nothing already readable.** ``refs/replace/S -> T``
  from a remote is adopted only after this repository has restored both S and T
  and found every tensor bit-identical (`mvc.repo.replace_verify`), when S's data
  can be had here or from the remote.  When it cannot (a history gc'd before it
  was pushed), T is the only copy of that checkpoint: it is adopted, marked
  unverified, for a commit this repository did not hold before; gc keeps what an
  unverified replacement's original reaches.  A replacement already here is never
  moved by a fetch.
* **A pruned mark never hides a commit held here.** ``refs/pruned/C`` is taken
  only for a commit this repository does not hold.
"""
from __future__ import annotations

import warnings
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from mvc.errors import DataError, MvcError, MvcWarning
from mvc.repo import refs as R
from mvc.repo.objectdb import ObjectDB, Reached
from mvc.repo.pruned import PRUNED
from mvc.repo.replace import OID, REPLACE
from mvc.store import BlobStore, MemoryRefStore, RefStore
from mvc.store.objstore import Remote


class BadRemoteRefError(DataError):
    """A ref asked for by name is damaged on the remote (its record, its name, or the
    history it names cannot be read); fetch skipped it."""

    exit_code = 178


@dataclass
class RemoteRefs:
    """The refs a fetch takes, with what it skipped and why (``ref: reason`` lines)."""

    #: Branches and tags whose whole history reads: ``refs/heads/...``/``refs/tags/...`` -> commit.
    heads: dict[str, str] = field(default_factory=dict)
    #: Original snapshot -> replacement, as the remote has them (not yet checked).
    replacements: dict[str, str] = field(default_factory=dict)
    #: Commits the remote marks pruned that this repository does not hold.
    pruned: set[str] = field(default_factory=set)
    skipped: dict[str, str] = field(default_factory=dict)

    def skip(self, ref: str, reason: str) -> None:
        """Leave `ref` out, with a warning naming it."""
        self.skipped[ref] = reason
        warnings.warn(f"fetch: skipped {ref!r}: {reason}", MvcWarning, stacklevel=3)


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def read_remote_refs(remote: Remote, local: RefStore, blobs: BlobStore) -> RemoteRefs:
    """The remote's refs as a fetch into `blobs`/`local` may take them (the module doc):
    every record read once, the undecodable and unholdable skipped."""
    out = RemoteRefs()
    raw: list[tuple[str, str]] = []
    for name, value in remote.refs.iter_refs("refs/", on_corrupt=lambda e: out.skip(
            getattr(e, "name", "a ref"), _first_line(e))):
        raw.append((name, value))
    held = MemoryRefStore()  # its checks are the ones every ref store applies
    for name, value in raw:
        try:
            held.update_ref(name, None, value, "fetch")
        except MvcError as exc:
            if name.startswith((R.HEADS, R.TAGS, REPLACE, PRUNED)):
                out.skip(name, _first_line(exc))
            continue
        if name.startswith((R.HEADS, R.TAGS)):
            why = _unusable(name, value)
            if why is None:
                out.heads[name] = value
            else:
                out.skip(name, why)
        elif name.startswith(REPLACE):
            sid = name[len(REPLACE):]
            if OID.fullmatch(sid) and OID.fullmatch(value) and sid != value:
                out.replacements[sid] = value
            else:
                out.skip(name, "not a replacement of one snapshot id by another")
        elif name.startswith(PRUNED):
            cid = name[len(PRUNED):]
            if not OID.fullmatch(cid):
                out.skip(name, "not a commit id")
            elif blobs.has(cid):
                if local.read_ref(name) is None:
                    out.skip(name, f"commit {cid[:12]} is held here: a remote cannot prune it")
            else:
                out.pruned.add(cid)
    return out


def usable_head(name: str, value: str) -> bool:
    """Whether `name` is a branch or tag this repository can hold and `value` a commit id
    (anything else a remote holds -- another mvc's refs, a hand-made key -- is left there)."""
    return name.startswith((R.HEADS, R.TAGS)) and _unusable(name, value) is None


def _unusable(name: str, value: str) -> str | None:
    """Why a remote branch or tag cannot be taken (None: it can, as far as its name goes)."""
    prefix, kind = (R.HEADS, "branch") if name.startswith(R.HEADS) else (R.TAGS, "tag")
    try:
        R.check_ref_name(name[len(prefix):], kind)
    except R.RefNameError as exc:
        return _first_line(exc)
    if R.is_symbolic(value) or not OID.fullmatch(value):
        return f"names {value!r}, not a commit id"
    return None


def walk_heads(remote_odb: ObjectDB, local: ObjectDB, found: RemoteRefs, *,
               depth: int | None = None) -> list[Reached]:
    """Everything the remote's good branches and tags reach that `local` lacks, one ref
    at a time: a ref whose history cannot be read is skipped (and taken out of
    `found.heads`), the others are walked as usual.  Only a whole walk's objects count as
    held for the next ref, so one bad ref never vouches for another's history.

    `depth`: the newest `depth` commits of each ref only (`mvc.remote.shallow`).  The
    commits at `local`'s shallow boundary, and those above it, are walked through, not taken
    as held with their history: a fetch that reaches them brings the parents they lack."""
    reached: list[Reached] = []
    ids: set[str] = set()
    kinds: dict[str, str] = {}
    partial = _incomplete(local, found.heads.values())

    def had(oid: str) -> bool:
        return oid in ids or (oid not in partial and local.blobs.has(oid))

    for ref, value in sorted(found.heads.items()):
        try:
            # A value already walked or held is not read again: it must be a commit there.
            if kinds.get(value, "commit") != "commit" or (
                    value not in kinds and local.blobs.has(value) and not local.is_commit(value)):
                raise DataError(f"it names {value}, which is not a commit")
            got = list(remote_odb.reachable([value], have=had, depth=depth))
        except DataError as exc:
            del found.heads[ref]
            found.skip(ref, _first_line(exc))
            continue
        reached += got
        ids.update(r.oid for r in got)
        kinds.update((r.oid, r.kind) for r in got)
    return reached


def _incomplete(local: ObjectDB, tips: Iterable[str]) -> set[str]:
    """The commits held here whose history stops at the shallow boundary (the boundary
    included): a fetch walks through them rather than taking them as held with their history.
    Empty in a complete repository.  Walked from every root here and the remote's `tips`
    that are held (commits only: a shallow repository's history is short)."""
    boundary = local.shallow_ids()
    if not boundary:
        return set()
    roots = local.root_ids() | {t for t in tips if local.blobs.has(t)}
    out: set[str] = set()
    for c in local.walk_commits(roots, order="topo", on_damage=lambda _d: None):
        if c.id in boundary or any(p in out for p in c.parents):
            out.add(c.id)
    return out


@dataclass
class ReplacementPlan:
    """What a fetch does about the remote's replacements of snapshots it reads."""

    #: Original -> replacement to restore and compare once both are stored here.
    to_verify: dict[str, str] = field(default_factory=dict)
    #: Original -> replacement for originals whose data neither side has: adopted unverified.
    only_copy: dict[str, str] = field(default_factory=dict)
    #: What the replacements reach that the fetch must also bring (their closures).
    reached: list[Reached] = field(default_factory=list)
    #: Chunks of `only_copy` originals that the remote lacks: not to be fetched.
    unavailable: set[str] = field(default_factory=set)


def plan_replacements(remote: Remote, view: MemoryRefStore, local: ObjectDB, found: RemoteRefs,
                      walked: list[Reached]) -> ReplacementPlan:
    """Sort the remote's replacements of snapshots this fetch reads (or holds): those whose
    original can be restored here (held, or fully on the remote: then checked) and those
    that are the only copy; add what either needs that the walk did not reach.
    `view`: the refs the remote was walked through (`walk_view`)."""
    plan = ReplacementPlan()
    ids = {r.oid for r in walked}
    remote_has: set[str] | None = None
    for sid, target in sorted(found.replacements.items()):
        if local.refs.read_ref(REPLACE + sid) is not None or view.read_ref(REPLACE + sid) != target \
                or not (sid in ids or local.blobs.has(sid)):
            continue  # this repository's own replacement rules, or nothing here reads `sid`
        try:
            got = list(_closure(remote, view, [target], ids, local))
        except DataError as exc:
            found.skip(REPLACE + sid, f"its replacement {target} cannot be read ({_first_line(exc)})")
            continue
        plan.reached += got
        ids.update(r.oid for r in got)
        if local.blobs.has(sid):
            plan.to_verify[sid] = target
            continue
        # The original as itself: its own chunks and delta parents, if the remote has them all.
        try:
            orig: list[Reached] | None = list(
                _closure(remote, _without(view, REPLACE + sid), [sid], ids, local, keep=sid))
        except DataError:
            orig = None
        if orig is not None:
            if remote_has is None:
                remote_has = remote.blobs.known_ids()
            missing = {r.oid for r in orig if r.kind == "chunk" and r.oid not in remote_has}
            if missing:
                plan.unavailable |= missing
                orig = None
        if orig is None:
            plan.only_copy[sid] = target
        else:
            plan.to_verify[sid] = target
            plan.reached += [r for r in orig if r.oid not in ids]
            ids.update(r.oid for r in orig)
    return plan


def _closure(remote: Remote, view: RefStore, sids: list[str], ids: set[str], local: ObjectDB,
             keep: str | None = None) -> Iterable[Reached]:
    """What `sids` reach on the remote through `view`, less what is held or already
    walked (`keep`: walked, but to be read again as itself)."""
    def had(oid: str) -> bool:
        return oid != keep and (oid in ids or local.blobs.has(oid))

    return ObjectDB(remote.blobs, view).snapshot_closure(sids, have=had)


def _without(view: MemoryRefStore, name: str) -> MemoryRefStore:
    out = MemoryRefStore()
    for n, v in view.iter_refs(""):
        if n != name:
            out.update_ref(n, None, v, "fetch: view")
    return out


def walk_view(found: RemoteRefs, local: RefStore) -> MemoryRefStore:
    """The refs to walk the remote through: this repository's own replacements (a fetch
    reads a snapshot as it is read here), the remote's for the other snapshots (until they
    are checked: `plan_replacements`), and the pruned marks it takes."""
    view = MemoryRefStore()
    for name, value in local.iter_refs(REPLACE):
        view.update_ref(name, None, value, "fetch: local")
    for sid, target in found.replacements.items():
        if view.read_ref(REPLACE + sid) is None and target not in found.replacements:
            view.update_ref(REPLACE + sid, None, target, "fetch: remote")
    for cid in found.pruned:
        view.update_ref(PRUNED + cid, None, cid, "fetch: remote")
    return view


def check_named(skipped: Mapping[str, str], ref: str, remote: str) -> None:
    """`BadRemoteRefError` if `ref`, which the user asked for by name, is among the refs a
    fetch from `remote` skipped (`TransferReport.skipped_refs`)."""
    if ref in skipped:
        raise BadRemoteRefError(f"the remote {remote!r}'s {ref} is damaged and was not "
                                f"fetched: {skipped[ref]}")
