"""Commit and snapshot objects: their fields and their canonical byte encoding.

Objects are stored as a one-line type header followed by canonical JSON
(sorted keys, no whitespace), so equal content always hashes to the same id:
an unchanged snapshot committed twice is stored once.  Snapshots (version 2)
deflate their JSON: a record per tensor (hex ids, section lengths, parent
names) is ~400 bytes that compress ~6-10x, and with well-compressed tensors
these records were a third of what a commit of a small model stored.
Version-1 snapshots (plain JSON) are still read.  Payload chunks are stored
as bare bytes and are only ever reached through a snapshot.
"""
from __future__ import annotations

import json
import math
import re
import zlib
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field, fields
from typing import Any, NoReturn

from mvc.errors import DataError, UsageError
from mvc.state.skeleton import MAX_SKELETON_DEPTH, skeleton_depth
from mvc.store.base import InvalidIdError, check_oid

COMMIT_HEADER = b"mvc-commit 1\n"
SNAPSHOT_HEADER = b"mvc-snapshot 2\n"    # + zlib(canonical JSON)
SNAPSHOT_HEADER_V1 = b"mvc-snapshot 1\n"  # + canonical JSON; read, no longer written
# A snapshot's JSON is ~400 bytes per tensor: anything inflating past this is hostile.
_MAX_SNAPSHOT_JSON = 1 << 30
#: Largest element count a record may claim (2^48: beyond any real tensor, and small enough
#: that shape products and byte counts stay exact in every integer type that meets them).
MAX_NUMEL = 1 << 48
#: Largest byte count or depth a record may claim.
_MAX_COUNT = 1 << 62


class MalformedObjectError(DataError):
    """An object's bytes verify against its id but are not a valid mvc object."""

    exit_code = 14


class UnstorableTensorError(UsageError):
    """A tensor of the state to commit lies outside what a snapshot record may claim (the
    reader's limits, `shape_problem`): refused before anything is stored."""

    exit_code = 173


def shape_problem(shape: Sequence[object]) -> str | None:
    """Why a tensor record may not claim `shape`, or None when it may.

    The one rule for both directions: the reader refuses a stored record that breaks it
    (`MalformedObjectError`) and the writer refuses to store a tensor that breaks it
    (`UnstorableTensorError`), so no commit is published that its own reader rejects.
    Every dimension is an integer in [0, MAX_NUMEL] -- a tensor with a zero dimension holds
    no data, yet its other dimensions still reach every shape product -- and the product is
    at most MAX_NUMEL.
    """
    numel = 1
    for d in shape:
        if type(d) is not int or not 0 <= d <= MAX_NUMEL:
            return f"shape dimension {_short(d)} is not an integer in [0, 2^48 = {MAX_NUMEL}]"
        # capped, so a long hostile shape cannot build a huge integer
        numel = min(numel * d, MAX_NUMEL + 1)
    if numel > MAX_NUMEL:
        return f"shape {_short(list(shape))} claims more than 2^48 = {MAX_NUMEL} elements"
    return None


def check_tensor_shape(name: str, shape: Sequence[int]) -> None:
    """`UnstorableTensorError` naming tensor `name` when a record could not claim `shape`:
    what the writer asks of every tensor before it stores any."""
    problem = shape_problem(list(shape))
    if problem is not None:
        raise UnstorableTensorError(
            f"tensor {_short(name)} cannot be stored: {problem} (the limit every mvc snapshot "
            "reader enforces); nothing was stored")


def _canonical(obj: dict[str, Any]) -> bytes:
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), allow_nan=False).encode()


def _parse(data: bytes, header: bytes, oid: str, kind: str, inflate: bool = False) -> dict[str, Any]:
    """The JSON object after `header` (deflated when `inflate`)."""
    if not data.startswith(header):
        raise MalformedObjectError(f"object {oid} is not a {kind}")
    view = memoryview(data)[len(header):]
    body = _inflate(view, oid) if inflate else bytes(view)
    try:
        obj = json.loads(body)
    except ValueError as exc:
        raise MalformedObjectError(f"{kind} {oid} is not valid JSON: {exc}") from None
    except RecursionError:  # the C parser's own guard: thousands of nested brackets
        raise MalformedObjectError(f"{kind} {oid} is nested too deeply to be an mvc object") from None
    if not isinstance(obj, dict):
        raise MalformedObjectError(f"{kind} {oid} is not a JSON object")
    return obj


