"""Nearest-centroid assignment: sorted centroids -> midpoints -> bucketize.

level(x) = number of midpoints strictly below x, i.e. `torch.bucketize(x, mids,
right=False)`: a value exactly on a midpoint goes to the lower centroid.  On CPU the
native kernel (`native/assign.c`) computes the same thing several times faster than
`torch.bucketize` (4-14x single-threaded on 1M float32 values for k = 2..254, 9-20x with
two threads for k = 16; see benchmarks/bench_quant.py), so it is the CPU path whenever
levels are uint8 or int16; CUDA tensors and int32 levels use torch.  Both paths give
identical levels.

The native kernel can also apply the prune / protect partition in the same pass
(pruned -> level k, protected -> level k + 1).
"""
from __future__ import annotations

import torch

from mvc.quant._kernels import Partition, assign_into, level_sums
from mvc.quant.backend import on_host_kernels
from mvc.quant.errors import QuantConfigError

BACKENDS = ("auto", "native", "torch")


def level_dtype(bins: int) -> torch.dtype:
    """Smallest integer dtype holding levels 0..bins+1 (bins centroids, pruned, protected)."""
    if bins + 1 <= 255:
        return torch.uint8
    if bins + 1 <= 32767:
        return torch.int16
    return torch.int32


def midpoints(centroids: torch.Tensor) -> torch.Tensor:
    """float32 midpoints of sorted float32 centroids (computed in float64: no overflow)."""
    c = centroids.to(torch.float64)
    return ((c[:-1] + c[1:]) * 0.5).to(torch.float32)


def native_ok(x: torch.Tensor, dtype: torch.dtype) -> bool:
    """Whether the native kernels serve this device / level dtype."""
    return on_host_kernels(x) and dtype in (torch.uint8, torch.int16)


def assign(x: torch.Tensor, centroids: torch.Tensor, *, dtype: torch.dtype | None = None,
           backend: str = "auto", part: Partition | None = None) -> torch.Tensor:
    """Level of each element of the 1-D float32 tensor `x` against sorted `centroids`.

    Returns a tensor on x's device of `dtype` (default: `level_dtype(len(centroids))`).
    `backend` is "auto", "native" (CPU only, uint8/int16 levels) or "torch".  `part`
    (native path only) also writes the pruned / protected levels.
    """
    if backend not in BACKENDS:
        raise QuantConfigError(f"unknown assign backend {backend!r}")
    if not isinstance(x, torch.Tensor) or x.dtype != torch.float32 or x.dim() != 1:
        raise QuantConfigError("assign() takes a 1-D float32 tensor")
    k = centroids.numel()
    if k < 1:
        raise QuantConfigError("assign() needs at least one centroid")
    dtype = dtype or level_dtype(k)
    allowed = (torch.uint8, torch.int16, torch.int32, torch.int64)
    if dtype not in allowed or level_dtype(k).itemsize > dtype.itemsize:
        raise QuantConfigError(f"level dtype {dtype} cannot hold {k + 2} levels")
    mids = midpoints(centroids.detach().to(torch.float32).cpu())
    use_native = native_ok(x, dtype) and backend != "torch"
    if backend == "native" and not use_native:
        raise QuantConfigError(
            "the native assign backend needs a CPU tensor and uint8/int16 levels")
    if part is not None and not use_native:
        raise QuantConfigError("a partition can only be applied by the native backend")
    if use_native:
        out = torch.empty(x.numel(), dtype=dtype)
        assign_into(x.contiguous(), mids, out, part, k)
        return out
    lv = torch.bucketize(x, mids.to(x.device), right=False, out_int32=True)
    return lv.to(dtype)


def level_means(x: torch.Tensor, levels: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(sum, count) of the values of each level 0..k-1 as float64 / int64 CPU tensors.

    Levels >= k (pruned, protected) are ignored.  On CPU the summation order is fixed
    (blocks sized from n alone), so results are reproducible to the bit.
    """
    flat = levels.reshape(-1)
    if x.device.type != "cpu" or flat.device.type != "cpu":
        # Only a degenerate tensor's exact means come here (rare): on the host they are the
        # host path's bits, where a device's weighted bincount adds float64 atomically, in no
        # fixed order (and raises under torch.use_deterministic_algorithms on CUDA).
        x, flat = x.cpu(), flat.cpu()
    if native_ok(x, flat.dtype):
        return level_sums(x.contiguous(), flat.contiguous(), k)
    lv = flat.to(torch.int64)
    keep = lv < k
    lv, xv = lv[keep], x[keep].to(torch.float64)
    return (torch.bincount(lv, weights=xv, minlength=k).cpu(),
            torch.bincount(lv, minlength=k).cpu())
