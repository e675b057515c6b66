"""Sharded saves and loads straight to object storage: ``s3://bucket/prefix``, ``file:///dir``.

``MvcStorageWriter("s3://bucket/runs/exp1", message=...)`` and
``MvcStorageReader("s3://bucket/runs/exp1", rev=...)`` need no local repository on any host:
the remote is the repository.  The writer's plan / write / finish are the local ones
(`mvc.dcp.writer`, `CommitTransaction`, `pipeline.write` / `publish`); only the parts they run
on differ, and this module builds them from the remote's (`mvc.store.objstore`):

    objects   every rank uploads its own chunks (`UploadBlobs`: the remote's own layout --
              loose objects of 1 MiB or more, packs of the small ones -- `workers` uploads
              in parallel; a loose object the remote already holds is not sent again), so
              ``mvc clone`` / ``fetch`` / ``checkout --remote`` of the bucket read them;
    parent    the branch head on the remote, its objects read through `RemoteRepo` (with
              `cache_dir`, a local read-through cache of every object read);
    publish   the coordinator's `CommitTransaction.publish`: the snapshot, then the commit
              (one upload each, in that order), then the branch moves by the remote's
              conditional-write compare-and-swap -- what ``mvc push`` moves refs with.  The
              commit point is that one conditional write: a save killed before it leaves
              the branch where it was (its uploads are unreferenced), and of two jobs
              saving to one branch from the same head exactly one wins; the other gets
              `RefConflictError`.

Settings: a remote holds no configuration (``mvc clone`` does not copy one, ``push`` does
not send one), so the writer's `config=` mapping (mvc config keys, as ``mvc config`` takes
them: ``commit.mode``, ``commit.quant``, ``quality.epsilon``, ``commit.chunk_mib``,
``user.name`` ...) over mvc's defaults is the save's configuration, with the writer's own
arguments (`lossless=`, `quant=`, `epsilon=` ...) taking precedence as for a local save.
"""
from __future__ import annotations

import os
import re
from collections.abc import Iterable, Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from mvc.errors import DataError, UsageError
from mvc.remote.readonly import RemoteRepo
from mvc.repo import pipeline
from mvc.repo import refs as R
from mvc.repo.commitopts import commit_settings
from mvc.repo.config import Config
from mvc.repo.objects import Commit, Snapshot, TensorRecord
from mvc.repo.levelcache import LevelCache
from mvc.repo.reader import TensorReader
from mvc.repo.records import parent_ref
from mvc.repo.repository import Repo
from mvc.repo.transaction import CommitTransaction, Published
from mvc.integrations.repo_handle import RepoOnDemand
from mvc.store import MemoryBlobStore
from mvc.store.base import BytesLike, byte_view, object_id
from mvc.store.contracts import BlobStore
from mvc.store.memory import MemoryMaintenance
from mvc.store.objstore import Remote, open_remote
from mvc.store.objstore.blobs import PACK_MAX_OBJECT, RemoteBlobStore, loose_key
from mvc.store.objstore.cached import open_cache

_URL = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*://")


class RemoteOptionError(UsageError):
    """A remote's option (`branch=`, `config=`, `cache_dir=`) given for a local repository."""

    exit_code = 167


def is_url(target: object) -> bool:
    """Whether `target` names a remote (``s3://...``, ``file://...``) rather than a path."""
    return isinstance(target, str) and _URL.match(target) is not None


class SettingsConfig(Config):
    """The configuration of a save to (or load from) a remote: `values` (mvc config keys,
    checked as ``mvc config`` checks them) over mvc's defaults.  Read-only."""

    def __init__(self, values: Mapping[str, Any] | None = None) -> None:
        super().__init__(Path(os.devnull))
        self._values = dict(values or {})
        for key in self._values:
            self.get(key)   # an unknown key or a bad value fails here, not mid-save

    def _load(self) -> dict[str, Any]:
        return dict(self._values)

    def set(self, key: str, value: Any) -> None:
        raise UsageError("the configuration of a save to a remote is the writer's config=")


