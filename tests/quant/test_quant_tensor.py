"""quantize() / QuantizedTensor: level convention, exact protect/prune, determinism, errors."""
from __future__ import annotations

import pytest
import torch

import mvc.quant.tensor as qt
from mvc.errors import DataError, UsageError
from mvc.quant import (NonFiniteTensorError, QuantConfigError, QuantError, QuantizedPartsError,
                       QuantizedTensor, QuantStateError, quantize)

DTYPES = [torch.float32, torch.float16, torch.bfloat16, torch.float64]
cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


def _w(shape=(256, 384), seed=0, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(*shape, generator=g) * 0.05).to(dtype)


def _same(a: QuantizedTensor, b: QuantizedTensor) -> bool:
    return (torch.equal(a.levels, b.levels) and torch.equal(a.centroids, b.centroids)
            and torch.equal(a.protected, b.protected) and a.dtype == b.dtype and a.bins == b.bins)


def test_determinism():
    w = _w()
    g = torch.randn_like(w)
    kw = dict(prune=0.2, protect=0.01, grad=g, seed=123)
    assert _same(quantize(w, 13, **kw), quantize(w.clone(), 13, **kw))
    assert _same(quantize(w, 16), quantize(w, 16))


def test_level_convention_and_dtypes():
    w = _w()
    q = quantize(w, 6, prune=0.25, protect=0.02)
    assert q.levels.shape == w.shape and q.levels.dtype == torch.uint8
    assert q.centroids.dtype == torch.float32 and q.centroids.shape == (6,)
    assert torch.all(q.centroids[1:] >= q.centroids[:-1])
    assert q.n_levels == 8 and int(q.levels.max()) <= 7
    deq = q.dequantize()
    lv = q.levels.long()
    table = torch.cat([q.centroids, torch.zeros(2)])
    expect = table[lv]
    expect[lv == 7] = q.protected
    assert torch.equal(deq, expect)
    assert quantize(w, 254).levels.dtype == torch.uint8  # 256 levels
    assert quantize(w, 255).levels.dtype == torch.int16
    assert quantize(w, 300).levels.dtype == torch.int16


@pytest.mark.parametrize("dtype", DTYPES)
def test_protected_values_restore_exactly(dtype):
    w = _w(dtype=dtype)
    w.view(-1)[::997] *= 40  # outliers that must be protected
    q = quantize(w, 8, protect=0.01)
    assert q.protected.dtype == dtype
    deq = q.dequantize()
    assert deq.dtype == dtype and deq.shape == w.shape
    prot = q.levels == q.protected_level
    assert 0.005 <= prot.float().mean() <= 0.02
    assert torch.equal(deq[prot], w[prot])
    assert torch.equal(q.protected, w.reshape(-1)[prot.reshape(-1)])  # flattened C order
    assert bool(prot[w.abs() >= w.abs().max() * 0.9].all())


@pytest.mark.parametrize("dtype", DTYPES)
def test_pruned_values_exactly_zero(dtype):
    w = _w(dtype=dtype)
    q = quantize(w, 4, prune=0.3)
    pruned = q.levels == q.pruned_level
    assert 0.27 <= pruned.float().mean() <= 0.33
    deq = q.dequantize()
    assert bool((deq[pruned] == 0).all())
    # by magnitude: everything pruned is smaller than everything kept
    assert float(w[pruned].abs().max()) <= float(w[~pruned].abs().min())


def test_sensitivity_protects_small_but_sensitive_weights():
    w = _w((100, 100))
    g = torch.zeros_like(w)
    g.view(-1)[:50] = 1e4  # huge gradients on 50 parameters, whatever their size
    q = quantize(w, 8, protect=0.005, grad=g)
    prot = (q.levels == q.protected_level).reshape(-1)
    assert bool(prot[:50].all())
    assert torch.equal(q.dequantize().reshape(-1)[:50], w.reshape(-1)[:50])


def test_sensitivity_pruning():
    w = _w((100, 100))
    g = torch.rand_like(w)
    q = quantize(w, 8, prune=0.5, prune_metric="sensitivity", grad=g)
    s = (g * w).abs()
    pruned = q.levels == q.pruned_level
    assert 0.45 <= pruned.float().mean() <= 0.55
    assert float(s[pruned].max()) <= float(s[~pruned].min())


