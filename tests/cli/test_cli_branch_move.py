"""branch -m OLD NEW, branch -f NAME REV, and tag listing columns (issue 19 item 6)."""
from __future__ import annotations

import torch

from cli_helpers import run
from mvc.repo.repository import Repo


def _repo(tmp_path):
    repo = Repo.init(tmp_path)
    ids = [repo.commit({"w": torch.full((4,), float(i))}, f"c{i}", lossless=True) for i in range(3)]
    return repo, ids


def test_rename_moves_head_with_it_and_keeps_the_old_reflog(tmp_path):
    repo, ids = _repo(tmp_path)
    repo.close()
    code, out, err = run(tmp_path, "branch", "-m", "main", "trunk")
    assert code == 0, err
    with Repo(tmp_path) as r:
        assert r.current_branch() == "trunk" and r.resolve("trunk") == ids[-1]
        assert [n for n, _ in r.branches()] == ["trunk"]
        assert r.resolve("main@{0}") == ids[-1]  # the old name's reflog, in its grace period
        assert r.fsck().ok
    assert run(tmp_path, "branch", "exp", ids[0])[0] == 0
    code, _, err = run(tmp_path, "branch", "-m", "exp", "trunk")
    assert code == 16 and "already exists" in err  # RefExistsError
    code, _, err = run(tmp_path, "branch", "-m", "nope", "x")
    assert code != 0 and "nope" in err
    code, _, err = run(tmp_path, "branch", "-m", "exp")
    assert code == 2


def test_force_moves_a_branch_but_not_the_current_one(tmp_path):
    repo, ids = _repo(tmp_path)
    repo.branch("exp", ids[0])
    repo.close()
    code, out, err = run(tmp_path, "branch", "-f", "exp", ids[1])
    assert code == 0 and ids[1][:12] in out
    code, out, err = run(tmp_path, "branch", "-f", "new", "HEAD~2")
    assert code == 0
    with Repo(tmp_path) as r:
        assert r.resolve("exp") == ids[1] and r.resolve("new") == ids[0]
        assert r.resolve("exp@{1}") == ids[0]
    code, _, err = run(tmp_path, "branch", "-f", "main", ids[0])
    assert code == 18 and "HEAD is on it" in err


def test_tag_listing_columns_line_up(tmp_path):
    repo, ids = _repo(tmp_path)
    repo.tag("v1", ids[0])
    repo.tag("a-much-longer-tag-name", ids[2])
    repo.close()
    code, out, _ = run(tmp_path, "tag")
    lines = out.splitlines()
    assert code == 0 and len(lines) == 2
    assert lines[0].index(ids[2][:12]) == lines[1].index(ids[0][:12])
    assert [ln.split()[-1] for ln in lines] == ["c2", "c0"]


def test_log_all_shows_every_branch(tmp_path):
    repo, ids = _repo(tmp_path)
    repo.switch("side", create=True)
    side = repo.commit({"w": torch.zeros(4)}, "side work", lossless=True)
    repo.switch("main")
    repo.close()
    out = run(tmp_path, "log", "--oneline")[1]
    assert side[:12] not in out
    code, out, _ = run(tmp_path, "log", "--all", "--oneline")
    assert code == 0 and out.splitlines()[0].startswith(side[:12]) and len(out.splitlines()) == 4
