"""Issue 27: the batched assignment chunk as one Triton kernel (mvc.quant.triton_assign), against
the torch path it replaces.

On the host the kernel runs in Triton's interpreter (`triton_path()`), so CPU-only CI checks
what a GPU compiles: the same levels, level counts, centroids and protected values as the torch
path's, and the error sums to float64 summation order (and, in the log domain, the sqrt's
rounding: Triton's is correctly rounded, torch's host sqrt is not always).
"""
from __future__ import annotations

from contextlib import nullcontext

import numpy as np
import pytest
import torch

pytest.importorskip("triton")

import mvc.quant.triton_assign as ta  # noqa: E402
from mvc.quant import LogSketch, sensitivity, thresholds  # noqa: E402
from mvc.quant.backend import device_path  # noqa: E402
from mvc.quant.batched import GroupJob, quantize_group  # noqa: E402
from mvc.quant.optimizer import quantize_optimizer_state  # noqa: E402

cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
# where CUDA is, conftest leaves Triton's interpreter off: the kernel then runs on the GPU only
host = pytest.mark.skipif(not ta.runs_on_host(), reason="Triton's interpreter is off")


def _tensors(seed: int = 0) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    # 20000 values: several of the interpreter's blocks (`HOST_BLOCK`) in one piece
    ts = [torch.randn(n, generator=g) * s for n, s in ((1000, 1.0), (20000, 0.02), (3000, 3.0))]
    ts.append((torch.randn(40, 63, generator=g) * 0.1).to(torch.bfloat16))
    ts.append((torch.randn(1500, generator=g) * 0.5).to(torch.float16))
    z = torch.randn(2049, generator=g)
    z[::7] = 0.0
    z[1::7] = -0.0
    ts.append(z)
    return ts


def _jobs(ts: list[torch.Tensor], rules: dict, weighted: bool) -> list[GroupJob]:
    out = []
    for i, t in enumerate(ts):
        x = t.reshape(-1).float()
        sk = LogSketch.from_tensor(x, 0.01)
        g = torch.randn(t.shape, generator=torch.Generator().manual_seed(100 + i))
        ssk = LogSketch.from_tensor(sensitivity(t, g), 0.01) if rules.get("sens") else None
        metric = rules.get("metric", "magnitude")
        if metric == "mixed":  # some tensors prune by sensitivity, some by magnitude
            metric = "sensitivity" if i % 2 else "magnitude"
        thr = thresholds(sk.abs(), ssk, prune=rules.get("prune", 0.0), prune_metric=metric,
                         protect=rules.get("protect", 0.0))
        w = torch.randn(t.shape, generator=torch.Generator().manual_seed(i)) if weighted else None
        out.append(GroupJob(t, sk, thr, grad=g if ssk is not None else None, weight=w))
    return out


def _same_q(a, b) -> bool:
    return (torch.equal(a.levels, b.levels) and a.levels.dtype == b.levels.dtype
            and torch.equal(a.centroids, b.centroids) and torch.equal(a.protected, b.protected)
            and a.protected.dtype == b.protected.dtype and a.bins == b.bins)


def _both(jobs, bins, ran: bool = True, **kw):
    with device_path():
        ref = quantize_group(jobs, bins, seed=5, **kw)
        before = ta.launches
        with ta.triton_path():
            got = quantize_group(jobs, bins, seed=5, **kw)
    # the kernel ran (a failure would have been served by the torch path, with a warning)
    assert (ta.launches > before) == ran and not (ran and ta._failed)
    return ref, got


RULES = [dict(), dict(prune=0.3), dict(protect=0.01), dict(prune=0.2, protect=0.02),
         dict(prune=0.2, protect=0.02, sens=True),
         dict(prune=0.25, metric="sensitivity", protect=0.01, sens=True),
         dict(prune=0.25, metric="mixed", sens=True)]


@host
@pytest.mark.parametrize("rules", RULES, ids=lambda r: "-".join(f"{k}" if v is True else f"{k}={v}"
                                                           for k, v in r.items()) or "plain")
@pytest.mark.parametrize("weighted", [False, True])
@pytest.mark.parametrize("chunk", [4099, None])
def test_the_kernel_quantizes_as_the_torch_path(rules, weighted, chunk):
    jobs = _jobs(_tensors(), rules, weighted)
    # chunks of 4099 values: pieces straddle chunks; whole chunks: a piece of several blocks,
    # the last one partial
    ref, got = _both(jobs, 16, chunk=chunk)
    for r, g in zip(ref, got, strict=True):
        assert r is not None and g is not None
        assert _same_q(g.q, r.q)
        assert np.array_equal(g.counts, r.counts)
        assert g.sums == pytest.approx(r.sums, rel=1e-12, abs=0.0)


