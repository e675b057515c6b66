"""Optimizer moments in a sharded lossy save: ``commit.optimizer = compressed``, as one process.

A lossy `Repo.commit` compresses Adam's moments after choosing the weights' config
(`mvc.search.plan.compress_optimizer`, ExCP; `mvc.quant.optimizer`): first moments
(``exp_avg``, ``momentum_buffer``) in the linear domain -- jointly pruned where their weight
is pruned, 85% of the rest pruned by magnitude, 2 levels -- and second moments
(``exp_avg_sq``, ``max_exp_avg_sq``) in the log domain, 4 levels; each within its cap in the
quantity Adam uses (a first moment over it stored as zeros, a second moment over it exactly);
a compressed ``exp_avg`` records the exact state's largest |m| / sqrt(v), which restore
clamps to.  Here the same decisions over shards, agreed over the process group:

* **which tensors**: optimizer state named ``.../state/<param>/<key>``, ``<param>`` a DCP
  parameter FQN (``optim/state/0.weight/exp_avg``) or an index (``optimizer.state_dict()``);
  a moment's weight (joint pruning) is the tensor named ``.../<param>`` (by index: the
  order-and-shape alignment `infer_param_map` makes, over the global shapes).  Sizes, NaN /
  Inf and negative second moments are judged on the whole tensor: any rank's shard decides.
* **one quantization per tensor**: each rank sketches the values its shards feed k-means
  (m's kept entries; log v of v > 0); the sketches are all-gathered and merged in rank order,
  thresholds and k-means read the merged sketch with the same seed and warm start (the
  parent's centroids, as one rank found them), so every shard gets the centroids the whole
  tensor would (tested equal to a one-process commit of the same state).
* **guard rails**: a moment's error sums (`moment_error_sums`) are added over the ranks;
  the bound's max |m| / sqrt(v) is the max over the ranks; every rank decides alike.

Limits: a tensor whose kept values fall into no more sketch buckets than levels (where one
process replaces the centroids by the exact per-level means) is stored exactly here; a first
moment whose second moment is laid out differently on some rank gets no restore bound.
"""
from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import torch

from mvc.dtypes import QUANTIZABLE
from mvc.quant import LogSketch, QuantizedTensor, quantize_prepared
from mvc.quant._kernels import log_positive   # the exact log values one process quantizes
from mvc.quant.assign import level_dtype
from mvc.quant.backend import on_host_kernels
from mvc.quant.error import relative_error
from mvc.quant.moment_bound import bound_meta, moment_ratio_bound
from mvc.quant.optimizer import (
    LOG_SIGMA,
    MOMENT_KEYS,
    _log32,
    infer_param_map,
    moment_error_sums,
    parse_moment_name,
    weights_by_name,
    zeroed_moment,
)
from mvc.quant.partition import thresholds
from mvc.repo.shards import shard_name
from mvc.search.measure import DEFAULT_MOMENT_CAP
from mvc.search.plan import FIRST_MOMENT_CAP

from mvc.dcp.lossy import _raise_if_failed, agreed_sums, all_gather

#: `mvc.quant.optimizer.quantize_optimizer_state`'s defaults, which a one-process commit uses.
BINS = {"linear": 2, "log": 4}
ALPHA = {"linear": 0.01, "log": 0.002}
SIGMA = {"linear": 0.2, "log": LOG_SIGMA}
PRUNE_MOMENT = 0.85
MIN_NUMEL = 128
#: (state prefix, parameter FQN or index, key) of an optimizer moment's name, else None: the
#: one-process commit's own parse.
moment_of = parse_moment_name


@dataclass
class Moments:
    """What `compress` decided, this rank's part: quantized shards, their domains and first-
    moment bounds by record name, and the quality record's moment fields (every rank's)."""

    quantized: dict[str, QuantizedTensor] = field(default_factory=dict)
    domains: dict[str, str] = field(default_factory=dict)
    bounds: dict[str, dict] = field(default_factory=dict)
    report: dict[str, Any] = field(default_factory=dict)


