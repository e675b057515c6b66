"""The commit pipeline in three stages: plan -> write -> publish.

    plan     flatten the state and decide, per tensor, how it is stored: an exact codec, or
             quantized (a fixed config, the config search, optimizer-moment compression,
             first-moment bounds).  No store writes.
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
`read_quantized(snapshot_id, record)` for the parent's quantized tensors, the ref store
for the one compare-and-swap and plain configuration values (`CommitSettings`).
"""
from __future__ import annotations

import dataclasses
import warnings
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any, Protocol

import torch

import mvc.search
from mvc.codecs.base import BytesLike, tensor_codec
from mvc.errors import InternalError, MvcError, MvcWarning, UsageError
from mvc.native.parallel import pmap
from mvc.progress import Progress, phase
from mvc.quant import QuantConfig, QuantizedTensor, QuantPolicy, quantize_state
from mvc.quant.optimizer import moment_ratio_bound, quantize_optimizer_state, zeroed_moment
from mvc.repo import lossy
from mvc.repo.objects import (Commit, Snapshot, TensorRecord, check_tensor_shape,
                              checked_encoding)
from mvc.repo.tensors import ChunkWriter
from mvc.search import default_policy
from mvc.search.measure import DEFAULT_MOMENT_CAP, measure, moment_distortion
from mvc.search.space import SearchSpace
from mvc.state import FlatState, unflatten
from mvc.store import ObjectMissingError, object_id
from mvc.store.writeback import BackgroundWriter

#: Tensors this small are stored raw: a codec header would cost more than it saves.
RAW_BELOW_BYTES = 64

#: read_quantized(snapshot id, record) -> the record's QuantizedTensor (walking its chain).
ReadQuantized = Callable[[str, TensorRecord], QuantizedTensor]


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


#: What a fixed-config commit outside its gate's bound or the tensor cap does (see
#: `Quantization`): the first is the default of `commit.fixed_gate`.
FIXED_RULES = ("warn", "refuse")


class FixedConfigRefusedError(UsageError):
    """A fixed-config commit measured outside its quality bound or the tensor cap while
    commit.fixed_gate = refuse; nothing was stored."""

    exit_code = 190


@dataclass(frozen=True)
class Quantization:
    """How a commit stores its tensors: `mode` "lossless", "fixed" (`config`) or "search"
    (`space`, judged by `quality(candidate_state) -> loss` within `epsilon`, or by the proxy;
    every trial keeps each quantized tensor's relative L2 error within `tensor_cap`, None: the
    search's default); `optimizer` "exact" or "compressed" (Adam moments, ExCP-style).

    A "fixed" commit is measured by the same gates (`quality`, `epsilon`, `tensor_cap`) but
    not searched; `fixed_rule` says what a measurement outside its bound does: "warn"
    (store as configured, record it, warn) or "refuse" (`FixedConfigRefusedError`)."""

    mode: str = "lossless"
    config: QuantConfig | None = None
    space: SearchSpace | None = None
    quality: Callable[[Any], float] | None = None
    epsilon: float | None = None
    policy: QuantPolicy | None = None
    optimizer: str = "exact"
    tensor_cap: float | None = None
    fixed_rule: str = "warn"
    moment_cap: float | None = None

    def __post_init__(self) -> None:
        if self.mode not in ("lossless", "fixed", "search"):
            raise UsageError(f"commit mode must be lossless, fixed or search, got {self.mode!r}")
        if self.mode == "fixed" and not isinstance(self.config, QuantConfig):
            raise UsageError("a fixed-config commit needs a mvc.quant.QuantConfig")
        if self.fixed_rule not in FIXED_RULES:
            raise UsageError(f"commit.fixed_gate must be one of {', '.join(FIXED_RULES)}, "
                             f"got {self.fixed_rule!r}")
        if self.optimizer not in ("exact", "compressed"):
            raise UsageError(f"commit.optimizer must be 'exact' or 'compressed', "
                             f"got {self.optimizer!r}")


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
    quantized: name -> QuantizedTensor for the tensors stored quantized; others are exact.
    domains:   name -> "log" / "linear" for compressed optimizer moments.
    moments:   name -> {"partner", "ratio_bound"} for compressed Adam first moments.
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
         read_quantized: ReadQuantized, settings: CommitSettings,
         grads: Mapping[str, torch.Tensor] | None = None) -> CommitPlan:
    """Decide how each tensor of `flat` is stored (see `Quantization`); no store writes.

    `parent`: the commit the plan is written against; its centroids warm-start k-means
    (levels, and so deltas, stay stable) and its recorded config starts the search's
    neighbourhood.  `grads` (by flattened name, e.g. an EMA of gradients) enables
    sensitivity-based protect / prune.
    """
    for name, t in flat.tensors.items():  # before any work: what no reader takes back
        check_tensor_shape(name, t.shape)
    config: QuantConfig | None = None
    qmap: dict[str, QuantizedTensor | None] = {}
    quality: dict | None = None
    init: dict[str, torch.Tensor] = {}
    if how.mode != "lossless":
        init = parent_centroids(parent, read_quantized)
        if how.mode == "fixed":
            config = how.config
            qmap, quality = quantize_fixed(flat.tensors, how.config, how.policy, grads, init)
            quality = gate_fixed(flat, qmap, quality, how)
        else:
            config, qmap, quality = search(flat, how, parent, grads, init)
    domains: dict[str, str] = {}
    if config:
        domains, report = compress_optimizer(flat.tensors, qmap, init, how.optimizer,
                                             how.moment_cap)
        if quality is not None and report:
            quality = dict(quality, **report)
    names = list(flat.tensors)
    return CommitPlan(
        WritePlan(names=names, tensors=dict(flat.tensors), parent=parent, settings=settings,
                  quantized={n: q for n, q in qmap.items() if q is not None}, domains=domains,
                  moments=moment_bounds(flat.tensors, domains)),
        Manifest(names=list(names), skeleton=flat.skeleton,
                 config=config.to_dict() if config is not None else None, quality=quality,
                 parent=parent.commit))


