"""A remote read in place: revisions and checkpoints straight from object storage, without a
clone (`mvc checkout --remote NAME REV -o FILE`; `open_remote_repo(url).read_state(rev)`).

`RemoteRepo` is the read side of a repository over a remote's parts: its refs, read once
into memory (`mvc.remote.remote_refs`: bad ones skipped with a warning, as a fetch does),
its objects read as they are needed -- a checkout reads the commit, its snapshot and the
payloads of the tensors it restores, each quantized tensor's delta chain through the
parents' snapshots, and nothing else (exact reads: no neighbouring objects of a pack).
Revisions are spelled as in a repository (``main``, ``v1``, ``main~3``, a full id or a
prefix, `refs/heads/X`); ``HEAD`` is the remote's ``main`` (else its first branch).  With
`cache_dir`, every object read is kept there (`mvc.store.objstore.cached`) and read from it
afterwards.  Nothing is written to the remote.
"""
from __future__ import annotations

import os
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any

from mvc.progress import Progress
from mvc.remote.remote_refs import read_remote_refs, walk_view
from mvc.remote.shallow import UnknownRemoteRevisionError, default_branch, exact_reads
from mvc.repo.revparse import UnknownRevisionError
from mvc.repo import refs as R
from mvc.repo.objectdb import ObjectDB
from mvc.repo.objects import Commit
from mvc.repo.refops import RefOps
from mvc.store import MemoryBlobStore, MemoryRefStore
from mvc.store.lmdb_store import LmdbStore
from mvc.store.objstore import Remote, RemoteMissingError, open_remote
from mvc.store.objstore.cached import ReadThroughBlobs, open_cache

if TYPE_CHECKING:
    import torch

    from mvc.repo.reader import TensorReader


class RemoteRepo:
    """The read side of the repository on a remote (module doc).  Use as a context manager,
    or `close` it."""

    def __init__(self, remote: Remote, *, cache: LmdbStore | None = None) -> None:
        self.remote = remote
        self.url = remote.url
        self._cache = cache
        exact_reads(remote)
        remote.storage.check_exists()  # a mistyped directory or bucket is an error, not "empty"
        if not remote.check_format():
            raise RemoteMissingError(f"{remote.url}: no mvc repository there (nothing was pushed)")
        found = read_remote_refs(remote, MemoryRefStore(), MemoryBlobStore())
        #: The refs revisions are read through: the remote's good branches and tags, its
        #: replacements and pruned marks, and HEAD on its default branch.
        self.refs = walk_view(found, MemoryRefStore())
        for name, value in sorted(found.heads.items()):
            self.refs.update_ref(name, None, value, "remote")
        branch = default_branch(found.heads)
        if branch is not None:
            self.refs.update_ref(R.HEAD, None, R.SYMREF + branch, "remote")
        self.skipped_refs = dict(found.skipped)
        self.blobs = ReadThroughBlobs(remote.blobs, None if cache is None else cache.blobs)
        self.odb = ObjectDB(self.blobs, self.refs)
        self.refops = RefOps(self.refs, self.odb)
        self._reader: TensorReader | None = None

    # ------------------------------------------------------------------ revisions
    def resolve(self, rev: str = "HEAD") -> str:
        """The commit id `rev` names on the remote (`UnknownRemoteRevisionError` if none)."""
        try:
            return self.refops.resolve(rev)
        except UnknownRevisionError as exc:
            raise UnknownRemoteRevisionError(f"{self.url}: {exc}") from None

    def branches(self) -> list[tuple[str, str]]:
        """(name, commit id) of the remote's branches."""
        return self.refops.branches()

    def tags(self) -> list[tuple[str, str]]:
        """(name, commit id) of the remote's tags."""
        return self.refops.tags()

    def read_commit(self, cid: str) -> Commit:
        """The commit `cid` (an id)."""
        return self.odb.read_commit(cid)

    def log(self, rev: str = "HEAD", n: int | None = None) -> list[Commit]:
        """Up to `n` commits of `rev`'s history, newest first (reads one commit each)."""
        out: list[Commit] = []
        for c in self.odb.walk_commits([self.resolve(rev)], order="date"):
            if n is not None and len(out) >= n:
                break
            out.append(c)
        return out

    # ------------------------------------------------------------------ checkpoints
    @property
    def reader(self) -> TensorReader:
        """The tensor reader over the remote's objects (imports torch on first use)."""
        if self._reader is None:
            from mvc.repo.reader import TensorReader

            self._reader = TensorReader(self.odb)
        return self._reader

    def read_state(self, rev: str = "HEAD", *, map_location: str | torch.device | None = None,
                   only: Sequence[str] | None = None, weights_only: bool = False,
                   progress: Progress | None = None, safe_globals: Iterable[str] = ()) -> Any:
        """The checkpoint stored at `rev`, as `Repo.read_state` rebuilds it (`only`,
        `weights_only`: a part of it, reading only that part's payloads).  `safe_globals`:
        more globals the state's non-tensor values may name (`checkpoint.safe_globals`)."""
        from mvc.state.safe_globals import allowing

        cid = self.resolve(rev)
        with allowing(safe_globals):
            return self.reader.read_state(cid, map_location=map_location, only=only,
                                          weights_only=weights_only, progress=progress,
                                          cache_levels=False)

    def close(self) -> None:
        self.blobs.close()
        self.remote.refs.close()
        if self._cache is not None:
            self._cache.close()

    def __enter__(self) -> RemoteRepo:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def open_remote_repo(url: str, *, cache_dir: str | os.PathLike[str] | None = None,
                     workers: int = 8) -> RemoteRepo:
    """The repository at remote `url` (``s3://bucket/prefix``, ``file:///dir``), read-only.
    `cache_dir`: a local directory that keeps every object read (made if absent)."""
    if cache_dir is not None:
        cache_dir = os.path.expanduser(os.fspath(cache_dir))
    remote = open_remote(url, workers=workers, spool_dir=cache_dir)
    cache = open_cache(cache_dir) if cache_dir is not None else None
    try:
        return RemoteRepo(remote, cache=cache)
    except BaseException:
        remote.close()
        if cache is not None:
            cache.close()
        raise
