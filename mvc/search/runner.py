"""Runs a search's trials (`mvc.search.driver`): quantize a config (reusing what the last
and the best trials quantized), measure it, score it with the gate chosen from the exact
state's measurement, log it, and keep the best trials' levels; parallel searches run the
same trials in rounds, one per rank."""
from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, cast

import torch

from mvc.errors import InternalError
from mvc.progress import NO_PROGRESS, Progress
from mvc.quant import QuantConfig, QuantizedTensor
from mvc.quant.backend import on_host_kernels
from mvc.quant.error import measured_stand_in
from mvc.quant.uniform import DEFAULT_FAMILY
from mvc.search.fidelity import FidelityJudge, FidelityOutputs
from mvc.search.gate import (
    DEFAULT_CONFIDENCE,
    DEFAULT_MIRROR,
    DEFAULT_TENSOR_CAP,
    MetricJudge,
    PerExampleJudge,
    ProxyJudge,
    Verdict,
    mirror_candidate,
)
from mvc.search.measure import choose_judge
from mvc.search.neighbourhood import Outcome
from mvc.search.parallel import Ranks
from mvc.search.quality import finite as _finite
from mvc.search.quality import proxy_name
from mvc.search.space import Point, SearchSpace, quantizer_of, short
from mvc.search.trials import Measure, PieceKey, Pieces, TrialSource, quantize_config
from mvc.search.trials import worst as worst_of

Evaluate = Callable[[dict[str, torch.Tensor]], Any]


@dataclass
class Trial:
    config: QuantConfig
    verdict: Verdict
    feasible: bool            # the gate's verdict and the tensor cap
    bits: float
    worst: float              # the largest per-tensor relative L2 error
    worst_name: str | None
    qmap: dict[str, QuantizedTensor | None] | None = field(default=None, repr=False)
    keys: dict[PieceKey, Pieces] = field(default_factory=dict, repr=False)

    @property
    def value(self) -> float:
        return self.verdict.value

    @property
    def degradation(self) -> float:
        return self.verdict.degradation


def json_info(info: Mapping[str, Any]) -> dict[str, Any]:
    return {k: _finite(v) if isinstance(v, float) else v for k, v in info.items()}


