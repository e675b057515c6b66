"""Error feedback (GPTQ, Frantar et al. 2023): levels chosen column by column so that a linear
layer's outputs on calibration inputs move as little as possible.

Plain quantization rounds each weight to its nearest level on its own. A linear layer computes
y = W x, so what matters is the error of W x over the inputs the layer sees; with
H = sum x x^T over calibration inputs (the layer's input second moments), the output error of a
change D of W is tr(D H D^T). GPTQ quantizes one input column at a time and spreads that
column's rounding error over the columns not quantized yet, weighted by the inverse Hessian, so
later columns compensate for earlier ones.

The levels come from the same quantization as without feedback: the centroids (k-means or the
uniform grid) and the pruned / protected masks of `quantize()` on the original tensor are kept,
and only the assignment changes. So the result is an ordinary `QuantizedTensor` -- same
convention (level k pruned, k + 1 protected with its value stored), same codecs, deltas and
readers -- whose dequantized weights fit the layer's inputs better. Protected parameters keep
their original values, as without feedback (the difference from the compensated value is
spread over the later columns like any rounding error), so every quantization's error sums
follow the one convention: protected entries restore exactly.

`HessianCollector` gathers H per linear layer from forward hooks on calibration inputs.
"""
from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any

import torch

from mvc.quant.assign import level_dtype, midpoints
from mvc.quant.errors import QuantConfigError
from mvc.quant.tensor import QuantizedTensor

#: Dampening added to H's diagonal, as a fraction of its mean diagonal (GPTQ's default).
DAMP = 0.01
#: Columns quantized together before their error is applied to the rest (GPTQ's lazy batch).
BLOCK = 128


class FeedbackError(QuantConfigError):
    """Error feedback asked for a tensor it cannot serve (not 2-D, a Hessian of the wrong size)."""

    exit_code = 85


def _inverse_cholesky(h: torch.Tensor, damp: float) -> torch.Tensor:
    """Upper Cholesky factor of H^-1 (float64), with `damp` * mean(diag H) on the diagonal."""
    h = h.to(torch.float64).clone()
    dead = torch.diagonal(h) == 0
    h[dead, dead] = 1.0  # an input that was always 0: its column is free (any level fits)
    mean = float(torch.diagonal(h).mean())
    h += torch.eye(h.shape[0], dtype=h.dtype, device=h.device) * (damp * mean)
    for _ in range(6):  # a nearly singular H: more dampening until it factors
        try:
            low = torch.linalg.cholesky(h)
            break
        except RuntimeError:
            h += torch.eye(h.shape[0], dtype=h.dtype, device=h.device) * mean
    else:
        raise FeedbackError("the input Hessian does not factor even with heavy dampening")
    inv = torch.cholesky_inverse(low)
    return torch.linalg.cholesky(inv, upper=True)


def feedback_levels(q: QuantizedTensor, w: torch.Tensor, h: torch.Tensor, *,
                    damp: float = DAMP, block: int = BLOCK) -> QuantizedTensor:
    """`q` (a quantization of the 2-D weight `w`, out x in) re-assigned with error feedback
    against the input Hessian `h` (in x in): same centroids, same pruned and protected
    positions, levels chosen column by column (GPTQ)."""
    if w.dim() != 2 or tuple(q.shape) != tuple(w.shape):
        raise FeedbackError(f"error feedback needs a 2-D weight its quantization matches, got "
                            f"{tuple(w.shape)} and {tuple(q.shape)}")
    rows, cols = w.shape
    if tuple(h.shape) != (cols, cols):
        raise FeedbackError(f"input Hessian of shape {tuple(h.shape)} for a weight with {cols} inputs")
    dev = w.device
    k = q.bins
    u = _inverse_cholesky(h.to(dev), damp)
    cen = q.centroids.to(device=dev, dtype=torch.float32)
    mids = midpoints(q.centroids.detach().cpu().to(torch.float32)).to(dev)
    lv_in = q.levels.to(dev)
    pruned, protected = lv_in == k, lv_in == k + 1
    orig = w.detach().to(torch.float64)
    work = orig.clone()
    work[:, torch.diagonal(h.to(dev)) == 0] = 0.0
    levels = torch.empty((rows, cols), dtype=torch.int64, device=dev)
    for c0 in range(0, cols, block):
        c1 = min(c0 + block, cols)
        err = torch.zeros((rows, c1 - c0), dtype=torch.float64, device=dev)
        for j in range(c0, c1):
            col = work[:, j]
            lv = torch.bucketize(col.to(torch.float32), mids, right=False).to(torch.int64)
            val = cen[lv].to(torch.float64)
            lv = torch.where(pruned[:, j], k, torch.where(protected[:, j], k + 1, lv))
            val = torch.where(pruned[:, j], 0.0, torch.where(protected[:, j], orig[:, j], val))
            levels[:, j] = lv
            e = (col - val) / u[j, j]
            work[:, j + 1:c1] -= e[:, None] * u[j, j + 1:c1][None, :]
            err[:, j - c0] = e
        work[:, c1:] -= err @ u[c0:c1, c1:]
    final = levels.to(level_dtype(k))
    # the same positions as `q`'s, so the same exact values in the same order
    return QuantizedTensor(final, q.centroids.to(dev), q.protected.to(dev), q.dtype, k)


