"""gc, fsck."""
from __future__ import annotations

import click

from mvc.cli.format import human_bytes
from mvc.errors import DataError
from mvc.repo.repository import Repo


class FsckFailed(DataError):
    """fsck found problems (listed on stdout)."""

    exit_code = 26


@click.command()
@click.option("--dry-run", is_flag=True, help="Report what would be removed; remove nothing.")
def gc(dry_run: bool) -> None:
    """Remove objects unreachable from any ref or reflog entry."""
    repo = Repo.discover()
    r = repo.gc(dry_run=dry_run)
    verb = "would remove" if dry_run else "removed"
    click.echo(f"gc: {verb} {r.removed_objects} objects, {human_bytes(r.freed_bytes)}; "
               f"{r.kept_objects} reachable objects kept")


@click.command()
def fsck() -> None:
    """Verify every object against its id and every reference; exit non-zero on problems."""
    repo = Repo.discover()
    r = repo.fsck()
    for p in r.problems:
        click.echo(p)
    if r.problems:
        raise FsckFailed(f"fsck found {len(r.problems)} problem(s) in {r.objects_checked} objects")
    click.echo(f"fsck: {r.objects_checked} objects, {r.commits_checked} commits: ok")


COMMANDS = [gc, fsck]
