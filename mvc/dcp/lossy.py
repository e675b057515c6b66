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
* **the search** (``commit.mode = search``): the guided exhaustive search over the config
  cube (`mvc.search.guided`, Inshrinkerator Alg. 4) with the proxy gate.  A trial's
  proxy, sqrt(sum |w| (q - w)^2 / sum |w| w^2), and each tensor's relative L2 error (the
  tensor cap) are sums over parameters: each rank sums over its shards, one all-reduce
  adds them, and every rank sees the same verdict.  The search is deterministic given the
  verdicts, so every rank walks the same trials in the same order and picks the same
  config.  A user quality function cannot run here (no rank holds the model), so the
  gate is always the proxy; the search starts afresh each save (no neighbourhood search).
* **fixed** (``commit.mode = fixed`` or `quant=`): the one config, with the sketches above.

Without a process group (one process) the collectives are the identity.  Gradients are
not known to a StorageWriter: pruning and protection use magnitude only.
"""
from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from mvc.errors import MvcError
from mvc.quant import LogSketch, QuantConfig, QuantizedTensor, QuantPolicy, quantize_prepared
from mvc.quant.errors import NonFiniteTensorError
from mvc.layer_types import layer_type
from mvc.quant.partition import thresholds
from mvc.repo.commitopts import quantization
from mvc.repo.repository import Repo
from mvc.search import default_policy
from mvc.search.gate import DEFAULT_TENSOR_CAP
from mvc.search.guided import MonotoneOracle, guided_search
from mvc.search.quality import PROXY_EPSILON, PROXY_MAGNITUDE
from mvc.search.space import SearchSpace, short

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

    @property
    def lossy(self) -> bool:
        return self.mode != "lossless"

    @classmethod
    def of(cls, repo: Repo, lossless: bool, options: Mapping[str, Any]) -> How:
        """From the writer's options and the repository's ``commit.*`` configuration, with
        `Repo.commit`'s precedence: lossless, then `quant=`, then `space=`, then the mode."""
        # DCP keys optimizer state by parameter name (``optim/state/fc1.weight/exp_avg``),
        # which the default policy's ``state/<index>`` pattern does not catch.
        policy = options.get("policy") or QuantPolicy(
            exclude=tuple(default_policy().exclude) + ("*/state/*", "state/*"))
        # Repo.commit's rules (precedence, a fixed mode's config, the proxy opt-in), without a
        # quality function: a storage writer has no model to evaluate.
        how = quantization(repo.config, lossless, options.get("quant"), policy, None,
                           options.get("epsilon"), options.get("space"))
        if how.mode == "lossless":
            return cls("lossless", policy=policy)
        if how.mode == "fixed":
            assert how.config is not None
            return cls("fixed", config=how.config.to_dict(), policy=policy)
        cap = options.get("tensor_cap")
        if cap is None:
            cap = how.tensor_cap
        return cls("search", space=how.space or SearchSpace(),
                   epsilon=float(PROXY_EPSILON if how.epsilon is None else how.epsilon),
                   tensor_cap=float(DEFAULT_TENSOR_CAP if cap is None else cap), policy=policy)


class PeerFailedError(MvcError):
    """Another rank failed in a step of a sharded save that every rank takes together (its
    own error is raised there); this rank stops with it instead of waiting for it."""

    exit_code = 165


# ------------------------------------------------------------------ collectives
def _group_size() -> int:
    return dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1


def all_gather(obj: Any) -> list[Any]:
    """`obj` of every rank, in rank order ([obj] without a process group)."""
    if _group_size() == 1:
        return [obj]
    out: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(out, obj)
    return out


def all_sum(values: list[float]) -> list[float]:
    """Element-wise sums over the ranks (float64)."""
    if _group_size() == 1 or not values:
        return list(values)
    t = torch.tensor(values, dtype=torch.float64)
    dist.all_reduce(t)
    return t.tolist()


