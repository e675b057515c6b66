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
"""
from __future__ import annotations

import torch

from mvc.errors import UsageError

#: The EMA weight of the newest gradient (Inshrinkerator §4.5).
BETA = 0.9


class GradientEMAError(UsageError):
    """A GradientEMA was built with an invalid argument (beta outside (0, 1], not a module)."""

    exit_code = 119


class GradientEMA:
    """The float32 EMA of every parameter's gradient, keyed by `prefix + parameter name`."""

    def __init__(self, model: torch.nn.Module, *, beta: float = BETA, prefix: str = "model/"
                 ) -> None:
        if not isinstance(model, torch.nn.Module):
            raise GradientEMAError(f"GradientEMA needs a torch.nn.Module, got {type(model).__name__}")
        if isinstance(beta, bool) or not isinstance(beta, (int, float)) or not 0.0 < beta <= 1.0:
            raise GradientEMAError(f"beta must be in (0, 1], got {beta!r}")
        self.beta = float(beta)
        self._params = [(prefix + n, p) for n, p in model.named_parameters()]
        self._ema: dict[str, torch.Tensor] = {}
        self._staged: dict[str, tuple[torch.Tensor, torch.cuda.Event]] = {}
        self._staging: dict[str, torch.Tensor] = {}

    @property
    def names(self) -> list[str]:
        """The keys `take()` can return, one per parameter."""
        return [n for n, _ in self._params]

    def accumulate(self) -> None:
        """Fold every parameter's current gradient into the average (None / sparse: skipped)."""
        self.fold_pending()
        for name, p in self._params:
            g = p.grad
            if g is None or g.is_sparse:
                continue
            if g.device.type == "cuda":
                buf = self._staging.get(name)
                if buf is None or buf.shape != g.shape:
                    buf = self._staging[name] = torch.empty(g.shape, dtype=torch.float32,
                                                            pin_memory=True)
                buf.copy_(g.detach(), non_blocking=True)
                event = torch.cuda.Event()
                event.record()
                self._staged[name] = (buf, event)
            else:
                self._fold(name, g.detach())

    def fold_pending(self) -> None:
        """Fold the gradients still being copied from the GPU (waits for those copies)."""
        for name, (buf, event) in self._staged.items():
            event.synchronize()
            self._fold(name, buf)
        self._staged.clear()

    def take(self) -> dict[str, torch.Tensor]:
        """The average so far, by name, and a fresh start (the next commit's EMA begins empty)."""
        self.fold_pending()
        grads, self._ema = self._ema, {}
        return grads

    def reset(self) -> None:
        """Drop everything accumulated (a resume from another commit, say)."""
        self._ema, self._staged = {}, {}

    def _fold(self, name: str, g: torch.Tensor) -> None:
        ema = self._ema.get(name)
        if ema is None or ema.shape != g.shape:
            self._ema[name] = g.to(torch.float32, copy=True)
        else:
            ema.mul_(1.0 - self.beta).add_(g.to(torch.float32), alpha=self.beta)
