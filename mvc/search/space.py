"""The quantization-config cube searched at every commit (Inshrinkerator §5, Table 9).

A point of the cube is one index per axis plus a pruning metric.  Every axis is
ordered from the most compressive value to the least compressive (= highest
quality) one, so that quality is assumed to rise and compression to fall along
every axis — the monotonicity Algorithm 4 relies on:

    bins            ascending   (4 -> 64)
    prune           descending  (0.5 -> 0)
    protect         ascending   (0.0005 -> 0.01)
    embedding_bins  ascending   (16 -> 32; only when the checkpoint has embeddings)

Index vectors therefore compare componentwise: p <= q means q is at least as
conservative as p on every axis.

The quantizer family (`family`: "kmeans", "uniform", see `mvc.quant.uniform`) is not an
axis -- neither family is more compressive than the other everywhere -- but a choice made
like the pruning metric's: a point names its *variant*, the prune metric for the k-means
family ("magnitude", as before families existed) or "uniform:<metric>", and the search runs
per variant and keeps the winner with the fewest measured bits (`mvc.search.driver`).
Error feedback (`feedback`: GPTQ over the layers' input Hessians, `mvc.quant.feedback`) is
chosen the same way: a quantizer with feedback is its family's name with "+feedback"
("kmeans+feedback:magnitude"), searched only when the commit knows Hessians.

When every point of the space is refused, the search does not give up at once: with
`refine` (on in the default space, `SearchSpace.default()`, which a search uses when given
none; a space built by hand is searched as given unless it sets it) it searches
`SearchSpace.refined()` before a commit falls back to lossless: finer levels (96 / 128
bins, 64 / 128 embedding bins), both quantizer families and error feedback where Hessians
are known.  A model whose quality the space's finest point cannot keep (a pretrained
encoder under a fidelity gate: docs/quality.md) then gets about 5x instead of 1.2x; a
commit the space serves never pays for it.

Expected compression (`SearchSpace.cost`) is a config-only cost model in bits per
quantized parameter, cheap enough to order trials before running them:

    bits(bins, prune, protect) = (1 - prune - protect) * log2(bins) + protect * 32

i.e. a quantized parameter costs its level index, a pruned one nothing (pruned
positions are stable across commits and collapse into runs of the delta coder), a
protected one its full 32-bit value.  It is strictly monotone along every axis (as
long as log2(bins) < 32), so it orders trials consistently with the cube's partial
order; embedding tensors are weighted by their share of the quantized parameters.
Ties are broken by the index vector, so every ordering is deterministic.
"""
from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, fields
from typing import Any

from mvc.errors import MvcError, UsageError
from mvc.quant import QuantConfig
from mvc.quant.importance import METRICS
from mvc.quant.uniform import DEFAULT_FAMILY, FAMILIES

#: A point: (variant -- the prune metric, prefixed by a family other than k-means --, index
#: per axis).
Point = tuple[str, tuple[int, ...]]


#: What a quantizer key adds to its family's name when it quantizes with error feedback.
FEEDBACK_TAG = "+feedback"


def quantizer(family: str, feedback: bool = False) -> str:
    """A quantizer key: the family, "+feedback" when its levels get error feedback."""
    return family + FEEDBACK_TAG if feedback else family


def split_quantizer(key: str) -> tuple[str, bool]:
    """(family, feedback) of a quantizer key."""
    return (key[:-len(FEEDBACK_TAG)], True) if key.endswith(FEEDBACK_TAG) else (key, False)


def quantizer_of(config: QuantConfig) -> str:
    """The quantizer key of a config (its family, with feedback or not)."""
    return quantizer(config.family, config.feedback)


def variant(family: str, metric: str) -> str:
    """A point's variant string: `metric` for plain k-means, "quantizer:metric" otherwise
    (`family` is a quantizer key: a family, "+feedback" when with error feedback)."""
    return metric if family == DEFAULT_FAMILY else f"{family}:{metric}"