@host
@pytest.mark.parametrize("bins", [1, 2, 3, 64, 254, 300])
def test_every_bins_count_and_level_dtype(bins):
    # 1-2 midpoints (the shortest search), 63 (a full power-of-two row), int16 levels past 254
    jobs = _jobs(_tensors(1)[:3], dict(prune=0.1, protect=0.01), False)
    ref, got = _both(jobs, bins)
    for r, g in zip(ref, got, strict=True):
        assert (r is None) == (g is None)
        if r is not None:
            assert _same_q(g.q, r.q) and np.array_equal(g.counts, r.counts)
            assert g.sums == pytest.approx(r.sums, rel=1e-12, abs=0.0)


@host
def test_values_on_midpoints_and_signed_zeros():
    # every value a midpoint, a centroid or a signed zero: ties go to the lower centroid
    base = torch.linspace(-2, 2, 33)
    t = torch.cat([base, (base[1:] + base[:-1]) / 2, torch.tensor([0.0, -0.0] * 20)])
    t = t.repeat(40)
    jobs = _jobs([t], {}, False)
    ref, got = _both(jobs, 8)
    assert _same_q(got[0].q, ref[0].q) and np.array_equal(got[0].counts, ref[0].counts)


def _moments(seed: int = 0) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    out = {}
    for i, n in enumerate((5000, 300, 7000)):
        m = torch.randn(n, generator=g) * 1e-3
        m[::5] = 0.0
        v = torch.exp(torch.randn(n, generator=g) * 2.5 - 16.0)
        v[::9] = 0.0
        v[1::9] = -0.0
        out[f"opt/state/{i}/exp_avg"] = m
        out[f"opt/state/{i}/exp_avg_sq"] = v
    return out


@host
@pytest.mark.parametrize("protect", [0.0, 0.01])
def test_moments_log_domain_and_set_aside_entries(protect):
    # second moments: log values, v <= 0 set aside; first moments: zeros set aside
    state = _moments()
    with device_path():
        ref = quantize_optimizer_state(state, protect=protect)
        before = ta.launches
        with ta.triton_path():
            got = quantize_optimizer_state(state, protect=protect)
    assert ta.launches > before and not ta._failed
    assert set(ref) == set(got) == set(state)
    for n in state:
        assert got[n].domain == ref[n].domain
        assert _same_q(got[n].q, ref[n].q), n


@host
@pytest.mark.parametrize("rules", [dict(), dict(prune=0.2, protect=0.01)],
                         ids=["plain", "prune-protect"])
def test_a_chunk_is_one_launch_and_the_group_waits_as_often(rules):
    # 4 chunks of 40,000 values: a chunk is the kernel and a few launches around it (37 on the
    # torch path, 6 here); the group still reads its counts and sums back once (and, with
    # protected values, gathers them)
    from sync_counter import SyncCounter

    g = torch.Generator().manual_seed(3)
    ts = [torch.randn(40000, generator=g) for _ in range(4)]
    jobs = _jobs(ts, rules, False)
    counted = {}
    for kernel in (False, True):
        with device_path(), (ta.triton_path() if kernel else nullcontext()), \
                SyncCounter(device=ts) as c:
            quantize_group(jobs, 16, chunk=40000)
        counted[kernel] = c
    torch_path, kernel = counted[False], counted[True]
    assert kernel.syncs == torch_path.syncs and kernel.waits == torch_path.waits
    assert kernel.ops * 4 < torch_path.ops, (kernel.ops, torch_path.ops)
    # what the device would hold at the peak: the levels, a chunk's copy and the kernel's tables
    assert kernel.peak_bytes < torch_path.peak_bytes


def test_block_table_covers_each_piece_once():
    pieces = [(0, 10, 2058), (1, 0, 1), (2, 0, 1024), (3, 5, 3000)]
    table, per_piece = ta.block_table(pieces, 1024)
    jobs, starts, stops = table
    assert list(per_piece) == [2, 1, 1, 3]
    covered = np.zeros(sum(b - a for _, a, b in pieces), dtype=np.int64)
    for j, s, e in zip(jobs, starts, stops, strict=True):
        covered[s:min(e, s + 1024)] += 1
    assert covered.min() == covered.max() == 1
    assert list(jobs) == [0, 0, 1, 2, 3, 3, 3]


