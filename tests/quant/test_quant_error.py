"""One-pass error sums (native/qerr.c via mvc.quant.error) against a float64 torch reference,
and the proxy metric built on them against the per-trial float64 computation it replaced."""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings, strategies as st

from mvc.errors import InternalError
from mvc.quant import QuantizedTensor, quantize
from mvc.quant._kernels import (
    compact_moment,
    expand_moment,
    expand_positive,
    level_census,
    level_counts,
    log_positive,
    qerr_sums,
    ratio_max,
    scan_f32,
)
from mvc.quant.assign import level_dtype
from mvc.quant.error import error_sums, level_histogram, level_table
from mvc.quant.moment_bound import moment_ratio_bound
from mvc.quant.optimizer import (
    LOG_SIGMA,
    _quantize_moment_native,
    quantize_moment,
    quantize_second_moment,
)
from mvc.search.quality import proxy_error

SETTINGS = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
f32 = st.floats(width=32, allow_nan=False, allow_infinity=False, min_value=-2.0 ** 100, max_value=2.0 ** 100)


def reference_sums(q: QuantizedTensor, x: torch.Tensor, w: torch.Tensor | None) -> list[float]:
    """The definition, in float64 torch over a dequantized copy."""
    lv = q.levels.reshape(-1)
    xd = x.reshape(-1).to(torch.float32).to(torch.float64)
    d = q.dequantize().reshape(-1).to(torch.float64) - xd
    d[lv == q.protected_level] = 0.0
    out = [(d * d).sum(), (xd * xd).sum(), (xd.abs() * d * d).sum(), (xd.abs() * xd * xd).sum()]
    if w is None:
        out += [torch.zeros((), dtype=torch.float64)] * 2
    else:
        wd = w.reshape(-1).to(torch.float32).to(torch.float64).abs()
        out += [(wd * d * d).sum(), (wd * xd * xd).sum()]
    return [float(v) for v in out]


def _close(a, b) -> None:
    for u, v in zip(a, b):
        assert u == pytest.approx(v, rel=1e-9, abs=1e-30)


def _random_q(values: list[float], bins: int, n_prot: int, seed: int,
              dtype: torch.dtype = torch.float32) -> tuple[QuantizedTensor, torch.Tensor]:
    x = torch.tensor(values, dtype=torch.float32).to(dtype)
    g = torch.Generator().manual_seed(seed)
    lv = torch.randint(0, bins + 1, (x.numel(),), generator=g)  # centroids and pruned
    prot = torch.randperm(x.numel(), generator=g)[:n_prot]
    lv[prot] = bins + 1
    cents = torch.sort(torch.randn(bins, generator=g) * 3).values
    protected = x.reshape(-1)[lv == bins + 1]
    return QuantizedTensor(lv.to(level_dtype(bins)), cents, protected, dtype, bins), x


@SETTINGS
@given(st.lists(f32, min_size=1, max_size=400), st.sampled_from([1, 2, 15, 254, 300]),
       st.integers(0, 5), st.booleans(), st.integers(0, 2 ** 16))
def test_native_sums_match_reference(values, bins, n_prot, weighted, seed):
    n_prot = min(n_prot, len(values))
    q, x = _random_q(values, bins, n_prot, seed)
    w = torch.randn(x.numel(), generator=torch.Generator().manual_seed(seed)) if weighted else None
    got = error_sums(q, x, w)
    _close(got, reference_sums(q, x, w))
    if not weighted:
        assert got[4] == got[5] == 0.0


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float64])
def test_sums_use_the_centroids_rounded_to_the_tensor_dtype(dtype):
    t = torch.randn(5000, generator=torch.Generator().manual_seed(1)).to(dtype)
    q = quantize(t, 16, prune=0.2, protect=0.01)
    _close(error_sums(q, t, t * 2), reference_sums(q, t, t * 2))


