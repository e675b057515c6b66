"""branch, tag, switch, reflog."""
from __future__ import annotations

from datetime import datetime, timezone
from typing import TYPE_CHECKING

import click

from mvc.cli.format import echo, echo_json, escape
from mvc.errors import UsageError
from mvc.repo.refs import HEAD, HEADS, TAGS
from mvc.repo.revparse import ref_history, reflog_ref

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
def branch(name: str | None, rev: str | None, delete: bool, force_delete: bool, rename: bool, force: bool) -> None:
    """List branches, create NAME at REV (default HEAD), move it there (-f), rename it
    (-m OLD NEW), or delete NAME with -d (-D: even unmerged)."""
    repo = Repo.discover()
    if rename:
        if not name or not rev:
            raise UsageError("branch -m needs the old and the new name: mvc branch -m OLD NEW")
        oid = repo.rename_branch(name, rev)
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
        old = repo.delete_branch(name, force=force_delete)
        echo(f"Deleted branch {name} (was {old[:12]})")
        return
    if name:
        oid = repo.branch(name, rev)
        echo(f"Created branch {name} at {oid[:12]}")
        return
    current = repo.current_branch()
    branches = repo.branches()
    # Pad the name as shown (escaped), so ids and summaries line up in columns.
    width = max((len(escape(bname)) for bname, _ in branches), default=0)
    for bname, oid in branches:
        mark = "*" if bname == current else " "
        echo(f"{mark} {escape(bname).ljust(width)}  {oid[:12]}  {repo.read_commit(oid).summary}")
    head = repo.head()
    if current is None and head:
        echo(f"* (HEAD detached at {head[:12]})")


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
@click.option("-c", "--create", is_flag=True, help="Create the branch at HEAD first.")
def switch(name: str, create: bool) -> None:
    """Attach HEAD to branch NAME (the checkpoint file is not rewritten; use checkout for that)."""
    repo = Repo.discover()
    repo.switch(name, create=create)
    echo(f"Switched to {'a new ' if create else ''}branch {repo.current_branch()}")


def _selector(ref: str) -> str:
    """How `REF@{n}` spells `ref` back: as the user would type it (short names)."""
    if ref == HEAD:
        return HEAD
    return ref.removeprefix(HEADS) if ref.startswith(HEADS) else ref.removeprefix(TAGS)


def _when(t: float) -> str:
    return datetime.fromtimestamp(t, timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")


@click.command()
@click.argument("ref", required=False, default=HEAD)
@click.option("-n", "max_count", type=click.IntRange(min=0), default=None,
              help="Show at most N entries.")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
def reflog(ref: str, max_count: int | None, as_json: bool) -> None:
    """Show where REF (default HEAD; a branch or tag) has pointed, newest first, as REF@{n}
    (usable as a revision: `mvc checkout main@{2}`). HEAD's entries include the commits made
    while it was attached to a branch, as in git."""
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
