"""`MvcStorageReader`: `torch.distributed.checkpoint.load` from an mvc commit.

Any commit loads, at any world size: DCP asks for regions of tensors by FQN and offset,
and the reader answers from the records that hold them -- a whole tensor's record, or the
shard records of a sharded save (`mvc.repo.shards`), narrowed to the region asked for.
So a 2-rank save loads into 1 rank or 4 ranks (resharding) or a process without a
process group.  Each record is decoded once per `read_data` through the repository's
`TensorReader` (delta chains, level caches, an Adam first moment's bound), exactly as
``repo.checkout`` decodes it: every load path restores the same values.
"""
from __future__ import annotations

import io
import os
from pathlib import Path
from typing import Any

import torch
from torch.futures import Future
from torch.distributed.checkpoint.metadata import (
    BytesStorageMetadata,
    ChunkStorageMetadata,
    Metadata,
    MetadataIndex,
    StorageMeta,
    TensorProperties,
    TensorStorageMetadata,
)
from torch.distributed.checkpoint.planner import LoadItemType, LoadPlan, LoadPlanner
from torch.distributed.checkpoint.storage import StorageReader
from torch.distributed.checkpoint._nested_dict import FLATTEN_MAPPING

from mvc.dtypes import parse_dtype
from mvc.errors import UsageError
from mvc.repo.objects import TensorRecord
from mvc.repo.repository import Repo
from mvc.repo.shards import ShardLayoutError, check_tiling, shard_of

from mvc.dcp.layout import fqn_view
from mvc.dcp.remote import RemoteTarget, UsesTarget, is_url, open_target


class DcpLayoutError(UsageError):
    """The commit holds a tensor DCP cannot address: a view into another tensor's storage
    (two views of one buffer in the committed state).  Check it out with ``mvc checkout``."""

    exit_code = 163


