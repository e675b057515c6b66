"""Quantize / dequantize a whole state dict with per-layer-type thresholds (§4.2).

Two passes over the tensors chosen by the policy:

1. sketch each tensor (and |g w| when a gradient is given), merge the magnitude and
   sensitivity sketches of all tensors of one layer type, and read that type's prune
   and protect thresholds from the merged sketches: one fraction per layer type;
2. quantize each tensor against its type's thresholds, reusing its pass-1 sketch.

Only sketches (a few KB each) are kept between the passes, so memory stays near one
tensor's working set.  Tensors the policy leaves alone map to None (keep lossless).
"""
from __future__ import annotations

from typing import Literal, Mapping

import torch

from mvc.layer_types import layer_type
from mvc.quant.config import QuantConfig, QuantPolicy
from mvc.quant.errors import NonFiniteTensorError, QuantConfigError, QuantStateError
from mvc.quant.importance import sensitivity
from mvc.quant.partition import Thresholds, thresholds
from mvc.quant.sketch import LogSketch
from mvc.quant.tensor import QuantizedTensor, quantize_prepared

NonFinitePolicy = Literal["raise", "lossless"]


def _group_thresholds(names: list[str], sketches: dict[str, LogSketch],
                      sens_sketches: dict[str, LogSketch], config: QuantConfig,
                      ltype: str) -> Thresholds:
    lq = config.for_layer_type(ltype)
    mag = LogSketch(config.alpha).merge(*(sketches[n].abs() for n in names))
    sens = None
    needs_sens = lq.prune > 0 and lq.prune_metric == "sensitivity"
    # (a sensitivity rule's gradients were checked up front: `check_sensitivity_grads`)
    if sens_sketches and (lq.protect > 0 or needs_sens):
        sens = LogSketch(config.alpha).merge(*(sens_sketches[n] for n in names
                                               if n in sens_sketches))
    return thresholds(mag, sens, prune=lq.prune, prune_metric=lq.prune_metric, protect=lq.protect)


def check_sensitivity_grads(tensors: Mapping[str, torch.Tensor], config: QuantConfig,
                            policy: QuantPolicy, grads: Mapping[str, torch.Tensor] | None
                            ) -> None:
    """Raise `QuantConfigError` naming the first tensor `config` prunes by sensitivity that
    has no gradient in `grads` (what `quantize_state` raises), before any work."""
    for name, t in tensors.items():
        if not policy.should_quantize(name, t):
            continue
        ltype = layer_type(name, t.shape)
        lq = config.for_layer_type(ltype)
        if lq.prune > 0 and lq.prune_metric == "sensitivity" and name not in (grads or {}):
            raise QuantConfigError(
                f"prune_metric='sensitivity' for {ltype} tensors needs a gradient for {name!r}"
                if grads else
                f"prune_metric='sensitivity' for {ltype} tensors needs gradients (grads=None)")


def quantize_state(tensors: Mapping[str, torch.Tensor], config: QuantConfig,
                   policy: QuantPolicy | None = None,
                   grads: Mapping[str, torch.Tensor] | None = None, seed: int = 0, *,
                   nonfinite: NonFinitePolicy = "raise",
                   init: Mapping[str, torch.Tensor] | None = None,
                   ) -> dict[str, QuantizedTensor | None]:
    """Quantize every tensor the policy selects; others (and, with nonfinite="lossless",
    tensors holding NaN/Inf) map to None.

    grads: optional gradients by name, enabling sensitivity protection / pruning.
    seed:  k-means++ seed used for every tensor (results are deterministic).
    init:  warm-start centroids by name (e.g. the parent commit's), used where the
           bin count matches (the uniform family: where they are a grid of its size whose
           step is still good); they keep levels stable between commits.
    Raises `NonFiniteTensorError` naming the first NaN/Inf tensor when nonfinite="raise".
    """
    if not isinstance(config, QuantConfig):
        raise QuantConfigError(f"config must be a QuantConfig, got {type(config).__name__}")
    if nonfinite not in ("raise", "lossless"):
        raise QuantConfigError(f"nonfinite must be 'raise' or 'lossless', got {nonfinite!r}")
    policy = policy or QuantPolicy()
    check_sensitivity_grads(tensors, config, policy, grads)
    grads = grads or {}
    out: dict[str, QuantizedTensor | None] = {}
    groups: dict[str, list[str]] = {}
    sketches: dict[str, LogSketch] = {}
    sens_sketches: dict[str, LogSketch] = {}
    for name, t in tensors.items():
        out[name] = None
        if not policy.should_quantize(name, t):
            continue
        x = t.detach().reshape(-1).to(torch.float32)
        try:
            sketches[name] = LogSketch.from_tensor(x, config.alpha, name=name)
            g = grads.get(name)
            if g is not None:
                sens_sketches[name] = LogSketch.from_tensor(sensitivity(t, g, name=name),
                                                            config.alpha, name=name)
        except NonFiniteTensorError:
            if nonfinite == "raise":
                raise
            sketches.pop(name, None)
            continue
        groups.setdefault(layer_type(name, t.shape), []).append(name)
    for ltype, names in groups.items():
        thr = _group_thresholds(names, sketches, sens_sketches, config, ltype)
        bins = config.for_layer_type(ltype).bins
        for name in names:
            t = tensors[name]
            x = t.detach().reshape(-1).to(torch.float32).contiguous()
            sens = sensitivity(t, grads[name], name=name) if (
                thr.needs_sensitivity and name in sens_sketches) else None
            tthr = thr
            if sens is None and thr.protect_sensitivity is not None:
                tthr = Thresholds(thr.prune, thr.prune_metric, thr.protect_magnitude, None)
            out[name] = quantize_prepared(t, x, sketches.pop(name), sens, tthr, bins,
                                          init=(init or {}).get(name),
                                          seed=seed, sigma=config.sigma, family=config.family)
    return out


def dequantize_state(quantized: Mapping[str, QuantizedTensor | None],
                     lossless: Mapping[str, torch.Tensor] | None = None) -> dict[str, torch.Tensor]:
    """Rebuild a state dict: dequantized tensors, and `lossless[name]` where the entry is None.

    Raises `QuantStateError` when a None entry has no lossless tensor.
    """
    lossless = lossless or {}
    out: dict[str, torch.Tensor] = {}
    for name, q in quantized.items():
        if q is not None:
            out[name] = q.dequantize()
        elif name in lossless:
            out[name] = lossless[name]
        else:
            raise QuantStateError(
                f"tensor {name!r} was kept lossless but no value was given for it")
    return out
