"""Start-up without torch (issue 19 item 6): `mvc --version` and the command modules this
project's CLI owns import no torch; the repository code is loaded on a command's first use."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

PROBE = """
import sys
{body}
print("torch" in sys.modules)
"""


def _imports_torch(body: str) -> bool:
    out = subprocess.run([sys.executable, "-c", PROBE.format(body=body)], capture_output=True,
                         text=True, check=True).stdout
    return out.strip().splitlines()[-1] == "True"


def test_version_does_not_import_torch() -> None:
    assert not _imports_torch(
        "from mvc.cli.main import main\ntry:\n    main(['--version'])\nexcept SystemExit:\n    pass")


def test_command_modules_import_without_torch() -> None:
    assert not _imports_torch("import mvc.cli.commands_work, mvc.cli.commands_refs, "
                              "mvc.cli.commands_history, mvc.cli.commands_maint, mvc.cli.main")


def test_a_command_still_finds_the_repository(tmp_path) -> None:
    out = subprocess.run([sys.executable, "-m", "mvc", "init", str(tmp_path)], capture_output=True,
                         text=True, check=True).stdout
    assert "Initialized empty" in out
    rc = subprocess.run([sys.executable, "-m", "mvc", "-C", str(tmp_path), "branch"], capture_output=True,
                        text=True).returncode
    assert rc == 0


def test_help_lists_every_command_without_torch() -> None:
    assert not _imports_torch(
        "from mvc.cli.main import main\ntry:\n    main(['--help'])\nexcept SystemExit:\n    pass")


# Commands that open a repository but never touch tensors (issue 19 item 6): each runs in a
# fresh interpreter against a repository holding a real commit (objects, snapshot, reflog,
# tracked checkpoint file), and must leave torch unimported.
COMMAND_PROBE = """
import sys
from mvc.cli.main import main
rc = main(sys.argv[1:])
print("torch imported:", "torch" in sys.modules)
sys.exit(rc)
"""


@pytest.fixture(scope="module")
def committed(tmp_path_factory) -> Path:
    import torch

    from cli_helpers import run

    work = tmp_path_factory.mktemp("startup")
    assert run(work, "init")[0] == 0
    assert run(work, "config", "checkpoint.path", "model.pt")[0] == 0
    torch.save({"w": torch.arange(12.0).reshape(3, 4), "step": 7}, work / "model.pt")
    code, _, err = run(work, "commit", "-m", "first")
    assert code == 0, err
    assert run(work, "tag", "v1")[0] == 0
    for args in (("branch", "old"), ("branch", "doomed"), ("tag", "doomed")):
        assert run(work, *args)[0] == 0
    return work


def _run_probe(work: Path, *args: str) -> tuple[int, str, bool]:
    proc = subprocess.run([sys.executable, "-c", COMMAND_PROBE, *args], cwd=work, capture_output=True,
                          text=True)
    out, _, flag = proc.stdout.rpartition("torch imported: ")
    return proc.returncode, out + proc.stderr, flag.strip() == "True"


TORCH_FREE = [
    (("log",), "first"),
    (("log", "--json"), '"message": "first"'),
    (("log", "--all", "--oneline"), "first"),
    (("branch",), "main"),
    (("branch", "startup-new"), "startup-new"),
    (("branch", "-f", "startup-moved", "HEAD"), ""),
    (("branch", "-m", "old", "startup-renamed"), ""),
    (("branch", "-d", "doomed"), "Deleted branch doomed"),
    (("tag",), "v1"),
    (("tag", "startup-tag"), "startup-tag"),
    (("tag", "-d", "doomed"), "doomed"),
    (("reflog",), "commit: first"),
    (("reflog", "main"), "commit: first"),
    (("config",), "commit.mode = search"),
    (("config", "checkpoint.path"), "model.pt"),
    (("config", "core.lock_timeout", "30"), ""),
    (("config", "commit.mode", "turbo"), "must be one of"),    # validation (rc 19)
    (("config", "quality.epsilon", "1.5"), "must be in (0, 1)"),
    (("status",), "unchanged since HEAD"),
    (("show", "--stat", "HEAD"), "first"),
    (("switch", "main"), ""),
    (("remote", "add", "startup-remote", "file:///nonexistent/startup-remote"), ""),
    (("remote", "-v"), ""),
]


@pytest.mark.parametrize(("args", "expect"), TORCH_FREE, ids=[" ".join(a) for a, _ in TORCH_FREE])
def test_repository_commands_do_not_import_torch(committed: Path, args: tuple[str, ...], expect: str) -> None:
    code, out, imported = _run_probe(committed, *args)
    assert code == (19 if "must" in expect else 0), out
    assert expect in out
    assert not imported, f"`mvc {' '.join(args)}` imported torch"


def test_commands_that_need_tensors_still_get_them(committed: Path) -> None:
    code, out, imported = _run_probe(committed, "checkout", "HEAD", "-o", str(committed / "copy.pt"))
    assert code == 0, out
    assert imported
    import torch

    assert torch.equal(torch.load(committed / "copy.pt")["w"], torch.arange(12.0).reshape(3, 4))


def test_reading_history_through_the_api_does_not_import_torch(committed: Path) -> None:
    # The Python API too: opening a repository and walking refs, commits, snapshots and config.
    assert not _imports_torch(
        f"from mvc.repo.repository import Repo\n"
        f"r = Repo({str(committed)!r})\n"
        "c = r.log()[0]\n"
        "assert c.message == 'first' and r.read_snapshot(c.snapshot).tensors\n"
        "assert r.branches() and r.tags() and r.config.items()\n"
        "assert r.resolve('v1') == c.id and r.store.refs.reflog('HEAD')")
