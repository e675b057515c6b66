"""Histories gc has rewritten travel whole: replacement snapshots (gc's compaction) with their
refs/replace/ refs, and commits a retention policy pruned with their refs/pruned/ marks, so a
clone reads exactly what the original reads and fscks clean."""
from __future__ import annotations

import pytest
from lossy_history import configs, trajectory
from remote_helpers import same_state

from mvc.remote.porcelain import clone
from mvc.remote.transfer import fetch, push
from mvc.repo.pruned import PRUNED, CommitPrunedError
from mvc.repo.replace import REPLACE
from mvc.repo.repository import Repo
from mvc.store.objstore import open_remote


def _gc_history(root):
    repo = Repo.init(root)
    repo.config.set("commit.base_every", 100)
    repo.config.set("commit.chain_budget", 0.0)
    ids = [repo.commit(state, f"step {t}", quant=configs(t)) for t, state in trajectory(10)]
    repo.gc(max_chain=2)  # re-encodes deep delta chains: replacement snapshots
    repo.gc(keep_last=3)  # prunes all but the newest 3 (tips and tags kept)
    return repo, ids


def test_replaced_and_pruned_history_clones_exactly(tmp_path):
    repo, ids = _gc_history(tmp_path / "r")
    replaced = list(repo.store.refs.iter_refs(REPLACE))
    pruned = [n[len(PRUNED):] for n, _ in repo.store.refs.iter_refs(PRUNED)]
    assert replaced and pruned
    url = f"file://{tmp_path / 'remote'}"
    remote = open_remote(url)
    push(repo.odb, remote, {"refs/heads/main": ids[-1]})
    assert dict(remote.refs.iter_refs(PRUNED)) == {PRUNED + c: c for c in pruned}
    res = clone(url, tmp_path / "c")
    c = Repo(res.path)
    assert c.fsck().problems == []
    assert sorted(n[len(PRUNED):] for n, _ in c.store.refs.iter_refs(PRUNED)) == sorted(pruned)
    for cid in ids:
        if cid in pruned:
            with pytest.raises(CommitPrunedError):
                c.read_state(cid)
        else:
            assert same_state(c.read_state(cid), repo.read_state(cid)), cid
    # a fetch into a repository that has none of it takes the same
    other = Repo.init(tmp_path / "o")
    fetch(other.store.blobs, other.store.refs, remote, "x")
    assert other.fsck().problems == []
    other.close()
    c.close()
    repo.close()


def test_replacement_refs_follow_objects_a_killed_push_left(tmp_path):
    repo, ids = _gc_history(tmp_path / "r")
    remote = open_remote(f"file://{tmp_path / 'remote'}")
    # what a push killed after its uploads leaves: every object, no ref
    remote.blobs.put_many(repo.store.blobs.get(r.oid) for r in repo.odb.reachable([ids[-1]]))
    report = push(repo.odb, remote, {"refs/heads/main": ids[-1]})
    assert report.objects == 0
    assert dict(remote.refs.iter_refs(REPLACE)) == dict(repo.store.refs.iter_refs(REPLACE))
    c = Repo(clone(f"file://{tmp_path / 'remote'}", tmp_path / "c").path)
    assert c.fsck().problems == []
    assert same_state(c.read_state(ids[-1]), repo.read_state(ids[-1]))
    c.close()
    repo.close()
