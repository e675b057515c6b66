"""Committing an unchanged checkpoint (issue 30 item 4): `mvc commit` says "nothing to commit"
and exits 0 with no new commit, as git does, unless `--allow-empty`; the Python API keeps making
the commit unless `allow_empty=False`, which raises `NothingToCommitError`."""
from __future__ import annotations

import pytest
import torch
from cli_helpers import init_work, run

from mvc.repo.repository import Repo
from mvc.repo.transaction import NothingToCommitError


def _save(path, seed: int) -> None:
    g = torch.Generator().manual_seed(seed)
    torch.save({"w": torch.randn(64, 32, generator=g), "b": torch.zeros(4), "step": seed}, path)


def _log(work) -> list[str]:
    code, out, err = run(work, "log", "--oneline")
    assert code == 0, err
    return out.splitlines()


@pytest.mark.parametrize("mode", [["--lossless"], [], ["--epsilon", "0.05"]],
                         ids=["lossless", "default", "lossy"])
def test_committing_an_unchanged_checkpoint_makes_no_commit(tmp_path, mode: list[str]) -> None:
    work = init_work(tmp_path, {"checkpoint.path": "model.pt"})
    _save(work / "model.pt", 1)
    code, out, err = run(work, "commit", "-m", "first", *mode)
    assert code == 0, err
    head = Repo(work).head()
    assert head is not None
    code, out, err = run(work, "commit", "-m", "again", *mode)
    assert code == 0, err
    assert out.strip() == f"nothing to commit, {work / 'model.pt'} matches HEAD ({head[:12]})"
    assert len(_log(work)) == 1
    assert Repo(work).head() == head
    code, out, _ = run(work, "status")
    assert "unchanged since HEAD" in out


def test_allow_empty_commits_anyway(work) -> None:
    _save(work / "model.pt", 1)
    assert run(work, "commit", "-m", "first", "model.pt")[0] == 0
    code, out, err = run(work, "commit", "-m", "second", "model.pt", "--allow-empty")
    assert code == 0, err
    assert out.startswith("[main ") and "second" in out
    assert len(_log(work)) == 2


def test_a_changed_checkpoint_is_committed(work) -> None:
    _save(work / "model.pt", 1)
    assert run(work, "commit", "-m", "first", "model.pt")[0] == 0
    _save(work / "model.pt", 2)
    code, out, err = run(work, "commit", "-m", "second", "model.pt")
    assert code == 0 and out.startswith("[main "), err
    # The same tensors in a different structure are a different snapshot, so a commit too.
    torch.save({"model": torch.load(work / "model.pt")}, work / "model.pt")
    code, out, err = run(work, "commit", "-m", "nested", "model.pt")
    assert code == 0 and out.startswith("[main "), err
    assert len(_log(work)) == 3


def test_an_unchanged_checkpoint_directory_makes_no_commit(work) -> None:
    d = work / "checkpoint-1"
    d.mkdir()
    _save(d / "pytorch_model.bin", 1)
    (d / "config.json").write_text('{"a": 1}')
    assert run(work, "commit", "-m", "dir", "checkpoint-1")[0] == 0
    code, out, err = run(work, "commit", "-m", "dir again", "checkpoint-1")
    assert code == 0, err
    assert out.startswith("nothing to commit, checkpoint-1 matches HEAD (")
    (d / "config.json").write_text('{"a": 2}')
    code, out, err = run(work, "commit", "-m", "dir changed", "checkpoint-1")
    assert code == 0 and out.startswith("[main "), err
    assert len(_log(work)) == 2


def test_the_api_commits_by_default_and_raises_with_allow_empty_false(tmp_path) -> None:
    repo = Repo.init(tmp_path)
    state = {"w": torch.randn(16, 8), "step": 1}
    first = repo.commit(state, "first")
    second = repo.commit(state, "second")          # the default is unchanged: a commit
    assert second != first and repo.read_commit(second).parents == [first]
    reflog = len(repo.store.refs.reflog("refs/heads/main"))
    with pytest.raises(NothingToCommitError) as info:
        repo.commit(state, "third", allow_empty=False)
    assert info.value.head == second and info.value.exit_code == 108
    assert repo.head() == second and len(repo.store.refs.reflog("refs/heads/main")) == reflog
    state["w"] = state["w"] + 1
    assert repo.commit(state, "changed", allow_empty=False) != second


def test_allow_empty_false_on_an_unborn_branch_commits(tmp_path) -> None:
    repo = Repo.init(tmp_path)
    cid = repo.commit({"w": torch.zeros(3)}, "first", allow_empty=False)
    assert repo.head() == cid
