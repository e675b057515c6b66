"""lossless/1: bit-exact round trips of every dtype, the documented payload, hostile payloads."""
from __future__ import annotations

import struct

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import reference_coders as ref
from mvc.codecs import get_codec
from mvc.codecs.base import CodecError, tensor_bytes
from mvc.codecs.lossless import LosslessCodec
from mvc.native import byteplane, rans

SETTINGS = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
CODEC = get_codec("lossless/1")
SMALL = LosslessCodec(segment=97)  # many segments on small tensors
MID = LosslessCodec(segment=5000)  # segments big enough for rANS exponent blocks

DTYPES = [torch.float32, torch.float16, torch.bfloat16, torch.float64, torch.complex64,
          torch.complex128, torch.int8, torch.uint8, torch.int16, torch.int32, torch.int64,
          torch.bool, torch.float8_e4m3fn, torch.float8_e5m2]


def make(dtype: torch.dtype, shape: tuple[int, ...], seed: int = 0, peaked: bool = False) -> torch.Tensor:
    """Random data of `dtype`; `peaked` floats have 3/4 of their exponents equal,
    the distribution on which exponent planes get rANS blocks."""
    g = torch.Generator().manual_seed(seed)
    if peaked and dtype.is_floating_point:
        base = torch.randn(shape, dtype=torch.float64, generator=g)
        ones = 1.0 + torch.rand(shape, dtype=torch.float64, generator=g) * 0.5
        return torch.where(torch.rand(shape, generator=g) < 0.75, ones, base).to(dtype)
    if dtype == torch.bool:
        return torch.rand(shape, generator=g) > 0.5
    if dtype.is_complex:
        return (torch.randn(shape, dtype=torch.complex128, generator=g) * 0.05).to(dtype)
    if dtype.is_floating_point:
        return (torch.randn(shape, dtype=torch.float64, generator=g) * 0.05).to(dtype)
    return torch.randint(0, 100, shape, generator=g).to(dtype)


def payload_of(codec, t: torch.Tensor):
    enc = codec.encode(t)
    return enc.meta, b"".join(bytes(p) for p in enc.parts)


def same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.dtype == b.dtype and a.shape == b.shape and bytes(tensor_bytes(a.contiguous())) == bytes(
        tensor_bytes(b.contiguous()))


@SETTINGS
@given(st.sampled_from(DTYPES), st.lists(st.integers(0, 40), max_size=3), st.integers(0, 99),
       st.booleans())
def test_round_trip_every_dtype(dtype, shape, seed, small_segments):
    codec = SMALL if small_segments else CODEC
    t = make(dtype, tuple(shape), seed)
    meta, payload = payload_of(codec, t)
    back = codec.decode(meta, payload, dtype, tuple(shape))
    assert same_bits(back, t)


def test_a_peaked_float64_exponent_plane_round_trips():
    """Regression (hypothesis's find): this tensor's exponent plane is 88% one value, a
    frequency at which the rANS encoder's inexact division wrote a block that never decoded."""
    t = make(torch.float64, (39, 40, 40), 40)
    meta, payload = payload_of(CODEC, t)
    assert same_bits(CODEC.decode(meta, payload, t.dtype, tuple(t.shape)), t)


def test_special_values_round_trip():
    specials = torch.tensor([0.0, -0.0, float("inf"), float("-inf"), float("nan"), 1e-45, -3e38])
    nan_payload = torch.tensor([0x7FC00001, 0xFFFFFFFF], dtype=torch.int64).to(torch.int32).view(torch.float32)
    for t in [specials, nan_payload, specials.to(torch.bfloat16), specials.to(torch.float16),
              specials.to(torch.float64)]:
        meta, payload = payload_of(SMALL, t)
        assert same_bits(SMALL.decode(meta, payload, t.dtype, tuple(t.shape)), t)


def test_non_contiguous_and_zero_dim():
    t = make(torch.float32, (30, 40)).t()
    meta, payload = payload_of(CODEC, t)
    assert torch.equal(CODEC.decode(meta, payload, t.dtype, (40, 30)), t)
    s = torch.tensor(3.5, dtype=torch.bfloat16)
    meta, payload = payload_of(CODEC, s)
    assert same_bits(CODEC.decode(meta, payload, s.dtype, ()), s)


@pytest.mark.parametrize("segment,n", [(97, 1000), (5000, 12000)])
def test_payload_matches_documented_format(segment, n):
    """Rebuild the tensor from the payload with the Python references alone
    (the 5000-element segments put rANS blocks in plane 0)."""
    codec = LosslessCodec(segment=segment)
    t = make(torch.float32, (n,), seed=5, peaked=segment >= 4096)
    meta, payload = payload_of(codec, t)
    assert meta == {"layout": "f32", "item": 4, "seg": segment}
    raw = bytes(tensor_bytes(t))
    pos, rebuilt, modes = 0, b"", set()
    for start in range(0, n, segment):
        cnt = min(segment, n - start)
        lengths = struct.unpack_from("<4I", payload, pos)
        pos += 16
        planes = []
        for p, ln in enumerate(lengths):
            region = payload[pos:pos + ln]
            modes.add((p, region[0]))
            if p == 0:
                planes.append(ref.rans_decode_block(region, cnt))
            elif p == 1:  # coded conditionally on the exponent plane
                planes.append(ref.ctx_decode_block(region, planes[0]))
            else:
                planes.append(ref.huf_decode_block(region, cnt, 1))
            pos += ln
        rebuilt += ref.merge_planes(np.stack(planes), byteplane.F32, 4)
    assert pos == len(payload) and rebuilt == raw
    if segment >= 4096:
        assert (0, rans.MODE) in modes