def split_variant(v: str) -> tuple[str, str]:
    """(quantizer key -- the family, "+feedback" with error feedback --, prune metric) of a
    variant string."""
    family, sep, metric = v.rpartition(":")
    return (family, metric) if sep else (DEFAULT_FAMILY, v)

#: What `SearchSpace.refined()` adds beyond a space's finest bins / embedding bins.
FINER_BINS: tuple[int, ...] = (96, 128)
FINER_EMBEDDING_BINS: tuple[int, ...] = (64, 128)

#: Bits a protected parameter costs in the cost model (its float32 value).
PROTECTED_BITS = 32.0


class SearchError(MvcError):
    """Base of the config search's errors."""

    exit_code = 80


class SearchSpaceError(SearchError, UsageError):
    """An invalid search space (empty axis, out-of-range value, unknown key)."""

    exit_code = 82


def _axis(values: Any, what: str, kind: type) -> tuple:
    if isinstance(values, (str, bytes)) or not isinstance(values, Sequence) or not values:
        raise SearchSpaceError(f"search space axis {what!r} must be a non-empty sequence")
    out = []
    for v in values:
        if isinstance(v, bool) or not isinstance(v, (int, float) if kind is float else kind):
            raise SearchSpaceError(f"search space axis {what!r}: invalid value {v!r}")
        out.append(kind(v))
    if len(set(out)) != len(out):
        raise SearchSpaceError(f"search space axis {what!r} has duplicate values")
    return tuple(out)


