"""The install rule probes the torch index once (issue 30 item 11): where it cannot be reached,
torch comes from the default index at once, with one line saying so -- no pip retry warnings per
package -- and an installed pinned torch asks no index at all. Run for real with `PIP=true` (pip
is not run) and the venv in a temporary directory."""
from __future__ import annotations

import importlib.metadata
import shutil
import subprocess
import sys

import pytest
from locations import ROOT

pytestmark = pytest.mark.skipif(shutil.which("make") is None, reason="make is not installed")


def _install(tmp_path, **overrides: str) -> list[str]:
    (tmp_path / "venv").mkdir(exist_ok=True)
    args = [f"{k}={v}" for k, v in {"VENV": str(tmp_path / "venv"), "PY": sys.executable,
                                    "PIP": "echo PIP", **overrides}.items()]
    out = subprocess.run(["make", "-s", "-B", "-C", str(ROOT), "install", *args], capture_output=True,
                         text=True, check=True, timeout=120)
    return (out.stdout + out.stderr).splitlines()


def test_unreachable_index_falls_back_at_once_with_one_line(tmp_path) -> None:
    lines = _install(tmp_path, TORCH_SPEC="torch==0.0.1", TORCH_INDEX="https://example.invalid/simple")
    said = [ln for ln in lines if ln.startswith("torch: ")]
    assert said == ["torch: torch==0.0.1 from the default index "
                    "(https://example.invalid/simple cannot be reached)"], lines
    assert 'PIP install torch==0.0.1' in lines and not any("Retrying" in ln for ln in lines), lines
    assert not any("example.invalid" in ln for ln in lines if ln.startswith("PIP")), lines


def test_an_installed_pinned_torch_asks_no_index(tmp_path) -> None:
    version = importlib.metadata.version("torch").split("+")[0]
    lines = _install(tmp_path, TORCH_SPEC=f"torch=={version}")
    assert f"torch: torch=={version} is installed" in lines, lines
    assert not any("torch==" in ln for ln in lines if ln.startswith("PIP")), lines
