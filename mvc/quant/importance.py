"""Parameter importance scores (Inshrinkerator §4.1).

magnitude:   I_m(w) = |w|
sensitivity: I_s(w) = |g * w|, g being the gradient (in training, an exponential moving
             average of recent gradients; capturing it is the training loop's job).

Scores are float32, flattened in C order, on the weight's device.
"""
from __future__ import annotations

import torch

from mvc.quant.errors import NonFiniteTensorError, QuantConfigError

METRICS = ("magnitude", "sensitivity")
_F32_MAX = torch.finfo(torch.float32).max


def check_metric(metric: str) -> str:
    """Validate a pruning metric name."""
    if metric not in METRICS:
        raise QuantConfigError(f"prune_metric must be one of {METRICS}, got {metric!r}")
    return metric


def magnitude(w: torch.Tensor) -> torch.Tensor:
    """|w| as a flat float32 tensor."""
    return w.detach().reshape(-1).to(torch.float32).abs()


def sensitivity(w: torch.Tensor, grad: torch.Tensor, *, name: str | None = None) -> torch.Tensor:
    """|grad * w| as a flat float32 tensor on w's device.

    Raises `QuantConfigError` when the shapes differ and `NonFiniteTensorError` when the
    gradient holds NaN/Inf.  A product overflowing float32 saturates at float32 max (it
    is simply the most important parameter).
    """
    if tuple(grad.shape) != tuple(w.shape):
        raise QuantConfigError(
            f"gradient for {name or 'tensor'} has shape {tuple(grad.shape)}, "
            f"expected {tuple(w.shape)}")
    g = grad.detach().reshape(-1).to(device=w.device, dtype=torch.float32)
    bad = int((~torch.isfinite(g)).sum().item())
    if bad:
        raise NonFiniteTensorError(name, bad, what="gradient of tensor")
    return sensitivity_values(w.detach().reshape(-1), g)


def sensitivity_values(w: torch.Tensor, g: torch.Tensor) -> torch.Tensor:
    """|g * w| in float32 for flat `w` and `g` of one length and device, saturated at float32
    max, with no checks: `sensitivity`'s arithmetic, which the batched quantizer
    (`mvc.quant.batched`) runs on slices of gradients `sensitivity` has already checked."""
    s = (g.to(torch.float32) * w.to(torch.float32)).abs_()
    return s.clamp_(max=_F32_MAX)
