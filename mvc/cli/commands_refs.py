"""branch, tag, switch, reflog."""
from __future__ import annotations

from datetime import datetime, timezone
from typing import TYPE_CHECKING

import click

from mvc.cli.format import echo, echo_json, escape
from mvc.errors import UsageError
from mvc.remote import tracking
from mvc.repo.refs import HEAD, HEADS, REMOTES, TAGS
from mvc.repo.revparse import ref_history, reflog_ref
from mvc.store import InvalidRefError

if TYPE_CHECKING:
    from mvc.repo.repository import Repo
else:
    from mvc.cli.lazy import Repo


@click.command()
@click.argument("name", required=False)
@click.argument("rev", required=False)
@click.option("-d", "--delete", is_flag=True,
              help="Delete branch NAME if another branch, a tag or HEAD still reaches its tip.")
@click.option("-D", "force_delete", is_flag=True, help="Delete branch NAME even if unmerged.")
@click.option("-m", "--move", "rename", is_flag=True, help="Rename branch NAME to REV (a new name): branch -m OLD NEW.")
@click.option("-f", "--force", is_flag=True, help="Point NAME at REV even if it exists (not the current branch).")
@click.option("-r", "--remotes", is_flag=True,
              help="List the remote-tracking branches (origin/NAME); with -d, delete one here.")
@click.option("-a", "--all", "all_", is_flag=True, help="List branches and remote-tracking branches.")
@click.option("-u", "--set-upstream-to", "upstream", metavar="REMOTE/BRANCH", default=None,
              help="Make NAME (default: the current branch) follow REMOTE/BRANCH.")
@click.option("--unset-upstream", is_flag=True, help="NAME (default: the current branch) follows nothing.")
def branch(name: str | None, rev: str | None, delete: bool, force_delete: bool, rename: bool, force: bool,
           remotes: bool, all_: bool, upstream: str | None, unset_upstream: bool) -> None:
    """List branches (-r: remote-tracking ones, -a: both), create NAME at REV (default HEAD;
    from a remote-tracking branch REV, NAME follows it), move it there (-f), rename it
    (-m OLD NEW), delete NAME with -d (-D: even unmerged; -d -r: a remote-tracking branch),
    or set what it follows (-u, --unset-upstream)."""
    repo = Repo.discover()
    refs = repo.store.refs
    if upstream is not None or unset_upstream:
        _branch_upstream(repo, name, upstream)
        return
    if rename:
        if not name or not rev:
            raise UsageError("branch -m needs the old and the new name: mvc branch -m OLD NEW")
        tracking.refuse_remote_branch(refs, name, "rename")
        oid = repo.rename_branch(name, rev)
        tracking.rename_upstream(repo.config, name, rev)
        echo(f"Renamed branch {name} to {rev} ({oid[:12]})")
        return
    if force:
        if not name:
            raise UsageError("branch -f needs a branch name: mvc branch -f NAME [REV]")
        oid = repo.move_branch(name, rev or "HEAD")
        echo(f"Branch {name} now at {oid[:12]}")
        return
    if delete or force_delete:
        if not name:
            raise UsageError(f"branch {'-D' if force_delete else '-d'} needs a branch name")
        if remotes:
            _delete_remote_branch(repo, name)
            return
        tracking.refuse_remote_branch(refs, name, "delete")
        old = repo.delete_branch(name, force=force_delete)
        tracking.unset_upstream(repo.config, name)
        echo(f"Deleted branch {name} (was {old[:12]})")
        return
    if name:
        up = tracking.as_upstream(refs, rev) if rev else None
        oid = repo.branch(name, rev)
        echo(f"Created branch {name} at {oid[:12]}")
        if up is not None:  # git's branch.autoSetupMerge: a branch made from origin/x follows it
            tracking.set_upstream(repo.config, name, up)
            echo(f"branch '{name}' set up to track '{up.name}'.")
        return
    current = repo.current_branch()
    rows = [] if remotes else [(bname, bname == current, oid) for bname, oid in repo.branches()]
    if remotes or all_:
        prefix = "" if remotes else "remotes/"
        rows += [(prefix + rname, False, oid) for rname, oid in repo.refops.remote_branches()]
    # Pad the name as shown (escaped), so ids and summaries line up in columns.
    width = max((len(escape(bname)) for bname, _, _ in rows), default=0)
    for bname, is_current, oid in rows:
        mark = "*" if is_current else " "
        echo(f"{mark} {escape(bname).ljust(width)}  {oid[:12]}  {repo.read_commit(oid).summary}")
    head = repo.head()
    if current is None and head and not remotes:
        echo(f"* (HEAD detached at {head[:12]})")


def _branch_upstream(repo: Repo, name: str | None, upstream: str | None) -> None:
    """`branch -u REMOTE/BRANCH [NAME]` / `branch --unset-upstream [NAME]`."""
    name = name or repo.current_branch()
    if name is None:
        raise UsageError("HEAD is detached: name the branch (mvc branch -u REMOTE/BRANCH NAME)")
    if repo.store.refs.read_ref(HEADS + name) is None:
        raise tracking.NoUpstreamError(f"no branch named {name!r}")
    if upstream is None:
        if not tracking.unset_upstream(repo.config, name):
            raise tracking.NoUpstreamError(f"branch {name!r} has no upstream")
        echo(f"Branch '{name}' follows nothing now.")
        return
    up = tracking.as_upstream(repo.store.refs, upstream)
    if up is None:
        raise tracking.NoUpstreamError(
            f"{upstream!r} is no remote-tracking branch (`mvc branch -r` lists them; "
            "`mvc fetch` brings a remote's)")
    tracking.set_upstream(repo.config, name, up)
    echo(f"branch '{name}' set up to track '{up.name}'.")


