"""quality.epsilon is honoured without a quality hook: as the proxy's bound, like --epsilon
(issue 19 item 6); unset, the proxy keeps its own bound."""
from __future__ import annotations

import torch

from mvc.repo.repository import Repo
from mvc.search.quality import PROXY_EPSILON


def _state():
    g = torch.Generator().manual_seed(0)
    return {"fc.weight": torch.randn(128, 64, generator=g), "fc.bias": torch.zeros(128)}


def test_configured_epsilon_bounds_the_proxy(tmp_path):
    with Repo.init(tmp_path) as repo:
        c = repo.read_commit(repo.commit(_state(), "default"))
        assert c.quant is None and c.quality is None, "unset, nothing opts in to a lossy commit"
        c = repo.read_commit(repo.commit(_state(), "proxy", epsilon=PROXY_EPSILON))
        assert c.quality["epsilon"] == PROXY_EPSILON
        repo.config.set("quality.epsilon", 0.002)
        tight = repo.read_commit(repo.commit({k: v * 1.5 for k, v in _state().items()}, "tight"))
        assert tight.quality["epsilon"] == 0.002
        assert tight.quality["value"] is None or tight.quality["value"] <= 0.002
        # --epsilon (the argument) still wins over the config.
        c3 = repo.read_commit(repo.commit({k: v * 2 for k, v in _state().items()}, "arg", epsilon=0.03))
        assert c3.quality["epsilon"] == 0.03
