"""Fetching only what a checkout needs (issue 28, item 4), on file:// and on moto's S3 server.

A lossy history of 20 commits (small tensors, deltas against the parent, a base every 4) is
pushed.  `clone --depth 1` restores HEAD bit-identically to a full clone, moving at most 1.2x
HEAD's own stored bytes -- the stored bytes of the objects its checkpoint needs: the commit,
its snapshot, the snapshots its deltas are encoded against down to their bases, and all their
chunks (`ObjectDB.reachable([HEAD], depth=1)`) -- counted on the server (moto's GET bytes,
listings included) or, on file://, at the storage's reads.  fsck is clean on the shallow clone,
gc keeps what HEAD needs, and `fetch --unshallow` completes the history.  `fetch REMOTE REV`
takes one commit; `checkout --remote` restores without a clone what a local checkout does.
"""
from __future__ import annotations

from pathlib import Path

import pytest
import torch
from cli_helpers import init_work, run
from lossy_history import configs, trajectory
from remote_helpers import S3Server, same_state

from mvc.remote import open_remote_repo
from mvc.remote.porcelain import clone
from mvc.remote.remote_refs import BadRemoteRefError
from mvc.remote.shallow import BadDepthError, UnknownRemoteRevisionError, Want
from mvc.remote.transfer import ShallowPushError, fetch, push
from mvc.repo.repository import Repo
from mvc.repo.shallow import SHALLOW, BeyondShallowError
from mvc.store.objstore import open_remote
from mvc.store.objstore.local import FileStorage

N = 20


@pytest.fixture(scope="module")
def history(tmp_path_factory):
    """(repo path, commit ids, the states they restore, HEAD's stored bytes, all stored bytes)."""
    root = tmp_path_factory.mktemp("src") / "r"
    repo = Repo.init(root)
    repo.config.set("commit.base_every", 4)
    ids = [repo.commit(state, f"step {t}", quant=configs(t)) for t, state in trajectory(N)]
    states = {cid: repo.read_state(cid) for cid in ids}
    size = repo.store.blobs.size
    needed = sum(size(r.oid) for r in repo.odb.reachable([ids[-1]], depth=1))
    everything = sum(size(r.oid) for r in repo.odb.reachable([ids[-1]]))
    repo.close()
    return root, ids, states, needed, everything


@pytest.fixture(params=["file", "s3"])
def remote_url(request, history, tmp_path):
    """A remote holding the history's main, freshly pushed."""
    root = history[0]
    url = f"file://{tmp_path / 'remote'}" if request.param == "file" else S3Server.shared().fresh_url()
    repo = Repo(root)
    try:
        push(repo.odb, open_remote(url), {"refs/heads/main": history[1][-1]})
    finally:
        repo.close()
    return url


class ReadBytes:
    """Bytes the remote served: moto's count of GET answers (its server side), or on file://
    what the storage's reads returned."""

    def __init__(self, url: str, monkeypatch: pytest.MonkeyPatch) -> None:
        self.s3 = url.startswith("s3://")
        self.n = 0
        if self.s3:
            S3Server.shared().reset()
            return
        for op in ("get", "get_range"):
            real = getattr(FileStorage, op)

            def counted(storage, *args, _real=real, **kw):
                got = _real(storage, *args, **kw)
                self.n += len(got.data) if hasattr(got, "data") else len(got or b"")
                return got
            monkeypatch.setattr(FileStorage, op, counted)
        real_iter = FileStorage.iter_range

        def pieces(storage, *args, **kw):
            for piece in real_iter(storage, *args, **kw):
                self.n += len(piece)
                yield piece
        monkeypatch.setattr(FileStorage, "iter_range", pieces)

    @property
    def total(self) -> int:
        return S3Server.shared().stats()["get_bytes"] if self.s3 else self.n


def test_depth_1_clone_moves_about_one_commit_and_restores_it(history, remote_url, tmp_path, monkeypatch):
    root, ids, states, needed, everything = history
    read = ReadBytes(remote_url, monkeypatch)
    res = clone(remote_url, tmp_path / "shallow", depth=1)
    moved = read.total
    print(f"depth-1 clone of a {N}-commit history: {moved} bytes read, HEAD needs {needed}, "
          f"the history is {everything}")
    assert moved <= 1.2 * needed, (moved, needed)
    assert needed < 0.6 * everything  # a base every 4 commits: far from the whole history
    monkeypatch.undo()
    full = clone(remote_url, tmp_path / "full")
    with Repo(res.path) as sh, Repo(full.path) as fl:
        assert res.commit == ids[-1] and sh.odb.shallow_ids() == {ids[-1]}
        assert same_state(sh.read_state("main"), fl.read_state("main"))
        assert same_state(sh.read_state("main"), states[ids[-1]])
        assert [c.id for c in sh.log()] == [ids[-1]]
        assert sh.fsck().ok, sh.fsck().problems
        with pytest.raises(BeyondShallowError):
            sh.resolve("HEAD~1")
        with pytest.raises(BeyondShallowError):
            sh.resolve(ids[-2])  # an older commit's id: behind the boundary
        # gc keeps what HEAD needs, and the boundary mark
        report = sh.gc()
        assert report.removed_objects == 0
        assert sh.odb.shallow_ids() == {ids[-1]}
        assert same_state(sh.read_state("main"), states[ids[-1]])
        assert sh.fsck().ok
        # a plain fetch completes the history and clears the boundary
        remote = open_remote(remote_url)
        done = fetch(sh.store.blobs, sh.store.refs, remote, "origin")
        remote.close()
        assert done.unshallowed == {ids[-1]} and not done.shallow
        assert sh.odb.shallow_ids() == set()
        assert [c.id for c in sh.log()] == ids[::-1]
        assert sh.fsck().ok, sh.fsck().problems
        assert same_state(sh.read_state("main~7"), states[ids[-8]])
        assert set(sh.store.blobs.iter_ids()) == set(fl.store.blobs.iter_ids())