def test_dequantize_is_bit_identical_and_from_parts_round_trips():
    w = _w(dtype=torch.bfloat16)
    q = quantize(w, 11, prune=0.1, protect=0.01)
    a, b = q.dequantize(), q.dequantize()
    assert torch.equal(a.view(torch.int16), b.view(torch.int16))
    r = QuantizedTensor.from_parts(q.levels.clone(), q.centroids.clone(), q.protected.clone(),
                                   q.dtype, q.bins)
    assert torch.equal(r.dequantize().view(torch.int16), a.view(torch.int16))
    r64 = QuantizedTensor.from_parts(q.levels.long(), q.centroids, q.protected, q.dtype, q.bins)
    assert r64.levels.dtype == torch.uint8 and torch.equal(r64.dequantize(), a)


def test_from_parts_rejects_inconsistent_parts():
    q = quantize(_w(), 4, protect=0.01)
    lv, c, p = q.levels, q.centroids, q.protected
    bad = [
        (lv, c[:3], p, torch.float32, 4),                    # centroid count
        (lv, c.flip(0), p, torch.float32, 4),                # unsorted
        (lv, c.double(), p, torch.float32, 4),               # centroid dtype
        (lv, c, p[:-1], torch.float32, 4),                   # protected count
        (lv, c, p.half(), torch.float32, 4),                 # protected dtype
        (lv.float(), c, p, torch.float32, 4),                # level dtype
        (torch.full_like(lv, 9), c, p[:0], torch.float32, 4),  # out of range
        (lv, c, p, torch.int32, 4),                          # non-float dtype
        (lv, torch.tensor([0, 1, 2, float("nan")]), p, torch.float32, 4),
    ]
    for args in bad:
        with pytest.raises(QuantizedPartsError) as ei:
            QuantizedTensor.from_parts(*args)
        assert isinstance(ei.value, DataError)


def test_degenerate_inputs():
    const = torch.full((5000,), 0.3)
    assert torch.equal(quantize(const, 4).dequantize(), const)
    zeros = torch.zeros(64, 64)
    assert torch.equal(quantize(zeros, 8).dequantize(), zeros)
    three = torch.tensor([-1.5, 0.25, 3.0]).repeat(1000)
    assert torch.equal(quantize(three, 4).dequantize(), three)
    one = quantize(_w(), 1)
    assert one.centroids.numel() == 1 and int(one.levels.max()) == 0
    empty = quantize(torch.empty(0, 3), 4)
    assert empty.dequantize().shape == (0, 3)
    scalar = quantize(torch.tensor(2.5), 2)
    assert scalar.dequantize().shape == () and float(scalar.dequantize()) == 2.5
    assert torch.equal(quantize(torch.ones(10), 3, protect=1.0).dequantize(), torch.ones(10))
    assert torch.equal(quantize(torch.ones(10), 3, prune=1.0).dequantize(), torch.zeros(10))


def test_non_contiguous_input():
    w = _w((64, 96))
    assert _same(quantize(w.t(), 8, prune=0.1), quantize(w.t().contiguous(), 8, prune=0.1))


def test_native_and_torch_paths_agree(monkeypatch):
    w = _w((300, 200), seed=4)
    g = torch.randn_like(w)
    cases = [dict(), dict(prune=0.3), dict(protect=0.01, grad=g),
             dict(prune=0.2, prune_metric="sensitivity", protect=0.002, grad=g)]
    native = [quantize(w, 9, **kw) for kw in cases]
    monkeypatch.setattr(qt, "native_ok", lambda x, dtype: False)
    torch_path = [quantize(w, 9, **kw) for kw in cases]
    for a, b in zip(native, torch_path):
        assert _same(a, b)


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -float("inf")])
def test_non_finite_policy(bad):
    w = _w()
    w[3, 4] = bad
    with pytest.raises(NonFiniteTensorError, match="enc.weight"):
        quantize(w, 8, name="enc.weight")
    g = torch.randn_like(w)
    g[0, 0] = bad
    with pytest.raises(NonFiniteTensorError, match="gradient"):
        quantize(_w(), 8, protect=0.01, grad=g, name="enc.weight")


