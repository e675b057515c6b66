"""The numpy k-means of mvc/quant/kmeans.py before it moved to C (native/kmeans.c): the
reference the native seeding and Lloyd iterations are checked against, bit for bit (the
greedy step's potentials: summed in index order in `kmeanspp_init(..., ordered=True)`,
where numpy's dot, as production had it, leaves the order to the BLAS)."""
from __future__ import annotations

import numpy as np
import torch

MAX_LLOYD_ITERS = 300


def _sample(p: np.ndarray, u: float) -> int:
    """Index drawn with probability proportional to p, using the uniform draw u in [0, 1)."""
    cs = np.cumsum(p)
    j = int(np.searchsorted(cs, u * cs[-1], side="right"))
    if j >= p.size or p[j] <= 0:  # rounding at the very top: fall back to the heaviest point
        j = int(np.argmax(p))
    return j


def kmeanspp_init(values: np.ndarray, weights: np.ndarray, k: int,
                  generator: torch.Generator, trials: int | None = None,
                  ordered: bool = False) -> np.ndarray:
    """Weighted k-means++ seeding (Alg. 3); returns up to k distinct centres, unsorted.

    Each new centre is drawn with probability proportional to weight x squared distance
    to the nearest centre so far.  With `trials` > 1 this is greedy k-means++ (as in
    scikit-learn): that many candidates are drawn and the one leaving the smallest
    weighted potential is kept.  Default: 2 + ln(k) trials.
    """
    if trials is None:
        trials = 2 + int(np.log(k))
    draws = torch.rand(k, trials, generator=generator, dtype=torch.float64).numpy()
    centres = [values[_sample(weights, float(draws[0, 0]))]]
    d2 = (values - centres[0]) ** 2
    heaviest = None
    for i in range(1, k):
        p = d2 * weights
        if not p.sum() > 0:
            break
        # All trials of a centre share one prefix sum (drawing them one by one summed p once
        # per trial: most of a commit's k-means time).  Same draws, same picks as _sample.
        cs = np.cumsum(p)
        idx = np.searchsorted(cs, draws[i] * cs[-1], side="right")
        bad = (idx >= p.size) | (p[np.minimum(idx, p.size - 1)] <= 0)
        if bad.any():
            heaviest = int(np.argmax(p))
            idx = np.where(bad, heaviest, idx)
        cands = np.minimum(d2, (values - values[idx][:, None]) ** 2)
        # One dot per trial (not a matrix product): the potentials, and so the picks, stay
        # bit-identical to drawing the trials one at a time.
        pots = [_ordered_dot(c, weights) if ordered else float(np.dot(c, weights))
                for c in cands]
        best = min(range(trials), key=lambda t: (pots[t], t))
        centres.append(values[idx[best]])
        d2 = cands[best]
    return np.asarray(centres, dtype=np.float64)


def _cluster_edges(values: np.ndarray, centres: np.ndarray) -> np.ndarray:
    # A point equal to a midpoint joins the lower cluster, as in `assign` (bucketize, right=False).
    mids = (centres[:-1] + centres[1:]) * 0.5
    cuts = np.searchsorted(values, mids, side="right")
    return np.concatenate([[0], cuts, [values.size]])


def _reseed_empty(values: np.ndarray, weights: np.ndarray, centres: np.ndarray,
                  edges: np.ndarray, empty: np.ndarray) -> np.ndarray:
    """Move centres of empty clusters onto the points that are currently worst served."""
    owner = np.repeat(np.arange(centres.size), np.diff(edges))
    err = weights * (values - centres[owner]) ** 2
    out = centres.copy()
    for j in np.flatnonzero(empty):
        i = int(np.argmax(err))
        if err[i] <= 0:
            break
        out[j] = values[i]
        err = np.minimum(err, weights * (values - values[i]) ** 2)
    return np.sort(out)


def weighted_kmeans_1d(values: np.ndarray, weights: np.ndarray, k: int,
                       generator: torch.Generator, init: np.ndarray | None = None,
                       ordered: bool = False) -> np.ndarray:
    """Cluster sorted 1-D points with sample weights into k centres (ascending, length k).

    With fewer than k positively weighted points, the points themselves are the
    centres and the largest is repeated to fill k slots. `init` (k finite values)
    replaces the k-means++ seeding: Lloyd then settles in the optimum nearest to
    it, which keeps centroids stable from one commit to the next.
    """
    if k < 1:
        raise ValueError(f"k must be >= 1, got {k}")
    live = weights > 0
    values, weights = values[live], weights[live]
    if values.size == 0:
        return np.zeros(k, dtype=np.float64)
    if values.size <= k:
        return np.concatenate([values, np.full(k - values.size, values[-1])])
    if init is not None and len(init) == k and np.all(np.isfinite(init)):
        centres = np.sort(np.asarray(init, dtype=np.float64))
    else:
        centres = np.sort(kmeanspp_init(values, weights, k, generator, ordered=ordered))
    if centres.size < k:  # every point already a centre; cannot happen with > k points
        centres = np.concatenate([centres, np.full(k - centres.size, centres[-1])])
    cw = np.concatenate([[0.0], np.cumsum(weights)])
    cwx = np.concatenate([[0.0], np.cumsum(weights * values)])
    edges = None
    for _ in range(MAX_LLOYD_ITERS):
        new_edges = _cluster_edges(values, centres)
        if edges is not None and np.array_equal(new_edges, edges):
            break
        edges = new_edges
        sw = cw[edges[1:]] - cw[edges[:-1]]
        swx = cwx[edges[1:]] - cwx[edges[:-1]]
        empty = ~(sw > 0)
        centres = np.where(empty, centres, swx / np.where(empty, 1.0, sw))
        # keep the centre inside its cluster's hull despite prefix-sum cancellation
        nonempty = ~empty
        lo = values[np.minimum(edges[:-1], values.size - 1)]
        hi = values[np.maximum(edges[1:] - 1, 0)]
        centres[nonempty] = np.clip(centres[nonempty], lo[nonempty], hi[nonempty])
        if empty.any():
            centres = _reseed_empty(values, weights, centres, edges, empty)
        else:
            centres = np.sort(centres)
    return centres




def _ordered_dot(a: np.ndarray, b: np.ndarray) -> float:
    """sum(a[j] * b[j]) added in index order (as native/kmeans.c does)."""
    acc = 0.0
    for x, y in zip(a.tolist(), b.tolist()):
        acc += x * y
    return acc
