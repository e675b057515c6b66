"""Every fsck detection branch, and gc refusing to delete when stored data is damaged.

Each test damages one thing in a small repository (through the store's own API, or by
writing hand-made objects that verify against their ids but say something wrong) and
checks that fsck names it, and where the damage is in reachable history, that gc refuses
(`UnsafeGcError`, exit 25) and deletes nothing.
"""
from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import torch
from store_contract import corrupt_object

from mvc.quant import QuantConfig
from mvc.repo.gc import UnsafeGcError
from mvc.repo.objects import Commit, Snapshot, TensorRecord
from mvc.repo.replace import REPLACE
from mvc.repo.repository import Repo
from mvc.store import ANY, RefUpdate, object_id

ORPHAN = b"left behind by an interrupted commit"


def lossless_repo(root: Path, n: int = 3) -> tuple[Repo, list[str]]:
    repo = Repo.init(root)
    repo.config.set("commit.mode", "lossless")
    ids = [repo.commit({"w": torch.arange(64.0) + i, "b": torch.full((32,), float(i))},
                       f"c{i}") for i in range(n)]
    return repo, ids


def lossy_repo(root: Path, n: int = 3) -> tuple[Repo, list[str]]:
    """`n` quantized commits of one tensor `w`, each a delta on the previous."""
    repo = Repo.init(root)
    repo.config.set("cache.levels_keep", 0)
    g = torch.Generator().manual_seed(0)
    w = torch.randn(64, 64, generator=g)
    ids = []
    for i in range(n):
        w = w + 0.01 * torch.randn(64, 64, generator=g)
        ids.append(repo.commit({"w": w}, f"c{i}", quant=QuantConfig(bins=8)))
    assert [r.codec for r in repo.read_snapshot(snap(repo, ids[-1])).tensors] == ["qdelta/1"]
    return repo, ids


def snap(repo: Repo, cid: str) -> str:
    return repo.read_commit(cid).snapshot


def records(repo: Repo, cid: str) -> list[TensorRecord]:
    return repo.read_snapshot(snap(repo, cid)).tensors


def hand_commit(repo: Repo, recs: list[TensorRecord], parents: list[str], branch: str) -> tuple[str, str]:
    """A commit of a hand-made snapshot holding `recs`, on a new branch: (commit id, snapshot id)."""
    sid = repo.store.blobs.put(Snapshot(recs, {"format": 1, "root": None}).encode())
    cid = repo.store.blobs.put(Commit(parents=parents, snapshot=sid, message="hand made",
                                time="2030-01-01T00:00:00+00:00", author="t").encode())
    repo.store.refs.update_refs([RefUpdate("refs/heads/" + branch, None, cid)], "test")
    return cid, sid


def problems(repo: Repo) -> list[str]:
    report = repo.fsck()
    assert not report.ok
    return report.problems


def has(lines: list[str], *parts: str) -> bool:
    return any(all(p in line for p in parts) for line in lines)


def assert_gc_refuses(repo: Repo, *, match: str | None = None) -> None:
    """gc raises UnsafeGcError, and neither deletes an object nor drops a ref."""
    orphan = repo.store.blobs.put(ORPHAN)
    ids, refs = set(repo.store.blobs.iter_ids()), dict(repo.store.refs.iter_refs(""))
    with pytest.raises(UnsafeGcError, match=match) as info:
        repo.gc()
    assert info.value.exit_code == 25
    assert set(repo.store.blobs.iter_ids()) == ids and repo.store.blobs.has(orphan)
    assert dict(repo.store.refs.iter_refs("")) == refs


# ------------------------------------------------------------------------ refs

def test_symbolic_ref_to_a_missing_ref(tmp_path):
    repo, _ = lossless_repo(tmp_path / "r")
    repo.store.refs.update_refs([RefUpdate("refs/heads/alias", None, "ref: refs/heads/nowhere")], "t")
    assert has(problems(repo), "ref refs/heads/alias: points to missing ref refs/heads/nowhere")
    repo.close()