def test_torch_path_matches_native():
    """int32 levels (bins > 32766) take the torch path; same sums on the same parts."""
    q, x = _random_q([float(i % 97) - 40.0 for i in range(3000)], 40, 7, 3)
    wide = QuantizedTensor(q.levels.to(torch.int32), q.centroids, q.protected, q.dtype, q.bins)
    w = torch.rand(3000)
    _close(error_sums(wide, x, w), error_sums(q, x, w))


def test_blocks_are_reproducible_across_thread_counts():
    x = torch.randn(3_000_000, generator=torch.Generator().manual_seed(0))
    q = quantize(x, 8, prune=0.3)
    old = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = error_sums(q, x, x)
        torch.set_num_threads(max(2, old))
        many = error_sums(q, x, x)
    finally:
        torch.set_num_threads(old)
    assert one == many
    _close(one, reference_sums(q, x, x))


def test_level_outside_the_table_is_refused():
    x = torch.zeros(10)
    lv = torch.full((10,), 9, dtype=torch.uint8)
    table = torch.zeros(4)
    with pytest.raises(InternalError):
        qerr_sums(x, lv, table)


def test_length_mismatch_is_refused():
    q, x = _random_q([1.0, 2.0, 3.0], 2, 0, 0)
    with pytest.raises(ValueError):
        error_sums(q, torch.zeros(4))


def test_level_table_layout():
    q = QuantizedTensor(torch.zeros(3, dtype=torch.uint8), torch.tensor([1.0 / 3, 2.0]),
                        torch.empty(0, dtype=torch.bfloat16), torch.bfloat16, 2)
    t = level_table(q, torch.device("cpu"))
    assert t.tolist() == [float(torch.tensor(1.0 / 3).to(torch.bfloat16)), 2.0, 0.0, 0.0]


def _ratio_ref(m: torch.Tensor, v: torch.Tensor) -> float:
    """Correctly rounded float32 sqrt and division (numpy's), the max over v > 0."""
    mn, vn = m.numpy(), v.numpy()
    pos = vn > 0
    return float((np.abs(mn[pos]) / np.sqrt(vn[pos])).max()) if pos.any() else 0.0


@SETTINGS
@given(st.lists(st.tuples(f32, st.floats(width=32, min_value=-1.0, max_value=2.0 ** 100)),
                min_size=0, max_size=300))
def test_ratio_max_matches_torch(pairs):
    m = torch.tensor([p[0] for p in pairs], dtype=torch.float32)
    v = torch.tensor([p[1] for p in pairs], dtype=torch.float32)
    assert ratio_max(m, v) == _ratio_ref(m, v)


@SETTINGS
@given(st.lists(st.tuples(st.floats(width=32), st.floats(width=32)), min_size=0, max_size=70))
def test_native_ratio_max_matches_a_scalar_reference(pairs):
    """The vector loop (four lanes, then a scalar tail) against the scalar definition, with
    NaN, infinities, zeros and negatives on both sides: the same maximum bits, the same
    count of entries with v > 0."""
    from mvc.native import ffi, lib

    m = np.array([p[0] for p in pairs], dtype=np.float32)
    v = np.array([p[1] for p in pairs], dtype=np.float32)
    best, count = np.float32(0.0), 0
    with np.errstate(all="ignore"):
        for mi, vi in zip(m, v):
            if vi > 0:
                r = np.float32(abs(mi)) / np.sqrt(vi)
                best = r if r > best else best
                count += 1
    out = ffi.new("float *")
    got = lib.mvc_ratio_max_f32(ffi.cast("const float *", m.ctypes.data),
                                ffi.cast("const float *", v.ctypes.data), m.size, out)
    assert got == count
    assert np.float32(out[0]).tobytes() == np.float32(best).tobytes()


def test_ratio_max_large_is_exact_and_threaded():
    g = torch.Generator().manual_seed(5)
    m, v = torch.randn(2_000_001, generator=g), torch.rand(2_000_001, generator=g)
    v[::7] = 0.0
    assert ratio_max(m, v) == _ratio_ref(m, v)
    pos = v > 0  # torch's vectorized sqrt/div may sit one float32 ulp off the rounded value
    assert ratio_max(m, v) == pytest.approx(float((m[pos].abs() / v[pos].sqrt()).max()), rel=3e-7)


