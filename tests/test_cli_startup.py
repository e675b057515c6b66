"""Start-up without torch (issue 19 item 6): `mvc --version` and the command modules this
project's CLI owns import no torch; the repository code is loaded on a command's first use."""
from __future__ import annotations

import subprocess
import sys

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
