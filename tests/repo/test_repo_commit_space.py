"""Repo.commit(space=...): the commit hook searches the caller's config cube (issue 13)."""
from __future__ import annotations

import pytest
import torch
from checkpoints import small_mlp_state

from mvc.errors import UsageError
from mvc.quant import QuantConfig
from mvc.repo.repository import Repo
from mvc.search.quality import PROXY_EPSILON
from mvc.search import SearchSpace

SPACE = SearchSpace(bins=(32,), prune=(0.0, 0.1), protect=(0.01,))


def _in_space(quant: dict, space: SearchSpace) -> bool:
    cfg = QuantConfig.from_dict(quant)
    return cfg.bins in space.bins and cfg.prune in space.prune and cfg.protect in space.protect


def test_commit_searches_the_given_space(tmp_path):
    with Repo.init(tmp_path / "r") as repo:
        default = repo.read_commit(repo.commit(small_mlp_state(), "default cube", epsilon=PROXY_EPSILON))
        assert not _in_space(default.quant, SPACE)  # the default cube picks something else here
        c = repo.read_commit(repo.commit(small_mlp_state(1), "narrow cube", space=SPACE))
        assert _in_space(c.quant, SPACE) and c.quality["mode"] in ("neighbourhood",
                                                                    "fallback-exhaustive")
        assert c.quality["value"] <= c.quality["epsilon"]


def test_an_explicit_space_searches_whatever_the_mode(tmp_path):
    with Repo.init(tmp_path / "r") as repo:
        repo.config.set("commit.mode", "lossless")
        assert repo.read_commit(repo.commit(small_mlp_state(), "lossless by config")).quant is None
        c = repo.read_commit(repo.commit(small_mlp_state(), "searched", space=SPACE))
        assert c.quant is not None and _in_space(c.quant, SPACE)


def test_space_is_checked_and_exclusive_with_quant_and_lossless(tmp_path):
    with Repo.init(tmp_path / "r") as repo:
        with pytest.raises(UsageError, match="SearchSpace"):
            repo.commit(small_mlp_state(), "m", space={"bins": [8]})
        with pytest.raises(UsageError, match="space="):
            repo.commit(small_mlp_state(), "m", space=SPACE, quant=QuantConfig(bins=8))
        with pytest.raises(UsageError, match="space="):
            repo.commit(small_mlp_state(), "m", space=SPACE, lossless=True)
        assert repo.head() is None
        assert torch.equal(repo.read_state(repo.commit(small_mlp_state(), "ok", lossless=True))
                           ["model"]["fc1.weight"], small_mlp_state()["model"]["fc1.weight"])
