"""remote, push, fetch, pull, clone (docs/remotes.md)."""
from __future__ import annotations

from typing import TYPE_CHECKING

import click

from mvc.cli.format import echo, human_bytes
from mvc.cli.progress import quiet_option, terminal_progress
from mvc.errors import UsageError
from mvc.cli.lazy import Repo
from mvc.remote.config import ORIGIN, REMOTES, RemoteConfig
from mvc.store.objstore import open_remote
from mvc.store.objstore.storage import redact_url

if TYPE_CHECKING:
    from mvc.remote.transfer import TransferReport
    from mvc.repo.repository import Repo as RepoType

# mvc.remote.porcelain / transfer import the repository code (about 0.15 s; torch only once a
# transfer opens a snapshot): they are imported where a command runs, as `Repo` is (cli/lazy.py),
# so that listing the commands (`mvc --help`) does not pay for them.


def _default_remote(config: RemoteConfig, name: str | None) -> str:
    """NAME, else `origin`, else the only remote there is."""
    if name is not None:
        return name
    remotes = config.items()
    if ORIGIN in remotes or not remotes:
        return ORIGIN
    if len(remotes) == 1:
        return next(iter(remotes))
    raise UsageError(f"several remotes ({', '.join(remotes)}) and none named {ORIGIN!r}: name one")


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
    """Forget remote NAME and its remote-tracking branches (nothing on the remote changes)."""
    repo = Repo.discover()
    RemoteConfig(repo.mvc_dir).remove(name)
    refs = repo.store.refs
    for ref, value in list(refs.iter_refs(f"{REMOTES}{name}/")):
        refs.update_ref(ref, value, None, f"remote remove {name}")
        refs.delete_reflog(ref)


@click.command()
@click.argument("remote_name", metavar="[REMOTE]", required=False)
@click.argument("refs", nargs=-1)
@click.option("-f", "--force", is_flag=True, help="Overwrite remote refs even when that drops commits there.")
@quiet_option
def push(remote_name: str | None, refs: tuple[str, ...], force: bool, quiet: bool) -> None:
    """Send branches or tags (default: the current branch) and the objects the remote lacks.

    Objects go first, then each ref by compare-and-swap: a ref that moved on the remote, or
    that would lose commits there, is refused (exit 142) unless --force."""
    repo = Repo.discover()
    config = RemoteConfig(repo.mvc_dir)
    name = _default_remote(config, remote_name)
    target = open_remote(config.url(name))
    from mvc.remote.porcelain import push_updates, record_push
    from mvc.remote.transfer import push as push_objects

    try:
        updates = push_updates(repo.store.refs, list(refs), repo.current_branch())
        with terminal_progress(quiet=quiet) as progress:
            report = push_objects(repo.odb, target, updates, force=force, progress=progress)
    finally:
        target.close()
    record_push(repo.store.refs, name, report)
    echo(f"push {name}: {_objects_line('sent', report)}")
    for r in report.refs:
        echo(f"  {r.ref}: {_short(r.old)} -> {_short(r.new)} ({r.status})")


@click.command()
@click.argument("remote_name", metavar="[REMOTE]", required=False)
@quiet_option
def fetch(remote_name: str | None, quiet: bool) -> None:
    """Copy the remote's branches (as refs/remotes/REMOTE/BRANCH) and new tags, with the
    objects this repository lacks."""
    repo = Repo.discover()
    config = RemoteConfig(repo.mvc_dir)
    name = _default_remote(config, remote_name)
    _fetch(repo, name, config.url(name), quiet)


def _fetch(repo: RepoType, name: str, url: str, quiet: bool) -> TransferReport:
    from mvc.remote.transfer import fetch as fetch_objects

    source = open_remote(url, spool_dir=repo.mvc_dir)
    try:
        with terminal_progress(quiet=quiet) as progress:
            store = repo.store
            report = fetch_objects(store.blobs, store.refs, source, name,
                                   lock=store.maintenance.write_lock(), progress=progress)
    finally:
        source.close()
    echo(f"fetch {name}: {_objects_line('received', report)}")
    for r in report.refs:
        echo(f"  {r.ref}: {_short(r.old)} -> {_short(r.new)} ({r.status})")
    return report


@click.command()
@click.argument("remote_name", metavar="[REMOTE]", required=False)
@click.argument("branch", required=False)
@quiet_option
def pull(remote_name: str | None, branch: str | None, quiet: bool) -> None:
    """Fetch, then fast-forward BRANCH (default: the current branch) to the remote's.

    A branch that has diverged from the remote's is refused (exit 142). The working
    checkpoint file is not rewritten: `mvc checkout BRANCH` writes it."""
    repo = Repo.discover()
    config = RemoteConfig(repo.mvc_dir)
    name = _default_remote(config, remote_name)
    branch = branch or repo.current_branch()
    if branch is None:
        raise UsageError("HEAD is detached: name the branch to pull")
    report = _fetch(repo, name, config.url(name), quiet)
    from mvc.remote.remote_refs import check_named

    check_named(report.skipped_refs, f"refs/heads/{branch}", name)
    upstream = f"{REMOTES}{name}/{branch}"
    target = repo.store.refs.read_ref(upstream)
    if target is None:
        raise UsageError(f"the remote {name!r} has no branch {branch!r}")
    from mvc.remote.porcelain import fast_forward

    r = fast_forward(repo.odb, repo.store.refs, branch, target, f"{name}/{branch}")
    echo(f"pull: branch {branch}: {_short(r.old)} -> {_short(r.new)} ({r.status})")
    if r.status == "fast-forward" and repo.current_branch() == branch:
        echo(f"pull: run `mvc checkout {branch}` to write its checkpoint")


@click.command()
@click.argument("url")
@click.argument("directory", required=False)
@quiet_option
def clone(url: str, directory: str | None, quiet: bool) -> None:
    """Create a repository in DIRECTORY (default: the URL's last component) from the remote
    at URL, named origin, with every commit of its branches and tags (no --depth: a clone
    is complete)."""
    from mvc.remote.porcelain import clone as clone_repo, default_clone_dir

    with terminal_progress(quiet=quiet) as progress:
        res = clone_repo(url, directory or default_clone_dir(url), progress=progress)
    echo(f"clone: {res.path}: {_objects_line('received', res.report)}")
    if res.branch is None:
        echo("clone: the remote is empty")
    else:
        echo(f"clone: on branch {res.branch} at {_short(res.commit)}; "
             f"`mvc checkout {res.branch}` writes its checkpoint")


COMMANDS = [remote, push, fetch, pull, clone]
