"""mvc diff REV: REV against the working checkpoint file (issue 19 item 6)."""
from __future__ import annotations

import json

import torch

from cli_helpers import run


def test_diff_rev_against_the_working_file(tmp_path):
    assert run(tmp_path, "init")[0] == 0
    assert run(tmp_path, "config", "commit.mode", "lossless")[0] == 0
    assert run(tmp_path, "config", "checkpoint.path", "ck.pt")[0] == 0
    state = {"a": torch.ones(8), "b": torch.arange(6.0)}
    torch.save(state, tmp_path / "ck.pt")
    assert run(tmp_path, "commit", "-m", "one")[0] == 0
    code, out, err = run(tmp_path, "diff", "HEAD")
    assert code == 0, err
    assert out.strip() == "2 unchanged"
    torch.save({"a": torch.ones(8) * 2, "c": torch.zeros(2)}, tmp_path / "ck.pt")
    code, out, err = run(tmp_path, "diff", "HEAD", "--json")
    got = {d["name"]: d for d in json.loads(out)}
    assert got["a"]["status"] == "changed" and got["a"]["rel_l2"] == 1.0 and got["a"]["max_abs"] == 1.0
    assert got["b"]["status"] == "removed" and got["c"]["status"] == "added"
    torch.save({"a": torch.ones(8), "b": torch.arange(6.0)}, tmp_path / "other.pt")
    code, out, _ = run(tmp_path, "diff", "HEAD", "--file", "other.pt")
    assert code == 0 and out.strip() == "2 unchanged"
    code, _, err = run(tmp_path, "diff", "HEAD", "HEAD", "--file", "other.pt")
    assert code == 2 and "--file" in err
