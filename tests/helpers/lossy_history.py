"""A lossy training history for repository tests: drifting weights, the configs committed
with them, a repository holding them as delta chains, and a bitwise tensor comparison."""
from __future__ import annotations

import torch

from mvc.quant import QuantConfig
from mvc.repo.repository import Repo


def trajectory(n: int, seed: int = 0):
    """Weights drifting like SGD: small updates to a fixed init, plus a tensor that changes shape."""
    g = torch.Generator().manual_seed(seed)
    w = {"enc.weight": torch.randn(128, 96, generator=g) * 0.05,
         "embed.weight": torch.randn(200, 32, generator=g) * 0.02,
         "dec.weight": torch.randn(96, 64, generator=g).to(torch.bfloat16) * 0.05}
    for t in range(n):
        w = {k: v + (0.002 * torch.randn(v.shape, generator=g)).to(v.dtype) for k, v in w.items()}
        state = dict(w)
        state["bias"] = torch.full((7,), float(t))
        if t >= n // 2:  # reshaped mid-run: becomes a base
            state["dec.weight"] = w["dec.weight"].reshape(64, 96)
        yield t, state


def configs(t: int) -> QuantConfig:
    bins = [4, 6, 8, 12, 16, 32][t % 6]
    return QuantConfig(bins=bins, prune=[0.0, 0.1, 0.3][t % 3],
                       prune_metric="magnitude", protect=[0.0005, 0.005, 0.01][t % 3],
                       embedding_bins=[16, 32][t % 2])


def chained_repo(root, n: int, *, base_every: int = 100, chain_budget: float = 0.0):
    """(repo, ids): `n` lossy commits of `trajectory` under the given chain bounds
    (by default none that n < 100 commits reach)."""
    repo = Repo.init(root)
    repo.config.set("commit.base_every", base_every)
    repo.config.set("commit.chain_budget", chain_budget)
    return repo, [repo.commit(state, f"step {t}", quant=configs(t)) for t, state in trajectory(n)]


def assert_bits(a: torch.Tensor, b: torch.Tensor, what: str) -> None:
    assert a.dtype == b.dtype and a.shape == b.shape, what
    assert torch.equal(a.contiguous().view(-1).view(torch.uint8),
                       b.contiguous().view(-1).view(torch.uint8)), what