# ------------------------------------------------------------------ the proxy
def old_weighted(tensors, qmap, names, grads) -> float:
    """The per-trial float64 computation the cached sums replaced (mvc 2026-11 quality.py)."""
    num = den = 0.0
    for n in names:
        q = qmap[n]
        w = tensors[n].detach().reshape(-1).to(torch.float64)
        err = q.dequantize().reshape(-1).to(device=w.device, dtype=torch.float64) - w
        s = (grads[n].detach().reshape(-1).to(device=w.device, dtype=torch.float64).abs()
             if grads is not None else w.abs())
        num += float((s * err.square()).sum())
        den += float((s * w.square()).sum())
    if den <= 0.0 or not math.isfinite(den):
        return 0.0 if num == 0.0 else math.inf
    return math.sqrt(num / den)


def _state(seed: int) -> tuple[dict, dict]:
    g = torch.Generator().manual_seed(seed)
    tensors = {"a.weight": torch.randn(64, 80, generator=g),
               "b.weight": torch.randn(300, generator=g).to(torch.bfloat16),
               "c.bias": torch.randn(8, generator=g)}
    grads = {n: torch.randn(t.shape, generator=g) for n, t in tensors.items()}
    return tensors, grads


@pytest.mark.parametrize("with_grads", [False, True])
def test_proxy_equals_the_float64_reference(with_grads):
    tensors, grads = _state(0)
    qmap = {"a.weight": quantize(tensors["a.weight"], 4, prune=0.3, protect=0.01),
            "b.weight": quantize(tensors["b.weight"], 8), "c.bias": None}
    value, name = proxy_error(tensors, qmap, grads if with_grads else None)
    names = ["a.weight", "b.weight"]
    ref = old_weighted(tensors, qmap, names, None)
    if with_grads:
        ref = max(ref, old_weighted(tensors, qmap, names, grads))
        assert name.startswith("proxy:max")
    assert value == pytest.approx(ref, rel=1e-12)


def test_proxy_cache_sees_in_place_changes_and_other_tensors():
    tensors, grads = _state(1)
    q = quantize(tensors["a.weight"], 4)
    qmap = {"a.weight": q}
    first, _ = proxy_error(tensors, qmap, None)
    assert proxy_error(tensors, qmap, None)[0] == first          # cached
    tensors["a.weight"].mul_(2.0)                                # in place: version moves
    assert proxy_error(tensors, qmap, None)[0] == pytest.approx(
        old_weighted(tensors, qmap, ["a.weight"], None), rel=1e-12)
    other = {"a.weight": tensors["a.weight"].clone() + 1.0}     # another tensor, same q
    assert proxy_error(other, qmap, None)[0] == pytest.approx(
        old_weighted(other, qmap, ["a.weight"], None), rel=1e-12)
    with_g, _ = proxy_error(tensors, qmap, {"a.weight": grads["a.weight"]})
    assert with_g == pytest.approx(max(
        old_weighted(tensors, qmap, ["a.weight"], None),
        old_weighted(tensors, qmap, ["a.weight"], {"a.weight": grads["a.weight"]})), rel=1e-12)


def test_all_zero_weights():
    z = {"w": torch.zeros(500)}
    q = quantize(z["w"], 2)
    assert proxy_error(z, {"w": q}, None)[0] == 0.0


# ------------------------------------------------------------------ counts and scans
@SETTINGS
@given(st.lists(st.integers(0, 301), min_size=0, max_size=500), st.sampled_from([3, 300]))
def test_level_histogram_matches_bincount(levels, bins):
    lv = torch.tensor([v % (bins + 2) for v in levels], dtype=torch.int64)
    q = QuantizedTensor(lv.to(level_dtype(bins)), torch.arange(bins, dtype=torch.float32),
                        torch.zeros(int((lv == bins + 1).sum())), torch.float32, bins)
    got = level_histogram(q)
    assert torch.equal(got, torch.bincount(lv, minlength=bins + 2))
    assert level_histogram(q) is got                      # remembered while q lives


