"""Branches, tags, HEAD and revisions: the ref porcelain `Repo` delegates to.

`RefOps` is composed of the ref store (the refs and their reflogs) and the object database
(what a revision's `~n` / `^n` walk and a branch delete's reachability check read).  It reads
no config and no tensors, so opening a repository to list or move refs never imports torch.
"""
from __future__ import annotations

import re
import warnings

from mvc.errors import MvcWarning
from mvc.repo import refs as R
from mvc.repo import shallow
from mvc.repo.objectdb import ObjectDB
from mvc.repo.revparse import UnknownRevisionError, check_spelling, resolve_base, split_suffixes
from mvc.store import (ANY, InvalidRefError, RefConflictError, RefStore, RefUpdate,
                       TransactionalRefStore)


#: A revision that can only be a commit id or id prefix.
_HEXISH = re.compile(r"[0-9a-f]{4,32}")


def commit_target(refs: RefStore) -> tuple[str, str | None]:
    """(the ref the next commit moves, its current value): HEAD's branch when HEAD is
    attached (the branch may be unborn: value None), else HEAD itself (detached)."""
    value = refs.read_ref(R.HEAD)
    if value is not None and R.is_symbolic(value):
        target = R.symbolic_target(value)
        return target, refs.read_ref(target)
    return R.HEAD, value


