"""Read-only views of history: per-tensor diffs and storage statistics.

Both receive the parts they read (the object database, the tensor reader, the
store's maintenance part, the cache directory) and ids already resolved; never
a `Repo`. Only the diffs import torch (when called): stats and sizes read metadata.

Two sizes of a commit, named the same everywhere (`mvc commit`, `show`, `stats`):

* *encoded*: the bytes of its tensor records' payloads (`TensorRecord.stored_bytes`
  summed), chunks it shares with other commits included -- what restoring it reads;
* *new in store*: the bytes of the objects it added to the store -- its commit and
  snapshot objects and the chunks no earlier commit uses (`stats`: each object is
  charged to the first commit, in time order, that uses it; `commit_sizes`: to the
  commit unless one of its nearest ancestors uses it). Re-committing an unchanged
  checkpoint is a few hundred bytes new in store, whatever its encoded size.
"""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from mvc.repo.levelfile import cache_bytes
from mvc.repo.objectdb import ObjectDB
from mvc.repo.pruned import check_not_pruned, pruned_ids
from mvc.store import StoreMaintenance

if TYPE_CHECKING:  # diffs read tensors; stats and sizes read metadata only, without torch
    import torch

    from mvc.repo.reader import TensorReader


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
    """One commit's sizes (see the module docstring for *encoded* and *new in store*)."""

    id: str
    message: str
    raw_bytes: int
    #: New in store: the bytes this commit added (the name scripts have read since the start).
    stored_bytes: int
    #: Pruned by a retention policy: no checkpoint stored (raw_bytes 0).
    pruned: bool = False
    #: Encoded: its tensor records' payload bytes, shared chunks included.
    encoded_bytes: int = 0

    @property
    def new_bytes(self) -> int:
        """New in store (the same number as `stored_bytes`, under its label)."""
        return self.stored_bytes

    @property
    def ratio(self) -> float:
        """Raw bytes per byte new in store."""
        return self.raw_bytes / self.stored_bytes if self.stored_bytes else float("inf")

    @property
    def encoded_ratio(self) -> float:
        """Raw bytes per encoded byte: the commit's compression."""
        return self.raw_bytes / self.encoded_bytes if self.encoded_bytes else float("inf")

    def to_dict(self) -> dict:
        """`stats --json`'s entry: the fields, both ratios, and `new_bytes` (= `stored_bytes`)."""
        return dict(asdict(self), ratio=self.ratio, new_bytes=self.new_bytes,
                    encoded_ratio=self.encoded_ratio)


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
        """New in store, summed: what the history's commits added to the store."""
        return sum(c.stored_bytes for c in self.commits)

    @property
    def encoded_bytes(self) -> int:
        """Encoded, summed: shared chunks count once per commit that uses them."""
        return sum(c.encoded_bytes for c in self.commits)

    @property
    def ratio(self) -> float:
        """Raw bytes per byte new in store: the history's compression, deduplication included."""
        return self.raw_bytes / self.stored_bytes if self.stored_bytes else float("inf")

    def to_dict(self) -> dict:
        return {
            "commits": [c.to_dict() for c in self.commits],
            "raw_bytes": self.raw_bytes, "stored_bytes": self.stored_bytes, "ratio": self.ratio,
            "new_bytes": self.stored_bytes, "encoded_bytes": self.encoded_bytes,
            "object_bytes": self.object_bytes, "disk_bytes": self.disk_bytes,
            "cache_bytes": self.cache_bytes, "total_disk_bytes": self.total_disk_bytes,
            "unreachable_bytes": self.unreachable_bytes,
            "unreachable_objects": self.unreachable_objects,
        }


def _compare(a: torch.Tensor, b: torch.Tensor) -> tuple[float, float]:
    import torch

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
    import torch

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
    from mvc.dtypes import dtype_name

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
        out.commits.append(CommitStats(c.id, c.summary, snap.raw_bytes, added,
                                       encoded_bytes=sum(t.stored_bytes for t in snap.tensors)))
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


@dataclass(frozen=True)
class CommitSizes:
    """One commit's sizes as `mvc commit` and `mvc show` name them."""

    #: The checkpoint's tensors, uncompressed.
    raw_bytes: int
    #: Its tensor records' payload bytes, shared chunks included.
    encoded_bytes: int
    #: The bytes of its objects (commit, snapshot, chunks) no ancestor uses.
    new_bytes: int


#: How many of a commit's nearest ancestors `commit_sizes` looks through for the objects it
#: shares: a training run's unchanged tensors are in its parent's snapshot already, and reading
#: every snapshot of a long history would cost each `mvc commit` line seconds.
NEAREST_ANCESTORS = 8


def commit_sizes(odb: ObjectDB, cid: str) -> CommitSizes:
    """Raw, encoded and new-in-store bytes of commit `cid` (not a pruned one).

    New in store counts the commit's objects that none of its `NEAREST_ANCESTORS` nearest
    kept ancestors uses: for a commit just made, what it added to the store, unless the
    same bytes were stored by an older commit (a checkpoint reverted to an old state) or
    another branch, which `stats` -- counting over all history -- charges to that commit.
    The walk stops as soon as every object is found, so re-committing an unchanged
    checkpoint reads one parent."""
    c = odb.read_commit(cid)
    snap = odb.read_snapshot(c.snapshot)
    mine = {c.id, c.snapshot, *snap.chunk_ids()}
    left = set(mine) - {c.id}  # no ancestor holds the commit itself
    if c.parents and left:
        pruned = pruned_ids(odb.refs)
        looked = 0
        for older in odb.walk_commits(c.parents, order="date"):  # nearest first
            if older.id in pruned:
                continue  # its snapshot is gone; what kept commits share stays counted where used
            left.discard(older.snapshot)
            if left:
                left -= set(odb.read_snapshot(older.snapshot).chunk_ids())
            looked += 1
            if not left or looked >= NEAREST_ANCESTORS:
                break
    new = sum(odb.blobs.size(oid) for oid in mine if oid == c.id or oid in left)
    return CommitSizes(snap.raw_bytes, sum(t.stored_bytes for t in snap.tensors), new)