def test_level_counts_refuse_out_of_range_levels():
    with pytest.raises(InternalError):
        level_counts(torch.tensor([0, 1, 7], dtype=torch.uint8), 4)


@SETTINGS
@given(st.lists(st.floats(width=32), min_size=0, max_size=300))
def test_scan_counts_match_torch(values):
    x = torch.tensor(values, dtype=torch.float32)
    bad, neg, zero, pos = scan_f32(x)
    assert bad == int((~torch.isfinite(x)).sum())
    assert neg == int((x < 0).sum()) and pos == int((x > 0).sum()) and zero == int((x == 0).sum())


@pytest.mark.parametrize("bad", [-1.0, float("-inf")])
def test_second_moment_with_negative_entries_stays_exact(bad):
    v = torch.rand(1000)
    v[17] = bad
    assert quantize_second_moment(v, 4) is None


def test_moment_ratio_bound():
    g = torch.Generator().manual_seed(2)
    m, v = torch.randn(10_000, generator=g), torch.rand(10_000, generator=g)
    v[:100] = 0.0
    assert moment_ratio_bound(m, v) == _ratio_ref(m, v)
    assert moment_ratio_bound(m.to(torch.bfloat16), v) == _ratio_ref(m.to(torch.bfloat16).float(), v)
    assert moment_ratio_bound(m, torch.zeros_like(v)) == 0.0


# ------------------------------------------------------------------ log-domain moments
def old_second_moment(v: torch.Tensor, bins: int, **kw) -> QuantizedTensor:
    """The torch path the native compaction replaced: mask, masked select, float64 log,
    quantize, scatter back."""
    flat = v.reshape(-1)
    keep = flat > 0
    sub = flat[keep]
    q = quantize(sub.to(torch.float64).log().to(torch.float32), bins, **kw)
    levels = torch.full((flat.numel(),), bins, dtype=level_dtype(bins))
    levels[keep] = q.levels.reshape(-1)
    protected = sub[q.levels == bins + 1] if q.protected.numel() else sub.new_empty(0)
    return QuantizedTensor(levels.reshape(v.shape), q.centroids, protected, v.dtype, bins)


@pytest.mark.parametrize("bins,protect", [(4, 0.0), (16, 0.01), (300, 0.001)])
def test_native_second_moment_equals_the_torch_path(bins, protect):
    g = torch.Generator().manual_seed(bins)
    v = (torch.randn(700_001, generator=g) * 3).exp() * 1e-8
    v[torch.rand(v.numel(), generator=g) < 0.3] = 0.0
    got = quantize_second_moment(v, bins, protect=protect, alpha=0.002)
    ref = old_second_moment(v, bins, protect=protect, alpha=0.002, sigma=LOG_SIGMA)
    assert torch.equal(got.levels, ref.levels)
    assert torch.equal(got.centroids, ref.centroids)
    assert torch.equal(got.protected, ref.protected)
    assert (got.protected.numel() > 0) == (protect > 0)


@SETTINGS
@given(st.lists(st.floats(width=32, min_value=0.0, max_value=2.0 ** 100), min_size=0, max_size=300))
def test_log_positive_and_expand_match_torch(values):
    v = torch.tensor(values, dtype=torch.float32)
    logs = log_positive(v)
    assert torch.equal(logs, v[v > 0].to(torch.float64).log().to(torch.float32))
    sub = torch.arange(logs.numel(), dtype=torch.int64).remainder(200).to(torch.uint8)
    out = expand_positive(v, sub, 201)
    ref = torch.full((v.numel(),), 201, dtype=torch.uint8)
    ref[v > 0] = sub
    assert torch.equal(out, ref)


