"""LEB128 varints for the small headers of the native stream formats.

The one Python reader and writer; the C coders share one too
(native/internal/varint.h), with the same rule: a 64-bit varint takes at most
10 bytes and sets no bit at or above 2**64, so a value never wraps.
"""
from __future__ import annotations

from mvc.native.status import NativeDecodeError

_BITS = 64


def put_varint(value: int) -> bytes:
    """Encode a non-negative int below 2**64 as LEB128."""
    if not 0 <= value < 1 << _BITS:
        raise ValueError(f"varint value {value} outside [0, 2**64)")
    out = bytearray()
    while value >= 0x80:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def get_varint(buf: memoryview, pos: int, what: str) -> tuple[int, int]:
    """Decode a LEB128 varint below 2**64 at `pos`; return (value, next pos).

    `NativeDecodeError` naming `what` if it runs past the buffer or is wider than 64 bits.
    """
    value = shift = 0
    end = len(buf)
    while True:
        if pos >= end:
            raise NativeDecodeError(f"{what}: truncated or overlong varint")
        b = buf[pos]
        pos += 1
        if _BITS - shift < 7 and b >> (_BITS - shift):
            raise NativeDecodeError(f"{what}: truncated or overlong varint")
        value |= (b & 0x7F) << shift
        if not b & 0x80:
            return value, pos
        shift += 7
