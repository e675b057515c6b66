"""Hostile objects and garbled metadata: typed data errors naming the object, no allocation
beyond what is actually stored, never an internal error (exit 70), and fsck reports them.

Hostile snapshots and commits here carry valid content ids (an attacker or a buggy writer
recomputes them), so only decode-time validation stands between them and the readers."""
from __future__ import annotations

import json
import time
import tracemalloc
import zlib

import pytest
import torch
from cli_helpers import run

from mvc.errors import DataError, InternalError, MvcError
from mvc.state import MAX_SKELETON_DEPTH, SkeletonTooDeepError, flatten, unflatten
from mvc.repo.objects import COMMIT_HEADER, SNAPSHOT_HEADER, MalformedObjectError
from mvc.repo.repository import Repo
from mvc.repo.tensors import PayloadSizeError
from mvc.store import RefUpdate


@pytest.fixture
def base(tmp_path):
    repo = Repo.init(tmp_path)
    repo.config.set("commit.mode", "lossless")
    cid = repo.commit({"w": torch.randn(64, 8), "step": 3, "nested": {"a": [1, 2]}}, "one")
    yield repo, cid
    repo.close()


def _canonical(obj) -> bytes:
    return json.dumps(obj, sort_keys=True, separators=(",", ":")).encode()


def forge_commit(repo: Repo, cid: str, mutate=None, snapshot: str | None = None) -> str:
    """A commit like `cid` (optionally on another snapshot, optionally mutated) on branch evil."""
    d = json.loads(repo.store.blobs.get(cid)[len(COMMIT_HEADER):])
    if snapshot is not None:
        d["snapshot"] = snapshot
    if mutate is not None:
        mutate(d)
    nid = repo.store.blobs.put(COMMIT_HEADER + _canonical(d))
    repo.store.refs.update_refs([RefUpdate("refs/heads/evil", None, nid)], "forge")
    return nid


def forge_snapshot(repo: Repo, cid: str, mutate=None, body: bytes | None = None) -> str:
    """A commit on branch evil whose snapshot is `cid`'s, mutated (content id recomputed)."""
    raw = repo.store.blobs.get(repo.read_commit(cid).snapshot)
    if body is None:
        obj = json.loads(zlib.decompress(raw[len(SNAPSHOT_HEADER):]))
        mutate(obj)
        body = _canonical(obj)
    sid = repo.store.blobs.put(SNAPSHOT_HEADER + zlib.compress(body, 9))
    return forge_commit(repo, cid, snapshot=sid)


def tensor0(**fields):
    return lambda o: o["tensors"][0].update(fields)


SNAPSHOT_CASES = {
    "stored_bytes 3e9": (tensor0(stored_bytes=3_000_000_000), PayloadSizeError),
    "stored_bytes 2^70": (tensor0(stored_bytes=1 << 70), MalformedObjectError),
    "stored_bytes str": (tensor0(stored_bytes="12"), MalformedObjectError),
    "stored_bytes negative": (tensor0(stored_bytes=-5), MalformedObjectError),
    "stored_bytes float": (tensor0(stored_bytes=1.5), MalformedObjectError),
    "stored_bytes bool": (tensor0(stored_bytes=True), MalformedObjectError),
    "raw_bytes null": (tensor0(raw_bytes=None), MalformedObjectError),
    "shape negative": (tensor0(shape=[-1, 8]), MalformedObjectError),
    "shape huge dim": (tensor0(shape=[10 ** 30]), MalformedObjectError),
    "shape huge product": (tensor0(shape=[1 << 30, 1 << 30]), MalformedObjectError),
    "shape long": (tensor0(shape=[1 << 40] * 5000), MalformedObjectError),
    "shape str": (tensor0(shape="ab"), MalformedObjectError),
    "shape of floats": (tensor0(shape=[64.0, 8.0]), MalformedObjectError),
    "name int": (tensor0(name=7), MalformedObjectError),
    "dtype int": (tensor0(dtype=7), MalformedObjectError),
    "codec list": (tensor0(codec=["raw/1"]), MalformedObjectError),
    "chunks int": (tensor0(chunks=[5]), MalformedObjectError),
    "chunks not hex": (tensor0(chunks=["zz" * 16]), MalformedObjectError),
    "chunks str": (tensor0(chunks="ab" * 16), MalformedObjectError),
    "meta list": (tensor0(meta=[1]), MalformedObjectError),
    "meta refs": (tensor0(meta={"refs": [1, 2]}), MalformedObjectError),
    "meta parent": (tensor0(meta={"parent": {"snapshot": 3, "name": "w"}}), MalformedObjectError),
    "meta moment": (tensor0(meta={"moment": {"partner": "v", "ratio_bound": "x"}}), MalformedObjectError),
    "meta moment sqrt": (tensor0(meta={"moment": {"partner": "v", "ratio_bound": 2.0,
                                                  "sqrt": "fast"}}), MalformedObjectError),
    "meta chain_cost": (tensor0(meta={"chain_cost": -1}), MalformedObjectError),
    "meta domain": (tensor0(meta={"domain": "sqrt"}), MalformedObjectError),
    "depth negative": (tensor0(depth=-3), MalformedObjectError),
    "unknown field": (tensor0(evil=1), MalformedObjectError),
    "missing field": (lambda o: o["tensors"][0].pop("chunks"), MalformedObjectError),
    "duplicate names": (lambda o: o["tensors"].append(dict(o["tensors"][0])), MalformedObjectError),
    "tensors dict": (lambda o: o.update(tensors={"a": 1}), MalformedObjectError),
    "tensor is a list": (lambda o: o.update(tensors=[[1]]), MalformedObjectError),
    "skeleton list": (lambda o: o.update(skeleton=[1]), MalformedObjectError),
    "skeleton deeper than unflatten goes":
        (lambda o: o["skeleton"].update(root=json.loads("[" * 450 + "]" * 450)), MalformedObjectError),
}