@dataclass
class TensorRecord:
    """How one tensor of a snapshot is stored."""

    name: str
    dtype: str
    shape: list[int]
    codec: str
    chunks: list[str]
    stored_bytes: int
    raw_bytes: int
    meta: dict[str, Any] = field(default_factory=dict)
    #: Delta-chain depth of this tensor (0 = self-contained).
    depth: int = 0


@dataclass
class Snapshot:
    """Every tensor of a checkpoint plus the skeleton that rebuilds its structure."""

    tensors: list[TensorRecord]
    skeleton: dict[str, Any]

    def encode(self) -> bytes:
        body = _canonical({"tensors": [asdict(t) for t in self.tensors], "skeleton": self.skeleton})
        return SNAPSHOT_HEADER + zlib.compress(body, 9)

    @classmethod
    def decode(cls, data: bytes, oid: str) -> "Snapshot":
        v1 = data.startswith(SNAPSHOT_HEADER_V1)
        obj = _parse(data, SNAPSHOT_HEADER_V1 if v1 else SNAPSHOT_HEADER, oid, "snapshot",
                     inflate=not v1)
        check = _Checker("snapshot", oid)
        check.keys(obj, {"tensors", "skeleton"}, "")
        tensors_raw = check.typed(obj["tensors"], list, "tensors")
        skeleton = check.typed(obj["skeleton"], dict, "skeleton")
        depth = skeleton_depth(skeleton.get("root"), MAX_SKELETON_DEPTH)
        if depth > MAX_SKELETON_DEPTH:
            check.fail(f"skeleton is nested deeper than {MAX_SKELETON_DEPTH} levels")
        tensors = [_record(check, t, i) for i, t in enumerate(tensors_raw)]
        names = [t.name for t in tensors]
        if len(set(names)) != len(names):
            check.fail("two tensor records share a name")
        return cls(tensors=tensors, skeleton=skeleton)

    @property
    def raw_bytes(self) -> int:
        return sum(t.raw_bytes for t in self.tensors)

    def chunk_ids(self) -> list[str]:
        return [c for t in self.tensors for c in t.chunks]


@dataclass
class Commit:
    """A point in history: a snapshot plus who, when, why and how well it was stored."""

    parents: list[str]
    snapshot: str
    message: str
    time: str
    author: str
    step: int | None = None
    metrics: dict[str, float] = field(default_factory=dict)
    provenance: dict[str, Any] | None = None
    #: The quantization configuration used (None for a lossless commit).
    quant: dict[str, Any] | None = None
    #: The metric that vouched for a lossy commit: name, baseline, measured value, bound.
    quality: dict[str, Any] | None = None
    #: Longest delta chain any tensor of this commit needs to walk.
    chain_depth: int = 0
    extra: dict[str, Any] = field(default_factory=dict)
    #: Filled in when read from the store; not part of the stored bytes.
    id: str = field(default="", compare=False)

    def encode(self) -> bytes:
        d = asdict(self)
        d.pop("id")
        return COMMIT_HEADER + _canonical(d)

    @classmethod
    def decode(cls, data: bytes, oid: str) -> "Commit":
        obj = _parse(data, COMMIT_HEADER, oid, "commit")
        check = _Checker("commit", oid)
        names = {f.name for f in fields(cls)} - {"id"}
        check.keys(obj, {"parents", "snapshot", "message", "time", "author"}, "", allowed=names)
        for i, p in enumerate(check.typed(obj["parents"], list, "parents")):
            check.object_id(p, f"parents[{i}]")
        check.object_id(obj["snapshot"], "snapshot")
        for key in ("message", "time", "author"):
            check.typed(obj[key], str, key)
        if obj.get("step") is not None:
            check.integer(obj["step"], "step", lo=-_MAX_COUNT)  # check_step's range
        for k, v in check.typed(obj.get("metrics", {}), dict, "metrics").items():
            check.number(v, f"metrics[{k!r}]")
        for key in ("provenance", "quant", "quality"):
            if obj.get(key) is not None:
                check.typed(obj[key], dict, key)
        check.integer(obj.get("chain_depth", 0), "chain_depth")
        check.typed(obj.get("extra", {}), dict, "extra")
        c = cls(**obj)
        c.id = oid
        return c

    @property
    def summary(self) -> str:
        return self.message.splitlines()[0] if self.message else ""


