"""Repository porcelain through the Python API: round trips, refs, revisions, dedupe."""
from __future__ import annotations

import warnings

import pytest
import torch

from checkpoints import assert_same, realistic_state
from mvc.errors import MvcWarning, UsageError
from mvc.repo.refs import CurrentBranchError, NoSuchRefError, RefExistsError, RefNameError
from mvc.repo.repository import NotARepositoryError, Repo
from mvc.repo.revparse import AmbiguousRevisionError, UnknownRevisionError


def test_roundtrip_realistic_checkpoint(repo, state):
    cid = repo.commit(state, "epoch 3", step=3, metrics={"loss": 1.25})
    restored = repo.checkout(cid)
    assert_same(state, restored)
    # tied weights come back tied
    m = restored["model"]
    assert m["embed.weight"].data_ptr() == m["head.weight"].data_ptr()
    c = repo.read_commit(cid)
    assert c.step == 3 and c.metrics == {"loss": 1.25} and c.parents == []


@pytest.mark.parametrize("dtype", [
    torch.float32, torch.float16, torch.bfloat16, torch.float64, torch.int8, torch.uint8,
    torch.int16, torch.int32, torch.int64, torch.bool, torch.complex64,
] + [getattr(torch, n) for n in ("float8_e4m3fn", "float8_e5m2", "uint16", "uint32", "uint64")
     if hasattr(torch, n)])
def test_roundtrip_every_dtype(repo, dtype):
    base = torch.randn(37, 5) * 100
    t = base.to(dtype) if dtype != torch.bool else base > 0
    state = {"t": t, "scalar": t[0, 0].clone(), "empty": t[:0], "noncontig": t.t()}
    cid = repo.commit(state, f"dtype {dtype}")
    assert_same(state, repo.read_state(cid))


def test_history_revisions_and_log(repo):
    ids = [repo.commit({"w": torch.full((4,), float(i))}, f"c{i}", step=i) for i in range(4)]
    assert repo.resolve("HEAD") == ids[3]
    assert repo.resolve("HEAD~2") == ids[1]
    assert repo.resolve("main^") == ids[2]
    assert repo.resolve("HEAD~1^") == ids[1]
    assert repo.resolve(ids[2][:8]) == ids[2]
    assert [c.id for c in repo.log()] == ids[::-1]
    assert [c.id for c in repo.log("HEAD~1", n=2)] == [ids[2], ids[1]]
    with pytest.raises(UnknownRevisionError):
        repo.resolve("HEAD~9")
    with pytest.raises(UnknownRevisionError):
        repo.resolve("nope")


def test_ambiguous_prefix_via_fake_store(repo, monkeypatch):
    a = repo.commit({"w": torch.zeros(2)}, "a")
    b = repo.commit({"w": torch.ones(2)}, "b")
    monkeypatch.setattr(repo.store.blobs, "ids_with_prefix", lambda p: [a, b])
    with pytest.raises(AmbiguousRevisionError) as exc:
        repo.resolve("abcd")
    assert a[:12] in str(exc.value) and b[:12] in str(exc.value)


def test_unborn_head(repo):
    assert repo.head() is None and repo.log() == []
    with pytest.raises(UnknownRevisionError):
        repo.checkout("HEAD")


def test_branches_tags_switch_detach(repo):
    c1 = repo.commit({"w": torch.zeros(3)}, "one")
    repo.branch("exp")
    with pytest.raises(RefExistsError):
        repo.branch("exp")
    with pytest.raises(RefNameError):
        repo.branch("bad name")
    repo.switch("exp")
    c2 = repo.commit({"w": torch.ones(3)}, "two")
    assert repo.resolve("exp") == c2 and repo.resolve("main") == c1
    with pytest.raises(CurrentBranchError):
        repo.delete_branch("exp")
    repo.tag("v1", "main")
    assert repo.resolve("v1") == c1
    repo.checkout("v1")  # a tag: HEAD detaches
    assert repo.current_branch() is None and repo.head() == c1
    c3 = repo.commit({"w": torch.full((3,), 2.0)}, "detached work")
    assert repo.head() == c3 and repo.resolve("main") == c1
    with pytest.warns(MvcWarning, match=f"leaving 1 commit.*{c3[:12]} \\(detached work\\)"):
        repo.checkout("main")   # git's "you are leaving 1 commit behind"
    assert repo.current_branch() == "main"
    assert repo.delete_branch("exp", force=True) == c2  # unmerged (c2 is only on exp)
    with pytest.raises(NoSuchRefError):
        repo.delete_branch("exp")
    repo.delete_tag("v1")
    with pytest.raises(UnknownRevisionError):
        repo.resolve("v1")


def test_moving_a_detached_head_warns_only_when_it_leaves_commits_behind(repo):
    c1 = repo.commit({"w": torch.zeros(3)}, "one")
    repo.commit({"w": torch.ones(3)}, "two")
    with warnings.catch_warnings():
        warnings.simplefilter("error", MvcWarning)
        repo.checkout(c1)                    # detached at a commit main reaches
        repo.switch("main")                  # nothing left behind: no warning
        repo.checkout(c1)
    a = repo.commit({"w": torch.full((3,), 2.0)}, "resumed a")
    b = repo.commit({"w": torch.full((3,), 3.0)}, "resumed b")
    with pytest.warns(MvcWarning, match=f"leaving 2 commit.*{b[:12]} \\(resumed b\\).*mvc branch NAME"):
        repo.switch("main")
    repo.checkout(b)                         # the reflog still has them
    repo.branch("kept", b)
    with warnings.catch_warnings():
        warnings.simplefilter("error", MvcWarning)
        repo.switch("main")                  # a branch reaches them now
    assert repo.resolve("kept~1") == a


