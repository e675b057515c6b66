"""The remote commands' steps around `transfer`: which refs a push sends, the remote-tracking
refs, pull's fast-forward, and clone.

Each takes the parts it needs (an `ObjectDB`, a ref store, a `Remote`); only
`clone`, which creates a repository, composes a `Repo` itself.
"""
from __future__ import annotations

import errno
import fcntl
import os
import secrets
import shlex
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlparse

from mvc.errors import UsageError
from mvc.progress import NO_PROGRESS, Progress
from mvc.remote.config import ORIGIN, REMOTES, RemoteConfig
from mvc.remote.shallow import Want, check_depth
from mvc.remote.tracking import Upstream, set_upstream
from mvc.remote.transfer import (
    NonFastForwardError,
    RefResult,
    TransferReport,
    fetch,
    is_ancestor,
)
from mvc.repo import refs as R
from mvc.repo.objectdb import ObjectDB
from mvc.repo.repository import MVC_DIR, Repo
from mvc.store import ANY, RefStore
from mvc.store.objstore import Remote, open_remote
from mvc.store.objstore.storage import redact_url

#: The name of a clone's working directory, before it is moved into place: a sibling
#: ``.<dest name>.mvc-clone-<random>`` of an absent destination, or ``.mvc-clone-<random>``
#: inside an existing empty one (whose parent may not be writable, or may be another filesystem).
CLONE_TMP = ".mvc-clone-"


class CloneTargetError(UsageError):
    """The directory to clone into exists and is not empty (nothing was written)."""

    exit_code = 149


def push_updates(refs: RefStore, names: list[str], current: str | None, *,
                 all_branches: bool = False, tags: bool = False) -> dict[str, str]:
    """Remote ref -> local commit id for what `mvc push` was given: branch or tag names (a
    branch first), full ``refs/heads/`` / ``refs/tags/`` names, or none: the current branch.
    `all_branches` (``--all``): every branch, and no names; `tags` (``--tags``): every tag
    too (alone: only the tags), as git's push does."""
    if all_branches and names:
        raise UsageError("push --all sends every branch: name no branch or tag with it")
    out: dict[str, str] = {}
    if all_branches or tags:
        for prefix in ([R.HEADS] if all_branches else []) + ([R.TAGS] if tags else []):
            out.update((n, v) for n, v in refs.iter_refs(prefix) if not R.is_symbolic(v))
        if not names:
            return out
    if not names:
        if current is None:
            raise UsageError("HEAD is detached: name the branch or tag to push")
        names = [current]
    for name in names:
        candidates = [name] if name.startswith(("refs/heads/", "refs/tags/")) else \
            [R.HEADS + name, R.TAGS + name]
        for ref in candidates:
            value = refs.read_ref(ref)
            if value is not None and not R.is_symbolic(value):
                out[ref] = value
                break
        else:
            raise R.NoSuchRefError(f"no branch or tag named {name!r} to push")
    return out


def record_push(refs: RefStore, remote_name: str, report: TransferReport) -> None:
    """Move ``refs/remotes/<remote>/<branch>`` to what the push left on the remote."""
    for r in report.refs:
        tracking = f"{REMOTES}{remote_name}/{r.ref[len(R.HEADS):]}"
        if r.ref.startswith(R.HEADS) and r.new is not None and refs.read_ref(tracking) != r.new:
            refs.update_ref(tracking, ANY, r.new, f"push: {remote_name}")


def fast_forward(odb: ObjectDB, refs: RefStore, branch: str, target: str,
                 upstream: str) -> RefResult:
    """Move branch `branch` forward to `target` (named `upstream` in messages), only if its
    commit is in `target`'s history (`NonFastForwardError`: diverged)."""
    ref = R.HEADS + branch
    old = refs.read_ref(ref)
    if old == target:
        return RefResult(ref, old, target, "up to date")
    if old is not None and not is_ancestor(odb, old, target):
        if is_ancestor(odb, target, old):
            return RefResult(ref, old, old, "ahead")
        raise NonFastForwardError(
            f"branch {branch!r} and {upstream} have diverged (mvc pull only fast-forwards): "
            f"keep yours and `mvc push --force`, or take theirs with "
            f"`mvc branch -D` + `mvc branch {branch} {upstream}`")
    refs.update_ref(ref, old, target, f"pull: fast-forward to {upstream}")
    return RefResult(ref, old, target, "fast-forward")


