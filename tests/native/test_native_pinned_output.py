"""The encoders" exact bytes, pinned: speed work on the native coders must not change what is stored.

Each case encodes a fixed, seeded input and compares the SHA-256 of the output with the value
the coders produced before their encoders were restructured (one histogram per plane, the
Huffman block planned before it is written, rANS states in registers, chunked byte-plane
split).  A deliberate change of an encoder"s choices updates these constants and says why.
"""
from __future__ import annotations

import hashlib

import numpy as np
import pytest
import torch

from mvc.codecs.lossless import LosslessCodec
from mvc.native import ffi, huffman, lib, rans


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
    }


PINNED = {
    "f32": "7ccf9b59f7cc46542a757fb6562f1d70112c08275bb88b4835071e43cfc08abe",
    "f32 sq": "05b1f3d8dbf1c0e2a4f7898b2c9f75ac0a6ebc5e7ed953dc7e03c27b60a2253e",
    "bf16": "a72ef0a66be313d61924ea6820fce8a732effe2c1c38d77d5bed095fc97f7a3d",
    "f16": "9006345dce35998296fe4e2140eb7d073013f1f9d41941a13082191e523ee322",
    "f64": "ef8bc799d604c62fdd57156f038a26349a46087f5e15427f5dc5df91e3853ec6",
    "i64": "15b8707b3ebba8e44460763ecff3c628fb8d6344fa66dcbf903d2e871288ca8b",
    "f32 huffman exponents": "c0f08144ea2194cb79c41dc8cf3d71fa870c1d8af390b49f903be3e6c298da2d",
    "bf16 small segments": "775e268f4c68b24844fa21b9895200386e5feca5ca65d7bc0479852dc306525c",
    "rans": "5a799edc4fc4e2801fdc245bd363e7e5f6ea2edcd4280aa59f71c9557d84da26",
    "rans ragged": "ac7fae26268c967518ebea814a5e6ed4a831f7c6220becb937058af2ec569585",
    "huffman u8": "0c5e01f559cbcaa89ead9704656a00008636e981e36cf47b3af66953364386ce",
    "huffman u16": "2a2606819648e446373e5495d68799801ef8640d9077929a042e56393e276244",
    "ctx coded": "96c9f02c0a9efc40bc4d5cd1d4b372ca217a8208e3824f5b64cf207607faaf63",
    "ctx falls back": "0ab4f3296132bda0c685e325e64e22ffb639e96b0c99090bfc8519b6161d16ba",
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
    """The decoder"s eight-state fast path and its one-state tail meet at every offset."""
    ex = _skewed(5000, 3)
    for n in list(range(1, 40)) + [4095, 4096, 4097, 4103, 4104]:
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
