"""push / clone / fetch / pull against file:// and s3:// (moto's server, `remote_helpers`).

A lossy history of 12 commits is pushed, cloned into a fresh directory, and every commit
restores bit-identically to the original repository; one more commit's push sends about
that commit's bytes (counted by the server); two pushers race on one branch; injected 503s
are retried.
"""
from __future__ import annotations

import threading

import pytest
import torch
from cli_helpers import run
from lossy_history import configs, trajectory
from remote_helpers import S3Server, s3_server, same_state  # noqa: F401 - the fixture

from mvc.remote.porcelain import clone
from mvc.remote.transfer import NonFastForwardError, fetch, push
from mvc.repo.repository import Repo
from mvc.store import RefUpdate
from mvc.store.objstore import open_remote

N = 12


@pytest.fixture(scope="module")
def history(tmp_path_factory):
    """A repository with N lossy commits on main and a tag; (repo path, commit ids, states)."""
    root = tmp_path_factory.mktemp("src") / "r"
    repo = Repo.init(root)
    repo.config.set("commit.base_every", 4)
    ids = [repo.commit(state, f"step {t}", quant=configs(t)) for t, state in trajectory(N)]
    repo.tag("v1", ids[5])
    states = {cid: repo.read_state(cid) for cid in ids}
    repo.close()
    return root, ids, states


def url_for(kind: str, tmp_path) -> str:
    if kind == "file":
        return f"file://{tmp_path / 'remote'}"
    return S3Server.shared().fresh_url()


@pytest.mark.parametrize("kind", ["file", "s3"])
def test_push_clone_restores_every_commit(kind, history, tmp_path):
    root, ids, states = history
    url = url_for(kind, tmp_path)
    assert run(root, "remote", "add", f"r-{kind}", url)[0] == 0
    code, out, err = run(root, "push", f"r-{kind}", "main", "v1")
    assert code == 0, err
    assert "refs/heads/main" in out and "(new)" in out
    code, out, err = run(tmp_path, "clone", url, "copy")
    assert code == 0, err
    clone_repo = Repo(tmp_path / "copy")
    assert clone_repo.head() == ids[-1] and clone_repo.current_branch() == "main"
    assert clone_repo.store.refs.read_ref("refs/tags/v1") == ids[5]
    assert [c.id for c in clone_repo.log()] == ids[::-1]
    for cid in ids:
        assert same_state(clone_repo.read_state(cid), states[cid]), cid
    assert clone_repo.fsck().problems == []
    clone_repo.close()
    # a second push of the same refs sends nothing
    code, out, _ = run(root, "push", f"r-{kind}", "main")
    assert code == 0 and "sent 0 objects" in out and "(up to date)" in out


def test_second_push_sends_about_one_commit(history, tmp_path):
    root, ids, states = history
    server = S3Server.shared()
    url = server.fresh_url()
    src = Repo(root)
    work = tmp_path / "w"
    remote = open_remote(url)
    push(src.odb, remote, {"refs/heads/main": ids[-1]})
    # a new commit in a clone, pushed: the server receives about its stored bytes
    res = clone(url, work)
    assert res.commit == ids[-1]
    repo = Repo(work)
    g = torch.Generator().manual_seed(5)
    state = {k: v + (0.002 * torch.randn(v.shape, generator=g)).to(v.dtype) if v.is_floating_point() else v
             for k, v in states[ids[-1]].items()}
    before = set(repo.store.blobs.iter_ids())
    new = repo.commit(state, "one more", quant=configs(1))
    new_bytes = sum(repo.store.blobs.size(o) for o in set(repo.store.blobs.iter_ids()) - before)
    server.reset()
    report = push(repo.odb, remote, {"refs/heads/main": new})
    put_bytes = server.stats()["put_bytes"]
    assert report.bytes == new_bytes
    # the objects plus pack indexes and one ref record: a few hundred bytes of bookkeeping
    assert new_bytes <= put_bytes <= new_bytes + 4096, (new_bytes, put_bytes)
    total = sum(src.store.blobs.size(o) for o in src.store.blobs.iter_ids())
    assert put_bytes < total / 3
    # fetch into the original: it gets exactly that commit's objects
    got = fetch(src.store.blobs, src.store.refs, remote, "s3")
    assert got.bytes == new_bytes
    assert src.store.refs.read_ref("refs/remotes/s3/main") == new
    assert same_state(src.read_state(new), repo.read_state(new))
    repo.close()
    src.close()
    remote.close()