def _read_bounded(repo: Repo, rev: str, limit: int = 64 << 20) -> BaseException:
    """Read `rev`: it must fail fast, with at most `limit` bytes of Python allocations."""
    tracemalloc.start()
    t0 = time.monotonic()
    try:
        repo.read_state(rev)
    except BaseException as exc:  # noqa: BLE001 - the test inspects whatever was raised
        err = exc
    else:
        err = AssertionError("a hostile object was read without an error")
    finally:
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
    assert time.monotonic() - t0 < 5, "hostile object took too long to refuse"
    assert peak < limit, f"allocated {peak} bytes for a hostile object"
    return err


@pytest.mark.parametrize("case", list(SNAPSHOT_CASES))
def test_hostile_snapshots_are_typed_data_errors(base, case):
    repo, cid = base
    mutate, kind = SNAPSHOT_CASES[case]
    forge_snapshot(repo, cid, mutate)
    err = _read_bounded(repo, "evil")
    assert isinstance(err, kind), repr(err)
    assert isinstance(err, DataError) and not isinstance(err, InternalError)
    if isinstance(err, MalformedObjectError):
        assert repo.read_commit(repo.resolve("evil")).snapshot in str(err)  # names the object
    report = repo.fsck()
    assert not report.ok and any("evil" in p or repo.read_commit(repo.resolve("evil")).snapshot in p
                                 or "chunks hold" in p for p in report.problems), report.problems


def test_a_100k_deep_skeleton_is_refused_without_recursing(base):
    repo, cid = base
    raw = repo.store.blobs.get(repo.read_commit(cid).snapshot)
    body = zlib.decompress(raw[len(SNAPSHOT_HEADER):]).decode()
    obj = json.loads(body)
    root = json.dumps(obj["skeleton"]["root"], sort_keys=True, separators=(",", ":"))
    deep = body.replace(root, "[" * 100_000 + "]" * 100_000).encode()
    forge_snapshot(repo, cid, body=deep)
    err = _read_bounded(repo, "evil")
    assert isinstance(err, MalformedObjectError), repr(err)
    assert "nested too deeply" in str(err)
    assert not repo.fsck().ok


@pytest.mark.parametrize("depth", [MAX_SKELETON_DEPTH + 2, 900, 5000])  # n lists: depth n - 1
def test_unflatten_refuses_skeletons_deeper_than_its_limit(depth):
    skeleton = flatten({"x": 1}).skeleton
    skeleton["root"] = json.loads("[" * depth + "]" * depth) if depth < 900 else _deep_list(depth)
    with pytest.raises(SkeletonTooDeepError):
        unflatten(skeleton, {})


def _deep_list(depth: int) -> list:
    root: list = []
    node = root
    for _ in range(depth):
        node.append([])
        node = node[0]
    return root