def check_metrics(metrics: Mapping[str, float] | None) -> dict[str, float]:
    """A commit's metrics as finite floats by name (`UsageError` naming the bad one)."""
    out: dict[str, float] = {}
    for k, v in (metrics or {}).items():
        try:
            f = float(v)
        except (TypeError, ValueError):
            raise UsageError(f"metric {k!r} must be a number, got {v!r}") from None
        if f != f or f in (float("inf"), float("-inf")):
            raise UsageError(f"metric {k!r} must be finite, got {v!r}")
        out[str(k)] = f
    return out


def check_step(step: object) -> int | None:
    """A commit's step as given: None, or an int in [-2^62, 2^62] -- what `Commit.decode`
    accepts (`UsageError` otherwise)."""
    if step is None:
        return None
    if type(step) is not int or not -_MAX_COUNT <= step <= _MAX_COUNT:
        raise UsageError(f"step must be an int in [-2^62, 2^62], got {_short(step)}")
    return step


class UnpublishableObjectError(UsageError):
    """A commit or snapshot about to be stored would not pass the reader's own checks
    (`checked_encoding`): the commit is refused, nothing is published."""

    exit_code = 174


def checked_encoding(obj: Snapshot | Commit) -> bytes:
    """`obj.encode()`, read back by the very parser the reader uses (`decode`) before anyone
    stores it: `UnpublishableObjectError` when the reader would refuse it (a limit, a field
    out of range, JSON past what the reader inflates, a NaN or inf JSON cannot hold)."""
    kind = "snapshot" if isinstance(obj, Snapshot) else "commit"
    try:
        data = obj.encode()
        type(obj).decode(data, "(not stored)")
    except (MalformedObjectError, ValueError) as exc:  # ValueError: NaN / inf in the JSON
        raise UnpublishableObjectError(f"{kind} refused, nothing was published: {exc}") from None
    return data


#: An object id as canonical JSON writes it: what `ids_named` looks for.
_QUOTED_ID = re.compile(rb'"([0-9a-f]{32})"')


def ids_named(data: bytes) -> set[str] | None:
    """Every object id the bytes of a commit or snapshot name, read leniently -- whether or
    not the object decodes -- or None when its text cannot be read (a snapshot that does not
    inflate).  A chunk names none.  A superset of what the object refers to: what gc keeps
    for an object this version cannot decode, so that nothing it may need is deleted."""
    if object_kind(data) == "chunk":
        return set()
    text = data
    if data.startswith(SNAPSHOT_HEADER):
        try:
            text = _inflate(memoryview(data)[len(SNAPSHOT_HEADER):], "?")
        except MalformedObjectError:
            return None
    return {m.decode() for m in _QUOTED_ID.findall(text)}


class _Checker:
    """Field-by-field validation of a decoded object: every failure is a
    `MalformedObjectError` naming the object and the field."""

    def __init__(self, kind: str, oid: str) -> None:
        self.kind, self.oid = kind, oid

    def fail(self, what: str) -> NoReturn:
        raise MalformedObjectError(f"{self.kind} {self.oid} is malformed: {what}")

    def keys(self, obj: dict, required: set[str], where: str, allowed: set[str] | None = None) -> None:
        missing = required - obj.keys()
        unknown = obj.keys() - (allowed if allowed is not None else required)
        if missing:
            self.fail(f"{where or 'object'} lacks {sorted(missing)}")
        if unknown:
            self.fail(f"{where or 'object'} has unknown fields {sorted(map(str, unknown))[:5]}")

    def typed(self, value: Any, kind: type, where: str) -> Any:
        if not isinstance(value, kind):
            self.fail(f"{where} is a {type(value).__name__}, not a {kind.__name__}")
        return value

    def integer(self, value: Any, where: str, lo: int = 0, hi: int = _MAX_COUNT) -> int:
        if type(value) is not int or not lo <= value <= hi:
            self.fail(f"{where} = {_short(value)} is not an integer in [{lo}, {hi}]")
        return value

    def number(self, value: Any, where: str) -> float:
        if type(value) not in (int, float) or not math.isfinite(value):
            self.fail(f"{where} = {_short(value)} is not a finite number")
        return value

    def object_id(self, value: Any, where: str) -> str:
        try:
            return check_oid(value)
        except InvalidIdError:
            self.fail(f"{where} = {_short(value)} is not an object id")


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


_RECORD_FIELDS = {"name", "dtype", "shape", "codec", "chunks", "stored_bytes", "raw_bytes", "meta", "depth"}


