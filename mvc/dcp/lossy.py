"""The lossy path of a sharded save: every rank quantizes its own shards, all alike.

No rank holds a whole tensor, so everything a quantization decision reads is agreed over
the process group before it is used, and every rank then decides the same thing:

* **sketches**: each rank sketches its shards (DDSketch, `mvc.quant.LogSketch`); the
  sketches are all-gathered and merged in rank order -- the all-reduce of their bucket
  counts -- into one sketch per tensor, and those into one per layer type.  Thresholds
  (prune / protect) are read off the layer type's merged sketch and k-means runs on the
  tensor's merged sketch with the same seed and the same warm start (the parent's
  centroids, as one rank found them), so every shard of a tensor gets the same
  centroids, and the shards together are quantized as the gathered tensor would be.
* **the search** (``commit.mode = search``): `mvc.search.search_trials`, the search
  `find_config` runs (the guided exhaustive search, Inshrinkerator Alg. 4, the probe of
  an inferred winner, the tensor cap, the record), over *collective trials*
  (`ShardedTrials`).  A trial's proxy, sqrt(sum |w| (q - w)^2 / sum |w| w^2), each
  tensor's relative L2 error (the tensor cap) and its level counts (the bits) are sums
  over parameters: each rank sums over its shards, an all-reduce adds them, and every rank
  sees the same verdict.  The search is deterministic given the verdicts, so every rank
  walks the same trials in the same order, reuses the same quantizations and picks the
  same config.  A user quality function cannot run here (no rank holds the model), so
  the gate is always the proxy; the search starts afresh each save (no neighbourhood
  search).
* **fixed** (``commit.mode = fixed`` or `quant=`): the one config, one collective trial
  measures it.

Without a process group (one process) the collectives are the identity.  Gradients are
not known to a StorageWriter: pruning and protection use magnitude only.
"""
from __future__ import annotations

import dataclasses
import math
import warnings
import weakref
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from mvc.errors import MvcError, MvcWarning
from mvc.quant import LogSketch, QuantConfig, QuantizedTensor, QuantPolicy, quantize_prepared
from mvc.quant.uniform import DEFAULT_FAMILY, FAMILIES, grid_size
from mvc.quant.error import cached_error_sums, level_histogram
from mvc.quant.errors import NonFiniteTensorError
from mvc.layer_types import layer_type
from mvc.quant.partition import Thresholds, thresholds
from mvc.repo.commitopts import quantization
from mvc.repo.config import Config
from mvc.search import default_policy
from mvc.search.driver import search_trials
from mvc.search.gate import DEFAULT_TENSOR_CAP
from mvc.search.quality import PROXY_EPSILON, PROXY_MAGNITUDE, finite, rel_l2
from mvc.search.record import NOTHING_TO_QUANTIZE, QualityRecord
from mvc.search.space import SearchSpace
from mvc.search.trials import Measure, PieceKey, Pieces, entropy_bits, quantize_config
from mvc.search.trials import worst as worst_of

MAGNITUDE = "magnitude"


@dataclass(frozen=True)
class How:
    """How a sharded save stores its tensors (decided once, by the coordinator; picklable)."""

    mode: str = "lossless"              # "lossless", "fixed" or "search"
    config: dict | None = None          # fixed: QuantConfig.to_dict()
    space: SearchSpace | None = None
    epsilon: float = PROXY_EPSILON
    tensor_cap: float = DEFAULT_TENSOR_CAP
    policy: QuantPolicy | None = None
    seed: int = 0
    optimizer: str = "exact"            # commit.optimizer: "compressed" (mvc.dcp.moments)
    moment_cap: float | None = None     # quality.moment_cap (None: the default)

    @property
    def lossy(self) -> bool:
        return self.mode != "lossless"

    @classmethod
    def of(cls, config: Config, lossless: bool, options: Mapping[str, Any]) -> How:
        """From the writer's options and the ``commit.*`` configuration (the repository's, or
        a remote save's `config=`), with `Repo.commit`'s precedence: lossless, then `quant=`,
        then `space=`, then the mode."""
        # DCP keys optimizer state by parameter name (``optim/state/fc1.weight/exp_avg``),
        # which the default policy's ``state/<index>`` pattern does not catch.
        policy = options.get("policy") or QuantPolicy(
            exclude=tuple(default_policy().exclude) + ("*/state/*", "state/*"))
        # Repo.commit's rules (precedence, a fixed mode's config, the proxy opt-in), without a
        # quality function: a storage writer has no model to evaluate.
        how = quantization(config, lossless, options.get("quant"), policy, None,
                           options.get("epsilon"), options.get("space"))
        if how.mode == "lossless":
            return cls("lossless", policy=policy)
        if how.mode == "fixed":
            assert how.config is not None
            return cls("fixed", config=how.config.to_dict(), policy=policy,
                       optimizer=how.optimizer, moment_cap=how.moment_cap)
        cap = options.get("tensor_cap")
        if cap is None:
            cap = how.tensor_cap
        return cls("search", space=how.space or SearchSpace.default(),
                   epsilon=float(PROXY_EPSILON if how.epsilon is None else how.epsilon),
                   tensor_cap=float(DEFAULT_TENSOR_CAP if cap is None else cap), policy=policy,
                   optimizer=how.optimizer, moment_cap=how.moment_cap)


