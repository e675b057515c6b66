"""Realistic checkpoints for tests, and a strict bitwise comparison of nested states."""
from __future__ import annotations

import random
from collections import OrderedDict
from typing import Any

import numpy as np
import torch
import torch.nn as nn


class TinyLM(nn.Module):
    """Embedding + attention-ish projections + MLP + tied output head, as in real LMs."""

    def __init__(self, vocab: int = 64, dim: int = 32) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        self.q_proj = nn.Linear(dim, dim)
        self.norm = nn.LayerNorm(dim)
        self.mlp = nn.Sequential(nn.Linear(dim, 4 * dim), nn.GELU(), nn.Linear(4 * dim, dim))
        self.head = nn.Linear(dim, vocab, bias=False)
        self.head.weight = self.embed.weight  # tied
        self.register_buffer("position_ids", torch.arange(16, dtype=torch.int64))

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        h = self.embed(idx)
        h = h + self.q_proj(self.norm(h))
        h = h + self.mlp(h)
        return self.head(h)


def trained(seed: int = 0, steps: int = 3):
    torch.manual_seed(seed)
    model = TinyLM()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=2, gamma=0.5)
    for _ in range(steps):
        idx = torch.randint(0, 64, (4, 8))
        loss = model(idx).logsumexp(-1).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        sched.step()
    return model, opt, sched


def realistic_state(seed: int = 0) -> dict[str, Any]:
    """model (with tied weights, a bf16 copy) + AdamW state + scheduler + epoch + RNG states."""
    model, opt, sched = trained(seed)
    random.seed(seed)
    np.random.seed(seed)
    return {
        "model": model.state_dict(),
        "optimizer": opt.state_dict(),
        "scheduler": sched.state_dict(),
        "epoch": 3,
        "global_step": 2**40 + 7,
        "best": float("inf"),
        "ema_bf16": OrderedDict((k, v.to(torch.bfloat16)) for k, v in model.state_dict().items()
                                if v.is_floating_point()),
        "counts": torch.tensor([1, 2, 3], dtype=torch.int64),
        "mask": torch.tensor([True, False]),
        "rng": {"torch": torch.get_rng_state(), "python": random.getstate(),
                "numpy": np.random.get_state()},
        "tags": ("run", None, [1, 2.5]),
    }


def assert_same(a: Any, b: Any, path: str = "state") -> None:
    """Identical structure, types, key order and bitwise-identical tensors."""
    assert type(a) is type(b), f"{path}: {type(a).__name__} != {type(b).__name__}"
    if isinstance(a, torch.Tensor):
        assert a.dtype == b.dtype and a.shape == b.shape, f"{path}: {a.dtype}{list(a.shape)} != {b.dtype}{list(b.shape)}"
        ua = a.detach().contiguous().reshape(-1).view(torch.uint8)
        ub = b.detach().contiguous().reshape(-1).view(torch.uint8)
        assert torch.equal(ua, ub), f"{path}: tensor bytes differ"
    elif isinstance(a, dict):
        assert list(a.keys()) == list(b.keys()), f"{path}: keys {list(a)} != {list(b)}"
        for k in a:
            assert_same(a[k], b[k], f"{path}[{k!r}]")
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b), f"{path}: length {len(a)} != {len(b)}"
        for i, (x, y) in enumerate(zip(a, b)):
            assert_same(x, y, f"{path}[{i}]")
    elif isinstance(a, np.ndarray):
        assert a.dtype == b.dtype and np.array_equal(a, b), f"{path}: arrays differ"
    elif isinstance(a, float) and a != a:
        assert b != b, f"{path}: nan != {b}"
    else:
        assert a == b, f"{path}: {a!r} != {b!r}"
