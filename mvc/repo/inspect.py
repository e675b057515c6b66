"""Read-only views of history: per-tensor diffs and storage statistics.

Both receive the parts they read (the object database, the tensor reader, the
store's maintenance part, the cache directory) and ids already resolved; never
a `Repo`.
"""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch

from mvc.repo.levelcache import cache_bytes
from mvc.repo.objectdb import ObjectDB
from mvc.repo.pruned import check_not_pruned, pruned_ids
from mvc.repo.reader import TensorReader
from mvc.dtypes import dtype_name
from mvc.store import StoreMaintenance


@dataclass
class TensorDiff:
    """How one tensor differs between two revisions."""

    name: str
    status: str  # "added" | "removed" | "changed" | "unchanged" | "retyped"
    shape_a: list[int] | None = None
    shape_b: list[int] | None = None
    dtype_a: str | None = None
    dtype_b: str | None = None
    rel_l2: float | None = None
    max_abs: float | None = None

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass
class CommitStats:
    id: str
    message: str
    raw_bytes: int
    stored_bytes: int
    #: Pruned by a retention policy: no checkpoint stored (raw_bytes 0).
    pruned: bool = False

    @property
    def ratio(self) -> float:
        return self.raw_bytes / self.stored_bytes if self.stored_bytes else float("inf")


@dataclass
class RepoStats:
    commits: list[CommitStats] = field(default_factory=list)
    object_bytes: int = 0
    #: The store file's size.
    disk_bytes: int = 0
    #: Files under `.mvc/cache/` (the level cache): disposable, so counted apart from the store.
    cache_bytes: int = 0
    #: Objects no ref or reflog reaches (an interrupted commit, expired history): what
    #: `mvc gc` would free, before any chain compaction.
    unreachable_bytes: int = 0
    unreachable_objects: int = 0

    @property
    def total_disk_bytes(self) -> int:
        """Everything the repository occupies on disk: the store plus its caches."""
        return self.disk_bytes + self.cache_bytes

    @property
    def raw_bytes(self) -> int:
        return sum(c.raw_bytes for c in self.commits)

    @property
    def stored_bytes(self) -> int:
        return sum(c.stored_bytes for c in self.commits)

    @property
    def ratio(self) -> float:
        return self.raw_bytes / self.stored_bytes if self.stored_bytes else float("inf")

    def to_dict(self) -> dict:
        return {
            "commits": [dict(asdict(c), ratio=c.ratio) for c in self.commits],
            "raw_bytes": self.raw_bytes, "stored_bytes": self.stored_bytes, "ratio": self.ratio,
            "object_bytes": self.object_bytes, "disk_bytes": self.disk_bytes,
            "cache_bytes": self.cache_bytes, "total_disk_bytes": self.total_disk_bytes,
            "unreachable_bytes": self.unreachable_bytes,
            "unreachable_objects": self.unreachable_objects,
        }


def _compare(a: torch.Tensor, b: torch.Tensor) -> tuple[float, float]:
    if a.dtype.is_floating_point or a.dtype.is_complex:
        fa, fb = a.double(), b.double()
    else:
        fa, fb = a.to(torch.float64), b.to(torch.float64)
    d = (fb - fa)
    if d.numel() == 0:
        return 0.0, 0.0
    norm = torch.linalg.vector_norm(fa).item()
    dn = torch.linalg.vector_norm(d).item()
    rel = dn / norm if norm > 0 else (0.0 if dn == 0 else float("inf"))
    return rel, d.abs().max().item()


def diff(odb: ObjectDB, reader: TensorReader, cid_a: str, cid_b: str) -> list[TensorDiff]:
    """Per tensor of commits `cid_a` and `cid_b`: added / removed / changed / unchanged, with
    relative L2 and max abs change."""
    check_not_pruned(odb.refs, cid_a)
    check_not_pruned(odb.refs, cid_b)
    sid_a = odb.read_commit(cid_a).snapshot
    sid_b = odb.read_commit(cid_b).snapshot
    snap_a, snap_b = odb.read_snapshot(sid_a), odb.read_snapshot(sid_b)
    recs_a = {r.name: r for r in snap_a.tensors}
    recs_b = {r.name: r for r in snap_b.tensors}
    out: list[TensorDiff] = []
    for name in list(recs_a) + [n for n in recs_b if n not in recs_a]:
        ra, rb = recs_a.get(name), recs_b.get(name)
        if ra is None:
            assert rb is not None  # the name is in one of the two
            out.append(TensorDiff(name, "added", shape_b=rb.shape, dtype_b=rb.dtype))
            continue
        if rb is None:
            out.append(TensorDiff(name, "removed", shape_a=ra.shape, dtype_a=ra.dtype))
            continue
        d = TensorDiff(name, "unchanged", ra.shape, rb.shape, ra.dtype, rb.dtype)
        if ra.shape != rb.shape or ra.dtype != rb.dtype:
            d.status = "retyped"
        elif (ra.codec, ra.chunks, ra.meta) == (rb.codec, rb.chunks, rb.meta):
            d.rel_l2, d.max_abs = 0.0, 0.0
        else:
            _measure(d, reader.read_any(sid_a, ra, snap_a.tensors),
                     reader.read_any(sid_b, rb, snap_b.tensors))
        out.append(d)
    return out