class PeerFailedError(MvcError):
    """Another rank failed in a step of a sharded save that every rank takes together (its
    own error is raised there); this rank stops with it instead of waiting for it."""

    exit_code = 165


# ------------------------------------------------------------------ collectives
#: The process group a save's collectives run on (None: the default group).  Set per save by
#: the writer (`collective_group`): an async save runs in a background thread, typically on
#: a checkpoint group of its own, while the training loop's collectives use the default one.
_GROUP: ContextVar[Any] = ContextVar("mvc_dcp_group", default=None)


@contextmanager
def collective_group(group: Any) -> Iterator[None]:
    """Run this thread's `all_gather` / `all_sum` on `group` (None: the default group)."""
    token = _GROUP.set(group)
    try:
        yield
    finally:
        _GROUP.reset(token)


def _group_size() -> int:
    if not (dist.is_available() and dist.is_initialized()):
        return 1
    return dist.get_world_size(_GROUP.get())


def all_gather(obj: Any) -> list[Any]:
    """`obj` of every rank, in rank order ([obj] without a process group)."""
    size = _group_size()
    if size == 1:
        return [obj]
    out: list[Any] = [None] * size
    dist.all_gather_object(out, obj, group=_GROUP.get())
    return out


def all_sum(values: list[float]) -> list[float]:
    """Element-wise sums over the ranks (float64)."""
    if _group_size() == 1 or not values:
        return list(values)
    group = _GROUP.get()
    t = torch.tensor(values, dtype=torch.float64, device=reduce_device(str(dist.get_backend(group))))
    dist.all_reduce(t, group=group)
    return t.tolist()


def reduce_device(backend: str) -> torch.device:
    """Where `all_sum`'s tensor goes for a group of `backend` (`dist.get_backend`'s name): the
    host when a backend of the group takes host tensors (gloo, mpi, or a "cpu:..." pair such as
    "cpu:gloo,cuda:nccl"), else the current CUDA device: NCCL reduces CUDA tensors only, and GPU
    training usually runs on an NCCL group alone."""
    name = backend.lower()
    if "gloo" in name or "mpi" in name or "cpu:" in name or not torch.cuda.is_available():
        return torch.device("cpu")
    return torch.device("cuda", torch.cuda.current_device())


# ------------------------------------------------------------------ the collective trials
@dataclass(frozen=True)
class _ShardSums:
    """What a trial reads off one shard's quantization: sum |w| e^2, sum |w| w^2, sum e^2,
    sum w^2 (e = restored - w, float64), the level counts, the protected values' bits."""

    wnum: float
    wden: float
    e2: float
    w2: float
    counts: torch.Tensor
    protected_bits: int


def _levels(bins: int) -> int:
    """Level counts a trial of `bins` exchanges per tensor, in either family: the most levels
    a quantization of `bins` can have (k-means: bins + 2; the uniform grid's
    `grid_size(bins)` + 2), so every rank lays them out alike whatever the family. Unused
    slots count 0, which no bit count reads."""
    return max(bins, grid_size(bins)) + 2


