"""rANS byte blocks: round trips, the documented format, near-entropy size, hostile input."""
from __future__ import annotations

import numpy as np
import pytest
import reference_coders as ref
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mvc.native import huffman, rans
from mvc.native.status import NativeDecodeError

SETTINGS = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@st.composite
def skewed_bytes(draw, max_size: int = 3000):
    n = draw(st.integers(0, max_size))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    k = draw(st.integers(1, 256))
    alphabet = rng.choice(256, size=k, replace=False)
    w = rng.pareto(draw(st.sampled_from([0.3, 1.0, 3.0])), size=k) + 1e-4
    return rng.choice(alphabet, size=n, p=w / w.sum()).astype(np.uint8)


@SETTINGS
@given(skewed_bytes())
def test_round_trip_and_reference_decoder(data):
    enc = rans.encode(data)
    assert np.array_equal(rans.decode(enc, data.size), data)
    assert np.array_equal(ref.rans_decode_block(enc, data.size), data)


def test_near_entropy_and_better_than_huffman_on_exponents():
    rng = np.random.default_rng(0)
    exps = (127 - rng.geometric(0.45, 200_000)).astype(np.uint8)  # float-exponent-like
    enc = rans.encode(exps)
    assert enc[0] == rans.MODE
    assert len(enc) * 8 <= ref.entropy_bits(exps) * 1.005 + 1200
    assert len(enc) < 0.99 * len(huffman.encode(exps))


def test_falls_back_for_constant_input():
    data = np.full(1000, 9, np.uint8)
    enc = rans.encode(data)
    assert enc[0] == 1 and np.array_equal(rans.decode(enc, 1000), data)


def _decode_or_codec_error(block: bytes, n: int) -> None:
    try:
        out = rans.decode(block, n)
    except NativeDecodeError:
        return
    assert out.size == n


@SETTINGS
@given(skewed_bytes(max_size=2000), st.data())
def test_truncation_flips_and_random_input(data, draw):
    enc = rans.encode(data)
    if not enc:
        return
    cut = draw.draw(st.integers(0, len(enc) - 1))
    with pytest.raises(NativeDecodeError):
        rans.decode(enc[:cut], data.size)
    flipped = bytearray(enc)
    bit = draw.draw(st.integers(0, 8 * len(enc) - 1))
    flipped[bit >> 3] ^= 1 << (bit & 7)
    _decode_or_codec_error(bytes(flipped), data.size)
    _decode_or_codec_error(b"\x04" + draw.draw(st.binary(max_size=300)), data.size)


def test_hostile_tables_are_rejected():
    for block in [b"\x04\x01", b"\x04\x02\x00\xff\x1f\x00\xff\x1f", b"\x04\x02\x00\x00\x00\x00"]:
        with pytest.raises(NativeDecodeError):
            rans.decode(block, 10)
    with pytest.raises(NativeDecodeError):
        rans.decode(b"\x04" + bytes(100), 10**6)
