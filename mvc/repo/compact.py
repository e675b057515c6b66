"""Bounding delta chains: re-encode deep or costly quantized tensors as bases (part of `mvc gc`).

Commit ids never change: a snapshot whose tensors are re-encoded is written as
a new snapshot object, checked to restore exactly the same levels, and
published with one ref update ``refs/replace/<original snapshot id>``.  Readers
follow that ref (`Repo.read_snapshot`), so a crash before the update leaves
the old encoding in force and only orphans for the next gc to remove.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from mvc.codecs.quantized import decode_base, encode_base
from mvc.errors import InternalError
from mvc.repo import lossy
from mvc.repo.objects import Snapshot
from mvc.repo.tensors import ChunkWriter, read_payload, parse_dtype
from mvc.store import ANY, RefUpdate

if TYPE_CHECKING:
    from mvc.repo.repository import Repo


@dataclass
class CompactReport:
    snapshots_rewritten: int = 0
    tensors_rebased: int = 0
    max_depth_before: int = 0
    max_depth_after: int = 0


def topo_commits(repo: "Repo", roots: set[str]) -> list[str]:
    """Every commit reachable from `roots`, parents before children."""
    order: list[str] = []
    state: dict[str, int] = {}
    for root in sorted(roots):
        stack = [(root, False)]
        while stack:
            cid, done = stack.pop()
            if done:
                order.append(cid)
                continue
            if cid in state:
                continue
            state[cid] = 1
            stack.append((cid, True))
            stack.extend((p, False) for p in repo.read_commit(cid).parents if p not in state)
    return order


def compact_chains(repo: "Repo", roots: set[str], max_chain: int,
                   budget: float = 0.0) -> CompactReport:
    """Re-encode every quantized tensor whose chain is deeper than `max_chain` (0: any depth)
    or costs more than `budget` passes to walk (0: no budget; see `lossy.chain_cost`) as a base.

    The caller holds the write lock. Commits are visited parents-first, so a
    rebased ancestor shortens every descendant's chain before it is measured.
    A step's cost is the difference of the costs its commit recorded.
    """
    report = CompactReport()
    depth: dict[tuple[str, str], int] = {}
    cost: dict[tuple[str, str], float] = {}      # after the rebases decided so far
    recorded: dict[tuple[str, str], float] = {}  # as committed
    chunk_size = int(repo.config.get("commit.chunk_mib")) << 20
    for cid in topo_commits(repo, roots):
        sid = repo.read_commit(cid).snapshot
        snap = repo.read_snapshot(sid)
        rebase: list[int] = []
        for i, rec in enumerate(snap.tensors):
            key = (sid, rec.name)
            recorded[key] = lossy.chain_cost(rec)
            if rec.codec != lossy.QDELTA:
                depth[key], cost[key] = 0, 0.0
                continue
            pkey = lossy.parent_ref(rec)
            d = depth.get(pkey, 0) + 1
            # One step never costs more than a pass: that also bounds a child recorded against
            # a chain an earlier gc has since cut (its parent reads as a base, cost 0).
            step = min(1.0, max(0.0, recorded[key] - recorded.get(pkey, 0.0)))
            c = cost.get(pkey, 0.0) + step
            report.max_depth_before = max(report.max_depth_before, d)
            if (max_chain and d > max_chain) or (budget and c > budget):
                rebase.append(i)
                d, c = 0, 0.0
            depth[key], cost[key] = d, c
            report.max_depth_after = max(report.max_depth_after, d)
        if rebase:
            _rewrite(repo, sid, snap, rebase, chunk_size)
            report.snapshots_rewritten += 1
            report.tensors_rebased += len(rebase)
    return report


def _rewrite(repo: "Repo", sid: str, snap: Snapshot, rebase: list[int], chunk_size: int) -> None:
    writer = ChunkWriter(repo.store, chunk_size)
    records = list(snap.tensors)
    for i in rebase:
        rec = records[i]
        q = lossy.read_quantized(repo, sid, rec)
        config = rec.meta.get("config")
        enc = encode_base(q, config=config if isinstance(config, dict) else None)
        new = writer.write_encoded(enc, lossy.QBASE, rec.name, q.dtype, tuple(q.shape),
                                   depth=0, raw_bytes=rec.raw_bytes)
        records[i] = new
    writer.flush()
    for i in rebase:  # never publish an encoding that does not restore the same levels
        rec, new = snap.tensors[i], records[i]
        again = decode_base(new.meta, read_payload(repo.store, new), parse_dtype(new.dtype),
                            tuple(new.shape))
        q = lossy.read_quantized(repo, sid, rec)
        if not (torch.equal(again.levels, q.levels) and torch.equal(again.centroids, q.centroids)
                and torch.equal(again.protected.view(-1), q.protected.view(-1))):
            raise InternalError(f"gc: re-encoding of {rec.name!r} in snapshot {sid} does not round-trip")
    new_sid = repo.store.put(Snapshot(records, snap.skeleton).encode())
    from mvc.repo.repository import REPLACE

    repo.store.update_refs([RefUpdate(REPLACE + sid, ANY, new_sid)], "gc: compact delta chains")
