"""`branch -d` refuses an unmerged branch, `-D` forces (issue 19 item 6, "data loss by habit")."""
from __future__ import annotations

from pathlib import Path

import pytest
from cli_helpers import run
import torch

from mvc.repo.refs import CurrentBranchError, UnmergedBranchError
from mvc.repo.repository import Repo



def make(path: Path) -> tuple[Repo, str, str]:
    """main at c1; `merged` at c1 (behind main's tip c2); `exp` at its own commit e1."""
    repo = Repo.init(path)
    repo.config.set("commit.mode", "lossless")
    c1 = repo.commit({"w": torch.zeros(3)}, "one")
    repo.branch("merged")
    c2 = repo.commit({"w": torch.ones(3)}, "two")
    repo.switch("exp", create=True)
    e1 = repo.commit({"w": torch.full((3,), 2.0)}, "exp work")
    repo.switch("main")
    assert repo.resolve("merged") == c1 and repo.resolve("main") == c2
    return repo, c2, e1


def refs(repo: Repo) -> tuple[list[tuple[str, str]], list[tuple[str, str]], str | None, list]:
    return repo.branches(), repo.tags(), repo.head(), list(repo.store.refs.reflog("refs/heads/exp"))


def test_api_merged_deletes_unmerged_refused_force_deletes(tmp_path):
    repo, c2, e1 = make(tmp_path)
    assert UnmergedBranchError.exit_code == 135
    repo.delete_branch("merged")  # its tip is main's parent: still reachable
    assert [n for n, _ in repo.branches()] == ["exp", "main"]
    before = refs(repo)
    with pytest.raises(UnmergedBranchError, match="not fully merged"):
        repo.delete_branch("exp")
    assert refs(repo) == before and repo.resolve("exp") == e1
    assert repo.delete_branch("exp", force=True) == e1
    assert [n for n, _ in repo.branches()] == ["main"]
    repo.close()


def test_api_reachable_from_a_tag_or_detached_head_counts(tmp_path):
    repo, _, e1 = make(tmp_path)
    repo.tag("keep", "exp")
    repo.delete_branch("exp")
    repo.branch("exp2", "keep")
    repo.delete_tag("keep")
    repo.checkout(e1)  # detached at the tip: HEAD reaches it
    assert repo.current_branch() is None
    assert repo.delete_branch("exp2") == e1
    repo.close()


def test_api_current_branch_still_refused_even_forced(tmp_path):
    repo, _, _ = make(tmp_path)
    with pytest.raises(CurrentBranchError):
        repo.delete_branch("main", force=True)
    with pytest.raises(CurrentBranchError):
        repo.delete_branch("main")
    repo.close()


def test_cli_d_refuses_unmerged_and_D_forces(tmp_path):
    repo, _, e1 = make(tmp_path)
    before = refs(repo)
    repo.close()
    code, out, err = run(tmp_path, "branch", "-d", "merged")
    assert code == 0 and "Deleted branch merged" in out, err
    code, out, err = run(tmp_path, "branch", "-d", "exp")
    assert code == 135 and out == ""
    assert len(err.strip().splitlines()) == 1 and "-D" in err and "not fully merged" in err
    with Repo(tmp_path) as r:
        assert refs(r)[0] == [b for b in before[0] if b[0] != "merged"]
        assert refs(r)[1:] == before[1:]
    code, out, err = run(tmp_path, "branch", "-D", "exp")
    assert code == 0 and f"Deleted branch exp (was {e1[:12]})" in out, err
    code, _, err = run(tmp_path, "branch", "-D", "main")
    assert code == CurrentBranchError.exit_code and "HEAD is on it" in err
    code, _, err = run(tmp_path, "branch", "-d", "main")
    assert code == CurrentBranchError.exit_code
    with Repo(tmp_path) as r:
        assert [n for n, _ in r.branches()] == ["main"]
