"""Optimizer-state compression (ExCP §3: joint weight-momentum pruning + non-uniform
quantization), for Adam/AdamW and SGD with momentum.

Which tensors.  Flattened optimizer state is named ``<prefix>state/<i>/<key>``
(e.g. ``optimizer/state/3/exp_avg``, with i the parameter's position in the
optimizer's parameter list: ``optimizer.state_dict()``), or ``<prefix>state/<fqn>/<key>``
(e.g. ``optim/state/layers.0.weight/exp_avg``: keyed by the parameter's name, as
``torch.distributed.checkpoint.state_dict.get_optimizer_state_dict`` and DCP save it).
By key:

    exp_avg, momentum_buffer   first moment / momentum  -> "linear" domain
    exp_avg_sq, max_exp_avg_sq second moment            -> "log" domain

Everything else (``step`` counters, hyperparameters in param_groups, other keys)
is never touched here and stays exact.  Tensors smaller than `min_numel`, non-float
ones and ones holding NaN/Inf are left out (stored exactly).

Linear domain (first moment).  Weighted k-means on the values, as for weights.
Joint pruning (ExCP eq. 6): where the parameter's weight is pruned in this
commit's quantization, its momentum is pruned too (set to exactly 0); exact zeros
are pruned as well so they restore exactly.  `prune_moment` additionally prunes that
fraction of the remaining smallest-magnitude entries (ExCP prunes momentum by its own
magnitude too).  m is a fast EMA (beta1 = 0.9: after 20 steps 12% of it is left), so
what a restore needs is its large entries' sign and rough size, not precision: the
defaults (85% of the rest pruned, 2 levels) store m in < 1 bit per entry and cost
about 0.1% held-out loss per restore on the benchmark's char-LM (training continued
40 steps from restored vs exact moments; 16 levels unpruned is no better, 90% pruned
costs ~0.25%).  Its levels are not stable between commits (m is mostly new), so m is
stored as a base, not a delta, in practice.

Log domain (second moment).  v spans many decades, so linear k-means would give
all small entries one centroid near 0 and the Adam step m / sqrt(v) would explode
for them.  Instead log(v) is quantized for v > 0 and restored as exp(centroid),
which bounds the *relative* error of every entry; v == 0 uses the pruned level and
restores exactly 0.  The second moment is deliberately NOT jointly pruned: a zero
v under a non-zero m makes the first step after restore m / eps, whereas a pruned
m with an intact v only drops that entry's momentum.  Negative entries (impossible
for Adam) leave the tensor exact.  Few levels suffice (default 4: Adam only needs
v's scale per entry; factored second moments as in Adafactor are far coarser), and
v is a slow EMA (beta2 = 0.999), so with k-means warm-started from the parent
commit's centroids (`init`, log values) its levels barely move between commits and
v is stored as a small delta.  The log-domain k-means counts every entry once
(`LOG_SIGMA`): Adam divides each entry's own step by its sqrt(v), so the error that
matters is the per-entry one.  The weights' weighting (mostly by |value|) means
nothing for a log value and favoured the *smallest* v: on bench_e2e's CNN it put the
4 levels over the tails of fc1's 25-nat spread of log v and left 38% of its entries
with steps over 2x too large after a restore (20% with every entry counted once; mean
|log| step error 0.91 -> 0.62).  It costs bytes (v about +50% on the char-LM) and a rare
tail entry may restore further off than before; end to end, bench_e2e's char-LM went
from +1.07% to +0.86% (mean of 3 seeds, docs/results.md).

Result.  `OptQuantized(q, domain)`: q is a `QuantizedTensor` whose levels and
centroids describe the *transformed* values (log(v) in the log domain), with the
original dtype and shape, so the repository stores it with the existing quantized
codecs and records ``meta["domain"]``; its protected values are the original
values, exact in both domains.  `restore(q, domain)` rebuilds the tensor
(deterministically, bit for bit across calls and devices: the exp is applied to the
small centroid table in float64 on the CPU).  `q.dequantize()` is only meaningful
in the linear domain.

Parameter mapping.  Joint pruning needs to know which weight a state entry
belongs to.  Pass `param_map` ({state index or state-name prefix: weight tensor
name}, e.g. from the Tracker, which reads it off the live optimizer) or let
`infer_param_map` guess: it assumes the optimizer holds the model's parameters in
`model.parameters()` order (the usual `Adam(model.parameters())`) and aligns state
indices with the model's float tensors in order, skipping tensors whose shape does
not match (buffers such as BatchNorm running stats) and names that are buffers
by convention.  When some state index is missing (parameters without state yet)
the alignment is ambiguous and nothing is inferred: the moments are then still
compressed, only without joint pruning.
"""
from __future__ import annotations

