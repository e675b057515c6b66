"""The second moment's log values (native/moments.c `mvc_log_positive_f32`): where AVX2 runs,
a polynomial gives them and a block near a float32 rounding midpoint is redone by libm; either
way every value must be float32(libm log(float64 x)), the bits the plain form writes.  (Checked
once for every positive float32, both forms: docs/development.md, SIMD code paths.)"""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mvc.native import ffi, lib
from mvc.native.simd import available, capped
from mvc.quant._kernels import log_positive

LEVELS = [lvl for lvl in available() if lvl <= 2]


def reference(x: np.ndarray) -> np.ndarray:
    """float32(log(float64 v)) of the positive entries, by Python's libm log, one value at a time."""
    pos = x[x > 0].astype(np.float64).tolist()
    return np.array([math.log(v) for v in pos], dtype=np.float64).astype(np.float32)


def near_midpoints(count: int) -> np.ndarray:
    """Floats whose float64 log lies within 1024 double ulps of a float32 rounding midpoint:
    the values the polynomial leaves to libm."""
    rng = np.random.default_rng(7)
    found: list[np.ndarray] = []
    while sum(f.size for f in found) < count:
        bits = rng.integers(0x00800000, 0x7f800000, size=1 << 22, dtype=np.uint32)
        x = bits.view(np.float32)
        low = np.log(x.astype(np.float64)).view(np.uint64) & np.uint64(0x1fffffff)
        off = low.astype(np.int64) - 0x10000000
        found.append(x[np.abs(off) <= 1024])
    return np.concatenate(found)[:count]


def edge_values() -> np.ndarray:
    f32 = np.float32
    one = np.nextafter(f32(1), f32(2))
    sqrt2 = np.array([0x3fb504f2, 0x3fb504f3, 0x3fb504f4, 0x3fb504f5, 0x3f3504f3, 0x3f3504f4],
                     dtype=np.uint32).view(np.float32)
    powers = np.ldexp(np.ones(254, dtype=np.float32), np.arange(-126, 128))
    return np.concatenate([
        np.array([1.0, one, np.nextafter(f32(1), f32(0)), 1e-45, 3e-40, 1.1754942e-38,
                  1.17549435e-38, 3.4028235e38, np.inf, 0.0, -0.0, -1.0, np.nan, -np.inf],
                 dtype=np.float32),
        sqrt2, powers, np.nextafter(powers, f32(0)), np.nextafter(powers, f32(np.inf))])


@pytest.fixture(params=LEVELS, ids=lambda lvl: f"simd{lvl}")
def level(request):
    with capped(request.param):
        yield request.param


def test_random_bit_patterns_edges_and_midpoints_match_libm(level):
    rng = np.random.default_rng(level)
    x = np.concatenate([rng.integers(0, 1 << 32, size=200_000, dtype=np.uint64)
                        .astype(np.uint32).view(np.float32), edge_values(), near_midpoints(40)])
    got = log_positive(torch.from_numpy(x)).numpy()
    assert np.array_equal(got.view(np.uint32), reference(x).view(np.uint32))


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.floats(width=32, allow_nan=True), min_size=0, max_size=700))
def test_any_values_match_libm_at_every_level(values):
    x = np.array(values, dtype=np.float32)
    want = reference(x).view(np.uint32)
    for lvl in LEVELS:
        with capped(lvl):
            got = log_positive(torch.from_numpy(x)).numpy()
        assert np.array_equal(got.view(np.uint32), want)


@pytest.mark.parametrize("n", [0, 1, 255, 256, 257, 1000])
def test_capacity_is_checked_before_anything_past_it_is_written(level, n):
    x = np.linspace(0.5, 2.0, n, dtype=np.float32)
    out = np.full(n + 4, -7.0, dtype=np.float32)
    vp, op = ffi.cast("const float *", x.ctypes.data), ffi.cast("float *", out.ctypes.data)
    assert lib.mvc_log_positive_f32(vp, n, op, n) == n
    assert np.array_equal(out[:n], reference(x)) and np.all(out[n:] == -7.0)
    if n:
        out[:] = -7.0
        assert lib.mvc_log_positive_f32(vp, n, op, n - 1) == -1
        assert np.all(out[n - 1:] == -7.0)
    assert lib.mvc_log_positive_f32(ffi.NULL, 3, op, n) == -1
    assert lib.mvc_log_positive_f32(vp, n, ffi.NULL, 2) == -1
