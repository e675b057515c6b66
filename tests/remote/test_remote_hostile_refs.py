"""A remote is untrusted (issue 25, defects 1 and 5): what a fetch takes of its refs.

* A ``refs/replace/`` ref pushed by anyone must never change what a commit restores: a
  victim who fetches or clones keeps restoring the original tensors, fsck says so, and gc
  keeps the original's data (also in a repository where an older mvc adopted such a ref).
* A ``refs/pruned/`` mark must not make a commit held here unreadable.
* One bad ref on a remote (a record that does not decode, a name with a newline, a branch
  naming a missing commit, a tag naming a snapshot) is skipped with a warning naming it;
  the good refs are fetched; `mvc pull` of the bad branch by name fails.

Each runs against file:// and s3:// (moto's server).
"""
from __future__ import annotations

import pytest
import torch
from cli_helpers import run
from remote_helpers import S3Server, s3_server  # noqa: F401 - the fixture

from mvc.remote.porcelain import clone
from mvc.remote.transfer import fetch, push
from mvc.repo.pruned import PRUNED
from mvc.repo.replace import REPLACE
from mvc.repo.repository import Repo
from mvc.store.objstore import open_remote
from mvc.store.objstore.refs import ref_key

KINDS = ["file", "s3"]


def url_for(kind: str, tmp_path) -> str:
    if kind == "file":
        return f"file://{tmp_path / 'remote'}"
    return S3Server.shared().fresh_url()


def bits(t: torch.Tensor) -> bytes:
    return t.contiguous().view(-1).view(torch.uint8).numpy().tobytes()


