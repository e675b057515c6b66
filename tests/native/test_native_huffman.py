"""Canonical Huffman coder: round trips, the documented format, optimality and hostile input."""
from __future__ import annotations

import numpy as np
import pytest
import reference_coders as ref
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mvc.native import ffi, huffman, lib
from mvc.native.status import NativeArgumentError, NativeDecodeError

SETTINGS = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@st.composite
def symbol_arrays(draw, max_size: int = 3000):
    """Arrays from a skewed distribution over a random sub-alphabet: the realistic case."""
    width = draw(st.sampled_from([1, 2]))
    n = draw(st.integers(0, max_size))
    k = draw(st.integers(1, 300))
    seed = draw(st.integers(0, 2**32 - 1))
    rng = np.random.default_rng(seed)
    top = 256 if width == 1 else 65536
    alphabet = rng.choice(top, size=min(k, top), replace=False)
    weights = rng.pareto(draw(st.sampled_from([0.5, 1.0, 3.0])), size=alphabet.size) + 1e-3
    data = rng.choice(alphabet, size=n, p=weights / weights.sum())
    return data.astype(np.uint8 if width == 1 else np.uint16)


def encode_one_block(data: np.ndarray, permille: int = 1000) -> bytes:
    width = data.itemsize
    return bytes(huffman.encode_block(ffi.from_buffer("uint8_t[]", data), data.size, width, permille))


@SETTINGS
@given(symbol_arrays(), st.sampled_from([64, 1000, 1 << 18]))
def test_round_trip_and_reference_decoder(data, block_bytes):
    enc = huffman.encode(data, block_bytes=block_bytes)
    assert np.array_equal(huffman.decode(enc, data.size, data.dtype), data)
    assert np.array_equal(ref.huf_decode(enc, data.size, data.itemsize), data)


def test_long_16_bit_codes_decode_past_the_direct_table():
    """16-bit codes longer than the decoder's 11-bit direct table take its canonical path,
    interleaved with short codes, in all four streams."""
    rng = np.random.default_rng(7)
    alphabet = rng.choice(65536, size=40, replace=False).astype(np.uint16)
    counts = [2 ** max(0, 17 - i) for i in range(40)]  # geometric: lengths up to the limit
    data = np.repeat(alphabet, counts)
    rng.shuffle(data)
    block = encode_one_block(data)
    assert block[0] == 2
    _, lens, _ = ref.parse_huf_table(block, 2)
    assert max(lens) > 11
    assert np.array_equal(huffman.decode(huffman.encode(data), data.size, data.dtype), data)


@SETTINGS
@given(symbol_arrays(max_size=5000))
def test_block_cost_is_optimal_when_lengths_fit(data):
    """The native code is a Huffman code: same total bits as an unrestricted
    optimal code whenever that code respects the length limit."""
    block = encode_one_block(data)
    counts = np.unique(data, return_counts=True)
    if not block or block[0] != 2:
        return
    syms, lens, _ = ref.parse_huf_table(block, data.itemsize)
    assert syms == counts[0].tolist()
    native_bits = int(np.dot(counts[1], lens))
    best, longest = ref.optimal_code_cost(counts[1].tolist())
    assert native_bits >= best
    if longest <= ref.LMAX[data.itemsize]:
        assert native_bits == best


@pytest.mark.parametrize("width", [1, 2])
def test_modes_raw_const_and_limit(width):
    dt = np.uint8 if width == 1 else np.uint16
    rng = np.random.default_rng(0)
    const = np.full(1000, 7, dt)
    assert encode_one_block(const)[0] == 1 and len(encode_one_block(const)) == 1 + width
    uniform = rng.integers(0, 256 if width == 1 else 65536, 4000).astype(dt)
    assert encode_one_block(uniform)[0] == 0
    skewed = np.minimum(rng.geometric(0.5, 4000) - 1, 200).astype(dt)
    assert encode_one_block(skewed)[0] == 2
    # Fibonacci-like counts force code lengths past the limit: they are folded back.
    fib = [1, 1]
    while len(fib) < 30:
        fib.append(fib[-1] + fib[-2])
    data = np.repeat(np.arange(30, dtype=dt), fib[:30])
    block = encode_one_block(data)
    _, lens, _ = ref.parse_huf_table(block, width)
    assert max(lens) <= ref.LMAX[width]
    assert np.array_equal(huffman.decode(huffman.encode(data), data.size, dt), data)


