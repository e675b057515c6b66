"""How a commit quantizes its tensors: one call, `plan_quantization`.

    plan = plan_quantization(tensors, how, to_state=..., previous=parent_config,
                             init=parent_centroids, grads=grad_ema)
    plan.config, plan.quantized, plan.domains, plan.moments, plan.quality

`how` (a `Quantization`) says what the commit asked for: lossless, a fixed config
(quantized as configured, measured by the search's gates, `FixedConfigRefusedError` or a
warning when outside them), or the config search (`mvc.search.find_config`, starting
from the parent's config); then, for a lossy commit, the optimizer moments
(`commit.optimizer = compressed`: each one within its cap, else zeroed or exact) and
the first moments' restore bounds.  The result is the decision alone, no store work:
the repository's pipeline (`mvc.repo.pipeline.plan`) writes it.

It needs only tensors, so the repository's reads stay with the caller: the parent's
recorded config (`previous`, a dict as the commit stores it) and its centroids (`init`,
the k-means warm start that keeps levels, and so deltas, stable).
"""
from __future__ import annotations

import dataclasses
import functools
import warnings
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import torch

import mvc.search
from mvc.errors import MvcError, MvcWarning, UsageError
from mvc.native.heap import release_free_heap
from mvc.native.parallel import pmap_sized
from mvc.progress import Progress
from mvc.quant import QuantConfig, QuantizedTensor, QuantPolicy, quantize_state
from mvc.quant.feedback import apply_feedback, usable
from mvc.quant.error import cached_error_sums, relative_error
from mvc.quant.moment_bound import bound_meta
from mvc.quant.state import check_sensitivity_grads
from mvc.quant.batched_moments import moment_ratio_bounds
from mvc.quant.optimizer import quantize_optimizer_state, zeroed_moment
from mvc.search.driver import default_policy
from mvc.search.gate import DEFAULT_MIRROR
from mvc.search.measure import DEFAULT_MOMENT_CAP, measure, moment_distortion
from mvc.search.prepared import Prepared
from mvc.search.random_state import as_the_caller_left_them
from mvc.search.record import QualityRecord
from mvc.search.space import SearchSpace
from mvc.search.trials import quantize_config

#: The candidate's nested state from its flat tensors: what a quality function judges.
ToState = Callable[[dict[str, torch.Tensor]], Any]

#: Input Hessians by module parameter name or flattened name, or a function returning them
#: (called only when a trial or a fixed config asks for error feedback).
Hessians = Mapping[str, torch.Tensor] | Callable[[], Mapping[str, torch.Tensor]]

#: What a fixed-config commit outside its gate's bound or the tensor cap does (see
#: `Quantization`): the first is the default of `commit.fixed_gate`.
FIXED_RULES = ("warn", "refuse")


class FixedConfigRefusedError(UsageError):
    """A fixed-config commit measured outside its quality bound or the tensor cap while
    commit.fixed_gate = refuse; nothing was stored."""

    exit_code = 190


@dataclass(frozen=True)
class Quantization:
    """How a commit stores its tensors: `mode` "lossless", "fixed" (`config`) or "search"
    (`space`, judged by `quality(candidate_state) -> loss` within `epsilon`, or by the proxy;
    every trial keeps each quantized tensor's relative L2 error within `tensor_cap`, None: the
    search's default; `mirror`: the scalar gate's mirror check, None: the default, on);
    `optimizer` "exact" or "compressed" (Adam moments, ExCP-style).

    A "fixed" commit is measured by the same gates (`quality`, `epsilon`, `tensor_cap`) but
    not searched; `fixed_rule` says what a measurement outside its bound does: "warn"
    (store as configured, record it, warn) or "refuse" (`FixedConfigRefusedError`).

    `hessians`: the layers' input Hessians for error feedback (a mapping, or a function
    returning one; `mvc.quant.feedback`); None: those of `quality` when it is a gate built from
    a module (`mvc.quality.from_module`), else none."""

    mode: str = "lossless"
    config: QuantConfig | None = None
    space: SearchSpace | None = None
    quality: Callable[[Any], float] | None = None
    epsilon: float | None = None
    policy: QuantPolicy | None = None
    optimizer: str = "exact"
    tensor_cap: float | None = None
    fixed_rule: str = "warn"
    moment_cap: float | None = None
    mirror: bool | None = None
    hessians: Hessians | None = None

    def __post_init__(self) -> None:
        if self.mode not in ("lossless", "fixed", "search"):
            raise UsageError(f"commit mode must be lossless, fixed or search, got {self.mode!r}")
        if self.mode == "fixed" and not isinstance(self.config, QuantConfig):
            raise UsageError("a fixed-config commit needs a mvc.quant.QuantConfig")
        if self.fixed_rule not in FIXED_RULES:
            raise UsageError(f"commit.fixed_gate must be one of {', '.join(FIXED_RULES)}, "
                             f"got {self.fixed_rule!r}")
        if self.optimizer not in ("exact", "compressed"):
            raise UsageError(f"commit.optimizer must be 'exact' or 'compressed', "
                             f"got {self.optimizer!r}")


