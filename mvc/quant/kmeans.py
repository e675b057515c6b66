"""Approximate k-means over a log histogram (Inshrinkerator Alg. 2 and 3).

Instead of clustering every parameter, the parameters' DDSketch buckets are clustered:
each bucket is one point (its representative value) with sample weight

    w = sigma * freq / max(freq) + (1 - sigma) * |x| / max(|x|)

(Alg. 2 lines 2-3; "Normalize" is read as scaling each term to [0, 1] by its maximum).
The magnitude term keeps resolution for the rare large weights that a frequency-only
clustering would give away to the crowd near zero; it costs reconstruction MSE
(sigma = 1 is plain histogram k-means, within a few % of exact k-means' MSE).

Initialization is weighted k-means++ (Alg. 3) drawing from a `torch.Generator`; Lloyd
iterations then run to a fixed point.  In one dimension clusters are contiguous runs of
the sorted buckets, so each Lloyd step is a binary search of the k-1 midpoints plus
prefix-sum differences: O(k log m) per iteration for m buckets, independent of the
tensor size.  Both run in float64 on the CPU (a few thousand points at most), in C
(native/kmeans.c: a search runs them per tensor per trial, and numpy's per-call overhead
was most of a first commit's k-means time), which also makes centroids identical whatever
device the tensor lives on.  The C code does the arithmetic of the numpy implementation it
replaced (tests/helpers/reference_kmeans.py) in the same order, so centres are
bit-identical to it; the greedy seeding's potentials are summed in index order, where
numpy's dot left the order to the BLAS (which decided only between near-equal
candidates, and could differ between machines).
"""
from __future__ import annotations

from typing import Any

import numpy as np
import torch

from mvc.errors import InternalError
from mvc.quant.errors import QuantConfigError
from mvc.quant.sketch import LogSketch

MAX_LLOYD_ITERS = 300


def bucket_weights(values: np.ndarray, counts: np.ndarray, sigma: float) -> np.ndarray:
    """Alg. 2 sample weights: sigma * frequency/max + (1 - sigma) * |value|/max."""
    if not 0.0 <= sigma <= 1.0:
        raise QuantConfigError(f"sigma must be in [0, 1], got {sigma!r}")
    c = counts.astype(np.float64)
    w = sigma * (c / c.max()) if c.size and c.max() > 0 else np.zeros_like(c)
    mag = np.abs(values)
    if mag.size and mag.max() > 0:
        w = w + (1.0 - sigma) * (mag / mag.max())
    return w


def kmeanspp_init(values: np.ndarray, weights: np.ndarray, k: int,
                  generator: torch.Generator, trials: int | None = None) -> np.ndarray:
    """Weighted k-means++ seeding (Alg. 3); returns up to k distinct centres, unsorted.

    Each new centre is drawn with probability proportional to weight x squared distance
    to the nearest centre so far.  With `trials` > 1 this is greedy k-means++ (as in
    scikit-learn): that many candidates are drawn and the one leaving the smallest
    weighted potential is kept.  Default: 2 + ln(k) trials.  `values` ascending, weights
    > 0 (native/kmeans.c).
    """
    if trials is None:
        trials = 2 + int(np.log(k))
    draws = torch.rand(k, trials, generator=generator, dtype=torch.float64).numpy()
    values, weights = _f64(values), _f64(weights)
    if values.size == 0 or values.size != weights.size:
        raise QuantConfigError("kmeanspp_init() needs as many weights as values, at least one")
    out = np.empty(k, dtype=np.float64)
    borrow, lib = _native()
    with borrow(values, "double[]") as v, borrow(weights, "double[]") as w, \
            borrow(draws, "double[]") as d, borrow(out, "double[]", writable=True) as o:
        got = lib.mvc_kmeanspp(v, w, values.size, k, trials, d, draws.size, o, out.size)
    if got < 1:
        raise InternalError(f"mvc_kmeanspp failed ({got})")
    return out[:got]


def _lloyd(values: np.ndarray, weights: np.ndarray, centres: np.ndarray) -> np.ndarray:
    """Lloyd iterations from ascending `centres` to a fixed point (at most MAX_LLOYD_ITERS;
    native/kmeans.c): nearest centre (the lower on a midpoint), weighted means kept inside
    their cluster's hull, empty clusters reseeded on the worst-served points."""
    out = np.array(centres, dtype=np.float64)    # a copy: updated in place
    borrow, lib = _native()
    with borrow(values, "double[]") as v, borrow(weights, "double[]") as w, \
            borrow(out, "double[]", writable=True) as o:
        got = lib.mvc_lloyd_1d(v, w, values.size, o, out.size, MAX_LLOYD_ITERS)
    if got < 0:
        raise InternalError(f"mvc_lloyd_1d failed ({got})")
    return out


def _f64(a: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(a, dtype=np.float64)


def _native() -> tuple[Any, Any]:
    from mvc.native import lib  # the extension loads on first use
    from mvc.native.buffers import borrow

    return borrow, lib


def weighted_kmeans_1d(values: np.ndarray, weights: np.ndarray, k: int,
                       generator: torch.Generator, init: np.ndarray | None = None) -> np.ndarray:
    """Cluster sorted 1-D points with sample weights into k centres (ascending, length k).

    With fewer than k positively weighted points, the points themselves are the
    centres and the largest is repeated to fill k slots. `init` (k finite values)
    replaces the k-means++ seeding: Lloyd then settles in the optimum nearest to
    it, which keeps centroids stable from one commit to the next.
    """
    if k < 1:
        raise QuantConfigError(f"k must be >= 1, got {k}")
    live = weights > 0
    values, weights = _f64(values[live]), _f64(weights[live])
    if values.size == 0:
        return np.zeros(k, dtype=np.float64)
    if values.size <= k:
        return np.concatenate([values, np.full(k - values.size, values[-1])])
    if init is not None and len(init) == k and np.all(np.isfinite(init)):
        centres = np.sort(np.asarray(init, dtype=np.float64))
    else:
        centres = np.sort(kmeanspp_init(values, weights, k, generator))
    if centres.size < k:  # every point already a centre; cannot happen with > k points
        centres = np.concatenate([centres, np.full(k - centres.size, centres[-1])])
    return _lloyd(values, weights, centres)


def approx_kmeans(sketch: LogSketch, k: int, *, sigma: float = 0.2,
                  generator: torch.Generator | None = None, seed: int = 0,
                  init: np.ndarray | None = None) -> np.ndarray:
    """Alg. 2: k centroids (float64, ascending) of the values summarized by `sketch`.

    `init`: warm-start centroids (e.g. the previous commit's) instead of k-means++."""
    if generator is None:
        generator = torch.Generator().manual_seed(int(seed))
    values, counts = sketch.buckets()
    if values.size == 0:
        return np.zeros(k, dtype=np.float64)
    return weighted_kmeans_1d(values, bucket_weights(values, counts, sigma), k, generator,
                              init=init)