@dataclass
class _Local:
    """One tensor's contribution from this rank (all-gathered)."""

    shape: list[int]
    floating: bool
    sketch: LogSketch | None = None     # of the values k-means sees; None: none here
    bad: bool = False                   # NaN / Inf in a shard
    negative: bool = False              # a negative second-moment entry
    init: torch.Tensor | None = None
    ratio: float | None = None          # max |m| / sqrt(v) of this rank's shards
    paired: bool = True                 # every shard here has its _sq partner, same shape


def compress(tensors: Mapping[str, torch.Tensor], shards: Mapping[str, dict],
             weights: Mapping[str, QuantizedTensor],
             glob: Mapping[str, tuple[list[int], torch.dtype]],
             init: Mapping[str, torch.Tensor], moment_cap: float | None = None) -> Moments:
    """Compress this rank's optimizer-moment shards as a one-process commit of the whole state
    would (see the module docstring); every rank of the group must call it.

    tensors / shards: this rank's records (name -> values, name -> ``meta.shard``);
    weights: this rank's quantized weights by record name (joint pruning); glob: every
    tensor of the state, in its order, with its global shape and dtype (the alignment of
    index-keyed state, and the sizes decided on); init: the parent's
    centroids by record name; moment_cap: ``quality.moment_cap`` (None: the default)."""
    of = {n: shards[n]["of"] if n in shards else n for n in tensors}
    error: BaseException | None = None
    local: dict[str, _Local] = {}
    jobs: dict[str, tuple[str, Any]] = {}     # record -> (domain, its weight's levels or None)
    try:
        jobs = _jobs(tensors, shards, weights, of, glob)
        local = _contributions(tensors, shards, of, jobs, init)
    except Exception as exc:   # every rank must reach the gather, and learn of it
        error = exc
    gathered = all_gather((None, local) if error is None else (repr(error), {}))
    _raise_if_failed(error, [e for e, _ in gathered])
    merged = _merge([rank for _, rank in gathered])
    out = Moments()
    quantized: dict[str, QuantizedTensor] = {}
    try:
        for n, (domain, _) in jobs.items():
            g = of[n]
            if g in merged.quantize:
                quantized[n] = _quantize(tensors[n], domain, jobs[n][1], merged, g)
    except Exception as exc:
        error = exc
    names = sorted(merged.quantize)
    d = _distortions(tensors, of, quantized, jobs, names, error)
    cap_v = DEFAULT_MOMENT_CAP if moment_cap is None else moment_cap
    caps = {"linear": FIRST_MOMENT_CAP, "log": cap_v}
    zeroed = [g for g in names if merged.domain[g] == "linear" and not d[g] <= caps["linear"]]
    if zeroed:   # as zeros: every entry at the pruned level, measured again
        for n in list(quantized):
            if of[n] in zeroed:
                quantized[n] = zeroed_moment(tensors[n], BINS["linear"])
        d.update(_distortions(tensors, of, quantized, jobs, zeroed, None))
    worst: dict[str, float] = {}
    exact = []
    for g in names:
        dom = merged.domain[g]
        worst[dom] = max(worst.get(dom, 0.0), d[g])
        if not d[g] <= caps[dom]:
            exact.append(g)
    for n, q in quantized.items():
        g = of[n]
        if g in exact:
            continue
        out.quantized[n] = q
        out.domains[n] = jobs[n][0]
        if merged.domain[g] == "linear" and g.endswith("exp_avg") and g in merged.bounds:
            out.bounds[n] = bound_meta(n + "_sq", merged.bounds[g])
    if worst:
        out.report = {"moment_cap": {"linear": FIRST_MOMENT_CAP, "log": cap_v},
                      "moment_distortion": {k: (round(v, 6) if v < math.inf else None)
                                            for k, v in worst.items()}}
        if exact:
            out.report["moments_exact"] = sorted(exact)
        if zeroed:
            out.report["moments_zeroed"] = sorted(set(zeroed) - set(exact))
    return out


