"""`mvc checkout REV -o PATH` makes PATH's missing parent directories (issue 30 item 3), as
`torch.save` / `save_pretrained` users expect of `-o out/checkpoint-20`: only those, only when
it writes, and never past the refusals that protect existing work."""
from __future__ import annotations

from pathlib import Path

import pytest
import torch
from cli_helpers import run

from mvc.cli.commands_work import _made


@pytest.fixture
def work(work: Path) -> Path:
    """The shared lossless repository with a file commit (tag `file`) and a directory commit
    (tag `dir`, HEAD)."""
    torch.save({"w": torch.arange(6.0), "step": 3}, work / "model.pt")
    assert run(work, "commit", "-m", "file", "model.pt")[0] == 0
    assert run(work, "tag", "file")[0] == 0
    d = work / "checkpoint-20"
    d.mkdir()
    torch.save({"w": torch.ones(4)}, d / "pytorch_model.bin")
    (d / "config.json").write_text('{"layers": 2}')
    assert run(work, "commit", "-m", "dir", "checkpoint-20")[0] == 0
    assert run(work, "tag", "dir")[0] == 0
    return work


def test_a_file_into_missing_directories(work: Path) -> None:
    code, out, err = run(work, "checkout", "file", "-o", "out/run-1/model.pt")
    assert code == 0, err
    assert "Wrote out/run-1/model.pt" in out
    assert torch.equal(torch.load(work / "out/run-1/model.pt")["w"], torch.arange(6.0))


def test_a_directory_into_missing_directories(work: Path) -> None:
    # The natural Hugging Face resume: the run's output directory does not exist yet.
    code, out, err = run(work, "checkout", "dir", "-o", "out/checkpoint-20")
    assert code == 0, err
    assert (work / "out/checkpoint-20/config.json").read_text() == '{"layers": 2}'
    assert torch.equal(torch.load(work / "out/checkpoint-20/pytorch_model.bin")["w"], torch.ones(4))


def test_an_absolute_path(work: Path, tmp_path_factory) -> None:
    target = tmp_path_factory.mktemp("elsewhere") / "a" / "b" / "model.pt"
    code, _, err = run(work, "checkout", "file", "-o", str(target))
    assert code == 0, err
    assert target.is_file()


def test_a_file_in_the_way_is_a_usage_error_and_nothing_is_made(work: Path) -> None:
    (work / "notes").write_text("mine")
    code, _, err = run(work, "checkout", "file", "-o", "notes/sub/model.pt")
    assert code == 2
    assert "notes: not a directory" in err
    assert (work / "notes").read_text() == "mine"


def test_nothing_is_made_when_the_checkout_is_refused(work: Path) -> None:
    code, _, err = run(work, "checkout", "no-such-rev", "-o", "out/x/model.pt")
    assert code == 4, err
    code, _, err = run(work, "checkout", "dir", "-o", "out/y/model.pt", "--only", "w")
    assert code == 2, err
    assert not (work / "out").exists()


def test_the_overwrite_rules_still_hold(work: Path) -> None:
    # A file mvc never wrote is refused (exit 172), a non-empty directory too (exit 151):
    # making parents changes neither.
    (work / "out").mkdir()
    torch.save({"w": torch.zeros(1)}, work / "out" / "model.pt")
    code, _, err = run(work, "checkout", "file", "-o", "out/model.pt")
    assert code == 172, err
    (work / "out" / "full").mkdir()
    (work / "out" / "full" / "x").write_text("x")
    code, _, err = run(work, "checkout", "dir", "-o", "out/full")
    assert code == 151, err
    assert (work / "out" / "full" / "x").read_text() == "x"


def test_directories_made_for_a_failed_write_are_removed(tmp_path: Path) -> None:
    (tmp_path / "kept").mkdir()
    parents = [tmp_path / "kept" / "a", tmp_path / "kept" / "a" / "b"]
    with pytest.raises(OSError):
        with _made(parents):
            assert parents[1].is_dir()
            raise OSError("disk full")
    assert not parents[0].exists()
    assert (tmp_path / "kept").is_dir()  # it was there before: never removed