@pytest.mark.parametrize("kind", ["file", "s3"])
def test_racing_pushers_exactly_one_wins(kind, history, tmp_path):
    root, ids, states = history
    url = url_for(kind, tmp_path)
    src = Repo(root)
    push(src.odb, open_remote(url), {"refs/heads/main": ids[3]})
    results: dict[str, object] = {}
    barrier = threading.Barrier(2)

    def pusher(tag: str, target: str) -> None:
        remote = open_remote(url)
        # both read the remote's ref before either moves it
        orig = remote.refs.iter_refs

        def synced(*a, **kw):
            out = list(orig(*a, **kw))
            barrier.wait(30)
            return iter(out)
        remote.refs.iter_refs = synced  # type: ignore[method-assign]
        try:
            results[tag] = push(src.odb, remote, {"refs/heads/main": target})
        except NonFastForwardError as exc:
            results[tag] = exc
    threads = [threading.Thread(target=pusher, args=("a", ids[6])),
               threading.Thread(target=pusher, args=("b", ids[8]))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    errors = [v for v in results.values() if isinstance(v, NonFastForwardError)]
    assert len(errors) == 1 and errors[0].exit_code == 142
    winner = ids[6] if not isinstance(results["a"], Exception) else ids[8]
    assert open_remote(url).refs.read_ref("refs/heads/main") == winner
    src.close()


def test_non_fast_forward_and_force(history, tmp_path):
    root, ids, _ = history
    url = f"file://{tmp_path / 'remote'}"
    assert run(root, "remote", "add", "nf", url)[0] == 0
    assert run(root, "push", "nf", "main")[0] == 0
    assert run(root, "branch", "old", ids[2])[0] == 0
    code, _, err = run(root, "push", "nf", "old")
    assert code == 0, err
    # rewind: pushing an older commit to main is refused, --force allows it
    src = Repo(root)
    remote = open_remote(url)
    with pytest.raises(NonFastForwardError):
        push(src.odb, remote, {"refs/heads/main": ids[2]})
    assert remote.refs.read_ref("refs/heads/main") == ids[-1]
    report = push(src.odb, remote, {"refs/heads/main": ids[2]}, force=True)
    assert report.refs[0].status == "forced" and report.objects == 0
    assert remote.refs.read_ref("refs/heads/main") == ids[2]
    src.close()
    run(root, "branch", "-D", "old")
    run(root, "remote", "remove", "nf")


def test_pull_fast_forwards_and_refuses_divergence(history, tmp_path):
    root, ids, states = history
    url = f"file://{tmp_path / 'remote'}"
    src = Repo(root)
    remote = open_remote(url)
    push(src.odb, remote, {"refs/heads/main": ids[4]})
    res = clone(url, tmp_path / "c")
    assert res.commit == ids[4]
    push(src.odb, remote, {"refs/heads/main": ids[9]})
    code, out, err = run(tmp_path / "c", "pull")
    assert code == 0, err
    assert "fast-forward" in out
    # the hint works in a clone, which has no checkpoint.path (issue 30 item 7)
    hint = out.split("pull: run `", 1)[1].split("`", 1)[0]
    assert hint == "mvc checkout main -o FILE"
    code, _, err = run(tmp_path / "c", *hint.split()[1:-1], str(tmp_path / "pulled.pt"))
    assert code == 0 and (tmp_path / "pulled.pt").is_file(), err
    c = Repo(tmp_path / "c")
    assert c.head() == ids[9]
    # diverge: a local commit, and the remote forced elsewhere
    c.commit(states[ids[1]], "local work", quant=configs(1))
    push(src.odb, remote, {"refs/heads/main": ids[10]}, force=True)
    code, _, err = run(tmp_path / "c", "pull")
    assert code == 142 and "diverged" in err
    # pushing the local commit is refused too
    code, _, err = run(tmp_path / "c", "push")
    assert code == 142 and "rejected" in err
    c.close()
    src.close()


def test_injected_503s_are_retried(history, tmp_path):
    root, ids, states = history
    server = S3Server.shared()
    url = server.fresh_url()
    src = Repo(root)
    remote = open_remote(url)
    server.reset()
    server.fail(6, 503, method="PUT")
    push(src.odb, remote, {"refs/heads/main": ids[-1]})
    assert server.stats()["failed"] == 6
    server.fail(4, 500, method="GET")
    clone(url, tmp_path / "c")
    assert server.stats()["failed"] == 10
    c = Repo(tmp_path / "c")
    assert same_state(c.read_state(ids[-1]), states[ids[-1]])
    c.close()
    src.close()


def test_permanent_errors_are_one_line(history, tmp_path, monkeypatch):
    root, _, _ = history
    S3Server.shared()
    run(root, "remote", "add", "nobucket", "s3://no-such-bucket-x/p")
    code, out, err = run(root, "push", "nobucket")
    assert code == 141 and err.count("\n") == 1 and "no such bucket" in err
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "wrong")
    code, _, err = run(tmp_path, "clone", "s3://no-such-bucket-x/p", "x")
    assert code in (140, 141) and err.count("\n") == 1
    assert not (tmp_path / "x").exists()
    code, _, err = run(root, "push", "nothere")
    assert code == 143
    code, _, err = run(root, "remote", "add", "bad", "ftp://x")
    assert code == 148
    run(root, "remote", "remove", "nobucket")


