"""remote, push, fetch, pull, clone (docs/remotes.md)."""
from __future__ import annotations

from typing import TYPE_CHECKING

import click

from mvc.cli.format import echo, human_bytes
from mvc.cli.progress import quiet_option, terminal_progress
from mvc.errors import UsageError
from mvc.cli.lazy import Repo
from mvc.remote import tracking
from mvc.remote.config import ORIGIN, REMOTES, RemoteConfig
from mvc.remote.tracking import Upstream
from mvc.store.objstore import open_remote
from mvc.store.objstore.storage import redact_url

if TYPE_CHECKING:
    from mvc.remote.shallow import Want
    from mvc.remote.transfer import TransferReport
    from mvc.repo.repository import Repo as RepoType

# mvc.remote.porcelain / transfer import the repository code (about 0.15 s; torch only once a
# transfer opens a snapshot): they are imported where a command runs, as `Repo` is (cli/lazy.py),
# so that listing the commands (`mvc --help`) does not pay for them.


def _default_remote(config: RemoteConfig, name: str | None, up: Upstream | None = None) -> str:
    """NAME, else the remote of `up` (the branch's upstream), else `origin`, else the only
    remote there is."""
    if name is not None:
        return name
    if up is not None:
        return up.remote
    remotes = config.items()
    if ORIGIN in remotes or not remotes:
        return ORIGIN
    if len(remotes) == 1:
        return next(iter(remotes))
    raise UsageError(f"several remotes ({', '.join(remotes)}) and none named {ORIGIN!r}: name one")


def _upstream(repo: RepoType, branch: str | None = None) -> Upstream | None:
    """The upstream of `branch` (default: the current branch), if it has one."""
    branch = branch or repo.current_branch()
    return tracking.upstream(repo.config, branch) if branch else None


def _short(oid: str | None) -> str:
    return oid[:12] if oid else "(none)"


def _objects_line(verb: str, r: TransferReport) -> str:
    extra = f"; {r.skipped} already there" if r.skipped else ""
    return f"{verb} {r.objects} objects, {human_bytes(r.bytes)}{extra}"


@click.group(invoke_without_command=True)
@click.option("-v", "--verbose", is_flag=True, help="Show each remote's URL.")
@click.pass_context
def remote(ctx: click.Context, verbose: bool) -> None:
    """List, add or remove remotes (s3://bucket/prefix or file:///dir)."""
    if ctx.invoked_subcommand is not None:
        return
    repo = Repo.discover()
    remotes = RemoteConfig(repo.mvc_dir).items()
    width = max((len(n) for n in remotes), default=0)
    for name, url in remotes.items():
        echo(f"{name:<{width}}  {redact_url(url)}" if verbose else name)


@remote.command("add")
@click.argument("name")
@click.argument("url")
def remote_add(name: str, url: str) -> None:
    """Add remote NAME at URL (s3://bucket/prefix: endpoint and credentials from the AWS
    environment, e.g. AWS_ENDPOINT_URL; or file:///absolute/dir)."""
    repo = Repo.discover()
    RemoteConfig(repo.mvc_dir).add(name, url)


@remote.command("remove")
@click.argument("name")
def remote_remove(name: str) -> None:
    """Forget remote NAME, its remote-tracking branches and the upstreams that were its
    branches (nothing on the remote changes)."""
    repo = Repo.discover()
    RemoteConfig(repo.mvc_dir).remove(name)
    tracking.forget_remote(repo.config, name)
    refs = repo.store.refs
    for ref, value in list(refs.iter_refs(f"{REMOTES}{name}/")):
        refs.update_ref(ref, value, None, f"remote remove {name}")
        refs.delete_reflog(ref)


@click.command()
@click.argument("remote_name", metavar="[REMOTE]", required=False)
@click.argument("refs", nargs=-1)
@click.option("-f", "--force", is_flag=True, help="Overwrite remote refs even when that drops commits there.")
@click.option("--all", "all_branches", is_flag=True, help="Push every branch (and no BRANCH may be named).")
@click.option("--tags", is_flag=True, help="Push every tag (besides any BRANCH named).")
@click.option("-u", "--set-upstream", "set_upstream", is_flag=True,
              help="Make each pushed branch follow the remote's (what `mvc status` compares with).")