class Runner:
    """Runs trials: quantize (with reuse), score, log; keeps the best trials' levels.
    `prep` is where the trials come from: this process's whole tensors (`Prepared`) or,
    e.g., a sharded save's collective trials (`mvc.search.trials`)."""

    def __init__(self, prep: TrialSource, space: SearchSpace, evaluate: Evaluate | None,
                 epsilon: float, seed: int, init: Mapping[str, torch.Tensor] | None = None,
                 tensor_cap: float = DEFAULT_TENSOR_CAP,
                 confidence: float = DEFAULT_CONFIDENCE, mirror: bool = DEFAULT_MIRROR) -> None:
        self.prep, self.space, self.evaluate = prep, space, evaluate
        self.epsilon, self.seed = epsilon, seed
        self.tensor_cap, self.confidence, self.mirror = tensor_cap, confidence, mirror
        self.init = dict(init or {})
        self.evaluations = 0
        self.judge: MetricJudge | PerExampleJudge | FidelityJudge = ProxyJudge(epsilon)
        self.started = False
        self.metric = proxy_name(prep.has_sensitivity)
        self.memo: dict[Point, Trial] = {}
        self.best: dict[str, Point] = {}          # requested metric -> cheapest feasible point
        self.log: list[dict[str, Any]] = []
        self._last: dict[PieceKey, Pieces] = {}
        self._last_family = DEFAULT_FAMILY        # the quantizer `_last` was quantized by
        self.par: Ranks | None = None             # leading a parallel search over these
        self.rounds = 0                           # parallel rounds (batches of trials)
        self.refined = False                      # searched `space.refined()` (`refine`)
        self.progress: Progress = NO_PROGRESS     # hears of each trial run
        # On a device a trial's levels are a quarter of the weights' bytes, held in its memory:
        # there only the latest trial's are kept (a winner that is not the latest is made again
        # at the end: deterministic, the same levels), not the best trials' as well.
        self.frugal = any(not on_host_kernels(t) for t in prep.tensors.values())
        # A proxy search measures a trial from each quantization's error sums and level counts
        # alone (a source that says so: `measures_stand_ins`), so a tensor an earlier trial
        # quantized under the same quantizer and key is measured again from a levels-free
        # stand-in, not quantized again: a few floats kept per key, not its levels.
        self.stand_ins = evaluate is None and bool(getattr(prep, "measures_stand_ins", False))
        self._measured: dict[tuple[str, PieceKey], Pieces] = {}

    @property
    def baseline(self) -> float:
        return self.judge.baseline

    def refine(self) -> None:
        """Go on in `space.refined()`: the trials run so far keep their answers, as points
        of the finer cube (its axes hold every value of this one's)."""
        old, new, emb = self.space, self.space.refined(), self.prep.embeddings
        self.memo = {new.remap(p, old, emb): tr for p, tr in self.memo.items()}
        self.best = {m: new.remap(p, old, emb) for m, p in self.best.items()}
        self.space, self.refined = new, True
        if self.par is not None:  # the workers evaluate points of the same cube
            self.par.send(("space", new))

    def start(self, metric_name: str | None) -> None:
        """Measure the exact tensors once and choose the gate from what came back."""
        self.started = True
        if self.evaluate is None:
            return
        # The exact state's measurement (a fidelity gate's reference outputs) lives in
        # the judge for this search only: a new commit measures its own state afresh.
        raw = self._call(dict(self.prep.tensors))
        self.judge = choose_judge(raw, self.epsilon, self.confidence, self.mirror)
        if isinstance(raw, FidelityOutputs):
            self.epsilon = self.judge.epsilon
            self.metric = "fidelity:" + raw.gate.metric
            return
        self.metric = metric_name or "quality:" + getattr(
            self.evaluate, "__qualname__", type(self.evaluate).__name__)

    def _call(self, candidate: dict[str, torch.Tensor]) -> Any:
        if self.evaluate is None:
            raise InternalError("a quality-function call in a proxy search")
        self.evaluations += 1
        return self.evaluate(candidate)

    # -------------------------------------------------------------- quantization
    def quantize(self, config: QuantConfig
                 ) -> tuple[dict[str, QuantizedTensor | None], dict[PieceKey, Pieces]]:
        """Every searched tensor quantized by `config`, levels and all (what a winner is
        written from)."""
        qmap, keys, _ = self._quantize(config, stand_ins=False)
        return qmap, keys

    def _quantize(self, config: QuantConfig, stand_ins: bool
                  ) -> tuple[dict[str, QuantizedTensor | None], dict[PieceKey, Pieces], bool]:
        # A tensor quantized by the last trial or kept by a best trial, under the same
        # (family, feedback, bins, thresholds), is not quantized again; with `stand_ins`, one
        # measured by any earlier trial is not either (the third value: some was).
        key = quantizer_of(config)
        reuse = dict(self._last) if self._last_family == key else {}
        self._last = {}  # held on only in `reuse`, which drops what this config does not use
        if self.frugal:
            self._release(keep=set())
        for point in self.best.values():
            if quantizer_of(self.memo[point].config) == key:
                reuse.update(self.memo[point].keys)
        stand = ({k: v for (q, k), v in self._measured.items() if q == key and k not in reuse}
                 if stand_ins else {})
        reuse.update(stand)
        qmap, keys = quantize_config(self.prep, config, seed=self.seed, init=self.init,
                                     weigh=self.evaluate is None, reuse=reuse)
        stood_in = {k for k, v in keys.items() if stand.get(k) is v}
        # only real quantizations are reused for levels
        self._last = {k: v for k, v in keys.items() if k not in stood_in}
        self._last_family = key
        return qmap, keys, bool(stood_in)

    # -------------------------------------------------------------- scoring
    def score(self, qmap: Mapping[str, QuantizedTensor | None], m: Measure) -> Verdict:
        if self.evaluate is None:
            assert m.proxy is not None and m.metric is not None
            self.metric = m.metric
            return self.judge.verdict(m.proxy, "the proxy")
        cand = {n: (q.dequantize() if q is not None else t)
                for n, t, q in ((n, t, qmap[n]) for n, t in self.prep.tensors.items())}
        v = self.judge.verdict(self._call(cand), "the quality function")
        if isinstance(self.judge, MetricJudge) and self.judge.wants_mirror(v):
            # the scalar gate's mirror check (mvc.search.gate): w - delta for w + delta
            quantized = {n for n, q in qmap.items() if q is not None}
            mirror = mirror_candidate(self.prep.tensors, cand, quantized)
            del cand
            v = self.judge.with_mirror(v, self._call(mirror), "the quality function")
        return v

    # -------------------------------------------------------------- trials
    def trial(self, metric: str, idx: tuple[int, ...]) -> Trial:
        sp, emb = self.space, self.prep.embeddings
        point = sp.canonical((metric, idx), emb)
        tr = self.memo.get(point)
        if tr is None:
            tr, entry = self._evaluate(point)
            self.memo[point] = tr
            self.log.append(entry)
            self.progress.advance(0, 1)
        self._keep_best(metric, point, tr)
        self._release()
        return tr

    def _evaluate(self, point: Point) -> tuple[Trial, dict[str, Any]]:
        config = self.space.config(point, self.prep.embeddings)
        qmap, keys, stood_in = self._quantize(config, stand_ins=self.stand_ins)
        m = self.prep.measure(qmap, keys, proxy=self.evaluate is None)
        if self.stand_ins:
            self._remember_measured(quantizer_of(config), keys)
        verdict = self.score(qmap, m)
        worst, worst_name = worst_of(m.distortion)
        capped = not worst <= self.tensor_cap
        tr = Trial(config, verdict, verdict.feasible and not capped, m.bits,
                    worst, worst_name, *((None, {}) if stood_in else (qmap, keys)))
        # (measured in part from stand-ins: no levels to keep; a winner is quantized again)
        entry = {"config": short(config), "value": _finite(verdict.value),
                 "degradation": _finite(verdict.degradation), "feasible": tr.feasible,
                 "bits": round(tr.bits, 4), **json_info(verdict.info),
                 "distortion": _finite(round(worst, 6))}
        if capped:
            entry["refused"] = (f"tensor_cap: {worst_name} has relative L2 error "
                                f"{worst:.4g} > {self.tensor_cap:g}")
        return tr, entry

    def _remember_measured(self, quantizer: str, keys: Mapping[PieceKey, Pieces]) -> None:
        """Keep a levels-free stand-in of each quantization `keys` holds that has none yet
        (its sums and counts are cached once the trial is measured)."""
        for k, pieces in keys.items():
            if (quantizer, k) in self._measured:
                continue
            stand = {n: measured_stand_in(q) for n, q in pieces.items()}
            if all(v is not None for v in stand.values()):
                self._measured[(quantizer, k)] = cast(Pieces, stand)

    def _keep_best(self, metric: str, point: Point, tr: Trial) -> None:
        if tr.feasible:
            cur = self.best.get(metric)
            if cur is None or self._key(point) < self._key(cur):
                self.best[metric] = point

    # -------------------------------------------------------------- parallel rounds
    def share(self, batch: list[Point], rank: int) -> tuple[Trial, dict[str, Any]] | None:
        """This rank's trial of a round (`batch[rank]`), levels included (None: no trial)."""
        if rank >= len(batch):
            return None
        return self._evaluate(batch[rank])

    def prefetch(self, points: list[tuple[str, tuple[int, ...]]]) -> list[bool]:
        """Evaluate `points` ((metric, idx) pairs) in rounds of one trial per rank; their
        verdicts (feasible or not), in order.  Only the leader of a parallel search calls it."""
        par = self.par
        if par is None:
            return [self.trial(m, i).feasible for m, i in points]
        sp, emb = self.space, self.prep.embeddings
        canon = [sp.canonical(p, emb) for p in points]
        todo = list(dict.fromkeys(c for c in canon if c not in self.memo))
        for k in range(0, len(todo), par.size):
            batch = todo[k:k + par.size]
            par.send(("batch", batch))
            mine = self.share(batch, par.rank)
            results = par.gather(strip(mine))
            if mine is not None:
                results[par.rank] = mine   # its levels stay: reused, and no recompute if it wins
            self.rounds += 1
            for point, res in zip(batch, results):
                assert res is not None
                self.memo[point], entry = res
                self.log.append(entry)
        for (metric, _), c in zip(points, canon):
            self._keep_best(metric, c, self.memo[c])
        self._release()
        return [self.memo[c].feasible for c in canon]

    def _key(self, point: Point) -> tuple:
        return (self.space.cost(point[1], self.prep.embeddings, self.prep.embedding_share), point[1])

    def _release(self, keep: set[Point] | None = None) -> None:
        """Drop the levels of the trials not in `keep` (default: the best ones)."""
        keep = set(self.best.values()) if keep is None else keep
        for point, tr in self.memo.items():
            if point not in keep and tr.qmap is not None:
                tr.qmap, tr.keys = None, {}

    def outcome(self, metric: str, idx: tuple[int, ...]) -> Outcome:
        tr = self.trial(metric, idx)
        return Outcome(tr.feasible, tr.verdict.preference)

    def qmap_of(self, point: Point) -> dict[str, QuantizedTensor | None]:
        tr = self.memo[point]
        if tr.qmap is None:  # released: recompute (deterministic, same result)
            tr.qmap, tr.keys = self.quantize(tr.config)
        return tr.qmap


def strip(result: tuple[Trial, dict[str, Any]] | None) -> tuple[Trial, dict[str, Any]] | None:
    """A trial as the other ranks receive it: the verdict without the levels."""
    if result is None:
        return None
    tr, entry = result
    return dataclasses.replace(tr, qmap=None, keys={}), entry
