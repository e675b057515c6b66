"""Quantize one tensor: `quantize()` and its result, `QuantizedTensor`.

Pipeline (Inshrinkerator §4): sketch the values (Alg. 1) -> prune / protect thresholds
from importance-sketch quantiles -> approximate k-means on the sketch of the remaining
values (Alg. 2-3) -> nearest-centroid levels.  Everything runs in float32 on the
tensor's device except the k-means itself, which works on a few thousand histogram
buckets on the CPU.

Level convention (relied on by the delta codec): with k = bins centroids, level i in
[0, k) means centroids[i], level k means pruned (exactly 0) and level k+1 means
protected (the next value of `protected`, in flattened C order).

NaN/Inf policy: a tensor (or gradient) with NaN or +-Inf is never binned; `quantize()`
raises `NonFiniteTensorError` naming it.  The repository then keeps that tensor
lossless or refuses the commit (`quantize_state(..., nonfinite="lossless")` does the
former).  float64 values beyond float32 range count as non-finite.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from mvc.dtypes import bits_view
from mvc.errors import InternalError
from mvc.quant._kernels import AssignStats, Partition, assign_into, dequant, gather_level
from mvc.quant.assign import assign, level_dtype, level_means, midpoints, native_ok
from mvc.quant.config import check_bins
from mvc.quant.device_chunks import upload
from mvc.quant.errors import QuantConfigError, QuantizedPartsError
from mvc.quant.importance import check_metric, sensitivity
from mvc.quant.kmeans import approx_kmeans
from mvc.quant.partition import Thresholds, check_fraction, masks, thresholds
from mvc.quant.sketch import LogSketch, check_alpha
from mvc.quant.uniform import DEFAULT_FAMILY, check_family, grid_size, uniform_plan

_INT_DTYPES = (torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64)


#: Levels per step of a torch-path lookup (`QuantizedTensor.lookup`): 64 MiB of int32 indices.
LOOKUP_CHUNK = 1 << 24


@dataclass(frozen=True, eq=False)
class QuantizedTensor:
    """A quantized tensor: integer levels plus the tables that give them values.

    levels:    integer tensor with the input's shape (uint8 / int16 / int32).
    centroids: float32, ascending, length `bins`.
    protected: 1-D, the original dtype: exact values of level-(bins+1) parameters.
    dtype:     the original dtype, restored by `dequantize()`.
    measured_only: a search's levels-free stand-in (`mvc.quant.error.measured_stand_in`):
               its levels and protected values are placeholders, so decoding it is a bug.
    """

    levels: torch.Tensor
    centroids: torch.Tensor
    protected: torch.Tensor
    dtype: torch.dtype
    bins: int
    measured_only: bool = False

    @property
    def n_levels(self) -> int:
        """bins + 2 (the pruned and protected levels)."""
        return self.bins + 2

    @property
    def shape(self) -> torch.Size:
        return self.levels.shape

    @property
    def pruned_level(self) -> int:
        return self.bins

    @property
    def protected_level(self) -> int:
        return self.bins + 1

    def to(self, device: torch.device | str) -> QuantizedTensor:
        """This quantization with its levels, centroids and protected values on `device`: the
        same object when every part is there already (no copy, so caches keyed by it still
        serve)."""
        device = torch.device(device)
        parts = (self.levels, self.centroids, self.protected)
        if all(t.device == device for t in parts):
            return self
        return QuantizedTensor(self.levels.to(device), self.centroids.to(device),
                               self.protected.to(device), self.dtype, self.bins,
                               self.measured_only)

    def uploaded(self, device: torch.device | str) -> QuantizedTensor:
        """`to(device)` with one wait, not three: to a CUDA device the small host parts
        (centroids, protected values) go from pinned memory asynchronously on the current
        stream (`device_chunks.upload`), where a plain copy from pageable memory waits for
        the stream.  The levels take the plain copy: pinned, every tensor's would stay in
        torch's pinned-memory cache after a checkout (a quarter of a float32 state)."""
        device = torch.device(device)
        parts = (self.levels, self.centroids, self.protected)
        if all(t.device == device for t in parts):
            return self
        centroids, protected = (upload(t, device) if t.device.type == "cpu" else t.to(device)
                                for t in parts[1:])
        return QuantizedTensor(self.levels.to(device), centroids, protected, self.dtype,
                               self.bins, self.measured_only)

    def dequantize(self) -> torch.Tensor:
        """The reconstructed tensor (original dtype, shape and device), bit-identical
        across calls: centroids.to(dtype)[levels], 0 for pruned, stored values for
        protected."""
        return self.lookup(self.centroids.to(device=self.levels.device).to(self.dtype))

    def lookup(self, values: torch.Tensor) -> torch.Tensor:
        """Levels mapped through `values` (one per bin, in the original dtype): pruned
        levels give 0 and protected levels their stored values.  `dequantize()` is
        `lookup(centroids)`; a transformed domain (log-quantized optimizer state)
        passes its inverse-transformed centroids."""
        if self.measured_only:
            raise InternalError("a search's measured-only stand-in was decoded")
        dev = self.levels.device
        table = torch.zeros(self.n_levels, dtype=self.dtype, device=dev)
        # a host table goes to a GPU from pinned memory, without the wait a pageable copy makes
        vals = upload(values, dev) if values.device.type == "cpu" else values.to(dev)
        table[:self.bins] = vals.to(self.dtype)
        flat = self.levels.reshape(-1)
        if native_ok(flat, flat.dtype) and table.element_size() in (2, 4, 8):
            out = dequant(flat.contiguous(), table, self.protected)
            if out is None:
                raise QuantizedPartsError(
                    "inconsistent quantized parts: level out of range or protected count mismatch")
            return out.reshape(self.levels.shape)
        # over the values' bits: exact, and every dtype has integer kernels (a float8 tensor
        # an earlier mvc quantized has no masked_scatter of its own)
        bits = bits_view(table)
        out = torch.empty(flat.numel(), dtype=bits.dtype, device=dev)
        # int32 indices a chunk at a time: a whole tensor's would be 4 bytes a value on the
        # device beside its levels and values (twice a bfloat16 tensor's own size)
        for s in range(0, flat.numel(), LOOKUP_CHUNK):
            part = flat[s:s + LOOKUP_CHUNK]
            idx = part if part.dtype in (torch.int32, torch.int64) else part.to(torch.int32)
            torch.index_select(bits, 0, idx, out=out[s:s + LOOKUP_CHUNK])
        if self.protected.numel():
            out.masked_scatter_(flat == self.protected_level, bits_view(self.protected.to(dev)))
        return out.view(self.dtype).reshape(self.levels.shape)

    @classmethod
    def from_parts(cls, levels: torch.Tensor, centroids: torch.Tensor, protected: torch.Tensor,
                   dtype: torch.dtype, bins: int) -> QuantizedTensor:
        """Rebuild from stored parts, checking they are consistent.

        Raises `QuantizedPartsError` (a DataError) when they are not: wrong dtypes,
        unsorted or wrong number of centroids, levels out of range, or a protected count
        that does not match the protected levels.
        """
        def bad(msg: str) -> QuantizedPartsError:
            return QuantizedPartsError(f"inconsistent quantized parts: {msg}")

        if isinstance(bins, bool) or not isinstance(bins, int) or bins < 1:
            raise bad(f"bins={bins!r}")
        if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
            raise bad(f"dtype {dtype!r} is not a floating-point dtype")
        if levels.dtype not in _INT_DTYPES:
            raise bad(f"levels have dtype {levels.dtype}")
        if centroids.dtype != torch.float32 or centroids.dim() != 1 or centroids.numel() != bins:
            raise bad(f"centroids must be float32 of length {bins}, got {centroids.dtype} "
                      f"{tuple(centroids.shape)}")
        if bins > 1 and bool((centroids[1:] < centroids[:-1]).any()):
            raise bad("centroids are not sorted ascending")
        if not bool(torch.isfinite(centroids).all()):
            raise bad("centroids are not finite")
        if protected.dim() != 1 or protected.dtype != dtype:
            raise bad(f"protected must be 1-D {dtype}, "
                      f"got {protected.dtype} {tuple(protected.shape)}")
        if levels.numel():
            lo, hi = int(levels.min()), int(levels.max())
            if lo < 0 or hi > bins + 1:
                raise bad(f"levels span [{lo}, {hi}], outside [0, {bins + 1}]")
        n_prot = int((levels == bins + 1).sum())
        if n_prot != protected.numel():
            raise bad(f"{n_prot} protected levels but {protected.numel()} protected values")
        lv = levels.to(level_dtype(bins)) if levels.dtype != level_dtype(bins) else levels
        return cls(lv, centroids.to(lv.device), protected.to(lv.device), dtype, bins)


