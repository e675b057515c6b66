"""Remote branches like git's (issue 30 item 1), through the CLI, on file:// and on moto's S3:
`origin/NAME` and `refs/remotes/origin/NAME` are read-only revisions everywhere; `branch -r/-a`
list them; a clone's branch follows `origin/main` and `switch NAME` makes a branch following
`origin/NAME`; `push --all/--tags/-u`; `status` says ahead / behind / diverged from local refs;
and the clone's hint (`mvc checkout main -o FILE`, item 7) works as printed.
"""
from __future__ import annotations

import json
import shutil

import pytest
import torch
from cli_helpers import init_work, run
from remote_helpers import S3Server, s3_server  # noqa: F401 - the fixture

from mvc.repo.repository import Repo

KINDS = ["file", "s3"]


def url_for(kind: str, tmp_path) -> str:
    return f"file://{tmp_path / 'remote'}" if kind == "file" else S3Server.shared().fresh_url()


def ok(cwd, *args) -> str:
    code, out, err = run(cwd, *args)
    assert code == 0, (args, out, err)
    return out


def commit(cwd, message: str, value: float) -> str:
    """Commit a small checkpoint holding `value`; returns the new commit's id."""
    torch.save({"w": torch.full((8,), value)}, cwd / "c.pt")
    ok(cwd, "commit", "-m", message, "c.pt")
    return Repo(cwd).head()


def ids(cwd, rev: str) -> list[str]:
    return [c["id"] for c in json.loads(ok(cwd, "log", "--json", rev))]


@pytest.fixture
def origin(tmp_path):
    """A repository with main (2 commits), exp (one more) and tag v1 on main; (its path,
    main's commit, exp's commit)."""
    (tmp_path / "a").mkdir()
    a = init_work(tmp_path / "a", {"commit.mode": "lossless"})
    commit(a, "one", 1.0)
    main = commit(a, "two", 2.0)
    ok(a, "switch", "-c", "exp")
    exp = commit(a, "three", 3.0)
    ok(a, "tag", "v1", "main")
    ok(a, "switch", "main")
    return a, main, exp


def published(kind, tmp_path, origin) -> str:
    """Push `origin`'s branches (--all) and tags (--tags) to a new remote; its URL."""
    a, main, exp = origin
    url = url_for(kind, tmp_path)
    ok(a, "remote", "add", "origin", url)
    out = ok(a, "push", "--all")
    assert "refs/heads/main" in out and "refs/heads/exp" in out and "refs/tags/v1" not in out
    out = ok(a, "push", "--tags")
    assert "refs/tags/v1" in out and "refs/heads" not in out
    return url


@pytest.mark.parametrize("kind", KINDS)
def test_remote_branches_are_read_only_revisions(kind, tmp_path, origin):
    a, main, exp = origin
    url = published(kind, tmp_path, origin)
    out = ok(tmp_path, "clone", url, "b")
    b = tmp_path / "b"
    assert "tracking 'origin/main'" in out and "origin/exp" in out
    # item 7: the hint names a file, and works in a fresh clone (no checkpoint.path)
    assert "`mvc checkout main -o FILE`" in out
    assert "Wrote" in ok(b, "checkout", "main", "-o", "main.pt")
    assert torch.equal(torch.load(b / "main.pt")["w"], torch.full((8,), 2.0))
    # the clone shows its branch, and the remote's as git does
    assert [line.split()[:2] for line in ok(b, "branch").splitlines()] == [["*", "main"]]
    assert [line.split()[0] for line in ok(b, "branch", "-r").splitlines()] == ["origin/exp", "origin/main"]
    listing = ok(b, "branch", "-a").splitlines()
    assert listing[0].startswith("* main ")
    assert [line[:2] + line.split()[0] for line in listing[1:]] == ["  remotes/origin/exp", "  remotes/origin/main"]
    # origin/NAME and refs/remotes/origin/NAME wherever a revision is taken
    assert ids(b, "origin/exp")[0] == exp and ids(b, "refs/remotes/origin/main")[0] == main
    assert ids(b, "origin/exp~1")[0] == main
    assert json.loads(ok(b, "show", "--json", "origin/exp"))["id"] == exp
    assert "w" in ok(b, "diff", "origin/main", "refs/remotes/origin/exp")
    assert "origin/exp" in ok(b, "log", "--oneline", "--all")
    assert "origin/main@{0}" in ok(b, "reflog", "origin/main")
    out = ok(b, "branch", "topic", "origin/exp")
    assert "branch 'topic' set up to track 'origin/exp'." in out
    assert ids(b, "topic")[0] == exp
    # read-only: checkout detaches HEAD; a commit there moves HEAD, never origin/exp
    ok(b, "config", "commit.mode", "lossless")
    ok(b, "config", "checkpoint.path", "c.pt")
    assert "HEAD detached at" in ok(b, "checkout", "origin/exp")
    detached = commit(b, "on top of origin/exp", 4.0)
    refs = Repo(b).store.refs
    assert refs.read_ref("refs/remotes/origin/exp") == exp and Repo(b).head() == detached
    assert Repo(b).current_branch() is None
    code, _, err = run(b, "switch", "origin/exp")
    assert code == 101 and "remote-tracking branch" in err and "mvc switch exp" in err
    code, _, err = run(b, "branch", "-d", "origin/exp")
    assert code == 101 and "-d -r" in err
    # git's precedence: a local branch named origin/exp wins over the remote-tracking one
    ok(b, "branch", "origin/exp", "main")
    assert ids(b, "origin/exp")[0] == main and ids(b, "refs/remotes/origin/exp")[0] == exp
    assert "Deleted remote-tracking branch origin/exp" in ok(b, "branch", "-d", "-r", "origin/exp")
    assert refs.read_ref("refs/remotes/origin/exp") is None
    ok(b, "fetch")  # the remote still has it: back
    assert refs.read_ref("refs/remotes/origin/exp") == exp


