"""Usage errors and repository-state errors answer before torch is imported (issue 30 item 6),
and `fsck` and `stats` never import it on a repository of lossy commits with a level cache.

Each probe runs the real CLI in a fresh interpreter (as tests/cli/test_cli_startup.py does)
and reports whether `torch` ended up in `sys.modules`: no wall-clock assertion, the import
itself is what made these answers take seconds.
"""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch
from cli_helpers import init_work, run

from mvc.cli.commands_work import DIR_MARK

PROBE = """
import sys
from mvc.cli.main import main
rc = main(sys.argv[1:])
print("torch imported:", "torch" in sys.modules)
sys.exit(rc)
"""


def _probe(work: Path, *args: str) -> tuple[int, str, bool]:
    proc = subprocess.run([sys.executable, "-c", PROBE, *args], cwd=work, capture_output=True, text=True)
    out, _, flag = proc.stdout.rpartition("torch imported: ")
    return proc.returncode, out + proc.stderr, flag.strip() == "True"


@pytest.fixture(scope="module")
def repo(tmp_path_factory) -> Path:
    """Two lossy commits of a file (so a level cache and delta records), a directory commit on
    branch `dirs`, no checkpoint.path, a plain file `notes` and no remote."""
    work = init_work(tmp_path_factory.mktemp("fast"))
    g = torch.Generator().manual_seed(0)
    w = torch.randn(96, 64, generator=g)
    torch.save({"w": w, "step": 1}, work / "model.pt")
    assert run(work, "commit", "-m", "one", "model.pt", "--epsilon", "0.05")[0] == 0
    torch.save({"w": w + 0.01 * torch.randn(96, 64, generator=g), "step": 2}, work / "model.pt")
    assert run(work, "commit", "-m", "two", "model.pt", "--epsilon", "0.05")[0] == 0
    assert any((work / ".mvc" / "cache" / "levels").iterdir())
    assert run(work, "switch", "-c", "dirs")[0] == 0
    d = work / "ckpt"
    d.mkdir()
    torch.save({"b": torch.ones(3)}, d / "pytorch_model.bin")
    assert run(work, "commit", "-m", "dir", "ckpt")[0] == 0
    assert run(work, "switch", "main")[0] == 0
    (work / "notes").write_text("not a directory")
    return work


FAILURES = [
    # (args, exit code, part of the message)
    (("log", "--bad-flag"), 2, "No such option"),
    (("checkout", "HEAD"), 2, "no output file (-o) given and none configured"),
    (("checkout", "no-such-rev", "-o", "x.pt"), 4, "unknown revision"),
    (("checkout", "HEAD", "--only", "w"), 2, "give the file with -o FILE"),
    (("checkout", "dirs", "-o", "a.pt", "--weights-only"), 2, "checked out whole"),
    (("checkout", "HEAD", "-o", "notes/x.pt"), 2, "not a directory"),
    (("commit", "-m", "x"), 2, "no checkpoint given and none configured"),
    (("commit", "-m", "x", "missing.pt"), 20, "missing.pt: no such file"),
    (("commit", "-m", " ", "model.pt"), 2, "non-empty message"),
    (("commit", "-m", "x", "model.pt", "--metric", "loss"), 2, "KEY=VALUE"),
    (("commit", "-m", "x", "model.pt", "--metric", "loss=nan"), 2, "must be finite"),
    (("diff", "no-such-rev"), 4, "unknown revision"),
    (("diff", "HEAD", "no-such-rev"), 4, "unknown revision"),
    (("diff", "HEAD", "--file", "missing.pt"), 20, "no such file"),
    (("gc", "--keep-last", "0"), 2, "--keep-last must be >= 1"),
    (("gc", "--keep-every", "-2"), 2, "--keep-every must be >= 1"),
    (("gc", "--expire", "soon"), 2, "--expire expects"),
    (("push",), 143, "no remote named 'origin'"),
    (("fetch", "nowhere"), 143, "no remote named 'nowhere'"),
]


@pytest.mark.parametrize(("args", "code", "expect"), FAILURES, ids=[" ".join(a) for a, _, _ in FAILURES])
def test_failures_answer_without_torch(repo: Path, args: tuple[str, ...], code: int, expect: str) -> None:
    rc, out, imported = _probe(repo, *args)
    assert rc == code, out
    assert expect in out
    assert not imported, f"`mvc {' '.join(args)}` imported torch before failing"


@pytest.mark.parametrize("args", [("fsck",), ("stats",), ("stats", "--json"), ("show", "HEAD")],
                         ids=" ".join)
def test_metadata_commands_do_not_import_torch(repo: Path, args: tuple[str, ...]) -> None:
    rc, out, imported = _probe(repo, *args)
    assert rc == 0, out
    assert not imported, f"`mvc {' '.join(args)}` imported torch"


def test_fsck_still_finds_damage_without_torch(tmp_path: Path) -> None:
    # A level-cache file that fails its checks: a warning fsck reports, reading headers only.
    work = init_work(tmp_path)
    torch.save({"w": torch.randn(64, 64)}, work / "model.pt")
    assert run(work, "commit", "-m", "one", "model.pt", "--epsilon", "0.05")[0] == 0
    (cache,) = (work / ".mvc" / "cache" / "levels").iterdir()
    data = bytearray(cache.read_bytes())
    data[-1] ^= 0xFF
    cache.write_bytes(bytes(data))
    rc, out, imported = _probe(work, "fsck")
    assert rc == 0, out
    assert "warning: level cache" in out and "corrupt" in out
    assert not imported


def test_commands_that_need_tensors_still_load_them(repo: Path) -> None:
    rc, out, imported = _probe(repo, "checkout", "HEAD", "-o", "copy.pt")
    assert rc == 0, out
    assert imported


def test_the_directory_mark_is_the_one_mvc_io_writes() -> None:
    from mvc.io.dirs import DIR_MARK as written

    assert DIR_MARK == written


def test_push_fetch_and_clone_move_objects_without_torch(tmp_path: Path) -> None:
    (tmp_path / "work").mkdir()
    work = init_work(tmp_path / "work")
    torch.save({"w": torch.randn(32, 32)}, work / "model.pt")
    assert run(work, "commit", "-m", "one", "model.pt", "--epsilon", "0.05")[0] == 0
    remote = tmp_path / "remote"
    remote.mkdir()
    assert run(work, "remote", "add", "origin", remote.as_uri())[0] == 0
    for args in (("push", "--all"), ("fetch",), ("clone", remote.as_uri(), str(tmp_path / "copy"))):
        rc, out, imported = _probe(work, *args)
        assert rc == 0, out
        assert not imported, f"`mvc {' '.join(args)}` imported torch"
    assert run(tmp_path / "copy", "log", "--oneline")[1].count("\n") == 1
