"""Restoring tensors from snapshots: `TensorReader`, the read side of every checkout.

Exact tensors are decoded by their codec.  A quantized tensor is stored either
as a base or as a delta against the same tensor in the first parent's snapshot
(`mvc.repo.lossy`); the reader walks its delta chain back to the nearest base,
or to a level-cache hit, and decodes forward.  Deltas are of integer levels, so
any commit restores exactly dequantize(quantize(W_t)), however deep (DESIGN
invariant 3).

A delta record names its parent as ``meta["parent"] = {"snapshot", "name"}``
with the parent commit's *original* snapshot id; the object database follows
gc's replacements (`ObjectDB.read_snapshot`), so a parent later re-encoded as a
base still serves.

The reader owns the two level caches: the in-memory one (`LevelCache`: recently
materialized tensors, so a training process does not re-walk chains on every
commit) and the on-disk one (`DiskLevelCache`: bases of the newest commits, for
a new process).  The commit pipeline hands it the levels of a landed commit
(`remember`); everything else only reads.
"""
from __future__ import annotations

import math
import warnings
from collections.abc import Mapping, Sequence
from typing import Any

import torch

from mvc.codecs.base import quantized_codec
from mvc.codecs.quantized import centroid_bytes, stored_centroids
from mvc.errors import MvcWarning
from mvc.native.parallel import pmap
from mvc.progress import Progress, phase
from mvc.quant import QuantizedTensor
from mvc.quant.moment_bound import clamp_first_moment, uses_host
from mvc.quant.optimizer import restore, restore_values
from mvc.repo.levelcache import BaseEntries, DiskLevelCache, LevelCache
from mvc.repo.lossy import (
    BrokenChainError,
    chain_cost,
    is_delta,
    is_quantized,
    parent_ref,
)
from mvc.repo.objectdb import ObjectDB
from mvc.repo.objects import Snapshot, TensorRecord
from mvc.repo.pruned import check_not_pruned
from mvc.repo.shards import assemble, expand_names
from mvc.repo.tensors import parse_dtype, read_payload, read_payload_head, read_tensor
from mvc.state import prune, unflatten
from mvc.state.device_memory import DEVICE_OUT_OF_MEMORY
from mvc.state.devices import target_device


