"""gc, fsck."""
from __future__ import annotations

import click

from mvc.cli.format import echo, human_bytes
from mvc.errors import DataError
from mvc.repo.repository import Repo


class FsckFailed(DataError):
    """fsck found problems (listed on stdout)."""

    exit_code = 26


@click.command()
@click.option("--dry-run", is_flag=True, help="Report what would be removed; change nothing.")
@click.option("--shrink", is_flag=True, help="Also rewrite the store file compactly to return disk space.")
@click.option("--max-chain", type=click.IntRange(min=0), default=None,
              help="Re-encode tensors with deeper delta chains as bases (default: gc.max_chain; "
                   "0: no depth bound, commit.chain_budget still applies).")
def gc(dry_run: bool, shrink: bool, max_chain: int | None) -> None:
    """Bound delta chains and remove objects unreachable from any ref or reflog entry."""
    repo = Repo.discover()
    r = repo.gc(dry_run=dry_run, max_chain=max_chain, shrink=shrink)
    if r.snapshots_rewritten:
        echo(f"gc: re-encoded {r.tensors_rebased} tensors in {r.snapshots_rewritten} snapshots "
             f"as bases (chain depth {r.max_chain_before} -> {r.max_chain_after})")
    verb = "would remove" if dry_run else "removed"
    echo(f"gc: {verb} {r.removed_objects} objects, {human_bytes(r.freed_bytes)}; "
         f"{r.kept_objects} reachable objects kept")
    if r.disk_before is not None:
        echo(f"gc: store file {human_bytes(r.disk_before)} -> {human_bytes(r.disk_after)}")


@click.command()
def fsck() -> None:
    """Verify every object against its id and every reference; exit non-zero on problems."""
    repo = Repo.discover()
    r = repo.fsck()
    for p in r.problems:
        echo(p)
    if r.problems:
        raise FsckFailed(f"fsck found {len(r.problems)} problem(s) in {r.objects_checked} objects")
    echo(f"fsck: {r.objects_checked} objects, {r.commits_checked} commits: ok")


COMMANDS = [gc, fsck]
