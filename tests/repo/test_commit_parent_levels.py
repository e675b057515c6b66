"""What a commit holds of its parent's levels (issue 27: a commit's extra host memory).

A commit reads its parent's centroids (the warm start) from the head of each record's payload,
without decoding levels, and its parent's levels one tensor at a time for the deltas, keeping
none of them: a fresh process's next commit never holds a second full set of levels beside its
own. Once it lands, the in-memory level cache holds its levels and drops its parent's, so a
training process holds one commit's levels, not every recent commit's.
"""
from __future__ import annotations

import gc
import weakref
from unittest import mock

import pytest
import torch

from mvc.quant import QuantConfig, QuantPolicy
from mvc.repo import reader as reader_mod
from mvc.repo.lossy import is_quantized
from mvc.repo.reader import TensorReader
from mvc.repo.repository import Repo

CFG = QuantConfig(bins=8, protect=0.005)
POLICY = QuantPolicy(min_numel=64)


def states(n: int):
    g = torch.Generator().manual_seed(0)
    w = {f"layer{i}.weight": torch.randn(64, 48, generator=g) * 0.05 for i in range(4)}
    for t in range(n):
        w = {k: v + 0.002 * torch.randn(v.shape, generator=g) for k, v in w.items()}
        yield {**w, "bias": torch.full((5,), float(t))}


def commit_all(repo: Repo, items) -> list[str]:
    return [repo.commit(s, f"step {t}", quant=CFG, policy=POLICY) for t, s in enumerate(items)]


def cached_snapshots(repo: Repo) -> set[str]:
    return {sid for sid, _ in repo.reader.levels._items}


def quantized_records(repo: Repo, cid: str):
    sid = repo.read_commit(cid).snapshot
    return sid, [r for r in repo.read_snapshot(sid).tensors if is_quantized(r)]


def test_centroids_are_read_without_decoding_levels(tmp_path):
    with Repo.init(tmp_path / "r") as repo:
        ids = commit_all(repo, states(3))
    with Repo(tmp_path / "r") as repo:
        want = {}
        for cid in ids:
            sid, recs = quantized_records(repo, cid)
            assert any(r.codec == "qdelta/1" for r in recs) or cid == ids[0]
            want[sid] = {r.name: repo.reader.read_quantized(sid, r, cache_levels=False).centroids
                         for r in recs}
    with Repo(tmp_path / "r") as repo, \
            mock.patch.object(reader_mod, "quantized_codec", side_effect=AssertionError("decoded")):
        for sid, cents in want.items():
            recs = {r.name: r for r in repo.read_snapshot(sid).tensors}
            for name, c in cents.items():
                got = repo.reader.read_centroids(sid, recs[name])
                assert got.dtype == torch.float32 and torch.equal(got, c)
        assert len(repo.reader.levels) == 0


def test_centroids_come_from_the_in_memory_cache_when_it_holds_them(tmp_path):
    with Repo.init(tmp_path / "r") as repo:
        ids = commit_all(repo, states(2))
        sid, recs = quantized_records(repo, ids[-1])
        with mock.patch.object(reader_mod, "read_payload_head", side_effect=AssertionError("read")):
            for r in recs:
                assert torch.equal(repo.reader.read_centroids(sid, r),
                                   repo.reader.levels.get((sid, r.name)).centroids)


def test_a_fresh_process_next_commit_keeps_only_its_own_levels(tmp_path):
    items = list(states(3))
    with Repo.init(tmp_path / "r") as repo:
        commit_all(repo, items[:2])
    with Repo(tmp_path / "r") as repo:   # a new process: the parent comes from the disk cache
        cid = repo.commit(items[2], "step 2", quant=CFG, policy=POLICY)
        assert cached_snapshots(repo) == {repo.read_commit(cid).snapshot}
        _, recs = quantized_records(repo, cid)
        assert len(repo.reader.levels) == len(recs)


def test_a_commit_holds_one_parent_tensors_levels_at_a_time(tmp_path, monkeypatch):
    """The parent's levels are read one tensor at a time (one writer thread here) and each is
    gone before the next is read; none survives the commit."""
    items = list(states(2))
    with Repo.init(tmp_path / "r") as repo:
        commit_all(repo, items[:1])
    monkeypatch.setenv("MVC_THREADS", "1")
    read = TensorReader.read_quantized
    seen: list[weakref.ref] = []
    alive_at_read: list[int] = []

    def counting(self, *a, **k):
        gc.collect()
        alive_at_read.append(sum(r() is not None for r in seen))
        q = read(self, *a, **k)
        seen.append(weakref.ref(q))
        return q

    with Repo(tmp_path / "r") as repo, mock.patch.object(TensorReader, "read_quantized", counting):
        repo.commit(items[1], "step 1", quant=CFG, policy=POLICY)
        gc.collect()
        assert len(seen) == 4 and max(alive_at_read) == 0
        assert all(r() is None for r in seen)


@pytest.mark.parametrize("fresh_reads", [False, True])
def test_a_training_process_holds_the_latest_commits_levels(tmp_path, fresh_reads):
    """Commits in one process (a Tracker): after each, the in-memory cache holds that commit's
    levels only (its parent's are dropped), also after a checkout that kept an older commit's."""
    with Repo.init(tmp_path / "r") as repo:
        ids = []
        for t, s in enumerate(states(4)):
            if fresh_reads and ids:
                repo.read_state(ids[-1])   # a resume: levels kept for the next commit
            ids.append(repo.commit(s, f"step {t}", quant=CFG, policy=POLICY))
            assert cached_snapshots(repo) == {repo.read_commit(ids[-1]).snapshot}
        restored = repo.read_state(ids[-1])
    with Repo(tmp_path / "r") as fresh:
        again = fresh.read_state(ids[-1], cache_levels=False)
    assert all(torch.equal(restored[k], again[k]) for k in restored)
