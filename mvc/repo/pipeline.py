"""The commit pipeline in three stages: plan -> write -> publish.

    plan     decide, per tensor of the flattened state, how it is stored: an exact codec, or
             quantized (a fixed config, the config search, optimizer-moment compression,
             first-moment bounds: `mvc.search.plan_quantization`, given the parent's config
             and centroids).  No store writes.
    write    encode the tensors a caller names and store their payload chunks; returns the
             `TensorRecord`s.  Chunks are content-addressed, so writing is idempotent: any
             number of processes may write disjoint or even overlapping names of one plan at
             once, and the same name always yields the same record.
    publish  the snapshot (every record + the skeleton), the commit object and one ref
             compare-and-swap: the commit point.  Once, by one process.

`Repo.commit` runs the three in one process, holding the repository write lock from
write to publish so that commits from several processes serialize.  A sharded save (a
`torch.distributed.checkpoint` StorageWriter) runs `plan` where the whole state is known,
ships its write half, runs `write(plan.write.subset(mine), mine, ...)` on every rank and
`publish(plan.manifest, records_of_all_ranks, ...)` once, under the write lock.

A `CommitPlan` is two halves: the `WritePlan` (what `write` encodes: tensors, quantization,
the parent's records, the settings) and the `Manifest` (what `publish` records: record
order, skeleton, config, quality, the parent commit).  Both are **picklable** (plain
dataclasses of tensors, `QuantizedTensor`s, records and JSON-able values; no callables, no
store handles): ship them to the ranks rather than re-deriving them.  `plan` is
deterministic (k-means is seeded; the search too, for a deterministic quality function), but
a lossy plan needs the whole state (the search evaluates the model, first-moment bounds pair
the two Adam moments): only its holder can derive it.

The pipeline never sees `Repo`: it takes the blob store (`put` / `put_many` / `has`), a
`read_quantized(snapshot_id, record)` for the parent's quantized tensors (the deltas) and a
`read_centroids` for their centroids alone (the plan's warm starts), the ref store
for the one compare-and-swap and plain configuration values (`CommitSettings`).
"""
from __future__ import annotations

import dataclasses
import gc
import warnings
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any, Protocol

import torch

from mvc.codecs.base import BytesLike, tensor_codec
from mvc.errors import InternalError, MvcWarning, UsageError
from mvc.native.heap import release_free_heap
from mvc.native.parallel import pmap, pmap_sized
from mvc.progress import Progress, phase
from mvc.quant import QuantizedTensor
from mvc.repo import lossy
from mvc.repo.objects import (Commit, Snapshot, TensorRecord, check_tensor_shape,
                              checked_encoding)
from mvc.repo.tensors import ChunkWriter
from mvc.quant.backend import on_host_kernels
from mvc.search.plan import Quantization, QuantizationPlan, plan_quantization
from mvc.search.random_state import as_the_caller_left_them
from mvc.state import FlatState, unflatten
from mvc.state.device_memory import (DEVICE_OUT_OF_MEMORY, device_bytes, host_copies, on_devices,
                                     other_accelerators)
from mvc.store import ObjectMissingError, object_id
from mvc.store.writeback import BackgroundWriter

#: Tensors this small are stored raw: a codec header would cost more than it saves.
RAW_BELOW_BYTES = 64

#: read_quantized(snapshot id, record) -> the record's QuantizedTensor (walking its chain).
ReadQuantized = Callable[[str, TensorRecord], QuantizedTensor]
#: read_centroids(snapshot id, record) -> the record's centroids (no levels decoded).
ReadCentroids = Callable[[str, TensorRecord], torch.Tensor]


class BlobSink(Protocol):
    """The part of a blob store the pipeline writes through."""

    def put(self, data: BytesLike) -> str: ...

    def put_many(self, items: Iterable[BytesLike]) -> list[str]: ...

    def has(self, oid: str) -> bool: ...


class RefSink(Protocol):
    """The part of a ref store `publish` moves a ref through: one compare-and-swap with its
    reflog entry, which any ref store (a remote's included) provides; no batch needed."""

    def update_ref(self, name: str, old: str | None, new: str | None, reason: str) -> None: ...


