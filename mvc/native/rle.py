"""Run-length coding of level-delta streams (Inshrinkerator section 6), plain and fused with Huffman.

Plain form (`encode` / `decode`): an int32 token stream.  Each maximal run of
a value v >= 0 with length L becomes the token -v (<= 0), followed by the
token L only when L > 1; the sign tells values and run lengths apart.  Runs
longer than 2**31 - 1 are split.  Tokens never outnumber values.

Fused form (`encode_huffman` / `decode_huffman`), for storage::

    varint  M          modulus: max value + 1 (values are read in [0, M))
    varint  n0, n1     symbol counts of the two context streams
    varint  xlen       byte length of the extra-bits stream
    varint  len0       byte length of Huffman stream 0
    bytes   extra      xlen bytes, LSB-first bit stream
    bytes   stream 0   `mvc.native.huffman` stream of n0 uint16 symbols
    bytes   stream 1   `mvc.native.huffman` stream of n1 uint16 symbols (rest)

Symbols carry the same tokens.  A value v is folded around zero modulo M and
zigzagged (z = 2v if v < M - v else 2(M - v) - 1), so the cyclic deltas +1
and -1 both get small symbols.  A value with z < 64 and its run share one
joint symbol z * 44 + run class; other values get a value symbol (or an
escape plus 32 extra bits) followed by a run symbol when L > 1.  Run classes:
0 is L = 1, 1..15 are L = 2..16, 16..43 are L with bit length 5..32 whose low
bits follow as extra bits.  A symbol goes to stream 0 when the previous value
was 0, else to stream 1; each stream has its own Huffman tables.  Exact
layout: docs/native-formats.md.
"""
from __future__ import annotations

from typing import Any

import numpy as np

from mvc.native import huffman
from mvc.native._lib import ffi, lib
from mvc.native._varint import get_varint, put_varint
from mvc.native.buffers import borrow
from mvc.native.status import (
    BytesLike,
    NativeArgumentError,
    NativeDecodeError,
    check_decode,
    check_encode,
)

_KIND = {np.dtype(np.uint8): 1, np.dtype(np.uint16): 2, np.dtype(np.int32): 4}
_LIMIT = {1: 1 << 8, 2: 1 << 16, 4: 1 << 31}


def _as_values(values: Any) -> tuple[np.ndarray, int]:
    """A contiguous uint8 / uint16 / int32 array and its kind; other integer
    dtypes are accepted when every value fits int32 and is >= 0."""
    arr = np.ascontiguousarray(values).reshape(-1)
    kind = _KIND.get(arr.dtype)
    if kind is not None:
        return arr, kind
    if arr.dtype.kind not in "iub":
        raise NativeArgumentError(f"run-length coding needs integer values, not {arr.dtype}")
    if arr.size and (int(arr.min()) < 0 or int(arr.max()) >= 1 << 31):
        raise NativeArgumentError("run-length values must lie in [0, 2**31)")
    return arr.astype(np.int32), 4


def _out_kind(dtype: Any) -> int:
    try:
        return _KIND[np.dtype(dtype)]
    except (KeyError, TypeError):
        raise NativeArgumentError(f"decoded values must be uint8, uint16 or int32, not {dtype}") from None


def encode(values: Any) -> np.ndarray:
    """Sign-trick RLE of non-negative integers: an int32 token array (see module doc)."""
    arr, kind = _as_values(values)
    out = np.empty(arr.size, dtype=np.int32)
    if arr.size == 0:
        return out
    rc = lib.mvc_rle_encode(ffi.from_buffer("uint8_t[]", arr), arr.size, kind,
                            ffi.from_buffer("int32_t[]", out, require_writable=True), out.size)
    return out[: check_encode(rc, "RLE encode")].copy()


def decode(encoded: Any, n: int, dtype: Any = np.int32) -> np.ndarray:
    """Expand `encode`'s tokens into exactly n values of `dtype` (uint8/uint16/int32)."""
    kind = _out_kind(dtype)
    tok = np.ascontiguousarray(encoded)
    if tok.dtype != np.int32:
        raise NativeArgumentError(f"RLE tokens must be int32, not {tok.dtype}")
    if n < 0:
        raise NativeArgumentError(f"negative value count {n}")
    out = np.empty(n, dtype=dtype)
    with borrow(tok, "int32_t[]") as tp, borrow(out, writable=True) as dp:
        rc = lib.mvc_rle_decode(tp, tok.size, kind, dp, n)
    check_decode(rc, "RLE stream")
    return out