import re
from typing import Any, Iterable, Literal, Mapping, NamedTuple

import torch

from mvc.dtypes import QUANTIZABLE, float32_faithful
from mvc.errors import UsageError
from mvc.native.parallel import pmap_sized
from mvc.quant._kernels import (
    compact_moment,
    expand_moment,
    expand_positive,
    gather_level,
    log_positive,
    qerr_sums,
    scan_f32,
)
from mvc.quant.assign import level_dtype, native_ok
from mvc.quant.batched import GroupJob, batchable
from mvc.quant.batched_moments import quantize_moments, scan_many
from mvc.quant.backend import on_host_kernels
from mvc.quant.config import check_bins
from mvc.quant.error import (SumsCache, cached_error_sums, chunk_for, seed_error_stats,
                             table_error_sums)
from mvc.quant.errors import QuantError
from mvc.quant.logdomain import exp_levels, log32
from mvc.quant.moment_bound import float64_sqrt
from mvc.quant.partition import Thresholds, check_fraction
from mvc.quant.sketch import LogSketch
from mvc.quant.tensor import QuantizedTensor, level_values, quantize

Domain = Literal["linear", "log"]
DOMAINS = ("linear", "log")
#: Flattened optimizer state: ``.../state/<param index>/...``, and the moments and step
#: counters of state keyed by parameter name (``.../state/<fqn>/exp_avg``): what the weight
#: search leaves out.
OPTIMIZER_STATE_PATTERNS = ("*state/[0-9]*", "*state/*/exp_avg", "*state/*/exp_avg_sq",
                            "*state/*/max_exp_avg_sq", "*state/*/momentum_buffer",
                            "*state/*/step")
#: Repository policy for optimizer state: kept exact or compressed by this module.
OPTIMIZER_POLICIES = ("exact", "compressed")
MOMENT_KEYS: dict[str, Domain] = {"exp_avg": "linear", "momentum_buffer": "linear",
                                  "exp_avg_sq": "log", "max_exp_avg_sq": "log"}
_STATE_RE = re.compile(r"^(?P<prefix>(?:.*/)?)state/(?P<index>\d+)/(?P<key>[^/]+)$")
_FQN_STATE_RE = re.compile(r"^(?P<prefix>(?:.*/)?)state/(?P<param>[^/]+)/(?P<key>[^/]+)$")
_BUFFER_RE = re.compile(r"(?:^|[./])(?:running_mean|running_var|num_batches_tracked)$")


class OptimizerStateError(QuantError, UsageError):
    """Invalid arguments for optimizer-state compression (unknown domain, bad mapping)."""

    exit_code = 83


class OptQuantized(NamedTuple):
    """A compressed optimizer tensor: levels over the transformed values, and the domain."""

    q: QuantizedTensor
    domain: Domain


def parse_state_name(name: str) -> tuple[str, int, str] | None:
    """(prefix, parameter index, key) of a flattened optimizer-state name, else None."""
    m = _STATE_RE.match(name)
    return (m["prefix"], int(m["index"]), m["key"]) if m else None


def parse_moment_name(name: str) -> tuple[str, int | str, str] | None:
    """(state prefix, parameter index or name, key) of a flattened optimizer moment (a key of
    `MOMENT_KEYS`), keyed by index or by parameter name; else None."""
    parsed: tuple[str, int | str, str] | None = parse_state_name(name)
    if parsed is None:
        m = _FQN_STATE_RE.match(name)
        parsed = (m["prefix"], m["param"], m["key"]) if m else None
    return parsed if parsed is not None and parsed[2] in MOMENT_KEYS else None


def is_state_name(name: str) -> bool:
    """Whether a flattened name is optimizer state: any key of index-keyed state, the moments
    and step counter of state keyed by parameter name."""
    if parse_state_name(name) is not None or parse_moment_name(name) is not None:
        return True
    m = _FQN_STATE_RE.match(name)
    return m is not None and m["key"] == "step"