class IncompleteCommitError(UsageError):
    """`publish` was handed records that do not cover the plan exactly (a tensor missing, one
    the plan does not name, or two different records for one name)."""

    exit_code = 117


class MissingChunkError(ObjectMissingError):
    """A record handed to `publish` names a chunk the store does not hold (never written, or
    removed by a gc that ran between write and publish): nothing is published."""

    exit_code = 118


# ---------------------------------------------------------------------------- inputs

@dataclass(frozen=True)
class CommitSettings:
    """The configuration values a commit uses, read once (plain values: picklable)."""

    lossless_codec: str = "lossless/1"
    chunk_size: int = 32 << 20
    base_every: int = 64
    delta_max_ratio: float = 1.0
    chain_budget: float = 8.0
    raw_below: int = RAW_BELOW_BYTES


@dataclass(frozen=True)
class ParentInfo:
    """The commit a plan is written against: its id (None: the branch is unborn), snapshot,
    recorded quantization config and quantized records by name (all a delta needs)."""

    commit: str | None = None
    snapshot: str | None = None
    quant: dict | None = None
    records: dict[str, TensorRecord] = field(default_factory=dict)

    @classmethod
    def of(cls, commit_id: str, commit: Commit, snapshot_id: str, snapshot: Snapshot
           ) -> ParentInfo:
        """From the parent's commit and snapshot objects (`snapshot_id`: the id the commit
        names; deltas record that one, so gc's replacements keep serving them)."""
        return cls(commit_id, snapshot_id, commit.quant,
                   {r.name: r for r in snapshot.tensors if lossy.is_quantized(r)})


# ---------------------------------------------------------------------------- plan

@dataclass
class WritePlan:
    """What `write` encodes: picklable, see the module docstring.

    names:     every tensor of the plan, in record order (what `write` takes names from).
    tensors:   name -> tensor; a `subset` keeps only the names one writer handles.
    parent:    the commit the records are written against (deltas, unchanged records).
    settings:  the `commit.*` values the encoding uses.
    quantized: name -> QuantizedTensor for the tensors stored quantized (on the device that
               made it); others are exact.
    domains:   name -> "log" / "linear" for compressed optimizer moments.
    moments:   name -> {"partner", "ratio_bound", "sqrt"} for compressed Adam first moments.
    """

    names: list[str]
    tensors: dict[str, torch.Tensor]
    parent: ParentInfo
    settings: CommitSettings
    quantized: dict[str, QuantizedTensor] = field(default_factory=dict)
    domains: dict[str, str] = field(default_factory=dict)
    moments: dict[str, dict] = field(default_factory=dict)

    def subset(self, names: Iterable[str]) -> WritePlan:
        """The same plan carrying only `names`' tensors: what one writer needs to be sent."""
        keep = set(names)
        unknown = keep - set(self.names)
        if unknown:
            raise UsageError(f"not in the plan: {sorted(unknown)[:5]}")
        return dataclasses.replace(
            self, tensors={n: t for n, t in self.tensors.items() if n in keep},
            quantized={n: q for n, q in self.quantized.items() if n in keep})

    def against(self, parent: ParentInfo) -> WritePlan:
        """The plan written against another parent (the branch moved since it was made): the
        quantization stays (the parent's centroids were only a warm start), deltas follow."""
        return dataclasses.replace(self, parent=parent)


@dataclass(frozen=True)
class Manifest:
    """What `publish` records besides the records themselves (plain values).

    names:    the snapshot's record order (a state's flatten order).
    skeleton: the state's structure around its tensors.
    config / quality: the QuantConfig (as a dict) and the quality record the commit records.
    parent:   the commit the new one follows (None: the branch is unborn): the value the
              ref's compare-and-swap expects.
    """

    names: list[str]
    skeleton: dict
    config: dict | None = None
    quality: dict | None = None
    parent: str | None = None


@dataclass
class CommitPlan:
    """A whole commit's plan: what to write (`write`, the half shipped to writers) and what
    to publish (`manifest`).  Picklable."""

    write: WritePlan
    manifest: Manifest

    def against(self, parent: ParentInfo) -> CommitPlan:
        """Both halves against another parent: deltas follow it, and the commit follows it."""
        return CommitPlan(self.write.against(parent),
                          dataclasses.replace(self.manifest, parent=parent.commit))