def test_clone_of_an_empty_remote_and_into_a_used_directory(tmp_path):
    (tmp_path / "nothing").mkdir()
    res = clone(f"file://{tmp_path / 'nothing'}", tmp_path / "empty")
    assert res.branch is None and res.report.objects == 0
    code, _, err = run(tmp_path, "clone", f"file://{tmp_path / 'typo'}", "t")
    assert code == 141 and "no such directory" in err and not (tmp_path / "t").exists()
    (tmp_path / "used").mkdir()
    (tmp_path / "used" / "f").write_text("x")
    code, _, err = run(tmp_path, "clone", f"file://{tmp_path / 'nothing'}", "used")
    assert code == 149 and (tmp_path / "used" / "f").exists()
    assert sorted(p.name for p in (tmp_path / "used").iterdir()) == ["f"]


def test_gc_in_a_clone_keeps_unpushed_and_fetched_history(history, tmp_path):
    root, ids, states = history
    url = f"file://{tmp_path / 'remote'}"
    src = Repo(root)
    push(src.odb, open_remote(url), {"refs/heads/main": ids[-1]})
    src.close()
    clone(url, tmp_path / "c")
    c = Repo(tmp_path / "c")
    # two local commits, never pushed, and main moved away from the fetched history
    local = [c.commit(states[ids[i]], f"local {i}", quant=configs(i)) for i in (1, 2)]
    c.branch("wip")
    c.store.refs.update_refs([RefUpdate("refs/heads/main", local[-1], ids[0])], "reset")
    report = c.gc()
    assert c.fsck().problems == []
    for cid in local:  # on branch wip (and in HEAD's reflog)
        assert c.read_commit(cid).id == cid
    # refs/remotes/origin/main keeps the fetched history readable
    assert c.store.refs.read_ref("refs/remotes/origin/main") == ids[-1]
    assert same_state(c.read_state(ids[-1]), states[ids[-1]])
    assert report.kept_objects > 0
    c.close()


def test_access_denied_is_one_line_and_tags_do_not_move(history, tmp_path):
    root, ids, _ = history
    server = S3Server.shared()
    url = server.fresh_url()
    assert run(root, "remote", "add", "deny", url)[0] == 0
    server.fail(1, 403)
    code, _, err = run(root, "push", "deny", "main")
    assert code == 140 and err.count("\n") == 1 and "access denied" in err
    assert run(root, "push", "deny", "main", "v1")[0] == 0
    # an existing tag on the remote is not moved without --force
    src = Repo(root)
    remote = open_remote(url)
    with pytest.raises(NonFastForwardError):
        push(src.odb, remote, {"refs/tags/v1": ids[7]})
    push(src.odb, remote, {"refs/tags/v1": ids[7]}, force=True)
    assert remote.refs.read_ref("refs/tags/v1") == ids[7]
    src.close()
    run(root, "remote", "remove", "deny")


def test_fetch_ignores_refs_it_cannot_take(history, tmp_path):
    root, ids, _ = history
    url = f"file://{tmp_path / 'remote'}"
    src = Repo(root)
    remote = open_remote(url)
    push(src.odb, remote, {"refs/heads/main": ids[2]})
    remote.refs.update_ref("refs/heads/bad..name", None, ids[1], "by hand")
    remote.refs.update_ref("refs/heads/sym", None, "ref: refs/heads/main", "by hand")
    remote.refs.update_ref("refs/notes/x", None, ids[0], "by hand")
    report = fetch(src.store.blobs, src.store.refs, remote, "hand")
    assert [r.ref for r in report.refs] == ["refs/remotes/hand/main"]
    src.close()