def test_fetch_of_one_revision(history, remote_url, tmp_path):
    root, ids, states, _, _ = history
    repo = Repo.init(tmp_path / "r")
    remote = open_remote(remote_url)
    try:
        report = fetch(repo.store.blobs, repo.store.refs, remote, "origin", want=Want(depth=1, rev=ids[9]))
        assert report.fetch_head == ids[9] and report.shallow == {ids[9]}
        assert same_state(repo.read_state("FETCH_HEAD"), states[ids[9]])
        assert repo.fsck().ok
        # a branch: its remote-tracking ref, two commits deep
        report = fetch(repo.store.blobs, repo.store.refs, remote, "origin", want=Want(depth=2, rev="main"))
        assert repo.store.refs.read_ref("refs/remotes/origin/main") == ids[-1]
        assert repo.odb.shallow_ids() == {ids[9], ids[-2]}
        assert [c.id for c in repo.log("origin/main")] == [ids[-1], ids[-2]]
        assert same_state(repo.read_state("origin/main~1"), states[ids[-2]])
        # revisions spelled as in a repository, on the remote's refs
        report = fetch(repo.store.blobs, repo.store.refs, remote, "origin", want=Want(depth=1, rev="main~5"))
        assert report.fetch_head == ids[-6]
        with pytest.raises(UnknownRemoteRevisionError):
            fetch(repo.store.blobs, repo.store.refs, remote, "origin", want=Want(depth=1, rev="no-such"))
        with pytest.raises(BadDepthError):
            Want(depth=0)
        assert repo.fsck().ok
        repo.gc()
        assert repo.fsck().ok and same_state(repo.read_state(ids[9]), states[ids[9]])
    finally:
        remote.close()
        repo.close()


def test_remote_checkout_equals_the_local_one(history, remote_url, tmp_path, monkeypatch):
    root, ids, states, needed, _ = history
    read = ReadBytes(remote_url, monkeypatch)
    with open_remote_repo(remote_url) as remote_repo:
        assert remote_repo.resolve("HEAD") == ids[-1]
        got = remote_repo.read_state("main")
    moved = read.total
    print(f"checkout --remote of HEAD: {moved} bytes read, HEAD needs {needed}")
    assert same_state(got, states[ids[-1]])
    # what the tensors' delta chains need, not every chunk of the snapshots they pass through
    # (a delta parent's exact tensors): less than a shallow clone moves
    assert moved < needed, (moved, needed)
    monkeypatch.undo()
    with open_remote_repo(remote_url, cache_dir=tmp_path / "cache") as remote_repo:
        assert same_state(remote_repo.read_state(ids[12]), states[ids[12]])
    with open_remote_repo(remote_url, cache_dir=tmp_path / "cache") as remote_repo:
        assert same_state(remote_repo.read_state("main~7"), states[ids[12]])
    (tmp_path / "w").mkdir()
    work = init_work(tmp_path / "w")
    assert run(work, "remote", "add", "origin", remote_url)[0] == 0
    code, out, err = run(work, "checkout", "--remote", "origin", "main~2", "-o", "ckpt.pt")
    assert code == 0, err
    assert same_state(torch.load(work / "ckpt.pt", weights_only=True), states[ids[-3]])
    with Repo(root) as src:
        assert same_state(torch.load(work / "ckpt.pt", weights_only=True), src.read_state("main~2"))
    code, out, err = run(work, "checkout", "--remote", "origin", "no-such", "-o", "y.pt")
    assert code == 182 and "no-such" in err and not (work / "y.pt").exists()
    # without a repository: the URL
    code, out, err = run(tmp_path, "checkout", "--remote", remote_url, ids[4], "-o", "x.pt")
    assert code == 0, err
    assert same_state(torch.load(tmp_path / "x.pt", weights_only=True), states[ids[4]])


