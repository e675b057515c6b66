"""LogSketch (Alg. 1): alpha-relative quantiles, exact merging, NaN/Inf policy."""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings, strategies as st

from mvc.quant import LogSketch, NonFiniteTensorError, QuantConfigError
from mvc.quant._kernels import Partition

QS = (0.0, 1e-4, 0.001, 0.01, 0.1, 0.3, 0.5, 0.7, 0.9, 0.99, 0.999, 0.9999, 1.0)


def _data(kind: str, n: int = 200_000, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    if kind == "normal":
        return torch.randn(n, generator=g) * 0.02
    if kind == "cauchy":  # heavy-tailed, both signs, huge dynamic range
        u = torch.rand(n, generator=g, dtype=torch.float64)
        return torch.tan(math.pi * (u - 0.5)).float() * 1e-3
    if kind == "lognormal":
        return torch.exp(torch.randn(n, generator=g) * 4.0)
    if kind == "mixed":  # zeros, tiny and huge values of both signs
        x = torch.randn(n, generator=g) * torch.exp(torch.randn(n, generator=g) * 10).clamp(max=1e30)
        x[::7] = 0.0
        return x.float()
    raise AssertionError(kind)


@pytest.mark.parametrize("kind", ["normal", "cauchy", "lognormal", "mixed"])
@pytest.mark.parametrize("alpha", [0.01, 0.05])
def test_quantile_within_alpha(kind, alpha):
    x = _data(kind)
    sk = LogSketch.from_tensor(x, alpha)
    xs = np.sort(x.numpy().astype(np.float64))
    for q in QS:
        exact = xs[math.floor(q * (xs.size - 1))]
        est = sk.quantile(q)
        assert abs(est - exact) <= alpha * abs(exact) * (1 + 1e-9), (q, est, exact)


def test_counts_and_stores():
    x = torch.tensor([0.0, -0.0, 1.0, 1.0, -2.0, 3.5, -1e-30, 1e30])
    sk = LogSketch.from_tensor(x, 0.01)
    assert sk.count == 8 and sk.zero == 2
    assert int(sk.pos.sum()) == 4 and int(sk.neg.sum()) == 2
    vals, cnts = sk.buckets()
    assert np.all(np.diff(vals) > 0) and int(cnts.sum()) == 8
    # every value is within alpha of its bucket's representative
    for v in x.tolist():
        rep = vals[np.argmin(np.abs(vals - v))]
        assert abs(rep - v) <= 0.01 * abs(v) * (1 + 1e-9)


def test_merged_shards_equal_whole():
    x = _data("mixed", 100_003, seed=3)
    whole = LogSketch.from_tensor(x)
    cuts = [0, 1, 17, 5000, 60_000, 100_003]
    shards = [LogSketch.from_tensor(x[a:b]) for a, b in zip(cuts, cuts[1:])]
    assert shards[0].merge(*shards[1:]) == whole
    assert LogSketch(0.01).merge(*reversed(shards)) == whole
    # 2-D shards of a different layout too
    y = x[:100_000].reshape(400, 250)
    assert LogSketch.from_tensor(y[:, :100]).merge(LogSketch.from_tensor(y[:, 100:])) == \
        LogSketch.from_tensor(y)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.floats(width=32, allow_nan=False, allow_infinity=False), min_size=1, max_size=300),
       st.integers(0, 300))
def test_merge_property_and_backends_agree(values, cut):
    x = torch.tensor(values, dtype=torch.float32)
    cut = min(cut, x.numel())
    whole = LogSketch.from_tensor(x)
    assert LogSketch.from_tensor(x[:cut]).merge(LogSketch.from_tensor(x[cut:])) == whole
    assert LogSketch.from_tensor(x, backend="torch") == whole
    assert whole.count == x.numel()