def default_clone_dir(url: str) -> str:
    """The directory `mvc clone URL` makes: the URL's last path component (else its bucket)."""
    parsed = urlparse(url)
    tail = [p for p in parsed.path.split("/") if p]
    return tail[-1] if tail else (parsed.netloc or "repo")


@dataclass
class CloneResult:
    """Where the clone is, what it fetched, and the branch HEAD is on (None: empty remote)."""

    path: Path
    report: TransferReport
    branch: str | None
    commit: str | None
    #: The remote's other branches, as the clone's remote-tracking branches (``origin/exp``).
    others: list[str] = field(default_factory=list)
    #: Whether the history holds quantized (lossy) commits: the clone has no quality hook
    #: (config is not cloned), so its own commits are lossless until one is set.
    lossy: bool = False


def clone(url: str, dest: str | os.PathLike[str], *, progress: Progress = NO_PROGRESS,
          depth: int | None = None) -> CloneResult:
    """Create a repository at `dest` (absent or empty) with remote ``origin`` = `url`, fetch
    everything, and put HEAD on a branch made from the remote's ``main`` (else its first
    branch), following ``origin/main``; the remote's other branches are the remote-tracking
    branches ``origin/NAME`` (`mvc switch NAME` makes one a branch), as git's clone does.

    `depth`: a shallow clone (`mvc.remote.shallow`): that branch only, its newest `depth`
    commits with every object their snapshots need (delta parents included), no tags.

    The repository is built in a working directory (`CLONE_TMP`) and moved into place by one
    rename once complete, so `dest` is only ever as it was or a whole clone.  On an error the
    working directory is removed; a clone killed outright leaves it behind, and the next clone
    into `dest` removes it (a live clone holds a lock on its own, which keeps it)."""
    check_depth(depth)
    path = Path(dest).resolve()
    existed = _check_target(path)
    remote = open_remote(url)
    try:
        if existed:
            parent, prefix = path, CLONE_TMP
        else:
            path.parent.mkdir(parents=True, exist_ok=True)
            parent, prefix = path.parent, f".{path.name}{CLONE_TMP}"
        _remove_abandoned(parent, prefix)
        work, held = _make_work_dir(parent, prefix)
        remote.blobs.spool_dir = str(work)  # on the clone's disk, not in a memory-backed /tmp
        try:
            result = _fill(work, url, remote, progress, depth)
            _move_into_place(work, path, existed)
        except BaseException:
            shutil.rmtree(work, ignore_errors=True)
            raise
        finally:
            os.close(held)
    finally:
        remote.close()
    result.path = path
    return result


def _check_target(path: Path) -> bool:
    """Whether `path` exists (as an empty directory, or one holding only what killed clones
    left); `CloneTargetError`, saying what to do, if it cannot be cloned into."""
    if not path.exists():
        return False
    if not path.is_dir():
        raise CloneTargetError(f"{path} exists and is not a directory: clone into another directory "
                               "(`mvc clone URL DIR`) or move it away")
    entries = sorted(p.name for p in path.iterdir() if not p.name.startswith(CLONE_TMP))
    if entries == [MVC_DIR]:
        raise CloneTargetError(
            f"{path} already holds an mvc repository: use it (`mvc -C {shlex.quote(str(path))} fetch`), "
            f"or remove it (`rm -rf {shlex.quote(str(path / MVC_DIR))}`) to clone again")
    if entries:
        shown = ", ".join(entries[:3]) + (", ..." if len(entries) > 3 else "")
        raise CloneTargetError(
            f"{path} exists and is not empty ({shown}): clone into a new or empty directory "
            "(`mvc clone URL DIR`), or move its content away first")
    return True