def output_error(w: torch.Tensor, restored: torch.Tensor, h: torch.Tensor) -> float:
    """tr((W' - W) H (W' - W)^T): the summed squared output error of a linear layer over the
    inputs `h` was collected from."""
    d = (restored.to(torch.float64) - w.to(torch.float64))
    return float((d @ h.to(torch.float64) * d).sum())


class HessianCollector:
    """Input Hessians H = sum x x^T of a module's `nn.Linear` layers over calibration inputs,
    by weight name (``layers.0.fc.weight``), from forward hooks; and of the packed input
    projection of a self-attention `nn.MultiheadAttention` (``attn.in_proj_weight``: query,
    key and value are one tensor, so it is one linear map of it), which torch's transformer
    layers call without going through an `nn.Linear` (its ``out_proj`` is not reachable by a
    hook: left without).

    ``with HessianCollector(model) as hc: model(batch)`` for each calibration batch, then
    `hc.hessians`. Float64 sums on the layer's device; the hooks come off on exit."""

    def __init__(self, model: torch.nn.Module,
                 select: Callable[[str, torch.nn.Module], bool] | None = None) -> None:
        self.model = model
        self.select = select
        self.hessians: dict[str, torch.Tensor] = {}
        self.counts: dict[str, int] = {}
        self._handles: list[Any] = []
        self._mixed: set[str] = set()

    def __enter__(self) -> HessianCollector:
        for name, mod in self.model.named_modules():
            if self.select is not None and not self.select(name, mod):
                continue
            if isinstance(mod, torch.nn.Linear):
                key = f"{name}.weight" if name else "weight"
                self._handles.append(mod.register_forward_pre_hook(self._hook(key)))
            elif isinstance(mod, torch.nn.MultiheadAttention) and mod.in_proj_weight is not None:
                key = f"{name}.in_proj_weight" if name else "in_proj_weight"
                self._handles.append(mod.register_forward_pre_hook(self._hook(key, True)))
        return self

    def __exit__(self, *exc: object) -> None:
        for hd in self._handles:
            hd.remove()
        self._handles.clear()

    def _hook(self, key: str, self_attention: bool = False) -> Callable[..., None]:
        def hook(_mod: torch.nn.Module, args: tuple) -> None:
            if key in self._mixed:
                return
            if self_attention and not (len(args) >= 3 and args[0] is args[1] is args[2]):
                # cross-attention: the packed projection sees several inputs, no one H
                self._mixed.add(key)
                self.hessians.pop(key, None)
                return
            x = args[0].detach()
            x = x.reshape(-1, x.shape[-1]).to(torch.float64)
            h = x.T @ x
            if key in self.hessians:
                self.hessians[key] += h
            else:
                self.hessians[key] = h
            self.counts[key] = self.counts.get(key, 0) + x.shape[0]
        return hook


def collect_hessians(model: torch.nn.Module, inputs: Iterable[Any],
                     forward: Callable[[torch.nn.Module, Any], Any] | None = None
                     ) -> dict[str, torch.Tensor]:
    """The input Hessian of each `nn.Linear` of `model` over `inputs` (each passed to
    `forward(model, x)`, default ``model(x)``), by weight name; under no_grad."""
    run = forward or (lambda m, x: m(x))
    with torch.no_grad(), HessianCollector(model) as hc:
        for x in inputs:
            run(model, x)
    return hc.hessians


def match_names(hessians: Mapping[str, torch.Tensor], names: Iterable[str]
                ) -> dict[str, torch.Tensor]:
    """`hessians` (by a module's parameter name) keyed by the flattened checkpoint names they
    belong to: ``model/layers.0.fc.weight`` takes ``layers.0.fc.weight``'s (a name, or its end
    after a "/", that exactly one Hessian matches)."""
    out: dict[str, torch.Tensor] = {}
    for n in names:
        tail = n.rsplit("/", 1)[-1]
        h = hessians.get(n, hessians.get(tail))
        if h is not None:
            out[n] = h
    return out


def usable(hessians: Mapping[str, torch.Tensor], tensors: Mapping[str, torch.Tensor]
           ) -> dict[str, torch.Tensor]:
    """`hessians` (by a module's parameter name or by flattened checkpoint name) for the
    tensors of `tensors` that error feedback can serve: matched by `match_names`, 2-D, float,
    the Hessian square with one row per input column.  Others are quantized on their own."""
    out: dict[str, torch.Tensor] = {}
    for name, h in match_names(hessians, tensors).items():
        t = tensors[name]
        if t.dim() == 2 and t.is_floating_point() and tuple(h.shape) == (t.shape[1],) * 2:
            out[name] = h
    return out


def apply_feedback(qmap: Mapping[str, QuantizedTensor | None],
                   tensors: Mapping[str, torch.Tensor],
                   hessians: Mapping[str, torch.Tensor]) -> dict[str, QuantizedTensor | None]:
    """`qmap` with every quantized tensor that has a Hessian in `hessians` (by the same name;
    see `usable`) re-assigned by `feedback_levels`; the others unchanged."""
    out = dict(qmap)
    for name, q in qmap.items():
        h = hessians.get(name)
        if q is not None and h is not None:
            out[name] = feedback_levels(q, tensors[name], h)
    return out

