"""Issue 27: a layer type's tensors quantized and sketched in one batched pass on their device
(mvc.quant.batched, mvc.quant.batched_sketch), against the per-tensor paths.

`device_path()` sends host tensors down the torch path, so CPU CI runs the code a GPU runs.
The batched pass must give every tensor the levels, centroids and protected values of
`quantize_prepared` (on the native path and the per-tensor torch one), the same level counts and
the error sums to float64 summation order; and its host synchronisations must not grow with the
number of tensors (counted here as the ops that synchronise a CUDA stream).
"""
from __future__ import annotations

from contextlib import nullcontext

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings, strategies as st
from sync_counter import SyncCounter, cuda_syncs

from mvc.quant import LogSketch, QuantConfigError, quantize_prepared, sensitivity, thresholds
from mvc.quant.backend import device_path
from mvc.quant.batched import GroupJob, batchable, quantize_group
from mvc.quant.device_chunks import float_keys
from mvc.quant.batched_sketch import sketch_many
from mvc.quant.error import error_sums, level_histogram

cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")

RULES = [dict(), dict(prune=0.3), dict(protect=0.01), dict(prune=0.2, protect=0.02),
         dict(prune=0.2, protect=0.02, sens=True),
         dict(prune=0.25, metric="sensitivity", protect=0.01, sens=True)]


def _tensors(seed: int = 0) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    ts = [torch.randn(n, generator=g) * s for n, s in ((1000, 1.0), (70000, 0.02), (5000, 3.0))]
    ts.append((torch.randn(64, 63, generator=g) * 0.1).to(torch.bfloat16))
    ts.append((torch.randn(3000, generator=g) * 0.5).to(torch.float16))
    z = torch.randn(4097, generator=g)
    z[::7] = 0.0
    z[1::7] = -0.0
    ts.append(z)
    return ts


def _jobs(ts: list[torch.Tensor], grads: list[torch.Tensor], rules: dict, alpha: float = 0.01
          ) -> list[tuple[GroupJob, torch.Tensor | None]]:
    out = []
    for t, g in zip(ts, grads, strict=True):
        x = t.reshape(-1).float()
        sk = LogSketch.from_tensor(x, alpha)
        ssk = LogSketch.from_tensor(sensitivity(t, g), alpha) if rules.get("sens") else None
        thr = thresholds(sk.abs(), ssk, prune=rules.get("prune", 0.0),
                         prune_metric=rules.get("metric", "magnitude"),
                         protect=rules.get("protect", 0.0))
        sens = sensitivity(t, g) if thr.needs_sensitivity else None
        out.append((GroupJob(t, sk, thr, grad=g, weight=g), sens))
    return out


def _reference(job: GroupJob, sens: torch.Tensor | None, bins: int, family: str, device: bool):
    x = job.tensor.reshape(-1).float()
    with device_path() if device else nullcontext():
        return quantize_prepared(job.tensor, x, job.sketch, sens, job.thr, bins, seed=5,
                                 family=family)



def _same(a, b) -> bool:
    return (torch.equal(a.levels, b.levels) and a.levels.dtype == b.levels.dtype
            and torch.equal(a.centroids, b.centroids) and torch.equal(a.protected, b.protected)
            and a.protected.dtype == b.protected.dtype and a.bins == b.bins and a.dtype == b.dtype)


@pytest.mark.parametrize("family", ["kmeans", "uniform"])
@pytest.mark.parametrize("rules", RULES, ids=lambda r: "-".join(f"{k}" for k in r) or "plain")
def test_a_group_quantizes_as_each_tensor_alone(rules, family):
    ts = _tensors()
    grads = [torch.randn(t.shape, generator=torch.Generator().manual_seed(i))
             for i, t in enumerate(ts)]
    jobs = _jobs(ts, grads, rules)
    with device_path():
        got = quantize_group([j for j, _ in jobs], 16, seed=5, family=family, chunk=4099)
    for (job, sens), r in zip(jobs, got, strict=True):
        assert r is not None
        for device in (False, True):
            assert _same(r.q, _reference(job, sens, 16, family, device))
        ref = error_sums(r.q, job.tensor, job.weight)
        assert r.sums == pytest.approx(ref, rel=1e-12, abs=0.0)
        assert np.array_equal(r.counts, level_histogram(r.q).numpy())