def _fill(work: Path, url: str, remote: Remote, progress: Progress, depth: int | None) -> CloneResult:
    """Make the repository in `work`: remote origin, everything fetched (`depth`: the newest
    commits of the default branch), HEAD on a branch following its remote-tracking branch."""
    repo = Repo.init(work)
    try:
        RemoteConfig(repo.mvc_dir).add(ORIGIN, url)
        store = repo.store
        want = Want(depth=depth, default_branch=depth is not None)
        report = fetch(store.blobs, store.refs, remote, ORIGIN,
                       lock=store.maintenance.write_lock(), progress=progress, want=want)
        result = CloneResult(work, report, None, None)
        tracking = dict(store.refs.iter_refs(f"{REMOTES}{ORIGIN}/"))
        if tracking:
            names = [n[len(f"{REMOTES}{ORIGIN}/"):] for n in tracking]
            branch = "main" if "main" in names else names[0]
            commit = tracking[f"{REMOTES}{ORIGIN}/{branch}"]
            why = f"clone: from {redact_url(url)}"
            store.refs.update_ref(R.HEADS + branch, None, commit, why)
            store.refs.update_ref(R.HEAD, ANY, R.SYMREF + R.HEADS + branch, why)
            set_upstream(repo.config, branch, Upstream(ORIGIN, branch))
            result.branch, result.commit = branch, commit
            result.others = [f"{ORIGIN}/{n}" for n in names if n != branch]
        tips = set(tracking.values()) | {v for _, v in store.refs.iter_refs(R.TAGS)}
        result.lossy = any(c.quant is not None for c in repo.odb.walk_commits(tips))
    finally:
        repo.close()
    return result


def _make_work_dir(parent: Path, prefix: str) -> tuple[Path, int]:
    """A new directory ``parent/<prefix><random>`` and a descriptor holding an exclusive flock
    on it (what tells `_remove_abandoned` in another clone that it is in use)."""
    while True:
        work = parent / f"{prefix}{secrets.token_hex(6)}"
        try:
            work.mkdir()
        except FileExistsError:
            continue
        fd = os.open(work, os.O_RDONLY | os.O_DIRECTORY)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            # Another clone took it for abandoned between mkdir and flock, and removes it.
            os.close(fd)
            continue
        except OSError:
            return work, fd  # no flock on this filesystem: nobody removes it, nobody is misled
        if os.fstat(fd).st_nlink > 0:
            return work, fd
        os.close(fd)  # ...and had removed it already


def _remove_abandoned(parent: Path, prefix: str) -> None:
    """Remove the working directories of killed clones: those under `parent` named
    ``<prefix>*`` whose flock is free (a running clone holds its own)."""
    try:
        candidates = [p for p in parent.iterdir() if p.name.startswith(prefix)]
    except OSError:
        return
    for work in candidates:
        try:
            fd = os.open(work, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
        except OSError:
            continue  # gone already, or not a directory: not ours to remove
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            here, held = os.stat(work, follow_symlinks=False), os.fstat(fd)
            # Still the directory locked (a finished clone renames its own away before unlocking).
            if (here.st_dev, here.st_ino) == (held.st_dev, held.st_ino):
                shutil.rmtree(work, ignore_errors=True)
        except OSError:
            pass  # in use (or no flock here): leave it
        finally:
            os.close(fd)


def _move_into_place(work: Path, path: Path, existed: bool) -> None:
    """One rename that makes the finished clone in `work` the repository at `path`."""
    src, dst = (work / MVC_DIR, path / MVC_DIR) if existed else (work, path)
    try:
        os.rename(src, dst)
    except OSError as exc:
        if exc.errno in (errno.EEXIST, errno.ENOTEMPTY, errno.ENOTDIR, errno.EISDIR):
            raise CloneTargetError(f"{dst} appeared while cloning: nothing was written; "
                                   "clone into another directory") from None
        raise
    if existed:
        shutil.rmtree(work, ignore_errors=True)
