"""Bounding delta chains: re-encode deep or costly quantized tensors as bases (part of `mvc gc`).

Commit ids never change: a snapshot whose tensors are re-encoded is written as
a new snapshot object, checked to restore exactly the same levels and the same
tensors (through the read path of a checkout), and published with one ref
update ``refs/replace/<original snapshot id>``.  Readers follow that ref
(`ObjectDB.read_snapshot`), so a crash before the update leaves the old encoding
in force and only orphans for the next gc to remove.

A re-encoded record keeps every meta field of the original that is not about
its encoding (`carried_meta`): what the levels mean -- the value domain of an
optimizer moment, the bound that clamps a first moment on restore, and
whatever later versions record -- belongs to the tensor, not to its encoding.
"""
from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any


from mvc.codecs.quantized import encode_base
from mvc.errors import InternalError
from mvc.progress import NO_PROGRESS, Progress
from mvc.repo import lossy
from mvc.repo.objectdb import ObjectDB
from mvc.repo.objects import Snapshot, TensorRecord
from mvc.repo.pruned import pruned_ids
from mvc.repo.reader import TensorReader
from mvc.repo.replace import publish_replacement
from mvc.repo.replace_verify import moment_partner, same_bits
from mvc.repo.tensors import ChunkWriter
from mvc.store import TransactionalRefStore


@dataclass
class CompactReport:
    snapshots_rewritten: int = 0
    tensors_rebased: int = 0
    max_depth_before: int = 0
    max_depth_after: int = 0


def compact_chains(odb: ObjectDB, reader: TensorReader, refs: TransactionalRefStore,
                   roots: Iterable[str], *, max_chain: int, budget: float = 0.0,
                   chunk_size: int, progress: Progress | None = None) -> CompactReport:
    """Re-encode every quantized tensor whose chain is deeper than `max_chain` (0: any depth)
    or costs more than `budget` passes to walk (0: no budget; see `lossy.chain_cost`) as a base.

    Writes the re-encodings through `odb.blobs` in chunks of `chunk_size` bytes,
    reads through `reader` and publishes each rewritten snapshot in `refs`.
    The caller holds the write lock. Commits are visited parents-first, so a
    rebased ancestor shortens every descendant's chain before it is measured.
    A step's cost is the difference of the costs its commit recorded.
    `progress` hears of each commit visited.
    """
    report = CompactReport()
    depth: dict[tuple[str, str], int] = {}
    cost: dict[tuple[str, str], float] = {}      # after the rebases decided so far
    recorded: dict[tuple[str, str], float] = {}  # as committed
    p = progress if progress is not None else NO_PROGRESS
    pruned = pruned_ids(refs)
    for commit in odb.walk_commits(roots, order="topo"):
        p.advance(items=1)
        if commit.id in pruned:  # no snapshot kept; the kept ones no longer delta on it
            continue
        sid = commit.snapshot
        snap = odb.read_snapshot(sid)
        rebase: list[int] = []
        for i, rec in enumerate(snap.tensors):
            key = (sid, rec.name)
            recorded[key] = lossy.chain_cost(rec)
            pkey = lossy.parent_ref(rec)
            if pkey is None:
                depth[key], cost[key] = 0, 0.0
                continue
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
            _rewrite(odb, reader, refs, sid, snap, rebase, chunk_size)
            report.snapshots_rewritten += 1
            report.tensors_rebased += len(rebase)
    return report


#: Meta fields about a quantized record's *encoding*: the codecs' own (payload layout,
#: checksum, level counts, protected values' codec, recorded config) and the link into
#: its delta chain that commit adds. A re-encoding writes its own; every other field is
#: carried over. `tests/repo/test_gc_invariance.py` checks this names all the codecs write.
ENCODING_META = frozenset({
    "mode", "bins", "numel", "n_protected", "protected", "parent_n_levels", "sections",
    "xxh3", "config",                    # mvc.codecs.quantized
    "parent", "refs", "chain_cost",      # lossy.choose_encoding: the delta's chain
})