class ShardedTrials:
    """A sharded save's `mvc.search.trials.TrialSource`: the agreed sketches (per tensor,
    merged over its shards, and per layer type), this rank's shards quantized by them, and
    a trial's sums added up over the ranks, so every rank measures the same trial."""

    has_sensitivity = False   # no gradient reaches a storage writer: magnitude only

    def __init__(self, tensors: Mapping[str, torch.Tensor], shards: Mapping[str, dict],
                 how: How, init: Mapping[str, torch.Tensor]) -> None:
        alpha = (how.space or SearchSpace.default()).alpha
        policy = how.policy or default_policy()
        self.tensors = tensors
        self.of = {n: shards[n]["of"] if n in shards else n for n in tensors}
        shapes = {n: list(shards[n]["shape"]) if n in shards else list(t.shape)
                  for n, t in tensors.items()}
        local: dict[str, Any] = {}    # tensor -> [sketch or None (non-finite), shape, init]
        error: BaseException | None = None
        try:
            self._sketch(tensors, shards, shapes, policy, alpha, init, local)
        except Exception as exc:   # every rank must reach the gather below, and learn of it
            error = exc
        gathered = all_gather((None, local) if error is None else (repr(error), {}))
        _raise_if_failed(error, [e for e, _ in gathered])
        merged: dict[str, LogSketch | None] = {}
        self.shapes: dict[str, list[int]] = {}
        #: warm-start centroids by tensor, as one rank found them (every rank uses these)
        self.init: dict[str, torch.Tensor] = {}
        for _, rank in gathered:
            for g, (sk, shape, c) in rank.items():
                if g in merged and (merged[g] is None or sk is None):
                    merged[g] = None
                else:
                    merged[g] = sk if g not in merged else merged[g].merge(sk)  # type: ignore[union-attr]
                self.shapes[g] = shape
                if c is not None and g not in self.init:
                    self.init[g] = c
        self._finish(tensors, merged, alpha)
        self._stats: weakref.WeakKeyDictionary[QuantizedTensor, _ShardSums] = \
            weakref.WeakKeyDictionary()
        self._error: BaseException | None = None

    def _sketch(self, tensors: Mapping[str, torch.Tensor], shards: Mapping[str, dict],
                shapes: Mapping[str, list[int]], policy: QuantPolicy, alpha: float,
                init: Mapping[str, torch.Tensor], local: dict[str, Any]) -> None:
        """This rank's sketches (a tensor's shards on this rank merged), into `local`."""
        for name, t in tensors.items():
            g = self.of[name]
            probe = torch.empty(shapes[name], dtype=t.dtype, device="meta")
            if not policy.should_quantize(g, probe):
                continue
            try:
                sk: LogSketch | None = LogSketch.from_tensor(
                    t.reshape(-1).to(torch.float32), alpha, name=g)
            except NonFiniteTensorError:
                sk = None
            prev = local.get(g)
            if prev is not None and prev[0] is not None and sk is not None:
                sk = prev[0].merge(sk)
            elif prev is not None:
                sk = None
            c = init.get(name)
            local[g] = [sk, shapes[name],
                        c.detach().cpu() if c is not None else (prev[2] if prev else None)]

    def _finish(self, tensors: Mapping[str, torch.Tensor], merged: dict[str, LogSketch | None],
                alpha: float) -> None:
        #: tensor -> its merged sketch (non-finite tensors stay lossless on every rank)
        self.sketches = {g: sk for g, sk in sorted(merged.items()) if sk is not None}
        self.groups: dict[str, list[str]] = {}
        for g in self.sketches:
            self.groups.setdefault(layer_type(g, self.shapes[g]), []).append(g)
        self.names = [g for names in self.groups.values() for g in names]
        self.mag = {lt: LogSketch(alpha).merge(*(self.sketches[g].abs() for g in names))
                    for lt, names in self.groups.items()}
        total = sum(math.prod(self.shapes[g]) for g in self.sketches)
        emb = sum(math.prod(self.shapes[g]) for g in self.groups.get("embedding", []))
        self.embeddings = "embedding" in self.groups
        self.embedding_share = emb / total if total else 0.0
        #: this rank's quantized tensors and shards, in their order (the sums add up in it)
        self.local = [n for n in tensors if self.of[n] in self.sketches]
        self._shards_of: dict[str, list[str]] = {}
        for n in self.local:
            self._shards_of.setdefault(self.of[n], []).append(n)
        #: a trial's sums, per tensor, in this order on every rank
        self._pos = {g: i for i, g in enumerate(sorted(self.sketches))}

    # ------------------------------------------------------------------ TrialSource
    def thresholds(self, config: QuantConfig, ltype: str) -> Thresholds:
        """Magnitude thresholds (no sensitivity), whatever metric `config` names."""
        lq = config.for_layer_type(ltype)
        return thresholds(self.mag[ltype], None, prune=lq.prune, prune_metric=MAGNITUDE,
                          protect=lq.protect)

    def tensor_thresholds(self, name: str, thr: Thresholds) -> Thresholds:
        return thr

    #: The quantizer families a sharded save quantizes with: a uniform grid, like k-means
    #: centroids, is a function of the merged sketch, so every rank's shards share it.
    families = FAMILIES

    def quantize(self, name: str, bins: int, thr: Thresholds, *, seed: int, sigma: float,
                 init: torch.Tensor | None, weigh: bool, family: str = DEFAULT_FAMILY) -> Pieces:
        """This rank's shards of tensor `name` (maybe none), with the same centroids on every
        rank, in quantizer family `family`.  A failure is kept for the trial's `measure`, which
        every rank reaches."""
        out: dict[str, QuantizedTensor] = {}
        if self._error is not None:
            return out
        try:
            for n in self._shards_of.get(name, []):
                t = self.tensors[n]
                x = t.detach().reshape(-1).to(torch.float32).contiguous()
                q = quantize_prepared(t, x, self.sketches[name], None, thr, bins, seed=seed,
                                      sigma=sigma, init=init, family=family)
                self._stats[q] = _shard_sums(q, t)
                out[n] = q
        except Exception as exc:   # the others will be in the trial's all-reduce: tell them there
            self._error = exc
        return out

    def measure(self, qmap: Mapping[str, QuantizedTensor | None],
                pieces: Mapping[PieceKey, Pieces], proxy: bool) -> Measure:
        """The trial's proxy, per-tensor errors and bits over every rank's shards: sums over
        this rank's, added up over the ranks.  Every rank must call it, with the same trial
        (it does: the search decides alike everywhere); a rank that failed in the trial
        raises its error here, the others `PeerFailedError`."""
        tot, counts = agreed_sums(2 + 2 * len(self._pos), lambda sums: self._add(pieces, sums),
                                  self._error)
        distortion = {g: rel_l2(tot[2 + 2 * self._pos[g]], tot[3 + 2 * self._pos[g]])
                      for g, _, _ in pieces}
        # The level counts in an all-reduce of their own: the sums' all-reduce (and the
        # order it adds them in) stays what it was before the counts joined.
        return Measure(rel_l2(tot[0], tot[1]) if proxy else None,
                       PROXY_MAGNITUDE if proxy else None, distortion,
                       self._bits(pieces, all_sum(counts)))

    def _add(self, pieces: Mapping[PieceKey, Pieces], sums: list[float]) -> list[float]:
        """This rank's sums into `sums`; its level counts and protected bits per tensor (in
        `_pos` order: `_levels(bins)` counts, then the bits)."""
        stats = {n: self._stats[q] for got in pieces.values() for n, q in got.items()}
        for n in self.local:
            s = stats.get(n)
            if s is None:
                continue
            sums[0] += s.wnum
            sums[1] += s.wden
            i = 2 + 2 * self._pos[self.of[n]]
            sums[i] += s.e2
            sums[i + 1] += s.w2
        slot: dict[str, int] = {}
        width: dict[str, int] = {}
        at = 0
        for g, bins in sorted((g, b) for g, b, _ in pieces):
            slot[g], width[g] = at, _levels(bins)
            at += width[g] + 1
        counts = [0.0] * at
        for n in self.local:
            s = stats.get(n)
            if s is None:
                continue
            i = slot[self.of[n]]
            for level, c in enumerate(s.counts.tolist()):
                counts[i + level] += c
            counts[i + width[self.of[n]]] += s.protected_bits
        return counts

    @staticmethod
    def _bits(pieces: Mapping[PieceKey, Pieces], counts: list[float]) -> float:
        """Bits per quantized parameter of the whole tensors, from their summed counts."""
        total_bits, n, at = 0.0, 0, 0
        for _, bins in sorted((g, b) for g, b, _ in pieces):
            width = _levels(bins)
            c = torch.tensor(counts[at:at + width], dtype=torch.float64)
            numel = int(c.sum())
            if numel:
                total_bits += entropy_bits(c, numel) + counts[at + width]
                n += numel
            at += width + 1
        return total_bits / n if n else 0.0


    def check(self) -> None:
        """Raise the error a quantization outside a trial met (the winner's, recomputed)."""
        if self._error is not None:
            raise self._error