def test_every_state_flatten_accepts_still_unflattens():
    state: dict = {"w": torch.ones(3)}
    deepest = None
    for _ in range(MAX_SKELETON_DEPTH):
        try:
            flatten(state)
        except MvcError:  # "nested too deeply": the deepest state a commit can hold
            break
        deepest = state
        state = {"a": state}
    flat = flatten(deepest)
    back = unflatten(flat.skeleton, flat.tensors)
    while "a" in back:
        back, deepest = back["a"], deepest["a"]
    assert torch.equal(back["w"], deepest["w"])


COMMIT_CASES = {
    "parents str": lambda d: d.update(parents="ab" * 16),
    "parents bad id": lambda d: d.update(parents=["nothex"]),
    "snapshot int": lambda d: d.update(snapshot=7),
    "message list": lambda d: d.update(message=["m"]),
    "time int": lambda d: d.update(time=5),
    "author null": lambda d: d.update(author=None),
    "step str": lambda d: d.update(step="3"),
    "metrics str": lambda d: d.update(metrics={"loss": "low"}),
    "metrics list": lambda d: d.update(metrics=[1]),
    "quant list": lambda d: d.update(quant=[1]),
    "chain_depth negative": lambda d: d.update(chain_depth=-1),
    "extra str": lambda d: d.update(extra="x"),
    "unknown field": lambda d: d.update(evil=1),
    "missing field": lambda d: d.pop("snapshot"),
}


@pytest.mark.parametrize("case", list(COMMIT_CASES))
def test_hostile_commits_are_malformed_objects(base, case):
    repo, cid = base
    nid = forge_commit(repo, cid, COMMIT_CASES[case])
    with pytest.raises(MalformedObjectError, match=nid):
        repo.read_commit(nid)
    assert any(nid in p for p in repo.fsck().problems)
    code, _, err = run(repo.path, "log", "evil")
    assert code == MalformedObjectError.exit_code, err


@pytest.mark.parametrize("case", ["stored_bytes 3e9", "stored_bytes str", "shape negative",
                                  "dtype int", "skeleton deeper than unflatten goes"])
def test_cli_reports_hostile_snapshots_with_their_data_exit_code(base, case):
    repo, cid = base
    mutate, kind = SNAPSHOT_CASES[case]
    forge_snapshot(repo, cid, mutate)
    code, _, err = run(repo.path, "checkout", "evil", "-o", "out.pt")
    assert code == kind.exit_code, err
    assert code != InternalError.exit_code and "internal error" not in err
    code, out, _ = run(repo.path, "fsck")
    assert code == 26, out


# ---------------------------------------------------------------------- store metadata

@pytest.mark.parametrize("garbled", [b"1\xff34", b"", b"-5", b"12 ", b"9" * 40, b"abc"])
def test_a_garbled_object_byte_counter_never_blocks_the_repository(base, garbled):
    repo, _cid = base
    actual = sum(repo.store.blobs.size(o) for o in repo.store.blobs.iter_ids())
    repo.store.maintenance.set_meta("store.object_bytes", garbled)
    assert repo.store.blobs.object_bytes() == actual  # recounted on read
    assert repo.stats().object_bytes == actual
    repo.commit({"w": torch.randn(64, 8), "step": 4}, "two")  # and on write
    actual = sum(repo.store.blobs.size(o) for o in repo.store.blobs.iter_ids())
    assert repo.store.maintenance.get_meta("store.object_bytes") == str(actual).encode()
    code, _, err = run(repo.path, "stats")
    assert code == 0, err


def test_the_cli_commits_and_reports_stats_after_a_counter_flip(base, tmp_path):
    repo, _cid = base
    repo.store.maintenance.set_meta("store.object_bytes", b"12\x0034")
    torch.save({"w": torch.randn(64, 8)}, tmp_path / "ckpt.pt")
    code, _, err = run(repo.path, "commit", "-m", "after flip", str(tmp_path / "ckpt.pt"))
    assert code == 0, err
    code, _, err = run(repo.path, "stats")
    assert code == 0, err


def test_fsck_recounts_and_repairs_a_wrong_but_readable_counter(base):
    repo, _cid = base
    actual = repo.store.blobs.object_bytes()
    repo.store.maintenance.set_meta("store.object_bytes", str(actual + 1000).encode())  # one digit flipped
    report = repo.fsck()
    assert report.ok  # derived data: a warning, repaired, not repository damage
    assert any("object byte counter" in w and "repaired" in w for w in report.warnings)
    assert repo.store.blobs.object_bytes() == actual
    assert repo.fsck().warnings == []
