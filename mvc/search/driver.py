"""`find_config`: pick the most compressive quantization config within epsilon (§5).

With no previous config (first commit), or when the neighbourhood has nothing
feasible, the guided exhaustive search (Alg. 4) runs once per pruning metric
(sensitivity only when a gradient is known for every quantized tensor) and the
cheaper winner is kept; otherwise the delta-neighbourhood search starts from the
previous config.  Every chosen config has been evaluated: a winner found by
monotone inference alone is probed before it is accepted, and if it fails (quality
is only roughly monotone) the search resumes with that knowledge.  When every point of
a refining space (the default one) is refused, the search goes on in
`SearchSpace.refined()`, its trials so far kept, before the commit falls back to lossless.

Work shared across trials is done once per call: the value and sensitivity
sketches of every tensor and their per-layer-type merges (so a trial only reads
thresholds off merged sketches and runs k-means + assignment), and a tensor whose
(bins, thresholds) did not change since the last or the best trial reuses that
quantization.  Trials quantize exactly as `mvc.quant.quantize_state(tensors,
config, policy, grads, seed, nonfinite="lossless")` does, and the winner's
quantization is returned so the repository never recomputes it.  Memory: besides
the sketches, only the current trial's and the best trials' levels are kept.  The trials
themselves run in `mvc.search.runner`.
"""
from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Callable, Mapping
from typing import Any

import torch

from mvc.quant import QuantConfig, QuantPolicy
from mvc.quant.optimizer import OPTIMIZER_STATE_PATTERNS
from mvc.progress import Progress
from mvc.quant.uniform import DEFAULT_FAMILY
from mvc.search.gate import (
    DEFAULT_CONFIDENCE,
    DEFAULT_MIRROR,
    DEFAULT_TENSOR_CAP,
    check_tensor_cap,
)
from mvc.search.guided import MonotoneOracle, guided_search
from mvc.search.neighbourhood import Outcome, neighbourhood, neighbourhood_search
from mvc.search.parallel import ParallelSearchError, Ranks, active, default_ranks
from mvc.search.prepared import Hessians, Prepared
from mvc.search.quality import DEFAULT_EPSILON, PROXY_EPSILON
from mvc.search.quality import finite as _finite
from mvc.search.record import QualityRecord
from mvc.search.result import SearchResult
from mvc.search.runner import Evaluate, Runner, json_info, strip
from mvc.search.space import (Point, SearchError, SearchSpace, quantizer_of, split_quantizer,
                              split_variant, variant)
from mvc.search.trials import TrialSource, source_families, source_feedback

#: Tensors of the optimizer state (``.../state/<param index>/...``) stay out of the search.
DEFAULT_EXCLUDE = OPTIMIZER_STATE_PATTERNS


def default_policy() -> QuantPolicy:
    """The repository's default: big float tensors, not biases / norms / optimizer state."""
    return QuantPolicy(exclude=DEFAULT_EXCLUDE)