@quiet_option
def push(remote_name: str | None, refs: tuple[str, ...], force: bool, all_branches: bool, tags: bool,
         set_upstream: bool, quiet: bool) -> None:
    """Send branches or tags (default: the current branch, to its upstream's remote) and the
    objects the remote lacks; --all: every branch, --tags: every tag.

    Objects go first, then each ref by compare-and-swap: a ref that moved on the remote, or
    that would lose commits there, is refused (exit 142) unless --force."""
    repo = Repo.discover()
    config = RemoteConfig(repo.mvc_dir)
    name = _default_remote(config, remote_name, _upstream(repo))
    from mvc.remote.porcelain import push_updates, record_push
    from mvc.remote.transfer import push as push_objects

    updates = push_updates(repo.store.refs, list(refs), repo.current_branch(),
                           all_branches=all_branches, tags=tags)
    url = config.url(name)
    if not updates:
        echo(f"push {name}: nothing to push (no {'branches' if all_branches else 'tags'})")
        return
    target = open_remote(url)
    try:
        with terminal_progress(quiet=quiet) as progress:
            report = push_objects(repo.odb, target, updates, force=force, progress=progress)
    finally:
        target.close()
    record_push(repo.store.refs, name, report)
    echo(f"push {name}: {_objects_line('sent', report)}")
    for r in report.refs:
        echo(f"  {r.ref}: {_short(r.old)} -> {_short(r.new)} ({r.status})")
    if set_upstream:
        for ref in updates:
            if ref.startswith("refs/heads/"):
                branch = ref[len("refs/heads/"):]
                tracking.set_upstream(repo.config, branch, Upstream(name, branch))
                echo(f"branch '{branch}' set up to track '{name}/{branch}'.")


@click.command()
@click.argument("remote_name", metavar="[REMOTE]", required=False)
@click.argument("rev", metavar="[REV]", required=False)
@click.option("--depth", type=int, default=None, metavar="N",
              help="Only the newest N commits of each branch fetched (of REV: default 1), with "
                   "every object their checkpoints need; the repository becomes shallow.")
@click.option("--unshallow", is_flag=True,
              help="Bring the history a shallow clone or fetch left out (a plain fetch does too).")
@quiet_option
def fetch(remote_name: str | None, rev: str | None, depth: int | None, unshallow: bool,
          quiet: bool) -> None:
    """Copy the remote's branches (as the remote-tracking branches REMOTE/BRANCH, i.e.
    refs/remotes/REMOTE/BRANCH) and new tags, with the objects this repository lacks.
    Default REMOTE: the current branch's upstream's, else origin.

    With REV (a branch, tag or full commit id on the remote): that one commit and what its
    checkpoint needs (--depth N: its newest N commits), kept as FETCH_HEAD too. A fetch
    of whole branches completes a shallow repository's history."""
    if unshallow and (depth is not None or rev is not None):
        raise UsageError("--unshallow fetches whole histories: give it no REV and no --depth")
    from mvc.remote.shallow import Want

    want = Want(depth=1 if rev is not None and depth is None else depth, rev=rev)
    repo = Repo.discover()
    config = RemoteConfig(repo.mvc_dir)
    name = _default_remote(config, remote_name, _upstream(repo))
    if unshallow and not repo.odb.shallow_ids():
        raise UsageError("--unshallow: this repository is not shallow (its history is complete)")
    _fetch(repo, name, config.url(name), quiet, want)


def _fetch(repo: RepoType, name: str, url: str, quiet: bool, want: Want | None = None) -> TransferReport:
    from mvc.remote.shallow import Want
    from mvc.remote.transfer import fetch as fetch_objects

    source = open_remote(url, spool_dir=repo.mvc_dir)
    try:
        with terminal_progress(quiet=quiet) as progress:
            store = repo.store
            report = fetch_objects(store.blobs, store.refs, source, name,
                                   lock=store.maintenance.write_lock(), progress=progress,
                                   want=want or Want())
    finally:
        source.close()
    echo(f"fetch {name}: {_objects_line('received', report)}")
    for r in report.refs:
        echo(f"  {r.ref}: {_short(r.old)} -> {_short(r.new)} ({r.status})")
    if report.fetch_head is not None:
        echo(f"  FETCH_HEAD: {report.fetch_head} (`mvc checkout FETCH_HEAD -o FILE` writes it)")
    _shallow_lines("fetch", report)
    return report


def _shallow_lines(verb: str, report: TransferReport) -> None:
    """Where a shallow repository's history stops, or that a fetch completed it."""
    if report.shallow:
        first = sorted(report.shallow)[0][:12]
        more = f" and {len(report.shallow) - 1} more" if len(report.shallow) > 1 else ""
        echo(f"{verb}: shallow: history stops at {first}{more} (`mvc fetch --unshallow` brings the rest)")
    elif report.unshallowed:
        echo(f"{verb}: the history is complete (no longer shallow)")


