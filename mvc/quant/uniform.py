"""The uniform quantizer family: a symmetric grid of levels with one step per tensor, a dead
zone around 0 that does the pruning, levels entropy coded like the k-means family's.

With entropy-coded levels a uniform grid (entropy-constrained scalar quantization) is close to
the rate-distortion bound, while k-means levels are optimal for fixed-length codes only; mvc
entropy-codes its levels anyway (issue 29: a pretrained encoder measured 3.1 bits/weight for a
uniform grid against 3.9 for 16 k-means levels, at better agreement).

The grid lives inside the existing `QuantizedTensor` convention, so dequantize, deltas, the level
caches and every reader work unchanged: for a config of `bins` levels the grid has
k = 2 * (bins // 2) + 1 centroids

    centroids[i] = float32(step * (i - m)),   i = 0..k-1,  m = k // 2,

ascending, with centroids[m] = 0.  `bins` counts the non-zero grid values (+-step .. +-m step);
0 is the dead zone.  The step covers the kept values' range: step = R / m with R the largest
magnitude left after protection (the protect threshold, or the tensor's top sketch bucket edge),
rounded to float32.  Parameters with |w| <= step / 2 are pruned (level k: exactly 0), as are those
the config's own prune fraction selects (a wider dead zone when it is wider); protected
parameters are level k + 1 with their exact values, as in the k-means family.

Warm start.  With the parent commit's centroids (`init`), when they form such a grid of the same
size whose step is still good -- it covers the new range to within half a step and is at most
`STEP_SLACK` coarser than the fresh step -- the parent's step is kept, so most levels do not move
between commits and deltas stay sparse.  Everything here is a function of the sketch, the
thresholds and `init`: the quantization is deterministic.
"""
from __future__ import annotations

import numpy as np

from mvc.quant.errors import QuantConfigError
from mvc.quant.partition import Thresholds
from mvc.quant.sketch import LogSketch

#: The quantizer families: k-means levels over a log histogram (Inshrinkerator §4), and this
#: module's uniform grid. A stored config without a `family` is k-means.
FAMILIES = ("kmeans", "uniform")
DEFAULT_FAMILY = "kmeans"

#: How much coarser than the fresh step the parent's step may be and still be kept.
STEP_SLACK = 0.1


def check_family(family: object) -> str:
    """Validate a quantizer family name."""
    if family not in FAMILIES:
        raise QuantConfigError(f"family must be one of {FAMILIES}, got {family!r}")
    return str(family)


def grid_size(bins: int) -> int:
    """Centroids of the uniform grid for a config of `bins` levels: 2 * (bins // 2) + 1 (at
    least 3: -step, 0, +step)."""
    return 2 * max(1, bins // 2) + 1


def grid(step: float, k: int) -> np.ndarray:
    """The k grid values step * (i - k // 2), rounded to float32 (as float64, ascending)."""
    m = k // 2
    return (np.float64(step) * (np.arange(k, dtype=np.float64) - m)).astype(np.float32) \
        .astype(np.float64)


def grid_step(centroids: np.ndarray) -> float | None:
    """The step of a uniform grid's centroids (float32 values), or None when they are not one
    (k-means centroids, another size's grid)."""
    k = centroids.size
    if k < 3 or k % 2 == 0:
        return None
    step = float(np.float32(centroids[k // 2 + 1]))
    if not step > 0 or not np.isfinite(step):
        return None
    return step if np.array_equal(grid(step, k), centroids.astype(np.float32).astype(np.float64)) \
        else None


def fresh_step(sketch: LogSketch, thr: Thresholds, k: int) -> float:
    """The step that spreads the grid's k // 2 positive values over the kept values' range: the
    smaller of the protect threshold and the top edge of the tensor's own sketch (0 when the
    tensor is all zeros), over k // 2, as float32."""
    mag = sketch.abs()
    top = mag.bucket_bound(1.0) if mag.count else 0.0
    if thr.protect_magnitude is not None:
        top = min(top, thr.protect_magnitude)
    if not top > 0:
        return 0.0
    return float(np.float32(top / (k // 2)))


def choose_step(sketch: LogSketch, thr: Thresholds, k: int,
                init: np.ndarray | None = None) -> float:
    """The grid step for a tensor: the parent's (`init`, its centroids) when still good (see the
    module docstring), else the fresh one."""
    step = fresh_step(sketch, thr, k)
    if init is None or init.size != k or not step > 0:
        return step
    parent = grid_step(init)
    m = k // 2
    if parent is not None and step * m <= parent * (m + 0.5) and parent <= step * (1 + STEP_SLACK):
        return parent
    return step


def dead_zone(thr: Thresholds, step: float) -> Thresholds:
    """`thr` with the dead zone |w| <= step / 2 pruned: the grid's 0 is the pruned level.  A
    magnitude prune threshold above it widens the zone; with sensitivity pruning the zone's
    values that sensitivity keeps fall on the grid's 0 centroid (also exactly 0)."""
    if not step > 0:
        return thr
    half = float(np.float32(step / 2))
    if thr.prune_metric != "magnitude":
        return thr
    cut = half if thr.prune is None else max(thr.prune, half)
    return Thresholds(cut, "magnitude", thr.protect_magnitude, thr.protect_sensitivity)


def uniform_plan(sketch: LogSketch, thr: Thresholds, bins: int,
                 init: np.ndarray | None = None) -> tuple[np.ndarray, Thresholds]:
    """(grid centroids as float64 holding float32 values, thresholds with the dead zone) for
    quantizing a tensor whose sketch is `sketch` to the uniform family with `bins` levels."""
    k = grid_size(bins)
    step = choose_step(sketch, thr, k, init)
    if not step > 0:  # an all-zero tensor (or all protected): every kept value is 0
        return np.zeros(k, dtype=np.float64), thr
    return grid(step, k), dead_zone(thr, step)