class UploadBlobs(BlobStore):
    """The remote's blob store as a save writes to it (`pipeline.write`, `publish`).

    `put_many` uploads in the remote's layout, `remote.blobs.workers` at a time, after one
    HEAD per loose-sized object (a chunk the remote holds already -- a frozen layer, a retry
    -- is not sent again).  `ordered`: one object after another instead, each stored before
    the next starts (the coordinator's snapshot, then its commit).  `has` answers from what
    this store uploaded or found and from `vouched` (the chunks of records other ranks
    returned, which `pipeline.write` stored before returning them) before asking the remote:
    a lookup of a packed object there would list every pack of the remote."""

    def __init__(self, remote: Remote, *, ordered: bool = False) -> None:
        self.remote = remote
        self.ordered = ordered
        self.stored: set[str] = set()
        self.vouched: set[str] = set()
        #: What this store sent: objects and bytes (a chunk found on the remote counts in
        #: `skipped`, not here).
        self.sent_objects = 0
        self.sent_bytes = 0
        self.skipped = 0

    def put(self, data: BytesLike) -> str:
        return self.put_many([data])[0]

    def put_many(self, items: Iterable[BytesLike]) -> list[str]:
        views = [byte_view(d) for d in items]
        ids = [object_id(v) for v in views]
        todo: dict[str, memoryview] = {}
        for oid, mv in zip(ids, views):
            if oid not in self.stored:
                todo.setdefault(oid, mv)
        big = [o for o, mv in todo.items() if mv.nbytes >= PACK_MAX_OBJECT]
        if big:
            storage = self.remote.storage
            with ThreadPoolExecutor(max(1, self.remote.blobs.workers)) as pool:
                there = list(pool.map(lambda o: storage.head(loose_key(o)), big))
            for oid, size in zip(big, there):
                if size is not None:
                    del todo[oid]
                    self.stored.add(oid)
                    self.skipped += 1
        groups = [[mv] for mv in todo.values()] if self.ordered else [list(todo.values())]
        for group in groups:
            if group:
                self.remote.blobs.put_many(group)
        self.stored.update(todo)
        self.sent_objects += len(todo)
        self.sent_bytes += sum(mv.nbytes for mv in todo.values())
        return ids

    def has(self, oid: str) -> bool:
        return oid in self.stored or oid in self.vouched or self.remote.blobs.has(oid)

    def get(self, oid: str) -> bytes:
        return self.remote.blobs.get(oid)

    def size(self, oid: str) -> int:
        return self.remote.blobs.size(oid)

    def iter_ids(self) -> Iterator[str]:
        return self.remote.blobs.iter_ids()

    def delete(self, oids: Iterable[str]) -> int:
        raise UsageError("a save never deletes objects on a remote")

    def close(self) -> None:
        """Nothing of its own: the remote is its `RemoteSide`'s to close."""


class RemoteCommitTransaction(CommitTransaction):
    """`CommitTransaction` on a remote: the commit moves `ref` (a remote has no HEAD to say
    which branch), and `publish` takes the chunks of the records it is handed as stored (see
    `UploadBlobs`); the write lock is this process's only -- between processes and hosts the
    ref's compare-and-swap decides."""

    def __init__(self, side: RemoteSide, ref: str, blobs: UploadBlobs, **parts: Any) -> None:
        super().__init__(blobs=blobs, **parts)
        self.side = side
        self.ref = ref
        self.uploads = blobs

    def target(self) -> tuple[str, str | None]:
        return self.ref, self.refs.read_ref(self.ref)

    def prefetch(self, snapshot: str | None, records: Iterable[TensorRecord]) -> None:
        """Read what decoding `records` (of `snapshot`, the parent's) will read, in few
        requests: `RemoteSide.prefetch`."""
        self.side.prefetch(snapshot, records)

    def publish(self, manifest: pipeline.Manifest, records: Iterable[TensorRecord],
                info: pipeline.CommitInfo, **kwargs: Any) -> Published:
        records = list(records)
        self.uploads.vouched.update(oid for rec in records for oid in rec.chunks)
        self.uploads.ordered = True   # the snapshot stored before the commit that names it
        return super().publish(manifest, records, info, **kwargs)