@dataclass(frozen=True)
class QuantizationPlan:
    """What `plan_quantization` decided.

    config:    the QuantConfig the commit records (None: stored exactly).
    quantized: name -> QuantizedTensor for the tensors stored quantized; others are exact.
    domains:   name -> "log" / "linear" for compressed optimizer moments.
    moments:   name -> {"partner", "ratio_bound", "sqrt"} for compressed Adam first moments.
    quality:   the quality record the commit records (None: a lossless commit).
    """

    config: QuantConfig | None = None
    quantized: dict[str, QuantizedTensor] = field(default_factory=dict)
    domains: dict[str, str] = field(default_factory=dict)
    moments: dict[str, dict] = field(default_factory=dict)
    quality: QualityRecord | None = None


def plan_quantization(tensors: Mapping[str, torch.Tensor], how: Quantization, *,
                      to_state: ToState, previous: Mapping[str, Any] | None = None,
                      init: Mapping[str, torch.Tensor] | None = None,
                      grads: Mapping[str, torch.Tensor] | None = None,
                      progress: Progress | None = None) -> QuantizationPlan:
    """Decide how each of `tensors` (flat name -> tensor, in the state's order) is stored.

    to_state: rebuilds a candidate's nested state from flat tensors, for `how.quality`.
    previous: the parent's recorded config (a dict; None: no parent, or an exact one): where
              the search's neighbourhood starts.
    init:     the parent's centroids by name: k-means warm starts.
    grads:    gradient (EMA) by name: sensitivity-based protect / prune.
    progress: hears of each trial of a search (a "searching quantization configs" phase).

    A fixed config outside its bounds warns (at the caller of `Repo.commit`) or raises
    `FixedConfigRefusedError`, per `how.fixed_rule`.
    """
    init = init if init is not None else {}
    config: QuantConfig | None = None
    qmap: dict[str, QuantizedTensor | None] = {}
    quality: QualityRecord | None = None
    if how.mode == "fixed":
        config = how.config
        hessians = None
        if config is not None and config.feedback:
            hessians = usable(resolve_hessians(how, tensors) or {}, tensors)
            if not hessians:
                warnings.warn(MvcWarning(
                    "the fixed config asks for error feedback, but no layer input Hessians "
                    "matching its 2-D weights are known (Repo.commit(hessians=...) or a quality "
                    "gate from mvc.quality.from_module): quantized without it"), stacklevel=4)
                config = dataclasses.replace(config, feedback=False)
        qmap, quality = quantize_fixed(tensors, config, how.policy, grads, init, hessians)
        quality = gate_fixed(tensors, qmap, quality, how, to_state)
    elif how.mode == "search":
        config, qmap, quality = search(tensors, how, previous, grads, init, to_state, progress)
    domains: dict[str, str] = {}
    if config:
        domains, report = compress_optimizer(tensors, qmap, init, how.optimizer, how.moment_cap)
        if quality is not None and report:
            quality = quality.updated(**report)
    return QuantizationPlan(
        config=config, quantized={n: q for n, q in qmap.items() if q is not None},
        domains=domains, moments=moment_bounds(tensors, domains), quality=quality)