def test_ref_to_a_missing_object(tmp_path):
    repo, _ = lossless_repo(tmp_path / "r")
    ghost = object_id(b"never stored")
    repo.store.refs.update_refs([RefUpdate("refs/tags/ghost", None, ghost)], "t")
    found = problems(repo)
    assert has(found, f"ref refs/tags/ghost: points to missing object {ghost}")
    assert has(found, f"reflog: names missing commit {ghost}")
    assert_gc_refuses(repo, match=ghost)
    repo.close()


# ------------------------------------------------------------------------ commits

def test_malformed_commit(tmp_path):
    repo, _ = lossless_repo(tmp_path / "r")
    bad = repo.store.blobs.put(b'mvc-commit 1\n{"parents":[]}')  # verifies, but lacks every field
    repo.store.refs.update_refs([RefUpdate("refs/heads/bad", None, bad)], "t")
    assert has(problems(repo), f"commit {bad}", "malformed")
    assert_gc_refuses(repo, match=bad)
    repo.close()


def test_ref_naming_a_snapshot_as_a_commit(tmp_path):
    repo, ids = lossless_repo(tmp_path / "r")
    sid = snap(repo, ids[0])
    repo.store.refs.update_refs([RefUpdate("refs/tags/oops", None, sid)], "t")
    assert has(problems(repo), sid, "referenced as a commit but is a snapshot")
    assert_gc_refuses(repo, match="is a snapshot")
    repo.close()


def test_missing_parent(tmp_path):
    repo, ids = lossless_repo(tmp_path / "r")
    repo.store.blobs.delete([ids[0]])
    assert has(problems(repo), f"commit {ids[1]}: parent {ids[0]} is missing")
    assert_gc_refuses(repo, match=ids[0])
    repo.close()


# ------------------------------------------------------------------------ snapshots

def test_unreadable_snapshot(tmp_path):
    repo, ids = lossless_repo(tmp_path / "r")
    sid = snap(repo, ids[1])
    corrupt_object(repo.store, sid, 20)
    found = problems(repo)
    assert has(found, f"object {sid}")                     # the re-hash
    assert has(found, f"commit {ids[1]}: snapshot {sid}")  # the walk
    assert_gc_refuses(repo, match=sid)
    repo.close()


def test_unknown_codec(tmp_path):
    repo, ids = lossless_repo(tmp_path / "r")
    recs = [dataclasses.replace(r, codec="nope/9") if r.name == "w" else r
            for r in records(repo, ids[-1])]
    _, sid = hand_commit(repo, recs, [ids[-1]], "future")
    assert has(problems(repo), f"snapshot {sid}", "tensor 'w' uses unknown codec nope/9")
    repo.close()


def test_missing_chunk(tmp_path):
    repo, ids = lossless_repo(tmp_path / "r")
    rec = next(r for r in records(repo, ids[-1]) if r.name == "w")
    repo.store.blobs.delete(rec.chunks[:1])
    assert has(problems(repo), f"tensor 'w': chunk {rec.chunks[0]} is missing")
    repo.close()


def test_payload_size_disagrees_with_the_record(tmp_path):
    repo, ids = lossless_repo(tmp_path / "r")
    recs = [dataclasses.replace(r, stored_bytes=r.stored_bytes + 1) if r.name == "w" else r
            for r in records(repo, ids[-1])]
    _, sid = hand_commit(repo, recs, [ids[-1]], "liar")
    assert has(problems(repo), f"snapshot {sid}", "tensor 'w': chunks hold")
    repo.close()


# ------------------------------------------------------------------------ replacements

def test_missing_replacement(tmp_path):
    repo, ids = lossless_repo(tmp_path / "r")
    sid, gone = snap(repo, ids[1]), object_id(b"no such snapshot")
    repo.store.refs.update_refs([RefUpdate(REPLACE + sid, None, gone)], "t")
    assert has(problems(repo), f"ref {REPLACE}{sid}: replacement snapshot {gone} is missing")
    assert_gc_refuses(repo, match=gone)
    repo.close()


def test_gc_refuses_a_replacement_chain(tmp_path):
    """Regression: reading through a chain of replacements raised ReplacementError (exit 92)
    out of gc, outside the damage check, instead of gc refusing."""
    repo, ids = lossy_repo(tmp_path / "r")
    s0, s1, s2 = (snap(repo, c) for c in ids)
    repo.store.refs.update_refs([RefUpdate(REPLACE + s0, ANY, s1), RefUpdate(REPLACE + s1, ANY, s2)], "t")
    assert has(problems(repo), REPLACE + s0, "a chain")
    assert_gc_refuses(repo, match="replacements")
    repo.close()


