"""Fidelity: gate a commit on agreement with the exact checkpoint's outputs.

A loss can stay put while the model's answers change (a compressed model keeps
its mean loss while many of its top-1 choices flip).  A fidelity gate compares
what the candidate computes with what the exact state computes, on the same
inputs::

    from mvc.quality import fidelity
    fid = fidelity(lambda state, x: model_fn(state, x), calib_inputs, metric="top1")
    repo.commit(state, "step 900", quality=fid)

`outputs_fn(subject, inputs)` returns a tensor of outputs, shape (N, ..., C): N
examples, optional positions (tokens), and C logits (``kl``, ``top1``) or
embedding dimensions (``cosine``).  `subject` is whatever the caller's quality
functions receive: the candidate state for `Repo.commit` and `mvc commit`'s
`quality.hook`, the model (with the candidate's tensors loaded) for the Tracker.
It runs under `torch.no_grad()`.

Calling a `Fidelity` returns `FidelityOutputs` (the outputs, tagged with the gate),
so whatever wraps it -- the repository's adapter from tensors to a state, the
Tracker's loading of the candidate into the model, a user's lambda -- passes the
tag through and the search knows to compare rather than read a loss.  The search
calls it once on the exact state at the start of each commit's search (the
reference outputs, kept by that search only, never across commits) and once per
trial.  Per example (averaged over positions) it measures

    kl      KL(p_exact || p_candidate) of softmax(logits), in nats;
    cosine  1 - cos(exact, candidate) of the embeddings (two all-zero vectors agree);
    top1    1 if argmax differs, else 0 (the mean is the disagreement rate);

an absolute divergence, not one relative to the reference (whose divergence from
itself is 0).  Non-finite candidate outputs make a trial infeasible.  `epsilon`
does not apply to a fidelity gate; its threshold does.

Confidence bound.  The mean over N calibration examples is itself a noisy
estimate of the divergence on the data the model will see.  With d_i the
per-example divergences, a trial is accepted only when the one-sided upper
confidence bound (Student t, N - 1 degrees of freedom, `confidence` 95% by
default, as the per-example loss gate)

    UCB = mean(d) + t_{confidence, N-1} * sd(d) / sqrt(N)

is <= `threshold`; the commit records both the mean (`fidelity`) and the bound
(`fidelity_ucb`, with `confidence`).  `confidence=None` gates on the mean alone
(the bound is still recorded, at the default confidence); so does a calibration
set of one example (no spread to bound: `fidelity_ucb` is None).

Default thresholds (`DEFAULT_THRESHOLDS`), from `benchmarks/bench_transfer.py`
(docs/quality.md): top-1 disagreement 0.02 (2 answers in 100: the gate's bound
is the behaviour to keep); KL 0.001 nats per example; cosine distance 0.00015.  On
the benchmark's two character transformers (0.43M parameters, held-out accuracy
30% and 54%) the held-out top-1 flip rate of a restored model followed
c * sqrt(KL) with c = 0.6 (sharper model) to 1.0 (flatter model) over every
config measured (KL 0.01-0.65), and calibration KL on 128 windows matched
held-out KL within 10%: a KL of 0.01 (the first, unmeasured default) let 9% of
answers flip; 2% flips needs KL <= 0.0004-0.0011, hence 0.001.  A KL bound does
not guarantee an agreement rate on another model: to keep answers, gate on
``top1``.  Cosine distance was measured on the same model's embedding (its final
normed hidden states, mean-pooled per window): over 64 to 4 bins it tracked
KL / 6, and the flip rate followed c * sqrt(cosine distance) with c = 1.4-1.7, so
2% flips needs a distance <= 0.00014-0.0002, hence 0.00015.  The first, unmeasured
default (0.01) accepted 16 bins there: 13% of answers flipped and held-out loss rose
2.6%.
"""
from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch

from mvc.search.gate import DEFAULT_CONFIDENCE, GATE_FIDELITY, Verdict, t_quantile
from mvc.search.quality import QualityFunctionError

METRICS = ("kl", "cosine", "top1")
#: Default bounds per metric (evidence in the module docstring and docs/quality.md).
DEFAULT_THRESHOLDS: dict[str, float] = {"kl": 0.001, "cosine": 0.00015, "top1": 0.02}
_MAX_THRESHOLD = {"kl": math.inf, "cosine": 2.0, "top1": 1.0}
_UNITS = {"kl": "nats", "cosine": "cosine distance", "top1": "disagreement rate"}


class FidelityError(QualityFunctionError):
    """A fidelity gate that cannot be used: bad metric or threshold, or unusable outputs."""

    exit_code = 131


