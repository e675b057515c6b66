"""The install rule: torch pinned from the CPU index by default (overridable), progress shown
(issue 19 item 6, set-up). Checked with `make -n`, which prints the commands without running them."""
from __future__ import annotations

import shutil
import subprocess

import pytest
from locations import ROOT


def _dry_run(*args: str) -> list[str]:
    out = subprocess.run(["make", "-n", "-B", "-C", str(ROOT), "install", *args], capture_output=True,
                         text=True, check=True).stdout
    return [ln for ln in out.splitlines() if " pip install" in ln]


@pytest.mark.skipif(shutil.which("make") is None, reason="make is not installed")
def test_torch_from_the_cpu_index_by_default_and_overridable() -> None:
    lines = _dry_run()
    torch_line = next(ln for ln in lines if "torch==" in ln)
    assert "--extra-index-url https://download.pytorch.org/whl/cpu" in torch_line
    assert all(" -q" not in ln for ln in lines), lines  # pip's progress is shown
    # The project's own install never uses the torch index.
    assert all("download.pytorch.org" not in ln for ln in lines if "-e " in ln)
    plain = next(ln for ln in _dry_run("TORCH_INDEX=") if "torch==" in ln)
    assert "index-url" not in plain
    other = next(ln for ln in _dry_run("TORCH_INDEX=https://example.invalid/simple") if "torch==" in ln)
    assert "--extra-index-url https://example.invalid/simple" in other