# ------------------------------------------------------------------ shared preparation
class Prepared:
    """The agreed sketches: per tensor (merged over its shards) and per layer type."""

    def __init__(self, tensors: Mapping[str, torch.Tensor], shards: Mapping[str, dict],
                 how: How, init: Mapping[str, torch.Tensor]) -> None:
        alpha = (how.space or SearchSpace()).alpha
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
        self.mag = {lt: LogSketch(alpha).merge(*(self.sketches[g].abs() for g in names))
                    for lt, names in self.groups.items()}
        total = sum(math.prod(self.shapes[g]) for g in self.sketches)
        emb = sum(math.prod(self.shapes[g]) for g in self.groups.get("embedding", []))
        self.embeddings = "embedding" in self.groups
        self.embedding_share = emb / total if total else 0.0
        self.local = [n for n in tensors if self.of[n] in self.sketches]

    def quantize(self, config: QuantConfig, seed: int) -> dict[str, QuantizedTensor]:
        """This rank's tensors and shards quantized by `config` (same centroids everywhere)."""
        out: dict[str, QuantizedTensor] = {}
        thr = {}
        for lt, mag in self.mag.items():
            lq = config.for_layer_type(lt)
            thr[lt] = (thresholds(mag, None, prune=lq.prune, prune_metric=MAGNITUDE,
                                  protect=lq.protect), lq.bins)
        for name in self.local:
            g = self.of[name]
            t = self.tensors[name]
            tt, bins = thr[layer_type(g, self.shapes[g])]
            x = t.detach().reshape(-1).to(torch.float32).contiguous()
            out[name] = quantize_prepared(t, x, self.sketches[g], None, tt, bins, seed=seed,
                                          sigma=config.sigma, init=self.init.get(g))
        return out

    def trial(self, config: QuantConfig, seed: int
              ) -> tuple[dict[str, QuantizedTensor], float, float, str | None]:
        """This rank's quantization by `config`, with (the proxy over every rank's shards, the
        largest per-tensor relative L2 error, its tensor): sums over this rank's shards, added
        up over the ranks.  Every rank must call it, with the same config."""
        order = sorted(self.sketches)
        pos = {g: i for i, g in enumerate(order)}
        sums = [0.0] * (3 + 2 * len(order))   # the last one counts ranks that failed
        error: BaseException | None = None
        qmap: dict[str, QuantizedTensor] = {}
        try:
            qmap = self.quantize(config, seed)
            self._sums(qmap, pos, sums)
        except Exception as exc:   # the others are in the all-reduce: tell them, then raise
            error = exc
            sums = [0.0] * len(sums)
            sums[-1] = 1.0
        tot = all_sum(sums)
        _raise_if_failed(error, ["a rank"] if tot[-1] > 0 else [])
        proxy = _ratio(tot[0], tot[1])
        worst, worst_name = 0.0, None
        for g, i in pos.items():
            d = _ratio(tot[2 + 2 * i], tot[3 + 2 * i])
            if worst_name is None or d > worst:
                worst, worst_name = d, g
        return qmap, proxy, worst, worst_name

    def _sums(self, qmap: Mapping[str, QuantizedTensor], pos: Mapping[str, int],
              sums: list[float]) -> None:
        for name, q in qmap.items():
            w = self.tensors[name].detach().reshape(-1).to(torch.float64)
            err = q.dequantize().reshape(-1).to(torch.float64) - w
            e2, w2 = err.square(), w.square()
            sums[0] += float((w.abs() * e2).sum())
            sums[1] += float((w.abs() * w2).sum())
            i = 2 + 2 * pos[self.of[name]]
            sums[i] += float(e2.sum())
            sums[i + 1] += float(w2.sum())


def _raise_if_failed(error: BaseException | None, peers: list[Any]) -> None:
    """Raise this rank's own error, or `PeerFailedError` when another rank reported one."""
    if error is not None:
        raise error
    failed = [p for p in peers if p]
    if failed:
        raise PeerFailedError(f"another rank failed in the sharded save: {failed[0]}")


def _ratio(num: float, den: float) -> float:
    if den <= 0.0 or not math.isfinite(den):
        return 0.0 if num == 0.0 else math.inf
    return math.sqrt(num / den)


# ------------------------------------------------------------------ the decision
def choose(tensors: Mapping[str, torch.Tensor], shards: Mapping[str, dict], how: How,
           init: Mapping[str, torch.Tensor]
           ) -> tuple[dict[str, QuantizedTensor], dict | None, dict | None]:
    """(this rank's quantized tensors by record name, the config as a dict, the quality
    record); every rank of the group must call it, with its own tensors.  Nothing to quantize
    or nothing feasible: ({}, None, a record saying so) -- stored losslessly."""
    prep = Prepared(tensors, shards, how, init)
    if how.mode == "fixed":
        assert how.config is not None
        config = QuantConfig.from_dict(how.config)
        qmap, proxy, worst, worst_name = prep.trial(config, how.seed)
        quality = {"metric": PROXY_MAGNITUDE, "value": _finite(proxy), "baseline": 0.0,
                   "bound": None, "gate": "none", "quantized_tensors": len(prep.sketches),
                   "max_distortion": _finite(worst), "worst_tensor": worst_name,
                   "sharded": True}
        return qmap, config.to_dict(), quality
    return _search(prep, how)


def _finite(x: float) -> float | None:
    return x if math.isfinite(x) else None


def _search(prep: Prepared, how: How
            ) -> tuple[dict[str, QuantizedTensor], dict | None, dict | None]:
    space = how.space or SearchSpace()
    emb, share = prep.embeddings, prep.embedding_share
    log: list[dict[str, Any]] = []
    trials: dict[tuple[int, ...], tuple[bool, float, float, str | None]] = {}
    record: dict[str, Any] = {
        "metric": PROXY_MAGNITUDE, "baseline": 0.0, "epsilon": how.epsilon, "evaluations": 0,
        "mode": "exhaustive-sharded", "gate": "proxy", "bound": how.epsilon,
        "tensor_cap": _finite(how.tensor_cap), "sharded": True, "trials": log}
    if not prep.sketches:
        record.update(value=None, degradation=None, mode="nothing-to-quantize")
        return {}, None, record

    def probe(idx: tuple[int, ...]) -> bool:
        config = space.config((MAGNITUDE, idx), emb)
        _, proxy, worst, worst_name = prep.trial(config, how.seed)
        ok = proxy <= how.epsilon and worst <= how.tensor_cap
        trials[idx] = (ok, proxy, worst, worst_name)
        log.append({"config": short(config), "value": _finite(proxy),
                    "degradation": _finite(proxy), "feasible": ok,
                    "distortion": _finite(round(worst, 6))})
        return ok

    oracle = MonotoneOracle(probe)
    winner = None
    while True:
        idx = guided_search(space.shape(emb), lambda i: space.cost(i, emb, share), oracle)
        if idx is None:
            break
        if oracle.probe(idx):   # inferred by monotonicity: probed before it is accepted
            winner = idx
            break
    if winner is None:
        record.update(value=None, degradation=None, stored="lossless: no feasible configuration")
        return {}, None, record
    config = space.config((MAGNITUDE, winner), emb)
    _, proxy, worst, worst_name = trials[winner]
    record.update(value=_finite(proxy), degradation=_finite(proxy),
                  max_distortion=_finite(round(worst, 6)), worst_tensor=worst_name)
    return prep.quantize(config, how.seed), config.to_dict(), record