def _evaluator(quality: Callable[[Any], Any] | None, to_state: ToState
               ) -> Callable[[dict[str, torch.Tensor]], Any] | None:
    """The quality function on flat tensors (what the search and the gates call)."""
    if quality is None:
        return None

    def evaluate(candidate: dict[str, torch.Tensor]) -> Any:
        with as_the_caller_left_them():   # a commit must not change the training run after it
            return quality(to_state(candidate))
    return evaluate


def quantize_fixed(tensors: Mapping[str, torch.Tensor], config: QuantConfig | None,
                   policy: QuantPolicy | None, grads: Mapping[str, torch.Tensor] | None,
                   init: Mapping[str, torch.Tensor] | None = None,
                   hessians: Mapping[str, torch.Tensor] | None = None
                   ) -> tuple[dict[str, QuantizedTensor | None], QualityRecord]:
    """(name -> QuantizedTensor or None, quality record) for one config; with
    `config.feedback`, the tensors `hessians` names (flattened names) get error feedback."""
    assert config is not None
    policy = policy or _default_policy()
    if config.feedback and hessians:
        qmap = apply_feedback(quantize_state(tensors, config, policy, grads,
                                             nonfinite="lossless", init=init),
                              tensors, hessians)
    else:
        # A search's one trial: on a device, each layer type's tensors in one batched pass
        # with one wait (`quantize_state` goes tensor by tensor, waiting several times for
        # each), which leaves the error sums the loop below looks up.
        check_sensitivity_grads(tensors, config, policy, grads)
        source = Prepared(tensors, grads or {}, policy, config.alpha)
        qmap, _ = quantize_config(source, config, seed=0, init=init or {}, weigh=False)
    err = ref = 0.0
    for name, q in qmap.items():
        if q is not None:   # one pass over the levels where no quantization pass left sums
            sums = cached_error_sums(q, tensors[name])
            err, ref = err + sums[0], ref + sums[1]
    rel = (err / ref) ** 0.5 if ref > 0 else 0.0
    # No gate chose a fixed config: `gate_fixed` measures it (worst tensor, quality).
    quality = QualityRecord(metric="rel_l2_weights", value=rel, baseline=0.0, bound=None,
                            quantized_tensors=sum(q is not None for q in qmap.values()),
                            gate="none", nulls=frozenset({"bound"}))
    return qmap, quality


def gate_fixed(tensors: Mapping[str, torch.Tensor], qmap: Mapping[str, QuantizedTensor | None],
               record: QualityRecord, how: Quantization, to_state: ToState) -> QualityRecord:
    """Measure a fixed config with the search's gates and apply `how.fixed_rule`.

    The record keeps `value` = the weights' relative L2 error when no quality function
    is given (gate "none"); with one, the gate it selects measures the config once
    (`value`, `degradation`, `ucb` / `fidelity`, `within_bound`) and the weights' error
    moves to `rel_l2_weights`.  `within_cap` says whether every quantized tensor kept
    its relative L2 error within `how.tensor_cap`; `outside` lists what did not."""
    cap = mvc.search.DEFAULT_TENSOR_CAP if how.tensor_cap is None else how.tensor_cap
    evaluate = _evaluator(how.quality, to_state)
    epsilon = mvc.search.DEFAULT_EPSILON if how.epsilon is None else how.epsilon
    m = measure(tensors, qmap, evaluate=evaluate, epsilon=epsilon, tensor_cap=cap,
                mirror=_mirror(how))
    rec = record.updated(mode="fixed").merged({k: v for k, v in m.items() if k != "quality_value"})
    if evaluate is not None:
        rec = rec.updated(metric=f"fixed-config:{m['gate']}", value=m["quality_value"],
                          rel_l2_weights=record.value)
    outside = []
    if not m["within_cap"]:
        outside.append(f"tensor {m['worst_tensor']} has relative L2 error "
                       f"{m['max_distortion']:.4g} > quality.tensor_cap {cap:g}")
    if evaluate is not None and not m["within_bound"]:
        outside.append(f"the {m['gate']} gate measured it outside its bound "
                       f"({_measured(m)})")
    if outside:
        rec = rec.updated(outside=outside)
        what = "; ".join(outside)
        if how.fixed_rule == "refuse":
            raise FixedConfigRefusedError(
                f"fixed config refused: {what}; nothing stored (commit.fixed_gate = refuse; "
                "'warn' stores it as configured)")
        # 5: this function, plan_quantization, the pipeline's plan, Repo.commit, its caller
        warnings.warn(MvcWarning(f"fixed config stored as configured, but {what} "
                                 "(commit.fixed_gate = refuse refuses such a commit)"),
                      stacklevel=5)
    return rec


