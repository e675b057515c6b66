"""What a tensor record says about itself, read without decoding it (and without torch).

Walking history's objects (`ObjectDB.reachable`: stats, fsck, push and fetch) asks each
record whether its codec stores a quantized tensor and which parent a delta is encoded
against, and fsck compares its `stored_bytes` with its chunks.  None of that needs the
tensor, so none of it imports torch: the codec registry does (`mvc.codecs`, whose codecs
are torch code), and it is asked only about a codec name this table does not hold (one
registered at run time, or an unknown one).
"""
from __future__ import annotations

from typing import Protocol

from mvc.errors import DataError
from mvc.repo.objects import TensorRecord

#: (stores a quantized tensor, needs its parent's levels) of the codecs mvc ships, by name.
#: A codec name is permanent (`mvc.codecs.base`), so this never goes stale;
#: tests/repo/test_records.py checks it against the registry.
BUILTIN_CODECS: dict[str, tuple[bool, bool]] = {
    "raw/1": (False, False),
    "lossless/1": (False, False),
    "qbase/1": (True, False),
    "qdelta/1": (True, True),
}


def codec_kind(name: str) -> tuple[bool, bool] | None:
    """(is_quantized, has_parent) of codec `name`, or None when no codec has that name."""
    kind = BUILTIN_CODECS.get(name)
    if kind is not None:
        return kind
    from mvc.codecs.base import find_codec  # the registry (and torch): other names only

    codec = find_codec(name)
    return None if codec is None else (codec.is_quantized, codec.has_parent)


def is_known_codec(name: str) -> bool:
    """Whether a codec of that name is registered (fsck reports records of any other)."""
    return codec_kind(name) is not None


def is_quantized(rec: TensorRecord) -> bool:
    """Whether the record stores a quantized tensor (its codec says so; unknown codec: no)."""
    kind = codec_kind(rec.codec)
    return kind is not None and kind[0]


def is_delta(rec: TensorRecord) -> bool:
    """Whether the record is encoded against the same tensor in its parent snapshot."""
    kind = codec_kind(rec.codec)
    return kind is not None and kind[0] and kind[1]


class BrokenChainError(DataError):
    """A delta chain cannot be walked: a delta names no parent, or one its parent snapshot lacks,
    or the chain loops."""

    exit_code = 27


def parent_ref(rec: TensorRecord) -> tuple[str, str] | None:
    """(original snapshot id, name) a delta record is encoded against."""
    if not is_delta(rec):
        return None
    p = rec.meta.get("parent") or {}
    if not isinstance(p.get("snapshot"), str) or not isinstance(p.get("name"), str):
        raise BrokenChainError(f"delta tensor {rec.name!r} does not name its parent")
    return p["snapshot"], p["name"]


class SizedBlobs(Protocol):
    """The part of a blob store `payload_size_problems` reads."""

    def size(self, oid: str) -> int: ...


def payload_size_problems(store: SizedBlobs, rec: TensorRecord, present: set[str]) -> list[str]:
    """For fsck: the record's `stored_bytes` against its chunks' sizes (missing chunks are
    reported by the caller)."""
    if not all(oid in present for oid in rec.chunks):
        return []
    try:
        held = sum(store.size(oid) for oid in rec.chunks)
    except DataError:  # removed meanwhile: the caller's presence check reports it next run
        return []
    if held == rec.stored_bytes:
        return []
    return [f"tensor {rec.name!r}: chunks hold {held} bytes, snapshot says {rec.stored_bytes}"]