class TensorReader:
    """Tensors of snapshots, read through `odb` and the level caches.

    `levels`: the in-memory cache (a new one if not given); `disk`: the on-disk
    cache, or None to walk chains from their stored bases (`cache.levels_keep = 0`).
    Safe to share between threads.
    """

    def __init__(self, odb: ObjectDB, *, levels: LevelCache | None = None,
                 disk: DiskLevelCache | None = None) -> None:
        self.odb = odb
        self.levels = levels if levels is not None else LevelCache()
        self.disk = disk

    # ------------------------------------------------------------------ states
    def read_state(self, cid: str, *, map_location: str | torch.device | None = None,
                   only: Sequence[str] | None = None, weights_only: bool = False,
                   progress: Progress | None = None, cache_levels: bool = True) -> Any:
        """The checkpoint of commit `cid` (an id, already resolved), rebuilt with its original
        structure on `map_location` (default: the CPU).

        `only` (name patterns) and `weights_only` (drop optimizer state) restore a partial
        state: the skeleton pruned to the selected tensors (`mvc.state.prune` says exactly
        what each keeps), and only their payloads are read and decoded -- plus what a
        selected tensor's restore needs: its delta chain, and an Adam first moment's
        second moment (its bound). Raises `UsageError` when nothing is selected.
        `progress` hears of each tensor restored (see `read_all`). `cache_levels`: see `read_all`.
        """
        device = target_device(map_location)   # a device it cannot use: before any read
        check_not_pruned(self.odb.refs, cid)
        sid = self.odb.read_commit(cid).snapshot
        snap = self.odb.read_snapshot(sid)
        skeleton, records = snap.skeleton, snap.tensors
        if only or weights_only:
            skeleton = prune(skeleton, only=only, weights_only=weights_only)
            records = _needed(snap.tensors, skeleton["entries"])
        tensors = self.read_all(sid, records, progress=progress, cache_levels=cache_levels,
                                device=device)
        # Shards of a sharded save (mvc.dcp) come back as the full tensors the skeleton names.
        return unflatten(skeleton, assemble(records, tensors), map_location=map_location or "cpu")

    # ------------------------------------------------------------------ tensors
    def read_quantized(self, snapshot_id: str, rec: TensorRecord,
                       snapshots: dict[str, Snapshot] | None = None, *,
                       cache_levels: bool = True) -> QuantizedTensor:
        """Materialize a quantized tensor, walking its delta chain back to the nearest base or
        cache hit; in host memory (decoded on the host; the level caches hold host copies).

        `snapshots` memoizes the parent snapshots the walk reads (one checkout
        walks every tensor's chain through the same commits). `cache_levels=False` still
        reads the caches but puts nothing in the in-memory one.
        """
        chain: list[tuple[str, TensorRecord]] = []
        sid, cur = snapshot_id, rec
        q = self._cached(sid, cur, cache_levels)
        seen: set[tuple[str, str]] = set()
        while q is None and is_delta(cur):
            # Content ids make the committed chain acyclic; only a bogus replacement can
            # close a loop, and that must be an error, not a walk that never ends.
            if (sid, cur.name) in seen:
                raise BrokenChainError(f"tensor {cur.name!r}: delta chain loops back to snapshot {sid}")
            seen.add((sid, cur.name))
            chain.append((sid, cur))
            ref = parent_ref(cur)
            if ref is None:
                raise BrokenChainError(f"tensor {cur.name!r}: delta names no parent")
            psid, pname = ref
            snap = snapshots.get(psid) if snapshots is not None else None
            if snap is None:
                snap = self.odb.read_snapshot(psid)
                if snapshots is not None:
                    snapshots[psid] = snap
            prec = next((r for r in snap.tensors if r.name == pname), None)
            if prec is None or not is_quantized(prec):
                raise BrokenChainError(f"tensor {cur.name!r}: parent {pname!r} missing in snapshot {psid}")
            sid, cur = psid, prec
            q = self._cached(sid, cur, cache_levels)
        if q is None:
            if not is_quantized(cur):
                raise BrokenChainError(f"tensor {cur.name!r}: chain ends in codec {cur.codec}")
            q = quantized_codec(cur.codec).decode_quantized(
                cur.meta, read_payload(self.odb.blobs, cur), parse_dtype(cur.dtype), tuple(cur.shape))
            if cache_levels:
                self.levels.put((sid, cur.name), q)
        if chain:
            last_sid, last = chain[0]
            blobs = self.odb.blobs
            steps = [(crec.meta, lambda crec=crec: read_payload(blobs, crec))
                     for _, crec in reversed(chain)]
            q = quantized_codec(last.codec).decode_chain(q, steps, parse_dtype(last.dtype),
                                                         tuple(last.shape))
            if cache_levels:
                self.levels.put((last_sid, last.name), q)
        return q

    def read_centroids(self, snapshot_id: str, rec: TensorRecord) -> torch.Tensor:
        """A quantized tensor's centroids (float32, in host memory), from the in-memory cache
        or the start of its own payload: no delta chain walked, no levels decoded (a commit's
        warm start needs only these)."""
        hit = self.levels.get((snapshot_id, rec.name))
        if hit is not None:
            return hit.centroids
        if not is_quantized(rec):
            raise BrokenChainError(f"tensor {rec.name!r}: codec {rec.codec} holds no centroids")
        head = read_payload_head(self.odb.blobs, rec, centroid_bytes(rec.meta))
        return stored_centroids(rec.meta, head)

    def _cached(self, sid: str, rec: TensorRecord, keep: bool = True) -> QuantizedTensor | None:
        hit = self.levels.get((sid, rec.name))
        if hit is None and self.disk is not None and is_delta(rec):
            hit = self.disk.load(sid, rec)
            if hit is not None and keep:
                self.levels.put((sid, rec.name), hit)
        return hit

    def read_all(self, snapshot_id: str, records: list[TensorRecord], *,
                 progress: Progress | None = None, cache_levels: bool = True,
                 device: torch.device | None = None) -> dict[str, torch.Tensor]:
        """Every tensor of a snapshot, by name (in record order).

        The quantized tensors are decoded on the native thread pool (chain walks,
        entropy decoding and level lookups run in C without the GIL) through one
        shared snapshot memo, so at most one tensor per thread is being walked at a
        time; Adam first moments are then bounded by their second moments,
        restored once for both. `progress` hears of each tensor decoded (its raw bytes), from
        the pool's threads, in one "reading" phase.

        `cache_levels` (default True) keeps the levels decoded in the in-memory cache, so a
        commit that follows in this process reads its parent without decoding (a Tracker's
        resume). They cost about a quarter of a float32 state on top of it: a checkout that
        no commit follows in this process (the CLI's `mvc checkout`) passes False.

        `device`: where the tensors are wanted. For a CUDA device the quantized tensors' levels
        (1-2 bytes a value, a quarter of the float32 bytes) cross to it and the level -> value
        lookup runs there; the same bits as a host lookup (a table lookup rounds nothing).
        So do Adam moments, whose bound takes the same bits on every device
        (`mvc.quant.moment_bound`), except an earlier commit's moment pairs: their bound takes
        torch's host sqrt, and they are restored on the host. Other tensors come back on the
        host.
        """
        with phase(progress, "reading", total_bytes=sum(r.raw_bytes for r in records),
                   total_items=len(records)) as p:
            return self._read_all(snapshot_id, records, p, cache_levels, device)

    def _read_all(self, snapshot_id: str, records: list[TensorRecord],
                  progress: Progress, cache_levels: bool = True,
                  device: torch.device | None = None) -> dict[str, torch.Tensor]:
        quant = [r for r in records if is_quantized(r)]
        memo: dict[str, Snapshot] = {}
        out: dict[str, torch.Tensor] = {}
        moments = [r for r in quant if r.meta.get("moment")]
        for r in moments:   # before anything is decoded
            _partner(r, records)
        # an earlier commit's bound takes torch's host sqrt: its pair is restored on the host
        legacy = [r for r in moments if uses_host(r.meta["moment"])]
        on_host = {r.name for r in legacy} | {_partner(r, records).name for r in legacy}
        # (pmap's threads work on the caller's CUDA device and streams: mvc.native.parallel)
        lookup_on = device if device is not None and device.type == "cuda" else None

        def decode(rec: TensorRecord) -> None:
            if is_quantized(rec):
                q = self.read_quantized(snapshot_id, rec, memo, cache_levels=cache_levels)
                out[rec.name] = _values(rec, q, None if rec.name in on_host else lookup_on)
            else:
                out[rec.name] = read_tensor(self.odb.blobs, rec)
            progress.advance(rec.raw_bytes, 1)

        def bound(rec: TensorRecord) -> None:
            _bound_first_moment(rec, out[rec.name], out)

        # Costliest first (size times chain cost): the pool takes tasks in order, and the longest
        # walk is the critical path.
        pmap(decode, sorted(quant, key=lambda r: -math.prod(r.shape) * (1.0 + chain_cost(r))))
        # Exact tensors after: their codec spreads one tensor's blocks over the pool itself.
        for rec in records:
            if rec.name not in out:
                decode(rec)
        pmap(bound, moments)
        return {rec.name: out[rec.name] for rec in records}

    def read_any(self, snapshot_id: str, rec: TensorRecord,
                 records: list[TensorRecord] | None = None,
                 known: dict[str, torch.Tensor] | None = None) -> torch.Tensor:
        """The tensor a record restores, whatever its codec (`records`: the snapshot's records,
        if the caller has them, saves re-reading the snapshot).  `known`: tensors already
        restored, by record name, which a first moment's bound takes its second moment from;
        one it restores for that is added, so a caller that loads both decodes it once."""
        if not is_quantized(rec):
            return read_tensor(self.odb.blobs, rec)
        out = _values(rec, self.read_quantized(snapshot_id, rec))
        if rec.meta.get("moment"):
            if records is None:
                records = self.odb.read_snapshot(snapshot_id).tensors
            partner = _partner(rec, records)
            v = known.get(partner.name) if known is not None else None
            if v is None:
                v = self.read_any(snapshot_id, partner, records, known)
                if known is not None:
                    known[partner.name] = v
            _bound_first_moment(rec, out, {partner.name: v})
        return out

    # ------------------------------------------------------------------ after a commit
    def remember(self, snapshot_id: str, quantized: Mapping[str, QuantizedTensor],
                 bases: BaseEntries, *, superseded: str | None = None) -> None:
        """Keep a landed commit's levels for later commits and checkouts: `quantized` in memory,
        the base encodings `bases` on disk (when the disk cache is on).  `superseded`: the
        parent's snapshot, whose levels the in-memory cache drops (the next commit is written
        against this one: a training process would otherwise hold every recent commit's
        levels, up to the cache's bound).

        Only a speed-up, done after the commit point: the caller turns a failure
        to write the disk cache (`OSError`, `MvcError`: a full disk) into a warning.
        """
        if superseded is not None and superseded != snapshot_id:
            self.levels.drop_snapshot(superseded)
        for name, q in quantized.items():
            self.levels.put((snapshot_id, name), q)
        if self.disk is not None:
            self.disk.save(snapshot_id, bases)