def plan(flat: FlatState, how: Quantization, parent: ParentInfo, *,
         read_centroids: ReadCentroids, settings: CommitSettings,
         grads: Mapping[str, torch.Tensor] | None = None,
         progress: Progress | None = None) -> CommitPlan:
    """Decide how each tensor of `flat` is stored (`mvc.search.plan_quantization`, see
    `mvc.search.Quantization`); no store writes.  `progress` hears of the search's trials.

    `parent`: the commit the plan is written against; its centroids warm-start k-means
    (levels, and so deltas, stay stable) and its recorded config starts the search's
    neighbourhood.  `grads` (by flattened name, e.g. an EMA of gradients) enables
    sensitivity-based protect / prune.
    """
    for name, t in flat.tensors.items():  # before any work: what no reader takes back
        check_tensor_shape(name, t.shape)
    init = parent_centroids(parent, read_centroids) if how.mode != "lossless" else {}
    q, tensors = _quantization(flat, how, parent, init, grads, progress)
    names = list(flat.tensors)
    # what the search freed on the host goes back to the OS before the writer's peak lands on it
    release_free_heap()
    return CommitPlan(
        WritePlan(names=names, tensors=dict(tensors), parent=parent, settings=settings,
                  # a quantization made on a device stays there: the writer's threads move each
                  # to the host as they encode it (`lossy.encode_for_commit`), so the copies
                  # overlap the encoding of others and the host holds the levels in flight
                  quantized=dict(q.quantized), domains=q.domains, moments=q.moments),
        Manifest(names=list(names), skeleton=flat.skeleton,
                 config=q.config.to_dict() if q.config is not None else None,
                 quality=q.quality.to_json() if q.quality is not None else None,
                 parent=parent.commit))


def _quantization(flat: FlatState, how: Quantization, parent: ParentInfo,
                  init: Mapping[str, torch.Tensor], grads: Mapping[str, torch.Tensor] | None,
                  progress: Progress | None) -> tuple[QuantizationPlan, Mapping[str, torch.Tensor]]:
    """(`plan_quantization` of the state, the tensors the writer stores).

    The hook's device path is CUDA's (float64 sums, CUDA streams): a tensor on another
    accelerator (Apple's MPS has no float64) is quantized from a host copy. Where the state's
    device runs out of memory in the hook, the hook runs again on host copies of the state
    (and of `grads`), with a warning: the same levels and configs (the host path gives the
    device path's answers), so the same commit, slower and with the state copied to host
    memory. A quality function still sees the state on its devices (`on_devices`)."""
    originals = flat.tensors

    def run(tensors: Mapping[str, torch.Tensor], g: Mapping[str, torch.Tensor] | None
            ) -> QuantizationPlan:
        def to_state(candidate: dict[str, torch.Tensor]) -> Any:
            return unflatten(flat.skeleton, on_devices(candidate, originals, tensors))
        # the quality function's calls each put the generators back; so does the rest (a
        # gate's Hessians are collected by running the model)
        with as_the_caller_left_them():
            return plan_quantization(tensors, how, to_state=to_state, previous=parent.quant,
                                     init=init, grads=g, progress=progress)

    tensors = host_copies(originals, other_accelerators)
    if grads is not None:
        grads = host_copies(grads, other_accelerators)
    retry = None
    try:
        return run(tensors, grads), tensors
    except DEVICE_OUT_OF_MEMORY as exc:
        if all(on_host_kernels(t) for t in tensors.values()):
            raise
        retry = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
    # Out of the except block: the failed attempt's frames (and the device memory they hold)
    # are gone with the exception; cycles through the pool's futures go with a collection.
    gc.collect()
    warnings.warn(MvcWarning(
        f"the commit hook ran out of device memory ({retry}); quantizing on the host instead: "
        f"the same commit, slower, with {device_bytes(tensors) / 2**30:.2f} GiB of the "
        "state copied to host memory"), stacklevel=4)
    tensors = host_copies(tensors)
    return run(tensors, host_copies(grads) if grads is not None else None), tensors


