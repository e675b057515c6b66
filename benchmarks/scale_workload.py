"""bench_scale's workload: a GPT-2-shaped model trained a few AdamW steps on real text (the
Python standard library's sources, word-level tokens by frequency rank), and its checkpoints.
Shared by the benchmarks that time mvc on that model (bench_scale, bench_background,
bench_device_pipeline, bench_write)."""
from __future__ import annotations

import copy
import re
import sysconfig
from collections import Counter
from pathlib import Path
from typing import Any, Callable

import torch
from torch import nn

GPT2_SMALL = {"layers": 12, "d": 768, "vocab": 50257, "ctx": 1024}


class Block(nn.Module):
    def __init__(self, d: int, heads: int) -> None:
        super().__init__()
        self.ln_1, self.ln_2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.attn = nn.MultiheadAttention(d, heads, batch_first=True)
        self.mlp = nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d))

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        h = self.ln_1(x)
        x = x + self.attn(h, h, h, attn_mask=mask, need_weights=False)[0]
        return x + self.mlp(self.ln_2(x))


class GPT(nn.Module):
    """GPT-2's shape: token + position embeddings, pre-norm blocks, tied LM head."""

    def __init__(self, layers: int, d: int, vocab: int, ctx: int) -> None:
        super().__init__()
        self.wte, self.wpe = nn.Embedding(vocab, d), nn.Embedding(ctx, d)
        self.h = nn.ModuleList(Block(d, max(1, d // 64)) for _ in range(layers))
        self.ln_f = nn.LayerNorm(d)
        for p in self.parameters():
            if p.dim() >= 2:
                nn.init.normal_(p, std=0.02)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        t = idx.shape[1]
        mask = torch.triu(torch.full((t, t), float("-inf"), device=idx.device), 1)
        x = self.wte(idx) + self.wpe(torch.arange(t, device=idx.device))
        for blk in self.h:
            x = blk(x, mask)
        return self.ln_f(x) @ self.wte.weight.t()


def shape_for(params: float, layers: int | None = None) -> dict[str, int]:
    """GPT-2-small's shape (or `layers` blocks: 48 is GPT-2-XL's) with d (a multiple of 64)
    scaled so the model has about `params` parameters; below what d = 64 gives, fewer layers
    and a smaller vocabulary."""
    layers = layers or GPT2_SMALL["layers"]
    vocab, ctx = GPT2_SMALL["vocab"], GPT2_SMALL["ctx"]

    def count(layers: int, d: int, vocab: int) -> int:
        return layers * (12 * d * d + 13 * d) + (vocab + ctx) * d + 2 * d

    if count(layers, 64, vocab) > params:
        layers, ctx = 2, 256
        vocab = max(256, int((params - count(layers, 64, 0)) / 64))
        return {"layers": layers, "d": 64, "vocab": vocab, "ctx": ctx}
    d = max(64, min(range(64, 4097, 64), key=lambda d: abs(count(layers, d, vocab) - params)))
    return {"layers": layers, "d": d, "vocab": vocab, "ctx": ctx}


def corpus_tokens(vocab: int, limit: int = 2_000_000) -> torch.Tensor:
    """Word-level tokens of the standard library's sources, ids by frequency rank."""
    words: list[str] = []
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    for path in sorted(stdlib.glob("*.py")):
        words += re.findall(r"\w+|[^\w\s]", path.read_text(errors="replace"))
        if len(words) >= limit:
            break
    rank = {w: i for i, (w, _) in enumerate(Counter(words).most_common(vocab - 1))}
    return torch.tensor([rank.get(w, vocab - 1) for w in words[:limit]], dtype=torch.int64)


def trainer(shape: dict[str, int], device: str, batch: int, seq: int, seed: int = 0,
            data: torch.Tensor | None = None
            ) -> tuple[nn.Module, torch.optim.Optimizer, Callable[[], None]]:
    """The workload's model, its AdamW, and a function running one training step on the next
    batch of stdlib text (or of `data`'s tokens)."""
    torch.manual_seed(seed)
    model = GPT(**shape).to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4, weight_decay=0.1)
    if data is None:
        data = corpus_tokens(shape["vocab"])
    g = torch.Generator().manual_seed(seed)

    def step() -> None:
        starts = torch.randint(0, data.numel() - seq - 1, (batch,), generator=g)
        x = torch.stack([data[s:s + seq] for s in starts]).to(device)
        y = torch.stack([data[s + 1:s + seq + 1] for s in starts]).to(device)
        loss = nn.functional.cross_entropy(model(x).reshape(-1, shape["vocab"]), y.reshape(-1))
        opt.zero_grad()
        loss.backward()
        opt.step()
    return model, opt, step


def train(shape: dict[str, int], steps: list[int], device: str, batch: int, seq: int,
          seed: int = 0, data: torch.Tensor | None = None) -> list[dict]:
    """Checkpoints {"model", "optimizer", "step"} after each count of AdamW steps in `steps`."""
    model, opt, step_once = trainer(shape, device, batch, seq, seed, data)
    out = []
    for step in range(1, max(steps) + 1):
        step_once()
        if step in steps:
            out.append({"model": {k: v.detach().clone() for k, v in model.state_dict().items()},
                        "optimizer": copy.deepcopy(opt.state_dict()), "step": step})
    return out


def tensor_bytes(state: Any) -> int:
    if isinstance(state, torch.Tensor):
        return state.numel() * state.element_size()
    if isinstance(state, dict):
        return sum(tensor_bytes(v) for v in state.values())
    if isinstance(state, (list, tuple)):
        return sum(tensor_bytes(v) for v in state)
    return 0