class FidelityOutputs:
    """What calling a `Fidelity` returns: `outputs_fn`'s result and the gate that judges it."""

    __slots__ = ("gate", "outputs")

    def __init__(self, outputs: Any, gate: Fidelity) -> None:
        self.outputs, self.gate = outputs, gate

    def __repr__(self) -> str:
        shape = tuple(getattr(self.outputs, "shape", ()))
        return f"FidelityOutputs(shape={shape}, gate={self.gate!r})"


class Fidelity:
    """A fidelity quality gate; build it with `fidelity()`.

    Calling it on a subject returns `FidelityOutputs(outputs_fn(subject, inputs))`;
    the search compares those outputs with the exact state's instead of reading
    them as a loss.
    """

    __slots__ = ("confidence", "inputs", "metric", "outputs_fn", "threshold")

    def __init__(self, outputs_fn: Callable[[Any, Any], Any], inputs: Any, metric: str = "kl",
                 threshold: float | None = None,
                 confidence: float | None = DEFAULT_CONFIDENCE) -> None:
        if not callable(outputs_fn):
            raise FidelityError("outputs_fn must be callable as outputs_fn(state_or_model, inputs)")
        if metric not in METRICS:
            raise FidelityError(f"unknown fidelity metric {metric!r}; known: {', '.join(METRICS)}")
        if threshold is None:
            threshold = DEFAULT_THRESHOLDS[metric]
        if isinstance(threshold, bool) or not isinstance(threshold, (int, float)) \
                or not 0.0 <= threshold <= _MAX_THRESHOLD[metric] or math.isnan(threshold):
            raise FidelityError(f"fidelity threshold for {metric!r} must be a number in "
                                f"[0, {_MAX_THRESHOLD[metric]:g}], got {threshold!r}")
        if confidence is not None and (isinstance(confidence, bool) or not isinstance(
                confidence, (int, float)) or not 0.5 <= confidence < 1.0):
            raise FidelityError(f"fidelity confidence must be in [0.5, 1) or None, "
                                f"got {confidence!r}")
        self.outputs_fn, self.inputs = outputs_fn, inputs
        self.metric, self.threshold = metric, float(threshold)
        self.confidence = None if confidence is None else float(confidence)

    @property
    def units(self) -> str:
        return _UNITS[self.metric]

    def __repr__(self) -> str:
        name = getattr(self.outputs_fn, "__qualname__", type(self.outputs_fn).__name__)
        return (f"Fidelity({name}, metric={self.metric!r}, threshold={self.threshold:g}, "
                f"confidence={self.confidence!r})")

    def __call__(self, subject: Any) -> FidelityOutputs:
        with torch.no_grad():
            return FidelityOutputs(self.outputs_fn(subject, self.inputs), self)

    # -------------------------------------------------------------- comparison
    def _outputs(self, raw: Any) -> torch.Tensor:
        if not isinstance(raw, torch.Tensor):
            try:
                raw = torch.as_tensor(raw)
            except (TypeError, ValueError, RuntimeError):
                raise FidelityError(f"outputs_fn returned {type(raw).__name__}, expected a "
                                    "tensor of outputs (N, ..., C)") from None
        if raw.dim() < 2 or raw.shape[0] == 0 or raw.shape[-1] == 0:
            raise FidelityError(f"outputs_fn returned shape {tuple(raw.shape)}, expected "
                                "(N examples, ..., C logits or embedding dims)")
        if not raw.is_floating_point():
            raise FidelityError(f"outputs_fn returned {raw.dtype} outputs, expected floats")
        return raw.detach().to(torch.float32).reshape(raw.shape[0], -1, raw.shape[-1])

    def reference(self, raw: Any) -> dict[str, Any]:
        """What the exact state's outputs contribute to every later comparison."""
        out = self._outputs(raw)
        if not bool(torch.isfinite(out).all()):
            raise FidelityError("outputs_fn returned non-finite outputs for the exact state")
        ref: dict[str, Any] = {"shape": out.shape}
        if self.metric == "kl":
            ref["logp"] = torch.log_softmax(out, dim=-1)
            ref["p"] = ref["logp"].exp()
        elif self.metric == "cosine":
            ref["y"], ref["norm"] = out, torch.linalg.vector_norm(out, dim=-1)
        else:
            ref["top"] = out.argmax(dim=-1)
        return ref

    def divergence(self, ref: dict[str, Any], raw: Any) -> torch.Tensor:
        """Per-example divergence (float64, CPU) of a candidate's outputs from the reference;
        inf for an example with a non-finite output."""
        out = self._outputs(raw)
        if out.shape != ref["shape"]:
            raise FidelityError(f"outputs_fn returned shape {tuple(out.shape)} for a candidate, "
                                f"but {tuple(ref['shape'])} for the exact state (after "
                                "flattening the position dims)")
        device = next(v.device for v in ref.values() if isinstance(v, torch.Tensor))
        out = out.to(device)
        bad = ~torch.isfinite(out).reshape(out.shape[0], -1).all(dim=1)
        if self.metric == "kl":
            logq = torch.log_softmax(out, dim=-1)
            per_pos = torch.sum(ref["p"] * (ref["logp"] - logq), dim=-1, dtype=torch.float64)
            per_pos = per_pos.clamp_min(0.0)
        elif self.metric == "cosine":
            norm = torch.linalg.vector_norm(out, dim=-1)
            dot = torch.sum(ref["y"] * out, dim=-1, dtype=torch.float64)
            denom = ref["norm"].double() * norm.double()
            cos = torch.where(denom > 0, dot / denom.clamp_min(1e-300),
                              torch.zeros_like(dot)).clamp(-1.0, 1.0)
            both_zero = (ref["norm"] == 0) & (norm == 0)
            per_pos = torch.where(both_zero, torch.zeros_like(cos), 1.0 - cos)
        else:
            per_pos = (out.argmax(dim=-1) != ref["top"]).to(torch.float64)
        per = per_pos.mean(dim=1)
        per = torch.where(bad, torch.full_like(per, math.inf), per)
        return per.to("cpu")


