"""Errors raised by the quantizer (exit codes 30-39).

`NonFiniteTensorError` is the quantizer's side of the NaN/Inf policy: a tensor
holding NaN or +-Inf is never binned; the caller (the repository) decides whether
to keep that tensor losslessly or to refuse the commit.
"""
from __future__ import annotations

from mvc.errors import DataError, MvcError, UsageError


class QuantError(MvcError):
    """Base of every quantizer error."""

    exit_code = 30


class NonFiniteTensorError(QuantError):
    """A tensor (or its gradient) holds NaN or +-Inf, so it cannot be quantized."""

    exit_code = 31

    def __init__(self, name: str | None, count: int | None = None, what: str = "tensor") -> None:
        self.tensor_name = name
        self.count = count
        label = f"{what} {name!r}" if name else what
        n = f"{count} " if count is not None else ""
        super().__init__(
            f"{label} holds {n}non-finite value(s) (NaN/Inf, or beyond float32 range); "
            "it cannot be quantized and must be stored losslessly or rejected"
        )


class QuantConfigError(QuantError, UsageError):
    """An invalid quantization argument or configuration."""

    exit_code = 32


class QuantizedPartsError(QuantError, DataError):
    """Stored quantized parts (levels / centroids / protected) are inconsistent."""

    exit_code = 33


class QuantStateError(QuantError, UsageError):
    """A state-dict level request cannot be served (e.g. a lossless tensor is missing)."""

    exit_code = 34
