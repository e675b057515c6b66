"""The quality record of a commit: which gate vouched for its quantization, and how.

A commit stores it as a JSON object (`Commit.quality`); its id hashes that JSON, so the
JSON form is fixed: `QualityRecord.to_json()` returns exactly the dict the writers have
always written, and `from_json(d).to_json() == d` for every record ever written (old
ones without `gate`, fixed-config ones, sharded ones, ...) and for any JSON object at
all: a key this class does not know, or a known key holding a value of another type,
is kept as it is in `extra`.

Absent and null are different JSON: a search record writes ``"value": null`` when no
configuration passed, where a fixed-config record leaves `bits_per_param` out.  A field
is written when it is not None, or as null when its name is in `nulls`.

Readers go through the typed fields and the helpers (`gate_name`, `lossless_fallback`,
`closest_config`, ...) rather than through string keys.
"""
from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from mvc.errors import InternalError

#: What the search does not decide for: the record of a commit with nothing to quantize.
NOTHING_TO_QUANTIZE = "nothing-to-quantize"


def _num(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _str(v: Any) -> bool:
    return isinstance(v, str)


def _bool(v: Any) -> bool:
    return isinstance(v, bool)


def _dict(v: Any) -> bool:
    return isinstance(v, dict)


def _strs(v: Any) -> bool:
    return isinstance(v, list) and all(isinstance(x, str) for x in v)


def _dicts(v: Any) -> bool:
    return isinstance(v, list) and all(isinstance(x, dict) for x in v)


def _nums(v: Any) -> bool:
    return isinstance(v, dict) and all(isinstance(k, str) and (x is None or _num(x))
                                       for k, x in v.items())


def _f(check: Callable[[Any], bool]) -> Any:
    """A JSON field of the record: None by default, `check` says which values it holds."""
    return field(default=None, metadata={"json": check})


@dataclass(frozen=True)
class QualityRecord:
    """A commit's quality record (see the module docstring for the JSON rules).

    Every field is optional (None: not in this record).  Integral JSON numbers stay ints
    (a float field holds what was written), so the JSON, and the commit id, do not move.
    """

    # what was measured, against what
    metric: str | None = _f(_str)             # e.g. "quality:eval_loss", "proxy:..."
    gate: str | None = _f(_str)               # proxy, metric, per-example-ucb, fidelity, none
    baseline: float | None = _f(_num)         # the exact state's measurement
    value: float | None = _f(_num)            # the stored quantization's measurement
    degradation: float | None = _f(_num)      # in the gate's units
    epsilon: float | None = _f(_num)          # the gate's bound
    bound: float | None = _f(_num)            # fixed-config and sharded records
    # how the search went
    mode: str | None = _f(_str)               # exhaustive, neighbourhood, fixed, ...
    evaluations: int | None = _f(_int)
    bits_per_param: float | None = _f(_num)
    trials: list[dict[str, Any]] | None = _f(_dicts)
    closest: dict[str, Any] | None = _f(_dict)  # the best refused trial (lossless fallback)
    stored: str | None = _f(_str)             # "lossless: no feasible configuration"
    suspicious_trials: int | None = _f(_int)
    refined: bool | None = _f(_bool)          # went on in `SearchSpace.refined()`
    ranks: int | None = _f(_int)              # a parallel search's group size
    rounds: int | None = _f(_int)             # ... and its rounds of trials
    sharded: bool | None = _f(_bool)          # decided by a sharded (DCP) save
    quantized_tensors: int | None = _f(_int)
    # the guard rail
    tensor_cap: float | None = _f(_num)
    max_distortion: float | None = _f(_num)
    worst_tensor: str | None = _f(_str)
    # a fixed config's measurement (`mvc.search.plan`)
    within_cap: bool | None = _f(_bool)
    within_bound: bool | None = _f(_bool)
    rel_l2_weights: float | None = _f(_num)
    outside: list[str] | None = _f(_strs)     # what was outside its bound, stored anyway
    # the per-example gate
    confidence: float | None = _f(_num)
    examples: int | None = _f(_int)
    ucb: float | None = _f(_num)
    suspicious: bool | None = _f(_bool)
    # the scalar gate's mirror check (issue 29)
    mirror_check: bool | None = _f(_bool)
    mirror_degradation: float | None = _f(_num)  # the winner's mirrored candidate
    # the fidelity gate
    fidelity: float | None = _f(_num)
    fidelity_ucb: float | None = _f(_num)
    fidelity_metric: str | None = _f(_str)
    threshold: float | None = _f(_num)
    units: str | None = _f(_str)
    # compressed optimizer moments
    moment_cap: dict[str, float | None] | None = _f(_nums)
    moment_distortion: dict[str, float | None] | None = _f(_nums)
    moments_exact: list[str] | None = _f(_strs)
    moments_zeroed: list[str] | None = _f(_strs)
    #: Keys this class does not know, and known keys whose value is not of the field's type.
    extra: dict[str, Any] = field(default_factory=dict)
    #: Fields written as JSON null when None (the others are left out when None).
    nulls: frozenset[str] = frozenset()

    def __post_init__(self) -> None:
        for k in self.extra:
            if k in _CHECKS and (getattr(self, k) is not None or k in self.nulls):
                raise InternalError(f"quality record field {k!r} set twice (field and extra)")
        unknown = self.nulls - _CHECKS.keys()
        if unknown:
            raise InternalError(f"not quality record fields: {sorted(unknown)}")

    # ------------------------------------------------------------------ JSON
    def to_json(self) -> dict[str, Any]:
        """The JSON object a commit stores (nested values are shared, not copied)."""
        out: dict[str, Any] = {}
        for name in _CHECKS:
            v = getattr(self, name)
            if v is not None or name in self.nulls:
                out[name] = v
        out.update(self.extra)
        return out

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> QualityRecord:
        """The record a commit stored, whatever version wrote it (see the module docstring)."""
        fields: dict[str, Any] = {}
        extra: dict[str, Any] = {}
        nulls: set[str] = set()
        for k, v in d.items():
            check = _CHECKS.get(k)
            if check is None:
                extra[k] = v
            elif v is None:
                nulls.add(k)
            elif check(v):
                fields[k] = v
            else:
                extra[k] = v
        return cls(**fields, extra=extra, nulls=frozenset(nulls))

    def merged(self, fields: Mapping[str, Any]) -> QualityRecord:
        """This record with JSON `fields` set over it, read as `from_json` reads them (a
        None value is written as null): how a gate's own fields join the record."""
        return QualityRecord.from_json({**self.to_json(), **fields})

    def updated(self, **fields: Any) -> QualityRecord:
        """This record with typed `fields` replaced (None: written as null)."""
        nulls = self.nulls | {k for k, v in fields.items() if v is None}
        extra = {k: v for k, v in self.extra.items() if k not in fields}
        return dataclasses.replace(self, **fields, extra=extra, nulls=nulls)

    # ------------------------------------------------------------------ readers
    @property
    def gate_name(self) -> str:
        """The gate that judged the record; records written before the `gate` field
        (issue 15) are inferred from their metric."""
        if self.gate:
            return self.gate
        if self.metric == "rel_l2_weights":
            return "none"  # commit.mode = fixed: measured, never checked against a bound
        return "proxy" if (self.metric or "").startswith("proxy") else "metric"

    @property
    def lossless_fallback(self) -> bool:
        """The search found no configuration within its bound: the commit was stored
        losslessly (not: there was nothing to quantize)."""
        return (self.stored is not None and self.stored.startswith("lossless")
                and self.mode != NOTHING_TO_QUANTIZE)

    @property
    def closest_config(self) -> dict[str, Any]:
        """The short config of the trial that came closest (a lossless fallback's), or {}."""
        return (self.closest or {}).get("config") or {}

    @property
    def closest_degradation(self) -> float | None:
        """The degradation the closest trial measured, None when it measured none."""
        deg = (self.closest or {}).get("degradation")
        return deg if isinstance(deg, (int, float)) else None

    @property
    def closest_refused(self) -> str | None:
        """Why the tensor cap refused the closest trial, if it did."""
        return (self.closest or {}).get("refused") or None


#: field name -> which JSON values it holds, in the order `to_json` writes them.
_CHECKS: dict[str, Callable[[Any], bool]] = {
    f.name: f.metadata["json"] for f in dataclasses.fields(QualityRecord) if "json" in f.metadata}
