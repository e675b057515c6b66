"""gc, fsck."""
from __future__ import annotations

import click

from mvc.cli.format import echo, human_bytes
from mvc.cli.progress import quiet_option, terminal_progress
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
@click.option("--keep-last", type=int, default=None, metavar="N",
              help="Retention: keep the N newest commits of each branch; prune older ones "
                   "(tags and branch tips are always kept).")
@click.option("--keep-every", type=int, default=None, metavar="K",
              help="Retention: also keep every K-th commit of older history (counted from the root).")
@quiet_option
def gc(dry_run: bool, shrink: bool, max_chain: int | None, keep_last: int | None,
       keep_every: int | None, quiet: bool) -> None:
    """Bound delta chains and remove objects unreachable from any ref or reflog entry.

    With --keep-last / --keep-every, first prune the commits the policy does not keep:
    they stay in history (same ids, `mvc log` marks them pruned) but their checkpoints
    are freed; kept commits restore exactly as before. --dry-run lists them."""
    repo = Repo.discover()
    with terminal_progress(quiet=quiet) as progress:
        r = repo.gc(dry_run=dry_run, max_chain=max_chain, shrink=shrink, progress=progress,
                    keep_last=keep_last, keep_every=keep_every)
    if keep_last is not None or keep_every is not None:
        verb = "would prune" if dry_run else "pruned"
        echo(f"gc: {verb} {len(r.pruned)} commits" + (":" if r.pruned and dry_run else ""))
        if dry_run:
            for cid in r.pruned:
                echo(f"  {cid[:12]} {repo.read_commit(cid).summary}")
        elif r.retention_rebased:
            echo(f"gc: re-encoded {r.retention_rebased} tensors of kept commits as bases "
                 "(they were deltas on pruned ones)")
    if r.snapshots_rewritten:
        echo(f"gc: re-encoded {r.tensors_rebased} tensors in {r.snapshots_rewritten} snapshots "
             f"as bases (chain depth {r.max_chain_before} -> {r.max_chain_after})")
    verb = "would remove" if dry_run else "removed"
    echo(f"gc: {verb} {r.removed_objects} objects, {human_bytes(r.freed_bytes)}; "
         f"{r.kept_objects} reachable objects kept")
    if r.disk_before is not None and r.disk_after is not None:  # both set by the one shrink
        echo(f"gc: store file {human_bytes(r.disk_before)} -> {human_bytes(r.disk_after)}")


@click.command()
@click.option("--prune-cache", is_flag=True,
              help="Delete the level-cache files fsck warns about (the cache is disposable).")
@quiet_option
def fsck(prune_cache: bool, quiet: bool) -> None:
    """Verify every object against its id and every reference; exit non-zero on problems.

    Unusable level-cache entries and a recounted store counter are warnings: they never
    reach a checkout and do not change the exit status."""
    repo = Repo.discover()
    with terminal_progress(quiet=quiet) as progress:
        r = repo.fsck(progress=progress)
    for p in r.problems:
        echo(p)
    for w in r.warnings:
        echo(f"warning: {w}")
    if prune_cache and r.warnings:
        repo.prune_level_cache()
        echo("fsck: unusable level-cache files deleted")
    elif any(w.startswith("level cache") for w in r.warnings):
        echo("fsck: level-cache entries are skipped on read; `mvc fsck --prune-cache` deletes them")
    if r.problems:
        raise FsckFailed(f"fsck found {len(r.problems)} problem(s) in {r.objects_checked} objects")
    echo(f"fsck: {r.objects_checked} objects, {r.commits_checked} commits: ok")


COMMANDS = [gc, fsck]
