"""A fidelity gate built from a module, which also knows the module's data: `from_module`.

    from mvc.quality import from_module            # also: mvc.quality.fidelity.from_module
    gate = from_module(model, calib_batches, metric="kl")
    repo.commit({"model": model.state_dict()}, "step 900", quality=gate)

The gate is a `mvc.search.fidelity.Fidelity` whose outputs are the module's own: each
calibration batch goes through ``forward(model, batch)`` (default ``model(batch)``) in eval
mode, and the outputs of all batches are concatenated along dim 0.  A candidate state
(nested, as `Repo.commit` passes it, or flat tensors, as the search does) is run with
`torch.func.functional_call`: its tensors stand in for the module's parameters and buffers of
the same name (``model/layers.0.fc.weight`` for ``layers.0.fc.weight``: the name, or its end
after the last "/"); the module itself is never modified.  The Tracker passes its model
with the candidate loaded, which runs as it is.

Because the gate has the module and its inputs, it can also give the input Hessians of the
module's `nn.Linear` layers over the same inputs (`hessians_of`, `hessians`): what error
feedback (`mvc.quant.feedback`, `QuantConfig.feedback`, `SearchSpace.feedback`) needs.  A
commit asks for them only when a trial or its fixed config uses error feedback, once.
"""
from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any

import torch

from mvc.quant.feedback import collect_hessians
from mvc.search.fidelity import Fidelity, FidelityError
from mvc.search.gate import DEFAULT_CONFIDENCE

#: ``forward(model, batch) -> outputs``.
Forward = Callable[[torch.nn.Module, Any], Any]


def _call(model: torch.nn.Module, batch: Any) -> Any:
    return model(batch)


class _Run(torch.nn.Module):
    """`forward(model, batch)` as a module, so `functional_call` can run any forward."""

    def __init__(self, model: torch.nn.Module, forward: Forward) -> None:
        super().__init__()
        self.m = model
        self.fn = forward

    def forward(self, batch: Any) -> Any:
        return self.fn(self.m, batch)


def _flat(state: Mapping[Any, Any], prefix: str = "") -> dict[str, torch.Tensor]:
    """Tensors of a nested state by their "/"-joined names (a flat mapping stays as it is)."""
    out: dict[str, torch.Tensor] = {}
    for k, v in state.items():
        name = f"{prefix}{k}"
        if isinstance(v, torch.Tensor):
            out[name] = v
        elif isinstance(v, Mapping):
            out.update(_flat(v, name + "/"))
    return out