def parent_centroids(parent: ParentInfo, read_quantized: ReadQuantized) -> dict[str, torch.Tensor]:
    """The parent's centroids by tensor name: warm starts keep levels (and deltas) stable."""
    if parent.snapshot is None:
        return {}
    snap, recs = parent.snapshot, list(parent.records.items())
    # one tensor per pool thread: a parent's levels decode (or load from the level cache) apiece
    got = pmap(lambda item: read_quantized(snap, item[1]).centroids, recs)
    return {name: c for (name, _), c in zip(recs, got)}


def quantize_fixed(tensors: Mapping[str, torch.Tensor], config: QuantConfig | None,
                   policy: QuantPolicy | None, grads: Mapping[str, torch.Tensor] | None,
                   init: Mapping[str, torch.Tensor] | None = None
                   ) -> tuple[dict[str, QuantizedTensor | None], dict]:
    """(name -> QuantizedTensor or None, quality record) for one config."""
    assert config is not None
    qmap = quantize_state(tensors, config, policy or _default_policy(), grads,
                          nonfinite="lossless", init=init)
    err = ref = 0.0
    for name, q in qmap.items():
        if q is not None:
            w = tensors[name].detach()
            err += float(torch.linalg.vector_norm((q.dequantize() - w).float())) ** 2
            ref += float(torch.linalg.vector_norm(w.float())) ** 2
    rel = (err / ref) ** 0.5 if ref > 0 else 0.0
    # No gate chose a fixed config: `gate_fixed` measures it (worst tensor, quality).
    quality = {"metric": "rel_l2_weights", "value": rel, "baseline": 0.0, "bound": None,
               "quantized_tensors": sum(q is not None for q in qmap.values()), "gate": "none"}
    return qmap, quality


