"""Running the `mvc` command in-process from tests, and setting up a working directory with it."""
from __future__ import annotations

import contextlib
import io
import os
from pathlib import Path

from mvc.cli.main import main


def run(cwd: Path | str, *args: str) -> tuple[int, str, str]:
    """Run the CLI in-process (fast) in `cwd` and return (exit code, stdout, stderr)."""
    out, err = io.StringIO(), io.StringIO()
    old = os.getcwd()
    os.chdir(cwd)
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            code = main(list(args))
    finally:
        os.chdir(old)
    return code, out.getvalue(), err.getvalue()


def init_work(path: Path, config: dict[str, str] | None = None) -> Path:
    """`mvc init` in `path`, then `mvc config KEY VALUE` for each item of `config`; returns `path`.

    conftest's `work` fixture is this with `commit.mode = lossless`; a test needing the default
    mode, or more set-up, calls it itself or overrides `work`."""
    code, out, err = run(path, "init")
    assert code == 0 and "Initialized empty" in out, err
    for key, value in (config or {}).items():
        assert run(path, "config", key, value)[0] == 0, key
    return path