def test_native_and_torch_backends_agree_on_extremes():
    tiny = torch.tensor([1.4e-45, -1.4e-45, 1.1754942e-38, 1e-40], dtype=torch.float32)
    big = torch.tensor([3.4028235e38, -3.4028235e38, 1e38], dtype=torch.float32)
    x = torch.cat([tiny, big, _data("mixed", 50_000, seed=5)])
    for alpha in (0.001, 0.01, 0.2, 0.5):
        assert LogSketch.from_tensor(x, alpha) == LogSketch.from_tensor(x, alpha, backend="torch")


@pytest.mark.parametrize("alpha", [0.001, 0.002, 0.01, 0.05, 0.5])
def test_native_buckets_exact_at_every_boundary(alpha):
    """The native kernel looks normal values up by cell (exponent + top mantissa bits) and
    compares once: at each bucket boundary (rounded to float32, and one ulp either side), at
    cell edges and for subnormals it must agree with torch's searchsorted on float64."""
    from mvc.quant.sketch import _table

    t = _table(alpha)
    b = t.bounds[(t.bounds > 1e-45) & (t.bounds < 3.4e38)].astype(np.float32)
    k = t.cell_bits
    cell_lo = (np.arange(1 << k, 255 << k, 97, dtype=np.uint32) << np.uint32(23 - k)).view(np.float32)
    vals = np.concatenate([b, np.nextafter(b, np.float32(np.inf)), np.nextafter(b, np.float32(0)),
                           cell_lo, np.nextafter(cell_lo, np.float32(0)),
                           np.array([1e-45, 3e-40, 1.1754942e-38, 1.17549435e-38, 3.4028235e38],
                                    dtype=np.float32)])
    x = torch.from_numpy(np.concatenate([vals, -vals]))
    assert LogSketch.from_tensor(x, alpha) == LogSketch.from_tensor(x, alpha, backend="torch")


@pytest.mark.parametrize("alpha", [0.001, 0.01, 0.5])
def test_float32_bounds_find_the_float64_bounds_buckets(alpha):
    """`bucket_keys` searches float32 bounds rounded down (no float64 copy of the values):
    for every float32 the same bucket as a float64 search of the exact bounds, at each bound
    and one ulp either side, over every exponent and among the subnormals."""
    from mvc.quant.sketch import _table, bucket_keys

    t = _table(alpha)
    b = t.bounds[(t.bounds > 1e-45) & (t.bounds < 3.4e38)].astype(np.float32)
    g = np.random.default_rng(3)
    spread = (g.integers(1, 0x7F800000, 200_000, dtype=np.int64).astype(np.uint32)).view(np.float32)
    vals = np.concatenate([b, np.nextafter(b, np.float32(np.inf)), np.nextafter(b, np.float32(0)),
                           spread, np.array([1e-45, 3e-40, 3.4028235e38], dtype=np.float32)])
    vals = vals[vals > 0]   # zeros have a key of their own
    x = torch.from_numpy(np.concatenate([vals, -vals]))
    want = torch.searchsorted(torch.from_numpy(t.bounds.copy()), x.abs().double())
    want += len(t.bounds) * (x < 0).to(want.dtype)
    got = bucket_keys(x, alpha)
    assert got.dtype == torch.int32 and torch.equal(got.to(torch.int64), want)


def test_subtract_and_abs():
    x = _data("normal", 10_000)
    a, b = LogSketch.from_tensor(x[:3000]), LogSketch.from_tensor(x[3000:])
    assert a.merge(b).subtract(b) == a
    assert LogSketch.from_tensor(x).abs() == LogSketch.from_tensor(x.abs())


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), float("-inf")])
@pytest.mark.parametrize("backend", ["native", "torch"])
def test_non_finite_is_reported_never_binned(bad, backend):
    x = torch.randn(1000)
    x[123] = bad
    with pytest.raises(NonFiniteTensorError, match="layer.weight"):
        LogSketch.from_tensor(x, name="layer.weight", backend=backend)


def test_float64_beyond_float32_range_is_non_finite():
    with pytest.raises(NonFiniteTensorError):
        LogSketch.from_tensor(torch.tensor([1.0, 1e300], dtype=torch.float64))