def weights_by_name(names: Iterable[str]) -> dict[str, str]:
    """{parameter name: flattened tensor name} for the non-state tensors among `names` whose
    last path segment (``model/layers.0.weight`` -> ``layers.0.weight``) no other one shares:
    how a moment keyed by parameter name finds its weight."""
    seen: dict[str, list[str]] = {}
    for n in names:
        if not is_state_name(n):
            seen.setdefault(n.rsplit("/", 1)[-1], []).append(n)
    return {fqn: found[0] for fqn, found in seen.items() if len(found) == 1}


def moment_domain(name: str) -> Domain | None:
    """The domain a flattened state name is compressed in, or None if it stays exact."""
    parsed = parse_moment_name(name)
    return MOMENT_KEYS.get(parsed[2]) if parsed else None


def check_policy(value: str) -> str:
    """Validate the repository setting ``optimizer = exact | compressed``."""
    if value not in OPTIMIZER_POLICIES:
        raise OptimizerStateError(f"optimizer policy must be one of {OPTIMIZER_POLICIES}, got {value!r}")
    return value


def infer_param_map(tensors: Mapping[str, torch.Tensor]) -> dict[tuple[str, int], str]:
    """{(state prefix, index): weight name} by aligning state indices with the model's
    tensors in order (see the module docstring); {} where the alignment is ambiguous."""
    states: dict[str, dict[int, tuple[int, ...]]] = {}
    for name, t in tensors.items():
        parsed = parse_state_name(name)
        if parsed and parsed[2] in MOMENT_KEYS:
            states.setdefault(parsed[0], {})[parsed[1]] = tuple(t.shape)
    params = [(n, tuple(t.shape)) for n, t in tensors.items()
              if parse_state_name(n) is None and t.is_floating_point() and not _BUFFER_RE.search(n)]
    out: dict[tuple[str, int], str] = {}
    for prefix, shapes in states.items():
        if sorted(shapes) != list(range(len(shapes))):
            continue  # a parameter without state: positions cannot be aligned by shape
        j = 0
        for i in range(len(shapes)):
            while j < len(params) and params[j][1] != shapes[i]:
                j += 1
            if j == len(params):
                break
            out[(prefix, i)] = params[j][0]
            j += 1
    return out


def _normalize_map(param_map: Mapping) -> dict[tuple[str, int], str]:
    out: dict[tuple[str, int], str] = {}
    for k, v in param_map.items():
        if not isinstance(v, str):
            raise OptimizerStateError(f"param_map values must be tensor names, got {v!r}")
        if isinstance(k, int) and not isinstance(k, bool):
            out[("*", k)] = v
        elif isinstance(k, tuple) and len(k) == 2:
            out[(str(k[0]), int(k[1]))] = v
        else:
            raise OptimizerStateError(
                f"param_map keys must be an int index or (prefix, index), got {k!r}")
    return out


def zeroed_moment(m: torch.Tensor, bins: int, device: torch.device | None = None
                  ) -> QuantizedTensor:
    """`m` stored as zeros: every entry at the pruned level (`quantize_moment` with all of m
    pruned), without a pass over m; on `device` (default m's)."""
    return _empty_quantized(m.shape, m.dtype, m.device if device is None else device, bins)


def _empty_quantized(shape: torch.Size, dtype: torch.dtype, device: torch.device, bins: int
                     ) -> QuantizedTensor:
    levels = torch.full(tuple(shape), bins, dtype=level_dtype(bins), device=device)
    return QuantizedTensor(levels, torch.zeros(bins, dtype=torch.float32, device=device),
                           torch.empty(0, dtype=dtype, device=device), dtype, bins)


def _scatter(values: torch.Tensor, keep: torch.Tensor, shape: torch.Size, dtype: torch.dtype,
             bins: int, protected: torch.Tensor, centroids: torch.Tensor, sub_levels: torch.Tensor
             ) -> QuantizedTensor:
    levels = torch.full((values.numel(),), bins, dtype=level_dtype(bins), device=values.device)
    # masked_scatter_ is one pass; indexing with a bool mask first builds the index list.
    levels.masked_scatter_(keep, sub_levels.reshape(-1).to(levels.dtype))
    return QuantizedTensor(levels.reshape(shape), centroids, protected, dtype, bins)


def _scan(t: torch.Tensor) -> tuple[int, int]:
    """(non-finite, < 0) entry counts of `t` (-inf is both; NaN only the first), one
    native pass for CPU float32."""
    flat = t.detach().reshape(-1)
    if on_host_kernels(flat) and flat.dtype == torch.float32:
        bad, neg, _, _ = scan_f32(flat.contiguous())
        return bad, neg
    return int((~torch.isfinite(flat)).sum()), int((flat < 0).sum())


