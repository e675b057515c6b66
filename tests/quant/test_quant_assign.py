"""Native assignment kernel == torch.bucketize, exactly (ties at midpoints included)."""
from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings, strategies as st

from mvc.quant import QuantConfigError, assign, level_dtype
from mvc.quant._kernels import Partition, assign_into, level_sums
from mvc.quant.assign import level_means, midpoints

f32 = st.floats(width=32, allow_nan=False, allow_infinity=False)
SETTINGS = settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def _with_ties(values: list[float], mids: torch.Tensor) -> torch.Tensor:
    """The values plus every midpoint and its float32 neighbours (tie cases)."""
    m = mids.numpy()
    with np.errstate(over="ignore"):  # neighbours of +-float32 max are +-inf: dropped below
        up, down = np.nextafter(m, np.float32(np.inf)), np.nextafter(m, np.float32(-np.inf))
    extra = np.concatenate([m, up, down, np.array([0.0, -0.0], np.float32)])
    extra = extra[np.isfinite(extra)]
    return torch.cat([torch.tensor(values, dtype=torch.float32), torch.from_numpy(extra.astype(np.float32))])


@SETTINGS
@given(st.lists(f32, min_size=1, max_size=300), st.lists(f32, min_size=1, max_size=40))
def test_native_assign_equals_bucketize(values, cents):
    centroids = torch.sort(torch.tensor(cents, dtype=torch.float32)).values
    x = _with_ties(values, midpoints(centroids))
    ref = torch.bucketize(x, midpoints(centroids), right=False)
    got = assign(x, centroids, backend="native")
    assert got.dtype == level_dtype(centroids.numel())
    assert torch.equal(got.long(), ref)
    assert torch.equal(assign(x, centroids, backend="torch").long(), ref)


@SETTINGS
@given(st.lists(f32, min_size=0, max_size=200), st.lists(f32, min_size=0, max_size=300),
       st.sampled_from([torch.uint8, torch.int16]))
def test_kernel_on_raw_midpoints_with_duplicates(values, mids, dtype):
    """Any sorted midpoint table (duplicates, signed zeros) on both search strategies."""
    limit = 253 if dtype == torch.uint8 else 32765
    m = torch.sort(torch.tensor(mids[:limit], dtype=torch.float32)).values
    x = _with_ties(values, m) if m.numel() else torch.tensor(values, dtype=torch.float32)
    out = torch.empty(x.numel(), dtype=dtype)
    assign_into(x, m, out)
    assert torch.equal(out.long(), torch.bucketize(x, m, right=False))


@pytest.mark.parametrize("k", [1, 2, 3, 5, 16, 17, 31, 200, 254, 255, 300, 1000])
def test_many_sizes_large_input(k):
    g = torch.Generator().manual_seed(k)
    x = torch.randn(600_001, generator=g)  # > 2 threads' worth of chunks
    c = torch.sort(torch.randn(k, generator=g)).values
    ref = torch.bucketize(x, midpoints(c), right=False)
    got = assign(x, c)
    assert got.dtype == level_dtype(k) and torch.equal(got.long(), ref)


def test_partition_applied_in_kernel_matches_masks():
    g = torch.Generator().manual_seed(1)
    x = torch.randn(50_000, generator=g)
    sens = (torch.randn(50_000, generator=g) * x).abs()
    c = torch.sort(torch.randn(7, generator=g)).values
    part = Partition(prune_t=0.3, protect_mag_t=2.5, protect_sens_t=2.0, prune_on_sens=True, sens=sens)
    got = assign(x, c, part=part).long()
    ref = torch.bucketize(x, midpoints(c), right=False)
    prot = (x.abs() > 2.5) | (sens > 2.0)
    ref[(sens <= 0.3) & ~prot] = 7
    ref[prot] = 8
    assert torch.equal(got, ref)


def test_level_sums_match_torch_and_are_thread_independent():
    g = torch.Generator().manual_seed(2)
    x = torch.randn(300_000, generator=g)
    lv = torch.randint(0, 12, (300_000,), generator=g, dtype=torch.uint8)
    s, c = level_means(x, lv, 10)
    ref_c = torch.bincount(lv.long(), minlength=12)[:10]
    assert torch.equal(c, ref_c)
    keep = lv.long() < 10
    ref_s = torch.bincount(lv.long()[keep], weights=x.double()[keep], minlength=10)
    assert torch.allclose(s, ref_s, rtol=1e-12, atol=1e-9)
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        s1, _ = level_sums(x, lv, 10)
    finally:
        torch.set_num_threads(threads)
    assert torch.equal(s1, s)


def test_bad_arguments():
    with pytest.raises(QuantConfigError):
        assign(torch.ones(3, dtype=torch.float64), torch.ones(2))
    with pytest.raises(QuantConfigError):
        assign(torch.ones(3), torch.ones(0))
    with pytest.raises(QuantConfigError):
        assign(torch.ones(3), torch.ones(300), dtype=torch.uint8)
    with pytest.raises(QuantConfigError):
        assign(torch.ones(3), torch.ones(3), backend="gpu")
    with pytest.raises(QuantConfigError):
        assign(torch.ones(3), torch.ones(40_000), backend="native")