def test_reflog_records_every_move(repo):
    c1 = repo.commit({"w": torch.zeros(1)}, "one")
    c2 = repo.commit({"w": torch.ones(1)}, "two")
    log = repo.store.refs.reflog("refs/heads/main")
    assert [(e.old, e.new) for e in log] == [(None, c1), (c1, c2)]
    assert all(e.reason.startswith("commit:") and e.time > 0 for e in log)


def test_same_checkpoint_twice_adds_under_4kib(repo, state):
    repo.commit(state, "first")
    before = repo.store.blobs.object_bytes()
    repo.commit(state, "again")
    assert repo.store.blobs.object_bytes() - before < 4096


def test_frozen_half_stores_only_changed_half(repo):
    torch.manual_seed(1)
    sd = {f"layer{i}.weight": torch.randn(256, 256) for i in range(8)}
    repo.commit(sd, "base")
    before = repo.store.blobs.object_bytes()
    tuned = {k: (v + 0.01 * torch.randn_like(v) if i % 2 else v) for i, (k, v) in enumerate(sd.items())}
    repo.commit(tuned, "fine-tune, half the layers frozen")
    added = repo.store.blobs.object_bytes() - before
    half = sum(v.numel() * 4 for i, v in enumerate(sd.values()) if i % 2)
    assert added < half * 1.05 + 8192


def test_discover_and_not_a_repo(tmp_path, monkeypatch):
    Repo.init(tmp_path / "a").close()
    (tmp_path / "a" / "sub" / "dir").mkdir(parents=True)
    monkeypatch.chdir(tmp_path / "a" / "sub" / "dir")
    with Repo.discover() as r:
        assert r.path == (tmp_path / "a").resolve()
    monkeypatch.chdir(tmp_path)
    with pytest.raises(NotARepositoryError):
        Repo.discover()
    with pytest.raises(NotARepositoryError):
        Repo(tmp_path)


def test_diff_and_stats(repo):
    a = repo.commit({"w": torch.ones(10), "gone": torch.zeros(2)}, "a")
    b = repo.commit({"w": torch.ones(10) * 1.5, "new": torch.zeros(3)}, "b")
    d = {x.name: x for x in repo.diff(a, b)}
    assert d["w"].status == "changed" and d["w"].rel_l2 == pytest.approx(0.5)
    assert d["w"].max_abs == pytest.approx(0.5)
    assert d["gone"].status == "removed" and d["new"].status == "added"
    s = repo.stats()
    assert [c.id for c in s.commits] == [a, b]
    assert s.raw_bytes == 48 + 52 and s.stored_bytes > 0


def test_stats_names_the_bytes_no_ref_reaches_and_gc_frees_them(repo, tmp_path):
    from cli_helpers import run

    repo.commit({"w": torch.arange(1000.0)}, "a")
    assert repo.stats().unreachable_objects == 0
    # What an interrupted commit leaves: objects written, no ref moved to them.
    orphans = [repo.store.blobs.put(bytes([i]) * 5000) for i in range(3)]
    s = repo.stats()
    assert s.unreachable_objects == 3
    assert s.unreachable_bytes == sum(repo.store.blobs.size(o) for o in orphans)
    assert s.to_dict()["unreachable_bytes"] == s.unreachable_bytes
    code, out, err = run(repo.path, "stats")
    assert code == 0, err
    assert "3 objects no ref or reflog reaches" in out and "`mvc gc` frees them" in out
    repo.gc()
    assert repo.stats().unreachable_objects == 0
    assert "no ref or reflog reaches" not in run(repo.path, "stats")[1]


def test_bad_commit_arguments(repo):
    with pytest.raises(UsageError):
        repo.commit({"w": torch.zeros(1)}, "")
    with pytest.raises(UsageError):
        repo.commit({"w": torch.zeros(1)}, "m", metrics={"loss": float("nan")})
    assert repo.head() is None


def test_checkout_map_location_keeps_ties(repo, state):
    cid = repo.commit(state, "s")
    out = repo.read_state(cid, map_location="cpu")
    assert out["model"]["embed.weight"].data_ptr() == out["model"]["head.weight"].data_ptr()


def test_other_realistic_seeds_roundtrip(repo):
    for seed in range(3):
        s = realistic_state(seed)
        assert_same(s, repo.checkout(repo.commit(s, f"seed {seed}")))


@pytest.mark.parametrize("bad", ["bogus", f"cuda:{torch.cuda.device_count()}"])
def test_a_checkout_to_a_device_it_cannot_use_moves_nothing(repo, state, bad):
    """A `map_location` naming no device, or a CUDA device this host does not have, is a
    `UsageError` before anything is read: HEAD stays where it was."""
    first = repo.commit(state, "a")
    repo.commit(state, "b")
    head = repo.head()
    with pytest.raises(UsageError, match="map_location"):
        repo.read_state(first, map_location=bad)
    with pytest.raises(UsageError, match="map_location"):
        repo.checkout(first, map_location=bad)
    assert repo.head() == head