def _mirror(how: Quantization) -> bool:
    return DEFAULT_MIRROR if how.mirror is None else bool(how.mirror)


def _measured(m: Mapping[str, Any]) -> str:
    def num(x: Any) -> str:
        return "inf" if x is None else f"{x:.4g}"
    if m["gate"] == "fidelity":
        if m.get("confidence") is not None and m.get("fidelity_ucb") is not None:
            return f"upper bound {num(m['fidelity_ucb'])} > {m['epsilon']:g}"
        return f"{num(m.get('fidelity'))} > {m['epsilon']:g}"
    if m["gate"] == "per-example-ucb":
        return f"upper bound {num(m.get('ucb'))} > {m['epsilon']:g}"
    deg, mirror = m.get("degradation"), m.get("mirror_degradation")
    if deg is not None and deg <= m["epsilon"] and m.get("mirror_check"):
        return f"relative degradation of its mirror {num(mirror)} > {m['epsilon']:g}"
    return f"relative degradation {num(deg)} > {m['epsilon']:g}"


def search(tensors: Mapping[str, torch.Tensor], how: Quantization,
           previous: Mapping[str, Any] | None, grads: Mapping[str, torch.Tensor] | None,
           init: Mapping[str, torch.Tensor], to_state: ToState,
           progress: Progress | None = None
           ) -> tuple[QuantConfig | None, dict[str, QuantizedTensor | None], QualityRecord]:
    """The commit hook: the most compressive config of `how.space` within `how.epsilon`,
    starting from the parent's config `previous` (Inshrinkerator §5)."""
    start = None
    if previous:
        try:
            start = QuantConfig.from_dict(previous)
        except MvcError:  # written by another version: start afresh
            start = None
    quality = how.quality
    space = how.space or SearchSpace.default()
    hessians: Any = None
    if True in space.feedback:
        hessians = resolve_hessians(how, tensors)
    elif space.refine:  # a refined search may try error feedback: collected if it does
        hessians = functools.partial(resolve_hessians, how, tensors)
    # Through the package, not a name bound at import: callers (tests, a Tracker) may wrap it.
    result = mvc.search.find_config(
        tensors, evaluate=_evaluator(quality, to_state), epsilon=how.epsilon, previous=start,
        grads=grads, policy=how.policy or _default_policy(), space=space,
        metric_name=getattr(quality, "__name__", None) if quality else None,
        init=init, tensor_cap=how.tensor_cap, mirror=_mirror(how), hessians=hessians,
        progress=progress)
    if result.config is None:
        return None, {}, result.quality.updated(stored="lossless: no feasible configuration")
    return result.config, dict(result.qmap), result.quality


def resolve_hessians(how: Quantization, tensors: Mapping[str, torch.Tensor]
                     ) -> Mapping[str, torch.Tensor] | None:
    """The input Hessians this commit knows (`Quantization.hessians`), computed now if they
    are lazy: given ones, called when a function, else those a module gate
    (`mvc.quality.from_module`) collects on the exact tensors being committed."""
    h = how.hessians
    if h is None:
        collect = getattr(how.quality, "hessians_of", None)
        return collect(tensors) if callable(collect) else None
    return h() if callable(h) else h


#: Guard rail on compressed first moments (linear domain): a restored m may not be further
#: from m than zeros are (relative L2 error 1): never worse than dropping the momentum.
#: The default scheme (85% pruned, 2 levels) measures 0.55-1.0 on bench_e2e's models by
#: design, and 1.15 on the CNN's largest layer after 200 steps (docs/quality.md): such a
#: moment is stored as zeros (all pruned), which is exactly at the cap and costs nothing.
FIRST_MOMENT_CAP = 1.0