def test_expand_refuses_a_wrong_level_count():
    with pytest.raises(InternalError):
        expand_positive(torch.ones(5), torch.zeros(4, dtype=torch.uint8), 9)


@pytest.mark.parametrize("wbins,bins,protect,zeros", [(None, 2, 0.0, 0.2), (16, 2, 0.0, 0.0),
                                                      (300, 4, 0.01, 0.1), (8, 300, 0.001, 0.3)])
def test_native_first_moment_equals_the_torch_path(wbins, bins, protect, zeros):
    g = torch.Generator().manual_seed(bins)
    m = torch.randn(600, 1001, generator=g) * 1e-3
    m[torch.rand(m.shape, generator=g) < zeros] = 0.0
    m[0, :5] = -0.0
    wq = quantize(torch.randn(m.shape, generator=g), wbins, prune=0.4) if wbins else None
    kw = dict(prune=0.85, protect=protect, seed=0, alpha=0.01, sigma=0.2, init=None)
    got = _quantize_moment_native(m, wq, bins, **kw)
    pruned = wq.levels == wq.pruned_level if wq is not None else None
    ref = quantize_moment(m, bins, pruned=pruned, **kw)
    assert torch.equal(got.levels, ref.levels) and got.levels.dtype == ref.levels.dtype
    assert torch.equal(got.centroids, ref.centroids)
    assert torch.equal(got.protected, ref.protected)


def test_compact_moment_counts_and_order():
    m = torch.tensor([0.0, 1.0, -2.0, 0.0, 3.0, -0.0, 5.0])
    wl = torch.tensor([0, 4, 1, 1, 4, 0, 2], dtype=torch.uint8)
    sub, spans = compact_moment(m, wl, 4)
    assert sub.tolist() == [-2.0, 5.0]
    out = expand_moment(m, wl, 4, spans, torch.tensor([7, 8], dtype=torch.uint8), 9)
    assert out.tolist() == [9, 9, 7, 9, 9, 9, 8]
    sub, spans = compact_moment(m, None, -1)
    assert sub.tolist() == [1.0, -2.0, 3.0, 5.0]
    with pytest.raises(InternalError):
        expand_moment(m, None, -1, spans, torch.zeros(3, dtype=torch.uint8), 9)


@SETTINGS
@given(st.lists(st.tuples(st.sampled_from([0.0, -0.0, 1.5, -2.0, float("nan"), 1e-30]),
                          st.integers(-3, 3)), min_size=0, max_size=200),
       st.sampled_from([None, torch.uint8, torch.int16]), st.integers(-1, 3))
def test_branch_free_compact_and_expand_match_a_reference(entries, wdtype, wpruned):
    """The native first-moment compaction / expansion (branch-free loops) against numpy,
    with every weight-level width, NaN (kept: it is not 0) and -0.0 (not kept), and the
    native bounds: more kept entries than the buffer holds is refused, nothing written past
    it; no levels to spread is refused unless nothing is kept."""
    from mvc.native import ffi, lib

    m = torch.tensor([e[0] for e in entries], dtype=torch.float32)
    w = (torch.tensor([e[1] for e in entries], dtype=torch.int64).remainder(4).to(wdtype)
         if wdtype is not None else None)
    mn = m.numpy()
    kept = mn != 0
    if w is not None:
        kept &= w.numpy().astype(np.int64) != wpruned
    sub, spans = compact_moment(m, w, wpruned)
    np.testing.assert_array_equal(sub.numpy(), mn[kept])   # NaN equal to NaN here
    levels = torch.arange(int(kept.sum()), dtype=torch.int64).remainder(7).to(torch.uint8)
    out = expand_moment(m, w, wpruned, spans, levels, 9)
    ref = np.full(mn.size, 9, dtype=np.uint8)
    ref[kept] = levels.numpy()
    np.testing.assert_array_equal(out.numpy(), ref)

    n = m.numel()
    wp = ffi.cast("const void *", w.data_ptr()) if w is not None else ffi.NULL
    ws = w.element_size() if w is not None else 1
    mp = ffi.cast("const float *", m.data_ptr())
    k = int(kept.sum())
    if k:
        short = np.full(k, 123.0, dtype=np.float32)        # one slot too few, and a guard
        got = lib.mvc_compact_moment_f32(mp, n, wp, ws, wpruned,
                                         ffi.cast("float *", short.ctypes.data), k - 1)
        assert got == -1 and short[-1] == 123.0
    out8 = np.zeros(n, dtype=np.uint8)
    got = lib.mvc_expand_moment_u8(mp, n, wp, ws, wpruned, ffi.NULL, 0, 9,
                                   ffi.cast("uint8_t *", out8.ctypes.data))
    assert got == (-1 if k else 0)


