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
@quiet_option
def fetch(remote_name: str | None, quiet: bool) -> None:
    """Copy the remote's branches (as the remote-tracking branches REMOTE/BRANCH, i.e.
    refs/remotes/REMOTE/BRANCH) and new tags, with the objects this repository lacks.
    Default REMOTE: the current branch's upstream's, else origin."""
    repo = Repo.discover()
    config = RemoteConfig(repo.mvc_dir)
    name = _default_remote(config, remote_name, _upstream(repo))
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
@quiet_option
def clone(url: str, directory: str | None, quiet: bool) -> None:
    """Create a repository in DIRECTORY (default: the URL's last component) from the remote
    at URL, named origin, with every commit of its branches and tags (no --depth: a clone
    is complete). HEAD is on a branch made from origin's main (else its first branch),
    following it; the other branches are origin/NAME (`mvc branch -a`, `mvc switch NAME`)."""
    from mvc.remote.porcelain import clone as clone_repo, default_clone_dir

    with terminal_progress(quiet=quiet) as progress:
        res = clone_repo(url, directory or default_clone_dir(url), progress=progress)
    echo(f"clone: {res.path}: {_objects_line('received', res.report)}")
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
