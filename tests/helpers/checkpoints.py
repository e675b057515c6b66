"""Realistic checkpoints for tests, and strict bitwise comparisons of nested states."""
from __future__ import annotations

import random
import struct
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


def small_mlp_state(seed: int = 0) -> dict:
    """A two-layer MLP's weights under "model": what the commit hook's search quantizes."""
    g = torch.Generator().manual_seed(seed)
    return {"model": {"fc1.weight": torch.randn(256, 128, generator=g) * 0.05,
                      "fc1.bias": torch.zeros(256),
                      "fc2.weight": torch.randn(10, 256, generator=g) * 0.05}}


# The strictest comparison: strides, requires_grad, float bits and storage sharing as well.

#: A same-size integer dtype to view a tensor's elements as (complex128 has none).
INT_VIEW = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


def tensor_bytes(t: torch.Tensor) -> bytes:
    """The tensor's logical values as raw bytes (works for every dtype, NaNs included)."""
    t = t.detach().cpu()
    if t.element_size() in INT_VIEW:
        t = t.view(INT_VIEW[t.element_size()])
    else:  # complex128
        t = torch.view_as_real(t).view(torch.int64)
    return t.contiguous().numpy().tobytes()


def assert_identical(a: Any, b: Any, path: str = "state") -> None:
    """Same types, key order (and key types), float bits and bit-identical tensors with strides."""
    assert type(a) is type(b), f"{path}: {type(a)} != {type(b)}"
    if isinstance(a, torch.Tensor):
        assert a.dtype == b.dtype, path
        assert a.shape == b.shape, path
        assert a.stride() == b.stride(), f"{path}: stride {a.stride()} != {b.stride()}"
        assert a.requires_grad == b.requires_grad, path
        assert tensor_bytes(a) == tensor_bytes(b), f"{path}: bytes differ"
    elif isinstance(a, dict):
        assert [(type(k), k) for k in a] == [(type(k), k) for k in b], f"{path}: keys differ"
        for k in a:
            assert_identical(a[k], b[k], f"{path}[{k!r}]")
        if isinstance(a, OrderedDict):
            assert_identical(getattr(a, "_metadata", None), getattr(b, "_metadata", None), f"{path}._metadata")
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b), path
        for i, (x, y) in enumerate(zip(a, b)):
            assert_identical(x, y, f"{path}[{i}]")
    elif isinstance(a, float):
        assert struct.pack(">d", a) == struct.pack(">d", b), f"{path}: {a!r} != {b!r}"
    elif isinstance(a, np.ndarray):
        assert a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes(), path
    elif isinstance(a, (set, frozenset)):
        assert a == b, path
    else:
        assert a == b, f"{path}: {a!r} != {b!r}"


def all_tensors(state: Any) -> list[torch.Tensor]:
    """Tensors in traversal order (dict values in order, sequences in order)."""
    found: list[torch.Tensor] = []

    def walk(v: Any) -> None:
        if isinstance(v, torch.Tensor):
            found.append(v)
        elif isinstance(v, dict):
            for item in v.values():
                walk(item)
        elif isinstance(v, (list, tuple)):
            for item in v:
                walk(item)

    walk(state)
    return found


def on_device(state: Any, device: str | torch.device) -> Any:
    """`state` with every tensor moved to `device` (dicts, lists and plain tuples rebuilt)."""
    if isinstance(state, torch.Tensor):
        return state.to(device)
    if isinstance(state, dict):
        return {k: on_device(v, device) for k, v in state.items()}
    if isinstance(state, list):
        return [on_device(v, device) for v in state]
    if type(state) is tuple:
        return tuple(on_device(v, device) for v in state)
    return state


def adam_state(*widths: int) -> dict[str, Any]:
    """{"model", "optimizer"} of Linear layers between successive `widths` (default one,
    64 -> 32) after three Adam steps: compressible moments and their partners."""
    widths = widths or (64, 32)
    layers = [torch.nn.Linear(a, b) for a, b in zip(widths, widths[1:])]
    model = layers[0] if len(layers) == 1 else torch.nn.Sequential(*layers)
    g = torch.Generator().manual_seed(0)
    opt = torch.optim.Adam(model.parameters())
    for _ in range(3):
        opt.zero_grad()
        model(torch.randn(8, widths[0], generator=g)).pow(2).mean().backward()
        opt.step()
    return {"model": model.state_dict(), "optimizer": opt.state_dict()}


def assert_same_sharing(a: Any, b: Any) -> None:
    """Object identity and storage sharing (with relative byte offsets) match pairwise."""
    ta, tb = all_tensors(a), all_tensors(b)
    assert len(ta) == len(tb)

    def where(t: torch.Tensor) -> tuple[int, int]:
        return t.untyped_storage().data_ptr(), t.storage_offset() * t.element_size()

    for i in range(len(ta)):
        for j in range(i + 1, len(ta)):
            assert (ta[i] is ta[j]) == (tb[i] is tb[j]), (i, j)
            if ta[i].numel() == 0 or ta[j].numel() == 0:
                continue
            (pa_i, oa_i), (pa_j, oa_j) = where(ta[i]), where(ta[j])
            (pb_i, ob_i), (pb_j, ob_j) = where(tb[i]), where(tb[j])
            assert (pa_i == pa_j) == (pb_i == pb_j), (i, j)
            if pa_i == pa_j:
                assert oa_i - oa_j == ob_i - ob_j, (i, j)


def realistic_checkpoint() -> dict[str, Any]:
    """A small trained model (tied weights) + AdamW + scheduler + RNG states, as torch.save sees it."""
    torch.manual_seed(0)
    random.seed(0)
    np.random.seed(0)
    model = torch.nn.Sequential(torch.nn.Embedding(16, 8), torch.nn.LayerNorm(8), torch.nn.Linear(8, 16))
    model[2].weight = model[0].weight  # tied
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=2)
    for _ in range(3):
        loss = model(torch.randint(0, 16, (4,))).square().mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        sched.step()
    return {
        "model": model.state_dict(),
        "optimizer": opt.state_dict(),
        "scheduler": sched.state_dict(),
        "epoch": 3,
        "rng": torch.get_rng_state(),
        "py_rng": random.getstate(),
        "np_rng": np.random.get_state(),
        "half": torch.randn(4, 4).to(torch.bfloat16),
        "counts": torch.arange(5, dtype=torch.int64),
    }
