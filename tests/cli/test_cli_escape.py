"""User-provided text never reaches the terminal raw (issue 12, #6): control characters are
shown escaped by every command that prints them; --json stays exact."""
from __future__ import annotations

import json

import pytest
import torch
from click.testing import CliRunner

from mvc.cli.format import escape
from mvc.cli.main import cli
from mvc.repo.repository import Repo
from mvc.store import RefUpdate

RED = "\x1b[31m"
CLEAR = "\x1b[2J\x1b[H"


def _raw_controls(text: str) -> list[str]:
    """Characters a terminal would act on (newline and tab are layout, not attacks)."""
    return [c for c in text if (ord(c) < 0x20 and c not in "\n\t") or 0x7f <= ord(c) <= 0x9f
            or 0x202a <= ord(c) <= 0x202e or 0x2066 <= ord(c) <= 0x2069]


@pytest.fixture
def hostile(tmp_path):
    """A repository whose commit message, author, metric, branch and tag carry escape sequences."""
    repo = Repo.init(tmp_path / "r")
    repo.config.set("commit.mode", "lossless")
    repo.config.set("user.name", f"{RED}mallory")
    repo.config.set("user.email", "m@example.com")
    cid = repo.commit({"w\x1b[1mx": torch.zeros(3)}, f"{RED}evil{CLEAR} summary\r\nsecond\tline\x07",
                      metrics={f"lo{RED}ss": 1.0})
    # Names checked at creation cannot hold control characters, and the store refuses C0 ones;
    # C1 controls (CSI is U+009B) and bidi overrides get through it from an older version or
    # another tool, straight into the store.
    repo.store.refs.update_refs([RefUpdate("refs/heads/\x9b31mbr", None, cid),
                            RefUpdate("refs/tags/t\u202egat\x9b2J", None, cid)], "test")
    repo.close()
    return tmp_path / "r", cid


def invoke(path, *args: str) -> str:
    result = CliRunner().invoke(cli, ["-C", str(path), *args], color=True)
    assert result.exit_code == 0, (result.output, result.exception)
    return result.stdout


def test_escape_helper():
    assert escape("a\x1b[31mb") == "a^[[31mb"
    assert escape("a\nb\tc") == "a^Jb^Ic"
    assert escape("a\nb\tc\r", multiline=True) == "a\nb\tc^M"
    assert escape("\x00\x7f\x9b\u202e") == "^@^?\\x9b\\u202e"
    assert escape("plain ü text") == "plain ü text"
    assert escape(escape("x\x1by")) == escape("x\x1by")


@pytest.mark.parametrize("args", [
    ["log"], ["log", "--oneline"], ["log", "--graph"], ["show"], ["branch"], ["tag"], ["status"],
    ["stats"],
])
def test_control_characters_are_escaped_on_display(hostile, args):
    path, _ = hostile
    out = invoke(path, *args)
    assert _raw_controls(out) == [], (args, out)
    assert "^[[" in out or "\\x9b" in out  # shown, escaped, not dropped


def test_log_and_show_escape_every_field(hostile):
    path, _cid = hostile
    for args in (["log"], ["show"]):
        out = invoke(path, *args)
        assert "^[[31mevil^[[2J^[[H summary" in out
        assert "^[[31mmallory" in out
        assert "lo^[[31mss" in out
        assert "second\tline^G" in out  # a tab in a message is layout, a bell is not
    assert "w^[[1mx" in invoke(path, "show")
    deco = invoke(path, "log", "--oneline")
    assert "\\x9b31mbr" in deco and "t\\u202egat\\x9b2J" in deco


def test_branch_tag_status_escape_names(hostile):
    path, _ = hostile
    assert "\\x9b31mbr" in invoke(path, "branch")
    assert "t\\u202egat\\x9b2J" in invoke(path, "tag")
    assert "^[[31mevil" in invoke(path, "status")


def test_json_stays_exact(hostile):
    path, _cid = hostile
    entries = json.loads(invoke(path, "log", "--json"))
    assert entries[0]["message"].startswith(f"{RED}evil{CLEAR}")
    assert entries[0]["author"].startswith(f"{RED}mallory")
    shown = json.loads(invoke(path, "show", "--json"))
    assert shown["tensors"][0]["name"] == "w\x1b[1mx"


def test_error_messages_are_one_escaped_line(hostile, capsys):
    from mvc.cli.main import main

    path, _ = hostile
    code = main(["-C", str(path), "checkout", "nope\n\x1b[31mx", "-o", str(path / "o.pt")])
    err = capsys.readouterr().err
    assert code != 0 and _raw_controls(err) == [] and len(err.strip().splitlines()) == 1