def gate_fixed(flat: FlatState, qmap: Mapping[str, QuantizedTensor | None], record: dict,
               how: Quantization) -> dict:
    """Measure a fixed config with the search's gates and apply `how.fixed_rule`.

    The record keeps `value` = the weights' relative L2 error when no quality function
    is given (gate "none"); with one, the gate it selects measures the config once
    (`value`, `degradation`, `ucb` / `fidelity`, `within_bound`) and the weights' error
    moves to `rel_l2_weights`.  `within_cap` says whether every quantized tensor kept
    its relative L2 error within `how.tensor_cap`; `outside` lists what did not."""
    cap = mvc.search.DEFAULT_TENSOR_CAP if how.tensor_cap is None else how.tensor_cap
    evaluate = None
    if how.quality is not None:
        quality, skeleton = how.quality, flat.skeleton

        def evaluate(candidate: dict[str, torch.Tensor]) -> Any:
            return quality(unflatten(skeleton, candidate))
    epsilon = mvc.search.DEFAULT_EPSILON if how.epsilon is None else how.epsilon
    m = measure(flat.tensors, qmap, evaluate=evaluate, epsilon=epsilon, tensor_cap=cap)
    rec = dict(record, mode="fixed", **{k: v for k, v in m.items() if k != "quality_value"})
    if evaluate is not None:
        rec.update(metric=f"fixed-config:{m['gate']}", value=m["quality_value"],
                   rel_l2_weights=record["value"])
    outside = []
    if not m["within_cap"]:
        outside.append(f"tensor {m['worst_tensor']} has relative L2 error "
                       f"{m['max_distortion']:.4g} > quality.tensor_cap {cap:g}")
    if evaluate is not None and not m["within_bound"]:
        outside.append(f"the {m['gate']} gate measured it outside its bound "
                       f"({_measured(m)})")
    if outside:
        rec["outside"] = outside
        what = "; ".join(outside)
        if how.fixed_rule == "refuse":
            raise FixedConfigRefusedError(
                f"fixed config refused: {what}; nothing stored (commit.fixed_gate = refuse; "
                "'warn' stores it as configured)")
        warnings.warn(MvcWarning(f"fixed config stored as configured, but {what} "
                                 "(commit.fixed_gate = refuse refuses such a commit)"),
                      stacklevel=4)
    return rec


def _measured(m: Mapping[str, Any]) -> str:
    def num(x: Any) -> str:
        return "inf" if x is None else f"{x:.4g}"
    if m["gate"] == "fidelity":
        if m.get("confidence") is not None and m.get("fidelity_ucb") is not None:
            return f"upper bound {num(m['fidelity_ucb'])} > {m['epsilon']:g}"
        return f"{num(m.get('fidelity'))} > {m['epsilon']:g}"
    if m["gate"] == "per-example-ucb":
        return f"upper bound {num(m.get('ucb'))} > {m['epsilon']:g}"
    return f"relative degradation {num(m.get('degradation'))} > {m['epsilon']:g}"


def search(flat: FlatState, how: Quantization, parent: ParentInfo,
           grads: Mapping[str, torch.Tensor] | None, init: Mapping[str, torch.Tensor]
           ) -> tuple[QuantConfig | None, dict[str, QuantizedTensor | None], dict]:
    """The commit hook: the most compressive config of `how.space` within `how.epsilon`,
    starting from the parent's config (Inshrinkerator §5)."""
    previous = None
    if parent.quant:
        try:
            previous = QuantConfig.from_dict(parent.quant)
        except MvcError:  # written by another version: start afresh
            previous = None
    evaluate = None
    quality = how.quality
    if quality is not None:
        skeleton = flat.skeleton

        def evaluate(candidate: dict[str, torch.Tensor]) -> float:
            return quality(unflatten(skeleton, candidate))
    # Through the package, not a name bound at import: callers (tests, a Tracker) may wrap it.
    result = mvc.search.find_config(
        flat.tensors, evaluate=evaluate, epsilon=how.epsilon, previous=previous, grads=grads,
        policy=how.policy or _default_policy(), space=how.space,
        metric_name=getattr(quality, "__name__", None) if quality else None,
        init=init, tensor_cap=how.tensor_cap)
    if result.config is None:
        return None, {}, dict(result.quality, stored="lossless: no feasible configuration")
    return result.config, dict(result.qmap), result.quality


