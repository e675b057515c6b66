"""`mvc status` hints a checkout that works (issue 30 item 7): `mvc checkout HEAD` only where
checkpoint.path is set, else `mvc checkout HEAD -o FILE`, which then does what it says."""
from __future__ import annotations

import shlex
from pathlib import Path

import torch
from cli_helpers import init_work, run

from mvc.repo.repository import Repo


def _two_commits_and_head_back_on_the_first(work: Path, *file_args: str) -> None:
    torch.save({"w": torch.zeros(8)}, work / "model.pt")
    assert run(work, "commit", "-m", "one", *file_args)[0] == 0
    assert run(work, "branch", "first")[0] == 0
    torch.save({"w": torch.ones(8)}, work / "model.pt")
    assert run(work, "commit", "-m", "two", *file_args)[0] == 0
    assert run(work, "switch", "first")[0] == 0   # HEAD moves; the file stays "two"


def _hinted_command(out: str) -> list[str]:
    line = next(ln for ln in out.splitlines() if ln.startswith("Checkpoint "))
    assert "which is not HEAD" in line, out
    return shlex.split(line.split("`")[1])


def test_without_checkpoint_path_the_hint_names_the_file(tmp_path: Path) -> None:
    work = init_work(tmp_path, {"commit.mode": "lossless"})
    _two_commits_and_head_back_on_the_first(work, "model.pt")
    code, out, err = run(work, "status")
    assert code == 0, err
    cmd = _hinted_command(out)
    assert cmd[:5] == ["mvc", "checkout", "HEAD", "-o", str(work / "model.pt")]
    # The hint works as printed (`mvc checkout HEAD` alone would exit 2 here).
    assert run(work, "checkout", "HEAD")[0] == 2
    code, _, err = run(work, *cmd[1:])
    assert code == 0, err
    assert torch.equal(torch.load(work / "model.pt")["w"], torch.zeros(8))
    assert "Checkpoint " in (out := run(work, "status")[1]) and "unchanged since HEAD" in out


def test_with_checkpoint_path_the_hint_is_plain_checkout(tmp_path: Path) -> None:
    work = init_work(tmp_path, {"commit.mode": "lossless", "checkpoint.path": "model.pt"})
    _two_commits_and_head_back_on_the_first(work)
    cmd = _hinted_command(run(work, "status")[1])
    assert cmd == ["mvc", "checkout", "HEAD"]
    code, _, err = run(work, *cmd[1:])
    assert code == 0, err
    assert "unchanged since HEAD" in run(work, "status")[1]


def test_no_checkpoint_file_at_all_hints_checkout_to_a_file(tmp_path: Path) -> None:
    # As after a clone: commits, no checkpoint.path, no file committed or checked out here.
    work = init_work(tmp_path)
    Repo(work).commit({"w": torch.zeros(2)}, "api commit")
    code, out, err = run(work, "status")
    assert code == 0, err
    assert ("No checkpoint file configured (`mvc config checkpoint.path PATH`; "
            "`mvc checkout HEAD -o FILE` writes HEAD's checkpoint to FILE)") in out
    assert run(work, "checkout", "HEAD", "-o", "restored.pt")[0] == 0
    # An empty repository has nothing to check out: only the config hint.
    (tmp_path / "empty").mkdir()
    empty = init_work(tmp_path / "empty")
    assert "(`mvc config checkpoint.path PATH`)" in run(empty, "status")[1]
