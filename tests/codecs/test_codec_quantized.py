"""qbase/1 and qdelta/1: exact round trips and hostile input.

(The benchmark's HE / RLE ablations and their comparison with qdelta/1: test_delta_ablations.py.)
"""
from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch
import xxhash
from hypothesis import HealthCheck, given, settings, strategies as st
from quantized_tensors import assert_same, evolve, make_q, payload

from mvc.codecs import quantized as qc
from mvc.codecs.base import CodecError
from mvc.quant import QuantizedTensor

MODES = {"pe": qc.encode_delta}  # the one mode the repository writes
SETTINGS = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])


# --------------------------------------------------------------------------- builders

def roundtrip_base(q, shape):
    enc = qc.encode_base(q)
    return qc.decode_base(json.loads(json.dumps(enc.meta)), payload(enc), q.dtype, shape)


def roundtrip_delta(mode, q, parent, n_prev, shape):
    enc = MODES[mode](q, torch.from_numpy(parent.astype(np.int64)), n_prev)
    meta = json.loads(json.dumps(enc.meta))
    return qc.decode_delta(meta, payload(enc), q.dtype, shape,
                           torch.from_numpy(parent.astype(np.int64)).to(torch.int32)), enc


@st.composite
def level_streams(draw, min_size=0, max_size=400):
    bins = draw(st.integers(2, 32))
    n = draw(st.integers(min_size, max_size))
    seed = draw(st.integers(0, 2**31))
    rng = np.random.default_rng(seed)
    p = rng.dirichlet(np.ones(bins + 2) * draw(st.sampled_from([0.1, 1.0, 10.0])))
    return rng.choice(bins + 2, size=n, p=p), bins, seed


# --------------------------------------------------------------------------- base

@SETTINGS
@given(level_streams(), st.sampled_from([torch.float32, torch.float16, torch.bfloat16]))
def test_base_roundtrip(stream, dtype):
    levels, bins, seed = stream
    q = make_q(levels, bins, dtype, seed)
    r = roundtrip_base(q, (levels.size,))
    assert_same(q, r)


@pytest.mark.parametrize("shape", [(0,), (1,), (3, 0, 2), (1, 1), (7, 5)])
@pytest.mark.parametrize("fill", ["mixed", "pruned", "protected"])
def test_base_edge_shapes(shape, fill):
    bins = 4
    n = math.prod(shape)
    rng = np.random.default_rng(1)
    levels = {"mixed": rng.integers(0, bins + 2, n), "pruned": np.full(n, bins),
              "protected": np.full(n, bins + 1)}[fill]
    q = make_q(levels.reshape(shape), bins)
    assert_same(q, roundtrip_base(q, shape))


def test_base_records_config():
    q = make_q(np.arange(10) % 6, 4)
    enc = qc.encode_base(q, config={"bins": 4, "prune": 0.1, "protect": 0.005})
    assert enc.meta["config"] == {"bins": 4, "prune": 0.1, "protect": 0.005}
    assert enc.extra["codec"] == qc.QBASE


def test_base_compresses_skewed_levels():
    rng = np.random.default_rng(0)
    levels = rng.choice(18, size=50_000, p=np.r_[np.full(16, 0.05), 0.19, 0.01])
    q = make_q(levels, 16)
    size = qc.encoded_size(qc.encode_base(q))
    assert size < 50_000 * 4 / 6  # well under 5 bits/param vs 32-bit floats


# --------------------------------------------------------------------------- delta

@SETTINGS
@given(level_streams(), st.integers(2, 32), st.sampled_from([0.0, 0.01, 0.2, 1.0]),
       st.sampled_from(sorted(MODES)))
def test_delta_roundtrip_changing_bins(stream, bins_cur, change, mode):
    parent, bins_prev, seed = stream
    rng = np.random.default_rng(seed + 1)
    child = evolve(parent, bins_prev + 2, bins_cur + 2, change, rng)
    q = make_q(child, bins_cur, seed=seed)
    r, _ = roundtrip_delta(mode, q, parent, bins_prev + 2, (child.size,))
    assert_same(q, r)


@pytest.mark.parametrize("mode", sorted(MODES))
@pytest.mark.parametrize("n", [0, 1, 2])
def test_delta_tiny(mode, n):
    parent = np.arange(n) % 6
    q = make_q((parent + 1) % 6, 4)
    r, _ = roundtrip_delta(mode, q, parent, 6, (n,))
    assert_same(q, r)


@pytest.mark.parametrize("mode", sorted(MODES))
def test_delta_all_pruned_and_all_protected(mode):
    n = 300
    pruned, protected = np.full(n, 8), np.full(n, 9)
    for parent, child, kp, kc in [(pruned, protected, 8, 8), (protected, pruned, 8, 8),
                                  (pruned, np.full(n, 32), 8, 32), (np.full(n, 33), pruned, 32, 8)]:
        q = make_q(child, kc)
        r, _ = roundtrip_delta(mode, q, parent, kp + 2, (n,))
        assert_same(q, r)


