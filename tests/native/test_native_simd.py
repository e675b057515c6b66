"""The SIMD forms of the native kernels (AVX2, AVX-512, where this CPU has them) write the same
bytes as the plain C ones: byte-plane merges at every alignment, rANS decodes, whole lossless
tensors.  `simd.capped` runs each lower form on this machine."""
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