# ------------------------------------------------------------------ searches
def _exhaustive(run: Runner, metrics: list[str]) -> Point | None:
    sp, prep = run.space, run.prep
    emb, share = prep.embeddings, prep.embedding_share
    shape = sp.shape(emb)

    def cost(idx: tuple[int, ...]) -> float:
        return sp.cost(idx, emb, share)

    winners: list[Point] = []
    for metric in metrics:
        oracle = MonotoneOracle(functools.partial(_feasible, run, metric))
        family = split_variant(metric)[0]
        for point, tr in run.memo.items():  # seed with what earlier trials showed
            if point[0] == metric or (split_variant(point[0])[0] == family
                                      and sp.axes(emb)[1][point[1][1]] == 0):
                oracle.seed(point[1], tr.feasible)
        prefetch = None
        if run.par is not None:
            def prefetch(idxs: list[tuple[int, ...]], metric: str = metric,
                         oracle: MonotoneOracle = oracle) -> None:
                for i, ok in zip(idxs, run.prefetch([(metric, i) for i in idxs])):
                    oracle.seed(i, ok)
        while True:
            idx = guided_search(shape, cost, oracle, prefetch=prefetch,
                                width=run.par.size if run.par is not None else 1)
            if idx is None:
                break
            # A winner inferred by monotonicity alone is probed before it is accepted;
            # if it fails, the oracle now knows and the search resumes.
            if oracle.probe(idx):
                winners.append(sp.canonical((metric, idx), emb))
                break
    if not winners:
        return None

    def order(p: Point) -> int:
        return metrics.index(p[0]) if p[0] in metrics else 0

    # Within a family the cost model decides (as before families); between families, the
    # measured bits (level entropy plus protected values): the smaller stored size wins.
    best: dict[str, Point] = {}
    for p in winners:
        fam = split_variant(p[0])[0]
        cur = best.get(fam)
        key = (cost(p[1]), run.memo[p].bits, run.memo[p].verdict.preference, order(p))
        if cur is None or key < (cost(cur[1]), run.memo[cur].bits,
                                 run.memo[cur].verdict.preference, order(cur)):
            best[fam] = p
    return min(best.values(), key=lambda p: (run.memo[p].bits, cost(p[1]), order(p)))


def _feasible(run: Runner, metric: str, idx: tuple[int, ...]) -> bool:
    return run.trial(metric, idx).feasible


def _metrics(space: SearchSpace, prep: TrialSource) -> list[str]:
    """The variants searched: every family of the space the source quantizes with, by every
    prune metric it can serve, with error feedback too when the space asks for it and the
    source knows Hessians."""
    metrics = [m for m in space.prune_metric if m != "sensitivity" or prep.has_sensitivity]
    families = source_families(prep)
    feedback = True in space.feedback and source_feedback(prep)  # (collects lazy Hessians)
    out = []
    for v in space.variants(metrics):
        family, fb = split_quantizer(split_variant(v)[0])
        if family in families and (feedback or not fb):
            out.append(v)
    return out