#: Guard rail on compressed first moments (linear domain): a restored m may not be further
#: from m than zeros are (relative L2 error 1): never worse than dropping the momentum.
#: The default scheme (85% pruned, 2 levels) measures 0.55-1.0 on bench_e2e's models by
#: design, and 1.15 on the CNN's largest layer after 200 steps (docs/quality.md): such a
#: moment is stored as zeros (all pruned), which is exactly at the cap and costs nothing.
FIRST_MOMENT_CAP = 1.0


def compress_optimizer(tensors: Mapping[str, torch.Tensor],
                       qmap: dict[str, QuantizedTensor | None],
                       init: Mapping[str, torch.Tensor], policy: str,
                       moment_cap: float | None = None) -> tuple[dict[str, str], dict]:
    """Add optimizer moments to `qmap` when `policy` is "compressed".

    Returns (name -> domain, record fields).  Guard rail: each compressed moment's error
    in the quantity Adam uses (`mvc.search.measure.moment_distortion`) must stay within
    its cap -- FIRST_MOMENT_CAP for first moments, `moment_cap` (config
    `quality.moment_cap`; None: the default) for second moments' sqrt(v); a second moment
    over its cap is stored exactly instead (`moments_exact`), a first moment over it as
    zeros (`moments_zeroed`: no worse than the cap, at no cost).  The record carries
    `moment_cap` and the worst error per domain (`moment_distortion`).
    `init`: the parent's centroids by name, to warm-start the moments' k-means.
    """
    if policy == "exact":
        return {}, {}
    cap_v = DEFAULT_MOMENT_CAP if moment_cap is None else moment_cap
    caps = {"linear": FIRST_MOMENT_CAP, "log": cap_v}
    domains: dict[str, str] = {}
    worst: dict[str, float] = {}
    exact: list[str] = []
    zeroed: list[str] = []
    moments = quantize_optimizer_state(tensors, qmap, init=init)
    # measured one moment per pool thread (a pass each; results do not depend on the split)
    dist = dict(zip(moments, pmap(lambda n: moment_distortion(moments[n].q, moments[n].domain,
                                                               tensors[n]), list(moments))))
    for name, oq in moments.items():
        d = dist[name]
        q = oq.q
        if not d <= caps[oq.domain] and oq.domain == "linear":
            t = tensors[name]
            q = zeroed_moment(t, q.bins)
            d = moment_distortion(q, oq.domain, t)
            zeroed.append(name)
        worst[oq.domain] = max(worst.get(oq.domain, 0.0), d)
        if not d <= caps[oq.domain]:
            exact.append(name)
            continue
        qmap[name] = q
        domains[name] = oq.domain
    if not worst:
        return domains, {}
    report: dict[str, Any] = {
        "moment_cap": {"linear": FIRST_MOMENT_CAP, "log": cap_v},
        "moment_distortion": {k: (round(v, 6) if v < float("inf") else None)
                              for k, v in worst.items()}}
    if exact:
        report["moments_exact"] = sorted(exact)
    if zeroed:
        report["moments_zeroed"] = sorted(set(zeroed) - set(exact))
    return domains, report


def moment_bounds(tensors: Mapping[str, torch.Tensor], domains: Mapping[str, str]
                  ) -> dict[str, dict]:
    """Extra record meta for compressed first moments: their second-moment partner and
    the largest |m| / sqrt(v) of the exact state, so restore can keep Adam's step bounded."""
    pairs = [n for n, domain in domains.items() if domain == "linear" and n.endswith("exp_avg")
             and n + "_sq" in tensors and tensors[n].shape == tensors[n + "_sq"].shape]
    bounds = pmap(lambda n: moment_ratio_bound(tensors[n], tensors[n + "_sq"]), pairs)
    return {n: {"partner": n + "_sq", "ratio_bound": b} for n, b in zip(pairs, bounds)}


def _default_policy() -> QuantPolicy:
    # Weights only: optimizer state has its own path (`commit.optimizer`).
    return default_policy()


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

    # The quantized tensors encode on the pool, one per thread, biggest first (their encoded
    # bytes are small); chunks are then stored in plan order.
    quant = sorted((n for n in todo if n in plan.quantized),
                   key=lambda n: -plan.quantized[n].levels.numel())
    encoded = dict(zip(quant, pmap(encode, quant)))
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
