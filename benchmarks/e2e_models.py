"""The two end-to-end workloads: a small CNN on digits and a char-level transformer LM.

Both use real data that ships offline and are deterministic given a seed:

* ``cnn``: a 2-conv CNN on scikit-learn's `load_digits` (8x8 handwritten digits),
  split train / validation (the quality hook the compressors see) / test (the
  figure reported).
* ``lm``: a 2-layer character-level transformer on the concatenated docstrings of
  a fixed list of Python standard-library modules (`inspect.getdoc`), split
  90 / 5 / 5 by position.

A `Workload` exposes `batch(step)` (the batch is a pure function of the step, so
a run that resumes after a restore sees the same data it would have seen) and
`loss(model, split)`.
"""
from __future__ import annotations

import inspect
import importlib
import math
from dataclasses import dataclass, field
from typing import Callable

import torch
from torch import nn

__all__ = ["Workload", "make_workload", "STDLIB_MODULES"]

#: Modules whose docstrings form the LM corpus (fixed list: reproducible per Python version).
STDLIB_MODULES = ("os", "re", "json", "collections", "functools", "itertools", "typing",
                  "pathlib", "argparse", "logging", "subprocess", "threading", "inspect",
                  "dataclasses", "string", "textwrap", "shutil", "tempfile", "heapq",
                  "bisect", "random", "statistics", "decimal", "fractions", "datetime",
                  "calendar", "csv", "configparser", "zipfile", "tarfile", "socket",
                  "asyncio", "unittest", "doctest", "pickle", "copy", "enum", "abc")


@dataclass
class Workload:
    """A model factory plus deterministic data access."""

    name: str
    build: Callable[[], nn.Module]
    batch: Callable[[int], tuple[torch.Tensor, torch.Tensor]]
    splits: dict[str, tuple[torch.Tensor, torch.Tensor]] = field(default_factory=dict)
    lr: float = 2e-3

    @torch.no_grad()
    def _outputs(self, model: nn.Module, split: str) -> tuple[torch.Tensor, torch.Tensor]:
        """(model outputs, targets) on a split, in eval mode (restored after)."""
        x, y = self.splits[split]
        was = model.training
        model.eval()
        out = model(x)
        model.train(was)
        return out, y

    def loss(self, model: nn.Module, split: str = "val") -> float:
        """Mean cross-entropy of `model` on a held-out split."""
        out, y = self._outputs(model, split)
        return float(nn.functional.cross_entropy(out.reshape(-1, out.shape[-1]), y.reshape(-1)))

    def accuracy(self, model: nn.Module, split: str = "test") -> float:
        """Top-1 accuracy on a split."""
        out, y = self._outputs(model, split)
        return float((out.argmax(-1) == y).float().mean())


