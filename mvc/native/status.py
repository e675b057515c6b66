"""Map the native coders' status codes (native/status.h) to mvc errors.

Decoders turn every failure into `NativeDecodeError`: the bytes are corrupt,
truncated or hostile.  Encoders fail only on bad arguments (`NativeArgumentError`),
memory exhaustion (`MemoryError`) or a bug (`NativeCoderError`).  These are
the bottom layer's own errors: the codecs above catch `NativeDecodeError` where
they call a decoder and raise their `CodecError` from it.
"""
from __future__ import annotations

from mvc.errors import DataError, InternalError, UsageError

BytesLike = bytes | bytearray | memoryview

OK = 0
ERR_CORRUPT = -1
ERR_TRUNCATED = -2
ERR_ARG = -3
ERR_NOMEM = -4
ERR_CAPACITY = -5
ERR_RANGE = -6
ERR_INTERNAL = -7
ERR_AMBIGUOUS = -8

_NAMES = {
    ERR_CORRUPT: "corrupt input",
    ERR_TRUNCATED: "truncated input or trailing bytes",
    ERR_ARG: "invalid argument",
    ERR_NOMEM: "out of memory",
    ERR_CAPACITY: "output buffer too small",
    ERR_RANGE: "value out of range",
    ERR_INTERNAL: "internal invariant broken",
    ERR_AMBIGUOUS: ("a rANS block written by mvc's encoder before its exact division (Nov 2026), "
                    "which wrote two different inputs as this block: it cannot be recovered"),
}


class NativeArgumentError(UsageError):
    """An encoder was handed input it cannot encode (wrong dtype, negative values...)."""

    exit_code = 50


class NativeCoderError(InternalError):
    """A native coder reported an internal failure: a bug in mvc."""

    exit_code = 51


class NativeDecodeError(DataError):
    """Bytes handed to a native decoder are corrupt, truncated or hostile."""

    exit_code = 125


def describe(rc: int) -> str:
    """Human-readable name of a native status code."""
    return _NAMES.get(rc, f"status {rc}")


def check_decode(rc: int, what: str) -> int:
    """Return `rc` if it is a success, else raise `NativeDecodeError` naming `what`."""
    if rc < 0:
        if rc == ERR_NOMEM:
            raise MemoryError(f"{what}: out of memory")
        raise NativeDecodeError(f"{what}: {describe(rc)}")
    return rc


def check_encode(rc: int, what: str) -> int:
    """Return `rc` if it is a success, else raise the matching encoder error."""
    if rc < 0:
        if rc in (ERR_ARG, ERR_RANGE):
            raise NativeArgumentError(f"{what}: {describe(rc)}")
        if rc == ERR_NOMEM:
            raise MemoryError(f"{what}: out of memory")
        raise NativeCoderError(f"{what}: {describe(rc)}")
    return rc