def test_delta_unchanged_is_nearly_free():
    rng = np.random.default_rng(0)
    levels = rng.integers(0, 17, 100_000)  # no protected values: they are stored in full
    enc = qc.encode_delta(make_q(levels, 16), torch.from_numpy(levels), 18)
    assert all(n == 0 for n in enc.meta["sections"][2:])
    assert qc.encoded_size(enc) < 400


def test_delta_shape_mismatch_asks_for_base():
    q = make_q(np.zeros(10, dtype=np.int64), 4)
    with pytest.raises(qc.DeltaShapeError):
        qc.encode_delta(q, torch.zeros(11, dtype=torch.uint8), 6)
    q2 = make_q(np.zeros((2, 5), dtype=np.int64), 4)
    with pytest.raises(qc.DeltaShapeError):  # a reshape is a new tensor: base
        qc.encode_delta(q2, torch.zeros(10, dtype=torch.uint8), 6)
    enc = qc.encode_delta(q2, torch.zeros((2, 5), dtype=torch.uint8), 6)
    r = qc.decode_delta(enc.meta, payload(enc), torch.float32, (2, 5), torch.zeros(10, dtype=torch.uint8))
    assert_same(q2, r)  # the decoder takes a flattened parent


def test_encoder_rejects_out_of_range_parent():
    q = make_q(np.zeros(10, dtype=np.int64), 4)
    with pytest.raises(qc.QuantInputError):
        qc.encode_delta(q, torch.full((10,), 6, dtype=torch.uint8), 6)


def test_many_levels_use_wide_symbols():
    rng = np.random.default_rng(0)
    parent = rng.integers(0, 302, 5000)
    child = evolve(parent, 302, 402, 0.05, rng)
    q = make_q(child, 400)
    assert_same(q, roundtrip_base(q, (5000,)))
    for mode in MODES:
        assert_same(q, roundtrip_delta(mode, q, parent, 302, (5000,))[0])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_chain_of_real_quantizations_has_no_drift(dtype):
    """Walking base + deltas restores exactly dequantize(quantize(W_t)) at every step."""
    from mvc.quant import quantize

    g = torch.Generator().manual_seed(0)
    w = torch.randn(60, 70, generator=g)
    parent = None
    bins_seq = [4, 16, 8, 32, 16, 2, 16, 16]
    for t, bins in enumerate(bins_seq):
        w = w + 0.01 * torch.randn(60, 70, generator=g)
        q = quantize(w.to(dtype), bins, prune=0.1, protect=0.01, seed=t)
        if parent is None:
            enc = qc.encode_base(q, config={"bins": bins})
            r = qc.decode_base(enc.meta, payload(enc), dtype, (60, 70))
        else:
            enc = qc.encode_delta(q, parent.levels, parent.n_levels)
            r = qc.decode_delta(enc.meta, payload(enc), dtype, (60, 70), parent.levels)
        assert torch.equal(r.dequantize().view(torch.uint8), q.dequantize().view(torch.uint8))
        parent = r  # the next delta is taken against what checkout would rebuild


# --------------------------------------------------------------------------- hostile input

def _delta_case(mode="pe"):
    rng = np.random.default_rng(3)
    parent = rng.integers(0, 10, 3000)
    child = evolve(parent, 10, 12, 0.1, rng)
    q = make_q(child, 10)
    enc = MODES[mode](q, torch.from_numpy(parent), 10)
    return enc.meta, payload(enc), parent


def _base_case():
    levels = np.random.default_rng(4).integers(0, 10, 3000)
    enc = qc.encode_base(make_q(levels, 8))
    return enc.meta, payload(enc)


def _decode_delta(meta, data, parent, shape=(3000,)):
    return qc.decode_delta(meta, data, torch.float32, shape, torch.from_numpy(parent))


@pytest.mark.parametrize("cut", [1, 7, 100])
def test_truncated_payloads_raise(cut):
    meta, data = _base_case()
    with pytest.raises(CodecError):
        qc.decode_base(meta, data[:-cut], torch.float32, (3000,))
    meta, data, parent = _delta_case()
    with pytest.raises(CodecError):
        _decode_delta(meta, data[:-cut], parent)


@SETTINGS
@given(st.integers(0, 10**9), st.integers(0, 7))
def test_bit_flips_raise(pos, bit):
    meta, data = _base_case()
    buf = bytearray(data)
    buf[pos % len(buf)] ^= 1 << bit
    with pytest.raises(CodecError):
        qc.decode_base(meta, bytes(buf), torch.float32, (3000,))
    meta, data, parent = _delta_case()
    buf = bytearray(data)
    buf[pos % len(buf)] ^= 1 << bit
    with pytest.raises(CodecError):
        _decode_delta(meta, bytes(buf), parent)


