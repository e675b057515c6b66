"""QuantizedTensors and level streams for the codec tests: builders and a bitwise comparison."""
from __future__ import annotations

import numpy as np
import torch

from mvc.quant import QuantizedTensor, level_dtype


def make_q(levels: np.ndarray, bins: int, dtype: torch.dtype = torch.float32, seed: int = 0):
    """A QuantizedTensor with the given levels, sorted random centroids, random protected values."""
    g = torch.Generator().manual_seed(seed)
    cent = torch.sort(torch.randn(bins, generator=g)).values.to(torch.float32)
    n_prot = int(np.count_nonzero(levels == bins + 1))
    prot = (torch.randn(n_prot, generator=g) * 3).to(dtype)
    lv = torch.from_numpy(levels.astype(np.int64)).to(level_dtype(bins))
    return QuantizedTensor.from_parts(lv, cent, prot, dtype, bins)


def payload(enc) -> bytes:
    return b"".join(bytes(p) for p in enc.parts)


def assert_same(q, r) -> None:
    assert r.bins == q.bins and r.dtype == q.dtype
    assert r.levels.shape == q.levels.shape
    assert torch.equal(r.levels.to(torch.int64), q.levels.to(torch.int64))
    assert torch.equal(r.centroids, q.centroids.to(torch.float32))
    assert r.protected.dtype == q.dtype
    assert torch.equal(r.protected.view(torch.uint8), q.protected.view(torch.uint8))
    a, b = q.dequantize(), r.dequantize()
    assert torch.equal(a.view(torch.uint8), b.view(torch.uint8))  # bit-identical


def evolve(parent: np.ndarray, n_prev: int, n_cur: int, change: float, rng) -> np.ndarray:
    """A child level stream: the parent mapped onto the new bin count, a fraction moved."""
    k_prev, k_cur = n_prev - 2, n_cur - 2
    child = np.where(parent < k_prev, np.minimum(parent * k_cur // max(k_prev, 1), k_cur - 1),
                     parent - k_prev + k_cur)
    moved = rng.random(parent.size) < change
    child[moved] = rng.integers(0, n_cur, int(moved.sum()))
    return child
