"""`Repo` over every local store: commit, checkout, gc (with shrink) and fsck.

`gc(shrink=True)` used to call an LMDB-only method, so a `Repo` over a
`MemoryStore` failed with AttributeError; shrink is now part of the store's
maintenance contract, and the same history runs over `memory:` and LMDB.
"""
from __future__ import annotations

from pathlib import Path

import pytest
import torch
from checkpoints import assert_same

from mvc.repo.repository import Repo
from mvc.store import LmdbStore, MemoryStore, ObjectStore, open_store


def _repo(kind: str, root: Path) -> Repo:
    if kind == "lmdb":
        return Repo.init(root)
    (root / ".mvc").mkdir(parents=True)  # the config and the level cache still live on disk
    store = open_store("memory:")
    store.refs.update_ref("HEAD", None, "ref: refs/heads/main", "init")  # what Repo.init writes
    return Repo(root, store=store)


def _state(i: int) -> dict:
    g = torch.Generator().manual_seed(i)
    w = torch.randn(64, 48, generator=g)
    return {"model": {"w": w + 0.01 * i, "b": torch.full((48,), float(i))}, "step": i}


@pytest.mark.parametrize("kind", ["memory", "lmdb"])
def test_repo_over_store(kind: str, tmp_path: Path) -> None:
    repo = _repo(kind, tmp_path / "r")
    try:
        assert isinstance(repo.store, MemoryStore if kind == "memory" else LmdbStore)
        assert isinstance(repo.store, ObjectStore)
        ids = [repo.commit(_state(i), f"c{i}", step=i) for i in range(3)]  # lossy search
        repo.config.set("commit.mode", "lossless")
        exact = repo.commit(_state(7), "exact")
        assert_same(_state(7), repo.checkout(exact))
        restored = {c: repo.read_state(c) for c in [*ids, exact]}
        assert [c.id for c in repo.log()] == [exact, *ids[::-1]]

        orphan = repo.store.blobs.put(b"left behind by an interrupted commit" * 1000)
        report = repo.gc(shrink=True)
        assert report.removed_objects == 1 and not repo.store.blobs.has(orphan)
        assert report.disk_before is not None and report.disk_after is not None
        assert 0 < report.disk_after <= report.disk_before
        assert report.disk_after == repo.store.maintenance.disk_usage()

        fsck = repo.fsck()
        assert fsck.ok, fsck.problems
        assert fsck.commits_checked == 4 and fsck.warnings == []
        for cid, state in restored.items():
            assert_same(state, repo.read_state(cid))
        assert_same(restored[ids[2]], repo.checkout(ids[2]))
    finally:
        repo.close()