def test_level_census_flags_levels_out_of_range():
    lv = torch.tensor([0, 1, 1, 5, 2] * 100_000, dtype=torch.uint8)
    assert level_census(lv, 6).tolist() == [100_000, 200_000, 100_000, 0, 0, 100_000]
    assert level_census(lv, 5) is None
    with pytest.raises(InternalError):
        level_counts(lv, 5)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_sums_and_bound_match_the_cpu():
    """On CUDA the sums run where the levels are (torch path, float64 sums)."""
    g = torch.Generator().manual_seed(9)
    x = torch.randn(300_000, generator=g)
    q = quantize(x, 16, prune=0.2, protect=0.001)
    qc = QuantizedTensor(q.levels.cuda(), q.centroids.cuda(), q.protected.cuda(), q.dtype, q.bins)
    _close(error_sums(qc, x.cuda(), x.cuda()), error_sums(q, x, x))
    v = torch.rand(300_000, generator=g)
    assert moment_ratio_bound(x.cuda(), v.cuda()) == pytest.approx(moment_ratio_bound(x, v), rel=3e-7)
    value, _ = proxy_error({"w": x.cuda()}, {"w": qc}, None)
    assert value == pytest.approx(proxy_error({"w": x}, {"w": q}, None)[0], rel=1e-9)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("n,bins,protect", [(1000, 4, 0.0), (3_000_001, 32, 0.001),
                                            (200_000, 300, 0.01)])
def test_assignment_stats_equal_the_separate_passes(dtype, n, bins, protect):
    """The sums and counts the assignment pass measures (AssignStats) are the very bits of
    error_sums and level_histogram run afterwards over the same quantization."""
    from mvc.quant import LogSketch, quantize_prepared
    from mvc.quant import AssignStats
    from mvc.quant.partition import thresholds

    g = torch.Generator().manual_seed(n)
    t = (torch.randn(n, generator=g) * 0.02).to(dtype)
    w = torch.randn(n, generator=g)
    x = t.float().contiguous()
    sk = LogSketch.from_tensor(x, 0.01 if bins < 256 else 0.001)  # more buckets than bins
    thr = thresholds(sk.abs(), None, prune=0.2, prune_metric="magnitude", protect=protect)
    for weights in (w, None):
        st = AssignStats(w=weights)
        q = quantize_prepared(t, x, sk, None, thr, bins, stats=st)
        assert st.sums is not None and st.counts is not None
        assert tuple(st.sums.tolist()) == error_sums(q, t, weights)
        assert torch.equal(torch.from_numpy(st.counts), level_histogram(q))


def test_degenerate_input_drops_the_assignment_sums():
    """Few distinct values: the centroids become exact level means after the assignment, so
    the sums it measured no longer describe the result and are not handed out."""
    from mvc.quant import LogSketch, quantize_prepared
    from mvc.quant import AssignStats
    from mvc.quant.partition import thresholds

    x = torch.tensor([0.5, 1.5, 0.5, 1.5] * 1000)
    sk = LogSketch.from_tensor(x, 0.01)
    thr = thresholds(sk.abs(), None, prune=0.0, prune_metric="magnitude", protect=0.0)
    st = AssignStats()
    q = quantize_prepared(x, x, sk, None, thr, 4, stats=st)
    assert st.sums is None and torch.equal(torch.from_numpy(st.counts), level_histogram(q))


