"""Approximate k-means (Alg. 2-3): quality against exact k-means, any k, degenerate input."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from mvc.quant import LogSketch, approx_kmeans, weighted_kmeans_1d
from mvc.quant.kmeans import bucket_weights, kmeanspp_init


def _lloyd_exact(x: np.ndarray, k: int, iters: int = 100) -> np.ndarray:
    """Plain Lloyd over every value from quantile init: the exact-k-means reference."""
    c = np.quantile(x, (np.arange(k) + 0.5) / k)
    for _ in range(iters):
        lv = np.searchsorted((c[:-1] + c[1:]) / 2, x)
        s = np.bincount(lv, weights=x, minlength=k)
        n = np.bincount(lv, minlength=k)
        c = np.where(n > 0, s / np.maximum(n, 1), c)
    return np.sort(c)


def _mse(x: np.ndarray, c: np.ndarray) -> float:
    lv = np.searchsorted((c[:-1] + c[1:]) / 2, x)
    return float(np.mean((x - c[lv]) ** 2))


@pytest.mark.parametrize("k", [3, 4, 8, 16])
def test_frequency_weighted_matches_exact_kmeans_mse(k):
    """With sigma = 1 (frequency only) the histogram clustering is within 10% of exact."""
    g = torch.Generator().manual_seed(k)
    x = (torch.randn(100_000, generator=g) * 0.02).numpy().astype(np.float64)
    c = approx_kmeans(LogSketch.from_tensor(torch.from_numpy(x).float()), k, sigma=1.0)
    assert c.shape == (k,) and np.all(np.diff(c) > 0)
    assert _mse(x, c) <= 1.1 * _mse(x, _lloyd_exact(x, k))


def test_magnitude_weight_moves_resolution_to_large_values():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(100_000, generator=g)
    sk = LogSketch.from_tensor(x)
    c_freq = approx_kmeans(sk, 8, sigma=1.0)
    c_mag = approx_kmeans(sk, 8, sigma=0.2)
    assert np.abs(c_mag).max() > np.abs(c_freq).max()


def test_bucket_weights_formula():
    vals = np.array([-2.0, 0.0, 1.0, 4.0])
    cnts = np.array([1, 10, 5, 2])
    w = bucket_weights(vals, cnts, 0.25)
    assert np.allclose(w, 0.25 * cnts / 10 + 0.75 * np.abs(vals) / 4)


def test_kmeanspp_is_seeded_and_distinct():
    vals = np.linspace(-1, 1, 500)
    w = np.ones(500)
    a = kmeanspp_init(vals, w, 10, torch.Generator().manual_seed(7))
    b = kmeanspp_init(vals, w, 10, torch.Generator().manual_seed(7))
    c = kmeanspp_init(vals, w, 10, torch.Generator().manual_seed(8))
    assert np.array_equal(a, b) and not np.array_equal(a, c)
    assert np.unique(a).size == 10


@pytest.mark.parametrize("k", [1, 2, 5, 7, 13, 100])
def test_any_k_sorted_and_inside_range(k):
    x = torch.randn(20_000, generator=torch.Generator().manual_seed(1))
    c = approx_kmeans(LogSketch.from_tensor(x), k)
    assert c.shape == (k,) and np.all(np.diff(c) >= 0)
    assert c.min() >= float(x.min()) * 1.02 and c.max() <= float(x.max()) * 1.02


def test_fewer_points_than_k_and_empty():
    g = torch.Generator().manual_seed(0)
    c = weighted_kmeans_1d(np.array([1.0, 2.0, 3.0]), np.ones(3), 5, g)
    assert np.array_equal(c, [1.0, 2.0, 3.0, 3.0, 3.0])
    assert np.array_equal(weighted_kmeans_1d(np.zeros(0), np.zeros(0), 3, g), np.zeros(3))
    assert np.array_equal(approx_kmeans(LogSketch(0.01), 4), np.zeros(4))
    # zero-weight points are ignored (sigma = 0 gives the zero bucket no weight)
    assert np.array_equal(approx_kmeans(LogSketch.from_tensor(torch.zeros(10)), 2, sigma=0.0), np.zeros(2))