@pytest.mark.parametrize("bins", [1, 2, 254, 300])
def test_bin_counts_at_the_level_dtypes_edges(bins):
    ts = _tensors(1)[:3]
    grads = [torch.ones_like(t) for t in ts]
    jobs = _jobs(ts, grads, dict(prune=0.1, protect=0.01))
    with device_path():
        got = quantize_group([j for j, _ in jobs], bins, seed=5)
    assert got[1] is not None  # 70k values: more buckets than bins
    for (job, sens), r in zip(jobs, got, strict=True):
        # None: no more distinct buckets than bins (left to the per-tensor path)
        assert r is None or _same(r.q, _reference(job, sens, bins, "kmeans", False))


def test_a_tensor_with_fewer_buckets_than_bins_is_left_to_the_per_tensor_path():
    ts = [torch.tensor([0.5, 0.5, -1.0]), torch.randn(500)]
    jobs = _jobs(ts, [torch.ones_like(t) for t in ts], {})
    with device_path():
        got = quantize_group([j for j, _ in jobs], 16)
    assert got[0] is None and got[1] is not None


def test_host_tensors_and_float64_are_not_batched():
    assert not batchable(torch.zeros(3))
    with device_path():
        assert batchable(torch.zeros(3)) and batchable(torch.zeros(3, dtype=torch.bfloat16))
        assert not batchable(torch.zeros(3, dtype=torch.float64))
        assert not batchable(torch.zeros(0))
        job = GroupJob(torch.zeros(3, dtype=torch.float64), LogSketch(), thresholds(
            LogSketch(), None, prune=0.0, prune_metric="magnitude", protect=0.0))
        with pytest.raises(QuantConfigError):
            quantize_group([job], 4)
    assert quantize_group([], 4) == []


def test_sensitivity_rules_need_a_gradient():
    t = torch.randn(100)
    (job, _), = _jobs([t], [torch.ones_like(t)], dict(protect=0.1, sens=True))
    job = GroupJob(job.tensor, job.sketch, job.thr)  # no grad
    with device_path(), pytest.raises(QuantConfigError, match="gradient"):
        quantize_group([job], 4)


_floats = st.floats(width=32, allow_nan=False)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(_floats, min_size=1, max_size=40), st.lists(_floats, min_size=1, max_size=40))
def test_float_keys_order_as_the_floats(a, b):
    x = torch.tensor(a + b, dtype=torch.float32)
    seg = torch.zeros(x.numel(), dtype=torch.int64)
    k = float_keys(x, seg)
    xs = x.double()
    assert torch.equal(k[:, None] < k[None, :], xs[:, None] < xs[None, :])
    assert torch.equal(k[:, None] == k[None, :], xs[:, None] == xs[None, :])
    # the tensor index comes first
    k2 = float_keys(x, seg + 1)
    assert bool((k2.min() > k.max()) or x.numel() == 0)


def test_values_on_a_midpoint_go_to_the_lower_centroid_as_bucketize():
    mids = torch.tensor([-1.0, -0.0, 0.0, 0.25, 0.25, 3.0])
    x = torch.tensor([-2.0, -1.0, -0.5, -0.0, 0.0, 1e-45, 0.25, 0.2500001, 3.0, 4.0])
    seg = torch.zeros(x.numel(), dtype=torch.int64)
    got = torch.searchsorted(float_keys(mids, torch.zeros(6, dtype=torch.int64)),
                             float_keys(x, seg))
    assert torch.equal(got, torch.bucketize(x, mids, right=False))


# ----------------------------------------------------------------------------- sketches
def test_sketch_many_counts_as_from_tensor():
    ts = _tensors(2)
    grads = [torch.randn(t.shape) for t in ts]
    with device_path():
        values = sketch_many(ts, 0.01, chunk=5000)
        sens = sketch_many(ts, 0.01, grads=grads, chunk=5000)
    for t, g, sk, ssk in zip(ts, grads, values, sens, strict=True):
        assert sk == LogSketch.from_tensor(t, 0.01)
        assert ssk == LogSketch.from_tensor(sensitivity(t, g), 0.01)


def test_sketch_many_marks_nonfinite_values_and_gradients():
    t = torch.randn(50)
    bad = t.clone()
    bad[3] = float("nan")
    g_inf = torch.ones(50)
    g_inf[7] = float("inf")
    with device_path():
        assert sketch_many([t, bad], 0.01)[1] is None
        got = sketch_many([t, t, t], 0.01, grads=[torch.ones(50), g_inf, None])
        with pytest.raises(QuantConfigError):
            sketch_many([t], 0.01, grads=[torch.ones(5)])
    assert got[0] is not None and got[1] is None and got[2] is None