@SETTINGS
@given(st.binary(max_size=300), st.sampled_from(["base", "pe"]))
def test_forged_payloads_with_valid_checksum_raise_or_roundtrip(garbage, kind):
    # A hostile writer can recompute the checksum: the decoders must still not crash.
    if kind == "base":
        meta, _ = _base_case()
    else:
        meta, _, parent = _delta_case(kind)
    meta = dict(meta)
    fixed = sum(meta["sections"][:2])
    secs = meta["sections"][:2] + [0] * (len(meta["sections"]) - 3) + [len(garbage)]
    data = bytes(fixed) + garbage
    meta["sections"], meta["xxh3"] = secs, xxhash.xxh3_64(data).hexdigest()
    try:
        if kind == "base":
            qc.decode_base(meta, data, torch.float32, (3000,))
        else:
            _decode_delta(meta, data, parent)
    except CodecError:
        pass


@pytest.mark.parametrize("field,value", [
    ("numel", 10**12), ("numel", 2999), ("bins", 0), ("bins", 10**9), ("bins", "8"),
    ("n_protected", -1), ("n_protected", 10**6), ("sections", None), ("sections", [1, 2]),
    ("xxh3", None), ("mode", "zz"), ("mode", "rle"), ("mode", "he"), ("mode", None),
    ("parent_n_levels", 1), ("parent_n_levels", 9),
    ("parent_n_levels", 10**7),
])
def test_bad_meta_raises(field, value):
    meta, data, parent = _delta_case()
    bad = dict(meta, **{field: value})
    with pytest.raises(CodecError):
        _decode_delta(bad, data, parent)
    if field in ("numel", "bins", "n_protected", "sections", "xxh3"):
        bmeta, bdata = _base_case()
        with pytest.raises(CodecError):
            qc.decode_base(dict(bmeta, **{field: value}), bdata, torch.float32, (3000,))


def test_centroids_are_read_from_a_payloads_head_alone():
    meta, data = _base_case()
    want = qc.decode_base(meta, data, torch.float32, (3000,)).centroids
    n = qc.centroid_bytes(meta)
    assert n == 4 * meta["bins"] and torch.equal(qc.stored_centroids(meta, data[:n]), want)
    meta, data, parent = _delta_case()
    want = _decode_delta(meta, data, parent).centroids
    assert torch.equal(qc.stored_centroids(meta, data[:qc.centroid_bytes(meta)]), want)


@pytest.mark.parametrize("change", [
    {"bins": 0}, {"bins": "8"}, {"sections": None}, {"sections": []}, {"sections": [7, 1, 1]},
    {"sections": ["32", 1, 1]}])
def test_centroids_of_a_bad_meta_raise(change):
    meta, data = _base_case()
    with pytest.raises(CodecError):
        qc.stored_centroids(dict(meta, **change), data)


def test_centroids_from_a_short_or_hostile_head_raise():
    meta, data = _base_case()
    n = qc.centroid_bytes(meta)
    with pytest.raises(CodecError):
        qc.stored_centroids(meta, data[:n - 1])
    unsorted = np.arange(meta["bins"], 0, -1, dtype="<f4").tobytes()
    with pytest.raises(CodecError):
        qc.stored_centroids(meta, unsorted)
    with pytest.raises(CodecError):
        qc.stored_centroids(meta, np.full(meta["bins"], np.nan, dtype="<f4").tobytes())


def test_wrong_parent_raises():
    meta, data, parent = _delta_case()
    with pytest.raises(qc.DeltaParentError):
        _decode_delta(meta, data, parent[:-1], shape=(3000,))
    with pytest.raises(CodecError):
        _decode_delta(meta, data, np.full_like(parent, 10))


def test_non_float_dtype_rejected():
    meta, data = _base_case()
    with pytest.raises(CodecError):
        qc.decode_base(meta, data, torch.int32, (3000,))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_inputs():  # pragma: no cover - CPU-only CI
    levels = np.random.default_rng(0).integers(0, 10, 1000)
    q = make_q(levels, 8)
    qg = QuantizedTensor.from_parts(q.levels.cuda(), q.centroids.cuda(), q.protected.cuda(),
                                    q.dtype, q.bins)
    enc = qc.encode_delta(qg, torch.from_numpy(levels).cuda(), 10)
    r = qc.decode_delta(enc.meta, payload(enc), q.dtype, (1000,), torch.from_numpy(levels))
    assert_same(q, r)


@pytest.mark.parametrize("dtype, n_levels", [(np.uint8, 200), (np.uint16, 300)])
def test_the_level_census_counts_without_a_wide_copy(dtype, n_levels):
    """16-bit levels (more than 254 bins) are counted by the native pass too: numpy's bincount
    made an int64 copy of them, 8 bytes a value (17 GB for a 2.1e9-value tensor)."""
    import tracemalloc

    from mvc.codecs.quantized import _census

    levels = np.random.default_rng(0).integers(0, n_levels, 1 << 20).astype(dtype)
    tracemalloc.start()
    try:
        got = _census(levels, n_levels)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert got is not None and np.array_equal(got, np.bincount(levels, minlength=n_levels))
    assert peak < levels.nbytes // 4, peak
    assert _census(levels, n_levels - 1) is None   # a level outside the range
