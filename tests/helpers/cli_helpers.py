"""Running the `mvc` command in-process from tests."""
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