class ModuleFidelity(Fidelity):
    """A `Fidelity` gate over a module's outputs that also gives its layers' input Hessians;
    build it with `from_module`."""

    __slots__ = ("_cache", "_run", "forward", "model")

    def __init__(self, model: torch.nn.Module, inputs: Any, metric: str = "kl",
                 threshold: float | None = None,
                 confidence: float | None = DEFAULT_CONFIDENCE,
                 forward: Forward | None = None) -> None:
        if not isinstance(model, torch.nn.Module):
            raise FidelityError(f"from_module needs a torch.nn.Module, got {type(model).__name__}")
        self.model = model
        self.forward = forward or _call
        self._run = _Run(model, self.forward)
        self._cache: tuple[tuple, dict[str, torch.Tensor]] | None = None
        super().__init__(self.outputs_of, inputs, metric, threshold, confidence)

    def __repr__(self) -> str:
        return (f"from_module({type(self.model).__name__}, metric={self.metric!r}, "
                f"threshold={self.threshold:g}, confidence={self.confidence!r})")

    def batches(self) -> list[Any]:
        """The calibration batches: `inputs` itself when it is a tensor, else its items."""
        if isinstance(self.inputs, torch.Tensor):
            return [self.inputs]
        if isinstance(self.inputs, (str, bytes)) or not isinstance(self.inputs, Iterable):
            raise FidelityError("from_module inputs must be a tensor (one batch) or a sequence "
                                f"of batches, got {type(self.inputs).__name__}")
        return list(self.inputs)

    def parameters_of(self, state: Mapping[Any, Any]) -> dict[str, torch.Tensor]:
        """The module's parameters and buffers found in `state`, by the module's names, on the
        module's devices."""
        flat = _flat(state)
        own: dict[str, torch.Tensor] = dict(self.model.named_parameters())
        own.update(self.model.named_buffers())
        tails: dict[str, str] = {}
        for n in flat:  # the first tensor whose name ends in a module name takes it
            tails.setdefault(n.rsplit("/", 1)[-1], n)
        out: dict[str, torch.Tensor] = {}
        for k, t in own.items():
            src = flat.get(k, flat.get(tails.get(k, ""), None))
            if src is not None and tuple(src.shape) == tuple(t.shape):
                out[k] = src.to(device=t.device)
        if not out:
            raise FidelityError("none of the module's parameters is in the candidate state "
                                "(by name, or a name ending in '/<parameter name>')")
        return out

    def _each(self, subject: Any, run: Callable[[Any], Any]) -> list[Any]:
        """`run(batch)` for every batch, with `subject`'s tensors in the module (a state) or
        on `subject` (a module), in eval mode."""
        module = subject if isinstance(subject, torch.nn.Module) else self.model
        if not isinstance(subject, (torch.nn.Module, Mapping)):
            raise FidelityError(f"a from_module gate judges a module or a state, got "
                                f"{type(subject).__name__}")
        mode = module.training
        module.eval()
        try:
            return [run(b) for b in self.batches()]
        finally:
            module.train(mode)

    def outputs_of(self, subject: Any, inputs: Any) -> torch.Tensor:
        """The outputs of every calibration batch, concatenated along dim 0 (`outputs_fn`)."""
        del inputs  # the batches are this gate's own (`self.inputs`)
        if isinstance(subject, torch.nn.Module):
            outs = self._each(subject, lambda b: self.forward(subject, b))
        else:
            params = {"m." + k: v for k, v in self.parameters_of(subject).items()}
            outs = self._each(subject, lambda b: torch.func.functional_call(
                self._run, params, (b,)))
        bad = [type(o).__name__ for o in outs if not isinstance(o, torch.Tensor)]
        if bad:
            raise FidelityError(f"forward(model, batch) returned {bad[0]}, expected a tensor of "
                                "outputs (pass forward= to pick them, e.g. lambda m, b: "
                                "m(**b).logits)")
        return torch.cat(outs, dim=0)

    def hessians_of(self, subject: Any) -> dict[str, torch.Tensor]:
        """Input Hessians (sum x x^T, float64) of the module's `nn.Linear` layers over the
        calibration batches, by weight name (``layers.0.fc.weight``), with `subject`'s tensors
        in the module (a state, nested or flat) or of `subject` itself (a module)."""
        if isinstance(subject, torch.nn.Module):
            return collect_hessians(subject, self.batches(), self._in_eval(subject, self.forward))
        params = {"m." + k: v for k, v in self.parameters_of(subject).items()}

        def run(_model: torch.nn.Module, b: Any) -> Any:
            return torch.func.functional_call(self._run, params, (b,))
        return collect_hessians(self.model, self.batches(), self._in_eval(self.model, run))

    def hessians(self) -> dict[str, torch.Tensor]:
        """`hessians_of(model)` for the module's current weights, computed on first use and
        again only after they change."""
        tag = tuple((id(p), p._version) for p in self.model.parameters())
        if self._cache is None or self._cache[0] != tag:
            self._cache = (tag, self.hessians_of(self.model))
        return self._cache[1]

    @staticmethod
    def _in_eval(module: torch.nn.Module, fn: Forward) -> Forward:
        def run(m: torch.nn.Module, b: Any) -> Any:
            mode = module.training
            module.eval()
            try:
                return fn(m, b)
            finally:
                module.train(mode)
        return run


def from_module(model: torch.nn.Module, inputs: Any, metric: str = "kl",
                threshold: float | None = None,
                confidence: float | None = DEFAULT_CONFIDENCE,
                forward: Forward | None = None) -> ModuleFidelity:
    """A fidelity gate (`mvc.quality.fidelity`) on `model`'s outputs over `inputs`, which also
    gives error feedback its layers' input Hessians (see the module docstring).

    model:   the module whose parameters the committed state holds (its state_dict's names,
             or names ending in "/<name>", e.g. ``model/<name>``).
    inputs:  calibration batches: a tensor (one batch) or a sequence of batches.
    forward: ``forward(model, batch) -> outputs tensor (N, ..., C)``; default ``model(batch)``.
    metric, threshold, confidence: as for `mvc.quality.fidelity`.
    """
    return ModuleFidelity(model, inputs, metric, threshold, confidence, forward)
