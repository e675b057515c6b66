"""The SIMD forms of the native kernels (AVX2, AVX-512, where this CPU has them) write the same
bytes as the plain C ones: byte-plane merges at every alignment, rANS decodes, whole lossless
tensors, level dequantization (and the level census beside it).  `simd.capped` runs each lower form on this machine."""
from __future__ import annotations

import numpy as np
import pytest
import reference_coders as ref
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mvc.codecs.lossless import LosslessCodec
from mvc.native import byteplane, ffi, lib, rans, simd
from mvc.native.status import NativeArgumentError

LEVELS = simd.available()
MERGED = [(byteplane.F32, 4), (byteplane.BF16, 2), (byteplane.F16, 2)]


def _merge_at(planes: np.ndarray, layout: int, item: int, offset: int) -> bytes:
    """Merge into a buffer `offset` bytes past a 64-byte boundary (the SIMD forms align their
    stores, so every head length and a misaligned destination are exercised)."""
    n = planes.shape[1]
    buf = np.zeros(n * item + 128, np.uint8)
    base = (-buf.ctypes.data) % 64 + offset
    k = planes.shape[0]
    planes = np.ascontiguousarray(planes)
    with ffi.from_buffer("uint8_t[]", planes) as p, ffi.from_buffer("uint8_t[]", buf, require_writable=True) as d:
        rc = lib.mvc_bp_merge(byteplane.plane_pointers(p, n, k), k, n, layout, item, d + base)
    assert rc == 0
    return buf[base:base + n * item].tobytes()


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.sampled_from(MERGED), st.integers(0, 400), st.integers(0, 63),
       st.binary(min_size=1600, max_size=1600))
def test_every_level_merges_the_reference_bytes(layout_item, n, offset, pool):
    layout, item = layout_item
    raw = pool[: n * item]
    planes = ref.split_planes(raw, layout, item)
    for lv in LEVELS:
        with simd.capped(lv):
            assert _merge_at(planes, layout, item, offset) == raw, (lv, offset)


def test_every_level_decodes_rans_alike():
    data = (127 - np.random.default_rng(3).geometric(0.45, 50_000)).astype(np.uint8)
    enc = rans.encode(data)
    for lv in LEVELS:
        with simd.capped(lv):
            assert np.array_equal(rans.decode(enc, data.size), data)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_every_level_restores_lossless_tensors_bit_identically(dtype):
    g = torch.Generator().manual_seed(7)
    t = (torch.randn(300_001, generator=g) * torch.rand(300_001, generator=g) * 0.05).to(dtype)
    codec = LosslessCodec()
    e = codec.encode(t)
    for lv in LEVELS:
        with simd.capped(lv):
            back = codec.decode(e.meta, e.parts[0], dtype, tuple(t.shape))
        assert torch.equal(back.view(torch.uint8), t.view(torch.uint8)), lv


def test_levels_and_the_cap():
    assert LEVELS[0] == 0 and set(LEVELS) <= {0, 2, 3}
    assert simd.level() == LEVELS[-1]
    with simd.capped(0):
        assert simd.level() == 0 and rans.kernels() == [1]
    assert simd.level() == LEVELS[-1]
    with pytest.raises(NativeArgumentError):
        with simd.capped(1):
            pass
    assert simd.level() == LEVELS[-1]


def _dequant_reference(levels: np.ndarray, table: np.ndarray, protected: np.ndarray) -> np.ndarray | None:
    if levels.size and int(levels.max()) >= table.size:
        return None
    plevel = table.size - 1
    out = table[levels.astype(np.int64)].copy()
    where = np.flatnonzero(levels == plevel)
    if where.size != protected.size:
        return None
    out[where] = protected
    return out


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.integers(0, 300), st.integers(1, 256), st.sampled_from([np.uint16, np.uint32, np.uint64]),
       st.integers(-1, 1), st.booleans(), st.integers(0, 2**32 - 1))