def _measure(d: TensorDiff, ta: torch.Tensor, tb: torch.Tensor) -> None:
    """Fill `d` from two tensors of one shape and dtype: unchanged when bit-identical,
    else changed with the relative L2 and largest absolute difference."""
    ta, tb = ta.contiguous(), tb.contiguous()
    if torch.equal(ta.view(-1).view(torch.uint8), tb.view(-1).view(torch.uint8)):
        d.rel_l2, d.max_abs = 0.0, 0.0
    else:
        d.status = "changed"
        d.rel_l2, d.max_abs = _compare(ta, tb)


def diff_state(odb: ObjectDB, reader: TensorReader, cid: str, tensors: Mapping[str, torch.Tensor]
               ) -> list[TensorDiff]:
    """Per tensor of commit `cid` (side a) and `tensors` (side b: a flattened state, e.g. the
    working checkpoint file), as `diff` reports two commits. A quantized tensor that the
    file holds as committed shows its quantization error: the file is not what was stored."""
    check_not_pruned(odb.refs, cid)
    sid = odb.read_commit(cid).snapshot
    snap = odb.read_snapshot(sid)
    recs = {r.name: r for r in snap.tensors}
    out: list[TensorDiff] = []
    for name in list(recs) + [n for n in tensors if n not in recs]:
        ra, tb = recs.get(name), tensors.get(name)
        if ra is None:
            assert tb is not None
            out.append(TensorDiff(name, "added", shape_b=list(tb.shape), dtype_b=dtype_name(tb.dtype)))
            continue
        if tb is None:
            out.append(TensorDiff(name, "removed", shape_a=ra.shape, dtype_a=ra.dtype))
            continue
        d = TensorDiff(name, "unchanged", ra.shape, list(tb.shape), ra.dtype, dtype_name(tb.dtype))
        if d.shape_a != d.shape_b or d.dtype_a != d.dtype_b:
            d.status = "retyped"
            out.append(d)
            continue
        _measure(d, reader.read_any(sid, ra, snap.tensors), tb.detach().cpu())
        out.append(d)
    return out


def stats(odb: ObjectDB, maintenance: StoreMaintenance, cache_dir: Path) -> RepoStats:
    """Raw checkpoint bytes vs bytes each commit added, oldest first, over all history (refs and
    reflogs), and what the store and the caches under `cache_dir` occupy.

    A chunk's bytes are charged to the first commit (in time order) that uses
    it, so deduplicated tensors cost nothing in later commits.
    """
    roots = odb.root_ids()
    commits = sorted(odb.walk_commits(roots), key=lambda c: (c.time, c.id))
    charged: set[str] = set()
    out = RepoStats()
    pruned = pruned_ids(odb.refs)
    for c in commits:
        if c.id in pruned:
            out.commits.append(CommitStats(c.id, c.summary, 0, 0, pruned=True))
            continue
        snap = odb.read_snapshot(c.snapshot)
        added = 0
        for oid in [c.id, c.snapshot, *snap.chunk_ids()]:
            if oid not in charged:
                charged.add(oid)
                added += odb.blobs.size(oid)
        out.commits.append(CommitStats(c.id, c.summary, snap.raw_bytes, added))
    out.object_bytes = odb.blobs.object_bytes()
    # Damage is fsck's to report; here it only means less is counted as reachable.
    reached = {r.oid for r in odb.reachable(roots, on_damage=lambda d: None)}
    for oid in odb.blobs.iter_ids():
        if oid not in reached:
            out.unreachable_objects += 1
            out.unreachable_bytes += odb.blobs.size(oid)
    out.disk_bytes = maintenance.disk_usage()
    out.cache_bytes = cache_bytes(cache_dir)
    return out