@pytest.mark.parametrize("kind", KINDS)
def test_switch_tracks_and_status_counts_ahead_behind(kind, tmp_path, origin):
    a, main, exp = origin
    url = published(kind, tmp_path, origin)
    ok(tmp_path, "clone", url, "b")
    b = tmp_path / "b"
    ok(b, "config", "commit.mode", "lossless")
    assert "Your branch is up to date with 'origin/main'." in ok(b, "status")
    # git's DWIM: no branch exp, one origin/exp
    out = ok(b, "switch", "exp")
    assert "branch 'exp' set up to track 'origin/exp'." in out and "Switched to a new branch exp" in out
    assert ok(b, "config", "branch.exp.remote").strip() == "origin"
    assert ok(b, "config", "branch.exp.merge").strip() == "refs/heads/exp"
    assert Repo(b).head() == exp
    commit(b, "four", 4.0)
    five = commit(b, "five", 5.0)
    out = ok(b, "status")
    assert "Your branch is ahead of 'origin/exp' by 2 commits." in out and "mvc push" in out
    out = ok(b, "push")  # to the upstream's remote and branch
    assert "refs/heads/exp" in out and "fast-forward" in out
    assert "Your branch is up to date with 'origin/exp'." in ok(b, "status")
    # the first repository: fetch, follow, behind; a commit of its own: diverged
    assert "refs/remotes/origin/exp" in ok(a, "fetch")
    ok(a, "switch", "exp")
    assert "branch 'exp' set up to track 'origin/exp'." in ok(a, "branch", "-u", "origin/exp")
    out = ok(a, "status")
    assert "Your branch is behind 'origin/exp' by 2 commits, and can be fast-forwarded." in out
    ok(a, "pull")
    assert Repo(a).head() == five and "up to date with 'origin/exp'" in ok(a, "status")
    commit(a, "six", 6.0)
    commit(b, "seven", 7.0)
    ok(b, "push")
    ok(a, "fetch")
    out = ok(a, "status")
    assert "Your branch and 'origin/exp' have diverged," in out
    assert "and have 1 and 1 different commits each, respectively." in out
    assert run(a, "pull")[0] == 142
    # status reads local refs only: the remote gone, it still answers
    if kind == "file":
        shutil.rmtree(tmp_path / "remote")
        assert "have diverged" in ok(a, "status")
    # an upstream deleted here is "gone"; --unset-upstream clears it
    ok(a, "branch", "-d", "-r", "origin/exp")
    assert "but the upstream is gone" in ok(a, "status")
    ok(a, "branch", "--unset-upstream")
    assert "Your branch" not in ok(a, "status")
    assert run(a, "branch", "--unset-upstream")[0] == 102


@pytest.mark.parametrize("kind", KINDS)
def test_push_all_tags_and_set_upstream(kind, tmp_path, origin):
    a, main, exp = origin
    url = url_for(kind, tmp_path)
    ok(a, "remote", "add", "origin", url)
    code, _, err = run(a, "push", "origin", "--all", "main")
    assert code == 2 and "--all" in err
    assert "branch 'main' set up to track 'origin/main'." in ok(a, "push", "-u")
    assert "Your branch is up to date with 'origin/main'." in ok(a, "status")
    out = ok(a, "push", "--all", "--tags")
    assert "refs/heads/exp" in out and "refs/tags/v1" in out and "(new)" in out
    remote_refs = {c: Repo(a).store.refs.read_ref(f"refs/remotes/origin/{c}") for c in ("main", "exp")}
    assert remote_refs == {"main": main, "exp": exp}
    # a second remote with an exp too: `switch exp` no longer knows which to follow
    ok(tmp_path, "clone", url, "b")
    b = tmp_path / "b"
    ok(b, "remote", "add", "backup", url)
    ok(b, "fetch", "backup")
    code, _, err = run(b, "switch", "exp")
    assert code == 100 and "origin/exp" in err and "backup/exp" in err
    out = ok(b, "switch", "-c", "exp", "backup/exp")
    assert "set up to track 'backup/exp'" in out
    # renaming a branch carries its upstream; removing the remote forgets it
    ok(b, "branch", "-m", "exp", "exp2")
    assert ok(b, "config", "branch.exp2.remote").strip() == "backup"
    assert ok(b, "config", "branch.exp.remote").strip() == ""
    ok(b, "remote", "remove", "backup")
    assert ok(b, "config", "branch.exp2.remote").strip() == ""
    assert ok(b, "branch", "-r").split()[0::3] == ["origin/exp", "origin/main"]


def test_upstream_config_keys_are_validated(work):
    ok(work, "config", "branch.main.remote", "origin")
    ok(work, "config", "branch.main.merge", "main")  # short for refs/heads/main
    assert ok(work, "config", "branch.main.merge").strip() == "refs/heads/main"
    assert "branch.main.remote = origin" in ok(work, "config")
    for key, value in [("branch.main.remote", "not a name"), ("branch.main.merge", "a..b"),
                       ("branch..remote", "origin"), ("branch.main.rebase", "true"),
                       ("branch.main.merge", "refs/tags/v1")]:
        code, _, err = run(work, "config", key, value)
        assert code == 19 and err.startswith("mvc: error:") and len(err.splitlines()) == 1, (key, err)
    ok(work, "config", "--unset", "branch.main.remote")
    assert ok(work, "config", "branch.main.remote").strip() == ""