# ----------------------------------------------------------------------------- synchronisations
def _count(n_tensors: int, batched: bool, rules: dict) -> SyncCounter:
    total = 1 << 15
    g = torch.Generator().manual_seed(3)
    ts = [torch.randn(total // n_tensors, generator=g) for _ in range(n_tensors)]
    grads = [torch.randn(t.shape, generator=g) for t in ts]
    jobs = _jobs(ts, grads, rules)
    with device_path(), SyncCounter(device=ts + grads) as counter:
        if batched:
            quantize_group([j for j, _ in jobs], 16, chunk=total)
        else:
            for j, sens in jobs:
                q = quantize_prepared(j.tensor, j.tensor.reshape(-1), j.sketch, sens, j.thr, 16)
                error_sums(q, j.tensor, j.weight)
                level_histogram(q)
    return counter


@pytest.mark.parametrize("rules", [dict(), dict(prune=0.2, protect=0.01, sens=True)],
                         ids=["plain", "prune-protect-sens"])
def test_a_groups_synchronisations_do_not_grow_with_its_tensors(rules):
    few, many = _count(4, True, rules), _count(64, True, rules)
    # the counts, the sums, and where rules need them the dropped values' histograms: the
    # protected values are gathered once the counts are on the host, by position (no chunk
    # waits to learn how many it holds), three launches for each tensor that has some;
    # otherwise the same kernel launches for 4 tensors as for 64
    assert many.syncs == few.syncs <= 3, (few.kinds, many.kinds)
    assert "masked_select" not in many.kinds
    assert many.ops - few.ops == (3 * 60 if rules else 0)
    # the per-tensor path's grow with the tensors: the counter sees them
    one_by_one = _count(64, False, rules), _count(4, False, rules)
    assert one_by_one[0].syncs >= one_by_one[1].syncs + 60 * 3
    assert one_by_one[0].ops >= 10 * one_by_one[1].ops


def test_a_chunk_reads_gradients_that_are_its_error_weights_once(monkeypatch):
    # A proxy search's error-sum weights are the gradients its sensitivity rules read (the same
    # tensor): a chunk reads them once. A GPU run keeps its gradients on the host
    # (mvc.integrations.grad_ema), so each read is a copy up to the device.
    import mvc.quant.batched as batched

    reads = []
    real = batched.flat_values
    monkeypatch.setattr(batched, "flat_values", lambda *a, **k: reads.append(1) or real(*a, **k))
    ts = _tensors()[:3]
    grads = [torch.randn(t.shape, generator=torch.Generator().manual_seed(i))
             for i, t in enumerate(ts)]
    rules = dict(prune=0.25, metric="sensitivity", protect=0.01, sens=True)
    shared = [j for j, _ in _jobs(ts, grads, rules)]
    apart = [GroupJob(j.tensor, j.sketch, j.thr, grad=j.grad, weight=j.weight.clone())
             for j in shared]
    n_chunks = -(-sum(t.numel() for t in ts) // 4099)
    got = {}
    for name, jobs in (("shared", shared), ("apart", apart)):
        reads.clear()
        with device_path():
            got[name] = quantize_group(jobs, 16, seed=5, chunk=4099)
        got[name + " reads"] = len(reads)
    assert got["apart reads"] - got["shared reads"] == n_chunks
    for a, b in zip(got["shared"], got["apart"], strict=True):
        assert _same(a.q, b.q) and a.sums == b.sums and np.array_equal(a.counts, b.counts)


def test_a_host_slice_goes_to_a_cuda_device_without_a_wait(monkeypatch):
    # A plain copy from pageable host memory synchronises the stream (once per chunk for a GPU
    # run's host gradients); `upload` goes through pinned memory, asynchronously.
    import mvc.quant.device_chunks as dc

    sent = []
    monkeypatch.setattr(dc, "upload", lambda t, device: sent.append((t, device)) or t)
    t = torch.arange(10.0)
    assert dc.to_device(t, torch.device("cpu")) is t and not sent
    dc.to_device(t[2:5], torch.device("cuda", 0))
    assert len(sent) == 1 and torch.equal(sent[0][0], t[2:5]) and sent[0][1].type == "cuda"


# ----------------------------------------------------------------------------- on a real GPU
@cuda
def test_cuda_group_is_the_host_group():  # pragma: no cover - no GPU in CI
    ts = _tensors()
    grads = [torch.randn(t.shape) for t in ts]
    for rules in RULES:
        jobs = _jobs(ts, grads, rules)
        with device_path():
            host = quantize_group([j for j, _ in jobs], 16, seed=5)
        dev_jobs = [GroupJob(j.tensor.cuda(), j.sketch, j.thr, grad=j.grad.cuda(),
                             weight=j.weight.cuda()) for j, _ in jobs]
        dev = quantize_group(dev_jobs, 16, seed=5)
        for h, d in zip(host, dev, strict=True):
            assert h is not None and d is not None
            assert _same(h.q, d.q.to("cpu"))
            assert np.array_equal(h.counts, d.counts)
            assert d.sums == pytest.approx(h.sums, rel=1e-12)


@cuda
def test_cuda_group_synchronises_a_fixed_number_of_times():  # pragma: no cover - no GPU in CI
    def count(n: int) -> int:
        g = torch.Generator().manual_seed(0)
        ts = [torch.randn((1 << 20) // n, generator=g).cuda() for _ in range(n)]
        jobs = [j for j, _ in _jobs([t.cpu() for t in ts], [t.cpu() for t in ts],
                                    dict(prune=0.2, protect=0.01))]
        jobs = [GroupJob(t, j.sketch, j.thr) for t, j in zip(ts, jobs, strict=True)]
        return cuda_syncs(lambda: quantize_group(jobs, 16)) + cuda_syncs(
            lambda: sketch_many(ts, 0.01))

    few, many = count(4), count(64)
    # counts + sums (the protected values are gathered after them by position, with
    # `nonzero_static`: no wait per tensor, or 64 tensors would wait more than 4); the
    # sketches' counts
    assert many == few and few <= 6, (few, many)


@cuda
def test_cuda_group_with_host_gradients_is_the_host_group_without_waits_per_chunk(
        ):  # pragma: no cover - no GPU in CI
    # the Tracker's and the Lightning callback's gradients are host tensors (their EMA) beside a
    # CUDA state: the same levels and sums, and no synchronisation per chunk for their copies
    def run(n: int) -> tuple[list, int]:
        g = torch.Generator().manual_seed(0)
        host = [torch.randn((1 << 20) // n, generator=g) for _ in range(n)]
        grads = [torch.randn(t.shape, generator=g) for t in host]
        jobs = [j for j, _ in _jobs(host, grads, dict(prune=0.2, protect=0.01, sens=True))]
        dev = [GroupJob(j.tensor.cuda(), j.sketch, j.thr, grad=j.grad, weight=j.weight)
               for j in jobs]
        with device_path():
            ref = quantize_group(jobs, 16, seed=5, chunk=1 << 16)
        got: list = []
        syncs = cuda_syncs(lambda: got.extend(quantize_group(dev, 16, seed=5, chunk=1 << 16)))
        for h, d in zip(ref, got, strict=True):
            assert _same(h.q, d.q.to("cpu")) and np.array_equal(h.counts, d.counts)
            assert d.sums == pytest.approx(h.sums, rel=1e-12)
        return got, syncs

    (_, few), (_, many) = run(4), run(64)
    assert many == few <= 4, (few, many)   # 16 chunks either way: none waits


@cuda
def test_cuda_degenerate_tensor_is_the_host_one_under_deterministic_algorithms(
        ):  # pragma: no cover - no GPU in CI
    # no more distinct values than bins (a zero-initialised LoRA-B, a constant): left out of the
    # batched pass, its levels' exact means are taken where CUDA's weighted bincount (float64
    # atomics) would raise under deterministic algorithms; the host path's bits
    ts = [torch.tensor([0.5, 0.5, -1.0] * 1000), torch.zeros(4096)]
    jobs = _jobs(ts, [torch.ones_like(t) for t in ts], {})
    torch.use_deterministic_algorithms(True)
    try:
        for job, sens in jobs:
            dev = GroupJob(job.tensor.cuda(), job.sketch, job.thr)
            got = _reference(dev, sens, 16, "kmeans", False)
            assert _same(_reference(job, sens, 16, "kmeans", False), got.to("cpu"))
    finally:
        torch.use_deterministic_algorithms(False)
