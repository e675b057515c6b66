"""`mvc branch` lists branches in aligned columns whatever the names' lengths."""
from __future__ import annotations

import json

import torch
from cli_helpers import run


def test_branch_listing_columns_line_up(tmp_path):
    assert run(tmp_path, "init")[0] == 0
    assert run(tmp_path, "config", "commit.mode", "lossless")[0] == 0
    torch.save({"w": torch.ones(3)}, tmp_path / "c.pt")
    assert run(tmp_path, "commit", "-m", "one", "c.pt")[0] == 0
    for name in ("x", "a-much-longer-branch-name"):
        assert run(tmp_path, "branch", name)[0] == 0
    short_id = json.loads(run(tmp_path, "log", "--json")[1])[0]["id"][:12]
    code, out, _ = run(tmp_path, "branch")
    lines = out.splitlines()
    assert code == 0 and len(lines) == 3
    assert len({line.index(short_id) for line in lines}) == 1, out
    assert [line.split()[-1] for line in lines] == ["one"] * 3
