"""Floats the float32 quantizer cannot take as they are, in a lossy commit: those of a byte or
less (float8 variants, the e8m0 scale type, packed float4), and float64 tensors whose values lie
outside float32's range.

They are stored exactly: torch lacks most kernels for them (float4 does not convert to float32,
which the quantizer's sketches need; float8 has no masked_scatter, which a restore took), and
they are 8 bits or fewer already. Before, a float4 tensor made a lossy commit fail, and a float8
one committed quantized and then could not be checked out. A float8 quantization such a commit
stored still restores (the lookup runs over the values' bits). A float64 tensor of values near
1e-50 became zeros in float32, measured against themselves as a perfect quantization, and was
stored as zeros: it is now stored exactly.
"""
from __future__ import annotations

import pytest
import torch

from mvc.dtypes import QUANTIZABLE
from mvc.quant import QuantPolicy, quantize
from mvc.repo import lossy
from mvc.repo.repository import Repo

NARROW = [getattr(torch, n) for n in ("float8_e4m3fn", "float8_e5m2", "float8_e4m3fnuz",
                                      "float8_e5m2fnuz", "float8_e8m0fnu", "float4_e2m1fn_x2")
          if hasattr(torch, n)]


def _narrow(dtype: torch.dtype, n: int = 8192) -> torch.Tensor:
    g = torch.Generator().manual_seed(0)
    if dtype.itemsize == 1 and str(dtype).startswith("torch.float4"):
        return torch.randint(0, 256, (n // 64, 64), dtype=torch.uint8, generator=g).view(dtype)
    if "e8m0" in str(dtype):
        return torch.exp2(torch.randint(-20, 20, (n // 64, 64), generator=g).float()).to(dtype)
    return (torch.randn(n // 64, 64, generator=g) * 0.3).to(dtype)


def _bits(t: torch.Tensor) -> bytes:
    return t.contiguous().view(torch.uint8).numpy().tobytes()


@pytest.mark.parametrize("dtype", NARROW, ids=str)
def test_the_policy_never_quantizes_a_narrow_float(dtype):
    t = _narrow(dtype)
    assert dtype not in QUANTIZABLE
    assert not QuantPolicy().should_quantize("layers.0.weight", t)
    assert not QuantPolicy(include=("*",), min_numel=0).should_quantize("layers.0.weight", t)
    assert QuantPolicy().should_quantize("layers.0.weight", torch.randn(128, 64))


def test_a_lossy_commit_stores_narrow_floats_exactly(tmp_path):
    g = torch.Generator().manual_seed(1)
    state = {"model": {f"layers.{i}.weight": _narrow(d) for i, d in enumerate(NARROW)}}
    state["model"]["head.weight"] = torch.randn(256, 64, generator=g)
    with Repo.init(tmp_path / "r") as repo:
        cid = repo.commit(state, "narrow", epsilon=0.05)
        recs = {r.name: r for r in repo.read_snapshot(repo.read_commit(cid).snapshot).tensors}
        back = repo.read_state(cid)["model"]
    assert lossy.is_quantized(recs["model/head.weight"])      # the float32 weight is quantized
    for i, d in enumerate(NARROW):
        name = f"layers.{i}.weight"
        assert not lossy.is_quantized(recs[f"model/{name}"]), d
        assert back[name].dtype == d and _bits(back[name]) == _bits(state["model"][name]), d


@pytest.mark.parametrize("dtype", [d for d in NARROW if d.is_floating_point and "float8_e" in str(d)
                                   and "e8m0" not in str(d)], ids=str)
def test_a_stored_float8_quantization_restores(dtype):
    """What an earlier mvc stored for a float8 tensor: its lookup (protected values too) gives
    each level's centroid in float8, bit for bit, where torch has no float8 masked_scatter."""
    t = _narrow(dtype)
    q = quantize(t, 8, protect=0.02)
    assert q.protected.numel() and q.protected.dtype == dtype
    got = q.dequantize()
    assert got.dtype == dtype and got.shape == t.shape
    table = q.centroids.to(dtype)
    flat = q.levels.reshape(-1).long()
    want = torch.zeros(t.numel(), dtype=torch.uint8)
    kept = flat < q.bins
    want[kept] = table.view(torch.uint8)[flat[kept]]
    want[flat == q.protected_level] = q.protected.view(torch.uint8)
    assert _bits(got) == _bits(want.view(dtype).reshape(t.shape))


@pytest.mark.parametrize("scale", [1e-50, 1e-42, 1e50])
def test_float64_values_outside_float32s_range_are_stored_exactly(tmp_path, scale):
    g = torch.Generator().manual_seed(2)
    t = torch.randn(64, 128, generator=g, dtype=torch.float64) * scale
    ok = torch.randn(64, 128, generator=g, dtype=torch.float64)
    assert not QuantPolicy().should_quantize("layers.0.weight", t)
    assert QuantPolicy().should_quantize("layers.1.weight", ok)
    with Repo.init(tmp_path / "r") as repo:
        cid = repo.commit({"layers.0.weight": t, "layers.1.weight": ok}, "f64", epsilon=0.05)
        recs = {r.name: r for r in repo.read_snapshot(repo.read_commit(cid).snapshot).tensors}
        back = repo.read_state(cid)
    assert not lossy.is_quantized(recs["layers.0.weight"])
    assert lossy.is_quantized(recs["layers.1.weight"])
    assert torch.equal(back["layers.0.weight"], t)


def test_a_float64_moment_outside_float32s_range_is_stored_exactly():
    from mvc.quant.optimizer import quantize_optimizer_state

    g = torch.Generator().manual_seed(3)
    v = torch.rand(8192, generator=g, dtype=torch.float64) * 1e-50
    ok = torch.rand(8192, generator=g, dtype=torch.float64) * 1e-6
    got = quantize_optimizer_state({"opt/state/0/exp_avg_sq": v, "opt/state/1/exp_avg_sq": ok})
    assert "opt/state/0/exp_avg_sq" not in got and "opt/state/1/exp_avg_sq" in got
