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
import zlib
from dataclasses import asdict, dataclass, field
from typing import Any

from mvc.errors import DataError

COMMIT_HEADER = b"mvc-commit 1\n"
SNAPSHOT_HEADER = b"mvc-snapshot 2\n"    # + zlib(canonical JSON)
SNAPSHOT_HEADER_V1 = b"mvc-snapshot 1\n"  # + canonical JSON; read, no longer written
# A snapshot's JSON is ~400 bytes per tensor: anything inflating past this is hostile.
_MAX_SNAPSHOT_JSON = 1 << 30


class MalformedObjectError(DataError):
    """An object's bytes verify against its id but are not a valid mvc object."""

    exit_code = 14


def _canonical(obj: dict[str, Any]) -> bytes:
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), allow_nan=False).encode()


def _parse(data: bytes, header: bytes, oid: str, kind: str, inflate: bool = False) -> dict[str, Any]:
    """The JSON object after `header` (deflated when `inflate`)."""
    if not data.startswith(header):
        raise MalformedObjectError(f"object {oid} is not a {kind}")
    body = memoryview(data)[len(header):]
    if inflate:
        body = _inflate(body, oid)
    try:
        obj = json.loads(bytes(body) if isinstance(body, memoryview) else body)
    except ValueError as exc:
        raise MalformedObjectError(f"{kind} {oid} is not valid JSON: {exc}") from None
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
        try:
            tensors = [TensorRecord(**t) for t in obj["tensors"]]
            return cls(tensors=tensors, skeleton=obj["skeleton"])
        except (KeyError, TypeError) as exc:
            raise MalformedObjectError(f"snapshot {oid} is malformed: {exc}") from None

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
        try:
            c = cls(**obj)
        except TypeError as exc:
            raise MalformedObjectError(f"commit {oid} is malformed: {exc}") from None
        c.id = oid
        return c

    @property
    def summary(self) -> str:
        return self.message.splitlines()[0] if self.message else ""


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
