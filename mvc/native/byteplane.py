"""Byte-plane split / merge of float and integer element arrays (native/byteplane.c).

Float layouts rotate every element left by one bit so the sign moves to the
lowest bit and plane 0 (the most significant byte) is the exponent: the
low-entropy plane the lossless codec Huffman-codes.  Planes follow in
decreasing significance.  `BYTES` is a plain transpose of `itemsize`-byte
elements (plane p = byte p, little-endian).  Exact format: docs/native-formats.md.
"""
from __future__ import annotations

from typing import Any

import numpy as np

from mvc.native._lib import ffi, lib
from mvc.native.buffers import borrow
from mvc.native.status import check_encode

BYTES = 0
F16 = 1
BF16 = 2
F32 = 3
F64 = 4

NAMES = {BYTES: "bytes", F16: "f16", BF16: "bf16", F32: "f32", F64: "f64"}
BY_NAME = {v: k for k, v in NAMES.items()}


def nplanes(layout: int, itemsize: int) -> int:
    """Planes per element for `layout`; `NativeArgumentError` if the pair is invalid."""
    return check_encode(lib.mvc_bp_nplanes(layout, itemsize), f"byte-plane layout {layout}/{itemsize}")


def plane_pointers(base: Any, n: int, count: int) -> Any:
    """A `uint8_t *[count]` of pointers to consecutive n-byte planes starting at `base`.

    The table does not keep `base`'s buffer alive: use it only while `base` is held."""
    return ffi.new("uint8_t *[]", [base + p * n for p in range(count)])


def split(data: Any, layout: int, itemsize: int) -> np.ndarray:
    """Split a buffer of whole elements into a (nplanes, n) uint8 array."""
    raw = np.frombuffer(data, dtype=np.uint8) if not isinstance(data, np.ndarray) else data.reshape(-1).view(np.uint8)
    k = nplanes(layout, itemsize)
    if raw.size % itemsize:
        raise ValueError(f"{raw.size} bytes is not a whole number of {itemsize}-byte elements")
    n = raw.size // itemsize
    planes = np.empty((k, n), dtype=np.uint8)
    if n:
        with borrow(planes, writable=True) as base, borrow(raw) as src:
            rc = lib.mvc_bp_split(src, n, layout, itemsize, plane_pointers(base, n, k), k)
        check_encode(rc, "byte-plane split")
    return planes


def merge(planes: np.ndarray, layout: int, itemsize: int) -> np.ndarray:
    """Inverse of `split`: a flat uint8 array of n * itemsize bytes."""
    k = nplanes(layout, itemsize)
    arr = np.ascontiguousarray(planes, dtype=np.uint8)
    if arr.ndim != 2 or arr.shape[0] != k:
        raise ValueError(f"expected ({k}, n) planes, got shape {arr.shape}")
    n = arr.shape[1]
    out = np.empty(n * itemsize, dtype=np.uint8)
    if n:
        with borrow(arr) as base, borrow(out, writable=True) as dst:
            rc = lib.mvc_bp_merge(plane_pointers(base, n, k), k, n, layout, itemsize, dst)
        check_encode(rc, "byte-plane merge")
    return out