def parent_centroids(parent: ParentInfo, read_centroids: ReadCentroids) -> dict[str, torch.Tensor]:
    """The parent's centroids by tensor name: warm starts keep levels (and deltas) stable.

    In host memory whatever device the new state is on: k-means runs its centroid updates on
    the host (`mvc.quant.kmeans`, from a sketch), so that is where a warm start is used.  Only
    centroids are read: the parent's levels are read later, one tensor at a time, by the
    writer's deltas (a plan holding all of them would hold a second set of levels)."""
    if parent.snapshot is None:
        return {}
    snap, recs = parent.snapshot, list(parent.records.items())
    # one record per pool thread: each reads (and verifies) the first chunk of its payload
    got = pmap(lambda item: read_centroids(snap, item[1]).to(lossy.HOST), recs)
    return {name: c for (name, _), c in zip(recs, got)}


# ---------------------------------------------------------------------------- write

#: name -> (base encoding, dtype, shape) of each quantized tensor written: what the level
#: cache keeps so later processes decode one base instead of walking a chain.
Bases = dict[str, tuple[Any, torch.dtype, tuple[int, ...]]]


def write(plan: WritePlan, names: Iterable[str], *, blobs: BlobSink,
          read_quantized: ReadQuantized, bases: Bases | None = None,
          progress: Progress | None = None) -> list[TensorRecord]:
    """Encode and store `names` (tensors of `plan`); returns their records, in plan order.

    Every chunk a returned record names is stored when this returns.  Idempotent and safe
    to run in several processes at once, on disjoint or overlapping names: objects are
    content-addressed and the encoding is deterministic, so a name always gives the same
    record.  A quantized tensor equal to the parent's is the parent's record, reused as is;
    otherwise it is a delta against the parent or a base (`lossy.choose_encoding`).
    `bases`, when given, receives each quantized tensor's base encoding (for the level cache).
    `progress` hears of each tensor written (its raw bytes) in one "writing" phase.
    """
    wanted = set(names)
    unknown = wanted - set(plan.names)
    if unknown:
        raise UsageError(f"not in the plan: {sorted(unknown)[:5]}")
    missing = [n for n in wanted if n not in plan.tensors]
    if missing:
        raise UsageError(f"this plan does not carry the tensors of {sorted(missing)[:5]} "
                         "(a subset made for another writer)")
    todo = [n for n in plan.names if n in wanted]
    # Chunks are stored on a thread while the next tensor encodes: see mvc.store.writeback.
    with phase(progress, "writing", total_items=len(todo),
               total_bytes=sum(_nbytes(plan.tensors[n]) for n in todo)) as p, \
            BackgroundWriter(blobs) as sink:
        writer = ChunkWriter(sink, plan.settings.chunk_size)
        records = _write_all(plan, todo, writer, read_quantized, bases, p)
        writer.flush()
    return records


def _nbytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()


def _reported(names: list[str], tensors: Mapping[str, torch.Tensor], progress: Progress) -> Iterator[str]:
    """`names`, telling `progress` of each one when the loop comes back for the next."""
    for name in names:
        yield name
        progress.advance(_nbytes(tensors[name]), 1)


