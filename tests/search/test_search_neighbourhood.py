"""Delta-neighbourhood search: never more aggressive, cheapest first, metric switching."""
from __future__ import annotations

from mvc.search import SWITCH_MARGIN, SearchSpace, neighbourhood
from mvc.search.neighbourhood import Outcome, neighbourhood_search

SP = SearchSpace()
SHAPE = SP.shape(False)


def cost(p):
    return SP.cost(p, False)


def test_neighbourhood_is_never_more_aggressive_and_sorted():
    p = (2, 3, 1)
    pts = neighbourhood(p, SHAPE, cost)
    assert pts[0] == p and len(pts) == 8
    assert all(all(q >= r for q, r in zip(x, p)) for x in pts)
    assert [cost(x) for x in pts] == sorted(cost(x) for x in pts)
    last = tuple(n - 1 for n in SHAPE)  # the most conservative corner has no neighbours
    assert neighbourhood(last, SHAPE, cost) == [last]


def _trial_table(table, calls):
    def trial(metric, idx):
        calls.append((metric, idx))
        return table(metric, idx)
    return trial


def test_first_feasible_ends_the_search():
    calls = []
    eps = 0.01

    def table(metric, idx):
        ok = idx[0] >= 3  # needs more bins than the previous point has
        return Outcome(ok, 0.0 if ok else 0.05)
    got = neighbourhood_search((2, 3, 1), "magnitude", "sensitivity", SHAPE, cost,
                               lambda i: True, _trial_table(table, calls), eps)
    assert got == ("magnitude", (3, 3, 1))
    assert calls[:2] == [("sensitivity", (2, 3, 1)), ("magnitude", (2, 3, 1))]
    assert calls[-1] == ("magnitude", (3, 3, 1))


def test_metric_switches_only_on_clear_improvement():
    eps = 0.01
    for alt_deg, expect in [(0.004 - SWITCH_MARGIN * eps * 1.01, "sensitivity"),
                            (0.004 - SWITCH_MARGIN * eps * 0.5, "magnitude")]:
        def table(metric, idx, alt_deg=alt_deg):
            return Outcome(True, alt_deg if metric == "sensitivity" else 0.004)
        got = neighbourhood_search((2, 3, 1), "magnitude", "sensitivity", SHAPE, cost,
                                   lambda i: True, _trial_table(table, []), eps)
        assert got == (expect, (2, 3, 1))


def test_switches_when_the_current_metric_fails_and_skips_when_irrelevant():
    calls = []

    def table(metric, idx):
        return Outcome(metric == "sensitivity", 0.0 if metric == "sensitivity" else 0.5)
    got = neighbourhood_search((2, 3, 1), "magnitude", "sensitivity", SHAPE, cost,
                               lambda i: True, _trial_table(table, calls), 0.01)
    assert got == ("sensitivity", (2, 3, 1)) and len(calls) == 2
    calls.clear()
    always = _trial_table(lambda m, i: Outcome(True, 0.0), calls)
    got = neighbourhood_search((2, 5, 1), "magnitude", "sensitivity", SHAPE, cost,
                               lambda i: False, always, 0.01)
    assert got == ("magnitude", (2, 5, 1)) and calls == [("magnitude", (2, 5, 1))]


def test_nothing_feasible_returns_none():
    got = neighbourhood_search((2, 3, 1), "magnitude", None, SHAPE, cost, lambda i: True,
                               lambda m, i: Outcome(False, 1.0), 0.01)
    assert got is None
