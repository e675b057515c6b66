"""The tensor codec interface and the registry of codecs by name.

A codec turns one CPU tensor into a small JSON-able `meta` dict plus a byte
payload, and back.  The repository splits the payload into content-addressed
chunks, so codecs never deal with storage.  The codec name (with its version,
e.g. ``"raw/1"``) is recorded per tensor in every snapshot; a name once
released is never reused for a different format, so old repositories keep
reading.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Iterable, Protocol, Union

import torch

from mvc.errors import DataError, UsageError

BytesLike = Union[bytes, bytearray, memoryview]


class CodecError(DataError):
    """A payload could not be decoded: it is corrupt, truncated or hostile."""

    exit_code = 12


class UnknownCodecError(DataError):
    """A snapshot names a codec this version of mvc does not know."""

    exit_code = 13


@dataclass
class Encoded:
    """One encoded tensor: codec-specific metadata plus the payload pieces.

    `parts` is consumed once, in order; their concatenation is the payload.
    Yielding several pieces lets a codec stream a huge tensor without building
    one giant buffer.
    """

    meta: dict[str, Any]
    parts: Iterable[BytesLike]
    extra: dict[str, Any] = field(default_factory=dict)


class TensorCodec(Protocol):
    """What every codec implements."""

    name: str
    lossless: bool

    def encode(self, tensor: torch.Tensor) -> Encoded:
        """Encode a contiguous CPU tensor."""

    def decode(self, meta: dict[str, Any], payload: BytesLike, dtype: torch.dtype,
               shape: tuple[int, ...]) -> torch.Tensor:
        """Rebuild the tensor from `encode`'s meta and the concatenated payload."""


_REGISTRY: dict[str, TensorCodec] = {}


def register(codec: TensorCodec) -> TensorCodec:
    """Make `codec` available under `codec.name`; names are permanent."""
    if codec.name in _REGISTRY and _REGISTRY[codec.name] is not codec:
        raise UsageError(f"codec name {codec.name!r} is already registered")
    _REGISTRY[codec.name] = codec
    return codec


def get_codec(name: str) -> TensorCodec:
    """Return the codec registered as `name`."""
    try:
        return _REGISTRY[name]
    except KeyError:
        raise UnknownCodecError(
            f"unknown codec {name!r}: written by a newer mvc? (known: {', '.join(sorted(_REGISTRY))})"
        ) from None


def registered() -> list[str]:
    """Names of every registered codec."""
    return sorted(_REGISTRY)


def tensor_bytes(t: torch.Tensor) -> memoryview:
    """The raw bytes of a contiguous CPU tensor of any dtype, without copying."""
    flat = t.reshape(-1)
    if flat.numel() == 0:
        return memoryview(b"")
    as_u8 = flat.view(torch.uint8)
    return memoryview(as_u8.numpy()).cast("B")


def tensor_from_bytes(payload: BytesLike, dtype: torch.dtype, shape: tuple[int, ...]) -> torch.Tensor:
    """Inverse of `tensor_bytes`: a tensor of `dtype`/`shape` over a copy-free buffer when possible."""
    numel = 1
    for d in shape:
        numel *= d
    itemsize = torch.empty((), dtype=dtype).element_size()
    if len(payload) != numel * itemsize:
        raise CodecError(
            f"payload holds {len(payload)} bytes, {dtype} {list(shape)} needs {numel * itemsize}"
        )
    if numel == 0:
        return torch.empty(shape, dtype=dtype)
    buf = payload if isinstance(payload, bytearray) else bytearray(payload)
    # torch.frombuffer keeps a reference to the object but no buffer export, so a bytearray
    # could still be resized (its memory moved) under the tensor.  Through a memoryview, the
    # view's export pins the bytearray for as long as the tensor lives; the view itself has
    # no export, so the collector can clear it safely.
    u8 = torch.frombuffer(memoryview(buf), dtype=torch.uint8)
    return u8.view(dtype).reshape(shape)