def test_native_assignment_checks_its_stats_table():
    from mvc.native import ffi, lib

    x = np.linspace(-1, 1, 16, dtype=np.float32)
    mids = np.array([-0.5, 0.0, 0.5], dtype=np.float32)
    out = np.zeros(16, dtype=np.uint8)
    table = np.zeros(4, dtype=np.float32)
    sums, counts = np.zeros(6), np.zeros(4, dtype=np.int64)
    st = ffi.new("mvc_assign_stats_t *")
    st.table, st.n_table = ffi.cast("const float *", table.ctypes.data), 4
    st.sums = ffi.cast("double *", sums.ctypes.data)
    st.counts = ffi.cast("int64_t *", counts.ctypes.data)
    args = (ffi.cast("const float *", x.ctypes.data), 16,
            ffi.cast("const float *", mids.ctypes.data), 3, ffi.NULL, 0)
    op = ffi.cast("uint8_t *", out.ctypes.data)
    assert lib.mvc_assign_f32_u8(*args, st, op, ffi.NULL) == 0
    assert counts.tolist() == [4, 4, 4, 4] and sums[1] > 0
    st.n_table = 3   # level 3 would be counted past the table
    assert lib.mvc_assign_f32_u8(*args, st, op, ffi.NULL) == -1
    st.n_table, st.table = 4, ffi.NULL
    assert lib.mvc_assign_f32_u8(*args, st, op, ffi.NULL) == -1


def _ieee_sqrt(v: torch.Tensor) -> torch.Tensor:
    """The correctly rounded float32 sqrt (numpy's), negatives as 0.  Not torch's: its CPU
    float32 sqrt is an ulp off for 17% of exp(10 N(0,1)) samples on this project's machine."""
    return torch.from_numpy(np.sqrt(v.clamp_min(0).numpy()))


def _sqrt_reference(v: torch.Tensor, lv: torch.Tensor, table: torch.Tensor) -> tuple[float, float]:
    """(sum d^2, sum s^2) as native/qerr.h defines them for one block: s the correctly rounded
    sqrt, d = table[level] - s (0 at the protected level), each float64 sum in four lanes (i %
    4, each summed in order) added pairwise, then the tail's."""
    sv = _ieee_sqrt(v).numpy()
    lvn = lv.numpy().astype(np.int64)
    tv = np.where(lvn == table.numel() - 1, sv, table.numpy()[lvn])
    d = tv.astype(np.float64) - sv.astype(np.float64)
    parts = (d * d, sv.astype(np.float64) ** 2)
    n4 = len(sv) - len(sv) % 4

    def lanes(x: np.ndarray) -> float:
        seq = [float(np.cumsum(x[k:n4:4])[-1]) if n4 else 0.0 for k in range(4)]
        tail = float(np.cumsum(x[n4:])[-1]) if len(x) > n4 else 0.0
        return ((seq[0] + seq[1]) + (seq[2] + seq[3])) + tail
    return lanes(parts[0]), lanes(parts[1])


@SETTINGS
@given(st.lists(st.sampled_from([0.0, -0.0, -1.5, 1e-30, 3.0, 2.0 ** 100, 7e-12, 0.25]) | f32,
                min_size=0, max_size=300),
       st.sampled_from([1, 2, 15, 300]), st.integers(0, 2 ** 16))
