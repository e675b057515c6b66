"""Byte-plane split/merge against the numpy reference."""
from __future__ import annotations

import numpy as np
import pytest
import reference_coders as ref
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from mvc.native import byteplane
from mvc.native.status import NativeArgumentError

LAYOUTS = [(byteplane.F16, 2), (byteplane.BF16, 2), (byteplane.F32, 4), (byteplane.F64, 8),
           (byteplane.BYTES, 1), (byteplane.BYTES, 2), (byteplane.BYTES, 3), (byteplane.BYTES, 8)]


@settings(max_examples=80, deadline=None)
@given(st.sampled_from(LAYOUTS), st.integers(0, 300), st.binary(min_size=2400, max_size=2400))
def test_split_matches_reference_and_merge_inverts(layout_item, n, pool):
    layout, item = layout_item
    raw = pool[: n * item]
    planes = byteplane.split(raw, layout, item)
    assert planes.shape == (item, n)
    assert np.array_equal(planes, ref.split_planes(raw, layout, item))
    assert byteplane.merge(planes, layout, item).tobytes() == raw
    assert ref.merge_planes(planes, layout, item) == raw


def test_plane_zero_is_the_exponent():
    x = torch.tensor([1.0, -2.0, 0.5, -0.0], dtype=torch.float32)
    planes = byteplane.split(x.numpy().tobytes(), byteplane.F32, 4)
    assert planes[0].tolist() == [127, 128, 126, 0]  # biased exponents; sign moved away
    assert planes[3].tolist() == [0, 1, 0, 1]         # sign in the lowest bit
    b = torch.tensor([1.0, -2.0], dtype=torch.bfloat16)
    planes = byteplane.split(b.view(torch.uint8).numpy().tobytes(), byteplane.BF16, 2)
    assert planes[0].tolist() == [127, 128]


def test_invalid_layouts():
    with pytest.raises(NativeArgumentError):
        byteplane.nplanes(byteplane.F32, 2)
    with pytest.raises(NativeArgumentError):
        byteplane.nplanes(99, 4)
    with pytest.raises(ValueError):
        byteplane.split(b"\x00" * 5, byteplane.F32, 4)


def test_raw_entry_points_check_the_plane_table_length():
    # The pointer table's length is an argument: a table one plane short is refused, not
    # read past its end (ASan would report the read in the sanitizer run).
    from mvc.native import ffi, lib
    from mvc.native.status import ERR_ARG

    n = 16
    src = np.arange(4 * n, dtype=np.uint8)
    planes = np.zeros((4, n), dtype=np.uint8)
    with ffi.from_buffer("uint8_t[]", planes, require_writable=True) as base, \
            ffi.from_buffer("uint8_t[]", src) as sp:
        short = ffi.new("uint8_t *[]", [base + p * n for p in range(3)])
        assert lib.mvc_bp_split(sp, n, byteplane.F32, 4, short, 3) == ERR_ARG
        assert lib.mvc_bp_merge(short, 3, n, byteplane.F32, 4, base) == ERR_ARG
        full = byteplane.plane_pointers(base, n, 4)
        assert lib.mvc_bp_split(sp, n, byteplane.F32, 4, full, 5) == ERR_ARG
        assert lib.mvc_bp_split(sp, n, byteplane.F32, 4, full, 4) == 0
