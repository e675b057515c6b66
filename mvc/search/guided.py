"""Guided exhaustive search over a monotone cube (Inshrinkerator Algorithm 4).

The cube is a box of index vectors, index 0 the most compressive value of each
axis.  Feasibility (quality within epsilon) is assumed monotone: if p is feasible,
every q >= p (componentwise) is too, and if p is infeasible every q <= p is.
The goal is the feasible point of least `cost` (expected bits per parameter).

Algorithm 4, for one box [lo, hi]:

1. *Diagonal*: the points lo + round(t (hi - lo) / (T - 1)), t = 0..T-1, with T the
   longest side, so every step moves each axis by at most one.  Feasibility is
   monotone along it, so a binary search finds the first feasible diagonal point d
   (if the top corner hi is infeasible, nothing in the box is).
2. *Feasible sub-cubes*: d splits the box into orthants.  The one >= d is feasible
   and its cheapest point is d itself; the one strictly below d lies under the
   infeasible diagonal point before d (steps are <= 1 per axis), so it is
   infeasible.  The remaining "mixed" orthants (some axes below d, the others at or
   above) may hold cheaper feasible points: each is searched recursively, cheapest
   lower corner first, skipping any whose lower corner cannot beat the best cost
   found so far or whose top corner is already known to be infeasible.

Every answer is memoized, and feasibility implied by monotonicity from earlier
answers is used without probing, so each point is evaluated at most once and most
are never evaluated.  The caller runs this once per pruning metric and keeps the
better result (§5).
"""
from __future__ import annotations

from collections.abc import Callable, Sequence
from itertools import product

Idx = tuple[int, ...]


class MonotoneOracle:
    """Feasibility answers for one cube: probed ones plus those implied by monotonicity.

    A probed answer always wins over an inferred one (quality is only roughly
    monotone, so the two can disagree).
    """

    def __init__(self, probe: Callable[[Idx], bool]) -> None:
        self._probe = probe
        self.answers: dict[Idx, bool] = {}
        self.probes = 0

    def known(self, p: Idx) -> bool | None:
        """True / False when probed or implied by probed answers, None when unknown."""
        if p in self.answers:
            return self.answers[p]
        items = self.answers.items()
        if any(ok and all(a >= b for a, b in zip(p, q)) for q, ok in items):
            return True
        if any(not ok and all(a <= b for a, b in zip(p, q)) for q, ok in items):
            return False
        return None

    def seed(self, p: Idx, ok: bool) -> None:
        """Record an answer obtained elsewhere."""
        self.answers[p] = bool(ok)

    def probe(self, p: Idx) -> bool:
        """Probe `p` even if its answer could be inferred (once: answers are memoized)."""
        if p not in self.answers:
            self.probes += 1
            self.answers[p] = bool(self._probe(p))
        return self.answers[p]

    def __call__(self, p: Idx) -> bool:
        k = self.known(p)
        return self.probe(p) if k is None else k


def diagonal(lo: Idx, hi: Idx) -> list[Idx]:
    """The box's diagonal from lo to hi; each step moves every axis by 0 or 1."""
    n = max(h - l for l, h in zip(lo, hi)) + 1
    if n == 1:
        return [tuple(lo)]
    return [tuple(l + int((t * (h - l)) / (n - 1) + 0.5) for l, h in zip(lo, hi))
            for t in range(n)]


def _first_feasible(points: Sequence[Idx], feasible: Callable[[Idx], bool]) -> int | None:
    if not feasible(points[-1]):
        return None
    lo, hi = 0, len(points) - 1   # invariant: points[hi] feasible, everything before lo infeasible
    while lo < hi:
        mid = (lo + hi) // 2
        if feasible(points[mid]):
            hi = mid
        else:
            lo = mid + 1
    return hi


def _first_feasible_batched(points: Sequence[Idx], oracle: MonotoneOracle,
                            prefetch: Callable[[list[Idx]], None], width: int) -> int | None:
    """`_first_feasible` in rounds of `width` probes spread over the open interval (a
    (width+1)-ary search): `prefetch(points)` probes them all at once (one per rank) and
    seeds `oracle` with the answers; monotonicity narrows the interval from every answer."""
    lo, hi = 0, len(points) - 1
    top = points[hi]
    if oracle.known(top) is None:
        # the top corner, and the cheapest points below it, in the first round
        first = [top] + [points[i] for i in range(lo, hi) if oracle.known(points[i]) is None]
        prefetch(_spread(first[1:], width - 1, [top]))
    if not oracle(top):
        return None
    while lo < hi:
        known = [oracle.known(points[i]) for i in range(lo, hi)]
        ok = [lo + i for i, k in enumerate(known) if k is True]
        bad = [lo + i for i, k in enumerate(known) if k is False]
        if ok:
            hi = min(ok)
        below = [b for b in bad if b < hi]
        if below:
            lo = max(below) + 1
        if lo >= hi:
            break
        unknown = [points[i] for i in range(lo, hi) if oracle.known(points[i]) is None]
        if not unknown:
            break
        prefetch(_spread(unknown, width, []))
    return hi