def encode_huffman(values: Any, threads: int | None = None) -> bytes:
    """RLE then Huffman-code non-negative integers (uint8/uint16/int32); format in the module doc."""
    arr, kind = _as_values(values)
    n = arr.size
    if n == 0:
        return b""
    counts = ffi.new("uint64_t[3]")
    with borrow(arr) as src:
        if kind == 4:  # the scan also range-checks int32 values
            check_encode(lib.mvc_rle_sym_scan(src, n, kind, counts), "RLE encode")
            bound, modulus = int(counts[0]), int(counts[1]) + 1
        else:
            # Tokens never outnumber values, and untouched pages of the symbol buffers cost
            # no memory: a bound of n spares the serial pass that counts them exactly.
            bound, modulus = n, int(arr.max()) + 1
        sym = np.empty((2, bound), dtype=np.uint16)
        extra = np.empty(4 * bound + 8, dtype=np.uint8)
        with borrow(sym, "uint16_t[]", writable=True) as base:
            rc = lib.mvc_rle_sym_encode(src, n, kind, modulus, base, base + bound, bound,
                                        ffi.from_buffer("uint8_t[]", extra), extra.size, counts)
    check_encode(rc, "RLE encode")
    n0, n1, xlen = int(counts[0]), int(counts[1]), int(counts[2])
    body0 = huffman.encode(sym[0, :n0], threads=threads)
    body1 = huffman.encode(sym[1, :n1], threads=threads)
    return b"".join([put_varint(modulus), put_varint(n0), put_varint(n1), put_varint(xlen),
                     put_varint(len(body0)), extra[:xlen].data, body0, body1])


def decode_huffman(data: BytesLike, n: int, dtype: Any = np.int32, threads: int | None = None) -> np.ndarray:
    """Inverse of `encode_huffman`: exactly n values of `dtype`; `NativeDecodeError` if corrupt."""
    kind = _out_kind(dtype)
    if n < 0:
        raise NativeArgumentError(f"negative value count {n}")
    out = np.empty(n, dtype=dtype)
    buf = memoryview(data).cast("B") if len(data) else memoryview(b"")
    if n == 0:
        if len(buf):
            raise NativeDecodeError("RLE+Huffman stream: data for an empty array")
        return out
    what = "RLE+Huffman stream"
    modulus, pos = get_varint(buf, 0, what)
    n0, pos = get_varint(buf, pos, what)
    n1, pos = get_varint(buf, pos, what)
    xlen, pos = get_varint(buf, pos, what)
    len0, pos = get_varint(buf, pos, what)
    if not 1 <= modulus <= _LIMIT[kind]:
        raise NativeDecodeError(f"{what}: modulus {modulus} does not fit {np.dtype(dtype)}")
    # Every symbol yields >= 1 value except run symbols, which follow a value:
    # n0 + n1 <= 2n bounds the allocations by the caller's n.
    if n0 + n1 < 1 or n0 + n1 > 2 * n or xlen + len0 > len(buf) - pos:
        raise NativeDecodeError(f"{what}: bad header")
    extra = buf[pos:pos + xlen]
    pos += xlen
    sym0 = huffman.decode(buf[pos:pos + len0], n0, np.uint16, threads=threads)
    sym1 = huffman.decode(buf[pos + len0:], n1, np.uint16, threads=threads)
    # Every pointer released before a corrupt stream's error leaves: see mvc.native.buffers.
    with (borrow(sym0, "uint16_t[]") as p0, borrow(sym1, "uint16_t[]") as p1,
          borrow(extra) as xp, borrow(out, writable=True) as dst):
        rc = lib.mvc_rle_sym_decode(p0, n0, p1, n1, xp, xlen, modulus, kind, dst, n)
    check_decode(rc, what)
    return out