def _log32(x: torch.Tensor) -> torch.Tensor:
    """`log32` chunk by chunk: no float64 copy of the whole tensor."""
    out = torch.empty(x.numel(), dtype=torch.float32, device=x.device)
    step = chunk_for(x)  # fewer launches on a GPU
    for s in range(0, x.numel(), step):
        out[s:s + step] = log32(x[s:s + step])
    return out


def quantize_moment(m: torch.Tensor, bins: int, *, pruned: torch.Tensor | None = None,
                    prune: float = 0.0, protect: float = 0.0, seed: int = 0,
                    alpha: float = 0.01, sigma: float = 0.2,
                    init: torch.Tensor | None = None) -> QuantizedTensor:
    """Linear-domain quantization; `pruned` (bool, m's shape) is forced to the pruned level.

    init: warm-start centroids (the parent commit's, same `bins`), else k-means++.
    """
    flat = m.detach().reshape(-1)
    drop = flat == 0
    if pruned is not None:
        drop |= pruned.reshape(-1).to(drop.device)
    keep = ~drop
    sub = flat[keep]
    if sub.numel() == 0:
        return _empty_quantized(m.shape, m.dtype, m.device, bins)
    qs = quantize(sub, bins, prune=prune, protect=protect, seed=seed, alpha=alpha, sigma=sigma,
                  init=init)
    return _scatter(flat, keep, m.shape, m.dtype, bins, qs.protected, qs.centroids, qs.levels)


def _native_moment(m: torch.Tensor, wq: QuantizedTensor | None, bins: int) -> bool:
    ok = (on_host_kernels(m) and m.dtype == torch.float32
          and level_dtype(bins) in (torch.uint8, torch.int16))
    return ok and (wq is None or (on_host_kernels(wq.levels)
                                  and wq.levels.dtype in (torch.uint8, torch.int16)))


def _quantize_moment_native(m: torch.Tensor, wq: QuantizedTensor | None, bins: int, *,
                            prune: float, protect: float, seed: int, alpha: float, sigma: float,
                            init: torch.Tensor | None) -> QuantizedTensor:
    """`quantize_moment(m, bins, pruned=wq's pruned levels, ...)` with the kept entries
    compacted and their levels spread back natively (one pass each, no masks)."""
    flat = m.detach().reshape(-1).contiguous()
    wlev = wq.levels.reshape(-1).contiguous() if wq is not None else None
    wpruned = wq.pruned_level if wq is not None else -1
    sub, spans = compact_moment(flat, wlev, wpruned)
    if sub.numel() == 0:
        return _empty_quantized(m.shape, m.dtype, m.device, bins)
    qs = quantize(sub, bins, prune=prune, protect=protect, seed=seed, alpha=alpha, sigma=sigma,
                  init=init)
    levels = expand_moment(flat, wlev, wpruned, spans, qs.levels.reshape(-1), bins)
    return QuantizedTensor(levels.reshape(m.shape), qs.centroids, qs.protected, m.dtype, bins)


#: k-means weight share of bucket frequency for log(v) (`mvc.quant.kmeans.bucket_weights`):
#: 1.0, every entry counts once.  The weights' default (0.2: mostly |value|) would weight a
#: log value by its magnitude, i.e. favour the *smallest* v, and spread the few levels over
#: the tails where few entries are: see the module docstring.
LOG_SIGMA = 1.0


def quantize_second_moment(v: torch.Tensor, bins: int, *, protect: float = 0.0, seed: int = 0,
                           alpha: float = 0.002, sigma: float = LOG_SIGMA,
                           init: torch.Tensor | None = None) -> QuantizedTensor | None:
    """Log-domain quantization of a non-negative tensor; None if it has negative entries."""
    flat = v.detach().reshape(-1)
    if _scan(flat)[1]:
        return None
    return _quantize_log(v, bins, protect=protect, seed=seed, alpha=alpha, sigma=sigma, init=init)