def _delete_remote_branch(repo: Repo, name: str) -> None:
    """`branch -d -r REMOTE/BRANCH`: forget a remote-tracking branch here (not on the remote;
    the next fetch brings it back if the remote still has it)."""
    refs = repo.store.refs
    ref = name if name.startswith(REMOTES) else REMOTES + name
    up = tracking.as_upstream(refs, ref)
    old = refs.read_ref(ref) if up is not None else None
    if up is None or old is None:
        raise tracking.NoUpstreamError(f"no remote-tracking branch named {name!r} (`mvc branch -r` lists them)")
    refs.update_ref(ref, old, None, "branch: deleted remote-tracking branch")
    refs.delete_reflog(ref)
    echo(f"Deleted remote-tracking branch {up.name} (was {old[:12]})")


@click.command()
@click.argument("name", required=False)
@click.argument("rev", required=False)
@click.option("-d", "--delete", is_flag=True, help="Delete tag NAME.")
def tag(name: str | None, rev: str | None, delete: bool) -> None:
    """List tags, create tag NAME at REV (default HEAD), or delete it with -d."""
    repo = Repo.discover()
    if delete:
        if not name:
            raise UsageError("tag -d needs a tag name")
        old = repo.delete_tag(name)
        echo(f"Deleted tag {name} (was {old[:12]})")
    elif name:
        oid = repo.tag(name, rev)
        echo(f"Tagged {oid[:12]} as {name}")
    else:
        tags = repo.tags()
        # Columns line up as in `mvc branch`: names padded as shown (escaped).
        width = max((len(escape(tname)) for tname, _ in tags), default=0)
        for tname, oid in tags:
            echo(f"{escape(tname).ljust(width)}  {oid[:12]}  {repo.read_commit(oid).summary}")


@click.command()
@click.argument("name")
@click.argument("start", required=False)
@click.option("-c", "--create", is_flag=True, help="Create the branch first, at START (default HEAD).")
def switch(name: str, start: str | None, create: bool) -> None:
    """Attach HEAD to branch NAME (the checkpoint file is not rewritten; use checkout for that).

    With no branch NAME but a remote-tracking branch REMOTE/NAME (of exactly one remote), NAME
    is created there, following it, as git does. -c NAME [START] creates NAME at START (a
    remote-tracking START: followed)."""
    repo = Repo.discover()
    refs = repo.store.refs
    up = None
    if create:
        up = tracking.as_upstream(refs, start) if start else None
        repo.branch(name, start)
    elif start is not None:
        raise UsageError("switch takes a START only with -c: mvc switch -c NAME START")
    else:
        name = name.removeprefix(HEADS)
        if _no_branch(repo, name):
            up = tracking.dwim_upstream(refs, name)
            if up is not None:
                repo.branch(name, up.ref)
                create = True
    if up is not None:
        tracking.set_upstream(repo.config, name, up)
        echo(f"branch '{name}' set up to track '{up.name}'.")
    repo.switch(name)
    echo(f"Switched to {'a new ' if create else ''}branch {repo.current_branch()}")


def _no_branch(repo: Repo, name: str) -> bool:
    """Whether there is no branch `name` (a name that cannot even be a ref is none)."""
    try:
        return not name or repo.store.refs.read_ref(HEADS + name) is None
    except InvalidRefError:
        return True


def _selector(ref: str) -> str:
    """How `REF@{n}` spells `ref` back: as the user would type it (short names)."""
    if ref == HEAD:
        return HEAD
    for prefix in (HEADS, TAGS, REMOTES):
        if ref.startswith(prefix):
            return ref[len(prefix):]
    return ref


def _when(t: float) -> str:
    return datetime.fromtimestamp(t, timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")


@click.command()
@click.argument("ref", required=False, default=HEAD)
@click.option("-n", "max_count", type=click.IntRange(min=0), default=None,
              help="Show at most N entries.")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
def reflog(ref: str, max_count: int | None, as_json: bool) -> None:
    """Show where REF (default HEAD; a branch, tag or remote-tracking branch) has pointed,
    newest first, as REF@{n} (usable as a revision: `mvc checkout main@{2}`). HEAD's entries
    include the commits made while it was attached to a branch, as in git."""
    repo = Repo.discover()
    full = reflog_ref(ref, repo.store.refs.read_ref, repo.store.refs.reflog)
    moves = ref_history(full, repo.store.refs.reflog)[:max_count]
    name = _selector(full)
    if as_json:
        echo_json([{"id": m.oid, "selector": f"{name}@{{{i}}}", "reason": m.reason,
                    "time": datetime.fromtimestamp(m.time, timezone.utc).isoformat()}
                   for i, m in enumerate(moves)])
        return
    for i, m in enumerate(moves):
        echo(f"{m.oid[:12]} {name}@{{{i}}}: {m.reason}  ({_when(m.time)})")


COMMANDS = [branch, tag, switch, reflog]
