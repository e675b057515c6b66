"""Canonical Huffman coding of uint8 / uint16 symbol arrays, block-parallel.

Stream format (`encode` output; the symbol count n is not stored, the caller
passes it to `decode`; n == 0 encodes to b""):

    varint  bs                 symbols per block (1 <= bs <= 2**24); the last
                               block holds the remainder
    varint  len[i]             encoded byte length of each block but the last
    bytes   block[0..k-1]      k = ceil(n / bs); the last block takes the rest

Each block is self-contained (mode byte raw / constant / Huffman, its own
code table): see docs/native-formats.md.  Blocks are coded on the shared
thread pool (`mvc.native.parallel`); a corrupt block is reported as
`NativeDecodeError` without touching the others.
"""
from __future__ import annotations

from typing import Any

import numpy as np

from mvc.native._lib import ffi, lib
from mvc.native._varint import get_varint, put_varint
from mvc.native.buffers import borrow
from mvc.native.parallel import pmap
from mvc.native.status import (
    BytesLike,
    NativeArgumentError,
    NativeDecodeError,
    check_decode,
    check_encode,
)

BLOCK_BYTES = 256 * 1024
MODE_RAW, MODE_CONST, MODE_HUFFMAN, MODE_CONTEXT = 0, 1, 2, 3  # first byte of a block
MAX_BLOCK = int(lib.mvc_huf_max_block())
_WIDTH = {np.dtype(np.uint8): 1, np.dtype(np.uint16): 2}


def _width(dtype: Any) -> int:
    try:
        return _WIDTH[np.dtype(dtype)]
    except (KeyError, TypeError):
        raise NativeArgumentError(f"Huffman symbols must be uint8 or uint16, not {dtype}") from None


def encode_block(src: Any, n: int, width: int, max_permille: int = 1000) -> np.ndarray:
    """Encode one block of n symbols at cffi pointer `src`; returns its bytes (a uint8 view).

    The block is Huffman coded only if that shrinks it below
    raw_size * max_permille / 1000; otherwise it is stored raw.
    """
    out = np.empty(int(lib.mvc_huf_bound(n, width)), dtype=np.uint8)
    rc = lib.mvc_huf_encode_block(src, n, width, ffi.from_buffer("uint8_t[]", out), out.size,
                                  max_permille)
    return shrink(out, check_encode(rc, "Huffman block encode"))


def shrink(buf: np.ndarray, size: int) -> np.ndarray:
    """`buf[:size]`, copied when that frees most of `buf` (encoded blocks are
    kept until the payload is stored: holding worst-case buffers would cost
    memory on huge tensors)."""
    return buf[:size].copy() if 4 * size < 3 * buf.size else buf[:size]


def decode_block(src: Any, length: int, dst: Any, n: int, width: int) -> None:
    """Decode one block of `length` bytes at `src` into n symbols at `dst` (cffi pointers)."""
    check_decode(lib.mvc_huf_decode_block(src, length, dst, n, width), "Huffman block")


def encode_ctx_block(ctx: Any, val: Any, n: int, max_permille: int = 1000) -> np.ndarray:
    """Encode n bytes at `val` conditionally on the n context bytes at `ctx` (native/ctxhuf.h).

    Falls back to a plain block when conditioning does not pay.
    """
    out = np.empty(int(lib.mvc_ctxhuf_bound(n)), dtype=np.uint8)
    rc = lib.mvc_ctxhuf_encode(ctx, val, n, ffi.from_buffer("uint8_t[]", out), out.size, max_permille)
    return shrink(out, check_encode(rc, "context Huffman encode"))


def decode_ctx_block(src: Any, length: int, ctx: Any, dst: Any, n: int) -> None:
    """Decode `encode_ctx_block` output (or any 8-bit plain block) given the same context bytes."""
    check_decode(lib.mvc_ctxhuf_decode(src, length, ctx, dst, n), "context Huffman block")


def encode(symbols: np.ndarray, block_bytes: int = BLOCK_BYTES, threads: int | None = None) -> bytes:
    """Huffman-code a uint8 or uint16 array (any shape, read in C order)."""
    arr = np.ascontiguousarray(symbols)
    width = _width(arr.dtype)
    n = arr.size
    if n == 0:
        return b""
    bs = max(1, min(MAX_BLOCK, block_bytes // width))
    starts = range(0, n, bs)
    with borrow(arr) as src:  # each block is an array of its own: nothing points into arr after
        blocks = pmap(lambda s: encode_block(src + s * width, min(bs, n - s), width), starts, threads)
    header = [put_varint(bs)] + [put_varint(b.size) for b in blocks[:-1]]
    return b"".join(header + [b.data for b in blocks])


def decode(data: BytesLike, n: int, dtype: Any = np.uint8, threads: int | None = None) -> np.ndarray:
    """Inverse of `encode`: n symbols of `dtype` (uint8 or uint16); `NativeDecodeError` if corrupt."""
    width = _width(dtype)
    if n < 0:
        raise NativeArgumentError(f"negative symbol count {n}")
    out = np.empty(n, dtype=dtype)
    buf = memoryview(data).cast("B") if len(data) else memoryview(b"")
    if n == 0:
        if len(buf):
            raise NativeDecodeError("Huffman stream: data for an empty array")
        return out
    bs, pos = get_varint(buf, 0, "Huffman stream")
    if not 1 <= bs <= MAX_BLOCK:
        raise NativeDecodeError(f"Huffman stream: bad block size {bs}")
    nblocks = -(-n // bs)
    if nblocks - 1 > len(buf) - pos:  # each length takes >= 1 byte: refuse before looping
        raise NativeDecodeError("Huffman stream: truncated block table")
    lengths = []
    for _ in range(nblocks - 1):
        length, pos = get_varint(buf, pos, "Huffman stream")
        lengths.append(length)
    spans = []
    for length in lengths:
        spans.append((pos, length))
        pos += length
    if pos > len(buf):
        raise NativeDecodeError("Huffman stream: truncated")
    spans.append((pos, len(buf) - pos))
    # Released before a corrupt block's error leaves: see mvc.native.buffers.
    with borrow(buf) as src, borrow(out, writable=True) as dst:
        def one(i: int) -> None:
            off, ln = spans[i]
            cnt = min(bs, n - i * bs)
            decode_block(src + off, ln, dst + i * bs * width, cnt, width)

        pmap(one, range(nblocks), threads)
    return out