@dataclass(frozen=True)
class SearchSpace:
    """The cube's axis values; the defaults are Inshrinkerator's Table 9 plus 64 bins.

    64 bins is one step finer than the paper's 32: a trained model whose loss is small
    can measure over a 0.5% epsilon even at 32 bins unpruned (bench_e2e's CNN at step 120:
    +0.71%), and without a finer point such a commit falls back to lossless (1.2x
    instead of about 5x).  The cost model decides between it and the 32-bin points
    (64 bins with half the weights pruned costs 3 bits, 32 bins unpruned 5).

    Values may be given in any order: `axes` sorts them most-compressive first.
    `alpha` and `sigma` are passed to every trial's `QuantConfig` unchanged.
    `family`: the quantizer families searched (default k-means only; "uniform" adds the
    uniform grid, `mvc.quant.uniform`).  `feedback`: with / without GPTQ error feedback
    (default without only; `(False, True)` searches both where the commit knows its layers'
    input Hessians, `mvc.quant.feedback`, and is the same as `(False,)` where it does not).
    `refine`: when every point is refused, search `refined()` before falling back to
    lossless (default False: the space as given; `SearchSpace.default()`, what a search
    uses when given no space, sets it).
    """

    bins: tuple[int, ...] = (4, 6, 8, 12, 16, 32, 64)
    embedding_bins: tuple[int, ...] = (16, 32)
    prune: tuple[float, ...] = (0.0, 0.1, 0.2, 0.3, 0.4, 0.5)
    prune_metric: tuple[str, ...] = ("magnitude", "sensitivity")
    protect: tuple[float, ...] = (0.0005, 0.005, 0.01)
    alpha: float = 0.01
    sigma: float = 0.2
    family: tuple[str, ...] = (DEFAULT_FAMILY,)
    feedback: tuple[bool, ...] = (False,)
    refine: bool = False

    def __post_init__(self) -> None:
        set_ = object.__setattr__
        if not isinstance(self.refine, bool):
            raise SearchSpaceError(f"search space 'refine' must be true or false, "
                                   f"got {self.refine!r}")
        fb = self.feedback
        if isinstance(fb, (str, bytes)) or not isinstance(fb, Sequence) or not fb \
                or not all(isinstance(v, bool) for v in fb) or len(set(fb)) != len(fb):
            raise SearchSpaceError(f"search space axis 'feedback' must be a non-empty sequence "
                                   f"of distinct booleans, got {fb!r}")
        set_(self, "feedback", tuple(v for v in (False, True) if v in fb))
        families = _axis(self.family, "family", str)
        bad_f = [f for f in families if f not in FAMILIES]
        if bad_f:
            raise SearchSpaceError(f"unknown quantizer family(ies) {bad_f}; known: {FAMILIES}")
        set_(self, "family", tuple(f for f in FAMILIES if f in families))
        set_(self, "bins", tuple(sorted(_axis(self.bins, "bins", int))))
        set_(self, "embedding_bins", tuple(sorted(_axis(self.embedding_bins, "embedding_bins", int))))
        set_(self, "prune", tuple(sorted(_axis(self.prune, "prune", float), reverse=True)))
        set_(self, "protect", tuple(sorted(_axis(self.protect, "protect", float))))
        metrics = _axis(self.prune_metric, "prune_metric", str)
        bad = [m for m in metrics if m not in METRICS]
        if bad:
            raise SearchSpaceError(f"unknown prune metric(s) {bad}; known: {METRICS}")
        set_(self, "prune_metric", tuple(m for m in METRICS if m in metrics))
        if not all(1 <= b <= 1 << 16 for b in self.bins + self.embedding_bins):
            raise SearchSpaceError("bins must be in [1, 65536]")
        if not all(0.0 <= p < 1.0 for p in self.prune) or not all(0.0 <= p < 1.0 for p in self.protect):
            raise SearchSpaceError("prune and protect fractions must be in [0, 1)")
        if max(self.prune) + max(self.protect) >= 1.0:
            raise SearchSpaceError("prune + protect must stay below 1")
        try:  # the extreme corners must be valid QuantConfigs
            QuantConfig(bins=self.bins[0], alpha=self.alpha, sigma=self.sigma)
        except MvcError as exc:
            raise SearchSpaceError(f"invalid alpha/sigma: {exc}") from exc

    @classmethod
    def default(cls) -> SearchSpace:
        """The space a search uses when given none: these defaults, refined before a
        commit falls back to lossless."""
        return cls(refine=True)

    # ------------------------------------------------------------------ refinement
    def refined(self) -> SearchSpace:
        """The space searched when every point of this one is refused: these axes plus
        `FINER_BINS` / `FINER_EMBEDDING_BINS` beyond their finest values, every quantizer
        family, error feedback searched too (where Hessians are known), and no further
        refinement.  Its axes hold every value of this space's, so a point of this space
        maps onto it (`remap`)."""
        return dataclasses.replace(
            self, bins=self.bins + tuple(b for b in FINER_BINS if b > self.bins[-1]),
            embedding_bins=self.embedding_bins + tuple(
                b for b in FINER_EMBEDDING_BINS if b > self.embedding_bins[-1]),
            family=FAMILIES, feedback=(False, True), refine=False)

    def beyond(self, config: QuantConfig) -> bool:
        """Whether `config` lies outside this space where `refined()` reaches: finer bins or
        embedding bins, a family or error feedback this space does not search (a parent
        chosen by a refined search, whose neighbourhood is in the finer cube)."""
        emb = config.embedding_bins
        return (config.bins > self.bins[-1]
                or (emb is not None and emb > self.embedding_bins[-1])
                or config.family not in self.family
                or (config.feedback and True not in self.feedback))

    def remap(self, point: Point, other: SearchSpace, embeddings: bool) -> Point:
        """`point` of `other` as a point of this space (whose axes hold `other`'s values)."""
        v, idx = point
        mine, theirs = self.axes(embeddings), other.axes(embeddings)
        return (v, tuple(a.index(b[i]) for a, b, i in zip(mine, theirs, idx)))

    # ------------------------------------------------------------------ geometry
    def axes(self, embeddings: bool) -> tuple[tuple, ...]:
        """Axis values, most compressive first: bins, prune, protect[, embedding_bins]."""
        base = (self.bins, self.prune, self.protect)
        return base + ((self.embedding_bins,) if embeddings else ())

    def shape(self, embeddings: bool) -> tuple[int, ...]:
        return tuple(len(a) for a in self.axes(embeddings))

    def variants(self, metrics: Sequence[str]) -> list[str]:
        """Every (family, feedback, metric) variant searched, k-means first, without error
        feedback before with, for the given metrics."""
        return [variant(quantizer(f, fb), m) for fb in self.feedback for f in self.family
                for m in metrics]

    def config(self, point: Point, embeddings: bool) -> QuantConfig:
        """The QuantConfig of a point; with prune 0 the metric is normalized to magnitude."""
        v, idx = point
        key, metric = split_variant(v)
        family, feedback = split_quantizer(key)
        ax = self.axes(embeddings)
        bins, prune, protect = ax[0][idx[0]], ax[1][idx[1]], ax[2][idx[2]]
        return QuantConfig(bins=bins, prune=prune,
                           prune_metric=metric if prune > 0 else "magnitude",
                           protect=protect,
                           embedding_bins=ax[3][idx[3]] if embeddings else None,
                           alpha=self.alpha, sigma=self.sigma, family=family,
                           feedback=feedback)

    def canonical(self, point: Point, embeddings: bool) -> Point:
        """The point with the metric normalized (prune 0 makes the metric irrelevant)."""
        v, idx = point
        if self.axes(embeddings)[1][idx[1]] == 0:
            return (variant(split_variant(v)[0], "magnitude"), idx)
        return point

    def cost(self, idx: Sequence[int], embeddings: bool, embedding_share: float = 0.0) -> float:
        """Expected bits per quantized parameter of a point (see the module docstring)."""
        ax = self.axes(embeddings)
        prune, protect = ax[1][idx[1]], ax[2][idx[2]]

        def bits(b: int) -> float:
            return (1.0 - prune - protect) * math.log2(max(b, 1)) + protect * PROTECTED_BITS

        if not embeddings:
            return bits(ax[0][idx[0]])
        return (1.0 - embedding_share) * bits(ax[0][idx[0]]) + embedding_share * bits(ax[3][idx[3]])

    def snap(self, config: QuantConfig, embeddings: bool) -> tuple[int, ...]:
        """Index of `config` in the cube, rounded towards the conservative side on each axis
        (a previous config off the grid never makes the neighbourhood more aggressive)."""
        ax = self.axes(embeddings)
        vals: list[float] = [config.bins, config.prune, config.protect]
        if embeddings:
            vals.append(config.embedding_bins if config.embedding_bins is not None else config.bins)
        out = []
        for a, (values, v) in enumerate(zip(ax, vals)):
            if a == 1:  # prune: conservative = smaller
                ok = [i for i, x in enumerate(values) if x <= v + 1e-12]
            else:       # bins / protect: conservative = larger
                ok = [i for i, x in enumerate(values) if x >= v - 1e-12]
            out.append(ok[0] if ok else len(values) - 1)
        return tuple(out)

    # ------------------------------------------------------------------ JSON
    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict (tuples become lists); `from_dict(to_dict())` is equal."""
        return {k: list(v) if isinstance(v, tuple) else v for k, v in asdict(self).items()}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> SearchSpace:
        """Rebuild from `to_dict()` output (missing keys take the defaults)."""
        if not isinstance(data, Mapping):
            raise SearchSpaceError(f"a search space must be a mapping, got {type(data).__name__}")
        names = {f.name for f in fields(cls)}
        unknown = sorted(set(data) - names)
        if unknown:
            raise SearchSpaceError(f"unknown search space key(s): {', '.join(unknown)}")
        kw: dict[str, Any] = {k: tuple(v) if isinstance(v, list) else v for k, v in data.items()}
        return cls(**kw)

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> SearchSpace:
        try:
            data = json.loads(text)
        except ValueError as exc:
            raise SearchSpaceError(f"search space is not valid JSON: {exc}") from exc
        return cls.from_dict(data)


def short(config: QuantConfig | None) -> dict[str, Any] | None:
    """A compact JSON form of a trial's config for logs."""
    if config is None:
        return None
    out: dict[str, Any] = {"bins": config.bins, "prune": config.prune,
                           "metric": config.prune_metric, "protect": config.protect}
    if config.embedding_bins is not None:
        out["embedding_bins"] = config.embedding_bins
    if config.family != DEFAULT_FAMILY:
        out["family"] = config.family
    if config.feedback:
        out["feedback"] = True
    return out
