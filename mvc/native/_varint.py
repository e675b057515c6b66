"""LEB128 varints for the small headers of the native stream formats."""
from __future__ import annotations

from mvc.native.status import NativeDecodeError


def put_varint(value: int) -> bytes:
    """Encode a non-negative int as LEB128."""
    out = bytearray()
    while value >= 0x80:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def get_varint(buf: memoryview, pos: int, what: str) -> tuple[int, int]:
    """Decode a LEB128 varint (at most 10 bytes) at `pos`; return (value, next pos)."""
    value = shift = 0
    end = len(buf)
    while True:
        if pos >= end or shift > 63:
            raise NativeDecodeError(f"{what}: truncated or overlong varint")
        b = buf[pos]
        pos += 1
        value |= (b & 0x7F) << shift
        if not b & 0x80:
            return value, pos
        shift += 7