def compress_optimizer(tensors: Mapping[str, torch.Tensor],
                       qmap: dict[str, QuantizedTensor | None],
                       init: Mapping[str, torch.Tensor], policy: str,
                       moment_cap: float | None = None) -> tuple[dict[str, str], dict[str, Any]]:
    """Add optimizer moments to `qmap` when `policy` is "compressed".

    Returns (name -> domain, the quality record's moment fields).  Guard rail: each
    compressed moment's error in the quantity Adam uses (`mvc.search.measure.moment_distortion`)
    must stay within its cap -- FIRST_MOMENT_CAP for first moments, `moment_cap` (config
    `quality.moment_cap`; None: the default) for second moments' sqrt(v); a second moment
    over its cap is stored exactly instead (`moments_exact`), a first moment over it as
    zeros (`moments_zeroed`: no worse than the cap, at no cost).  The record carries
    `moment_cap` and the worst error per domain (`moment_distortion`).
    `init`: the parent's centroids by name, to warm-start the moments' k-means.
    """
    if policy == "exact":
        return {}, {}
    cap_v = DEFAULT_MOMENT_CAP if moment_cap is None else moment_cap
    caps = {"linear": FIRST_MOMENT_CAP, "log": cap_v}
    domains: dict[str, str] = {}
    worst: dict[str, float] = {}
    exact: list[str] = []
    zeroed: list[str] = []
    moments = quantize_optimizer_state(tensors, qmap, init=init)
    # what the compression freed goes back to the OS before the measuring pass's temporaries
    # land on top of it (the C heap keeps each pool thread's freed pieces in its own arena)
    release_free_heap()
    # measured one moment per pool thread, the largest alone (a pass each; results do not
    # depend on the split)
    dist = pmap_sized(lambda n: moment_distortion(moments[n].q, moments[n].domain, tensors[n]),
                      {n: tensors[n].numel() for n in moments})
    for name, oq in moments.items():
        d = dist[name]
        q = oq.q
        if not d <= caps[oq.domain] and oq.domain == "linear":
            t = tensors[name]
            # zeros restore -m: an error of exactly m's own norm (1.0; 0 for an all-zero m),
            # known from the sums the compression left, with no pass over m. Their levels go
            # where the compressed moment's went (a device state's: the host, `to_host`), not
            # to the device for the writer to bring back.
            r = cached_error_sums(q, t)[1]  # sum m^2: zeros' squared error too
            d = relative_error((r, r))
            q = zeroed_moment(t, q.bins, device=q.levels.device)
            zeroed.append(name)
        worst[oq.domain] = max(worst.get(oq.domain, 0.0), d)
        if not d <= caps[oq.domain]:
            exact.append(name)
            continue
        qmap[name] = q
        domains[name] = oq.domain
    if not worst:
        return domains, {}
    report: dict[str, Any] = {
        "moment_cap": {"linear": FIRST_MOMENT_CAP, "log": cap_v},
        "moment_distortion": {k: (round(v, 6) if v < float("inf") else None)
                              for k, v in worst.items()}}
    if exact:
        report["moments_exact"] = sorted(exact)
    if zeroed:
        report["moments_zeroed"] = sorted(set(zeroed) - set(exact))
    return domains, report


def moment_bounds(tensors: Mapping[str, torch.Tensor], domains: Mapping[str, str]
                  ) -> dict[str, dict]:
    """Extra record meta for compressed first moments: their second-moment partner and
    the largest |m| / sqrt(v) of the exact state, so restore can keep Adam's step bounded."""
    pairs = [n for n, domain in domains.items() if domain == "linear" and n.endswith("exp_avg")
             and n + "_sq" in tensors and tensors[n].shape == tensors[n + "_sq"].shape]
    bounds = moment_ratio_bounds([(tensors[n], tensors[n + "_sq"]) for n in pairs])
    return {n: bound_meta(n + "_sq", b) for n, b in zip(pairs, bounds)}


def _default_policy() -> QuantPolicy:
    # Weights only: optimizer state has its own path (`commit.optimizer`).
    return default_policy()