class Recorder:
    """A `mvc.progress.Progress` that keeps what it is told."""

    def __init__(self) -> None:
        self.phases: list[dict] = []

    def phase(self, description, *, total_bytes=None, total_items=None, unit="tensors") -> None:
        self.phases.append({"d": description, "total_bytes": total_bytes, "total_items": total_items,
                            "bytes": 0, "items": 0})

    def advance(self, nbytes=0, items=0) -> None:
        self.phases[-1]["bytes"] += nbytes
        self.phases[-1]["items"] += items

    def end(self) -> None:
        pass


def test_push_and_fetch_report_progress(history, tmp_path):
    root, ids, _ = history
    src = Repo(root)
    remote = open_remote(f"file://{tmp_path / 'remote'}")
    rec = Recorder()
    report = push(src.odb, remote, {"refs/heads/main": ids[-1]}, progress=rec)
    sending = [p for p in rec.phases if p["d"].startswith("pushing")]
    assert len(sending) == 1 and sending[0]["bytes"] == sending[0]["total_bytes"] == report.bytes
    assert sending[0]["items"] == sending[0]["total_items"] == report.objects
    src.close()
    dest = Repo.init(tmp_path / "d")
    rec = Recorder()
    got = fetch(dest.store.blobs, dest.store.refs, remote, "o", progress=rec)
    receiving = [p for p in rec.phases if p["d"].startswith("fetching")]
    assert receiving[0]["items"] == receiving[0]["total_items"] == got.objects == report.objects
    assert got.bytes == report.bytes
    dest.close()


def test_connection_resets_are_retried(history, tmp_path):
    root, ids, states = history
    server = S3Server.shared()
    url = server.fresh_url()
    src = Repo(root)
    server.reset()
    server.fail(3, 0, method="PUT")
    push(src.odb, open_remote(url), {"refs/heads/main": ids[-1]})
    server.fail(3, 0, method="GET")
    clone(url, tmp_path / "c")
    assert server.stats()["failed"] == 6
    c = Repo(tmp_path / "c")
    assert same_state(c.read_state(ids[-1]), states[ids[-1]])
    c.close()
    src.close()


def test_remote_add_list_remove(tmp_path):
    Repo.init(tmp_path / "r").close()
    r = tmp_path / "r"
    assert run(r, "remote", "add", "origin", "file:///srv/x")[0] == 0
    assert run(r, "remote", "add", "backup", "s3://bucket-1/runs/a")[0] == 0
    assert run(r, "remote")[1] == "backup\norigin\n"
    assert run(r, "remote", "-v")[1] == "backup  s3://bucket-1/runs/a\norigin  file:///srv/x\n"
    code, _, err = run(r, "remote", "add", "origin", "file:///elsewhere")
    assert code == 145 and err.count("\n") == 1
    assert run(r, "remote", "add", "bad name", "file:///y")[0] == 2
    assert run(r, "remote", "remove", "origin")[0] == 0
    assert run(r, "remote", "remove", "origin")[0] == 143
    assert run(r, "remote", "-v")[1] == "backup  s3://bucket-1/runs/a\n"


def test_ref_write_whose_answer_was_lost(history, tmp_path):
    """The server applies a conditional ref write, then the connection drops: the client retries,
    the retry fails its own If-Match, and the ref store finds its own record there: done."""
    root, ids, _ = history
    server = S3Server.shared()
    remote = open_remote(server.fresh_url())
    src = Repo(root)
    push(src.odb, remote, {"refs/heads/main": ids[3]})
    server.reset()
    server.fail(1, -1, method="PUT", path="refs%252Fheads%252Fmain")
    report = push(src.odb, remote, {"refs/heads/main": ids[6]})
    assert server.stats()["failed"] == 1
    assert report.refs[0].status == "fast-forward"
    assert remote.refs.read_ref("refs/heads/main") == ids[6]
    assert [(e.old, e.new) for e in remote.refs.reflog("refs/heads/main")] == [(None, ids[3]), (ids[3], ids[6])]
    src.close()
