"""Static rANS coding of byte blocks (native/rans.c): near-entropy coding for skewed planes.

A rANS block is one more block mode (mode byte 5; mode 4, its predecessor, is still
read) beside the raw / constant / Huffman blocks of `mvc.native.huffman`; `decode_block`
accepts all of them.  Format: docs/native-formats.md.
"""
from __future__ import annotations

from typing import Any

import numpy as np

from mvc.native._lib import ffi, lib
from mvc.native.buffers import borrow, nbytes
from mvc.native.status import (
    ERR_ARG,
    ERR_CAPACITY,
    BytesLike,
    check_decode,
    check_encode,
)

MODE = 5
LEGACY_MODE = 4

#: Decode kernels of native/rans_kernels.c, by the number `mvc_rans_decode_with` takes.
KERNELS = {1: "scalar", 2: "avx2", 3: "avx512"}


def kernels() -> list[int]:
    """The decode kernels this CPU runs (1 scalar always; 2 AVX2, 3 AVX-512 where present)."""
    have = int(lib.mvc_rans_kernels())
    return [k for k in KERNELS if have >> k & 1]


def encode_block(src: Any, n: int) -> np.ndarray | None:
    """rANS-code n bytes at cffi pointer `src`; None when the block has fewer than two
    distinct values or would not fit in its bound (use a Huffman block then)."""
    out = np.empty(int(lib.mvc_rans_bound(n)), dtype=np.uint8)
    rc = lib.mvc_rans_encode(src, n, ffi.from_buffer("uint8_t[]", out), out.size)
    if rc in (ERR_ARG, ERR_CAPACITY) and n > 0:
        return None
    return out[: check_encode(rc, "rANS encode")].copy()  # the bound is 1.5x: keep only the output


def decode_block(src: Any, length: int, dst: Any, n: int) -> None:
    """Decode a rANS block, or any 8-bit raw / constant / Huffman block, into n bytes at `dst`."""
    check_decode(lib.mvc_rans_decode(src, length, dst, n), "rANS block")


def encode(data: np.ndarray) -> bytes:
    """rANS-code a uint8 array as one block (falls back to a Huffman block when rANS cannot)."""
    from mvc.native import huffman

    arr = np.ascontiguousarray(data, dtype=np.uint8).reshape(-1)
    if arr.size == 0:
        return b""
    with borrow(arr) as ptr:
        block = encode_block(ptr, arr.size)
        if block is None:
            block = huffman.encode_block(ptr, arr.size, 1)
    return block.tobytes()


def recovery_counts() -> tuple[int, int]:
    """Mode-5 blocks of the encoder before its exact quotient (blocks that never decoded) this
    process met: (recovered, ambiguous). `mvc_rans_decode` recovers one when exactly one input
    gives it; two inputs can (that encoder wrote a bad step of one symbol and a step of the
    symbol below it as one state), and such a block stays an error."""
    out = ffi.new("uint64_t[2]")
    lib.mvc_rans_recovery_counts(out)
    return int(out[0]), int(out[1])


def decode(data: BytesLike, n: int) -> np.ndarray:
    """Inverse of `encode`: n bytes; `NativeDecodeError` if the block is corrupt."""
    out = np.empty(n, dtype=np.uint8)
    length = nbytes(data)
    if n == 0 and length == 0:
        return out
    # Released before a corrupt block's error leaves: see mvc.native.buffers.
    with borrow(data) as src, borrow(out, writable=True) as dst:
        rc = lib.mvc_rans_decode(src, length, dst, n)
    check_decode(rc, "rANS block")
    return out
