"""`read_state(..., cache_levels=False)` / `checkout(..., cache_levels=False)` (issue 27 item 4): a
checkout that no commit follows keeps no decoded levels in memory, and restores the same bits as
the default read, which still fills the cache for the next commit."""
from __future__ import annotations

import shutil

import pytest
import torch

from mvc.quant import QuantConfig, QuantPolicy
from mvc.repo.repository import Repo

CFG = QuantConfig(bins=8, protect=0.005)
POLICY = QuantPolicy(min_numel=64)


def states(n: int):
    g = torch.Generator().manual_seed(0)
    w = torch.randn(96, 48, generator=g) * 0.05
    for t in range(n):
        w = w + 0.003 * torch.randn(w.shape, generator=g)
        yield t, {"enc.weight": w, "dec.weight": w.t() * 0.5, "bias": torch.full((5,), float(t))}


@pytest.fixture
def chain(tmp_path):
    """A repository whose HEAD is two deltas away from its base; its commit ids."""
    repo = Repo.init(tmp_path / "r")
    repo.config.set("commit.base_every", 100)
    repo.config.set("commit.chain_budget", 0)
    ids = [repo.commit(s, f"step {t}", quant=CFG, policy=POLICY) for t, s in states(3)]
    assert repo.read_commit(ids[-1]).chain_depth == 2
    repo.close()
    return tmp_path / "r", ids


def bits(state: dict) -> dict[str, bytes]:
    return {k: v.contiguous().view(-1).view(torch.uint8).numpy().tobytes()
            for k, v in state.items() if isinstance(v, torch.Tensor)}


@pytest.mark.parametrize("disk", [True, False], ids=["disk-cache", "no-disk-cache"])
def test_read_state_without_caching_levels(chain, disk: bool) -> None:
    root, ids = chain
    with Repo(root) as repo:
        if not disk:
            repo.disk_levels = None
        expect = bits(repo.read_state(ids[-1]))  # the default: levels kept for a next commit
        assert len(repo.reader.levels) > 0
    for cid in ids:
        with Repo(root) as repo:
            if not disk:
                repo.disk_levels = None
            with Repo(root) as default:
                if not disk:
                    default.disk_levels = None
                want = bits(default.read_state(cid))
            assert bits(repo.read_state(cid, cache_levels=False)) == want
            assert len(repo.reader.levels) == 0
    assert want == expect


def test_checkout_without_caching_levels_moves_head(chain) -> None:
    root, ids = chain
    with Repo(root) as repo:
        repo.disk_levels = None
        want = bits(repo.read_state(ids[0], cache_levels=False))
        got = bits(repo.checkout(ids[0], cache_levels=False))
        assert got == want and repo.head() == ids[0]
        assert len(repo.reader.levels) == 0


def test_a_commit_after_an_uncached_checkout_still_lands(chain, tmp_path) -> None:
    # Nothing cached: the next commit decodes its parent itself, with the same result as a
    # commit that found the parent's levels in the cache.
    root, ids = chain
    _, nxt = list(states(4))[-1]
    out = []
    for cache in (True, False):
        copy = tmp_path / f"copy-{cache}"
        shutil.copytree(root, copy)
        with Repo(copy) as repo:
            repo.disk_levels = None
            repo.read_state(ids[-1], cache_levels=cache)
            assert (len(repo.reader.levels) > 0) == cache
            cid = repo.commit(nxt, "step 3", quant=CFG, policy=POLICY)
            assert repo.read_commit(cid).parents == [ids[-1]]
            out.append(bits(repo.read_state(cid, cache_levels=False)))
    assert out[0] == out[1]
