"""`mvc checkout` keeps no decoded levels in memory (issue 27 item 4: no commit follows in its
process, and the levels cost about a quarter of a float32 state at the peak); what it writes is
bit-identical to the API's default restore."""
from __future__ import annotations

from pathlib import Path

import pytest
import torch
from cli_helpers import run

from mvc.quant import QuantConfig, QuantPolicy
from mvc.repo import levelcache
from mvc.repo.repository import Repo


@pytest.fixture
def lossy(tmp_path: Path) -> tuple[Path, list[str]]:
    """A repository with two lossy commits (the second a delta on the first)."""
    repo = Repo.init(tmp_path)
    g = torch.Generator().manual_seed(0)
    w = torch.randn(64, 32, generator=g) * 0.05
    ids = []
    for t in range(2):
        w = w + 0.003 * torch.randn(w.shape, generator=g)
        ids.append(repo.commit({"w": w, "v": w.abs() * 0.1, "step": t}, f"step {t}",
                               quant=QuantConfig(bins=8), policy=QuantPolicy(min_numel=64)))
    assert repo.read_commit(ids[-1]).chain_depth == 1
    repo.close()
    return tmp_path, ids


@pytest.mark.parametrize("rev", ["HEAD", "HEAD~1"])
def test_checkout_caches_no_levels(lossy, monkeypatch, rev: str) -> None:
    root, ids = lossy
    puts: list[tuple[str, str]] = []
    real = levelcache.LevelCache.put
    monkeypatch.setattr(levelcache.LevelCache, "put",
                        lambda self, key, q: (puts.append(key), real(self, key, q))[1])
    code, out, err = run(root, "checkout", rev, "-o", "out.pt")
    assert code == 0, err
    assert "Wrote out.pt" in out
    assert puts == []
    got = torch.load(root / "out.pt")
    with Repo(root) as repo:
        want = repo.read_state(rev)  # the API's default, which does fill the cache
        assert puts
    assert got["step"] == want["step"]
    for k in ("w", "v"):
        assert got[k].dtype == want[k].dtype
        assert torch.equal(got[k].view(torch.int32), want[k].view(torch.int32))