def _quantize_log(v: torch.Tensor, bins: int, *, protect: float, seed: int, alpha: float,
                  sigma: float, init: torch.Tensor | None) -> QuantizedTensor:
    # `quantize_second_moment` once v is known to be non-negative.
    flat = v.detach().reshape(-1)
    if on_host_kernels(flat) and flat.dtype == torch.float32 \
            and level_dtype(bins) in (torch.uint8, torch.int16):
        # Native: log(v) of the positive entries in one pass, their levels spread back in
        # another; no mask, no masked copies, no float64 copy.
        flat = flat.contiguous()
        logs = log_positive(flat)
        if logs.numel() == 0:
            return _empty_quantized(v.shape, v.dtype, v.device, bins)
        qs = quantize(logs, bins, protect=protect, seed=seed, alpha=alpha, sigma=sigma,
                      init=init)
        levels = expand_positive(flat, qs.levels.reshape(-1), bins)
        protected = flat.new_empty(0)
        if qs.protected.numel():
            protected = gather_level(levels, bins + 1, flat, qs.protected.numel())
        return QuantizedTensor(levels.reshape(v.shape), qs.centroids, protected, v.dtype, bins)
    keep = flat > 0
    sub = flat[keep]
    if sub.numel() == 0:
        return _empty_quantized(v.shape, v.dtype, v.device, bins)
    logs = _log32(sub)
    qs = quantize(logs, bins, protect=protect, seed=seed, alpha=alpha, sigma=sigma, init=init)
    protected = sub[qs.levels == bins + 1] if qs.protected.numel() else sub.new_empty(0)
    return _scatter(flat, keep, v.shape, v.dtype, bins, protected, qs.centroids, qs.levels)


def _log_values(q: QuantizedTensor) -> torch.Tensor:
    # exp in float64, then one rounding to the stored dtype: the same values on every device.
    return exp_levels(q.centroids, q.dtype)


def restore(q: QuantizedTensor, domain: str) -> torch.Tensor:
    """The tensor an `OptQuantized` stands for (original dtype, shape and device)."""
    if domain == "linear":
        return q.dequantize()
    if domain != "log":
        raise OptimizerStateError(f"unknown optimizer-state domain {domain!r}; known: {DOMAINS}")
    return q.lookup(_log_values(q))


def restore_values(q: QuantizedTensor, domain: str) -> torch.Tensor:
    """The value of each bin that `restore` looks `q`'s levels up in, as a host tensor of q's
    dtype: the centroids rounded to it (linear), exp in float64 rounded once (log).  For a
    lookup on a device, made before q's parts go there: a log table made from device
    centroids would bring them back to the host first (a wait)."""
    if domain == "linear":
        return q.centroids.detach().cpu().to(q.dtype)
    if domain != "log":
        raise OptimizerStateError(f"unknown optimizer-state domain {domain!r}; known: {DOMAINS}")
    return _log_values(q)


def moment_error_sums(q: QuantizedTensor, domain: str, x: torch.Tensor) -> tuple[float, float]:
    """(sum d^2, sum r^2) of a compressed moment in the quantity Adam uses from it, r the
    exact one: linear (m) d = m' - m, r = m; log (v) d = sqrt(v') - sqrt(v), r = sqrt(v).

    float32 values (v' rounded to its dtype, as `restore` gives it), float64 sums, from the
    levels and a table of level values in one pass: no restored copy of the moment.
    """
    if domain == "linear":
        # the batched pass that made q left its sums there (`_batched_moments`)
        s = cached_error_sums(q, x)
        return s[0], s[1]
    hit = _SQRT_SUMS.peek(q, x)
    if hit is not None:
        return hit[0], hit[1]
    if domain != "log":
        raise OptimizerStateError(f"unknown optimizer-state domain {domain!r}; known: {DOMAINS}")
    lv = q.levels.reshape(-1)
    xf = x.detach().reshape(-1).to(device=lv.device)
    if xf.numel() != lv.numel():
        raise ValueError("moment_error_sums: x does not match the levels' element count")
    # sqrt of each level's restored value; pruned (v = 0) restore as 0, protected exactly
    table = level_values(float64_sqrt(_log_values(q).to(torch.float32)), lv.device)
    num = den = 0.0
    native = native_ok(xf, lv.dtype) and xf.dtype == torch.float32
    if native:
        xf, lv = xf.contiguous(), lv.contiguous()
    for a in range(0, lv.numel(), _SQRT_CHUNK):
        if native:
            # sqrt(v) taken as it is read, correctly rounded: no temporary, one pass
            r = qerr_sums(xf[a:a + _SQRT_CHUNK], lv[a:a + _SQRT_CHUNK], table, sqrt_x=True)
            e0, e1 = float(r[0]), float(r[1])
        else:
            # one temporary per chunk (a pool thread each: 16 of them on a 16-CPU host); the
            # correctly rounded sqrt, as the kernel's and a GPU's sqrtf (torch's host float32
            # sqrt is not correctly rounded)
            xs = float64_sqrt(xf[a:a + _SQRT_CHUNK])
            e0, e1 = table_error_sums(lv[a:a + _SQRT_CHUNK], xs, table)[:2]
        num, den = num + e0, den + e1
    return num, den