def test_the_torch_path_serves_when_the_kernel_fails(monkeypatch):
    jobs = _jobs(_tensors()[:2], dict(prune=0.2), False)

    def boom(*a, **k):
        raise RuntimeError("no kernel today")

    monkeypatch.setattr(ta, "assign_chunk", boom)
    monkeypatch.setattr(ta, "_failed", False)
    with pytest.warns(RuntimeWarning, match="no kernel today"):
        ref, got = _both(jobs, 16, ran=False)
    assert ta._failed and not ta.wanted(torch.device("cpu"))
    for r, g in zip(ref, got, strict=True):
        assert _same_q(g.q, r.q) and np.array_equal(g.counts, r.counts)
        assert g.sums == r.sums


def test_host_tensors_without_the_interpreter_are_named_and_served(monkeypatch):
    # a compiled kernel cannot take host tensors: a typed error, warned, the torch path serves
    monkeypatch.setattr(ta, "_interpreted", lambda fn: False)
    monkeypatch.setattr(ta, "_failed", False)
    with pytest.raises(ta.TritonUnavailable, match="TRITON_INTERPRET"):
        ta._kernel(torch.device("cpu"))
    jobs = _jobs(_tensors()[:2], {}, False)
    with pytest.warns(RuntimeWarning, match="TritonUnavailable"):
        ref, got = _both(jobs, 16, ran=False)
    assert not ta.runs_on_host()
    for r, g in zip(ref, got, strict=True):
        assert _same_q(g.q, r.q) and g.sums == r.sums


@pytest.mark.parametrize("n, steps, want", [(1, (16, 64), 16), (16, (16, 64), 16),
                                            (17, (16, 64), 64), (65, (16, 64), 128),
                                            (300, (128, 256), 512)])
def test_table_rows_take_few_shapes(n, steps, want):
    assert ta._at_least(n, steps) == want


def test_off_unless_asked(monkeypatch):
    monkeypatch.delenv("MVC_TRITON", raising=False)
    assert not ta.wanted(torch.device("cpu")) and not ta.wanted(torch.device("cuda"))
    monkeypatch.setenv("MVC_TRITON", "1")
    assert ta.wanted(torch.device("cuda")) and not ta.wanted(torch.device("cpu"))


@cuda
def test_cuda_kernel_is_the_torch_path(monkeypatch):  # pragma: no cover - no GPU in CI
    monkeypatch.setenv("MVC_TRITON", "1")
    jobs = [GroupJob(j.tensor.cuda(), j.sketch, j.thr,
                     weight=j.weight.cuda() if j.weight is not None else None)
            for j in _jobs(_tensors(), dict(prune=0.2, protect=0.02), True)]
    monkeypatch.setenv("MVC_TRITON", "0")
    ref = quantize_group(jobs, 16, seed=5)
    monkeypatch.setenv("MVC_TRITON", "1")
    got = quantize_group(jobs, 16, seed=5)
    assert not ta._failed
    for r, g in zip(ref, got, strict=True):
        assert _same_q(g.q, r.q) and np.array_equal(g.counts, r.counts)
        assert g.sums == pytest.approx(r.sums, rel=1e-12, abs=0.0)
    state = {n: t.cuda() for n, t in _moments().items()}
    monkeypatch.setenv("MVC_TRITON", "0")
    ref_m = quantize_optimizer_state(state)
    monkeypatch.setenv("MVC_TRITON", "1")
    got_m = quantize_optimizer_state(state)
    for n in state:
        assert _same_q(got_m[n].q, ref_m[n].q), n


@cuda
def test_cuda_kernel_runs_on_its_tensors_device(monkeypatch):  # pragma: no cover - no GPU in CI
    """Tensors on the last GPU while the current device is the first (one GPU: the same one):
    the kernel launches on the tensors' device and its current stream, as torch's ops do."""
    dev = torch.device("cuda", torch.cuda.device_count() - 1)
    jobs = [GroupJob(j.tensor.to(dev), j.sketch, j.thr) for j in _jobs(_tensors(), dict(prune=0.2), False)]
    monkeypatch.setenv("MVC_TRITON", "0")
    ref = quantize_group(jobs, 16, seed=5)
    monkeypatch.setenv("MVC_TRITON", "1")
    before = ta.launches
    with torch.cuda.device(0):
        got = quantize_group(jobs, 16, seed=5)
    assert ta.launches > before and not ta._failed
    for r, g in zip(ref, got, strict=True):
        assert g.q.levels.device == dev and _same_q(g.q, r.q)