def seeded_generator(seed: int) -> torch.Generator:
    """A CPU generator seeded with `seed` (any int, taken modulo 2^64): what seeds a tensor's
    k-means++ in every quantizer path."""
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise QuantConfigError(f"seed must be an int, got {seed!r}")
    return torch.Generator(device="cpu").manual_seed(seed & 0xFFFF_FFFF_FFFF_FFFF)


def _flat32(tensor: torch.Tensor) -> torch.Tensor:
    if not isinstance(tensor, torch.Tensor) or not tensor.is_floating_point():
        raise QuantConfigError("quantize() takes a floating-point torch.Tensor")
    return tensor.detach().reshape(-1).to(torch.float32).contiguous()


def _exact_means(x: torch.Tensor, levels: torch.Tensor, centroids: np.ndarray) -> np.ndarray:
    """Per-level means of the raw values (levels < k); empty levels keep their centroid."""
    sums_t, cnt_t = level_means(x, levels, centroids.size)
    sums, cnt = sums_t.numpy(), cnt_t.numpy().astype(np.float64)
    return np.where(cnt > 0, sums / np.maximum(cnt, 1.0), centroids)


def _partition(thr: Thresholds, sens: torch.Tensor | None) -> Partition | None:
    """The thresholds in the native kernels' terms; None when nothing is pruned/protected."""
    inf = float("inf")
    part = Partition(
        prune_t=thr.prune if thr.prune is not None else -1.0,
        protect_mag_t=thr.protect_magnitude if thr.protect_magnitude is not None else inf,
        protect_sens_t=thr.protect_sensitivity if thr.protect_sensitivity is not None else inf,
        prune_on_sens=thr.prune is not None and thr.prune_metric == "sensitivity",
        sens=sens.contiguous() if sens is not None else None,
    )
    return part if part.active else None


