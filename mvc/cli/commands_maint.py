"""gc, fsck."""
from __future__ import annotations

from typing import TYPE_CHECKING

import click

from mvc.cli.format import echo, human_bytes
from mvc.cli.progress import quiet_option, terminal_progress
from mvc.errors import DataError, UsageError

if TYPE_CHECKING:
    from mvc.repo.repository import Repo
else:
    from mvc.cli.lazy import Repo


def _expire_days(value: str | None) -> float | None:
    if value is None:
        return None
    if value == "now":
        return 0.0
    if value == "never":
        return float("inf")
    try:
        days = float(value)
    except ValueError:
        days = -1.0
    if not days >= 0.0:
        raise UsageError(f"--expire expects a number of days >= 0, 'now' or 'never', got {value!r}")
    return days


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
@click.option("--expire", "expire", default=None, metavar="DAYS|now|never",
              help="Keep a deleted branch's or tag's reflog, and so its commits, this long after "
                   "the deletion (default: gc.reflog_expire, 30 days).")
@quiet_option
def gc(dry_run: bool, shrink: bool, max_chain: int | None, keep_last: int | None,
       keep_every: int | None, expire: str | None, quiet: bool) -> None:
    """Bound delta chains and remove objects unreachable from any ref or reflog entry.

    With --keep-last / --keep-every, first prune the commits the policy does not keep:
    they stay in history (same ids, `mvc log` marks them pruned) but their checkpoints
    are freed; kept commits restore exactly as before. --dry-run lists them.

    A deleted branch's commits stay for gc.reflog_expire days (its reflog: `mvc branch
    NAME NAME@{0}` restores it); --expire now drops them at once."""
    # Checked here, before the repository code (and torch) is loaded: RetentionPolicy says the
    # same, later.
    if keep_last is not None and keep_last < 1:
        raise UsageError(f"--keep-last must be >= 1 (branch tips are always kept), got {keep_last}")
    if keep_every is not None and keep_every < 1:
        raise UsageError(f"--keep-every must be >= 1, got {keep_every}")
    days = _expire_days(expire)
    repo = Repo.discover()
    with terminal_progress(quiet=quiet) as progress:
        r = repo.gc(dry_run=dry_run, max_chain=max_chain, shrink=shrink, progress=progress,
                    keep_last=keep_last, keep_every=keep_every, reflog_expire=days)
    for name in r.expired_reflogs:
        echo(f"gc: {'would expire' if dry_run else 'expired'} the reflog of deleted {name}")
    if r.deleted_refs_kept:
        names = ", ".join(n.split("/", 2)[-1] for n in r.deleted_refs_kept)
        echo(f"gc: kept the commits of deleted {names} (reflog grace period; --expire now drops them)")
    if keep_last is not None or keep_every is not None:
        verb = "would prune" if dry_run else "pruned"
        echo(f"gc: {verb} {len(r.pruned)} commits" + (":" if r.pruned and dry_run else ""))
        if dry_run:
            for cid in r.pruned:
                echo(f"  {cid[:12]} {repo.read_commit(cid).summary}")
        if r.retention_rebased:
            echo(f"gc: {'would re-encode' if dry_run else 're-encoded'} {r.retention_rebased} tensors of "
                 f"kept commits as bases (they {'are' if dry_run else 'were'} deltas on pruned ones)")
    if r.snapshots_rewritten:
        echo(f"gc: {'would re-encode' if dry_run else 're-encoded'} {r.tensors_rebased} tensors in "
             f"{r.snapshots_rewritten} snapshots as bases (chain depth {r.max_chain_before} -> {r.max_chain_after})")
    verb = "would remove" if dry_run else "removed"
    wrote = (f"; {'would write' if dry_run else 'wrote'} {r.written_objects} objects, "
             f"{human_bytes(r.written_bytes)} (the re-encodings)") if r.written_objects else ""
    echo(f"gc: {verb} {r.removed_objects} objects, {human_bytes(r.freed_bytes)}{wrote}; "
         f"{r.kept_objects} reachable objects kept")
    if r.cache_files_removed:
        echo(f"gc: deleted {r.cache_files_removed} stale level-cache file(s)")
    if r.disk_before is not None and r.disk_after is not None:  # both set by the one shrink
        echo(f"gc: store file {human_bytes(r.disk_before)} -> {human_bytes(r.disk_after)}")
    elif r.disk_bytes and r.reclaimable_bytes:
        # The file never shrinks by itself: say how much of it is free, and when shrinking pays.
        echo(f"gc: store file {human_bytes(r.disk_bytes)}, {human_bytes(r.reclaimable_bytes)} of it free "
             "(later commits reuse it)" + ("; `mvc gc --shrink` gives it back to the file system"
                                          if r.shrink_pays else ""))
    elif dry_run and r.freed_bytes and not shrink:
        echo("gc: the store file keeps its size (later commits reuse the space freed); "
             "--shrink gives it back to the file system")


@click.command()
@click.option("--prune-cache", is_flag=True,
              help="Delete the level-cache files fsck warns about (the cache is disposable).")
@click.option("--decode", is_flag=True,
              help="Also decode every tensor of every commit, as a checkout would: finds "
                   "payloads whose ids check but that do not decode (slow: a checkout per commit).")
@quiet_option
def fsck(prune_cache: bool, decode: bool, quiet: bool) -> None:
    """Verify every object against its id and every reference; exit non-zero on problems.

    Unusable level-cache entries and a recounted store counter are warnings: they never
    reach a checkout and do not change the exit status. --decode also decodes every tensor
    of every commit, as a checkout would (a checkout's time per commit)."""
    repo = Repo.discover()
    with terminal_progress(quiet=quiet) as progress:
        r = repo.fsck(progress=progress, decode=decode)
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