def _shard_sums(q: QuantizedTensor, t: torch.Tensor) -> _ShardSums:
    # one pass over the levels (native on the host; chunked, one wait, on a device), as a
    # whole-state search measures: no dequantized copy and four float64 copies of the shard
    e2, w2, wnum, wden = cached_error_sums(q, t)[:4]
    return _ShardSums(wnum, wden, e2, w2, level_histogram(q),
                      q.protected.numel() * q.protected.element_size() * 8)


def agreed_sums(n: int, fill: Callable[[list[float]], Any], error: BaseException | None = None
                ) -> tuple[list[float], Any]:
    """(`n` sums added over the ranks, what `fill` returned on this rank): `fill` adds this
    rank's part into a list of `n` zeros. A rank that failed -- `error`, or `fill` raising --
    makes every rank raise after the one all-reduce (its own error there, `PeerFailedError`
    elsewhere), so no rank waits on a collective the others left."""
    sums = [0.0] * (n + 1)   # the last slot counts the ranks that failed
    got = None
    if error is None:
        try:
            got = fill(sums)
        except Exception as exc:
            error = exc
    if error is not None:
        sums = [0.0] * (n + 1)
        sums[-1] = 1.0
    tot = all_sum(sums)
    _raise_if_failed(error, ["a rank"] if tot[-1] > 0 else [])
    return tot[:n], got