def magnitude_keep(sketch: LogSketch, thr: Thresholds) -> LogSketch | None:
    """The kept values' sketch as a slice of the full one, when no sensitivity is involved."""
    if thr.needs_sensitivity:
        return None
    return sketch.restrict_magnitude(thr.prune, thr.protect_magnitude)


def host_plan(sketch: LogSketch, thr: Thresholds, k: int, family: str,
              init: np.ndarray | None
              ) -> tuple[Thresholds, int, np.ndarray | None, np.ndarray | None]:
    """The host's part of quantizing a tensor to `k` bins before its levels, on every path:
    (the thresholds, with the uniform family's dead zone; the number of centroids; the uniform
    family's grid, or None for k-means; the warm start `init` (flat float64) where it has the
    family's size, else None)."""
    init_k = grid_size(k) if family == "uniform" else k
    init = init if init is not None and init.size == init_k else None
    if family == "uniform":
        grid, thr = uniform_plan(sketch, thr, k, init)
        return thr, grid.size, grid, init
    return thr, k, None, init


def level_values(values: torch.Tensor, device: torch.device) -> torch.Tensor:
    """A float32 table of level values for the error sums (`mvc.quant.error`): `values`, one
    per bin, then 0 for the pruned level and 0 for the protected one (its exact values are
    never looked up)."""
    table = torch.zeros(values.numel() + 2, dtype=torch.float32, device=device)
    table[:values.numel()] = values.to(device=device, dtype=torch.float32)
    return table