#: A second moment's error sums in sqrt(v), as the batched pass measured them (a linear moment's
#: are the ordinary ones: `cached_error_sums`).
_SQRT_SUMS = SumsCache()

#: Elements per chunk of sqrt(v) in `moment_error_sums` (a 16 MiB float32 temporary).
_SQRT_CHUNK = 1 << 22


def quantize_optimizer_state(tensors: Mapping[str, torch.Tensor],
                             weight_qmap: Mapping[str, QuantizedTensor | None] | None = None, *,
                             bins_moment: int = 2, bins_second: int = 4,
                             param_map: Mapping | None = None, prune_moment: float = 0.85,
                             protect: float = 0.0, min_numel: int = 128, seed: int = 0,
                             alpha: float = 0.01, log_alpha: float = 0.002, sigma: float = 0.2,
                             log_sigma: float = LOG_SIGMA,
                             init: Mapping[str, torch.Tensor] | None = None,
                             ) -> dict[str, OptQuantized]:
    """Compress the optimizer moments among `tensors` (flat names); others are left out.

    weight_qmap: this commit's weight quantization by name (joint pruning reads its
                 pruned levels); None or a missing / shape-mismatched weight disables
                 joint pruning for that moment.
    param_map:   {index or (state prefix, index): weight name}; None infers it
                 (`infer_param_map`).
    prune_moment: extra fraction of first-moment entries pruned by magnitude.
    protect:     fraction of entries kept exact (by magnitude of the transformed value).
    log_alpha:   sketch accuracy for log values (finer than for weights: |log v| ~ 10-30).
    sigma, log_sigma: k-means frequency share for first moments / for log(v).
    init:        warm-start centroids by state name (the parent commit's, in the
                 tensor's domain: log values for second moments), used where the bin
                 count matches; keeps levels, and so deltas, stable between commits.
    Returns {name: OptQuantized} for every compressed tensor.
    """
    check_bins(bins_moment)
    check_bins(bins_second)
    check_fraction(prune_moment, "prune_moment")
    check_fraction(protect, "protect")
    weight_qmap = weight_qmap or {}
    init = init or {}
    mapping = _normalize_map(param_map) if param_map is not None else infer_param_map(tensors)
    by_name = weights_by_name(tensors)
    jobs: list[tuple[str, torch.Tensor, str, QuantizedTensor | None]] = []
    for name, t in tensors.items():
        parsed = parse_moment_name(name)
        if parsed is None:
            continue
        domain = MOMENT_KEYS[parsed[2]]
        if t.dtype not in QUANTIZABLE or t.numel() < min_numel or not float32_faithful(t):
            continue
        wq = None
        if domain == "linear":
            param = parsed[1]
            wname = (by_name.get(param) if isinstance(param, str)
                     else mapping.get((parsed[0], param), mapping.get(("*", param))))
            wq = weight_qmap.get(wname) if wname is not None else None
            if wq is not None and tuple(wq.shape) != tuple(t.shape):
                wq = None
        jobs.append((name, t, domain, wq))

    def one(job: tuple[str, torch.Tensor, str, QuantizedTensor | None]) -> OptQuantized | None:
        name, t, domain, wq = job
        bad, neg = _scan(t)
        if bad:
            return None  # NaN/Inf: kept exact
        if domain == "log":
            if neg:
                return None
            # one scan serves both checks (a pass over every value)
            return OptQuantized(_quantize_log(t, bins_second, protect=protect, seed=seed,
                                              alpha=log_alpha, sigma=log_sigma,
                                              init=init.get(name)), "log")
        if _native_moment(t, wq, bins_moment):
            q = _quantize_moment_native(t, wq, bins_moment, prune=prune_moment, protect=protect,
                                        seed=seed, alpha=alpha, sigma=sigma, init=init.get(name))
        else:
            pruned = wq.levels == wq.pruned_level if wq is not None else None
            q = quantize_moment(t, bins_moment, pruned=pruned, prune=prune_moment,
                                protect=protect, seed=seed, alpha=alpha, sigma=sigma,
                                init=init.get(name))
        return OptQuantized(q, "linear")

    # Moments on the torch path (CUDA) are compressed together, a few passes per domain
    # (`mvc.quant.batched_moments`); what that leaves, and host moments, one by one.
    batched = [j for j in jobs if batchable(j[1])]
    done, rest = _batched_moments(batched, bins_moment=bins_moment, bins_second=bins_second,
                                  prune_moment=prune_moment, protect=protect, seed=seed,
                                  alpha=alpha, log_alpha=log_alpha, sigma=sigma,
                                  log_sigma=log_sigma, init=init)
    jobs = [j for j in jobs if not batchable(j[1])] + rest
    # One moment per pool thread, biggest first: a moment's own passes parallelize poorly
    # (k-means, masks and small tensors between the native loops).  But the largest (an
    # embedding's, on a wide pool) go alone, their native passes split across the pool:
    # several at once would hold their temporaries (the kept values, log values, levels: ~9
    # bytes a value) together.  Each result depends on its tensor alone (seeded k-means, sums
    # in fixed blocks), not on the scheduling.
    got = pmap_sized(lambda i: one(jobs[i]), {i: j[1].numel() for i, j in enumerate(jobs)})
    done.update({jobs[i][0]: r for i, r in got.items() if r is not None})
    return {name: done[name] for name in tensors if name in done}


