"""The shallow boundary (`mvc.repo.shallow`): a marked commit reads without parents, so every
walk stops there; `reachable(depth=N)` takes N generations with their snapshots' closures;
`settle` marks exactly the commits whose parents are not held."""
from __future__ import annotations

import pytest
import torch

from mvc.repo.repository import Repo
from mvc.repo.shallow import SHALLOW, BeyondShallowError, mark, settle, shallow_ids


@pytest.fixture
def line(tmp_path):
    repo = Repo.init(tmp_path / "r")
    ids = [repo.commit({"w": torch.full((4,), float(i))}, f"c{i}", lossless=True) for i in range(5)]
    yield repo, ids
    repo.close()


def test_a_marked_commit_reads_without_parents_and_walks_stop_there(line):
    repo, ids = line
    mark(repo.store.refs, [ids[2]], "test")
    assert repo.odb.read_commit(ids[2]).parents == []
    assert repo.odb.read_commit(ids[2], graft=False).parents == [ids[1]]
    assert [c.id for c in repo.log()] == ids[:1:-1]
    assert {r.oid for r in repo.odb.reachable([ids[-1]]) if r.kind == "commit"} == set(ids[2:])
    assert repo.resolve("HEAD~2") == ids[2]
    with pytest.raises(BeyondShallowError):
        repo.resolve("HEAD~3")
    # marks are not history: no root of gc's, and fsck is clean
    assert repo.odb.root_ids(reflogs=False) == {ids[-1]}
    assert repo.fsck().ok


def test_reachable_to_a_depth(line):
    repo, ids = line
    got = list(repo.odb.reachable([ids[-1]], depth=2))
    assert [r.oid for r in got if r.kind == "commit"] == [ids[-1], ids[-2]]
    assert {r.kind for r in got} == {"commit", "snapshot", "chunk"}
    with pytest.raises(ValueError):
        list(repo.odb.walk_commits([ids[-1]], order="date", depth=1))


def test_settle_marks_what_lacks_a_parent(line):
    repo, ids = line
    refs = repo.store.refs
    held = {ids[3], ids[4]}
    marked, unmarked = settle(refs, [(ids[4], [ids[3]]), (ids[3], [ids[2]])], held.__contains__, "t")
    assert marked == {ids[3]} and unmarked == set() and shallow_ids(refs) == {ids[3]}
    marked, unmarked = settle(refs, [(ids[3], [ids[2]])], lambda _o: True, "t")
    assert unmarked == {ids[3]} and shallow_ids(refs) == set()
    assert refs.reflog(SHALLOW + ids[3]) == []  # bookkeeping, not history