def _levels_native(x: torch.Tensor, flat: torch.Tensor, sketch: LogSketch,
                   sens: torch.Tensor | None, thr: Thresholds, k: int,
                   generator: torch.Generator, sigma: float,
                   init: np.ndarray | None = None, stats: AssignStats | None = None,
                   centres: np.ndarray | None = None
                   ) -> tuple[torch.Tensor, np.ndarray, LogSketch | None, torch.Tensor]:
    # CPU: the partition is applied inside the histogram and assignment kernels.
    # `centres` given (the uniform family's grid): no k-means, so no sketch of the kept values.
    part = _partition(thr, sens)
    keep: LogSketch | None = None
    if centres is None:
        keep = sketch
        if part is not None:
            restricted = magnitude_keep(sketch, thr)
            keep = (restricted if restricted is not None
                    else LogSketch.from_tensor(x, sketch.alpha, part=part))
        centres = approx_kmeans(keep, k, sigma=sigma, generator=generator, init=init)
    levels = torch.empty(x.numel(), dtype=level_dtype(k))
    mids = midpoints(torch.from_numpy(centres).to(torch.float32))
    if stats is not None:
        # each level's value as the QuantizedTensor will restore it (centroids rounded to
        # float32, then to the tensor's dtype)
        cen = torch.from_numpy(np.asarray(centres, dtype=np.float64)).to(torch.float32)
        stats.table = level_values(cen.to(flat.dtype).to(torch.float32), x.device)
    n_prot = assign_into(x, mids, levels, part, k, stats)
    src = flat.contiguous()
    protected = gather_level(levels, k + 1, src, n_prot) if n_prot else flat.new_empty(0)
    return levels, centres, keep, protected


def _levels_torch(x: torch.Tensor, flat: torch.Tensor, sketch: LogSketch,
                  sens: torch.Tensor | None, thr: Thresholds, k: int,
                  generator: torch.Generator, sigma: float,
                  init: np.ndarray | None = None, stats: AssignStats | None = None,
                  centres: np.ndarray | None = None
                  ) -> tuple[torch.Tensor, np.ndarray, LogSketch | None, torch.Tensor]:
    # `stats` is a native-pass extra: left unfilled here (the caller measures afterwards)
    prune_mask, protect_mask = masks(x, sens, thr)
    keep: LogSketch | None = None
    if centres is None:
        keep = magnitude_keep(sketch, thr)
        if keep is None:
            dropped = prune_mask if protect_mask is None else (
                protect_mask if prune_mask is None else prune_mask | protect_mask)
            keep = sketch.subtract(LogSketch.from_tensor(x[dropped], sketch.alpha))
        centres = approx_kmeans(keep, k, sigma=sigma, generator=generator, init=init)
    levels = assign(x, torch.from_numpy(centres).to(torch.float32), backend="torch")
    if prune_mask is not None:
        levels.masked_fill_(prune_mask, k)
    protected = flat.new_empty(0)
    if protect_mask is not None:
        levels.masked_fill_(protect_mask, k + 1)
        protected = flat[protect_mask]
    return levels, centres, keep, protected