@click.command()
@click.argument("remote_name", metavar="[REMOTE]", required=False)
@click.argument("branch", required=False)
@quiet_option
def pull(remote_name: str | None, branch: str | None, quiet: bool) -> None:
    """Fetch, then fast-forward BRANCH (default: the current branch) to the remote's (the
    branch's upstream when it has one and no REMOTE is named, else REMOTE's BRANCH).

    A branch that has diverged from the remote's is refused (exit 142). The working
    checkpoint file is not rewritten: `mvc checkout BRANCH` writes it."""
    repo = Repo.discover()
    config = RemoteConfig(repo.mvc_dir)
    branch = branch or repo.current_branch()
    if branch is None:
        raise UsageError("HEAD is detached: name the branch to pull")
    up = _upstream(repo, branch)
    name = _default_remote(config, remote_name, up)
    theirs = up.branch if up is not None and up.remote == name else branch
    report = _fetch(repo, name, config.url(name), quiet)
    from mvc.remote.remote_refs import check_named

    check_named(report.skipped_refs, f"refs/heads/{theirs}", name)
    upstream = f"{REMOTES}{name}/{theirs}"
    target = repo.store.refs.read_ref(upstream)
    if target is None:
        raise UsageError(f"the remote {name!r} has no branch {theirs!r}")
    from mvc.remote.porcelain import fast_forward

    r = fast_forward(repo.odb, repo.store.refs, branch, target, f"{name}/{theirs}")
    echo(f"pull: branch {branch}: {_short(r.old)} -> {_short(r.new)} ({r.status})")
    if r.status == "fast-forward" and repo.current_branch() == branch:
        # Without checkpoint.path (always so in a fresh clone) a bare checkout has nowhere to write.
        where = "" if repo.config.get("checkpoint.path") else " -o FILE"
        echo(f"pull: run `mvc checkout {branch}{where}` to write its checkpoint")


@click.command()
@click.argument("url")
@click.argument("directory", required=False)
@click.option("--depth", type=int, default=None, metavar="N",
              help="A shallow clone: the newest N commits of the default branch only, with every "
                   "object their checkpoints need (delta parents included); no tags.")
@quiet_option
def clone(url: str, directory: str | None, depth: int | None, quiet: bool) -> None:
    """Create a repository in DIRECTORY (default: the URL's last component) from the remote
    at URL, named origin, with every commit of its branches and tags (--depth N: the newest
    N of its default branch). HEAD is on a branch made from origin's main (else its first
    branch), following it; the other branches are origin/NAME (`mvc branch -a`,
    `mvc switch NAME`)."""
    from mvc.remote.porcelain import clone as clone_repo, default_clone_dir
    from mvc.remote.shallow import check_depth

    check_depth(depth)  # before anything is made
    with terminal_progress(quiet=quiet) as progress:
        res = clone_repo(url, directory or default_clone_dir(url), progress=progress, depth=depth)
    echo(f"clone: {res.path}: {_objects_line('received', res.report)}")
    _shallow_lines("clone", res.report)
    if res.branch is None:
        echo("clone: the remote is empty")
        return
    # No checkpoint.path in a new clone (config is not cloned): `checkout BRANCH` alone
    # would fail, so the hint names a file.
    echo(f"clone: on branch {res.branch} at {_short(res.commit)}, tracking '{ORIGIN}/{res.branch}'; "
         f"`mvc checkout {res.branch} -o FILE` writes its checkpoint")
    if res.others:
        shown = ", ".join(res.others[:5]) + (f", ... ({len(res.others)} in all)" if len(res.others) > 5 else "")
        echo(f"clone: remote branches {shown} (`mvc branch -a` lists them, "
             f"`mvc switch {res.others[0].split('/', 1)[1]}` makes a local branch of one)")
    if res.lossy:
        echo("clone: note: the remote's commits are quantized; this clone has no quality hook "
             "(config is not cloned), so commits here are stored losslessly until you set one: "
             "`mvc config quality.hook MODULE:FUNCTION` or `mvc config quality.epsilon E` "
             "(docs/quality.md)")


COMMANDS = [remote, push, fetch, pull, clone]


def checkout_remote(remote_arg: str, rev: str, output: str, *, fmt: str | None, only: tuple[str, ...],
                    weights_only: bool, force: bool, quiet: bool) -> None:
    """`mvc checkout --remote NAME REV -o FILE`: REV's checkpoint read straight from the remote
    (a remote's name here, or its URL anywhere), reading only the objects it needs; no
    repository is needed and none changes."""
    from pathlib import Path

    from mvc.io.files import save_checkpoint
    from mvc.remote.readonly import open_remote_repo

    if "://" in remote_arg:
        url = remote_arg
    else:
        url = RemoteConfig(Repo.discover().mvc_dir).url(remote_arg)
    path = Path(output)
    if path.exists() and not force:
        raise UsageError(f"{path} exists: a checkout from a remote does not write over a file "
                         "(add --force, or give another -o FILE)")
    with open_remote_repo(url) as remote_repo:
        cid = remote_repo.resolve(rev)
        with terminal_progress(quiet=quiet) as progress:
            state = remote_repo.read_state(cid, only=only or None, weights_only=weights_only,
                                           progress=progress)
    from mvc.io.dirs import is_dir_state, save_dir

    path.parent.mkdir(parents=True, exist_ok=True)
    if is_dir_state(state):
        save_dir(state, path, replace=force)
        echo(f"Wrote directory {path} from {cid[:12]} of {redact_url(url)}")
        return
    with terminal_progress(quiet=quiet) as progress:
        save_checkpoint(state, path, fmt, progress=progress)
    echo(f"Wrote {path} ({human_bytes(path.stat().st_size)}) from {cid[:12]} of {redact_url(url)}")