class RemoteSide:
    """A remote opened as the repository a save writes to or a load reads from: what
    `MvcStorageWriter` and `MvcStorageReader` use of a `Repo` (`config`, `resolve`,
    `read_commit`, `read_snapshot`, `reader`, `commit_transaction`), over the remote's parts.

    `write`: the bucket (or directory) must exist, and the remote's format marker is written
    if it is not there yet (an empty bucket becomes an empty repository); a read of a remote
    without one is `RemoteMissingError`.  The remote's refs are read once, when opened.
    `levels`: the decoded levels kept between saves of one process (the next save's parent
    is then one delta away, whatever its chain's depth).  A writer without `cache_dir` keeps
    what it reads in memory for the save (the parent's quantized records: small)."""

    def __init__(self, url: str, *, branch: str, settings: Mapping[str, Any] | None,
                 cache_dir: str | None, write: bool, levels: LevelCache | None = None,
                 workers: int = 8) -> None:
        self.config = SettingsConfig(settings)
        self.branch = branch
        remote = open_remote(url, workers=workers, spool_dir=cache_dir)
        cache = None
        try:
            if write:
                remote.storage.check_exists()
                remote.ensure_format()
            cache = open_cache(cache_dir) if cache_dir is not None else None
            self.view = RemoteRepo(remote, cache=cache)
        except BaseException:
            remote.close()
            if cache is not None:
                cache.close()
            raise
        if write:
            # a save's batched reads (`prefetch`) take a pack's objects between the ones it
            # wants along, as a full fetch does: a rank's parent records sit in its own packs
            # among its exact ones, and one request costs more than the bytes between them
            remote.blobs.gap = RemoteBlobStore.gap
            if cache is None:
                self.view.blobs.cache = MemoryBlobStore()
        self.remote = remote
        self.url = remote.url
        self._reader = TensorReader(self.view.odb, levels=levels)

    def resolve(self, rev: str) -> str:
        return self.view.resolve(rev)

    def read_commit(self, cid: str) -> Commit:
        return self.view.read_commit(cid)

    def read_snapshot(self, sid: str) -> Snapshot:
        return self.view.odb.read_snapshot(sid)

    @property
    def reader(self) -> TensorReader:
        return self._reader

    def prefetch(self, snapshot: str | None, records: Iterable[TensorRecord]) -> None:
        """Bring the payloads that decoding `records` (of snapshot `snapshot`) reads into the
        read cache: their chunks, then their delta parents', level by level down to a base or
        to levels decoded already -- one batched read (`get_many`: adjacent packed objects in
        one request) per level instead of a lookup and a read per object.  Only a speed-up:
        what it cannot follow is left to the reader, which reports it."""
        cache = self.view.blobs.cache
        if snapshot is None or cache is None:
            return
        level = [(snapshot, rec) for rec in records]
        seen: set[tuple[str, str]] = set()
        snaps: dict[str, Snapshot] = {}
        while level:
            level = [(sid, rec) for sid, rec in level
                     if (sid, rec.name) not in seen and self._reader.levels.get((sid, rec.name)) is None]
            seen.update((sid, rec.name) for sid, rec in level)
            want = [o for _, rec in level for o in rec.chunks if not cache.has(o)]
            for _, data in self.remote.blobs.get_many(want):
                cache.put(data)
            nxt = []
            for _, rec in level:
                try:
                    ref = parent_ref(rec)
                    if ref is None:
                        continue
                    if ref[0] not in snaps:
                        snaps[ref[0]] = self.read_snapshot(ref[0])
                except DataError:
                    continue
                prec = next((r for r in snaps[ref[0]].tensors if r.name == ref[1]), None)
                if prec is not None:
                    nxt.append((ref[0], prec))
            level = nxt

    def commit_transaction(self) -> RemoteCommitTransaction:
        """A transaction moving this remote's branch, its uploads going to the remote."""
        get = self.config.get
        return RemoteCommitTransaction(
            self, R.HEADS + self.branch, UploadBlobs(self.remote),
            refs=self.remote.refs, maintenance=MemoryMaintenance(MemoryBlobStore()),
            odb=self.view.odb, read_quantized=self.reader.read_quantized,
            read_centroids=self.reader.read_centroids,
            settings=commit_settings(self.config), lock_timeout=float(get("core.lock_timeout")),
            user_name=get("user.name"), user_email=get("user.email"))

    def close(self) -> None:
        self.view.close()


