"""Algorithm 4 on synthetic monotone cubes: same optimum as brute force, far fewer probes."""
from __future__ import annotations

import itertools
import random

import pytest

from mvc.search import MonotoneOracle, SearchSpace, diagonal, guided_search


def _monotone(shape, seed):
    rnd = random.Random(seed)
    w = [rnd.uniform(0.1, 2.0) for _ in shape]
    thr = rnd.uniform(0.0, sum(w) * 1.05)

    def feasible(p):
        return sum(wi * (pi / (n - 1) if n > 1 else 0.0) for wi, pi, n in zip(w, p, shape)) >= thr
    return feasible


@pytest.mark.parametrize("emb", [False, True])
def test_matches_brute_force_with_fewer_probes(emb):
    sp = SearchSpace()
    shape = sp.shape(emb)

    def cost(p):
        return sp.cost(p, emb, 0.25)
    everything = list(itertools.product(*(range(n) for n in shape)))
    probes = []
    for seed in range(120):
        feasible = _monotone(shape, seed)
        oracle = MonotoneOracle(feasible)
        got = guided_search(shape, cost, oracle)
        ok = [p for p in everything if feasible(p)]
        assert got == (min(ok, key=lambda p: (cost(p), p)) if ok else None), seed
        probes.append(oracle.probes)
    assert max(probes) < len(everything) / 2
    assert sum(probes) / len(probes) < len(everything) / 6


def test_diagonal_steps_by_at_most_one():
    for lo, hi in [((0, 0, 0), (5, 5, 2)), ((1, 0, 2), (4, 5, 2)), ((0,), (0,))]:
        d = diagonal(lo, hi)
        assert d[0] == lo and d[-1] == hi
        for a, b in zip(d, d[1:]):
            assert all(0 <= y - x <= 1 for x, y in zip(a, b))


def test_nothing_feasible_and_everything_feasible():
    sp = SearchSpace()
    shape = sp.shape(False)
    never = MonotoneOracle(lambda p: False)
    assert guided_search(shape, lambda p: sp.cost(p, False), never) is None
    assert never.probes == 1  # the top corner alone settles it
    always = MonotoneOracle(lambda p: True)
    assert guided_search(shape, lambda p: sp.cost(p, False), always) == (0, 0, 0)


def test_oracle_prefers_probed_answers_over_inference():
    o = MonotoneOracle(lambda p: p != (2, 2))
    assert o((1, 1)) is True
    assert o.known((2, 2)) is True      # implied by (1, 1)
    assert o.probe((2, 2)) is False     # but a probe says otherwise...
    assert o.known((2, 2)) is False     # ...and the probe wins
    assert o.probes == 2 and o.probe((2, 2)) is False and o.probes == 2