def _values(rec: TensorRecord, q: QuantizedTensor,
            device: torch.device | None = None) -> torch.Tensor:
    """A quantized record's tensor before any first-moment bound; looked up on `device` (a GPU)
    when given: the value table made on the host (`restore_values`, where a log moment's table
    from uploaded centroids would bring them back first) and q's small parts uploaded from
    pinned memory, so one wait for the stream a tensor (its levels), not four."""
    domain = rec.meta.get("domain", "linear")
    if device is None:
        return restore(q, domain)
    try:
        return q.uploaded(device).lookup(restore_values(q, domain))
    except DEVICE_OUT_OF_MEMORY:
        pass
    # Out of the except block, so the failed lookup's device tensors are freed first. The host
    # lookup gives the same bits; only the restored tensor itself then needs the device's room.
    warnings.warn(MvcWarning(f"restoring onto {device}: a lookup ran out of device memory; "
                             "looking levels up on the host instead (the same values, slower)"),
                  stacklevel=2)
    return restore(q, domain).to(device)


def _needed(records: list[TensorRecord], entries: Mapping[str, Any]) -> list[TensorRecord]:
    """The records a state of `entries` restores from, in snapshot order: the entries' own, and
    the second moment of each quantized first moment (its bound needs it)."""
    names = expand_names(records, entries)
    for rec in records:
        if rec.name in names and is_quantized(rec) and rec.meta.get("moment"):
            names.add(_partner(rec, records).name)
    return [rec for rec in records if rec.name in names]


