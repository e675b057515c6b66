"""`mvc`'s exit-code mapping: each error class its own code, one line, no traceback for user mistakes."""
from __future__ import annotations

import errno

import click
import pytest

from mvc.cli.main import cli, main
from mvc.errors import DataError, DiskFullError, InternalError, UsageError


@pytest.fixture
def raising():
    """A throw-away `mvc boom` command that raises whatever the test sets."""
    box: dict[str, BaseException] = {}

    @click.command("boom")
    def boom() -> None:
        raise box["exc"]

    cli.add_command(boom)
    try:
        yield box
    finally:
        cli.commands.pop("boom", None)


@pytest.mark.parametrize("exc, code, line", [
    (UsageError("bad flag combination"), 2, "mvc: error: bad flag combination"),
    (DataError("object abc is corrupt"), 6, "mvc: error: object abc is corrupt"),
    (InternalError("invariant broke"), 70, "mvc: error: invariant broke"),
    (DiskFullError("no space left"), 75, "mvc: error: no space left"),
    (KeyboardInterrupt(), 130, "mvc: interrupted"),
    (click.exceptions.Abort(), 130, "mvc: aborted"),
    (OSError(errno.EACCES, "Permission denied", "/x/y"), 74, "mvc: error: Permission denied: /x/y"),
    (OSError(errno.ENOSPC, "No space left on device", "/x/y"), 75,
     "mvc: error: No space left on device: /x/y"),
    (RuntimeError("oops"), 70, "mvc: internal error (this is a bug): RuntimeError: oops"),
])
def test_each_error_class_maps_to_its_code_and_one_line(raising, capsys, monkeypatch, exc, code, line):
    monkeypatch.delenv("MVC_DEBUG", raising=False)
    raising["exc"] = exc
    assert main(["boom"]) == code
    err = capsys.readouterr().err
    assert [x for x in err.splitlines() if x][0] == line
    assert "Traceback" not in err


def test_a_bug_prints_its_traceback_only_when_asked(raising, capsys, monkeypatch):
    raising["exc"] = RuntimeError("oops")
    monkeypatch.delenv("MVC_DEBUG", raising=False)
    assert main(["boom"]) == 70
    assert "rerun with MVC_DEBUG=1" in capsys.readouterr().err
    monkeypatch.setenv("MVC_DEBUG", "1")
    assert main(["boom"]) == 70
    assert "Traceback" in capsys.readouterr().err


def test_broken_pipe_is_quiet_success(raising, capsys):
    raising["exc"] = BrokenPipeError()
    assert main(["boom"]) == 0
    assert capsys.readouterr().err == ""


def test_usage_errors_from_click(capsys):
    assert main(["no-such-command"]) == 2
    assert main(["log", "--no-such-option"]) == 2
    err = capsys.readouterr().err
    assert "No such command" in err and "No such option" in err and "Traceback" not in err


def test_help_and_version_exit_zero(capsys):
    assert main(["--version"]) == 0
    assert main(["--help"]) == 0
    assert "Usage:" in capsys.readouterr().out


def test_clirunner_sees_the_same_codes_through_main(tmp_path, monkeypatch):
    """The commands themselves raise typed errors that main() maps (via click's CliRunner for I/O)."""
    from click.testing import CliRunner

    monkeypatch.chdir(tmp_path)
    runner = CliRunner()
    result = runner.invoke(cli, ["log"], standalone_mode=False)
    from mvc.repo.repository import NotARepositoryError

    assert isinstance(result.exception, NotARepositoryError)
    assert main(["log"]) == NotARepositoryError.exit_code == 3
