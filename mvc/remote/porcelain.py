"""The remote commands' steps around `transfer`: which refs a push sends, the remote-tracking
refs, pull's fast-forward, and clone.

Each takes the parts it needs (an `ObjectDB`, a ref store, a `Remote`); only
`clone`, which creates a repository, composes a `Repo` itself.
"""
from __future__ import annotations

import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlparse

from mvc.errors import UsageError
from mvc.progress import NO_PROGRESS, Progress
from mvc.remote.config import ORIGIN, REMOTES, RemoteConfig
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
from mvc.store.objstore import open_remote
from mvc.store.objstore.storage import redact_url


class CloneTargetError(UsageError):
    """The directory to clone into exists and is not empty (nothing was written)."""

    exit_code = 149


def push_updates(refs: RefStore, names: list[str], current: str | None) -> dict[str, str]:
    """Remote ref -> local commit id for what `mvc push` was given: branch or tag names (a
    branch first), full ``refs/heads/`` / ``refs/tags/`` names, or none: the current branch."""
    if not names:
        if current is None:
            raise UsageError("HEAD is detached: name the branch or tag to push")
        names = [current]
    out: dict[str, str] = {}
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
        if r.ref.startswith(R.HEADS) and r.new is not None:
            refs.update_ref(f"{REMOTES}{remote_name}/{r.ref[len(R.HEADS):]}", ANY, r.new,
                            f"push: {remote_name}")


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


def clone(url: str, dest: str | os.PathLike[str], *, progress: Progress = NO_PROGRESS) -> CloneResult:
    """Create a repository at `dest` (absent or empty) with remote ``origin`` = `url`, fetch
    everything, and put HEAD on the remote's ``main`` (else its first branch).  On any error
    what was created is removed again."""
    path = Path(dest).resolve()
    existed = path.exists()
    if existed and (not path.is_dir() or any(path.iterdir())):
        raise CloneTargetError(f"{path} exists and is not an empty directory")
    remote = open_remote(url)
    try:
        repo = Repo.init(path)
        try:
            RemoteConfig(repo.mvc_dir).add(ORIGIN, url)
            store = repo.store
            report = fetch(store.blobs, store.refs, remote, ORIGIN,
                           lock=store.maintenance.write_lock(), progress=progress)
            tracking = dict(store.refs.iter_refs(f"{REMOTES}{ORIGIN}/"))
            branch = commit = None
            if tracking:
                names = [n[len(f"{REMOTES}{ORIGIN}/"):] for n in tracking]
                branch = "main" if "main" in names else names[0]
                commit = tracking[f"{REMOTES}{ORIGIN}/{branch}"]
                why = f"clone: from {redact_url(url)}"
                store.refs.update_ref(R.HEADS + branch, None, commit, why)
                store.refs.update_ref(R.HEAD, ANY, R.SYMREF + R.HEADS + branch, why)
        finally:
            repo.close()
    except BaseException:
        if existed:
            shutil.rmtree(path / MVC_DIR, ignore_errors=True)
        else:
            shutil.rmtree(path, ignore_errors=True)
        raise
    finally:
        remote.close()
    return CloneResult(path, report, branch, commit)