def quantize_prepared(tensor: torch.Tensor, x: torch.Tensor, sketch: LogSketch,
                      sens: torch.Tensor | None, thr: Thresholds, bins: int, *,
                      seed: int = 0, sigma: float = 0.2,
                      init: torch.Tensor | None = None,
                      stats: AssignStats | None = None,
                      family: str = DEFAULT_FAMILY) -> QuantizedTensor:
    """Quantize with thresholds already chosen (e.g. per layer type over many tensors).

    `x` is `tensor` flattened to contiguous float32, `sketch` its LogSketch, `sens` its
    sensitivity scores (required when the thresholds use sensitivity, else may be None).
    `init`: warm-start centroids (used when there are exactly `bins` of them; for the uniform
    family, the parent's grid, whose step is kept while still good).
    `family`: "kmeans" (the default) or "uniform" (`mvc.quant.uniform`: a grid of
    `grid_size(bins)` centroids, a dead zone that prunes; the result's `bins` is the grid size).
    `stats` (`AssignStats`, with optional float32 weights `w`): where the native assignment
    runs, it also fills in the result's error sums against `x` (`mvc.quant.error`) and its
    level counts, in the same pass; `sums` / `counts` stay None where it does not.
    """
    k = check_bins(bins)
    check_family(family)
    if thr.needs_sensitivity and sens is None:
        raise QuantConfigError("these thresholds need sensitivity scores (a gradient)")
    if not thr.needs_sensitivity:
        sens = None  # no rule reads it: spare the kernels the extra stream
    x = x.reshape(-1).to(torch.float32).contiguous()
    if x.numel() != tensor.numel() or (sens is not None and sens.numel() != x.numel()):
        raise QuantConfigError("quantize_prepared(): x / sens do not match the tensor")
    gen = seeded_generator(seed)
    flat = tensor.detach().reshape(-1)
    init_np = (init.detach().reshape(-1).to("cpu", torch.float64).numpy()
               if init is not None else None)
    thr, k, grid_np, init_np = host_plan(sketch, thr, k, family, init_np)
    run = _levels_native if native_ok(x, level_dtype(k)) else _levels_torch
    levels, centres, keep, protected = run(x, flat, sketch, sens, thr, k, gen, sigma, init_np,
                                           stats, grid_np)
    vals = keep.buckets()[0] if keep is not None else np.zeros(0)
    if 0 < vals.size <= k:
        # Degenerate input (no more distinct buckets than centroids): bucket centres are
        # only alpha-close, the exact per-level means reproduce such tensors exactly.
        centres = np.maximum.accumulate(_exact_means(x, levels, centres))
        if stats is not None:
            stats.sums = None  # measured against the centres replaced here
    cen = torch.from_numpy(np.asarray(centres, dtype=np.float64)).to(torch.float32)
    return QuantizedTensor(levels.reshape(tensor.shape), cen.to(levels.device), protected,
                           tensor.dtype, k)


def quantize(tensor: torch.Tensor, bins: int, *, prune: float = 0.0,
             prune_metric: str = "magnitude", protect: float = 0.0,
             grad: torch.Tensor | None = None, seed: int = 0, alpha: float = 0.01,
             sigma: float = 0.2, name: str | None = None,
             init: torch.Tensor | None = None, family: str = DEFAULT_FAMILY) -> QuantizedTensor:
    """Quantize `tensor` to `bins` non-uniform levels, pruning and protecting fractions.

    prune:        fraction of least important parameters set to exactly 0.
    prune_metric: "magnitude" (|w|) or "sensitivity" (|g w|, needs `grad`).
    protect:      fraction of most important parameters kept exactly, by magnitude
                  and, when `grad` is given, also by sensitivity.
    grad:         gradient (e.g. its EMA) with the tensor's shape, or None.
    seed:         seeds the k-means++ initialization; same input + seed -> same result.
    alpha, sigma: sketch relative error and the frequency share of the k-means weights.
    name:         used in error messages.
    init:         warm-start centroids (e.g. the previous checkpoint's, same `bins`) instead
                  of k-means++: keeps levels stable between checkpoints, so deltas stay small.
    family:       "kmeans" (default) or "uniform": a symmetric grid of `bins` non-zero levels
                  with one step for the tensor and a dead zone at 0 (`mvc.quant.uniform`).

    Raises `NonFiniteTensorError` for NaN/Inf in `tensor` or `grad` and
    `QuantConfigError` for invalid arguments.
    """
    check_bins(bins)
    check_family(family)
    check_fraction(prune, "prune")
    check_fraction(protect, "protect")
    check_metric(prune_metric)
    check_alpha(alpha)
    if not 0.0 <= float(sigma) <= 1.0:
        raise QuantConfigError(f"sigma must be in [0, 1], got {sigma!r}")
    if prune > 0 and prune_metric == "sensitivity" and grad is None:
        raise QuantConfigError("prune_metric='sensitivity' needs a gradient")
    x = _flat32(tensor)
    sketch = LogSketch.from_tensor(x, alpha, name=name)
    sens = sens_sketch = None
    if grad is not None and (protect > 0 or (prune > 0 and prune_metric == "sensitivity")):
        sens = sensitivity(tensor, grad, name=name)
        sens_sketch = LogSketch.from_tensor(sens, alpha, name=name)
    thr = thresholds(sketch.abs(), sens_sketch, prune=prune, prune_metric=prune_metric,
                     protect=protect)
    return quantize_prepared(tensor, x, sketch, sens, thr, bins, seed=seed, sigma=sigma,
                             init=init, family=family)