def find_config(tensors: Mapping[str, torch.Tensor], *, evaluate: Evaluate | None = None,
                epsilon: float | None = None, previous: QuantConfig | None = None,
                grads: Mapping[str, torch.Tensor] | None = None,
                policy: QuantPolicy | None = None, space: SearchSpace | None = None,
                seed: int = 0, radius: int = 1, metric_name: str | None = None,
                init: Mapping[str, torch.Tensor] | None = None,
                tensor_cap: float | None = None,
                confidence: float = DEFAULT_CONFIDENCE,
                mirror: bool = DEFAULT_MIRROR,
                hessians: Hessians | None = None,
                progress: Progress | None = None) -> SearchResult:
    """Search the config cube for the most compressive config its gate accepts.

    tensors:  flat name -> tensor (`mvc.io.flatten(state).tensors`).
    evaluate: quality of a full candidate tensor dict (quantized tensors replaced by their
              dequantized values): a loss (the scalar gate), per-example losses (a 1-D
              tensor: the confidence-bound gate), or a fidelity gate's outputs when it
              is or carries a `mvc.search.fidelity.Fidelity`; None uses the proxy.  The
              gates are described in `mvc.search.gate`.
    epsilon:  bound on the relative degradation; None means DEFAULT_EPSILON (0.005) with
              `evaluate`, PROXY_EPSILON with the proxy.  A fidelity gate uses its own
              threshold instead.
    previous: the config chosen at the previous commit: enables the neighbourhood search.
    grads:    gradient (EMA) by tensor name: sensitivity pruning/protection and the
              gradient-weighted proxy.
    policy:   which tensors are quantized (default: `default_policy()`).
    radius:   neighbourhood size in steps per axis.
    metric_name: overrides the metric label recorded for `evaluate`.
    init:     warm-start centroids by name (the parent commit's): trials with the same bin
              count start Lloyd there, which keeps levels, and so deltas, stable.
    tensor_cap: every trial must keep each quantized tensor's relative L2 error within
              it, whatever the gate (None: DEFAULT_TENSOR_CAP; math.inf: off).
    confidence: one-sided confidence of the per-example gate's upper bound.
    mirror:   the scalar gate also measures each passing trial's mirrored candidate
              w - (q - w) and accepts only when both are within epsilon, so that selection
              cannot pick a trial for its calibration noise (`mvc.search.gate`); False: the
              trial alone.  Other gates ignore it.
    hessians: input Hessians of linear layers (by module parameter name or flattened name,
              `mvc.quant.feedback.collect_hessians`): a space with `feedback=(..., True)` also
              searches error feedback on the 2-D weights they match (so does a refined
              default space).  A function returning them is called when a trial first needs
              them.  A search spread over ranks does not (the replicas would need the same
              Hessians).
    progress: hears of each trial run (`mvc.progress`: a "searching quantization configs"
              phase counting trials); default: none.
    """
    space = space or SearchSpace.default()
    policy = policy or default_policy()
    if epsilon is None:
        epsilon = DEFAULT_EPSILON if evaluate is not None else PROXY_EPSILON
    _check_epsilon(epsilon)
    cap = check_tensor_cap(DEFAULT_TENSOR_CAP if tensor_cap is None else tensor_cap)
    if isinstance(confidence, bool) or not isinstance(confidence, (int, float)) \
            or not 0.5 <= confidence < 1.0:
        raise SearchError(f"confidence must be in [0.5, 1), got {confidence!r}")
    if previous is not None and not isinstance(previous, QuantConfig):
        raise SearchError(f"previous must be a QuantConfig, got {type(previous).__name__}")
    par = active()
    prep = Prepared(tensors, dict(grads or {}), policy, space.alpha,
                    hessians if par is None else None)
    run = Runner(prep, space, evaluate, float(epsilon), seed, init, cap, float(confidence),
                  bool(mirror))
    if progress is not None:
        run.progress = progress
        progress.phase("searching quantization configs", unit="trials")
    if par is None:
        return _find(run, previous, radius, metric_name)
    if not par.leader:
        raise ParallelSearchError(f"rank {par.rank} of a parallel search must serve_trials(), "
                                  "not search")
    # Workers build the same runner from these (and their own tensors, gradients, function).
    par.send(("start", {"policy": policy, "space": space, "epsilon": float(epsilon),
                        "seed": seed, "init": dict(init or {}), "cap": cap,
                        "confidence": float(confidence), "metric_name": metric_name,
                        "mirror": bool(mirror)}))
    run.par = par
    try:
        return _find(run, previous, radius, metric_name)
    finally:
        par.send(("done", None))


def search_trials(source: TrialSource, *, space: SearchSpace | None = None,
                  epsilon: float | None = None, seed: int = 0,
                  init: Mapping[str, torch.Tensor] | None = None,
                  tensor_cap: float | None = None) -> SearchResult:
    """`find_config`'s search over the trials `source` runs (`mvc.search.trials`), gated by
    the proxy: a first-commit search (no neighbourhood), no quality function.  A sharded
    save's source runs collective trials: every process of its group calls this alike and
    gets the same config and record, with its own part of the quantization (`qmap`, by
    `source.tensors`' names).

    epsilon:    bound on the proxy (None: PROXY_EPSILON).
    init:       warm-start centroids by tensor name (`source.names`).
    space, seed, tensor_cap: as for `find_config`.
    """
    epsilon = PROXY_EPSILON if epsilon is None else epsilon
    _check_epsilon(epsilon)
    cap = check_tensor_cap(DEFAULT_TENSOR_CAP if tensor_cap is None else tensor_cap)
    space = space or SearchSpace.default()
    families = tuple(f for f in space.family if f in source_families(source))
    # a source quantizing fewer families than the space lists searches the part it can
    space = dataclasses.replace(space, family=families or (DEFAULT_FAMILY,))
    run = Runner(source, space, None, float(epsilon), seed, init, cap)
    return _find(run, None, 1, None)


def _check_epsilon(epsilon: Any) -> None:
    if isinstance(epsilon, bool) or not isinstance(epsilon, (int, float)) or not epsilon >= 0 \
            or not math.isfinite(epsilon):
        raise SearchError(f"epsilon must be a finite number >= 0, got {epsilon!r}")