def same(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(bits(a[k]) == bits(b[k]) for k in a)


def honest_state(t: int) -> dict:
    g = torch.Generator().manual_seed(t)
    return {"w": torch.randn(64, 48, generator=g), "b": torch.full((5,), float(t))}


def evil_state() -> dict:
    return {"w": torch.full((64, 48), 7.0), "b": torch.full((5,), -1.0)}


@pytest.fixture
def honest(tmp_path):
    """An honest repository with two commits pushed to a remote; (repo path, url, ids)."""
    def make(kind: str):
        root = tmp_path / "honest"
        repo = Repo.init(root)
        repo.config.set("commit.mode", "lossless")
        ids = [repo.commit(honest_state(t), f"step {t}") for t in range(2)]
        url = url_for(kind, tmp_path)
        remote = open_remote(url)
        push(repo.odb, remote, {"refs/heads/main": ids[-1]})
        remote.close()
        repo.close()
        return root, url, ids
    return make


def inject_replacement(tmp_path, url: str, victim_commit: str) -> str:
    """A second pusher: pushes a branch of its own, then points refs/replace/<the victim
    commit's snapshot> at its own snapshot. Returns the replaced snapshot id."""
    root = tmp_path / "attacker"
    clone(url, root)
    repo = Repo(root)
    repo.config.set("commit.mode", "lossless")
    evil = repo.commit(evil_state(), "evil")
    remote = open_remote(url)
    push(repo.odb, remote, {"refs/heads/evil": evil})
    target = repo.odb.read_commit(evil).snapshot
    sid = repo.odb.read_commit(victim_commit).snapshot
    remote.refs.update_ref(REPLACE + sid, None, target, "push")
    remote.close()
    repo.close()
    return sid


@pytest.mark.parametrize("kind", KINDS)
def test_hostile_replacement_never_changes_an_old_commit(kind, honest, tmp_path):
    root, url, ids = honest(kind)
    victim = tmp_path / "victim"
    clone(url, victim)
    sid = inject_replacement(tmp_path, url, ids[0])

    code, _, err = run(victim, "fetch")
    assert code == 0, err
    assert f"refs/replace/{sid}" in err and "refused" in err
    repo = Repo(victim)
    assert repo.store.refs.read_ref(REPLACE + sid) is None
    assert same(repo.read_state(ids[0]), honest_state(0))
    repo.close()

    assert run(victim, "fsck")[0] == 0
    out_file = victim / "old.pt"
    assert run(victim, "checkout", ids[0], "-o", str(out_file))[0] == 0
    assert same(torch.load(out_file), honest_state(0))
    code, _, err = run(victim, "gc")
    assert code == 0, err
    repo = Repo(victim)
    assert same(repo.read_state(ids[0]), honest_state(0))
    repo.close()
    assert run(victim, "fsck")[0] == 0

    # A clone made after the injection refuses it too: the remote holds the original.
    fresh = tmp_path / "fresh"
    res = clone(url, fresh)
    assert REPLACE + sid in res.report.skipped_refs
    repo = Repo(fresh)
    assert repo.store.refs.read_ref(REPLACE + sid) is None
    assert same(repo.read_state(ids[0]), honest_state(0))
    repo.close()


def test_replacement_an_older_fetch_adopted_is_dropped_by_gc(honest, tmp_path):
    """A repository where an older mvc's fetch took a hostile replacement: fsck names it,
    gc checks it, drops it and keeps the original's data; the commit restores as it was."""
    root, url, ids = honest("file")
    victim = tmp_path / "victim"
    clone(url, victim)
    sid = inject_replacement(tmp_path, url, ids[0])
    repo = Repo(victim)
    target = open_remote(url).refs.read_ref(REPLACE + sid)
    # What the older fetch did: the objects, then the ref with a fetch's reason.
    remote = open_remote(url)
    evil_tip = remote.refs.read_ref("refs/heads/evil")
    fetch(repo.store.blobs, repo.store.refs, remote, "origin")
    remote.close()
    assert repo.store.blobs.has(target) and repo.store.blobs.has(evil_tip)
    repo.store.refs.update_ref(REPLACE + sid, None, target, "fetch: origin")
    assert not same(repo.read_state(ids[0]), honest_state(0))  # what the defect did
    repo.close()

    code, out, err = run(victim, "fsck")
    assert code != 0 and REPLACE + sid in out + err
    code, _, err = run(victim, "gc")
    assert code == 0, err
    assert "dropped" in err and sid in err
    repo = Repo(victim)
    assert repo.store.refs.read_ref(REPLACE + sid) is None
    assert same(repo.read_state(ids[0]), honest_state(0))
    repo.close()
    assert run(victim, "fsck")[0] == 0


def test_gc_dry_run_keeps_an_unverified_originals_data(honest, tmp_path):
    root, url, ids = honest("file")
    victim = tmp_path / "victim"
    clone(url, victim)
    sid = inject_replacement(tmp_path, url, ids[0])
    repo = Repo(victim)
    remote = open_remote(url)
    fetch(repo.store.blobs, repo.store.refs, remote, "origin")
    target = remote.refs.read_ref(REPLACE + sid)
    remote.close()
    repo.store.refs.update_ref(REPLACE + sid, None, target, "fetch: origin")
    report = repo.gc(dry_run=True)
    assert report.removed_objects == 0  # nothing of the original is counted as garbage
    repo.close()


@pytest.mark.parametrize("kind", KINDS)
def test_a_remote_cannot_prune_a_commit_held_here(kind, honest, tmp_path):
    root, url, ids = honest(kind)
    victim = tmp_path / "victim"
    clone(url, victim)
    remote = open_remote(url)
    remote.refs.update_ref(PRUNED + ids[0], None, ids[0], "push")
    remote.close()
    code, _, err = run(victim, "fetch")
    assert code == 0 and PRUNED + ids[0] in err
    assert run(victim, "gc")[0] == 0
    repo = Repo(victim)
    assert repo.store.refs.read_ref(PRUNED + ids[0]) is None
    assert same(repo.read_state(ids[0]), honest_state(0))
    repo.close()


def plant_bad_refs(url: str, ids: list[str], snapshot: str) -> dict[str, str]:
    """Four kinds of bad ref next to a good main: {ref as named in warnings: what it is}."""
    remote = open_remote(url)
    storage = remote.storage
    storage.put(ref_key("refs/heads/corrupt"), b"{not json")
    storage.put(ref_key("refs/heads/new\nline"),
                b'{"value":"%s","log":[]}' % ids[0].encode())
    remote.refs.update_ref("refs/heads/gone", None, "0" * 32, "by hand")
    remote.refs.update_ref("refs/tags/snap", None, snapshot, "by hand")
    remote.close()
    return {"refs/heads/corrupt": "corrupt", "refs/heads/new\\nline": "newline",
            "refs/heads/gone": "missing commit", "refs/tags/snap": "a snapshot"}


@pytest.mark.parametrize("kind", KINDS)
def test_bad_refs_are_skipped_and_the_good_ones_taken(kind, honest, tmp_path):
    root, url, ids = honest(kind)
    repo = Repo(root)
    snapshot = repo.odb.read_commit(ids[0]).snapshot
    repo.close()
    bad = plant_bad_refs(url, ids, snapshot)

    dest = tmp_path / "c"
    code, out, err = run(tmp_path, "clone", url, str(dest))
    assert code == 0, err
    for name in bad:
        assert name in err, (name, err)
    repo = Repo(dest)
    assert repo.store.refs.read_ref("refs/heads/main") == ids[-1]
    assert same(repo.read_state(ids[0]), honest_state(0))
    assert repo.store.refs.read_ref("refs/tags/snap") is None
    assert repo.store.refs.read_ref("refs/remotes/origin/gone") is None
    repo.close()

    code, _, err = run(dest, "fetch")
    assert code == 0 and "refs/heads/gone" in err
    code, _, err = run(dest, "pull", "origin", "gone")
    assert code == 178 and "gone" in err
    assert run(dest, "pull", "origin", "main")[0] == 0


def test_a_replacement_already_here_is_neither_checked_nor_warned_about(tmp_path):
    """The remote holds the very replacement this repository's own gc made (same history, same
    re-encoding): the fetch leaves it as it is and skips nothing."""
    from lossy_history import configs, trajectory

    src = Repo.init(tmp_path / "src")
    src.config.set("commit.base_every", 100)
    ids = [src.commit(state, f"step {t}", quant=configs(t)) for t, state in trajectory(6)]
    want = {c: src.read_state(c) for c in ids}
    first, second = f"file://{tmp_path / 'r1'}", f"file://{tmp_path / 'r2'}"
    remote = open_remote(first)
    push(src.odb, remote, {"refs/heads/main": ids[-1]})
    remote.close()
    clone(first, tmp_path / "c")
    src.gc(max_chain=1)
    remote = open_remote(second)
    push(src.odb, remote, {"refs/heads/main": ids[-1]})
    src.close()

    repo = Repo(tmp_path / "c")
    repo.gc(max_chain=1)
    mine = dict(repo.store.refs.iter_refs(REPLACE))
    assert mine and mine == dict(remote.refs.iter_refs(REPLACE))
    report = fetch(repo.store.blobs, repo.store.refs, remote, "second")
    remote.close()
    assert report.skipped_refs == {}
    assert dict(repo.store.refs.iter_refs(REPLACE)) == mine
    assert all(same(repo.read_state(c), want[c]) for c in ids)
    repo.close()