def test_compresses_float_weights_and_stores_mantissa_raw():
    t = make(torch.float32, (200_000,), seed=1)
    meta, payload = payload_of(CODEC, t)
    assert len(payload) < 0.85 * t.numel() * 4          # exponent plane ~2.7 bits instead of 8
    b = t.to(torch.bfloat16)
    meta, payload_b = payload_of(CODEC, b)
    assert len(payload_b) < 0.70 * b.numel() * 2
    zeros = torch.zeros(100_000, dtype=torch.int64)
    assert len(payload_of(CODEC, zeros)[1]) < 100      # constant planes


def test_rans_exponents_on_demand_are_smaller_and_exact():
    t = make(torch.float32, (300_000,), seed=3)
    meta, huffman_only = payload_of(LosslessCodec(rans_saving=1.0), t)
    ratio_first = LosslessCodec(rans_saving=0.0)
    meta_r, small = payload_of(ratio_first, t)
    assert len(small) < len(huffman_only)
    assert len(payload_of(CODEC, t)[1]) <= len(huffman_only)
    assert torch.equal(CODEC.decode(meta_r, small, t.dtype, (300_000,)), t)
    with pytest.raises(Exception):
        LosslessCodec(rans_saving=2.0)


def test_bf16_exponents_default_to_huffman_and_f32_to_rans_where_smaller():
    """bfloat16 keeps Huffman exponents by default (decode and encode speed; its ratio stays
    over ZipNN's), float32 takes rANS where it is smaller; both are what the explicit
    settings write, and both restore exactly."""
    b = make(torch.bfloat16, (300_000,), seed=4)
    assert payload_of(CODEC, b)[1] == payload_of(LosslessCodec(rans_saving=1.0), b)[1]
    meta, rans_b = payload_of(LosslessCodec(rans_saving=0.0), b)
    assert len(rans_b) < len(payload_of(CODEC, b)[1])        # what bf16 gives up
    assert torch.equal(CODEC.decode(meta, rans_b, b.dtype, (300_000,)), b)  # old data reads
    f = make(torch.float32, (300_000,), seed=4)
    assert payload_of(CODEC, f)[1] == payload_of(LosslessCodec(rans_saving=0.0), f)[1]


def test_meta_and_shape_mismatch_are_codec_errors():
    t = make(torch.float32, (500,))
    meta, payload = payload_of(CODEC, t)
    with pytest.raises(CodecError):
        CODEC.decode(meta, payload, torch.float16, (500,))
    with pytest.raises(CodecError):
        CODEC.decode({**meta, "seg": 0}, payload, torch.float32, (500,))
    with pytest.raises(CodecError):
        CODEC.decode({**meta, "seg": 2**40}, payload, torch.float32, (500,))
    with pytest.raises(CodecError):
        CODEC.decode(meta, payload, torch.float32, (501,))
    with pytest.raises(CodecError):
        CODEC.decode(meta, payload, torch.float32, (499,))
    with pytest.raises(CodecError):
        CODEC.decode(meta, payload + b"\x00", torch.float32, (500,))
    with pytest.raises(CodecError):  # a huge declared shape fails on the payload, allocating nothing
        CODEC.decode(meta, payload, torch.float32, (10**12,))
    with pytest.raises(CodecError):
        CODEC.decode(meta, b"x", torch.float32, (0,))


@SETTINGS
@given(st.sampled_from([torch.float32, torch.bfloat16, torch.int32]), st.booleans(), st.data())
def test_truncated_and_flipped_payloads(dtype, rans_segments, draw):
    codec, n = (MID, 6000) if rans_segments else (SMALL, 300)
    t = make(dtype, (n,), seed=draw.draw(st.integers(0, 9)), peaked=rans_segments)
    meta, payload = payload_of(codec, t)
    cut = draw.draw(st.integers(0, len(payload) - 1))
    with pytest.raises(CodecError):
        codec.decode(meta, payload[:cut], dtype, (n,))
    flipped = bytearray(payload)
    bit = draw.draw(st.integers(0, 8 * len(payload) - 1))
    flipped[bit >> 3] ^= 1 << (bit & 7)
    try:
        out = codec.decode(meta, bytes(flipped), dtype, (n,))
    except CodecError:
        return
    assert out.shape == (n,)  # flips inside raw planes decode; the store's hash catches them


@SETTINGS
@given(st.binary(max_size=600), st.integers(0, 400))
def test_random_payloads_never_crash(payload, n):
    try:
        SMALL.decode({"layout": "f32", "item": 4, "seg": 97}, payload, torch.float32, (n,))
    except CodecError:
        pass


@pytest.mark.filterwarnings("ignore::UserWarning")
def test_registered_and_rejects_quantized():
    assert CODEC.name == "lossless/1" and CODEC.lossless
    q = torch.quantize_per_tensor(torch.rand(4), 0.1, 0, torch.quint8)
    with pytest.raises(Exception) as exc:
        CODEC.encode(q)
    assert getattr(exc.value, "exit_code", None) == 50


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_tensor_encodes():  # pragma: no cover - CPU CI
    t = make(torch.float32, (1000,)).cuda()
    meta, payload = payload_of(CODEC, t)
    assert torch.equal(CODEC.decode(meta, payload, t.dtype, (1000,)), t.cpu())