def test_cli_shallow_clone_errors_and_unshallow(history, remote_url, tmp_path):
    root, ids, states, _, _ = history
    code, out, err = run(tmp_path, "clone", "--depth", "0", remote_url, "bad")
    assert code == 181 and "--depth" in err and not (tmp_path / "bad").exists()
    code, out, err = run(tmp_path, "clone", "--depth", "1", remote_url, "c")
    assert code == 0, err
    assert "shallow: history stops at" in out
    c = tmp_path / "c"
    code, out, err = run(c, "log", "--oneline")
    assert code == 0 and "grafted" in out and len(out.splitlines()) == 1
    code, out, err = run(c, "checkout", "HEAD~1", "-o", "old.pt")
    assert code == 180 and "Traceback" not in err and "--unshallow" in err
    code, out, err = run(c, "fetch", "origin", "no-such")
    assert code == 182 and "no-such" in err
    code, out, err = run(c, "fsck")
    assert code == 0, out + err
    # a push to a remote without the history is refused before anything is sent
    other = f"file://{tmp_path / 'other'}"
    assert run(c, "remote", "add", "other", other)[0] == 0
    code, out, err = run(c, "push", "other", "main")
    assert code == 183 and "shallow" in err
    assert not (tmp_path / "other" / "refs").exists()
    code, out, err = run(c, "fetch", "--unshallow")
    assert code == 0, err
    assert "no longer shallow" in out
    code, out, err = run(c, "log", "--oneline")
    assert len(out.splitlines()) == N and "grafted" not in out
    assert run(c, "fsck")[0] == 0
    code, out, err = run(c, "fetch", "--unshallow")
    assert code == 2 and "not shallow" in err


def test_a_mark_without_its_commit_is_harmless(tmp_path):
    """A fetch killed between writing a boundary mark and storing the commit leaves a mark on
    nothing: fsck is clean, gc drops it."""
    repo = Repo.init(tmp_path / "r")
    cid = repo.commit({"w": torch.ones(3)}, "one", lossless=True)
    ghost = "0" * 31 + "1"
    repo.store.refs.update_ref(SHALLOW + ghost, None, ghost, "fetch: killed")
    assert repo.fsck().ok
    assert repo.resolve("HEAD") == cid
    repo.gc()
    assert repo.store.refs.read_ref(SHALLOW + ghost) is None
    assert repo.fsck().ok
    repo.close()


def test_shallow_push_to_the_origin_works(history, remote_url, tmp_path):
    """A commit made on a shallow clone pushes to the remote it came from (which has the
    history below the boundary)."""
    root, ids, states, _, _ = history
    res = clone(remote_url, tmp_path / "c", depth=1)
    with Repo(res.path) as repo:
        cid = repo.commit({"w": torch.ones(4)}, "on top", lossless=True)
        remote = open_remote(remote_url)
        report = push(repo.odb, remote, {"refs/heads/main": cid})
        assert report.refs[0].status == "fast-forward"
        other = open_remote(f"file://{tmp_path / 'other'}")
        with pytest.raises(ShallowPushError):
            push(repo.odb, other, {"refs/heads/main": cid})
        remote.close()
        other.close()
    again = clone(remote_url, Path(tmp_path / "again"))
    with Repo(again.path) as repo:
        assert repo.fsck().ok and len(repo.log()) == N + 1


def test_a_revision_whose_history_is_damaged_on_the_remote_fails_by_name(history, tmp_path):
    root, ids, _, _, _ = history
    url = f"file://{tmp_path / 'remote'}"
    with Repo(root) as src:
        push(src.odb, open_remote(url), {"refs/heads/main": ids[-1]})
    for pack in (tmp_path / "remote" / "packs").rglob("*.pack"):  # every small object unreadable
        pack.write_bytes(bytes(len(pack.read_bytes())))
    repo = Repo.init(tmp_path / "r")
    remote = open_remote(url)
    try:
        with pytest.warns(UserWarning), pytest.raises(BadRemoteRefError):
            fetch(repo.store.blobs, repo.store.refs, remote, "origin", want=Want(depth=1, rev="main"))
        assert list(repo.store.blobs.iter_ids()) == [] and repo.odb.shallow_ids() == set()
    finally:
        remote.close()
        repo.close()


def test_a_plain_fetch_completes_a_deeper_shallow_clone(history, remote_url, tmp_path):
    """The boundary is below the tip: the fetch walks down through the commits held above it
    (not taking them as held with their history) and brings the rest."""
    root, ids, states, _, _ = history
    res = clone(remote_url, tmp_path / "c", depth=3)
    with Repo(res.path) as repo:
        assert repo.odb.shallow_ids() == {ids[-3]}
        assert [c.id for c in repo.log()] == ids[:-4:-1]
        before = set(repo.store.blobs.iter_ids())
        remote = open_remote(remote_url)
        report = fetch(repo.store.blobs, repo.store.refs, remote, "origin")
        remote.close()
        with Repo(root) as src:
            every = {r.oid for r in src.odb.reachable([ids[-1]])}
        assert set(repo.store.blobs.iter_ids()) == every
        assert report.objects == len(every - before)  # nothing held came again
        assert report.unshallowed == {ids[-3]} and repo.odb.shallow_ids() == set()
        assert [c.id for c in repo.log()] == ids[::-1]
        assert repo.fsck().ok
        assert same_state(repo.read_state(ids[0]), states[ids[0]])