#: Decoded levels by remote URL, kept for the life of the process: a training job makes a new
#: writer per save, and its next save's parent is then one delta away, whatever its chain's
#: depth.  Bounded (`LevelCache`: 2 GiB of levels each).
_LEVELS: dict[str, LevelCache] = {}


class RemoteTarget:
    """A remote named by URL, opened (`RemoteSide`) by each process on first use and again
    after `reset` (each save and load reads the branch as it is then).  Picklable: only the
    URL and the options travel."""

    def __init__(self, url: str, *, branch: str | None = None,
                 settings: Mapping[str, Any] | None = None,
                 cache_dir: str | os.PathLike[str] | None = None, write: bool) -> None:
        self.path = url
        self.branch = branch or "main"
        R.check_ref_name(self.branch, "branch")
        SettingsConfig(settings)   # checked where the writer is made
        self.settings = dict(settings or {})
        self.cache_dir = None if cache_dir is None else os.path.expanduser(os.fspath(cache_dir))
        self.write = write
        self.levels = _LEVELS.setdefault(url, LevelCache())
        self._side: RemoteSide | None = None

    def get(self) -> RemoteSide:
        if self._side is None:
            self._side = RemoteSide(self.path, branch=self.branch, settings=self.settings,
                                    cache_dir=self.cache_dir, write=self.write,
                                    levels=self.levels)
        return self._side

    def close(self) -> None:
        if self._side is not None:
            self._side.close()
            self._side = None

    def retarget(self, path: str | os.PathLike[str]) -> None:
        """Name another remote (a save or load's `checkpoint_id`)."""
        self.close()
        self.path = os.fspath(path)
        self.levels = _LEVELS.setdefault(self.path, LevelCache())

    def detached(self) -> RemoteTarget:
        """The same target, not opened (what a pickled writer carries)."""
        return RemoteTarget(self.path, branch=self.branch, settings=self.settings,
                            cache_dir=self.cache_dir, write=self.write)

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        del state["levels"], state["_side"]   # the receiving process's own, made there
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self.levels = _LEVELS.setdefault(self.path, LevelCache())
        self._side = None


#: What a storage writer or reader holds: a local repository or a remote.
Target = RepoOnDemand | RemoteTarget


def open_target(repo: str | os.PathLike[str] | Repo, *, write: bool,
                branch: str | None = None, settings: Mapping[str, Any] | None = None,
                cache_dir: str | os.PathLike[str] | None = None) -> Target:
    """A remote for a URL, else the local repository (`RemoteOptionError` when a remote's
    options are given for a local repository: its settings are its config, its branch HEAD's)."""
    if is_url(repo):
        assert isinstance(repo, str)
        return RemoteTarget(repo, branch=branch, settings=settings, cache_dir=cache_dir,
                            write=write)
    given = [n for n, v in (("branch", branch), ("config", settings), ("cache_dir", cache_dir))
             if v is not None]
    if given:
        raise RemoteOptionError(f"{', '.join(given)}= apply to a remote (s3://, file://); a local "
                         "repository's settings are its config and a save moves HEAD's branch")
    return RepoOnDemand(repo)


class UsesTarget:
    """`repo` (the opened repository or remote), `path` and `close` for a DCP storage writer
    or reader holding a `Target` as `_repo`."""

    _repo: Target

    @property
    def repo(self) -> Repo | RemoteSide:
        """The repository or remote, opened by this process on first use."""
        return self._repo.get()

    @property
    def path(self) -> Path | str:
        """The repository's work tree, or the remote's URL."""
        return self._repo.path

    def close(self) -> None:
        """Close what this object opened."""
        self._repo.close()