def _raise_if_failed(error: BaseException | None, peers: list[Any]) -> None:
    """Raise this rank's own error, or `PeerFailedError` when another rank reported one."""
    if error is not None:
        raise error
    failed = [p for p in peers if p]
    if failed:
        raise PeerFailedError(f"another rank failed in the sharded save: {failed[0]}")


# ------------------------------------------------------------------ the decision
def choose(tensors: Mapping[str, torch.Tensor], shards: Mapping[str, dict], how: How,
           init: Mapping[str, torch.Tensor]
           ) -> tuple[dict[str, QuantizedTensor], dict | None, dict | None]:
    """(this rank's quantized tensors by record name, the config as a dict, the quality
    record as JSON); every rank of the group must call it, with its own tensors.  Nothing
    to quantize or nothing feasible: ({}, None, a record saying so) -- stored losslessly."""
    trials = ShardedTrials(tensors, shards, how, init)
    if how.mode == "fixed":
        assert how.config is not None
        config = QuantConfig.from_dict(how.config)
        if config.feedback:
            # no rank holds a module or calibration inputs: say so, and record what was done
            warnings.warn(MvcWarning(
                "the fixed config asks for error feedback, which a sharded save cannot apply "
                "(no layer input Hessians): quantized without it"), stacklevel=2)
            config = dataclasses.replace(config, feedback=False)
        qmap, pieces = quantize_config(trials, config, seed=how.seed, init=trials.init,
                                       weigh=True)
        m = trials.measure(qmap, pieces, proxy=True)
        assert m.proxy is not None
        worst, worst_name = worst_of(m.distortion)
        quality = QualityRecord(
            metric=PROXY_MAGNITUDE, value=finite(m.proxy), baseline=0.0, gate="none",
            quantized_tensors=len(trials.sketches), max_distortion=finite(worst),
            worst_tensor=worst_name, sharded=True,
            nulls=frozenset({"value", "bound", "max_distortion", "worst_tensor"}))
        return _quantized(qmap), config.to_dict(), quality.to_json()
    # The space's magnitude points only: no rank has a gradient to rank by sensitivity.
    space = dataclasses.replace(how.space or SearchSpace.default(), prune_metric=(MAGNITUDE,))
    res = search_trials(trials, space=space, epsilon=how.epsilon, seed=how.seed,
                        init=trials.init, tensor_cap=how.tensor_cap)
    trials.check()
    record = res.quality.updated(sharded=True)
    if record.mode == "exhaustive":
        record = record.updated(mode="exhaustive-sharded")
    if res.config is None:
        if record.mode != NOTHING_TO_QUANTIZE:
            record = record.updated(stored="lossless: no feasible configuration")
        return {}, None, record.to_json()
    return _quantized(res.qmap), res.config.to_dict(), record.to_json()


def _quantized(qmap: Mapping[str, QuantizedTensor | None]) -> dict[str, QuantizedTensor]:
    return {n: q for n, q in qmap.items() if q is not None}