def _jobs(tensors: Mapping[str, torch.Tensor], shards: Mapping[str, dict],
          weights: Mapping[str, QuantizedTensor], of: Mapping[str, str],
          glob: Mapping[str, tuple[list[int], torch.dtype]]) -> dict[str, tuple[str, Any]]:
    """record -> (domain, its weight's quantized shard for joint pruning, or None)."""
    mapping: dict[tuple[str, int], str] = {}
    if any(isinstance(p[1], int) for g in glob if (p := moment_of(g)) is not None):
        # index-keyed state: the alignment one process infers, over the global shapes
        mapping = infer_param_map({g: torch.empty(shape, dtype=dtype, device="meta")
                                   for g, (shape, dtype) in glob.items()})
    by_fqn = weights_by_name(glob)
    jobs: dict[str, tuple[str, Any]] = {}
    for n, t in tensors.items():
        parsed = moment_of(of[n])
        if parsed is None:
            continue
        prefix, param, key = parsed
        domain = MOMENT_KEYS[key]
        wq = None
        if domain == "linear":
            if isinstance(param, int):
                wname = mapping.get((prefix, param))
            else:
                wname = by_fqn.get(param)
            if wname is not None:
                rec = wname if n not in shards else shard_name(
                    wname, shards[n]["offsets"], list(t.shape))
                q = weights.get(rec)
                if q is not None and tuple(q.shape) == tuple(t.shape):
                    wq = q
        jobs[n] = (domain, wq)
    return jobs


def _values(t: torch.Tensor, domain: str, wq: QuantizedTensor | None
            ) -> tuple[torch.Tensor, torch.Tensor]:
    """(the values k-means sees, the mask of the entries they are) of one shard, as
    `quantize_optimizer_state` takes them: m's nonzero entries whose weight is not pruned,
    float32 log v of v > 0."""
    flat = t.detach().reshape(-1)
    if domain == "log":
        keep = flat > 0
        if on_host_kernels(flat) and flat.dtype == torch.float32:
            return log_positive(flat.contiguous()), keep
        return _log32(flat[keep]), keep
    keep = flat != 0
    if wq is not None:
        keep &= wq.levels.reshape(-1).to(keep.device) != wq.pruned_level
    return flat[keep].to(torch.float32).contiguous(), keep


def _contributions(tensors: Mapping[str, torch.Tensor], shards: Mapping[str, dict],
                   of: Mapping[str, str], jobs: Mapping[str, tuple[str, Any]],
                   init: Mapping[str, torch.Tensor]) -> dict[str, _Local]:
    local: dict[str, _Local] = {}
    for n, (domain, wq) in jobs.items():
        t = tensors[n]
        g = of[n]
        shape = shards[n]["shape"] if n in shards else list(t.shape)
        mine = local.setdefault(g, _Local(shape, t.dtype in QUANTIZABLE))
        if not mine.floating or math.prod(shape) < MIN_NUMEL:
            continue
        flat = t.detach().reshape(-1)
        mine.bad |= bool((~torch.isfinite(flat)).any())
        if domain == "log":
            mine.negative |= bool((flat < 0).any())
        c = init.get(n)
        if c is not None and mine.init is None:
            mine.init = c.detach().cpu()
        if domain == "linear" and g.endswith("exp_avg"):
            v = tensors.get(n + "_sq")
            if v is None or v.shape != t.shape:
                mine.paired = False
            elif not mine.bad:
                r = moment_ratio_bound(t, v)
                mine.ratio = r if mine.ratio is None else max(mine.ratio, r)
        if mine.bad or mine.negative:
            continue
        x, _ = _values(t, domain, wq)
        if x.numel():
            sk = LogSketch.from_tensor(x, ALPHA[domain], name=g)
            mine.sketch = sk if mine.sketch is None else mine.sketch.merge(sk)
    return local


@dataclass
class _Merged:
    domain: dict[str, str] = field(default_factory=dict)
    sketch: dict[str, LogSketch | None] = field(default_factory=dict)
    init: dict[str, torch.Tensor] = field(default_factory=dict)
    bounds: dict[str, float] = field(default_factory=dict)
    quantize: set[str] = field(default_factory=set)


