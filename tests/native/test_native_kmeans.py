"""native/kmeans.c against the numpy implementation it replaced (tests/helpers/reference_kmeans.py):
bit-identical centres from the greedy k-means++ seeding and the Lloyd iterations (the reference
sums the seeding's potentials in index order, as the C code does), and every entry point's
argument checks."""
from __future__ import annotations

import numpy as np
import pytest
import reference_kmeans as ref
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mvc.native import ffi, lib
from mvc.quant.kmeans import bucket_weights, kmeanspp_init, weighted_kmeans_1d

ERR_ARG = -3


def _bits(a: np.ndarray) -> list[int]:
    return np.asarray(a, dtype=np.float64).view(np.int64).tolist()


@st.composite
def points(draw, max_n: int = 300):
    """Ascending values (duplicates and zeros allowed, as far apart as float32 weights get)
    with positive weights, as a log histogram's buckets give them."""
    n = draw(st.integers(1, max_n))
    seed = draw(st.integers(0, 2**31 - 1))
    rng = np.random.default_rng(seed)
    kind = draw(st.sampled_from(["normal", "heavy", "grid", "dups"]))
    if kind == "normal":
        v = rng.normal(size=n)
    elif kind == "heavy":
        v = rng.standard_cauchy(size=n) * 1e-3
    elif kind == "grid":
        v = np.round(rng.normal(size=n) * 8) / 8          # many exact ties between points
    else:
        v = rng.choice(np.array([-1.5, -0.25, 0.0, 0.0, 0.5, 3.0]), size=n)
    v = np.sort(v.astype(np.float32).astype(np.float64))
    counts = rng.integers(1, 10_000, size=n).astype(np.float64)
    w = bucket_weights(v, counts, draw(st.sampled_from([0.0, 0.2, 1.0])))
    keep = w > 0
    return v[keep], w[keep]


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(pw=points(), k=st.integers(1, 40), seed=st.integers(0, 1000))
def test_centres_bit_identical_to_the_reference(pw, k, seed):
    v, w = pw
    if v.size == 0:
        return
    got = weighted_kmeans_1d(v, w, k, torch.Generator().manual_seed(seed))
    want = ref.weighted_kmeans_1d(v, w, k, torch.Generator().manual_seed(seed), ordered=True)
    assert _bits(got) == _bits(want)
    seeds = kmeanspp_init(v, w, k, torch.Generator().manual_seed(seed))
    want_seeds = ref.kmeanspp_init(v, w, k, torch.Generator().manual_seed(seed), ordered=True)
    assert _bits(seeds) == _bits(want_seeds)


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(pw=points(), k=st.integers(1, 24), seed=st.integers(0, 1000))
def test_warm_started_lloyd_bit_identical_to_the_reference(pw, k, seed):
    """From given centres (a parent commit's), including ones that leave clusters empty."""
    v, w = pw
    if v.size <= k:
        return
    rng = np.random.default_rng(seed)
    init = np.sort(rng.choice(v, size=k) + rng.normal(size=k) * 0.01)
    init[: k // 3] = init[0]                               # duplicates: empty clusters
    got = weighted_kmeans_1d(v, w, k, torch.Generator(), init=init)
    want = ref.weighted_kmeans_1d(v, w, k, torch.Generator(), init=init, ordered=True)
    assert _bits(got) == _bits(want)


def test_the_greedy_step_keeps_the_lowest_potential_and_the_first_on_ties():
    v = np.array([-2.0, -1.0, 0.0, 1.0, 2.0])
    w = np.ones(5)
    draws = np.array([0.5, 0.5, 0.01, 0.99], dtype=np.float64)   # k=2, trials=2
    out = np.empty(2)
    got = lib.mvc_kmeanspp(ffi.from_buffer("double[]", v), ffi.from_buffer("double[]", w), 5,
                           2, 2, ffi.from_buffer("double[]", draws), 4,
                           ffi.from_buffer("double[]", out), 2)
    # centre 0 is the middle point; -2 and +2 leave equal potentials: the first trial wins
    assert got == 2 and out.tolist() == [0.0, -2.0]


def test_every_point_a_centre_stops_the_seeding():
    v, w = np.array([0.0, 1.0]), np.ones(2)
    seeds = kmeanspp_init(v, w, 5, torch.Generator().manual_seed(0))
    assert sorted(seeds.tolist()) == [0.0, 1.0]
    assert weighted_kmeans_1d(v, w, 5, torch.Generator()).tolist() == [0.0, 1.0, 1.0, 1.0, 1.0]


def _call_pp(n=3, k=2, trials=2, n_draws=4, out_len=2, null=None):
    v, w = np.arange(3.0), np.ones(3)
    d, o = np.full(8, 0.5), np.empty(4)
    args = [ffi.from_buffer("double[]", v), ffi.from_buffer("double[]", w), n, k, trials,
            ffi.from_buffer("double[]", d), n_draws, ffi.from_buffer("double[]", o), out_len]
    if null is not None:
        args[null] = ffi.NULL
    return lib.mvc_kmeanspp(*args)


@pytest.mark.parametrize("kw", [dict(n=0), dict(k=0), dict(k=-1), dict(trials=0),
                                dict(n_draws=3), dict(out_len=1), dict(null=0), dict(null=1),
                                dict(null=5), dict(null=7)])
def test_kmeanspp_refuses_bad_arguments(kw):
    assert _call_pp(**kw) == ERR_ARG


def test_kmeanspp_accepts_its_own_limits():
    assert _call_pp() == 2


def _call_lloyd(n=3, k=2, iters=10, null=None):
    v, w, c = np.arange(3.0), np.ones(3), np.array([0.0, 2.0])
    args = [ffi.from_buffer("double[]", v), ffi.from_buffer("double[]", w), n,
            ffi.from_buffer("double[]", c), k, iters]
    if null is not None:
        args[null] = ffi.NULL
    return lib.mvc_lloyd_1d(*args), c


@pytest.mark.parametrize("kw", [dict(n=0), dict(k=0), dict(iters=-1), dict(null=0),
                                dict(null=1), dict(null=3)])
def test_lloyd_refuses_bad_arguments(kw):
    assert _call_lloyd(**kw)[0] == ERR_ARG


def test_lloyd_zero_iterations_leaves_the_centres():
    got, c = _call_lloyd(iters=0)
    assert got == 0 and c.tolist() == [0.0, 2.0]
    got, c = _call_lloyd()
    assert got >= 1 and c.tolist() == [0.5, 2.0]


@pytest.mark.parametrize("seed", range(6))
def test_overflowing_distances_follow_the_reference(seed):
    """Values whose squared distances overflow to inf (beyond anything a float32 tensor
    gives): the NaN / inf comparisons follow numpy's (searchsorted, argmax) as well."""
    v = np.array([-1e200, -1e100, 0.0, 1.0, 1e150, 1e200])
    w = np.array([1.0, 0.5, 0.25, 1.0, 0.75, 0.1])
    for k in (2, 3, 4):
        got = weighted_kmeans_1d(v, w, k, torch.Generator().manual_seed(seed))
        with np.errstate(over="ignore", invalid="ignore"):   # numpy says so; C does the same
            want = ref.weighted_kmeans_1d(v, w, k, torch.Generator().manual_seed(seed),
                                          ordered=True)
        assert _bits(got) == _bits(want)
