"""`GradientEMA`: an exponential moving average of a model's gradients, for commits.

    ema = GradientEMA(model)            # names: "model/<parameter name>", as flatten names them
    loss.backward(); ema.accumulate()   # after each backward pass that should count
    repo.commit(state, msg, grads=ema.take())   # take() hands the EMA over and restarts it

EMA_t = beta g_t + (1 - beta) EMA_{t-1} (beta = 0.9, Inshrinkerator §4.5), in float32.  It
feeds sensitivity-based pruning and protection (`Repo.commit(grads=)`).  On CUDA each
gradient is copied asynchronously into pinned CPU memory and folded in at the next call
(`accumulate`, `fold_pending` or `take`), so the copy overlaps the optimizer step and the
next forward pass; on the CPU it is folded in place.  Training-loop integrations (the
`Tracker`, framework callbacks) decide *when* to accumulate; this class only keeps the average.

The pinned copies are packed into slabs of `SLAB_VALUES` float32 values (64 MiB, a power of
two), a large gradient cut across slabs: torch's caching host allocator rounds each pinned
block up to a power of two and keeps it, so a block per parameter pinned 1.66x a GPT-2's
gradients (0.83 GB for 0.50 GB at 124M); the slabs pin the gradients' size, rounded up to
one slab.
"""
from __future__ import annotations

import math
from typing import Any

import torch

from mvc.errors import UsageError
from mvc.integrations.host_copy import Piece, cut

#: The EMA weight of the newest gradient (Inshrinkerator §4.5).
BETA = 0.9
#: float32 values in a pinned staging slab (64 MiB).
SLAB_VALUES = 16 << 20


def _staged(t: torch.Tensor) -> bool:
    """Whether a gradient on this device is copied through the pinned slabs (an accelerator's)
    rather than folded where it is."""
    return t.device.type == "cuda"


class GradientEMAError(UsageError):
    """A GradientEMA was built with an invalid argument (beta outside (0, 1], not a module)."""

    exit_code = 119


