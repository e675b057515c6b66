"""Read-only views of history: per-tensor diffs and storage statistics."""
from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING

import torch

from mvc.repo.levelcache import cache_bytes
from mvc.repo.lossy import read_any

if TYPE_CHECKING:
    from mvc.repo.repository import Repo


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


def diff(repo: "Repo", rev_a: str, rev_b: str) -> list[TensorDiff]:
    """Per tensor: added / removed / changed / unchanged, with relative L2 and max abs change."""
    sid_a = repo.read_commit(repo.resolve(rev_a)).snapshot
    sid_b = repo.read_commit(repo.resolve(rev_b)).snapshot
    snap_a, snap_b = repo.read_snapshot(sid_a), repo.read_snapshot(sid_b)
    recs_a = {r.name: r for r in snap_a.tensors}
    recs_b = {r.name: r for r in snap_b.tensors}
    out: list[TensorDiff] = []
    for name in list(recs_a) + [n for n in recs_b if n not in recs_a]:
        ra, rb = recs_a.get(name), recs_b.get(name)
        if rb is None:
            out.append(TensorDiff(name, "removed", shape_a=ra.shape, dtype_a=ra.dtype))
            continue
        if ra is None:
            out.append(TensorDiff(name, "added", shape_b=rb.shape, dtype_b=rb.dtype))
            continue
        d = TensorDiff(name, "unchanged", ra.shape, rb.shape, ra.dtype, rb.dtype)
        if ra.shape != rb.shape or ra.dtype != rb.dtype:
            d.status = "retyped"
        elif (ra.codec, ra.chunks, ra.meta) == (rb.codec, rb.chunks, rb.meta):
            d.rel_l2, d.max_abs = 0.0, 0.0
        else:
            ta, tb = read_any(repo, sid_a, ra, snap_a.tensors), read_any(repo, sid_b, rb, snap_b.tensors)
            if torch.equal(ta.view(-1).view(torch.uint8), tb.view(-1).view(torch.uint8)):
                d.rel_l2, d.max_abs = 0.0, 0.0
            else:
                d.status = "changed"
                d.rel_l2, d.max_abs = _compare(ta, tb)
        out.append(d)
    return out


def stats(repo: "Repo") -> RepoStats:
    """Raw checkpoint bytes vs bytes each commit added, oldest first, over all branches.

    A chunk's bytes are charged to the first commit (in time order) that uses
    it, so deduplicated tensors cost nothing in later commits.
    """
    from mvc.repo.maintenance import root_ids

    seen_commits: dict[str, object] = {}
    stack = list(root_ids(repo))
    while stack:
        cid = stack.pop()
        if cid in seen_commits:
            continue
        c = repo.read_commit(cid)
        seen_commits[cid] = c
        stack.extend(c.parents)
    commits = sorted(seen_commits.values(), key=lambda c: (c.time, c.id))
    charged: set[str] = set()
    out = RepoStats()
    for c in commits:
        snap = repo.read_snapshot(c.snapshot)
        added = 0
        for oid in [c.id, c.snapshot, *snap.chunk_ids()]:
            if oid not in charged:
                charged.add(oid)
                added += repo.store.size(oid)
        out.commits.append(CommitStats(c.id, c.summary, snap.raw_bytes, added))
    out.object_bytes = repo.store.object_bytes()
    out.disk_bytes = repo.store.disk_usage()
    out.cache_bytes = cache_bytes(repo)
    return out
