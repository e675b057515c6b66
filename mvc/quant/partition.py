"""Prune / protect partitioning (Inshrinkerator §4.2-4.3), one fraction per layer type
(`mvc.layer_types`).

Thresholds are quantiles of importance sketches, so they can be computed over the union
of every tensor of a layer type by merging per-tensor sketches (§4.2: one fraction per
layer type).  A parameter is

- protected (kept exactly) if its magnitude is above the (1 - protect) magnitude
  quantile OR, when a gradient is known, its sensitivity is above the (1 - protect)
  sensitivity quantile;
- otherwise pruned (set to 0) if its pruning-metric importance is at most the `prune`
  quantile of that metric;
- otherwise quantized.

Protection wins over pruning.  Cut-offs are the upper edges of the sketch buckets
holding the requested quantiles (`LogSketch.bucket_bound`): the realized fractions match
the requested ones to within the population of one log bucket (pruning rounds up,
protection down), and because the split follows bucket edges the sketch of the values
left to quantize is a slice of the tensor's sketch (no second pass over the data when
only magnitude is involved).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from mvc.quant.errors import QuantConfigError
from mvc.quant.importance import check_metric
from mvc.quant.sketch import LogSketch

def check_fraction(value: float, what: str) -> float:
    """Validate a fraction in [0, 1]."""
    try:
        f = float(value)
    except (TypeError, ValueError) as exc:
        raise QuantConfigError(f"{what} must be a number in [0, 1], got {value!r}") from exc
    if not 0.0 <= f <= 1.0:
        raise QuantConfigError(f"{what} must be in [0, 1], got {value!r}")
    return f


@dataclass(frozen=True)
class Thresholds:
    """Importance cut-offs; None disables a rule.

    prune: importance <= prune is pruned (importance from `prune_metric`).
    protect_magnitude / protect_sensitivity: importance > threshold is protected.
    All are float32-representable, compared in float32.
    """

    prune: float | None = None
    prune_metric: str = "magnitude"
    protect_magnitude: float | None = None
    protect_sensitivity: float | None = None

    @property
    def needs_sensitivity(self) -> bool:
        return self.protect_sensitivity is not None or (
            self.prune is not None and self.prune_metric == "sensitivity")


def _upper(sk: LogSketch, frac: float) -> float | None:
    if frac <= 0.0 or sk.count == 0:
        return None
    return float("-inf") if frac >= 1.0 else sk.bucket_bound(1.0 - frac)


def thresholds(magnitude: LogSketch, sensitivity: LogSketch | None, *, prune: float,
               prune_metric: str, protect: float) -> Thresholds:
    """Cut-offs for the requested fractions from importance sketches.

    `magnitude` sketches |w| (e.g. `LogSketch.abs()` of the weights), `sensitivity`
    sketches |g w| or is None when no gradient is known.  Pruning by sensitivity
    without a sensitivity sketch raises `QuantConfigError`.
    """
    prune = check_fraction(prune, "prune")
    protect = check_fraction(protect, "protect")
    check_metric(prune_metric)
    t_prune = None
    if prune > 0.0:
        src = magnitude if prune_metric == "magnitude" else sensitivity
        if src is None:
            raise QuantConfigError("prune_metric='sensitivity' needs a gradient")
        if src.count:
            t_prune = float("inf") if prune >= 1.0 else src.bucket_bound(prune)
    return Thresholds(
        prune=t_prune, prune_metric=prune_metric,
        protect_magnitude=_upper(magnitude, protect),
        protect_sensitivity=_upper(sensitivity, protect) if sensitivity is not None else None,
    )


def masks(x: torch.Tensor, sens: torch.Tensor | None, thr: Thresholds
          ) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """(pruned, protected) boolean masks over flat float32 `x`; None when a rule is off.

    `sens` is |g x| (flat float32) and is required when `thr.needs_sensitivity`.
    """
    if thr.needs_sensitivity and sens is None:
        raise QuantConfigError("these thresholds need sensitivity scores (a gradient)")
    mag = x.abs() if (thr.prune is not None and thr.prune_metric == "magnitude"
                      or thr.protect_magnitude is not None) else None
    # The `is not None` tests on mag/sens below always hold once their rule is on (mag is
    # computed for it; a missing sens raised above); they are there so the types narrow.
    protect: torch.Tensor | None = None
    if thr.protect_magnitude is not None and mag is not None:
        protect = mag > thr.protect_magnitude
    if thr.protect_sensitivity is not None and sens is not None:
        ps = sens > thr.protect_sensitivity
        protect = ps if protect is None else protect.logical_or_(ps)
    prune: torch.Tensor | None = None
    imp = mag if thr.prune_metric == "magnitude" else sens
    if thr.prune is not None and imp is not None:
        prune = imp <= thr.prune
        if protect is not None:
            prune.logical_and_(protect.logical_not())
    return prune, protect