def serve_trials(tensors: Mapping[str, torch.Tensor], *, evaluate: Evaluate | None = None,
                 grads: Mapping[str, torch.Tensor] | None = None, group: Any = None) -> Any:
    """A worker's part of parallel searches (`mvc.search.parallel`): while rank 0 of `group`
    runs `find_config` in a `ranks(group)` block (any number of times), evaluate the trials
    it hands this rank, on this replica's `tensors` (the same state as the leader's), with
    `evaluate` and `grads` as `find_config` takes them.  Returns the first message rank 0
    sends (`Ranks.send`) that is not part of a search: what rank 0 does after its searches
    (e.g. the commit id), which also ends the wait when rank 0 does not search at all."""
    par = default_ranks(group)
    while True:
        msg = par.send()
        if not (isinstance(msg, tuple) and len(msg) == 2 and msg[0] == "start"):
            return msg
        _serve(par, msg[1], tensors, evaluate, grads)


def _serve(par: Ranks, kw: dict[str, Any], tensors: Mapping[str, torch.Tensor],
           evaluate: Evaluate | None, grads: Mapping[str, torch.Tensor] | None) -> None:
    prep = Prepared(tensors, dict(grads or {}), kw["policy"], kw["space"].alpha)
    run = Runner(prep, kw["space"], evaluate, kw["epsilon"], kw["seed"], kw["init"],
                  kw["cap"], kw["confidence"], kw.get("mirror", DEFAULT_MIRROR))
    while True:
        msg = par.send()
        if msg == ("done", None):
            return
        if isinstance(msg, tuple) and len(msg) == 2 and msg[0] == "space" \
                and isinstance(msg[1], SearchSpace):
            run.space = msg[1]   # the leader went on in a refined cube
            continue
        if not (isinstance(msg, tuple) and len(msg) == 2 and msg[0] == "batch"):
            raise ParallelSearchError(f"expected a batch of trials, got {msg!r:.80}")
        if not run.started:
            run.start(kw["metric_name"])    # this replica's own baseline (the same batch)
        par.gather(strip(run.share(msg[1], par.rank)))


def _find(run: Runner, previous: QuantConfig | None, radius: int, metric_name: str | None
          ) -> SearchResult:
    prep, space, tensors = run.prep, run.space, run.prep.tensors
    if not prep.names:
        return SearchResult(None, {n: None for n in tensors},
                            _record(run, None, "nothing-to-quantize"), 0)
    metrics = _metrics(space, prep)
    if not metrics:
        raise SearchError("the search space only allows sensitivity pruning, which needs a "
                          "gradient for every quantized tensor (grads=)")
    run.start(metric_name)
    if previous is not None and space.refine and space.beyond(previous):
        # the parent's config came from the refined cube: its neighbourhood is there
        run.refine()
        space = run.space
        metrics = _metrics(space, prep)
    emb, share = prep.embeddings, prep.embedding_share
    winner: Point | None = None
    mode = "exhaustive"
    if previous is not None and quantizer_of(previous) not in {split_variant(m)[0] for m in metrics}:
        # a parent with error feedback, this commit without Hessians: its family without it
        previous = dataclasses.replace(previous, feedback=False)
    if previous is not None and not any(split_variant(m)[0] == previous.family for m in metrics):
        previous = None  # a family this search does not cover: search afresh
    if previous is not None:
        mode = "neighbourhood"
        # the neighbourhood stays in the previous family (its levels keep deltas sparse); the
        # other family is searched when the neighbourhood has nothing feasible
        mine = [m for m in metrics if split_variant(m)[0] == quantizer_of(previous)]
        current = variant(quantizer_of(previous), previous.prune_metric)
        current = current if current in mine else mine[0]
        others = [m for m in mine if m != current]
        start = space.snap(previous, emb)
        outcome: Callable[[str, tuple[int, ...]], Outcome] = run.outcome
        if run.par is not None:
            outcome = _lookahead(run, start, current, others[0] if others else None, radius)
        found = neighbourhood_search(
            start, current, others[0] if others else None,
            space.shape(emb), lambda i: space.cost(i, emb, share),
            lambda i: space.axes(emb)[1][i[1]] > 0,
            outcome,
            run.epsilon, radius)
        if found is not None:
            winner = space.canonical(found, emb)
        else:
            mode = "fallback-exhaustive"
    if winner is None:
        winner = _exhaustive(run, metrics)
    if winner is None and run.space.refine:
        # every point refused: finer levels, both families, error feedback before lossless
        run.refine()
        winner = _exhaustive(run, _metrics(run.space, prep))
    if winner is None:
        return SearchResult(None, {n: None for n in tensors}, _record(run, None, mode),
                            run.evaluations)
    return SearchResult(run.memo[winner].config, run.qmap_of(winner), _record(run, winner, mode),
                        run.evaluations)


