"""A push costs what it sends, not what the remote holds (issue 28, item 5): after a history of
5 or of 20 commits, pushing one more commit makes the same requests -- no listing of the
objects or of every pack index, a HEAD per loose object the walk reached, its uploads, the
ref -- and moves exactly that commit's new objects. A push that failed after its uploads
leaves a marker by which the next push finds its packs and sends nothing again."""
from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest
import torch
from remote_helpers import S3Server

from mvc.remote.transfer import NonFastForwardError, push
from mvc.repo.repository import Repo
from mvc.store import RefConflictError
from mvc.store.objstore import Remote, open_remote
from mvc.store.objstore.presence import UPLOADS, unfinished_uploads

#: A tensor of this many float32 values is one loose object (over 1 MiB): new every commit.
BIG = 400_000


def _state(g: torch.Generator, frozen: torch.Tensor) -> dict[str, torch.Tensor]:
    return {"big": torch.randn(BIG, generator=g), "frozen": frozen,
            "w": torch.randn(64, 64, generator=g), "b": torch.randn(64, generator=g)}


def _history(root: Path, n: int) -> tuple[Repo, list[str]]:
    repo = Repo.init(root)
    g = torch.Generator().manual_seed(n)
    frozen = torch.randn(BIG, generator=torch.Generator().manual_seed(0))  # the same in all
    ids = [repo.commit(_state(g, frozen), f"step {i}") for i in range(n)]
    return repo, ids


def _one_more(repo: Repo) -> tuple[str, int, int]:
    """A new commit: (its id, how many objects and bytes it added to the store)."""
    before = set(repo.store.blobs.iter_ids())
    frozen = repo.read_state(repo.head())["frozen"]
    cid = repo.commit(_state(torch.Generator().manual_seed(99), frozen), "one more")
    new = set(repo.store.blobs.iter_ids()) - before
    return cid, len(new), sum(repo.store.blobs.size(o) for o in new)


def _counting(remote: Remote) -> Counter[str]:
    """Count the calls on the remote's storage by operation (and listings by prefix)."""
    calls: Counter[str] = Counter()
    storage = remote.storage
    for op in ("get", "get_range", "head", "put", "list", "delete"):
        real = getattr(storage, op)

        def counted(*args, _op=op, _real=real, **kw):
            calls[_op] += 1
            if _op == "list":
                calls["list " + args[0]] += 1
            return _real(*args, **kw)
        setattr(storage, op, counted)
    return calls


def _url(kind: str, tmp_path: Path, n: int) -> str:
    return S3Server.shared().fresh_url() if kind == "s3" else f"file://{tmp_path / f'remote{n}'}"


@pytest.mark.parametrize("kind", ["file", "s3"])
def test_push_cost_does_not_grow_with_the_remote(kind, tmp_path):
    costs = {}
    for n in (5, 20):
        repo, ids = _history(tmp_path / f"r{n}", n)
        url = _url(kind, tmp_path, n)
        remote = open_remote(url)
        push(repo.odb, remote, {"refs/heads/main": ids[-1]})
        cid, new_objects, new_bytes = _one_more(repo)
        remote = open_remote(url)  # a fresh process's view: no pack index loaded
        calls = _counting(remote)
        if kind == "s3":
            S3Server.shared().reset()
        report = push(repo.odb, remote, {"refs/heads/main": cid})
        assert report.objects == new_objects and report.bytes == new_bytes
        listed = sorted(k[5:] for k in calls if k.startswith("list "))
        # refs/ (branches and tags), and the markers of unfinished pushes: never objects/ or packs/
        assert listed == ["pushes/", "refs/"], listed
        # one HEAD per loose object the walk reached: the new big tensor (the frozen one is the
        # parent's, known without asking)
        assert calls["head"] == 1
        costs[n] = dict(calls)
        if kind == "s3":
            stats = S3Server.shared().stats()
            assert all(p.rsplit("/", 2)[-2] in ("refs", "pushes") for p in stats["list_prefixes"])
            costs[n]["server"] = stats["requests"]
            # its objects, pack indexes, the marker and one ref record: bookkeeping only beyond them
            assert new_bytes <= stats["put_bytes"] <= new_bytes + 4096
        assert open_remote(url).blobs.known_ids() >= {r.oid for r in repo.odb.reachable([cid])}
        assert unfinished_uploads(remote.storage) == []
        repo.close()
    assert costs[5] == costs[20], costs
    assert sum(v for k, v in costs[20].items() if k in ("get", "get_range", "head", "put", "list", "delete")) <= 20


@pytest.mark.parametrize("kind", ["file", "s3"])
def test_a_failed_push_is_resumed_from_its_marker(kind, tmp_path, monkeypatch):
    repo, ids = _history(tmp_path / "r", 3)
    url = _url(kind, tmp_path, 0)
    remote = open_remote(url)
    real = remote.refs.update_ref

    def lost_race(name, old, new, reason):
        if name == "refs/heads/main":
            raise RefConflictError(name, old, None)
        return real(name, old, new, reason)
    monkeypatch.setattr(remote.refs, "update_ref", lost_race)
    with pytest.raises(NonFastForwardError):
        push(repo.odb, remote, {"refs/heads/main": ids[-1]})
    # every object went up, in that push's folder of packs/, and its marker stayed
    [uid] = unfinished_uploads(remote.storage)
    assert any(k.startswith(f"packs/{uid}/") for k, _ in remote.storage.list("packs/"))
    reach = {r.oid for r in repo.odb.reachable([ids[-1]])}
    # a new process resumes: nothing is sent again, and the marker goes
    again = open_remote(url)
    report = push(repo.odb, again, {"refs/heads/main": ids[-1]})
    assert report.objects == 0 and report.skipped == len(reach)
    assert again.refs.read_ref("refs/heads/main") == ids[-1]
    assert list(again.storage.list(UPLOADS)) == []
    repo.close()