def test_permille_forces_raw_when_saving_is_small():
    rng = np.random.default_rng(1)
    data = rng.integers(0, 200, 10000).astype(np.uint8)  # ~7.6 bits: a ~4% saving
    assert encode_one_block(data, 1000)[0] == 2
    assert encode_one_block(data, 900)[0] == 0


def test_size_close_to_entropy():
    rng = np.random.default_rng(2)
    data = (rng.geometric(0.3, 200_000) - 1).clip(0, 255).astype(np.uint8)
    enc = huffman.encode(data)
    assert len(enc) * 8 <= ref.entropy_bits(data) * 1.03 + 2000


def test_empty_and_bad_arguments():
    assert huffman.encode(np.zeros(0, np.uint8)) == b""
    assert huffman.decode(b"", 0, np.uint8).size == 0
    with pytest.raises(NativeDecodeError):
        huffman.decode(b"\x01", 0, np.uint8)
    with pytest.raises(NativeArgumentError):
        huffman.encode(np.zeros(3, np.int32))
    with pytest.raises(NativeArgumentError):
        huffman.decode(b"", 3, np.float32)
    out = np.empty(10, np.uint8)
    assert lib.mvc_huf_encode_block(ffi.from_buffer("uint8_t[]", out), 10, 3,
                                    ffi.from_buffer("uint8_t[]", out), 10, 1000) < 0


def _decode_or_codec_error(data: bytes, n: int, dtype) -> None:
    try:
        out = huffman.decode(data, n, dtype)
    except NativeDecodeError:
        return
    assert out.size == n


@SETTINGS
@given(st.binary(max_size=400), st.integers(0, 5000), st.sampled_from([np.uint8, np.uint16]))
def test_random_input_never_crashes(data, n, dtype):
    _decode_or_codec_error(data, n, dtype)


@SETTINGS
@given(symbol_arrays(max_size=4000), st.data())
def test_truncation_and_bit_flips(data, draw):
    """Truncated streams always fail; a bit flip fails or, when it lands where
    every pattern is valid (a raw block, a code swapped for one of equal
    length), decodes to other symbols: the store's content hash catches those."""
    enc = huffman.encode(data, block_bytes=1024)
    if not enc:
        return
    cut = draw.draw(st.integers(0, len(enc) - 1))
    with pytest.raises(NativeDecodeError):
        huffman.decode(enc[:cut], data.size, data.dtype)
    flipped = bytearray(enc)
    bit = draw.draw(st.integers(0, 8 * len(enc) - 1))
    flipped[bit >> 3] ^= 1 << (bit & 7)
    _decode_or_codec_error(bytes(flipped), data.size, data.dtype)


def test_hostile_header_does_not_allocate_per_declared_block():
    # block size 1 with a declared count of 10**12 symbols: refused before any loop.
    with pytest.raises(NativeDecodeError):
        huffman.decode(b"\x01\x05", 10**6, np.uint8)
    with pytest.raises(NativeDecodeError):
        huffman.decode(b"\x00", 10, np.uint8)  # block size 0


def test_thread_pool_matches_serial():
    rng = np.random.default_rng(3)
    data = (rng.geometric(0.2, 300_000) - 1).clip(0, 255).astype(np.uint8)
    a = huffman.encode(data, block_bytes=4096, threads=1)
    b = huffman.encode(data, block_bytes=4096)
    assert a == b
    assert np.array_equal(huffman.decode(b, data.size, np.uint8, threads=1),
                          huffman.decode(a, data.size, np.uint8))


# ---- context-conditional blocks (native/ctxhuf.c) --------------------------------

@st.composite
def ctx_pairs(draw, max_size: int = 3000):
    """Context bytes from a few frequent values; values skewed differently per context."""
    n = draw(st.integers(0, max_size))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    nctx = draw(st.integers(1, 12))
    ctx = rng.choice(rng.choice(256, nctx, replace=False), size=n,
                     p=(w := rng.pareto(1.0, nctx) + 0.1) / w.sum()).astype(np.uint8)
    spread = draw(st.sampled_from([1, 4, 40, 256]))
    val = ((ctx.astype(np.int64) * 37 + rng.integers(0, spread, n)) % 256).astype(np.uint8)
    return ctx, val


def ctx_encode(ctx: np.ndarray, val: np.ndarray, permille: int = 1000) -> bytes:
    return bytes(huffman.encode_ctx_block(ffi.from_buffer("uint8_t[]", ctx),
                                          ffi.from_buffer("uint8_t[]", val), val.size, permille))


