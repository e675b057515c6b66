"""Help texts are whole sentences: `mvc --help` lists each command's first sentence uncut,
and every `mvc CMD --help` opens with a paragraph that ends a sentence."""
from __future__ import annotations

import pytest
from cli_helpers import run

from mvc.cli.main import cli

COMMANDS = sorted(cli.commands)


def test_command_list_is_not_cut(tmp_path):
    code, out, _ = run(tmp_path, "--help")
    assert code == 0
    listing = out.split("Commands:", 1)[1]
    assert "..." not in listing
    for name in COMMANDS:
        assert f"  {name} " in listing


@pytest.mark.parametrize("name", COMMANDS)
def test_first_paragraph_is_a_full_sentence(tmp_path, name):
    code, out, _ = run(tmp_path, name, "--help")
    assert code == 0
    first = " ".join(out.split("\n\n")[1].split())  # the paragraph after "Usage: ..."
    assert first.endswith((".", ".)")), first
    assert not first.endswith(("since.", "...")), first
