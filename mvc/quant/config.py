"""Quantization configuration and the policy of which tensors are quantized at all.

`QuantConfig` is one point of the search cube (quantizer family, bins, prune fraction and
metric, protect fraction), with separate values for embedding tensors (None = same as the
rest).  `family` is "kmeans" (Inshrinkerator's non-uniform levels, the default, and what a
stored config without the field means) or "uniform" (`mvc.quant.uniform`).  `feedback`: the
levels of every 2-D weight whose layer's input Hessian the commit knows are re-assigned with
GPTQ error feedback (`mvc.quant.feedback`); False (the default, and what a stored config
without the field means) quantizes each weight on its own.

`QuantPolicy` picks the tensors to quantize: floating-point tensors with at least
`min_numel` elements that are not biases or norm parameters; everything else
(small, integer, bool, complex tensors) stays lossless.  fnmatch patterns override:
`exclude` always keeps a tensor lossless, `include` quantizes any float tensor.
Both round-trip through JSON via `to_dict()` / `from_dict()`.
"""
from __future__ import annotations

import fnmatch
from dataclasses import asdict, dataclass, fields
from typing import Any, Mapping

import torch

from mvc.dtypes import QUANTIZABLE, float32_faithful
from mvc.layer_types import layer_type
from mvc.quant.errors import QuantConfigError
from mvc.quant.importance import check_metric
from mvc.quant.partition import check_fraction
from mvc.quant.sketch import check_alpha
from mvc.quant.uniform import DEFAULT_FAMILY, check_family

MAX_BINS = 1 << 20


def check_bins(bins: Any) -> int:
    """Validate a centroid count (any integer in [1, MAX_BINS], not only powers of two)."""
    if isinstance(bins, bool) or not isinstance(bins, int) or not 1 <= bins <= MAX_BINS:
        raise QuantConfigError(f"bins must be an int in [1, {MAX_BINS}], got {bins!r}")
    return bins


@dataclass(frozen=True)
class LayerQuant:
    """The resolved settings for one tensor."""

    bins: int
    prune: float
    prune_metric: str
    protect: float
    family: str = DEFAULT_FAMILY


def _from_dict(cls: type, data: Mapping[str, Any]) -> Any:
    if not isinstance(data, Mapping):
        raise QuantConfigError(f"{cls.__name__} must be given a mapping, got {type(data).__name__}")
    names = {f.name for f in fields(cls)}
    unknown = sorted(set(data) - names)
    if unknown:
        raise QuantConfigError(f"unknown {cls.__name__} field(s): {', '.join(unknown)}")
    try:
        return cls(**dict(data))
    except TypeError as exc:
        raise QuantConfigError(f"invalid {cls.__name__}: {exc}") from exc


@dataclass(frozen=True)
class QuantConfig:
    """How to quantize: one setting for all layer types, another (optional) for embeddings."""

    bins: int = 16
    prune: float = 0.0
    prune_metric: str = "magnitude"
    protect: float = 0.0
    embedding_bins: int | None = None
    embedding_prune: float | None = None
    embedding_prune_metric: str | None = None
    embedding_protect: float | None = None
    alpha: float = 0.01
    sigma: float = 0.2
    family: str = DEFAULT_FAMILY
    feedback: bool = False

    def __post_init__(self) -> None:
        check_family(self.family)
        if not isinstance(self.feedback, bool):
            raise QuantConfigError(f"feedback must be true or false, got {self.feedback!r}")
        check_bins(self.bins)
        check_fraction(self.prune, "prune")
        check_fraction(self.protect, "protect")
        check_metric(self.prune_metric)
        if self.embedding_bins is not None:
            check_bins(self.embedding_bins)
        if self.embedding_prune is not None:
            check_fraction(self.embedding_prune, "embedding_prune")
        if self.embedding_protect is not None:
            check_fraction(self.embedding_protect, "embedding_protect")
        if self.embedding_prune_metric is not None:
            check_metric(self.embedding_prune_metric)
        check_alpha(self.alpha)
        if not isinstance(self.sigma, (int, float)) or not 0.0 <= float(self.sigma) <= 1.0:
            raise QuantConfigError(f"sigma must be in [0, 1], got {self.sigma!r}")

    def for_layer_type(self, ltype: str) -> LayerQuant:
        """Settings for a layer type (embeddings use their own values where set)."""
        if ltype == "embedding":
            def pick(own: Any, default: Any) -> Any:
                return default if own is None else own
            return LayerQuant(pick(self.embedding_bins, self.bins),
                              float(pick(self.embedding_prune, self.prune)),
                              pick(self.embedding_prune_metric, self.prune_metric),
                              float(pick(self.embedding_protect, self.protect)), self.family)
        return LayerQuant(self.bins, float(self.prune), self.prune_metric, float(self.protect),
                          self.family)

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict; `from_dict(to_dict())` gives an equal config.  The default family
        (k-means) and feedback off are left out: such a config is stored as it was before
        families and error feedback existed."""
        out = asdict(self)
        if out["family"] == DEFAULT_FAMILY:
            del out["family"]
        if not out["feedback"]:
            del out["feedback"]
        return out

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> QuantConfig:
        """Rebuild from `to_dict()` output; unknown keys raise `QuantConfigError`."""
        return _from_dict(cls, data)


@dataclass(frozen=True)
class QuantPolicy:
    """Which tensors are quantized; the rest are stored losslessly."""

    min_numel: int = 4096
    include: tuple[str, ...] = ()
    exclude: tuple[str, ...] = ()
    lossless_types: tuple[str, ...] = ("bias", "norm")

    def __post_init__(self) -> None:
        n = self.min_numel
        if isinstance(n, bool) or not isinstance(n, int) or n < 0:
            raise QuantConfigError(f"min_numel must be a non-negative int, got {self.min_numel!r}")
        for attr in ("include", "exclude", "lossless_types"):
            val = getattr(self, attr)
            if isinstance(val, str) or not all(isinstance(p, str) for p in val):
                raise QuantConfigError(f"{attr} must be a sequence of strings, got {val!r}")
            object.__setattr__(self, attr, tuple(val))

    def should_quantize(self, name: str, tensor: torch.Tensor) -> bool:
        """True if `tensor` (named `name` in the state dict) is to be quantized."""
        if tensor.dtype not in QUANTIZABLE:   # include= cannot make an fp8 tensor quantizable
            return False
        if not float32_faithful(tensor):
            return False
        if any(fnmatch.fnmatchcase(name, p) for p in self.exclude):
            return False
        if any(fnmatch.fnmatchcase(name, p) for p in self.include):
            return True
        if tensor.numel() < self.min_numel:
            return False
        return layer_type(name, tensor.shape) not in self.lossless_types

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict (tuples become lists)."""
        return {k: list(v) if isinstance(v, tuple) else v for k, v in asdict(self).items()}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> QuantPolicy:
        """Rebuild from `to_dict()` output; unknown keys raise `QuantConfigError`."""
        return _from_dict(cls, data)
