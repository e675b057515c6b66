"""Running `mvc` in a child process as a user's terminal or a pipe sees it: the progress tests."""
from __future__ import annotations

import os
import pty
import re
import subprocess
import sys
import threading
from pathlib import Path

_ESCAPES = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")


def terminal_env(columns: int = 120) -> dict[str, str]:
    """The environment of an interactive terminal `columns` wide, whatever the test runner's is."""
    env = dict(os.environ, TERM="xterm", COLUMNS=str(columns))
    env.pop("MVC_PROGRESS", None)
    env.pop("NO_COLOR", None)
    return env


def run_on_pipe(cwd: Path, *args: str, columns: int = 120) -> tuple[int, str, str]:
    """`mvc ARGS` with stdout and stderr on pipes: (rc, stdout, stderr)."""
    p = subprocess.run([sys.executable, "-m", "mvc", *args], cwd=cwd, capture_output=True,
                       text=True, env=terminal_env(columns))
    return p.returncode, p.stdout, p.stderr


def run_on_pty(cwd: Path, *args: str, columns: int = 120) -> tuple[int, str, str]:
    """`mvc ARGS` with stderr on a pseudo-terminal (stdout a pipe): (rc, stdout, terminal text
    without escape sequences)."""
    master, slave = pty.openpty()
    p = subprocess.Popen([sys.executable, "-m", "mvc", *args], cwd=cwd, stdin=subprocess.DEVNULL,
                         stdout=subprocess.PIPE, stderr=slave, env=terminal_env(columns))
    os.close(slave)
    chunks: list[bytes] = []

    def drain() -> None:
        while True:
            try:
                data = os.read(master, 65536)
            except OSError:  # EIO: the child closed its end
                return
            if not data:
                return
            chunks.append(data)

    reader = threading.Thread(target=drain)
    reader.start()
    out = p.stdout.read() if p.stdout else b""
    rc = p.wait()
    reader.join()
    os.close(master)
    return rc, out.decode(), _ESCAPES.sub("", b"".join(chunks).decode("utf-8", "replace"))
