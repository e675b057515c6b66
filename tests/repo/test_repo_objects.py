"""Commit and snapshot object encodings: canonical, compact, and strict on hostile bytes."""
from __future__ import annotations

import zlib

import pytest

from mvc.repo.objects import (SNAPSHOT_HEADER, SNAPSHOT_HEADER_V1, MalformedObjectError, Snapshot,
                              TensorRecord, _canonical, object_kind)


def _snapshot(n: int = 50) -> Snapshot:
    recs = [TensorRecord(name=f"model/layer{i}.weight", dtype="float32", shape=[64, 64],
                         codec="qdelta/1", chunks=[f"{i:032x}"], stored_bytes=100, raw_bytes=16384,
                         meta={"bins": 16, "mode": "pe", "parent": {"name": f"model/layer{i}.weight",
                                                                   "snapshot": "ab" * 16},
                               "sections": [64, 10, 0, 3], "xxh3": f"{i:016x}"}, depth=3)
            for i in range(n)]
    return Snapshot(tensors=recs, skeleton={"type": "dict", "items": [["model", {"ref": 0}]]})


def test_snapshots_are_deflated_canonical_json():
    snap = _snapshot()
    data = snap.encode()
    plain = _canonical({"tensors": [r.__dict__ for r in snap.tensors], "skeleton": snap.skeleton})
    assert data.startswith(SNAPSHOT_HEADER) and object_kind(data) == "snapshot"
    assert len(data) * 4 < len(plain)
    assert snap.encode() == data  # same content, same bytes, same id
    back = Snapshot.decode(data, "x")
    assert back == snap


def test_version_1_snapshots_are_still_read():
    snap = _snapshot(3)
    v1 = SNAPSHOT_HEADER_V1 + _canonical({"tensors": [r.__dict__ for r in snap.tensors],
                                          "skeleton": snap.skeleton})
    assert object_kind(v1) == "snapshot"
    assert Snapshot.decode(v1, "old") == snap


@pytest.mark.parametrize("mangle", [
    lambda d: d[:-5],                                     # truncated stream
    lambda d: d[:len(SNAPSHOT_HEADER) + 3] + b"\xff" * 20,  # not deflate
    lambda d: SNAPSHOT_HEADER + zlib.compress(b"[1, 2]"),   # JSON but not an object
    lambda d: SNAPSHOT_HEADER + zlib.compress(b"{\"tensors\": 3}"),
])
def test_corrupt_snapshots_are_malformed_objects(mangle):
    with pytest.raises(MalformedObjectError):
        Snapshot.decode(mangle(_snapshot(5).encode()), "bad")


def test_a_snapshot_that_inflates_without_bound_is_refused(monkeypatch):
    import mvc.repo.objects as objects

    monkeypatch.setattr(objects, "_MAX_SNAPSHOT_JSON", 1000)
    with pytest.raises(MalformedObjectError, match="inflates past"):
        Snapshot.decode(SNAPSHOT_HEADER + zlib.compress(b" " * 5000), "bomb")
