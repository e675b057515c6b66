"""The uniform quantizer family (mvc.quant.uniform): a grid inside the QuantizedTensor
convention, a dead zone that prunes, protected values exact, a deterministic step kept
between commits while still good, and the codecs storing it as they store k-means levels."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from mvc.codecs.quantized import decode_base, decode_delta, encode_base, encode_delta, encoded_size
from mvc.quant import QuantConfig, QuantConfigError, quantize, quantize_state
from mvc.quant.config import LayerQuant
from mvc.quant.uniform import STEP_SLACK, grid, grid_size, grid_step


def _weights(seed: int = 0, shape: tuple[int, int] = (256, 192)) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    # heavy-tailed, as trained weights are: a Laplace bulk and a few large outliers
    w = torch.distributions.Laplace(0.0, 0.02).sample(shape)
    w[torch.rand(shape, generator=g) < 0.001] *= 20
    return w


def _step(q) -> float:
    step = grid_step(q.centroids.numpy().astype(np.float64))
    assert step is not None
    return step


@pytest.mark.parametrize("bins", [4, 6, 16, 33])
def test_grid_is_the_quantized_tensor_convention(bins):
    w = _weights()
    q = quantize(w, bins, family="uniform", protect=0.001)
    k = grid_size(bins)
    assert q.bins == k and k % 2 == 1
    c = q.centroids
    assert c.dtype == torch.float32 and bool((c[1:] > c[:-1]).all())
    assert float(c[k // 2]) == 0.0
    step = _step(q)
    assert np.array_equal(grid(step, k), c.numpy().astype(np.float64))
    # every kept value is within half a step of its restored value
    d = q.dequantize()
    kept = q.levels != q.protected_level
    assert float((d - w)[kept].abs().max()) <= step / 2 * (1 + 1e-6)


def test_dead_zone_is_the_pruned_level_and_exact_zero():
    w = _weights()
    q = quantize(w, 16, family="uniform", protect=0.001)
    step = _step(q)
    small = w.abs() <= step / 2
    assert bool(small.any())
    assert bool((q.levels[small] == q.pruned_level).all())
    assert bool((q.dequantize()[small] == 0).all())
    # the zero centroid itself is never used with magnitude pruning: one symbol for 0
    assert int((q.levels == q.bins // 2).sum()) == 0
    # a prune fraction wider than the dead zone widens it
    wide = quantize(w, 16, family="uniform", protect=0.001, prune=0.6)
    assert int((wide.levels == wide.pruned_level).sum()) > int((q.levels == q.pruned_level).sum())
    assert int((wide.levels == wide.pruned_level).sum()) >= 0.6 * w.numel() * 0.97


def test_protected_values_are_exact():
    w = _weights()
    q = quantize(w, 8, family="uniform", protect=0.01)
    prot = q.levels == q.protected_level
    assert int(prot.sum()) > 0
    assert torch.equal(q.dequantize()[prot], w[prot])
    assert torch.equal(q.protected, w[prot])


def test_deterministic_and_float_dtypes():
    w = _weights()
    a = quantize(w, 16, family="uniform", protect=0.001)
    b = quantize(w.clone(), 16, family="uniform", protect=0.001)
    assert torch.equal(a.levels, b.levels) and torch.equal(a.centroids, b.centroids)
    h = quantize(w.to(torch.bfloat16), 16, family="uniform")
    assert h.dequantize().dtype == torch.bfloat16


def test_all_zero_tensor():
    q = quantize(torch.zeros(64, 64), 16, family="uniform")
    assert bool((q.dequantize() == 0).all())


def test_warm_start_keeps_the_step_and_deltas_stay_sparse():
    w = _weights()
    q0 = quantize(w, 16, family="uniform", protect=0.001)
    g = torch.Generator().manual_seed(1)
    w1 = w + 1e-4 * torch.randn(w.shape, generator=g)
    q1 = quantize(w1, 16, family="uniform", protect=0.001, init=q0.centroids)
    assert torch.equal(q1.centroids, q0.centroids)
    changed = float((q1.levels != q0.levels).float().mean())
    assert changed < 0.05
    base = encoded_size(encode_base(q1))
    delta = encode_delta(q1, q0.levels, q0.n_levels)
    assert encoded_size(delta) < base / 2
    back = decode_delta(delta.meta, b"".join(bytes(p) for p in delta.parts), w.dtype,
                        tuple(w.shape), q0.levels)
    assert torch.equal(back.dequantize(), q1.dequantize())


def test_warm_start_steps_again_when_the_parent_step_is_no_longer_good():
    w = _weights()
    q0 = quantize(w, 16, family="uniform")
    # the range doubled: the parent's grid no longer covers it
    q1 = quantize(w * 2, 16, family="uniform", init=q0.centroids)
    assert _step(q1) > 1.9 * _step(q0)
    # the range shrank a lot: the parent's step is too coarse
    q2 = quantize(w * 0.5, 16, family="uniform", init=q0.centroids)
    assert _step(q2) < _step(q0) / (1 + STEP_SLACK)
    # k-means centroids of the same count are not a grid: a fresh step
    km = quantize(w, grid_size(16), protect=0.0)
    q3 = quantize(w, 16, family="uniform", init=km.centroids)
    assert torch.equal(q3.centroids, q0.centroids)


def test_codec_round_trip():
    w = _weights()
    q = quantize(w, 32, family="uniform", protect=0.002)
    enc = encode_base(q)
    back = decode_base(enc.meta, b"".join(bytes(p) for p in enc.parts), w.dtype, tuple(w.shape))
    assert torch.equal(back.levels, q.levels) and torch.equal(back.centroids, q.centroids)
    assert torch.equal(back.dequantize(), q.dequantize())


def test_config_json_round_trip_and_default_family():
    c = QuantConfig(bins=12, prune=0.1, protect=0.005, family="uniform")
    d = c.to_dict()
    assert d["family"] == "uniform"
    assert QuantConfig.from_dict(d) == c
    km = QuantConfig(bins=12)
    # a k-means config is stored as before families existed, and a stored config without
    # the field is k-means
    assert "family" not in km.to_dict()
    assert QuantConfig.from_dict(km.to_dict()).family == "kmeans"
    assert c.for_layer_type("embedding") == LayerQuant(12, 0.1, "magnitude", 0.005, "uniform")
    with pytest.raises(QuantConfigError):
        QuantConfig(family="lloyd")
    with pytest.raises(QuantConfigError):
        quantize(torch.ones(8), 4, family="nope")


def test_quantize_state_uses_the_family():
    state = {"layer.weight": _weights(), "layer.bias": torch.randn(192)}
    out = quantize_state(state, QuantConfig(bins=8, family="uniform"))
    q = out["layer.weight"]
    assert q is not None and q.bins == grid_size(8) and out["layer.bias"] is None
    again = quantize_state(state, QuantConfig(bins=8, family="uniform"),
                           init={"layer.weight": q.centroids})
    assert torch.equal(again["layer.weight"].levels, q.levels)


def test_device_path_gives_the_same_levels():
    from mvc.quant.backend import device_path
    w = _weights()
    native = quantize(w, 16, family="uniform", protect=0.001, prune=0.2)
    with device_path():
        torch_path = quantize(w, 16, family="uniform", protect=0.001, prune=0.2)
    assert torch.equal(native.levels, torch_path.levels)
    assert torch.equal(native.centroids, torch_path.centroids)
    assert torch.equal(native.protected, torch_path.protected)
