"""mvc stats --plot FILE.png (issue 19 item 5): a picture of the history, written with
matplotlib (the plot extra)."""
from __future__ import annotations

import pytest
import torch

from cli_helpers import run
from mvc.repo.repository import Repo

pytest.importorskip("matplotlib")


def test_stats_plot_writes_a_png_with_pruned_and_branch_points(tmp_path):
    repo = Repo.init(tmp_path)
    g = torch.Generator().manual_seed(0)
    w = torch.randn(256, 64, generator=g)
    ids = []
    for i in range(4):
        w = w + 0.01 * torch.randn(w.shape, generator=g)
        ids.append(repo.commit({"w": w}, f"step {i}", step=i))
    repo.switch("side", create=True)
    repo.commit({"w": w * 2}, "side", step=4)
    repo.switch("main")
    repo.gc(keep_last=1)
    repo.close()
    out_png = tmp_path / "hist.png"
    code, out, err = run(tmp_path, "stats", "--plot", str(out_png))
    assert code == 0, err
    assert "Wrote" in out and "5 commits" in out
    data = out_png.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 10_000
    # --json stays exact JSON on stdout; the note goes to stderr.
    code, out, err = run(tmp_path, "stats", "--json", "--plot", str(tmp_path / "b.png"))
    assert code == 0 and out.lstrip().startswith("{") and "Wrote" in err