class RefOps:
    """Revision parsing and the branch / tag / HEAD commands over a ref store."""

    def __init__(self, refs: TransactionalRefStore, odb: ObjectDB) -> None:
        self.refs = refs
        self.odb = odb

    # ------------------------------------------------------------------ reading
    def resolve_ref(self, name: str, depth: int = 0) -> str | None:
        """The commit id ref `name` holds, following symbolic refs (None: unset or unborn)."""
        value = self.refs.read_ref(name)
        if value is None:
            return None
        if R.is_symbolic(value):
            if depth > 5:
                raise UnknownRevisionError(f"symbolic ref loop at {name}")
            return self.resolve_ref(R.symbolic_target(value), depth + 1)
        return value

    def resolve_rev(self, rev: str) -> tuple[str, str | None]:
        """(commit id, branch) for `rev`: the branch name when `rev` names a branch exactly as
        resolved (no suffix; `HEAD` counts as the branch it is attached to), else None."""
        check_spelling(rev)
        base, steps = split_suffixes(rev)
        try:
            oid, ref = resolve_base(base, read_ref=self.refs.read_ref, resolve_ref=self.resolve_ref,
                                    ids_with_prefix=self.odb.blobs.ids_with_prefix,
                                    is_commit=self.odb.is_commit, reflog=self.refs.reflog)
        except UnknownRevisionError:
            # An id this shallow repository lacks may be a commit behind its boundary.
            boundary = sorted(self.odb.shallow_ids())
            if boundary and _HEXISH.fullmatch(base.lower()):
                raise shallow.beyond(boundary[0], f"unknown revision {base!r} (it may be a commit before the boundary)") from None
            raise
        for op, n in steps:
            if op == "~":
                for _ in range(n):
                    parents = self.odb.read_commit(oid).parents
                    if not parents:
                        self._check_boundary(rev, oid)
                        raise UnknownRevisionError(f"{rev!r}: {oid[:12]} has no parent")
                    oid = parents[0]
            elif n:  # ^n: the n-th parent; ^0 is the commit itself
                parents = self.odb.read_commit(oid).parents
                if len(parents) < n:
                    self._check_boundary(rev, oid)
                    raise UnknownRevisionError(f"{rev!r}: {oid[:12]} has no parent #{n}")
                oid = parents[n - 1]
        branch = ref[len(R.HEADS):] if ref and ref.startswith(R.HEADS) and not steps else None
        return oid, branch

    def _check_boundary(self, rev: str, oid: str) -> None:
        """`BeyondShallowError` when `oid` has no parents here only because it is a shallow
        boundary (its parents were not fetched)."""
        if shallow.is_shallow(self.refs, oid):
            raise shallow.beyond(oid, f"{rev!r} goes past {oid[:12]}")

    def resolve(self, rev: str = "HEAD") -> str:
        """The commit id a revision names (see `Repo.resolve`)."""
        return self.resolve_rev(rev)[0]

    def head(self) -> str | None:
        """The commit HEAD points at, or None on an unborn branch."""
        return self.resolve_ref(R.HEAD)

    def current_branch(self) -> str | None:
        """The branch HEAD is attached to, or None when detached."""
        value = self.refs.read_ref(R.HEAD)
        if value is not None and R.is_symbolic(value) and R.symbolic_target(value).startswith(R.HEADS):
            return R.symbolic_target(value)[len(R.HEADS):]
        return None

    def commit_target(self) -> tuple[str, str | None]:
        """(the ref the next commit moves, its current value): see `commit_target`."""
        return commit_target(self.refs)

    def branches(self) -> list[tuple[str, str]]:
        """(name, commit id) of every branch, sorted by name."""
        return [(n[len(R.HEADS):], v) for n, v in self.refs.iter_refs(R.HEADS)]

    def tags(self) -> list[tuple[str, str]]:
        """(name, commit id) of every tag, sorted by name."""
        return [(n[len(R.TAGS):], v) for n, v in self.refs.iter_refs(R.TAGS)]

    def remote_branches(self, remote: str | None = None) -> list[tuple[str, str]]:
        """(``REMOTE/BRANCH``, commit id) of every remote-tracking branch (of `remote` only,
        if given), sorted by name: what fetch, push and clone recorded of the remotes'
        branches (``refs/remotes/``), usable as revisions but never moved by a commit."""
        prefix = R.REMOTES + (f"{remote}/" if remote is not None else "")
        return [(n[len(R.REMOTES):], v) for n, v in self.refs.iter_refs(prefix)
                if not R.is_symbolic(v)]

    # ------------------------------------------------------------------ creating and moving
    def branch(self, name: str, rev: str | None = None) -> str:
        """Create branch `name` at `rev` (default HEAD); returns the commit id."""
        R.check_ref_name(name, "branch")
        oid = self.resolve(rev or "HEAD")
        self._create_ref(R.HEADS + name, oid, f"branch: created from {rev or 'HEAD'}", "branch")
        return oid

    def move_branch(self, name: str, rev: str) -> str:
        """Point branch `name` at `rev`, creating it if needed; never the current branch."""
        R.check_ref_name(name, "branch")
        if name == self.current_branch():
            raise R.CurrentBranchError(f"cannot force-move branch {name!r}: HEAD is on it")
        oid = self.resolve(rev)
        ref = R.HEADS + name
        old = self.refs.read_ref(ref)
        self.refs.update_refs([RefUpdate(ref, old, oid)], f"branch: moved to {rev}" if old else
                              f"branch: created from {rev}")
        return oid

    def rename_branch(self, old: str, new: str) -> str:
        """Rename branch `old` to `new` in one ref transaction (see `Repo.rename_branch`)."""
        R.check_ref_name(new, "branch")
        oid = self.refs.read_ref(R.HEADS + old)
        if oid is None:
            raise R.NoSuchRefError(f"no branch named {old!r}")
        if self.refs.read_ref(R.HEADS + new) is not None:
            raise R.RefExistsError(f"branch {new!r} already exists")
        updates = [RefUpdate(R.HEADS + new, None, oid), RefUpdate(R.HEADS + old, oid, None)]
        if self.current_branch() == old:
            updates.append(RefUpdate(R.HEAD, ANY, R.SYMREF + R.HEADS + new))
        try:
            self.refs.update_refs(updates, f"branch: renamed {old} to {new}")
        except RefConflictError:
            raise R.RefExistsError(f"branch {new!r} already exists, or {old!r} moved meanwhile") from None
        return oid

    def tag(self, name: str, rev: str | None = None) -> str:
        """Create tag `name` at `rev` (default HEAD); returns the commit id."""
        R.check_ref_name(name, "tag")
        oid = self.resolve(rev or "HEAD")
        self._create_ref(R.TAGS + name, oid, f"tag: {rev or 'HEAD'}", "tag")
        return oid

    def _create_ref(self, ref: str, oid: str, reason: str, kind: str) -> None:
        try:
            self.refs.update_refs([RefUpdate(ref, None, oid)], reason)
        except RefConflictError:
            raise R.RefExistsError(f"{kind} {ref.split('/', 2)[2]!r} already exists") from None

    # ------------------------------------------------------------------ deleting
    def delete_branch(self, name: str, force: bool = False) -> str:
        """Delete a branch (never the current one; an unmerged one only with `force`).
        Returns its old id (see `Repo.delete_branch`)."""
        if name == self.current_branch():
            raise R.CurrentBranchError(f"cannot delete branch {name!r}: HEAD is on it (switch first)")
        ref = R.HEADS + name
        old = self.refs.read_ref(ref)
        if old is not None and not force:
            others = {oid for n, oid in self.branches() if n != name} | {oid for _, oid in self.tags()}
            head = self.head()
            if head is not None:
                others.add(head)
            if old not in others and not any(c.id == old for c in self.odb.walk_commits(others)):
                raise R.UnmergedBranchError(
                    f"branch {name!r} is not fully merged: no other branch, tag or HEAD reaches "
                    f"its tip {old[:12]} (delete it anyway with 'mvc branch -D {name}')")
        # The value checked is the one swapped out: a commit landing on the branch meanwhile
        # makes the delete fail rather than vanish unchecked.
        return self._delete_ref(ref, "branch", old)

    def delete_tag(self, name: str) -> str:
        """Delete a tag; returns its old id."""
        return self._delete_ref(R.TAGS + name, "tag")

    def _delete_ref(self, ref: str, kind: str, old: str | None = None) -> str:
        old = old or self.refs.read_ref(ref)
        if old is None:
            raise R.NoSuchRefError(f"no {kind} named {ref.split('/', 2)[2]!r}")
        # The reflog stays (gc expires it after gc.reflog_expire days): the grace period in
        # which a deleted branch's commits can still be recovered.
        self.refs.update_refs([RefUpdate(ref, old, None)], f"{kind}: deleted")
        return old

    # ------------------------------------------------------------------ HEAD
    def switch(self, name: str, *, create: bool = False) -> None:
        """Attach HEAD to branch `name` (creating it at HEAD with `create=True`)."""
        if create:
            self.branch(name)
        else:
            name = name.removeprefix(R.HEADS)
            try:
                exists = bool(name) and self.refs.read_ref(R.HEADS + name) is not None
            except InvalidRefError:  # not even storable as a ref name: no such branch
                exists = False
            if not exists:
                raise R.NoSuchRefError(f"no branch named {name!r}")
        self._warn_if_leaving(R.SYMREF + R.HEADS + name)
        self.refs.update_refs([RefUpdate(R.HEAD, ANY, R.SYMREF + R.HEADS + name)],
                              f"switch: to {name}")

    def move_head(self, oid: str, branch: str | None, rev: str) -> None:
        """Point HEAD at `oid`: attached to `branch` (from `resolve_rev(rev)`: set only when
        `rev` named that branch exactly as resolved), detached otherwise."""
        new = R.SYMREF + R.HEADS + branch if branch is not None else oid
        if self.refs.read_ref(R.HEAD) != new:
            self._warn_if_leaving(new)
            self.refs.update_refs([RefUpdate(R.HEAD, ANY, new)], f"checkout: moving to {rev}")

    def _warn_if_leaving(self, new: str) -> None:
        """Warn, as git does, when HEAD is detached at commits no branch or tag reaches and is
        about to move to `new` (a ref value) that does not reach them either: after the move
        only the reflog holds them, until gc expires it (`gc.reflog_expire`)."""
        old = self.refs.read_ref(R.HEAD)
        if old is None or R.is_symbolic(old) or old == new:
            return
        kept = {oid for _, oid in self.branches()} | {oid for _, oid in self.tags()}
        target = self.resolve_ref(new[len(R.SYMREF):]) if R.is_symbolic(new) else new
        if target is not None:
            kept.add(target)
        reached = {c.id for c in self.odb.walk_commits(kept)} if kept else set()
        left = [c for c in self.odb.walk_commits([old]) if c.id not in reached]
        if left:
            newest = left[0]
            warnings.warn(MvcWarning(
                f"leaving {len(left)} commit(s) that no branch or tag reaches, the newest "
                f"{newest.id[:12]} ({newest.message.splitlines()[0] if newest.message else ''}); "
                f"keep them with 'mvc branch NAME {newest.id[:12]}' (the reflog holds them until "
                f"gc expires it)"), stacklevel=4)
