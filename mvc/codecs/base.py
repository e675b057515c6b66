"""The codec interfaces and the registry of codecs by name.

A codec turns one tensor into a small JSON-able `meta` dict plus a byte
payload, and back.  The repository splits the payload into content-addressed
chunks, so codecs never deal with storage.  The codec name (with its version,
e.g. ``"raw/1"``) is recorded per tensor in every snapshot; a name once
released is never reused for a different format, so old repositories keep
reading.

Two kinds share the registry, and every codec says which it is:

* exact codecs (`TensorCodec`: ``raw/1``, ``lossless/1``) store a tensor's bits;
* quantized codecs (`QuantizedCodec`: ``qbase/1``, ``qdelta/1``) store a
  `mvc.quant.QuantizedTensor`, on its own or, when `has_parent` is true, as a
  delta against the same tensor's levels in the parent commit.

Callers ask the codec (`is_quantized`, `has_parent`), never its name.  Decoders
take a target `device`: the decoded result is placed there (today decoding runs
on the CPU and the result is moved; a GPU decoder can honour it natively).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Iterable, Protocol, Sequence, Union

import torch

from mvc.errors import DataError, InternalError, UsageError

if TYPE_CHECKING:
    from mvc.quant import QuantizedTensor

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


class CodecKindError(InternalError):
    """An exact codec was asked for a quantized one's work, or the other way round (a bug)."""

    exit_code = 115


class Codec(Protocol):
    """What every registered codec declares about itself."""

    name: str
    #: Restores the tensor bit-exact.
    lossless: bool
    #: Stores a `QuantizedTensor` (levels, centroids, protected values), not the tensor's bits:
    #: a `QuantizedCodec`.
    is_quantized: bool
    #: Decoding needs the same tensor's levels from the parent commit (a delta).
    has_parent: bool


class TensorCodec(Codec, Protocol):
    """An exact codec: a tensor's bits in, the same bits out."""

    def encode(self, tensor: torch.Tensor) -> Encoded:
        """Encode a contiguous CPU tensor."""

    def decode(self, meta: dict[str, Any], payload: BytesLike, dtype: torch.dtype,
               shape: tuple[int, ...], device: torch.device | str | None = None) -> torch.Tensor:
        """Rebuild the tensor from `encode`'s meta and the concatenated payload, on `device`
        (None: the CPU)."""


#: One step of a delta chain: the record's meta and a loader of its payload (called once,
#: when the walk reaches the step, so a deep chain never sits in memory at once).
ChainStep = tuple[dict[str, Any], Callable[[], BytesLike]]


class QuantizedCodec(Codec, Protocol):
    """A codec of quantized tensors; `has_parent` says whether it needs the parent's levels."""

    def encode_quantized(self, q: QuantizedTensor, parent: QuantizedTensor | None = None
                         ) -> Encoded:
        """Encode `q`; `parent` (the same tensor in the parent commit) is required exactly when
        `has_parent` is true."""

    def decode_quantized(self, meta: dict[str, Any], payload: BytesLike, dtype: torch.dtype,
                         shape: tuple[int, ...], *, parent: QuantizedTensor | None = None,
                         device: torch.device | str | None = None) -> QuantizedTensor:
        """Rebuild the `QuantizedTensor` (levels bit-exact) on `device`; `parent` as for
        `encode_quantized`."""

    def decode_chain(self, base: QuantizedTensor, deltas: Sequence[ChainStep],
                     dtype: torch.dtype, shape: tuple[int, ...], *,
                     device: torch.device | str | None = None) -> QuantizedTensor:
        """The tensor at the end of a chain of this codec's deltas from `base`, oldest first
        (a codec without a parent takes an empty chain only)."""


AnyCodec = TensorCodec | QuantizedCodec

_REGISTRY: dict[str, AnyCodec] = {}


def register(codec: AnyCodec) -> AnyCodec:
    """Make `codec` available under `codec.name`; names are permanent."""
    if codec.name in _REGISTRY and _REGISTRY[codec.name] is not codec:
        raise UsageError(f"codec name {codec.name!r} is already registered")
    _REGISTRY[codec.name] = codec
    return codec


def get_codec(name: str) -> AnyCodec:
    """Return the codec registered as `name` (ask it `is_quantized` / `has_parent`)."""
    try:
        return _REGISTRY[name]
    except KeyError:
        raise UnknownCodecError(
            f"unknown codec {name!r}: written by a newer mvc? (known: {', '.join(sorted(_REGISTRY))})"
        ) from None


def find_codec(name: str) -> AnyCodec | None:
    """The codec registered as `name`, or None (a record of an unknown codec is reported
    where it is read)."""
    return _REGISTRY.get(name)


def tensor_codec(name: str) -> TensorCodec:
    """The exact codec registered as `name` (CodecKindError for a quantized one)."""
    codec = get_codec(name)
    if codec.is_quantized:
        raise CodecKindError(f"codec {name!r} stores quantized tensors, not a tensor's bits")
    return codec  # type: ignore[return-value]


def quantized_codec(name: str) -> QuantizedCodec:
    """The quantized codec registered as `name` (CodecKindError for an exact one)."""
    codec = get_codec(name)
    if not codec.is_quantized:
        raise CodecKindError(f"codec {name!r} stores a tensor's bits, not a quantized tensor")
    return codec  # type: ignore[return-value]


def registered(*, quantized: bool | None = None) -> list[str]:
    """Names of every registered codec (`quantized`: only those of that kind)."""
    return sorted(n for n, c in _REGISTRY.items() if quantized is None or c.is_quantized == quantized)


def exact_codecs() -> list[str]:
    """Names of the exact codecs: the values `commit.lossless_codec` may take."""
    return registered(quantized=False)


def on_device(t: torch.Tensor, device: torch.device | str | None) -> torch.Tensor:
    """`t` on `device` (None: where it is), for decoders honouring a target device."""
    return t if device is None else t.to(device)


def tensor_bytes(t: torch.Tensor) -> memoryview:
    """The raw bytes of a contiguous CPU tensor of any dtype, without copying."""
    flat = t.reshape(-1)
    if flat.numel() == 0:
        return memoryview(b"")
    as_u8 = flat.view(torch.uint8)
    return as_u8.numpy().data.cast("B")


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