def test_invalid_arguments():
    with pytest.raises(QuantConfigError):
        LogSketch(alpha=0.0)
    with pytest.raises(QuantConfigError):
        LogSketch.from_tensor(torch.ones(3), alpha=0.9)
    sk = LogSketch.from_tensor(torch.ones(3))
    with pytest.raises(QuantConfigError):
        sk.quantile(1.5)
    with pytest.raises(QuantConfigError):
        LogSketch(0.01).quantile(0.5)
    with pytest.raises(QuantConfigError):
        sk.merge(LogSketch(0.02))


def test_bucket_bounds_split_exactly_along_buckets():
    """Cut at bucket_bound(): the kept values' sketch is a slice of the whole sketch."""
    x = _data("mixed", 50_000, seed=11)
    sk = LogSketch.from_tensor(x)
    mag = sk.abs()
    inf = float("inf")
    cases = [(mag.bucket_bound(0.1), mag.bucket_bound(0.99)), (mag.bucket_bound(0.0), None),
             (None, mag.bucket_bound(0.999)), (None, None), (0.0, inf), (-inf, 0.0), (inf, None),
             (None, -inf)]
    for lo, hi in cases:
        keep = torch.ones_like(x, dtype=torch.bool)
        if lo is not None:
            keep &= x.abs() > lo
        if hi is not None:
            keep &= x.abs() <= hi
        assert sk.restrict_magnitude(lo, hi) == LogSketch.from_tensor(x[keep]), (lo, hi)
    b = mag.bucket_bound(0.5)
    assert b == float(np.float32(b))  # float32-representable
    exact = np.sort(x.abs().numpy())[math.floor(0.5 * (x.numel() - 1))]
    assert exact <= b <= exact * (1 + 2 * 0.01 / 0.99) + 1e-45
    with pytest.raises(QuantConfigError):
        sk.bucket_bound(0.5)  # signed sketch


def test_partitioned_native_sketch_equals_sketch_of_kept_values():
    x = _data("normal", 80_000, seed=2)
    sens = (torch.randn(80_000, generator=torch.Generator().manual_seed(3)) * x).abs()
    part = Partition(prune_t=1e-3, protect_mag_t=0.05, protect_sens_t=0.04, prune_on_sens=True, sens=sens)
    prot = (x.abs() > 0.05) | (sens > 0.04)
    keep = ~prot & ~(sens <= 1e-3)
    assert LogSketch.from_tensor(x, part=part) == LogSketch.from_tensor(x[keep])


def test_native_loghist_checks_its_cell_table_arguments():
    from mvc.native import ffi, lib
    from mvc.quant.sketch import _table

    t = _table(0.01)
    x = np.ones(4, dtype=np.float32)
    counts = np.zeros(2 * len(t.bounds), dtype=np.int64)
    zero = ffi.new("int64_t *", 0)
    args = (ffi.cast("const float *", x.ctypes.data), 4, ffi.NULL,
            ffi.cast("const double *", t.bounds.ctypes.data), len(t.bounds), t.inv_log2_gamma,
            t.first)
    out = (ffi.cast("int64_t *", counts.ctypes.data), zero)
    cp = ffi.cast("const int32_t *", t.cells.ctypes.data)
    assert lib.mvc_loghist_f32(*args, cp, t.cells.size, t.cell_bits, *out) == 0
    assert counts.sum() == 4
    assert lib.mvc_loghist_f32(*args, cp, t.cells.size - 1, t.cell_bits, *out) == -1
    assert lib.mvc_loghist_f32(*args, cp, t.cells.size, t.cell_bits + 1, *out) == -1
    assert lib.mvc_loghist_f32(*args, ffi.NULL, t.cells.size, t.cell_bits, *out) == -1
    assert lib.mvc_loghist_f32(*args, cp, 255 << 24, 24, *out) == -1
    # a wrong table is clamped inside the buffers (counts stay in range), never read past
    bogus = np.full(t.cells.size, 1 << 30, dtype=np.int32)
    assert lib.mvc_loghist_f32(*args, ffi.cast("const int32_t *", bogus.ctypes.data),
                               bogus.size, t.cell_bits, *out) == 0
    assert counts.sum() == 8
