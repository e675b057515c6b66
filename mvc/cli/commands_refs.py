"""branch, tag, switch."""
from __future__ import annotations

import click

from mvc.cli.format import echo
from mvc.errors import UsageError
from mvc.repo.repository import Repo


@click.command()
@click.argument("name", required=False)
@click.argument("rev", required=False)
@click.option("-d", "--delete", is_flag=True, help="Delete branch NAME.")
def branch(name: str | None, rev: str | None, delete: bool) -> None:
    """List branches, create NAME at REV (default HEAD), or delete NAME with -d."""
    repo = Repo.discover()
    if delete:
        if not name:
            raise UsageError("branch -d needs a branch name")
        old = repo.delete_branch(name)
        echo(f"Deleted branch {name} (was {old[:12]})")
        return
    if name:
        oid = repo.branch(name, rev)
        echo(f"Created branch {name} at {oid[:12]}")
        return
    current = repo.current_branch()
    for bname, oid in repo.branches():
        mark = "*" if bname == current else " "
        echo(f"{mark} {bname}  {oid[:12]}  {repo.read_commit(oid).summary}")
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
        for tname, oid in repo.tags():
            echo(f"{tname}  {oid[:12]}")


@click.command()
@click.argument("name")
@click.option("-c", "--create", is_flag=True, help="Create the branch at HEAD first.")
def switch(name: str, create: bool) -> None:
    """Attach HEAD to branch NAME (the checkpoint file is not rewritten; use checkout for that)."""
    repo = Repo.discover()
    repo.switch(name, create=create)
    echo(f"Switched to {'a new ' if create else ''}branch {repo.current_branch()}")


COMMANDS = [branch, tag, switch]
