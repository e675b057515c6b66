"""The HE / RLE delta ablations bench_delta.py compares qdelta/1 with (benchmarks/delta_ablations.py):
exact round trips through their own decoder, qdelta/1 beating them where Alg. 5 should, and mvc's
decoder refusing their payloads, which the repository never writes (issue 13)."""
from __future__ import annotations

import json
import sys

import numpy as np
import pytest
import torch
import xxhash
from locations import ROOT
from quantized_tensors import assert_same, evolve, make_q, payload

from mvc.codecs import quantized as qc
from mvc.codecs.base import CodecError

# benchmarks/ sits beside tests/; appended, so the installed (or sanitized) mvc stays first.
_ROOT = str(ROOT)
if _ROOT not in sys.path:
    sys.path.append(_ROOT)
from benchmarks import delta_ablations as abl  # noqa: E402  (needs the path above)

ENCODERS = {"pe": qc.encode_delta,
            "rle": lambda q, p, n: abl.encode("rle", q, p, n),
            "he": lambda q, p, n: abl.encode("he", q, p, n)}


def roundtrip(mode: str, q, parent: np.ndarray, n_prev: int):
    enc = abl.encode(mode, q, torch.from_numpy(parent.astype(np.int64)), n_prev)
    meta = json.loads(json.dumps(enc.meta))
    return abl.decode(mode, meta, payload(enc), q.dtype, tuple(q.levels.shape),
                      torch.from_numpy(parent.astype(np.int64)).to(torch.int32)), enc


@pytest.mark.parametrize("mode", abl.ABLATIONS)
@pytest.mark.parametrize("n_prev,n_cur,change,n", [
    (6, 6, 0.0, 0), (6, 6, 1.0, 1), (6, 6, 1.0, 2), (18, 12, 0.2, 3000), (10, 34, 0.01, 3000),
    (302, 402, 0.05, 5000),  # 16-bit levels
])
def test_ablations_roundtrip(mode, n_prev, n_cur, change, n):
    rng = np.random.default_rng(n + n_cur)
    parent = rng.integers(0, n_prev, n)
    q = make_q(evolve(parent, n_prev, n_cur, change, rng), n_cur - 2)
    r, enc = roundtrip(mode, q, parent, n_prev)
    assert_same(q, r)
    assert len(enc.meta["sections"]) == 3 and enc.meta["mode"] == mode


@pytest.mark.parametrize("mode", abl.ABLATIONS)
def test_all_pruned_and_all_protected(mode):
    n = 300
    pruned, protected = np.full(n, 8), np.full(n, 9)
    for parent, child, kp, kc in [(pruned, protected, 8, 8), (protected, pruned, 8, 8),
                                  (pruned, np.full(n, 32), 8, 32), (np.full(n, 33), pruned, 32, 8)]:
        q = make_q(child, kc)
        assert_same(q, roundtrip(mode, q, parent, kp + 2)[0])


def test_rearrangement_beats_plain_rle_when_buckets_migrate_differently():
    # Bucket 3 churns, every other bucket is stable: the case Alg. 5 is for.
    rng = np.random.default_rng(0)
    parent = rng.integers(0, 18, 200_000)
    child = parent.copy()
    hot = parent == 3
    child[hot] = rng.integers(0, 18, int(hot.sum()))
    q = make_q(child, 16)
    sizes = {m: sum(f(q, torch.from_numpy(parent), 18).meta["sections"][2:])
             for m, f in ENCODERS.items()}
    assert sizes["pe"] * 2 < sizes["rle"]
    assert sizes["pe"] < sizes["he"]


@pytest.mark.parametrize("mode", abl.ABLATIONS)
def test_qdelta_decoder_refuses_ablation_payloads(mode):
    """A payload claiming a mode the repository never writes is a typed codec error."""
    rng = np.random.default_rng(1)
    parent = rng.integers(0, 10, 3000)
    q = make_q(evolve(parent, 10, 12, 0.1, rng), 10)
    enc = abl.encode(mode, q, torch.from_numpy(parent), 10)
    with pytest.raises(qc.QuantPayloadError, match="unknown delta mode") as info:
        qc.decode_delta(enc.meta, payload(enc), torch.float32, (3000,), torch.from_numpy(parent))
    assert isinstance(info.value, CodecError)
    # a real qdelta/1 payload relabelled (checksum intact) is refused the same way
    real = qc.encode_delta(q, torch.from_numpy(parent), 10)
    data = payload(real)
    meta = dict(real.meta, mode=mode, xxh3=xxhash.xxh3_64(data).hexdigest())
    with pytest.raises(qc.QuantPayloadError, match="unknown delta mode"):
        qc.decode_delta(meta, data, torch.float32, (3000,), torch.from_numpy(parent))
    with pytest.raises(CodecError):
        qc.decode_chain(make_q(parent, 8), [(meta, lambda: data)], torch.float32, (3000,))


def test_bench_delta_runs_its_encoders_and_decoders():
    from benchmarks import bench_delta

    rng = np.random.default_rng(2)
    parent = make_q(rng.integers(0, 18, 4000), 16, seed=1)
    q = make_q(evolve(parent.levels.numpy().astype(np.int64), 18, 18, 0.05, rng), 16, seed=2)
    for mode in bench_delta.MODES:
        enc = bench_delta.ENCODERS[mode](q, parent.levels, parent.n_levels)
        r = bench_delta.DECODERS[mode](enc.meta, payload(enc), q.dtype, (4000,), parent.levels)
        bench_delta._check(q, r, mode)
