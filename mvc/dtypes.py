"""Torch dtypes as mvc stores them: the one set of dtype helpers.

Snapshots (tensor records), state skeletons and leaves, and checkpoint-file
messages all name a dtype by torch's attribute name ("float32", "bfloat16");
bit-exact copies go through the integer dtype of the same element size.  A
bottom module beside `mvc.errors`: every layer may use it.
"""
from __future__ import annotations

import torch

from mvc.errors import DataError

__all__ = ["BITS_DTYPES", "QUANTIZABLE", "bits_view", "dtype_name", "float32_faithful", "parse_dtype"]

#: The integer dtype of each element size: views through it move any dtype
#: bit-exactly, even those without copy kernels (uint1..7, float8 variants).
BITS_DTYPES = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}

#: The floating-point dtypes a lossy commit may quantize. The 1-byte ones (float8 variants,
#: the e8m0 scale type) and packed float4 are stored exactly: they are already 8 bits or
#: fewer, torch lacks most kernels for them (float4 does not even convert to float32), and an
#: e8m0 scale has no zero for a pruned value to take.
QUANTIZABLE = frozenset({torch.float16, torch.bfloat16, torch.float32, torch.float64})


def dtype_name(dtype: torch.dtype) -> str:
    """The stored name of `dtype`: torch's attribute name, e.g. "float32"."""
    return str(dtype).removeprefix("torch.")


def parse_dtype(name: object, where: str = "snapshot") -> torch.dtype:
    """The torch dtype a stored name denotes.

    `DataError` naming `where` for a name this torch lacks (written by a newer
    one) or that is no dtype name at all.
    """
    dtype = getattr(torch, name, None) if isinstance(name, str) else None
    if not isinstance(dtype, torch.dtype):
        raise DataError(f"unknown torch dtype {name!r} in {where} (written by a newer torch?)")
    return dtype


def bits_view(t: torch.Tensor) -> torch.Tensor:
    """Same-shape integer view of `t` (same element size), so copies of it are bit-exact;
    `t` itself when it is that integer dtype already or no integer dtype has its size."""
    bits = BITS_DTYPES.get(t.element_size())
    return t if bits is None or t.dtype == bits else t.view(bits)


#: How much of a float64 tensor's norm its float32 copy may lose and still be quantized.
FLOAT32_LOSS = 1e-6


def float32_faithful(t: torch.Tensor) -> bool:
    """Whether the float32 copy the quantizer works on keeps `t`'s values (True for a dtype no
    wider than float32). A float64 tensor whose values lie below float32's range (1e-50, say)
    becomes zeros, which would be measured against themselves as a perfect quantization; one
    past it becomes infinite. (NaN / Inf values of its own are the non-finite policy's to
    judge: True here.)"""
    if t.dtype != torch.float64:
        return True
    x = t.detach()
    x32 = x.to(torch.float32)
    if not bool(torch.isfinite(x32).all()):
        return not bool(torch.isfinite(x).all())
    norm = float(x.norm())
    return norm == 0.0 or float((x - x32.to(torch.float64)).norm()) <= FLOAT32_LOSS * norm
