"""Upstreams, as git's: which remote-tracking branch a local branch follows, and how far apart
they are.

A branch's upstream is two config keys (`mvc.repo.config`): ``branch.NAME.remote`` (a remote's
name) and ``branch.NAME.merge`` (that remote's branch, ``refs/heads/X``), read through the
remote-tracking branch ``refs/remotes/REMOTE/X`` that fetch, push and clone keep.  Clone, `mvc
switch NAME` (creating NAME from ``REMOTE/NAME``), ``mvc branch NAME REMOTE/X``, ``mvc switch -c
NAME REMOTE/X`` and ``mvc push -u`` set it; `mvc status` compares the two from local refs only
(no network: as of the last fetch or push).

Reads refs, commits and config only: no torch.
"""
from __future__ import annotations

from dataclasses import dataclass

from mvc.errors import MvcError, UsageError
from mvc.repo import refs as R
from mvc.repo.config import BRANCH_KEY, Config
from mvc.repo.objectdb import ObjectDB
from mvc.repo.revparse import split_suffixes
from mvc.store import InvalidRefError, RefStore


class AmbiguousRemoteBranchError(UsageError):
    """`mvc switch NAME` with no branch NAME, and remote-tracking branches NAME of several
    remotes: which one to track must be said (`mvc switch -c NAME REMOTE/NAME`)."""

    exit_code = 100


class RemoteBranchReadOnlyError(UsageError):
    """A remote-tracking branch (``origin/main``) given where a local branch is needed (switch,
    branch -d/-m): it is read-only, moved only by fetch and push."""

    exit_code = 101


class NoUpstreamError(UsageError):
    """The branch has no upstream, or the upstream asked for is no remote-tracking branch."""

    exit_code = 102


@dataclass(frozen=True)
class Upstream:
    """A remote's branch as a local branch follows it."""

    remote: str
    #: The branch's name on the remote (``branch.NAME.merge`` without ``refs/heads/``).
    branch: str

    @property
    def name(self) -> str:
        """As a revision and in messages: ``origin/main``."""
        return f"{self.remote}/{self.branch}"

    @property
    def ref(self) -> str:
        """The remote-tracking ref: ``refs/remotes/origin/main``."""
        return f"{R.REMOTES}{self.remote}/{self.branch}"


def _keys(branch: str) -> tuple[str, str]:
    return f"branch.{branch}.remote", f"branch.{branch}.merge"


def upstream(config: Config, branch: str) -> Upstream | None:
    """The upstream configured for `branch` (None: none, or only half of it set)."""
    remote_key, merge_key = _keys(branch)
    remote, merge = config.get(remote_key), config.get(merge_key)
    if not remote or not merge:
        return None
    return Upstream(remote, merge.removeprefix(R.HEADS))


def set_upstream(config: Config, branch: str, up: Upstream) -> None:
    """Make `branch` follow `up` (its keys validated as every config key is)."""
    remote_key, merge_key = _keys(branch)
    config.set(remote_key, up.remote)
    config.set(merge_key, R.HEADS + up.branch)


def unset_upstream(config: Config, branch: str) -> bool:
    """Forget `branch`'s upstream; whether it had one."""
    had = upstream(config, branch) is not None
    for key in _keys(branch):
        if config.is_set(key):
            config.set(key, None)
    return had


def rename_upstream(config: Config, old: str, new: str) -> None:
    """Carry `old`'s upstream over to `new` (a renamed branch keeps following it, as in git)."""
    up = upstream(config, old)
    unset_upstream(config, old)
    if up is not None:
        set_upstream(config, new, up)


def forget_remote(config: Config, remote: str) -> list[str]:
    """Unset the upstream of every branch that follows a branch of `remote` (removed);
    returns those branches."""
    out = []
    for key, value in config.items().items():
        m = BRANCH_KEY.fullmatch(key)
        if m is not None and m.group(2) == "remote" and value == remote:
            unset_upstream(config, m.group(1))
            out.append(m.group(1))
    return out


def _read(refs: RefStore, ref: str) -> str | None:
    try:
        return refs.read_ref(ref)
    except InvalidRefError:  # user input that cannot even be a ref name
        return None


def as_upstream(refs: RefStore, rev: str) -> Upstream | None:
    """The remote-tracking branch `rev` names as a revision (``origin/x``,
    ``refs/remotes/origin/x``; no suffix), else None: a branch or tag of that name comes
    first, as in revisions (`mvc.repo.revparse.resolve_base`)."""
    if split_suffixes(rev)[1] or "@{" in rev:
        return None
    if rev.startswith(R.REMOTES):
        ref = rev
    elif rev.startswith("refs/") or any(_read(refs, p + rev) is not None for p in (R.HEADS, R.TAGS)):
        return None
    else:
        ref = R.REMOTES + rev
    remote, sep, branch = ref[len(R.REMOTES):].partition("/")
    if not sep or not branch or _read(refs, ref) is None:
        return None
    return Upstream(remote, branch)