def test_sqrt_sums_are_the_sums_over_a_sqrt_copy(values, bins, seed):
    g = torch.Generator().manual_seed(seed)
    v = torch.tensor(values, dtype=torch.float32).reshape(-1)
    lv = torch.randint(0, bins + 2, (v.numel(),), generator=g).to(level_dtype(bins))
    table = torch.rand(bins + 2, generator=g) * 4
    got = qerr_sums(v, lv, table, sqrt_x=True)
    assert (float(got[0]), float(got[1])) == _sqrt_reference(v, lv, table)   # to the bit
    # and the definition, in float64 torch
    s = _ieee_sqrt(v).double()
    d = table.double()[lv.long()] - s
    d[lv.long() == bins + 1] = 0.0
    _close(got[:2], [float((d * d).sum()), float((s * s).sum())])
    assert got[4] == got[5] == 0.0


def test_sqrt_sums_check_their_arguments():
    v, lv, table = torch.ones(10), torch.zeros(10, dtype=torch.uint8), torch.ones(4)
    with pytest.raises(InternalError):                   # a level outside the table
        qerr_sums(v, torch.full((10,), 9, dtype=torch.uint8), table, sqrt_x=True)
    with pytest.raises(InternalError):                   # lengths differ
        qerr_sums(v, lv[:9], table, sqrt_x=True)
    with pytest.raises(InternalError):                   # weights have no meaning in sqrt(v)
        qerr_sums(v, lv, table, torch.ones(10), sqrt_x=True)
    with pytest.raises(InternalError):                   # float32 only
        qerr_sums(v.double(), lv, table, sqrt_x=True)
    from mvc.native._lib import ffi, lib
    sums = np.zeros(6)
    sp = ffi.cast("double *", sums.ctypes.data)
    vp, lp = ffi.cast("const float *", v.data_ptr()), ffi.cast("const uint8_t *", lv.data_ptr())
    tp = ffi.cast("const float *", table.data_ptr())
    assert lib.mvc_qerr_sqrt_sums_u8(vp, lp, 10, tp, 1, sp) == -1          # n_table < 2
    assert lib.mvc_qerr_sqrt_sums_u8(ffi.NULL, lp, 10, tp, 4, sp) == -1    # NULL with n > 0
    assert lib.mvc_qerr_sqrt_sums_i16(vp, ffi.NULL, 10, tp, 4, sp) == -1
    assert lib.mvc_qerr_sqrt_sums_u8(vp, lp, 10, tp, 4, ffi.NULL) == -1    # nowhere to sum
    assert lib.mvc_qerr_sqrt_sums_u8(ffi.NULL, ffi.NULL, 0, ffi.NULL, 4, sp) == 0
    assert not sums.any()


@pytest.mark.parametrize("bins", [16, 300])
def test_a_second_moments_error_in_sqrt_v_is_the_one_over_a_sqrt_copy(bins, monkeypatch):
    """`moment_error_sums` reads sqrt(v) in the kernel, chunk by chunk (made small here, so
    that there are several): the chunks' sums in order, the float64 definition's values."""
    import mvc.quant.optimizer as opt
    monkeypatch.setattr(opt, "_SQRT_CHUNK", 1 << 14)
    g = torch.Generator().manual_seed(bins)
    v = (torch.randn(100_003, generator=g) * 3).exp() * 1e-8
    v[torch.rand(v.numel(), generator=g) < 0.3] = 0.0
    q = quantize_second_moment(v, bins, protect=0.01)
    from mvc.quant.tensor import level_values
    table = level_values(_ieee_sqrt(opt._log_values(q).to(torch.float32)), v.device)
    num = den = 0.0
    for a in range(0, v.numel(), 1 << 14):
        s = qerr_sums(v[a:a + (1 << 14)], q.levels.reshape(-1)[a:a + (1 << 14)], table, sqrt_x=True)
        num, den = num + float(s[0]), den + float(s[1])
    got = opt.moment_error_sums(q, "log", v)
    assert got == (num, den)
    sv = _ieee_sqrt(v).double()
    d = table.double()[q.levels.reshape(-1).long()] - sv
    d[q.levels.reshape(-1).long() == bins + 1] = 0.0
    _close(got, [float((d * d).sum()), float((sv * sv).sum())])
    assert got[0] > 0