def test_every_level_dequantizes_as_the_reference(n, n_table, dtype, prot_skew, out_of_range, seed):
    """Byte levels into 2/4/8-byte values: the AVX-512 form (gather plus an expanding load of
    the protected values) and the plain loop agree, on good parts and on inconsistent ones
    (a level outside the table, one protected value too many or too few)."""
    from mvc.quant._kernels import dequant

    rng = np.random.default_rng(seed)
    levels = rng.integers(0, n_table, n).astype(np.uint8)
    if out_of_range and n and n_table < 256:
        levels[rng.integers(0, n)] = rng.integers(n_table, 256)
    table = rng.integers(0, np.iinfo(dtype).max, n_table, dtype=dtype)
    n_prot = max(0, int((levels == n_table - 1).sum()) + prot_skew)
    protected = rng.integers(0, np.iinfo(dtype).max, n_prot, dtype=dtype)
    want = _dequant_reference(levels, table, protected)
    signed = np.dtype(dtype).str.replace("u", "i")  # torch has no uint32/uint64 tensors to view
    for lv in LEVELS:
        with simd.capped(lv):
            got = dequant(torch.from_numpy(levels), torch.from_numpy(table.view(signed)),
                          torch.from_numpy(protected.view(signed)))
        if want is None:
            assert got is None, lv
        else:
            assert got is not None and np.array_equal(got.numpy().view(dtype), want), lv


def test_every_level_counts_levels_alike():
    from mvc.quant._kernels import level_census

    rng = np.random.default_rng(9)
    lv = np.where(rng.random(100_003) < 0.6, 3, rng.integers(0, 7, 100_003)).astype(np.uint8)
    want = np.bincount(lv, minlength=7)
    assert np.array_equal(level_census(torch.from_numpy(lv), 7).numpy(), want)
    assert level_census(torch.from_numpy(lv), 6) is None  # level 6 is out of range
    big = np.full(3, 200, np.uint8)
    assert np.array_equal(level_census(torch.from_numpy(big), 300).numpy()[200], 3)


@settings(max_examples=50, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.integers(0, 700), st.sampled_from([1, 2, 7, 15, 16, 17, 31, 62, 120, 253]),
       st.booleans(), st.booleans(), st.integers(0, 2**32 - 1))
def test_every_level_assigns_the_same_levels_and_stats(n, n_mids, partition, odd_values, seed):
    """Nearest-centroid assignment (the comparison sweep for few midpoints, the binary search
    for many) gives the same levels, protected count, error sums and level counts at every SIMD
    level, values on a midpoint, NaN and infinities included."""
    from mvc.quant._kernels import AssignStats, Partition, assign_into

    rng = np.random.default_rng(seed)
    mids = np.sort(rng.standard_normal(n_mids).astype(np.float32))
    x = rng.standard_normal(n).astype(np.float32)
    if odd_values and n >= 4:
        x[:4] = [np.nan, np.inf, -np.inf, mids[0]]
    k = n_mids + 1
    part = Partition(prune_t=0.3, protect_mag_t=2.0) if partition else None
    table = torch.from_numpy(np.concatenate([rng.standard_normal(k), [0.0, 0.0]]).astype(np.float32))
    results = []
    for lv in LEVELS:
        out = torch.empty(n, dtype=torch.uint8)
        stats = AssignStats(table=table)
        with simd.capped(lv):
            n_prot = assign_into(torch.from_numpy(x), torch.from_numpy(mids), out, part, k, stats)
        results.append((out.numpy().copy(), n_prot, np.asarray(stats.sums).copy(),
                        np.asarray(stats.counts).copy()))
    for got in results[1:]:
        assert np.array_equal(got[0], results[0][0]) and got[1] == results[0][1]
        assert np.array_equal(got[2], results[0][2], equal_nan=True)
        assert np.array_equal(got[3], results[0][3])