def test_usage_errors():
    w = _w()
    for kwargs in [dict(bins=0), dict(bins=2.5), dict(bins=8, prune=1.5), dict(bins=8, protect=-0.1),
                   dict(bins=8, prune_metric="random"), dict(bins=8, sigma=2.0), dict(bins=8, alpha=0.0),
                   dict(bins=8, prune=0.1, prune_metric="sensitivity"), dict(bins=8, seed="x"),
                   dict(bins=8, protect=0.1, grad=torch.ones(3))]:
        with pytest.raises(QuantConfigError) as ei:
            quantize(w, **kwargs)
        assert isinstance(ei.value, UsageError)
    with pytest.raises(QuantConfigError):
        quantize(torch.arange(10), 4)


def test_exit_codes_distinct_and_in_range():
    classes = [QuantError, NonFiniteTensorError, QuantConfigError, QuantizedPartsError, QuantStateError]
    codes = [c.exit_code for c in classes]
    assert len(set(codes)) == len(codes) and all(30 <= c <= 39 for c in codes)


@cuda
def test_cuda_matches_cpu():
    w = _w((512, 512), seed=9)
    g = torch.randn_like(w)
    a = quantize(w, 12, prune=0.2, protect=0.01, grad=g)
    b = quantize(w.cuda(), 12, prune=0.2, protect=0.01, grad=g.cuda())
    assert b.levels.is_cuda and b.dequantize().is_cuda
    assert torch.equal(a.levels, b.levels.cpu()) and torch.equal(a.centroids, b.centroids.cpu())


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("bins", [5, 300])
def test_native_dequantize_bit_identical_to_torch_rule(dtype, bins, monkeypatch):
    w = _w(dtype=dtype)
    q = quantize(w, bins, prune=0.1, protect=0.01)
    native = q.dequantize()
    monkeypatch.setattr(qt, "native_ok", lambda x, dtype: False)
    ref = q.dequantize()
    bits = {2: torch.int16, 4: torch.int32, 8: torch.int64}[native.element_size()]
    assert native.dtype == ref.dtype == dtype
    assert torch.equal(native.view(bits), ref.view(bits))


@pytest.mark.parametrize("bins", [5, 300])
def test_torch_lookup_in_chunks_is_the_whole_lookup(bins, monkeypatch):
    """The torch path looks levels up a chunk of indices at a time (a device's memory); chunks
    that do not divide the tensor give the native lookup's bits, protected values included."""
    w = _w(dtype=torch.bfloat16)
    q = quantize(w, bins, prune=0.1, protect=0.01)
    assert q.protected.numel()
    native = q.dequantize()
    monkeypatch.setattr(qt, "native_ok", lambda x, dtype: False)
    monkeypatch.setattr(qt, "LOOKUP_CHUNK", 77)
    assert torch.equal(q.dequantize().view(torch.int16), native.view(torch.int16))


def test_dequantize_rejects_inconsistent_parts():
    q = quantize(_w(), 4, protect=0.01)
    broken = QuantizedTensor(q.levels, q.centroids, q.protected[:-1], q.dtype, q.bins)
    with pytest.raises(QuantizedPartsError):
        broken.dequantize()


@pytest.mark.skipif(not hasattr(__import__("os"), "fork"), reason="needs os.fork")
def test_works_in_a_forked_child():
    """The kernels' thread pool is re-created after fork (an inherited one would hang)."""
    import os

    w = _w((1024, 600))  # big enough to use the thread pool
    quantize(w, 8)
    pid = os.fork()
    if pid == 0:  # pragma: no cover - child
        ok = quantize(w, 8).levels.numel() == w.numel()
        os._exit(0 if ok else 1)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0


def test_warm_start_keeps_levels_stable_between_checkpoints():
    from mvc.quant import quantize

    g = torch.Generator().manual_seed(11)
    w = torch.randn(512, 512, generator=g) * 0.05
    w2 = w + 0.0005 * torch.randn(512, 512, generator=g)
    q1 = quantize(w, 16, seed=0)
    cold = quantize(w2, 16, seed=1)
    warm = quantize(w2, 16, seed=1, init=q1.centroids)
    moved_cold = (cold.levels != q1.levels).float().mean().item()
    moved_warm = (warm.levels != q1.levels).float().mean().item()
    assert moved_warm < moved_cold and moved_warm < 0.1
    # still a good quantizer: error close to the cold start's
    err = lambda q: (q.dequantize() - w2).norm().item()
    assert err(warm) <= err(cold) * 1.1
    # deterministic
    again = quantize(w2, 16, seed=1, init=q1.centroids)
    assert torch.equal(again.levels, warm.levels) and torch.equal(again.centroids, warm.centroids)