def carried_meta(rec: TensorRecord) -> dict[str, Any]:
    """The meta of `rec` a re-encoding must keep: every field not in `ENCODING_META`.

    Kept by exclusion, so that a field a later version adds to what a tensor
    *is* survives gc without anyone updating this module.
    """
    return {k: v for k, v in rec.meta.items() if k not in ENCODING_META}


def rebase_tensors(odb: ObjectDB, reader: TensorReader, refs: TransactionalRefStore, sid: str,
                   snap: Snapshot, rebase: list[int], chunk_size: int, reason: str) -> None:
    """Publish a replacement of snapshot `sid` (read as `snap`) in which the records at indices
    `rebase` are re-encoded as bases, after checking it restores every affected tensor
    bit-identically (`InternalError` otherwise, and nothing is published)."""
    _rewrite(odb, reader, refs, sid, snap, rebase, chunk_size, reason)


def _rewrite(odb: ObjectDB, reader: TensorReader, refs: TransactionalRefStore, sid: str,
             snap: Snapshot, rebase: list[int], chunk_size: int,
             reason: str = "gc: compact delta chains") -> None:
    writer = ChunkWriter(odb.blobs, chunk_size)
    records = list(snap.tensors)
    for i in rebase:
        rec = records[i]
        q = reader.read_quantized(sid, rec)
        config = rec.meta.get("config")
        enc = encode_base(q, config=config if isinstance(config, dict) else None)
        new = writer.write_encoded(enc, lossy.QBASE, rec.name, q.dtype, tuple(q.shape),
                                   carried_meta(rec), depth=0, raw_bytes=rec.raw_bytes)
        records[i] = new
    # The snapshot rides in the chunks' transaction: nothing reaches it before the ref below.
    new_sid = writer.add(Snapshot(records, snap.skeleton).encode())
    writer.flush()
    _verify(odb, reader, sid, snap, new_sid, [snap.tensors[i].name for i in rebase])
    publish_replacement(refs, sid, new_sid, reason)


def _verify(odb: ObjectDB, reader: TensorReader, sid: str, snap: Snapshot, new_sid: str,
            rebased: list[str]) -> None:
    """Never publish a replacement that restores anything differently from `sid`.

    Reads the replacement back from the store and restores through the
    checkout's reader (`TensorReader.read_all`: domain conversion, first-moment
    clamping): the levels of every rebased tensor (descendants' deltas are
    decoded against them) and the values of every tensor a rebased one feeds,
    i.e. itself and any first moment it bounds.
    """
    new = Snapshot.decode(odb.blobs.get(new_sid), new_sid)
    old_recs = {r.name: r for r in snap.tensors}
    new_recs = {r.name: r for r in new.tensors}
    if list(old_recs) != list(new_recs):
        raise InternalError(f"gc: replacement of snapshot {sid} changes its tensor names")
    changed = set(rebased)
    for name in rebased:
        # Read under the replacement's own id: the caches hold the original's levels under
        # `sid`, and a hit there would check the old encoding against itself.
        again = reader.read_quantized(new_sid, new_recs[name])
        if not lossy.same_quantization(again, reader.read_quantized(sid, old_recs[name])):
            raise InternalError(f"gc: re-encoding of {name!r} in snapshot {sid} "
                                "does not restore the same levels")
    affected = [n for n, r in old_recs.items()
                if n in changed or moment_partner(r) in changed or moment_partner(new_recs[n]) in changed]
    # Clamped first moments need their partners restored alongside.
    needed = set(affected) | {p for n in affected for p in (moment_partner(old_recs[n]), moment_partner(new_recs[n]))
                              if p in old_recs}
    before = reader.read_all(sid, [r for n, r in old_recs.items() if n in needed])
    after = reader.read_all(new_sid, [r for n, r in new_recs.items() if n in needed])
    for name in affected:
        if not same_bits(before[name], after[name]):
            raise InternalError(f"gc: re-encoding snapshot {sid} does not restore tensor "
                                f"{name!r} bit-identically")
