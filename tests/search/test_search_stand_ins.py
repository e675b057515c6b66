"""A proxy search measures a tensor's quantization once per (quantizer, key): later trials
with that key measure a levels-free stand-in (`mvc.quant.error.measured_stand_in`), with the
same trials, record and winner as quantizing it again."""
from __future__ import annotations

import collections

import pytest
import torch

import mvc.search.prepared as prepared
from mvc.errors import InternalError
from mvc.quant import quantize
from mvc.quant.error import (cached_error_sums, error_sums, level_histogram, measured_stand_in,
                             seed_error_stats)
from mvc.search import find_config

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def _state(seed: int = 0) -> dict[str, torch.Tensor]:
    """An embedding and a few linear layers: a search whose trials repeat the linear layers'
    (bins, thresholds) while their embedding bins differ."""
    g = torch.Generator().manual_seed(seed)
    out = {"model/wte.weight": torch.randn(3000, 64, generator=g) * 0.02}
    for i in range(3):
        out[f"model/h.{i}.mlp.weight"] = torch.randn(256, 64, generator=g) * 0.05
        out[f"model/h.{i}.mlp.bias"] = torch.randn(256, generator=g) * 0.01
    return out


def _search(tensors, counted: collections.Counter, monkeypatch, **kw):
    real = prepared.Prepared.quantize

    def counting(self, name, bins, thr, **k):
        counted[(name, bins, thr)] += 1
        return real(self, name, bins, thr, **k)

    with monkeypatch.context() as m:
        m.setattr(prepared.Prepared, "quantize", counting)
        return find_config(tensors, epsilon=0.05, **kw)


@pytest.mark.parametrize("grads", [False, True])
def test_stand_ins_give_the_same_search_with_fewer_quantizations(monkeypatch, grads):
    tensors = _state()
    g = ({n: torch.randn_like(t) * 1e-3 for n, t in tensors.items()} if grads else None)
    with_stand_ins, without = collections.Counter(), collections.Counter()
    a = _search(tensors, with_stand_ins, monkeypatch, grads=g)
    monkeypatch.setattr(prepared.Prepared, "measures_stand_ins", False)
    b = _search(tensors, without, monkeypatch, grads=g)
    assert a.config == b.config and a.quality.to_json() == b.quality.to_json()
    assert len(a.quality.trials) > 3
    for name, q in a.qmap.items():   # the winner's levels themselves, not stand-ins
        other = b.qmap[name]
        assert (q is None) == (other is None)
        if q is not None:
            assert not q.measured_only
            assert torch.equal(q.levels, other.levels) and torch.equal(q.centroids, other.centroids)
            assert torch.equal(q.protected, other.protected)
    # each key quantized once, and again only for the winner's levels
    assert sum(with_stand_ins.values()) < sum(without.values())
    assert max(with_stand_ins.values()) <= 2 and set(with_stand_ins) == set(without)


def test_a_quality_function_search_takes_no_stand_ins(monkeypatch):
    tensors = _state(1)
    seen = []

    def evaluate(cand):
        seen.append(cand)   # every candidate is decoded: stand-ins would raise here
        return 1.0 + sum(float((cand[n] - tensors[n]).pow(2).sum()) for n in tensors)

    got = find_config(tensors, evaluate=evaluate, epsilon=0.05)
    assert seen and got.quality is not None


def test_a_stand_in_is_measured_as_its_quantization_and_never_decoded():
    x = torch.randn(500, 40, generator=torch.Generator().manual_seed(2))
    w = torch.rand(500, 40, generator=torch.Generator().manual_seed(3))
    q = quantize(x, 16, prune=0.1, protect=0.01)
    assert measured_stand_in(q) is None   # nothing measured yet
    seed_error_stats(q, x, w, error_sums(q, x, w), None)
    level_histogram(q)
    stand = measured_stand_in(q)
    assert stand is not None and stand.measured_only and not q.measured_only
    assert stand.levels.shape == q.levels.shape and stand.levels.dtype == q.levels.dtype
    assert stand.protected.numel() == q.protected.numel()
    assert stand.levels.untyped_storage().nbytes() <= 8   # a placeholder, not levels
    assert cached_error_sums(stand, x, w) == cached_error_sums(q, x, w)
    assert cached_error_sums(stand, x) == cached_error_sums(q, x)
    assert torch.equal(level_histogram(stand), level_histogram(q))
    assert stand.to("cpu").measured_only
    with pytest.raises(InternalError, match="stand-in"):
        stand.dequantize()
    with pytest.raises(InternalError, match="stand-in"):
        cached_error_sums(stand, x.clone())   # other tensors: its sums cannot serve them


def test_a_stand_in_never_reaches_the_writer():
    from mvc.repo.lossy import encode_for_commit

    x = torch.randn(300, generator=torch.Generator().manual_seed(4))
    q = quantize(x, 8)
    seed_error_stats(q, x, None, error_sums(q, x), None)
    level_histogram(q)
    stand = measured_stand_in(q)
    assert stand is not None
    with pytest.raises(InternalError, match="writer"):
        encode_for_commit(stand, None, None, lambda sid, rec: q, base_every=8)