def _spread(points: Sequence[Idx], n: int, head: list[Idx]) -> list[Idx]:
    """`head` plus up to `n` of `points`, evenly spaced (the ends of a search interval
    are where a (n+1)-ary search probes)."""
    if n <= 0 or not points:
        return list(head)
    if len(points) <= n:
        return list(head) + list(points)
    step = (len(points) + 1) / (n + 1)
    picks = sorted({min(len(points) - 1, max(0, int(step * (k + 1)) - 1)) for k in range(n)})
    return list(head) + [points[i] for i in picks]


def guided_search(shape: Sequence[int], cost: Callable[[Idx], float],
                  feasible: Callable[[Idx], bool], *,
                  prefetch: Callable[[list[Idx]], None] | None = None,
                  width: int = 1) -> Idx | None:
    """The cheapest feasible point of the cube `shape` (None if none is), per Algorithm 4.

    `feasible` should be a `MonotoneOracle` (any callable works, but then points
    may be probed more than once).  Ties in cost are broken by the index vector.
    `prefetch` (with a `MonotoneOracle`): probes a list of up to `width` points at once
    and seeds the oracle -- the parallel search over ranks (`mvc.search.parallel`), in
    which the diagonal's binary search becomes a (width+1)-ary one.
    """
    best: list[tuple[float, Idx] | None] = [None]

    def key(p: Idx) -> tuple[float, Idx]:
        return (cost(p), p)

    def known(p: Idx) -> bool | None:
        return feasible.known(p) if isinstance(feasible, MonotoneOracle) else None

    def step(lo: Idx, hi: Idx) -> list[tuple[Idx, Idx]]:
        """One box of the recursion: probe its diagonal, and the boxes left to search in it,
        in the order they are to be searched."""
        if best[0] is not None and key(lo) >= best[0]:
            return []  # nothing in this box can beat the best found so far
        if known(hi) is False:
            return []
        if known(lo) is True:
            best[0] = min(best[0], key(lo)) if best[0] is not None else key(lo)
            return []
        diag = diagonal(lo, hi)
        if prefetch is not None and width > 1 and isinstance(feasible, MonotoneOracle):
            t = _first_feasible_batched(diag, feasible, prefetch, width)
        else:
            t = _first_feasible(diag, feasible)
        if t is None:
            return []
        d = diag[t]
        if best[0] is None or key(d) < best[0]:
            best[0] = key(d)
        boxes = []
        axes = range(len(lo))
        for below in product((False, True), repeat=len(lo)):
            if not any(below) or all(below):
                continue
            if any(b and d[a] == lo[a] for a, b in zip(axes, below)):
                continue  # an empty side
            blo = tuple(lo[a] if below[a] else d[a] for a in axes)
            bhi = tuple(d[a] - 1 if below[a] else hi[a] for a in axes)
            boxes.append((key(blo), blo, bhi))
        boxes.sort()
        if prefetch is not None and width > 1 and isinstance(feasible, MonotoneOracle):
            # Each box's search starts at its top corner: probe the first boxes' tops together.
            tops = [bhi for k, _, bhi in boxes if (best[0] is None or k < best[0])
                    and feasible.known(bhi) is None]
            if len(tops) > 1:
                prefetch(tops[:width])
        return [(blo, bhi) for _, blo, bhi in boxes]

    if not shape or any(n < 1 for n in shape):
        return None
    # Depth first, each box's sub-boxes in their order: the recursion of Algorithm 4 on an
    # explicit stack. (A nested function calling itself is a reference cycle, which kept
    # `feasible` -- the search's runner, and its trials' levels on the GPU -- alive until the
    # cyclic garbage collector next ran.)
    stack = [(tuple(0 for _ in shape), tuple(n - 1 for n in shape))]
    while stack:
        stack.extend(reversed(step(*stack.pop())))
    return best[0][1] if best[0] is not None else None