def _record(check: _Checker, t: Any, i: int) -> TensorRecord:
    """One tensor record, every field checked for type and range before anything trusts it."""
    where = f"tensors[{i}]"
    check.typed(t, dict, where)
    check.keys(t, _RECORD_FIELDS - {"meta", "depth"}, where, allowed=_RECORD_FIELDS)
    name = check.typed(t["name"], str, f"{where}.name")
    where = f"tensor {_short(name)}"
    check.typed(t["dtype"], str, f"{where}: dtype")
    check.typed(t["codec"], str, f"{where}: codec")
    shape = check.typed(t["shape"], list, f"{where}: shape")
    problem = shape_problem(shape)
    if problem is not None:
        check.fail(f"{where}: {problem}")
    for c in check.typed(t["chunks"], list, f"{where}: chunks"):
        check.object_id(c, f"{where}: chunk")
    check.integer(t["stored_bytes"], f"{where}: stored_bytes")
    check.integer(t["raw_bytes"], f"{where}: raw_bytes")
    depth = check.integer(t.get("depth", 0), f"{where}: depth")
    meta = check.typed(t.get("meta", {}), dict, f"{where}: meta")
    _check_lossy_meta(check, meta, where)
    return TensorRecord(name=name, dtype=t["dtype"], shape=shape, codec=t["codec"],
                        chunks=t["chunks"], stored_bytes=t["stored_bytes"],
                        raw_bytes=t["raw_bytes"], meta=meta, depth=depth)


#: `mvc.quant.moment_bound.SQRT_FORMS`, spelled here so reading records needs no torch (a test
#: keeps the two equal).
MOMENT_SQRT_FORMS = ("ieee",)
#: `mvc.quant.optimizer.DOMAINS` (a quantized tensor's levels: the second moments' log domain,
#: everything else linear), spelled here for the same reason (a test keeps the two equal).
MOMENT_DOMAINS = ("linear", "log")


def _check_lossy_meta(check: _Checker, meta: dict, where: str) -> None:
    """The meta keys the repository itself reads (delta parents, gc references, moments);
    codec-specific keys are checked by the codec that decodes the payload."""
    if "refs" in meta:
        for r in check.typed(meta["refs"], list, f"{where}: meta.refs"):
            check.object_id(r, f"{where}: meta.refs")
    if "parent" in meta:
        p = check.typed(meta["parent"], dict, f"{where}: meta.parent")
        check.object_id(p.get("snapshot"), f"{where}: meta.parent.snapshot")
        check.typed(p.get("name"), str, f"{where}: meta.parent.name")
    if "chain_cost" in meta and check.number(meta["chain_cost"], f"{where}: meta.chain_cost") < 0:
        check.fail(f"{where}: meta.chain_cost is negative")
    if "domain" in meta and check.typed(meta["domain"], str, f"{where}: meta.domain") \
            not in MOMENT_DOMAINS:
        check.fail(f"{where}: meta.domain {meta['domain']!r} is not a known domain "
                   f"{MOMENT_DOMAINS} (written by a newer mvc?)")
    if "moment" in meta:
        m = check.typed(meta["moment"], dict, f"{where}: meta.moment")
        check.typed(m.get("partner"), str, f"{where}: meta.moment.partner")
        if check.number(m.get("ratio_bound"), f"{where}: meta.moment.ratio_bound") < 0:
            check.fail(f"{where}: meta.moment.ratio_bound is negative")
        if "sqrt" in m and m["sqrt"] not in MOMENT_SQRT_FORMS:
            check.fail(f"{where}: meta.moment.sqrt {m['sqrt']!r} is not a known bound form "
                       f"{MOMENT_SQRT_FORMS} (written by a newer mvc?)")


def _inflate(body: memoryview, oid: str) -> bytes:
    """A version-2 snapshot's JSON, bounded so a hostile stream cannot exhaust memory."""
    d = zlib.decompressobj()
    try:
        out = d.decompress(body, _MAX_SNAPSHOT_JSON)
    except zlib.error as exc:
        raise MalformedObjectError(f"snapshot {oid} does not inflate: {exc}") from None
    if d.unconsumed_tail or not d.eof:
        raise MalformedObjectError(f"snapshot {oid} is truncated or inflates past 1 GiB")
    return out


def object_kind(data: bytes) -> str:
    """'commit', 'snapshot' or 'chunk' from an object's leading bytes."""
    if data.startswith(COMMIT_HEADER):
        return "commit"
    if data.startswith(SNAPSHOT_HEADER) or data.startswith(SNAPSHOT_HEADER_V1):
        return "snapshot"
    return "chunk"
