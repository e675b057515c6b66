"""Delta-neighbourhood search: the steady-state search from the previous config (§5).

The neighbourhood of the previous point p is every point q with
p <= q <= p + radius componentwise (clipped to the cube): never more aggressive
than p on any axis — as training goes on the model gets denser and more
sensitive, so the search only ever relaxes — and at most `radius` steps less
aggressive on each axis.  With radius 1 that is up to 2^D points.

Order of trials:

1. the other pruning metric at p (when it matters: prune > 0 and both metrics are
   available), then p with the current metric.  The metric switches only when the
   other one is feasible and clearly better (degradation lower by at least
   `SWITCH_MARGIN` x epsilon), or when the current one is infeasible;
2. the rest of the neighbourhood with the chosen metric, in increasing expected
   cost, so the first feasible point is the most compressive one and ends the search.

If nothing is feasible the caller falls back to the guided exhaustive search.
"""
from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from itertools import product

Idx = tuple[int, ...]

#: Fraction of epsilon by which the other metric must beat the current one to switch.
#: A whole epsilon: eval-loss noise between near-identical configs is of that order,
#: and flipping the metric at every commit changes the pruned set, which costs delta
#: compression (seen in benchmarks/bench_search.py with a margin of 0.25).
SWITCH_MARGIN = 1.0


@dataclass(frozen=True)
class Outcome:
    """A trial's verdict as the neighbourhood search needs it."""

    feasible: bool
    degradation: float


def neighbourhood(p: Idx, shape: Sequence[int], cost: Callable[[Idx], float],
                  radius: int = 1) -> list[Idx]:
    """Points p <= q <= p + radius inside the cube, cheapest first (p itself first)."""
    ranges = [range(pi, min(pi + radius, n - 1) + 1) for pi, n in zip(p, shape)]
    return sorted(product(*ranges), key=lambda q: (cost(q), q))


def choose_metric(current: str, other: str | None, p: Idx, metric_matters: bool,
                  trial: Callable[[str, Idx], Outcome], epsilon: float) -> tuple[str, bool]:
    """(metric to continue with, whether p with that metric is feasible)."""
    if other is None or not metric_matters:
        return current, trial(current, p).feasible
    alt = trial(other, p)
    cur = trial(current, p)
    if alt.feasible and (not cur.feasible
                         or alt.degradation < cur.degradation - SWITCH_MARGIN * epsilon):
        return other, True
    return current, cur.feasible


def neighbourhood_search(p: Idx, current: str, other: str | None, shape: Sequence[int],
                         cost: Callable[[Idx], float], metric_matters: Callable[[Idx], bool],
                         trial: Callable[[str, Idx], Outcome], epsilon: float,
                         radius: int = 1) -> tuple[str, Idx] | None:
    """The first feasible (metric, point) of the neighbourhood, or None.

    `trial(metric, idx)` evaluates a point (the caller memoizes), `metric_matters(idx)`
    says whether the prune metric changes anything there (prune > 0).
    """
    metric, ok = choose_metric(current, other, p, metric_matters(p), trial, epsilon)
    if ok:
        return metric, p
    for q in neighbourhood(p, shape, cost, radius)[1:]:
        if trial(metric, q).feasible:
            return metric, q
    return None