def ctx_decode(block: bytes, ctx: np.ndarray) -> np.ndarray:
    out = np.empty(ctx.size, np.uint8)
    huffman.decode_ctx_block(ffi.from_buffer("uint8_t[]", block) if block else ffi.NULL, len(block),
                             ffi.from_buffer("uint8_t[]", ctx) if ctx.size else ffi.NULL,
                             ffi.from_buffer("uint8_t[]", out) if ctx.size else ffi.NULL, ctx.size)
    return out


@SETTINGS
@given(ctx_pairs())
def test_ctx_round_trip_and_reference_decoder(pair):
    ctx, val = pair
    block = ctx_encode(ctx, val)
    assert np.array_equal(ctx_decode(block, ctx), val)
    assert np.array_equal(ref.ctx_decode_block(block, ctx), val)
    assert len(block) <= 1 + val.size  # never worse than raw


def test_ctx_beats_plain_coding_when_values_depend_on_context():
    rng = np.random.default_rng(4)
    ctx = rng.integers(0, 4, 50_000).astype(np.uint8)
    val = (ctx * 60 + rng.integers(0, 8, ctx.size)).astype(np.uint8)  # 3 bits given ctx, ~5 without
    assert ctx_decode(ctx_encode(ctx, val), ctx).tobytes() == val.tobytes()
    assert len(ctx_encode(ctx, val)) < 0.75 * len(encode_one_block(val))
    assert ctx_encode(ctx, val)[0] == 3


@SETTINGS
@given(ctx_pairs(max_size=2000), st.data())
def test_ctx_truncation_flips_and_random_input(pair, draw):
    ctx, val = pair
    block = ctx_encode(ctx, val)
    if not block:
        return
    cut = draw.draw(st.integers(0, len(block) - 1))
    with pytest.raises(NativeDecodeError):
        ctx_decode(block[:cut], ctx)
    flipped = bytearray(block)
    bit = draw.draw(st.integers(0, 8 * len(block) - 1))
    flipped[bit >> 3] ^= 1 << (bit & 7)
    for candidate in (bytes(flipped), draw.draw(st.binary(max_size=200))):
        try:
            out = ctx_decode(candidate, ctx)
        except NativeDecodeError:
            continue
        assert out.size == ctx.size


def test_pmap_waits_for_every_task_before_raising():
    """A failing block must not leave sibling tasks writing into freed buffers."""
    import threading
    import time as _time

    from mvc.native.parallel import pmap, worker_count

    if worker_count() < 2:
        pytest.skip("runs inline on one CPU")
    finished = []
    lock = threading.Lock()

    def task(i: int) -> int:
        if i == 0:
            raise NativeDecodeError("bad block")
        _time.sleep(0.01)
        with lock:
            finished.append(i)
        return i

    with pytest.raises(NativeDecodeError):
        pmap(task, range(8), threads=2)
    assert sorted(finished) == list(range(1, 8))


def test_one_varint_rule_in_python_and_c():
    """The Python and C varint readers share one rule (issue 13): a header varint is at most
    64 bits wide.  The C reader used to drop the bits past 64, so an overlong block size
    that wraps to 1 was read as 1 in C and refused in Python."""
    from mvc.native._varint import get_varint, put_varint

    for v in (0, 1, 127, 128, 2**32 - 1, 2**63, 2**64 - 1):
        assert get_varint(memoryview(put_varint(v) + b"\x00"), 0, "t") == (v, len(put_varint(v)))
    with pytest.raises(ValueError):
        put_varint(2**64)
    wraps_to_one = b"\x81" + b"\x80" * 8 + b"\x02"  # 1 + 2**64
    for bad in (wraps_to_one, b"\x80" * 10 + b"\x00", b"\x80\x80"):
        with pytest.raises(NativeDecodeError):
            get_varint(memoryview(bad), 0, "t")
    stream = wraps_to_one + bytes([huffman.MODE_RAW, 42])  # one block of one raw symbol
    with pytest.raises(NativeDecodeError):
        huffman.decode(stream, 1)
    out = np.zeros(1, dtype=np.uint8)
    rc = lib.mvc_huf_decode_stream(ffi.from_buffer("uint8_t[]", stream), len(stream),
                                   ffi.from_buffer("uint8_t[]", out, require_writable=True), 1, 1)
    assert rc < 0
    good = put_varint(1) + bytes([huffman.MODE_RAW, 42])
    assert huffman.decode(good, 1).tolist() == [42]
    rc = lib.mvc_huf_decode_stream(ffi.from_buffer("uint8_t[]", good), len(good),
                                   ffi.from_buffer("uint8_t[]", out, require_writable=True), 1, 1)
    assert rc == 0 and out.tolist() == [42]
