"""Baseline quantizers the benchmark measures mvc.quant against (benchmarks only).

- uniform: min-max uniform quantization (the Check-N-Run / QD-compressor family).
- exact k-means on the raw values: scikit-learn `KMeans` (k-means++ init, n_init=1),
  and a torch Lloyd over every value with k-means++ init (1-D, so assignment is a
  bucketize against midpoints; this is exact k-means, just specialised to 1-D).
"""
from __future__ import annotations

import numpy as np
import torch


def reconstruct(w: torch.Tensor, centers: np.ndarray | torch.Tensor) -> torch.Tensor:
    """Replace every value of `w` by its nearest centre (float32, w's shape)."""
    c = torch.as_tensor(np.sort(np.asarray(centers, dtype=np.float64))).to(torch.float32)
    x = w.reshape(-1).to(torch.float32)
    mids = ((c[:-1].double() + c[1:].double()) / 2).float()
    return c[torch.bucketize(x, mids)].reshape(w.shape)


def uniform_quantize(w: torch.Tensor, bins: int) -> torch.Tensor:
    """Min-max uniform quantization to `bins` levels; returns the reconstruction (float32)."""
    x = w.to(torch.float32)
    lo, hi = float(x.min()), float(x.max())
    if bins < 2 or hi == lo:
        return torch.full_like(x, (lo + hi) / 2)
    step = (hi - lo) / (bins - 1)
    return torch.round((x - lo) / step).clamp_(0, bins - 1) * step + lo


def sklearn_kmeans(w: torch.Tensor, k: int, seed: int = 0) -> np.ndarray:
    """Exact k-means centres of the raw values (scikit-learn, k-means++ init, n_init=1)."""
    from sklearn.cluster import KMeans

    x = w.reshape(-1, 1).to(torch.float32).numpy()
    km = KMeans(n_clusters=k, init="k-means++", n_init=1, random_state=seed).fit(x)
    return np.sort(km.cluster_centers_.ravel().astype(np.float64))


def torch_lloyd(w: torch.Tensor, k: int, seed: int = 0, max_iter: int = 300,
                tol: float = 1e-7) -> np.ndarray:
    """Exact 1-D k-means over every value: k-means++ seeding, Lloyd to convergence."""
    x = w.reshape(-1).to(torch.float32)
    g = torch.Generator().manual_seed(seed)
    first = int(torch.randint(x.numel(), (1,), generator=g))
    cents = [x[first]]
    d2 = (x - cents[0]) ** 2
    for _ in range(1, k):
        if float(d2.sum()) <= 0:
            break
        i = int(torch.multinomial(d2, 1, generator=g))
        cents.append(x[i])
        d2 = torch.minimum(d2, (x - x[i]) ** 2)
    c = torch.sort(torch.stack(cents).double()).values
    xd = x.double()
    scale = float(x.abs().max()) or 1.0
    for _ in range(max_iter):
        mids = (c[:-1] + c[1:]) / 2
        lv = torch.bucketize(xd, mids)
        s = torch.bincount(lv, weights=xd, minlength=c.numel())
        n = torch.bincount(lv, minlength=c.numel())
        new = torch.where(n > 0, s / n.clamp(min=1), c)
        new = torch.sort(new).values
        if float((new - c).abs().max()) <= tol * scale:
            c = new
            break
        c = new
    return c.numpy()
