"""The encoders" exact bytes, pinned: speed work on the native coders must not change what is stored.

Each case encodes a fixed, seeded input and compares the SHA-256 of the output with the value
the coders produced before their encoders were restructured (one histogram per plane, the
Huffman block planned before it is written, rANS states in registers, chunked byte-plane
split).  A deliberate change of an encoder"s choices updates these constants and says why:
rANS mode 5 (32 states of 32 bits, 16-bit words, decoded with SIMD gathers) replaced mode 4
on 2026-11-27, which changed every case with rANS exponent blocks ("f32", "f32 sq", "bf16",
"f16", "f64", "rans", "rans ragged"); mode-4 blocks still decode (test_native_rans_legacy.py).
The RLE+Huffman cases (a quantized delta's streams) were pinned before the run scan found a run's
end from the XOR of eight bytes (2026-11-28), and did not move.
"""
from __future__ import annotations

import hashlib

import numpy as np
import pytest
import torch

from mvc.codecs.lossless import LosslessCodec
from mvc.native import ffi, huffman, lib, rans, rle


def _floats(n: int, seed: int) -> torch.Tensor:
    """Weight-like floats (a narrow normal) with a zeroed stretch, the case constant blocks take."""
    rng = np.random.default_rng(seed)
    x = (rng.standard_normal(n) * 0.02).astype(np.float32)
    x[n // 3: n // 3 + 5000] = 0
    return torch.from_numpy(x)


def _skewed(n: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return (127 - rng.geometric(0.45, n)).astype(np.uint8)  # float-exponent-like


def _lossless(t: torch.Tensor, **kw) -> bytes:
    return b"".join(bytes(p) for p in LosslessCodec(**kw).encode(t).parts)


def _ctx_block(ctx: np.ndarray, val: np.ndarray, permille: int) -> bytes:
    return bytes(huffman.encode_ctx_block(ffi.from_buffer("uint8_t[]", ctx), ffi.from_buffer("uint8_t[]", val),
                                          val.size, permille))


def _fallback_input() -> tuple[np.ndarray, np.ndarray]:
    """Context bytes that say nothing about values that Huffman codes 2.2% smaller: the eight
    class tables cost more than conditioning gains, so the context coder writes a plain block."""
    rng = np.random.default_rng(4)
    ctx = rng.integers(0, 256, 6000).astype(np.uint8)
    return ctx, rng.integers(0, 200, 6000).astype(np.uint8)


def _delta_streams() -> dict[str, np.ndarray]:
    """Inputs of `rle.encode_huffman` as a quantized delta's grouped streams are: mostly zero,
    short runs of small cyclic deltas, each width the encoder takes; and long runs."""
    rng = np.random.default_rng(3)
    u8 = np.where(rng.random(300_001) < 0.7, 0, rng.integers(0, 256, 300_001)).astype(np.uint8)
    small = np.where(rng.random(200_003) < 0.75, 0, rng.choice([1, 17], 200_003)).astype(np.uint8)
    u16 = np.where(rng.random(200_003) < 0.6, 0, rng.integers(0, 65536, 200_003)).astype(np.uint16)
    i32 = np.where(rng.random(100_007) < 0.5, 7, rng.integers(0, 2**31 - 1, 100_007)).astype(np.int32)
    runs = np.repeat(rng.integers(0, 5, 3000), rng.integers(1, 200, 3000)).astype(np.uint8)
    return {"u8": u8, "small deltas": small, "u16": u16, "i32": i32, "runs": runs,
            "runs u16": runs.astype(np.uint16), "runs i32": runs.astype(np.int32)}


def _cases() -> dict[str, bytes]:
    f = _floats(300_001, 0)
    sq = f * f  # an Adam second moment"s shape of distribution
    ex = _skewed(100_003, 1)
    rng = np.random.default_rng(2)
    u16 = rng.geometric(0.01, 50_001).astype(np.uint16)
    mant = rng.integers(0, 256, 70_001).astype(np.uint8)
    return {
        "f32": _lossless(f),
        "f32 sq": _lossless(sq),
        "bf16": _lossless(f.to(torch.bfloat16), rans_saving=0.0),   # rANS allowed (pinned so)
        "f16": _lossless(f.to(torch.float16)),
        "f64": _lossless(f[:100_000].to(torch.float64)),
        "i64": _lossless(torch.arange(70_000, dtype=torch.int64) * 3),
        "f32 huffman exponents": _lossless(f, rans_saving=1.0),
        "bf16 small segments": _lossless(f[:50_000].to(torch.bfloat16), segment=4099,
                                         rans_saving=0.0),
        "rans": bytes(rans.encode(ex)),
        "rans ragged": bytes(rans.encode(ex[:4101])),
        "huffman u8": huffman.encode(ex),
        "huffman u16": huffman.encode(u16),
        "ctx coded": _ctx_block(ex[:70_001], (ex[:70_001] * 7 + (mant & 3)).astype(np.uint8), 1000),
        "ctx falls back": _ctx_block(*_fallback_input(), 980),
        **{f"rle {k}": rle.encode_huffman(v) for k, v in _delta_streams().items()},
        **{f"rle tokens {k}": rle.encode(v).tobytes() for k, v in _delta_streams().items()},
    }


PINNED = {
    "f32": "14c668b165716709439e1ce091cb313ad75d8ac80bbfda4bad371d6c0b04beb3",
    "f32 sq": "7ccaf5a23d1946fefa764730f7f5c2d18ed4fa075dc5838eae635d837d535182",
    "bf16": "f69a4a8762ca8fec730939a7d6551ddfb80f91de872d307190389daf3c7a0fe7",
    "f16": "bff8ddbf3720e619457181599ae482542f499c2cb6c9622c8befcb7b1a1c04ba",
    "f64": "86af21fa5c48714454391c8cc96c325d5edb1a64b3e27817e79082e431c616a7",
    "i64": "15b8707b3ebba8e44460763ecff3c628fb8d6344fa66dcbf903d2e871288ca8b",
    "f32 huffman exponents": "c0f08144ea2194cb79c41dc8cf3d71fa870c1d8af390b49f903be3e6c298da2d",
    "bf16 small segments": "775e268f4c68b24844fa21b9895200386e5feca5ca65d7bc0479852dc306525c",
    "rans": "9e48ec57456465c1c70e5b9caddfee5d847b30437f9b0c9600c28d25bc34ea9f",
    "rans ragged": "541aae18d94c84d68932621775a6b60c75cd02d20698e7f6d875956a811d32c7",
    "huffman u8": "0c5e01f559cbcaa89ead9704656a00008636e981e36cf47b3af66953364386ce",
    "huffman u16": "2a2606819648e446373e5495d68799801ef8640d9077929a042e56393e276244",
    "ctx coded": "96c9f02c0a9efc40bc4d5cd1d4b372ca217a8208e3824f5b64cf207607faaf63",
    "ctx falls back": "0ab4f3296132bda0c685e325e64e22ffb639e96b0c99090bfc8519b6161d16ba",
    "rle u8": "c6eac55595e3dc4cba10280171cf607aab744f7a037288758a2834afb383e020",
    "rle small deltas": "2248a56de0a9326b2809ae59ef225c3fe8e41d1a2f511b1347a75fe1a12158d4",
    "rle u16": "fa9aefd30ee20ec64d7f2a59f48e433c06e3622e10445e23da8726a4c2af4e62",
    "rle i32": "13389d18b1e421cb33f31c7ec4b5a82d251a6587fbbfde9da8a4b0378b39817d",
    "rle runs": "e9e5c68ff248215052eb793bceaf79f409483fcbd573f1f3f298538733c1171f",
    "rle runs u16": "e9e5c68ff248215052eb793bceaf79f409483fcbd573f1f3f298538733c1171f",
    "rle runs i32": "e9e5c68ff248215052eb793bceaf79f409483fcbd573f1f3f298538733c1171f",
    "rle tokens u8": "cf3b056e95d272531c894ed78936112681853bfa3dae63b1951085dd72bda75d",
    "rle tokens small deltas": "5a6c42d034f1c39e10fed98a37c4bfefc519878a215a7dc825eaee85946ab6a7",
    "rle tokens u16": "df918815c2a4c044e823a851f955076b03dc6be0d686ed779164303360479ac5",
    "rle tokens i32": "41b1448da0b69a04dedee5d872c50efe8fb701b2226a5212e1923687db5315f6",
    "rle tokens runs": "92fa66098feb795b47e14c0b2fec2d1ac1bbf3c09ae8804e455cbab7881954d2",
    "rle tokens runs u16": "92fa66098feb795b47e14c0b2fec2d1ac1bbf3c09ae8804e455cbab7881954d2",
    "rle tokens runs i32": "92fa66098feb795b47e14c0b2fec2d1ac1bbf3c09ae8804e455cbab7881954d2",
}


@pytest.fixture(scope="module")
def digests() -> dict[str, str]:
    return {k: hashlib.sha256(v).hexdigest() for k, v in _cases().items()}


@pytest.mark.parametrize("case", sorted(PINNED))
def test_encoder_output_is_unchanged(digests, case):
    assert digests[case] == PINNED[case]


def test_every_case_is_pinned(digests):
    assert sorted(digests) == sorted(PINNED)


def test_rans_decodes_every_ragged_length_around_its_groups():
    """The decoder"s 32-lane group kernel and its one-state tail meet at every offset."""
    ex = _skewed(5000, 3)
    for n in list(range(1, 70)) + [4095, 4096, 4097, 4103, 4104, 4127, 4128, 4129]:
        data = ex[:n]
        if np.unique(data).size < 2:
            continue
        enc = rans.encode(data)
        assert np.array_equal(rans.decode(enc, n), data)


def test_context_fallback_is_the_plain_block():
    """When conditioning does not pay, the context coder writes exactly the plain Huffman block
    (planned from its class histograms, not from a second pass)."""
    ctx, val = _fallback_input()
    block = _ctx_block(ctx, val, 980)
    plain = bytes(huffman.encode_block(ffi.from_buffer("uint8_t[]", val), val.size, 1, 980))
    assert block[0] == huffman.MODE_HUFFMAN and block == plain
    out = np.empty_like(val)
    with ffi.from_buffer("uint8_t[]", ctx) as c, ffi.from_buffer("uint8_t[]", out, require_writable=True) as o:
        assert lib.mvc_ctxhuf_decode(block, len(block), c, o, val.size) == 0
    assert np.array_equal(out, val)