_Job = tuple[str, torch.Tensor, str, QuantizedTensor | None]


def _batched_moments(jobs: list[_Job], **settings: Any
                     ) -> tuple[dict[str, OptQuantized], list[_Job]]:
    """({name: compressed moment} of `jobs` done in batched passes, one set per device, the
    jobs left to the per-moment path: moments the batched pass leaves (`quantize_moments`)).
    `settings`: `_batched_on_one_device`'s."""
    by_device: dict[torch.device, list[_Job]] = {}
    for j in jobs:   # a state spread over several GPUs (device_map="auto", model parallel)
        by_device.setdefault(j[1].device, []).append(j)
    done: dict[str, OptQuantized] = {}
    rest: list[_Job] = []
    for group in by_device.values():
        got, left = _batched_on_one_device(group, **settings)
        done.update(got)
        rest.extend(left)
    return done, rest


def _batched_on_one_device(jobs: list[_Job], *, bins_moment: int, bins_second: int,
                           prune_moment: float, protect: float, seed: int, alpha: float,
                           log_alpha: float, sigma: float, log_sigma: float,
                           init: Mapping[str, torch.Tensor]
                           ) -> tuple[dict[str, OptQuantized], list[_Job]]:
    rest: list[_Job] = []
    scans = scan_many([j[1] for j in jobs])
    done: dict[str, OptQuantized] = {}
    runs: tuple[tuple[Domain, int, float, float, float], ...] = (
        ("linear", bins_moment, prune_moment, alpha, sigma),
        ("log", bins_second, 0.0, log_alpha, log_sigma))
    for domain, bins, prune, a, sig in runs:
        group = [j for j, (bad, neg) in zip(jobs, scans, strict=True)
                 if j[2] == domain and not bad and not (domain == "log" and neg)]
        work = [GroupJob(t, LogSketch(a), Thresholds(), init=init.get(name),
                         pruned_by=wq.levels if wq is not None else None,
                         pruned_level=wq.pruned_level if wq is not None else -1)
                for name, t, _, wq in group]
        # A moment's quantization is final (nothing searches it): its levels go to the host
        # (where the commit encodes them) as soon as its domain is done, not held on the device
        # through the rest of the hook (issue 27's GPU memory bound: all of a state's levels
        # are a quarter of its float32 bytes).
        got = quantize_moments(work, bins, domain=domain, prune=prune, protect=protect,
                               seed=seed, alpha=a, sigma=sig, to_host=True)
        for job, r in zip(group, got, strict=True):
            if r is None:
                rest.append(job)
                continue
            if domain == "linear":
                seed_error_stats(r.q, job[1], None, r.sums, r.counts)
            else:
                _SQRT_SUMS.put(r.q, job[1], None, r.sums)
            done[job[0]] = OptQuantized(r.q, domain)
    return done, rest