def fidelity(outputs_fn: Callable[[Any, Any], Any], inputs: Any, metric: str = "kl",
             threshold: float | None = None,
             confidence: float | None = DEFAULT_CONFIDENCE) -> Fidelity:
    """A quality gate on agreement with the exact checkpoint (see `mvc.search.fidelity`).

    outputs_fn: ``outputs_fn(state_or_model, inputs) -> tensor (N, ..., C)`` of logits
                (``kl``, ``top1``) or embeddings (``cosine``).
    inputs:     the calibration inputs, passed to `outputs_fn` unchanged.
    metric:     "kl" (nats), "cosine" (1 - cosine similarity) or "top1"
                (disagreement rate), each per example and averaged.
    threshold:  bound on the mean divergence; None takes DEFAULT_THRESHOLDS[metric]
                (KL 0.001 nats, cosine 0.00015, top-1 0.02; see the module docstring).
    confidence: the bound applies to the one-sided upper confidence bound of the
                mean divergence at this confidence (default 0.95); None: to the
                mean itself.

    Pass the result as `quality=` to `Repo.commit` or the Tracker, or expose it in
    the module named by `quality.hook` (``quality.hook = mymodule:fid``).
    """
    return Fidelity(outputs_fn, inputs, metric, threshold, confidence)


class FidelityJudge:
    """The fidelity gate for one search: the reference outputs and the absolute bound."""

    gate = GATE_FIDELITY

    def __init__(self, reference: FidelityOutputs) -> None:
        self.spec = reference.gate
        self.ref = self.spec.reference(reference.outputs)
        self.baseline = 0.0
        self.epsilon = self.spec.threshold
        self.t = t_quantile(self.spec.confidence or DEFAULT_CONFIDENCE,
                            max(1, int(self.ref["shape"][0]) - 1))

    def verdict(self, raw: Any, what: str) -> Verdict:
        if not isinstance(raw, FidelityOutputs) or raw.gate is not self.spec:
            raise FidelityError(f"{what} returned the outputs of a fidelity gate for the exact "
                                f"state but {type(raw).__name__} for a candidate")
        per = self.spec.divergence(self.ref, raw.outputs)
        if not bool(torch.isfinite(per).all()):
            return Verdict(math.inf, math.inf, False, {"ucb": None})
        value = float(per.mean())
        n = per.numel()
        ucb = value + self.t * float(per.std()) / math.sqrt(n) if n >= 2 else None
        bounded = ucb if ucb is not None and self.spec.confidence is not None else value
        return Verdict(value, value, bounded <= self.epsilon, {"ucb": ucb})

    def record(self, v: Verdict | None) -> dict[str, Any]:
        ok = v is not None and math.isfinite(v.value)
        return {"fidelity": v.value if v is not None and ok else None,
                "fidelity_ucb": v.info.get("ucb") if v is not None and ok else None,
                "confidence": self.spec.confidence,
                "fidelity_metric": self.spec.metric, "threshold": self.spec.threshold,
                "units": self.spec.units}