class MvcStorageReader(UsesTarget, StorageReader):
    """Read the commit `rev` (default HEAD) of the mvc repository at `repo` (a path or `Repo`)
    for ``dcp.load(state, storage_reader=MvcStorageReader("runs/exp1", rev="v1"))``.

    `repo` may be a remote's URL (``s3://bucket/prefix``, ``file:///dir``): the commit is read
    straight from there, no repository needed (`mvc.dcp.remote`; ``HEAD`` is its ``main``,
    else its first branch), and each rank fetches only the commit, its snapshot and the
    records holding the regions it loads (with their delta chains).  `cache_dir=` (a remote
    only): a local directory keeping every object read, for later loads."""

    def __init__(self, repo: str | os.PathLike | Repo, rev: str = "HEAD", *,
                 cache_dir: str | os.PathLike | None = None) -> None:
        super().__init__()
        self._repo = open_target(repo, write=False, cache_dir=cache_dir)
        self.rev = rev
        #: The commit read (set by `read_metadata`).
        self.commit_id: str | None = None
        self._snapshot = ""
        self._records: dict[str, TensorRecord] = {}
        self._values: dict[str, Any] = {}
        self._storage: dict[MetadataIndex, str] = {}

    def reset(self, checkpoint_id: str | os.PathLike | None = None) -> None:
        if checkpoint_id:
            self._repo.retarget(checkpoint_id)
        if isinstance(self._repo, RemoteTarget):
            self._repo.close()   # a load reads the remote's refs as they are now

    @classmethod
    def validate_checkpoint_id(cls, checkpoint_id: str | os.PathLike) -> bool:
        return is_url(checkpoint_id) or (Path(checkpoint_id) / ".mvc" / "store").is_dir()

    @property
    def checkpoint_id(self) -> Path | str:
        """The repository's work tree, or the remote's URL."""
        return self.path

    def read_metadata(self, *args: Any, **kwargs: Any) -> Metadata:
        repo = self.repo
        cid = repo.resolve(self.rev)
        sid = repo.read_commit(cid).snapshot
        snap = repo.read_snapshot(sid)
        skel = snap.skeleton
        views = {o["entry"] for o in skel["objects"] if o.get("kind") != "dense"}
        tensors, values, paths = fqn_view(skel)
        groups: dict[str, list[TensorRecord]] = {}
        for rec in snap.tensors:
            info = shard_of(rec)
            groups.setdefault(info["of"] if info is not None else rec.name, []).append(rec)
        sdm: dict[str, Any] = {}
        storage: dict[MetadataIndex, str] = {}
        for fqn, entry in tensors.items():
            if entry in views:
                raise DcpLayoutError(f"tensor {fqn!r} of commit {cid[:12]} is a view into a "
                                     "storage it shares; DCP cannot load it")
            info = skel["entries"][entry]
            _check_layout(fqn, groups.get(entry, []), info)
            chunks = []
            for rec in groups.get(entry, []):
                shard = shard_of(rec)
                offsets = torch.Size(shard["offsets"] if shard else [0] * len(rec.shape))
                chunks.append(ChunkStorageMetadata(offsets=offsets, sizes=torch.Size(rec.shape)))
                storage[MetadataIndex(fqn, offsets)] = rec.name
            sdm[fqn] = TensorStorageMetadata(
                properties=TensorProperties(dtype=parse_dtype(info["dtype"])),
                size=torch.Size(info["shape"]), chunks=chunks)
        for fqn in values:
            sdm[fqn] = BytesStorageMetadata()
            storage[MetadataIndex(fqn)] = fqn
        self.commit_id, self._snapshot = cid, sid
        self._records = {r.name: r for r in snap.tensors}
        self._values, self._storage = values, storage
        mapping: FLATTEN_MAPPING = dict(paths)
        return Metadata(state_dict_metadata=sdm, planner_data=mapping, storage_data=storage,
                        storage_meta=StorageMeta(checkpoint_id=str(self.path)))

    def set_up_storage_reader(self, metadata: Metadata, is_coordinator: bool, *args: Any,
                              **kwargs: Any) -> None:
        if metadata.storage_data:
            self._storage = metadata.storage_data

    def prepare_local_plan(self, plan: LoadPlan) -> LoadPlan:
        return plan

    def prepare_global_plan(self, plans: list[LoadPlan]) -> list[LoadPlan]:
        return plans

    def read_data(self, plan: LoadPlan, planner: LoadPlanner) -> Future[None]:
        reader = self.repo.reader
        records = list(self._records.values())
        names = [self._storage[item.storage_index] for item in plan.items]
        last = {name: i for i, name in enumerate(names)}
        decoded: dict[str, torch.Tensor] = {}
        for i, (item, name) in enumerate(zip(plan.items, names)):
            if item.type == LoadItemType.BYTE_IO:
                buf = io.BytesIO()
                torch.save(self._values[name], buf)
                buf.seek(0)
                planner.load_bytes(item, buf)
                continue
            t = decoded.get(name)
            if t is None:
                rec = self._records[name]
                # a first moment's second moment, restored for its bound, is kept in `decoded`
                # for its own items (freed after its last, like any)
                t = reader.read_any(self._snapshot, rec, records, decoded).reshape(rec.shape)
                decoded[name] = t
            for dim, (start, length) in enumerate(zip(item.storage_offsets, item.lengths)):
                t = t.narrow(dim, start, length)
            target = planner.resolve_tensor(item).detach()
            if tuple(target.shape) != tuple(t.shape):
                raise UsageError(f"{item.dest_index.fqn}: the commit holds {tuple(t.shape)} "
                                 f"where the state asks for {tuple(target.shape)}")
            target.copy_(t)
            planner.commit_tensor(item, target)
            if last[name] == i:
                decoded.pop(name, None)   # its last region: free it
        fut: Future[None] = Future()
        fut.set_result(None)
        return fut


def _check_layout(fqn: str, records: list[TensorRecord], entry: dict[str, Any]) -> None:
    """Raise `ShardLayoutError` unless `records` restore the skeleton `entry` of tensor `fqn`
    whole: one record of its shape and dtype, or shards that tile it (`check_tiling`). DCP
    copies each chunk into its place in the caller's tensor, so a part no record holds would
    keep whatever the caller's tensor held before (a checkout refuses such a commit when it
    assembles the shards; a load must too)."""
    layout = [(rec, shard_of(rec)) for rec in records]
    shards = [(rec, info) for rec, info in layout if info is not None]
    whole = [rec for rec, info in layout if info is None]
    if shards and whole:
        raise ShardLayoutError(f"tensor {fqn!r} is stored both whole and in shards")
    if shards:
        check_tiling(fqn, shards, shape=entry["shape"], dtype=entry["dtype"])
        return
    if len(whole) != 1 or list(whole[0].shape) != list(entry["shape"]) \
            or whole[0].dtype != entry["dtype"]:
        got = ", ".join(f"{r.dtype} {list(r.shape)}" for r in whole) or "no record"
        raise ShardLayoutError(f"tensor {fqn!r}: the commit says {entry['dtype']} "
                               f"{list(entry['shape'])}, its records hold {got}")
