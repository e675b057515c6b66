"""Measure one given quantization with the gates of the search: fixed-config commits.

A `commit.mode = fixed` commit (or an explicit `quant=`) is not searched: the user
chose the config.  It is still measured, by the same gates the search uses:

* the guard rail: each quantized tensor's relative L2 error against `tensor_cap`
  (`within_cap`, with `max_distortion` and `worst_tensor`);
* with a quality function, the gate its result selects (`metric`,
  `per-example-ucb`, `fidelity`; see `mvc.search.gate`), once on the exact state
  and once on the quantized one, against `epsilon` or the fidelity threshold
  (`within_bound`, with the gate's own fields: `ucb`, `fidelity`, ...).

What happens when a measurement is outside its bound is the caller's rule
(`mvc.repo.pipeline`: warn and store as configured, or refuse); this module only
measures and records.
"""
from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import torch

from mvc.quant import QuantizedTensor
from mvc.quant.error import cached_error_sums, relative_error
from mvc.quant.optimizer import moment_error_sums
from mvc.search.fidelity import FidelityJudge, FidelityOutputs
from mvc.search.gate import (
    DEFAULT_CONFIDENCE,
    DEFAULT_MIRROR,
    MetricJudge,
    PerExampleJudge,
    as_measurement,
    mirror_candidate,
)

Judge = MetricJudge | PerExampleJudge | FidelityJudge

#: Default bound on a compressed second moment's error, ||sqrt(v') - sqrt(v)|| / ||sqrt(v)||
#: (config `quality.moment_cap`): as for first moments, "never worse than dropping it"
#: (zeros are at 1).  The default log-domain scheme (4 levels) measures 0.07-0.41 on
#: bench_e2e's char-LM and 0.21-0.76 on its CNN (largest layer, 200 steps, seeds 0-1;
#: docs/quality.md): a tighter cap (0.75 was tried) stores that CNN layer's v exactly and
#: cuts the full-checkpoint ratio from 16x to 3x, for no measured gain.
DEFAULT_MOMENT_CAP = 1.0


def choose_judge(raw: Any, epsilon: float, confidence: float = DEFAULT_CONFIDENCE,
                 mirror: bool = DEFAULT_MIRROR) -> Judge:
    """The gate selected by what the quality function returned on the exact state
    (`mirror`: the scalar gate's mirror check, `mvc.search.gate`)."""
    if isinstance(raw, FidelityOutputs):
        return FidelityJudge(raw)
    base = as_measurement(raw, "the quality function")
    if isinstance(base, torch.Tensor):
        return PerExampleJudge(base, epsilon, confidence)
    return MetricJudge(base, epsilon, mirror)


def distortions(tensors: Mapping[str, torch.Tensor],
                qmap: Mapping[str, QuantizedTensor | None]) -> tuple[float, str | None]:
    """(largest per-tensor relative L2 error, its tensor name) of a quantization."""
    worst, worst_name = 0.0, None
    for name in sorted(qmap):
        q = qmap[name]
        if q is None:
            continue
        # the sums the quantization's own pass measured, where it left them (a device's
        # batched pass; a fresh pass, with its wait, otherwise)
        d = relative_error(cached_error_sums(q, tensors[name]))
        if worst_name is None or d > worst:
            worst, worst_name = d, name
    return worst, worst_name


def moment_distortion(q: QuantizedTensor, domain: str, x: torch.Tensor) -> float:
    """A compressed optimizer moment's error in the quantity Adam uses from it.

    linear (first moment m): ||m' - m|| / ||m||;
    log (second moment v):   ||sqrt(v') - sqrt(v)|| / ||sqrt(v)||, the relative error of
                             the denominator of Adam's step.
    0 for an all-zero tensor restored as zeros, inf when it is not.
    """
    return relative_error(moment_error_sums(q, domain, x))


def measure(tensors: Mapping[str, torch.Tensor], qmap: Mapping[str, QuantizedTensor | None], *,
            evaluate: Callable[[dict[str, torch.Tensor]], Any] | None, epsilon: float,
            tensor_cap: float, confidence: float = DEFAULT_CONFIDENCE,
            mirror: bool = DEFAULT_MIRROR) -> dict[str, Any]:
    """JSON-ready record of one quantization as the gates see it (see the module docstring).

    tensors:  flat name -> exact tensor; qmap: name -> its quantization (None: exact).
    evaluate: the quality function on flat tensors, or None (the guard rail only).
    mirror:   the scalar gate's mirror check, as the search applies it (`mvc.search.gate`).
    """
    worst, worst_name = distortions(tensors, qmap)
    rec: dict[str, Any] = {
        "tensor_cap": tensor_cap if tensor_cap < float("inf") else None,
        "max_distortion": worst if worst < float("inf") else None,
        "worst_tensor": worst_name, "within_cap": worst <= tensor_cap}
    if evaluate is None:
        return rec
    judge = choose_judge(evaluate(dict(tensors)), epsilon, confidence, mirror)
    cand = {n: (q.dequantize() if q is not None else t)
            for n, t, q in ((n, t, qmap.get(n)) for n, t in tensors.items())}
    v = judge.verdict(evaluate(cand), "the quality function")
    calls = 2
    if isinstance(judge, MetricJudge) and judge.wants_mirror(v):
        quantized = {n for n, q in qmap.items() if q is not None}
        v = judge.with_mirror(v, evaluate(mirror_candidate(tensors, cand, quantized)),
                              "the quality function")
        calls = 3
    finite = v.value < float("inf")
    rec.update({"gate": judge.gate, "baseline": judge.baseline,
                "quality_value": v.value if finite else None,
                "degradation": v.degradation if finite else None,
                "epsilon": judge.epsilon, "evaluations": calls, "within_bound": v.feasible})
    for k, val in judge.record(v).items():
        rec[k] = val if not isinstance(val, float) or val < float("inf") else None
    return rec