class GradientEMA:
    """The float32 EMA of every parameter's gradient, keyed by `prefix + parameter name`."""

    def __init__(self, model: torch.nn.Module, *, beta: float = BETA, prefix: str = "model/",
                 slab_values: int = SLAB_VALUES) -> None:
        if not isinstance(model, torch.nn.Module):
            raise GradientEMAError(f"GradientEMA needs a torch.nn.Module, got {type(model).__name__}")
        if isinstance(beta, bool) or not isinstance(beta, (int, float)) or not 0.0 < beta <= 1.0:
            raise GradientEMAError(f"beta must be in (0, 1], got {beta!r}")
        self.beta = float(beta)
        self._params = [(prefix + n, p) for n, p in model.named_parameters()]
        if isinstance(slab_values, bool) or not isinstance(slab_values, int) or slab_values < 1:
            raise GradientEMAError(f"slab_values must be a positive int, got {slab_values!r}")
        self._slab_values = slab_values
        self._ema: dict[str, torch.Tensor] = {}
        self._slabs: list[torch.Tensor] = []
        self._layout: dict[str, tuple[torch.Size, list[Piece]]] = {}
        self._pending: list[str] = []       # staged, not folded yet
        #: the host gradients of the step `_pending` belongs to (copies), folded with them
        self._pending_host: list[tuple[str, torch.Tensor]] = []
        #: Steps left out for a NaN or infinite gradient (`accumulate`).
        self.skipped = 0
        self._events: list[Any] = []        # one per device the pending copies run on

    @property
    def names(self) -> list[str]:
        """The keys `take()` can return, one per parameter."""
        return [n for n, _ in self._params]

    def accumulate(self) -> None:
        """Fold every parameter's current gradient into the average (None / sparse: skipped).
        A step with a NaN or infinite gradient is left out whole (`skipped` counts them): a
        mixed-precision loss scaler's overflow step, which the optimizer skips too, would
        otherwise stay in the average and leave every later commit's tensors unquantizable."""
        self.fold_pending()
        staged: list[tuple[str, torch.Tensor]] = []
        here: list[tuple[str, torch.Tensor]] = []
        for name, p in self._params:
            g = p.grad
            if g is None or g.is_sparse:
                continue
            (staged if _staged(g) else here).append((name, g.detach()))
        if here and not all(bool(torch.isfinite(g).all()) for _, g in here):
            self.skipped += 1
            return
        if not staged:
            for name, g in here:
                self._fold(name, g)
            return
        # The step's host gradients wait with its device ones until those are known finite
        # (a model partly on the CPU): as copies, since the loop's next backward overwrites them.
        self._pending_host = [(name, g.to(torch.float32, copy=True)) for name, g in here]
        self._stage(staged)

    def fold_pending(self) -> None:
        """Fold the gradients still being copied from the GPU (waits for those copies); a step
        with a NaN or infinite one is left out whole, checked here on the host copies."""
        for event in self._events:
            event.synchronize()
        if self._pending and not all(self._staged_finite(name) for name in self._pending):
            self.skipped += 1
        else:
            for name in self._pending:
                self._fold_staged(name)
            for name, g in self._pending_host:
                self._fold(name, g)
        self._pending, self._events, self._pending_host = [], [], []

    def _staged_finite(self, name: str) -> bool:
        return all(bool(torch.isfinite(self._slabs[slab][at:at + n]).all())
                   for slab, at, _, n in self._layout[name][1])

    def take(self) -> dict[str, torch.Tensor]:
        """The average so far, by name, and a fresh start (the next commit's EMA begins empty)."""
        self.fold_pending()
        grads, self._ema = self._ema, {}
        return grads

    def reset(self) -> None:
        """Drop everything accumulated (a resume from another commit, say)."""
        for event in self._events:   # the slabs are written into until these copies end
            event.synchronize()
        self._ema, self._pending, self._events, self._pending_host = {}, [], [], []

    # ------------------------------------------------------------------ pinned staging
    def _stage(self, staged: list[tuple[str, torch.Tensor]]) -> None:
        """Queue the copies of `staged` gradients into the slabs (without waiting for them)."""
        self._place([(name, g.shape) for name, g in staged], staged[0][1])
        devices: dict[torch.device, None] = {}
        for name, g in staged:
            flat = g.reshape(-1)
            for slab, at, start, n in self._layout[name][1]:
                self._slabs[slab][at:at + n].copy_(flat[start:start + n], non_blocking=True)
            devices[g.device] = None
        self._pending = [name for name, _ in staged]
        for dev in devices:
            if dev.type == "cuda":
                with torch.cuda.device(dev):
                    event = torch.cuda.Event()
                    event.record()
                self._events.append(event)

    def _place(self, shapes: list[tuple[str, torch.Size]], like: torch.Tensor) -> None:
        """Lay out every staged gradient seen so far in the slabs (again when one is new or
        changed its shape; nothing is pending then), growing the slabs to fit."""
        if all(self._layout.get(n, (None,))[0] == shape for n, shape in shapes):
            return
        wanted = {n: shape for n, (shape, _) in self._layout.items()}
        wanted.update(shapes)
        size = self._slab_values
        pieces = cut([math.prod(shape) for shape in wanted.values()], size)
        layout = {name: (shape, p) for (name, shape), p in zip(wanted.items(), pieces)}
        slab, at, _, n = max((p[-1] for p in pieces if p), default=(0, 0, 0, 0))
        # every slab full size but the last, which is only as long as it must be (rounded up to
        # a power of two, as the allocator would round it anyway)
        last = at + n
        lengths = [size] * slab + ([min(size, 1 << max(0, last - 1).bit_length())] if last else [])
        pin = like.device.type == "cuda"
        slabs: list[torch.Tensor] = []
        for i, n in enumerate(lengths):
            old = self._slabs[i] if i < len(self._slabs) else None
            slabs.append(old if old is not None and old.numel() >= n
                         else torch.empty(n, dtype=torch.float32, pin_memory=pin))
        self._slabs, self._layout = slabs, layout

    def _fold_staged(self, name: str) -> None:
        shape, pieces = self._layout[name]
        ema = self._ema.get(name)
        if ema is not None and ema.shape == shape and not ema.is_contiguous():
            ema = self._ema[name] = ema.contiguous()
        fresh = ema is None or ema.shape != shape
        if fresh:
            ema = self._ema[name] = torch.empty(shape, dtype=torch.float32)
        assert ema is not None
        flat = ema.view(-1)
        for slab, at, start, n in pieces:
            got = self._slabs[slab][at:at + n]
            if fresh:
                flat[start:start + n].copy_(got)
            else:
                flat[start:start + n].mul_(1.0 - self.beta).add_(got, alpha=self.beta)

    def _fold(self, name: str, g: torch.Tensor) -> None:
        ema = self._ema.get(name)
        if ema is None or ema.shape != g.shape:
            self._ema[name] = g.to(torch.float32, copy=True)
        else:
            ema.mul_(1.0 - self.beta).add_(g.to(torch.float32), alpha=self.beta)