def _write_all(plan: WritePlan, todo: list[str], writer: ChunkWriter, read_quantized: ReadQuantized,
               bases: Bases | None, progress: Progress) -> list[TensorRecord]:
    s = plan.settings
    exact, raw = tensor_codec(s.lossless_codec), tensor_codec("raw/1")
    parent = plan.parent

    def encode(name: str) -> TensorRecord | tuple:
        prec = parent.records.get(name)
        if prec is not None and prec.meta.get("domain", "linear") != plan.domains.get(name, "linear"):
            prec = None
        return lossy.encode_for_commit(plan.quantized[name], prec, parent.snapshot, read_quantized,
                                       base_every=s.base_every, delta_max_ratio=s.delta_max_ratio,
                                       chain_budget=s.chain_budget)

    # The quantized tensors encode first (their encoded bytes are small), each crossing to the
    # host as it encodes if it was made on a device; chunks are then stored in plan order.
    # The largest encode alone, each across the pool (`large_alone`): the temporaries of
    # several (the parent's levels, the delta, the encodings: ~2.5 bytes a value) are not in
    # memory at once, and none is one thread's critical path.
    encoded = pmap_sized(encode, {n: plan.quantized[n].levels.numel() for n in todo
                                  if n in plan.quantized})
    records: list[TensorRecord] = []
    for name in _reported(todo, plan.tensors, progress):
        t = plan.tensors[name]
        q = plan.quantized.get(name)
        if q is None:
            small = t.numel() * t.element_size() < s.raw_below
            records.append(writer.write(t, raw if small else exact, name))
            continue
        got = encoded.pop(name)
        if isinstance(got, TensorRecord):
            records.append(got)   # unchanged since the parent: its record (and chunks) as is
            continue
        cname, enc, extra, depth, base = got
        domain = plan.domains.get(name, "linear")
        if domain != "linear":
            extra = dict(extra, domain=domain)
        if name in plan.moments:
            extra = dict(extra, moment=plan.moments[name])
        if bases is not None:
            bases[name] = (base, q.dtype, tuple(q.shape))
        records.append(writer.write_encoded(enc, cname, name, q.dtype, tuple(q.shape), extra,
                                            depth, raw_bytes=t.numel() * t.element_size()))
    return records


# ---------------------------------------------------------------------------- publish

@dataclass(frozen=True)
class CommitInfo:
    """What a commit object says besides its snapshot and parents (all plain values)."""

    message: str
    author: str
    step: int | None = None
    metrics: dict[str, float] = field(default_factory=dict)
    provenance: dict | None = None
    time: str | None = None  # ISO 8601; None: now


def snapshot_of(manifest: Manifest, records: Iterable[TensorRecord]) -> Snapshot:
    """The snapshot `publish` writes for `manifest`: `records` (from every writer, in any order
    and with repeats) in the manifest's order, with its skeleton.  `IncompleteCommitError`
    unless they cover the manifest's names exactly, one record each."""
    by_name: dict[str, TensorRecord] = {}
    for rec in records:
        seen = by_name.setdefault(rec.name, rec)
        if seen != rec:
            raise IncompleteCommitError(f"two different records for tensor {rec.name!r}")
    missing = [n for n in manifest.names if n not in by_name]
    extra = sorted(set(by_name) - set(manifest.names))
    if missing or extra:
        raise IncompleteCommitError(
            f"records do not match the plan: missing {missing[:5]}, not planned {extra[:5]}")
    return Snapshot([by_name[n] for n in manifest.names], manifest.skeleton)


def publish(manifest: Manifest, records: Iterable[TensorRecord], info: CommitInfo, *,
            blobs: BlobSink, refs: RefSink, ref: str) -> tuple[str, str]:
    """Write the snapshot and the commit object, then move `ref` from the manifest's parent to
    the commit (compare-and-swap: `RefConflictError` if it moved).  Returns (commit id, snapshot id).

    `records` as for `snapshot_of`; every chunk they name must be stored (MissingChunkError;
    nothing is published).  Call it under the write lock, as gc takes it too.
    """
    snap = snapshot_of(manifest, records)
    ordered = snap.tensors
    for rec in ordered:
        for oid in rec.chunks:
            if not blobs.has(oid):
                raise MissingChunkError(oid)
    # Both objects read back by the reader's parsers first: nothing it refuses is published.
    snap_data = checked_encoding(snap)
    parent = manifest.parent
    commit = Commit(
        parents=[parent] if parent else [], snapshot=object_id(snap_data),
        message=info.message,
        time=info.time or datetime.now(timezone.utc).isoformat(timespec="microseconds"),
        author=info.author, step=info.step, metrics=dict(info.metrics),
        provenance=info.provenance, quant=manifest.config, quality=manifest.quality,
        chain_depth=max((r.depth for r in ordered), default=0),
    )
    # Both objects in one transaction (one fsync), then the ref: the commit point.
    sid, cid = blobs.put_many([snap_data, checked_encoding(commit)])
    if sid != commit.snapshot:
        raise InternalError(f"snapshot stored as {sid}, expected {commit.snapshot}")
    refs.update_ref(ref, parent, cid, f"commit: {commit.summary}")
    return cid, sid