# ---------------------------------------------------------------- CNN on digits
class DigitsCNN(nn.Module):
    """conv(1->32) - conv(32->64) - fc(4096->128) - fc(128->10); about 0.55M parameters."""

    def __init__(self) -> None:
        super().__init__()
        self.c1 = nn.Conv2d(1, 32, 3, padding=1)
        self.c2 = nn.Conv2d(32, 64, 3, padding=1)
        self.f1 = nn.Linear(64 * 8 * 8, 128)
        self.f2 = nn.Linear(128, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = torch.relu(self.c1(x.view(-1, 1, 8, 8)))
        x = torch.relu(self.c2(x))
        return self.f2(torch.relu(self.f1(x.flatten(1))))


def _digits(seed: int) -> Workload:
    from sklearn.datasets import load_digits

    ds = load_digits()
    x = torch.tensor(ds.data, dtype=torch.float32) / 16.0
    y = torch.tensor(ds.target, dtype=torch.int64)
    perm = torch.randperm(len(x), generator=torch.Generator().manual_seed(seed))
    x, y = x[perm], y[perm]
    n_te, n_va = len(x) // 5, len(x) // 10
    splits = {"test": (x[:n_te], y[:n_te]), "val": (x[n_te:n_te + n_va], y[n_te:n_te + n_va]),
              "train": (x[n_te + n_va:], y[n_te + n_va:])}
    xt, yt = splits["train"]

    def batch(step: int, bs: int = 64) -> tuple[torch.Tensor, torch.Tensor]:
        g = torch.Generator().manual_seed(seed * 100003 + step)
        idx = torch.randint(len(xt), (bs,), generator=g)
        return xt[idx], yt[idx]

    def build() -> nn.Module:
        torch.manual_seed(seed)
        return DigitsCNN()

    return Workload("cnn-digits", build, batch, splits, lr=1e-3)


# ---------------------------------------------------------------- char transformer
def stdlib_corpus() -> str:
    """Concatenated docstrings of STDLIB_MODULES and their public members (ASCII only)."""
    parts = []
    for mod_name in STDLIB_MODULES:
        mod = importlib.import_module(mod_name)
        parts.append(inspect.getdoc(mod) or "")
        for name in sorted(getattr(mod, "__all__", None) or dir(mod)):
            if name.startswith("_"):
                continue
            obj = getattr(mod, name, None)
            if inspect.isfunction(obj) or inspect.isclass(obj):
                parts.append(inspect.getdoc(obj) or "")
    text = "\n\n".join(p for p in parts if p)
    return "".join(ch for ch in text if 32 <= ord(ch) < 127 or ch == "\n")


class CharLM(nn.Module):
    """A pre-norm causal transformer: d=128, 2 layers, 4 heads, context 64."""

    def __init__(self, vocab: int, d: int = 128, layers: int = 2, ctx: int = 64) -> None:
        super().__init__()
        self.tok = nn.Embedding(vocab, d)
        self.pos = nn.Embedding(ctx, d)
        layer = nn.TransformerEncoderLayer(d, 4, 4 * d, dropout=0.0, batch_first=True,
                                           norm_first=True)
        self.body = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
        self.norm = nn.LayerNorm(d)
        self.head = nn.Linear(d, vocab)
        self.register_buffer("mask", nn.Transformer.generate_square_subsequent_mask(ctx),
                             persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        t = x.shape[1]
        h = self.tok(x) + self.pos(torch.arange(t))
        h = self.body(h, mask=self.mask[:t, :t], is_causal=True)
        return self.head(self.norm(h))


def _charlm(seed: int, ctx: int = 64) -> Workload:
    text = stdlib_corpus()
    chars = sorted(set(text))
    lut = {c: i for i, c in enumerate(chars)}
    data = torch.tensor([lut[c] for c in text], dtype=torch.int64)
    n = len(data)
    tr, va, te = data[: int(n * 0.9)], data[int(n * 0.9): int(n * 0.95)], data[int(n * 0.95):]

    def windows(seq: torch.Tensor, count: int) -> tuple[torch.Tensor, torch.Tensor]:
        starts = torch.linspace(0, len(seq) - ctx - 2, count).long()
        x = torch.stack([seq[s: s + ctx] for s in starts])
        y = torch.stack([seq[s + 1: s + ctx + 1] for s in starts])
        return x, y

    splits = {"val": windows(va, 64), "test": windows(te, 256)}

    def batch(step: int, bs: int = 32) -> tuple[torch.Tensor, torch.Tensor]:
        g = torch.Generator().manual_seed(seed * 100003 + step)
        starts = torch.randint(len(tr) - ctx - 1, (bs,), generator=g)
        x = torch.stack([tr[s: s + ctx] for s in starts])
        y = torch.stack([tr[s + 1: s + ctx + 1] for s in starts])
        return x, y

    def build() -> nn.Module:
        torch.manual_seed(seed)
        return CharLM(len(chars), ctx=ctx)

    wl = Workload("charlm-stdlib", build, batch, splits, lr=2e-3)
    wl.corpus_chars = n  # type: ignore[attr-defined]
    return wl


def make_workload(name: str, seed: int = 0) -> Workload:
    """`cnn` or `lm`."""
    if name == "cnn":
        return _digits(seed)
    if name == "lm":
        return _charlm(seed)
    raise ValueError(f"unknown workload {name!r}")


def n_params(model: nn.Module) -> int:
    """Parameter count."""
    return sum(p.numel() for p in model.parameters())


if __name__ == "__main__":
    import time

    for wname in ("cnn", "lm"):
        wl = make_workload(wname)
        m = wl.build()
        opt = torch.optim.Adam(m.parameters(), lr=wl.lr)
        t0 = time.perf_counter()
        for s in range(100):
            x, y = wl.batch(s)
            out = m(x)
            loss = nn.functional.cross_entropy(out.reshape(-1, out.shape[-1]), y.reshape(-1))
            opt.zero_grad()
            loss.backward()
            opt.step()
        print(wname, n_params(m), getattr(wl, "corpus_chars", None),
              f"{(time.perf_counter() - t0) / 100 * 1e3:.1f} ms/step", wl.loss(m), wl.loss(m, "test"),
              math.exp(wl.loss(m)))
