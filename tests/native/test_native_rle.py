"""Sign-trick RLE and the fused RLE+Huffman coder: references, formats, hostile input."""
from __future__ import annotations

import numpy as np
import pytest
import reference_coders as ref
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mvc.native import rle
from mvc.native.status import NativeArgumentError, NativeDecodeError

SETTINGS = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
DTYPES = [np.uint8, np.uint16, np.int32]


@st.composite
def level_deltas(draw, max_size: int = 3000):
    """Cyclic level deltas: mostly zero, changes +-1 mod B in bursts, rare big values."""
    dtype = draw(st.sampled_from(DTYPES))
    n = draw(st.integers(0, max_size))
    top = {np.uint8: 256, np.uint16: 65536, np.int32: 2**31}[dtype]
    b = draw(st.sampled_from([2, 16, 256, 65536, 2**31]).filter(lambda b: b <= top))
    p_change = draw(st.sampled_from([0.0, 0.001, 0.05, 0.3, 1.0]))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    burst = np.repeat(rng.random(max(1, n // 50 + 1)) < 0.3, 50)[:n]
    change = rng.random(n) < np.where(burst, min(1.0, p_change * 10), p_change)
    step = np.where(rng.random(n) < 0.5, 1, b - 1)
    big = rng.integers(0, b, n)
    values = np.where(change, np.where(rng.random(n) < 0.05, big, step), 0) % b
    return values.astype(dtype)


@SETTINGS
@given(level_deltas())
def test_tokens_match_reference(values):
    tokens = rle.encode(values)
    assert np.array_equal(tokens, ref.rle_encode(values))
    assert tokens.size <= values.size
    assert np.array_equal(rle.decode(tokens, values.size, values.dtype), values)


@SETTINGS
@given(level_deltas())
def test_fused_round_trip_and_reference_decoder(values):
    enc = rle.encode_huffman(values)
    assert np.array_equal(rle.decode_huffman(enc, values.size, values.dtype), values)
    assert np.array_equal(ref.rle_huffman_decode(enc, values.size), values.astype(np.int64))


def test_paper_example_and_long_runs():
    values = np.array([0, 5, 5, 5, 0, 0, 7], np.uint8)
    assert rle.encode(values).tolist() == [0, -5, 3, 0, 2, -7]
    for n in [16, 17, 31, 32, 1000, 123457]:  # around the run-class boundaries
        v = np.zeros(n, np.uint16)
        v[-1] = 65535
        assert np.array_equal(rle.decode_huffman(rle.encode_huffman(v), n, np.uint16), v)
    big = np.array([2**31 - 1] * 5 + [70000, 0, 64, 63], np.int32)  # escapes and value-only symbols
    assert np.array_equal(rle.decode_huffman(rle.encode_huffman(big), big.size, np.int32), big)


def test_compresses_sparse_streams():
    rng = np.random.default_rng(0)
    v = np.where(rng.random(200_000) < 0.01, np.where(rng.random(200_000) < 0.5, 1, 15), 0)
    enc = rle.encode_huffman(v.astype(np.uint8))
    assert len(enc) < 200_000 / 50  # >= 50x on 99% zeros (entropy bound is ~87x)


def test_other_integer_dtypes_and_errors():
    v = np.array([0, 0, 3, 3, 3], np.int64)
    assert np.array_equal(rle.decode(rle.encode(v), 5), v)
    with pytest.raises(NativeArgumentError):
        rle.encode(np.array([0, -1], np.int32))
    with pytest.raises(NativeArgumentError):
        rle.encode_huffman(np.array([0.5]))
    with pytest.raises(NativeArgumentError):
        rle.decode_huffman(b"", 1, np.float32)
    with pytest.raises(NativeDecodeError):  # values do not fit the requested dtype
        rle.decode_huffman(rle.encode_huffman(np.array([300], np.uint16)), 1, np.uint8)
    with pytest.raises(NativeDecodeError):
        rle.decode(np.array([5], np.int32), 5)  # run with no value before it
    with pytest.raises(NativeDecodeError):
        rle.decode(np.array([0, 1], np.int32), 1)  # run length 1 is never written
    with pytest.raises(NativeDecodeError):
        rle.decode(np.array([0, 2], np.int32), 1)  # overflows the declared count
    with pytest.raises(NativeDecodeError):
        rle.decode(np.array([-300], np.int32), 1, np.uint8)


def _decode_or_codec_error(data: bytes, n: int, dtype) -> None:
    try:
        out = rle.decode_huffman(data, n, dtype)
    except NativeDecodeError:
        return
    assert out.size == n


@SETTINGS
@given(st.binary(max_size=300), st.integers(0, 3000), st.sampled_from(DTYPES))
def test_random_input_never_crashes(data, n, dtype):
    _decode_or_codec_error(data, n, dtype)


@SETTINGS
@given(st.lists(st.integers(-(2**31), 2**31 - 1), max_size=50), st.integers(0, 500))
def test_random_tokens_never_crash(tokens, n):
    try:
        out = rle.decode(np.array(tokens, np.int32), n, np.uint16)
    except NativeDecodeError:
        return
    assert out.size == n


@SETTINGS
@given(level_deltas(max_size=2000), st.data())
def test_truncation_and_bit_flips(values, draw):
    enc = rle.encode_huffman(values)
    if not enc:
        return
    cut = draw.draw(st.integers(0, len(enc) - 1))
    with pytest.raises(NativeDecodeError):
        rle.decode_huffman(enc[:cut], values.size, values.dtype)
    flipped = bytearray(enc)
    bit = draw.draw(st.integers(0, 8 * len(enc) - 1))
    flipped[bit >> 3] ^= 1 << (bit & 7)
    _decode_or_codec_error(bytes(flipped), values.size, values.dtype)


def test_hostile_counts_are_bounded_by_n():
    # header claims 10**9 symbols for a 10-value array: refused before allocating.
    hostile = b"\x02" + b"\x80\x94\xeb\xdc\x03" + b"\x00\x00\x00"
    with pytest.raises(NativeDecodeError):
        rle.decode_huffman(hostile, 10, np.uint8)