def tracking_candidates(refs: RefStore, branch: str) -> list[Upstream]:
    """The remote-tracking branches ``REMOTE/<branch>``, one per remote that has one."""
    out = []
    for name, value in refs.iter_refs(R.REMOTES):
        remote, _, rest = name[len(R.REMOTES):].partition("/")
        if rest == branch and not R.is_symbolic(value):
            out.append(Upstream(remote, branch))
    return out


def dwim_upstream(refs: RefStore, branch: str) -> Upstream | None:
    """What `mvc switch BRANCH` makes `branch` from when there is no branch of that name: the
    one remote-tracking branch ``REMOTE/<branch>`` (git's DWIM); None when no remote has one;
    `AmbiguousRemoteBranchError` when several have.  `RemoteBranchReadOnlyError` when
    `branch` itself names a remote-tracking branch (``origin/x``): that is no branch to be on."""
    found = tracking_candidates(refs, branch)
    if len(found) > 1:
        names = ", ".join(u.name for u in found)
        raise AmbiguousRemoteBranchError(
            f"no branch {branch!r}, and it matches remote-tracking branches of several remotes "
            f"({names}): name the one to track, e.g. `mvc switch -c {branch} {found[0].name}`")
    if found:
        return found[0]
    up = as_upstream(refs, branch)
    if up is not None:
        local = _read(refs, R.HEADS + up.branch) is not None
        make = (f"`mvc switch {up.branch}` is your branch of that name" if local else
                f"`mvc switch {up.branch}` makes a branch following it")
        raise RemoteBranchReadOnlyError(
            f"{branch!r} is a remote-tracking branch (read-only: fetch and push move it), not a "
            f"branch to switch to: {make}; `mvc checkout {up.name} -o FILE` writes its checkpoint")
    return None


def refuse_remote_branch(refs: RefStore, name: str, verb: str) -> None:
    """`RemoteBranchReadOnlyError` if `name` is no branch but a remote-tracking one (so that
    `mvc branch -d origin/x` says why, rather than "no branch named ...")."""
    if _read(refs, R.HEADS + name) is None:
        up = as_upstream(refs, name)
        if up is not None:
            raise RemoteBranchReadOnlyError(
                f"{name!r} is a remote-tracking branch, which only fetch and push move: "
                f"cannot {verb} it" + (" (`mvc branch -d -r` deletes it here)" if verb == "delete" else ""))


def ahead_behind(odb: ObjectDB, local: str, other: str) -> tuple[int, int]:
    """(commits reachable from `local` and not from `other`, the reverse): git's counts."""
    if local == other:
        return 0, 0
    mine = {c.id for c in odb.walk_commits([local])}
    theirs = {c.id for c in odb.walk_commits([other])}
    return len(mine - theirs), len(theirs - mine)


def _plural(n: int) -> str:
    return f"{n} commit" if n == 1 else f"{n} commits"


def status_lines(config: Config, refs: RefStore, odb: ObjectDB, branch: str, head: str | None) -> list[str]:
    """What `mvc status` says of `branch` (at `head`) against its upstream, in git's words;
    nothing when it has none.  From local refs: as of the last fetch or push."""
    up = upstream(config, branch)
    if up is None:
        return []
    target = _read(refs, up.ref)
    if target is None or R.is_symbolic(target):
        return [f"Your branch is based on '{up.name}', but the upstream is gone.",
                '  (use "mvc fetch" if the remote has it again, or "mvc branch --unset-upstream" to fixup)']
    if head is None:
        return []
    try:
        ahead, behind = ahead_behind(odb, head, target)
    except MvcError as exc:  # a damaged history: status still says the rest (fsck says more)
        return [f"Your branch follows '{up.name}' (not compared: {exc})"]
    if not ahead and not behind:
        return [f"Your branch is up to date with '{up.name}'."]
    if not behind:
        return [f"Your branch is ahead of '{up.name}' by {_plural(ahead)}.",
                '  (use "mvc push" to publish your local commits)']
    if not ahead:
        return [f"Your branch is behind '{up.name}' by {_plural(behind)}, and can be fast-forwarded.",
                '  (use "mvc pull" to update your local branch)']
    return [f"Your branch and '{up.name}' have diverged,",
            f"and have {ahead} and {behind} different commits each, respectively.",
            f'  (mvc has no merge: "mvc push --force" keeps yours, "mvc switch -c NEW {up.name}" '
            'works from theirs)']
