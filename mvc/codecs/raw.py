"""`raw/1`: the tensor's bytes as they are (little-endian, C order)."""
from __future__ import annotations

from typing import Any

import torch

from mvc.codecs.base import BytesLike, Encoded, on_device, register, tensor_bytes, tensor_from_bytes


class RawCodec:
    """Exact storage with no compression; the fallback every build can read."""

    name = "raw/1"
    lossless = True
    is_quantized = False
    has_parent = False

    def encode(self, tensor: torch.Tensor) -> Encoded:
        return Encoded(meta={}, parts=[tensor_bytes(tensor)])

    def decode(self, meta: dict[str, Any], payload: BytesLike, dtype: torch.dtype,
               shape: tuple[int, ...], device: torch.device | str | None = None) -> torch.Tensor:
        return on_device(tensor_from_bytes(payload, dtype, shape), device)


RAW = register(RawCodec())