def _partner(rec: TensorRecord, records: list[TensorRecord]) -> TensorRecord:
    """The second moment a first moment's bound reads: a record of its shape that is not
    itself bounded (a bound first moment would be clamped while another thread reads it)."""
    name = rec.meta["moment"].get("partner")
    partner = next((r for r in records if r.name == name), None)
    if partner is None:
        raise BrokenChainError(f"tensor {rec.name!r}: second moment {name!r} missing")
    if partner.meta.get("moment") is not None:
        raise BrokenChainError(f"tensor {rec.name!r}: its second moment {name!r} is a bound "
                               "first moment itself")
    if list(partner.shape) != list(rec.shape):
        raise BrokenChainError(f"tensor {rec.name!r}: its second moment {name!r} has shape "
                               f"{list(partner.shape)}, not {list(rec.shape)}")
    return partner


def _bound_first_moment(rec: TensorRecord, m: torch.Tensor, restored: dict[str, torch.Tensor]) -> None:
    """Clamp a restored Adam first moment to |m| <= bound * sqrt(v), in place
    (`mvc.quant.moment_bound`): where v is tiny, independently quantized m and v could make
    Adam's first steps after a resume hundreds of times larger than the exact state's.
    `restored` holds the partner v by name."""
    info = rec.meta["moment"]
    v = restored.get(info.get("partner"))
    if v is None:
        raise BrokenChainError(f"tensor {rec.name!r}: second moment {info.get('partner')!r} missing")
    if v.shape != m.shape:   # (`_partner` refuses such a pair from the records)
        raise BrokenChainError(f"tensor {rec.name!r}: second moment {info.get('partner')!r} "
                               f"has shape {list(v.shape)}, not {list(m.shape)}")
    clamp_first_moment(m, v, info)