def _merge(ranks: list[dict[str, _Local]]) -> _Merged:
    """Every rank's contributions, in rank order: which tensors are compressed, their merged
    sketches, warm starts and bounds (the same on every rank)."""
    out = _Merged()
    info: dict[str, list[_Local]] = {}
    for rank in ranks:
        for g, c in rank.items():
            info.setdefault(g, []).append(c)
    for g, parts in sorted(info.items()):
        parsed = moment_of(g)
        assert parsed is not None
        domain = MOMENT_KEYS[parsed[2]]
        first = parts[0]
        if not first.floating or math.prod(first.shape) < MIN_NUMEL \
                or any(p.bad or p.negative for p in parts):
            continue     # stored exactly, as one process leaves it out
        sketches = [p.sketch for p in parts if p.sketch is not None]
        sk = sketches[0].merge(*sketches[1:]) if sketches else None
        out.domain[g] = domain
        out.sketch[g] = sk
        init = next((p.init for p in parts if p.init is not None), None)
        if init is not None:
            out.init[g] = init
        ratios = [p.ratio for p in parts if p.ratio is not None]
        if domain == "linear" and all(p.paired for p in parts) and ratios:
            out.bounds[g] = max(ratios)
        if sk is not None and _degenerate(sk, domain):
            continue     # one process would take exact per-level means: kept exact here
        out.quantize.add(g)
    return out


def _thresholds(sk: LogSketch, domain: str) -> Any:
    return thresholds(sk.abs(), None, prune=PRUNE_MOMENT if domain == "linear" else 0.0,
                      prune_metric="magnitude", protect=0.0)


def _degenerate(sk: LogSketch, domain: str) -> bool:
    """Whether k-means would see no more distinct buckets than levels (then `quantize`
    replaces its centroids by per-level means over the values, which no rank holds)."""
    thr = _thresholds(sk, domain)
    keep = sk.restrict_magnitude(thr.prune, thr.protect_magnitude)
    return 0 < keep.buckets()[0].size <= BINS[domain]


def _quantize(t: torch.Tensor, domain: str, wq: QuantizedTensor | None, merged: _Merged,
              g: str) -> QuantizedTensor:
    """One shard with the tensor's merged sketch: the levels and centroids its entries get in
    the whole tensor's quantization."""
    bins = BINS[domain]
    sk = merged.sketch[g]
    if sk is None:      # nothing to quantize on any rank: every entry at the pruned level
        return zeroed_moment(t, bins)
    x, keep = _values(t, domain, wq)
    # A shard with no values here still needs the agreed centroids: they come from the
    # merged sketch alone, so a stand-in value serves (its level is not used).
    probe = x if x.numel() else torch.zeros(1)
    qs = quantize_prepared(probe, probe, sk, None, _thresholds(sk, domain), bins, seed=0,
                           sigma=SIGMA[domain], init=merged.init.get(g))
    levels = torch.full((t.numel(),), bins, dtype=level_dtype(bins), device=t.device)
    if x.numel():
        levels.masked_scatter_(keep, qs.levels.reshape(-1).to(levels.dtype))
    return QuantizedTensor(levels.reshape(t.shape), qs.centroids, t.new_empty(0), t.dtype, bins)


def _distortions(tensors: Mapping[str, torch.Tensor], of: Mapping[str, str],
                 quantized: Mapping[str, QuantizedTensor], jobs: Mapping[str, tuple[str, Any]],
                 names: list[str], error: BaseException | None) -> dict[str, float]:
    """Each of `names`' error in the quantity Adam uses, its sums added over the ranks (a
    rank's failure, counted in the last slot, stops every rank)."""
    pos = {g: i for i, g in enumerate(names)}

    def fill(sums: list[float]) -> None:
        for n, q in quantized.items():
            i = pos.get(of[n])
            if i is None:
                continue
            a, b = moment_error_sums(q, jobs[n][0], tensors[n])
            sums[2 * i] += a
            sums[2 * i + 1] += b

    tot, _ = agreed_sums(2 * len(names), fill, error)
    return {g: relative_error((tot[2 * i], tot[2 * i + 1])) for g, i in pos.items()}