def test_gc_drops_replacements_of_unreachable_snapshots(tmp_path):
    root = tmp_path / "r"
    repo, ids = lossy_repo(root, n=4)
    before = {c: repo.read_state(c)["w"] for c in ids}
    assert repo.gc(max_chain=1).snapshots_rewritten > 0
    live = dict(repo.store.refs.iter_refs(REPLACE))
    assert live
    # A replacement of a snapshot no commit names (left by an interrupted run, or its
    # history deleted): the ref, its reflog, the original and the re-encoding all go.
    rec = records(repo, ids[0])[0]
    orig = repo.store.blobs.put(Snapshot([rec], {"format": 1, "root": "a"}).encode())
    copy = repo.store.blobs.put(Snapshot([rec], {"format": 1, "root": "b"}).encode())
    repo.store.refs.update_refs([RefUpdate(REPLACE + orig, None, copy)], "t")
    report = repo.gc()
    assert dict(repo.store.refs.iter_refs(REPLACE)) == live  # the live ones stay
    assert REPLACE + orig not in repo.store.refs.reflog_names()
    assert not repo.store.blobs.has(orig) and not repo.store.blobs.has(copy)
    assert report.removed_objects >= 2
    assert repo.fsck().ok, repo.fsck().problems
    for c in ids:
        assert torch.equal(repo.read_state(c)["w"], before[c])
    repo.close()


# ------------------------------------------------------------------------ delta parents

def test_delta_parent_tensor_missing_in_its_parent_snapshot(tmp_path):
    repo, ids = lossy_repo(tmp_path / "r")
    rec = records(repo, ids[-1])[0]
    meta = dict(rec.meta, parent=dict(rec.meta["parent"], name="nope"))
    _, sid = hand_commit(repo, [dataclasses.replace(rec, meta=meta)], [ids[-1]], "broken")
    assert has(problems(repo), f"snapshot {sid}", "delta parent 'nope' missing in snapshot")
    repo.close()


def test_delta_parent_snapshot_missing(tmp_path):
    repo, ids = lossy_repo(tmp_path / "r")
    rec = records(repo, ids[-1])[0]
    gone = object_id(b"no parent snapshot")
    meta = dict(rec.meta, parent=dict(rec.meta["parent"], snapshot=gone), refs=[gone])
    _, sid = hand_commit(repo, [dataclasses.replace(rec, meta=meta)], [ids[-1]], "broken")
    assert has(problems(repo), f"snapshot {sid}: delta parent snapshot {gone}")
    assert_gc_refuses(repo, match=gone)
    repo.close()


def test_delta_naming_no_parent(tmp_path):
    repo, ids = lossy_repo(tmp_path / "r")
    rec = records(repo, ids[-1])[0]
    meta = {k: v for k, v in rec.meta.items() if k not in ("parent", "refs")}
    _, sid = hand_commit(repo, [dataclasses.replace(rec, meta=meta)], [ids[-1]], "broken")
    assert has(problems(repo), f"snapshot {sid}", "does not name its parent")
    assert_gc_refuses(repo, match="does not name its parent")
    repo.close()


# ------------------------------------------------------------------------ the store's keys

def test_gc_refuses_a_damaged_object_key(tmp_path):
    """Regression: an object key that is no object id (a flipped byte in the LMDB key) made gc
    fail inside delete with InvalidIdError, a usage error; it is damage, and gc refuses."""
    repo, _ = lossless_repo(tmp_path / "r")
    victim = repo.store.blobs.put(b"an orphan whose key gets damaged")
    h = repo.store._h()
    bad_key = b"zz" + victim.encode()[2:]

    def rename(txn):
        value = txn.get(victim.encode(), db=h.dbs["objects"])
        txn.delete(victim.encode(), db=h.dbs["objects"])
        txn.put(bad_key, value, db=h.dbs["objects"])
    h.write(rename)
    assert has(problems(repo), "zz")  # fsck names the key it cannot use
    assert_gc_refuses(repo, match="damaged object key")
    repo.close()