def _lookahead(run: Runner, p: tuple[int, ...], current: str, other: str | None, radius: int
               ) -> Callable[[str, tuple[int, ...]], Outcome]:
    """`run.outcome` for the neighbourhood search of a parallel search: a trial not yet run
    is run in a round with the next ones the search would ask for, in its order (the metric
    check at p, then the neighbourhood cheapest first), so a round of N ranks runs N."""
    sp, emb, share = run.space, run.prep.embeddings, run.prep.embedding_share
    rest = neighbourhood(p, sp.shape(emb), lambda i: sp.cost(i, emb, share), radius)[1:]
    order: list[tuple[str, tuple[int, ...]]] = ([(other, p)] if other else []) + [(current, p)]
    order += [(current, q) for q in rest] + ([(other, q) for q in rest] if other else [])

    def outcome(metric: str, idx: tuple[int, ...]) -> Outcome:
        if sp.canonical((metric, idx), emb) not in run.memo:
            at = order.index((metric, idx)) if (metric, idx) in order else len(order)
            ahead = [q for q in order[at + 1:] if sp.canonical(q, emb) not in run.memo]
            assert run.par is not None
            run.prefetch([(metric, idx)] + ahead[:run.par.size - 1])
        return run.outcome(metric, idx)
    return outcome


def _record(run: Runner, winner: Point | None, mode: str) -> QualityRecord:
    tr = run.memo.get(winner) if winner is not None else None
    closest = None
    if tr is None and run.log:  # what came closest: a lossless fallback names it
        closest = min(run.log, key=lambda e: (e.get("degradation") is None, e.get("degradation") or 0.0))
    # Which gate vouched for the winner (or refused every trial), with its bound, and the
    # guard rail every trial had to pass.
    rec = QualityRecord(
        metric=run.metric, baseline=run.baseline,
        value=_finite(tr.value) if tr else None,
        degradation=_finite(tr.degradation) if tr else None,
        epsilon=run.epsilon, evaluations=run.evaluations, mode=mode,
        bits_per_param=round(tr.bits, 4) if tr else None,
        gate=run.judge.gate if run.started else None,
        suspicious_trials=sum(t.verdict.suspicious for t in run.memo.values())
        if run.started else None,
        tensor_cap=_finite(run.tensor_cap),
        max_distortion=_finite(round(tr.worst, 6)) if tr else None,
        worst_tensor=tr.worst_name if tr else None,
        trials=run.log, closest=closest,
        refined=True if run.refined else None,
        ranks=run.par.size if run.par is not None else None,
        rounds=run.rounds if run.par is not None else None,
        nulls=_SEARCH_FIELDS)
    if run.started:  # the gate's own fields (its bound, its confidence, ...)
        rec = rec.merged(json_info(run.judge.record(tr.verdict if tr else None)))
    return rec


#: What every search record writes, as null when it has no value.
_SEARCH_FIELDS = frozenset({"metric", "baseline", "value", "degradation", "epsilon", "evaluations",
                            "mode", "bits_per_param", "gate", "tensor_cap", "max_distortion",
                            "worst_tensor", "trials"})
