"""A search trial on a device waits for it once (issue 27): every layer type's batched pass is
enqueued before any is read back, so the device runs one layer type's pass while the host runs
the next one's k-means and launches, and the host does not stall the queue per layer type.

Counted on the host by tests/helpers/sync_counter.py (`waits`: the synchronisations that find
launches queued since the last one), through the device path on host tensors.
"""
from __future__ import annotations

import pytest
import torch
from sync_counter import SyncCounter

from mvc.quant import QuantConfig
from mvc.quant.backend import device_path
from mvc.search import default_policy
from mvc.search.prepared import Prepared
from mvc.search.trials import quantize_config


def _tensors(layers: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(4)
    out = {"model/wte.weight": torch.randn(512, 32, generator=g)}
    for i in range(layers):
        out[f"model/h.{i}.fc.weight"] = torch.randn(256, 128, generator=g)
        out[f"model/h.{i}.proj.weight"] = torch.randn(128, 256, generator=g)
    return out


def _trial(tensors: dict[str, torch.Tensor], config: QuantConfig) -> tuple[SyncCounter, dict]:
    prep = Prepared(tensors, {}, default_policy(), 0.01)
    with device_path(), SyncCounter(device=list(tensors.values())) as counter:
        qmap, _ = quantize_config(prep, config, seed=0, init={}, weigh=True)
    return counter, qmap


def test_a_trial_waits_for_the_device_once_whatever_its_layer_types():
    two_bins = QuantConfig(bins=64, embedding_bins=8)   # two batched passes: one per bins count
    one, _ = _trial({"model/wte.weight": _tensors(0)["model/wte.weight"]}, two_bins)
    many, qmap = _trial(_tensors(3), two_bins)
    assert {q.bins for q in qmap.values()} == {8, 64}
    # each pass still reads its counts and sums back, but only the first finds work queued
    assert many.syncs > one.syncs
    assert one.waits == many.waits == 1, (one.kinds, many.kinds)


def test_a_trial_takes_the_same_quantizations_as_one_pass_at_a_time(monkeypatch):
    """Enqueuing every pass first changes no result: levels, centroids, sums and counts are
    those of each pass waited for on its own."""
    import mvc.search.prepared as prepared
    from mvc.quant.error import cached_error_sums

    tensors = _tensors(2)
    config = QuantConfig(bins=64, embedding_bins=8)
    _, together = _trial(tensors, config)
    real = prepared.start_group

    def one_at_a_time(*a, **k):
        pending = real(*a, **k)
        pending.results()
        return pending

    monkeypatch.setattr(prepared, "start_group", one_at_a_time)
    _, alone = _trial(tensors, config)
    assert together.keys() == alone.keys()
    for name, q in together.items():
        r = alone[name]
        assert torch.equal(q.levels, r.levels) and torch.equal(q.centroids, r.centroids)
        assert torch.equal(q.protected, r.protected)
        assert cached_error_sums(q, tensors[name]) == cached_error_sums(r, tensors[name])


def test_a_fixed_config_commit_waits_as_often_for_many_tensors_as_for_one():
    # `Repo.commit(quant=...)` / commit.mode=fixed: a search's one trial (sketches, the batched
    # passes, the error from the passes' own sums), not a pass and several waits per tensor
    from mvc.search.plan import Quantization, plan_quantization

    def plan(tensors: dict[str, torch.Tensor]) -> SyncCounter:
        how = Quantization(mode="fixed", config=QuantConfig(bins=16, prune=0.1, protect=0.01))
        with device_path(), SyncCounter(device=list(tensors.values())) as counter:
            plan_quantization(tensors, how, to_state=lambda d: d)
        return counter

    # the same layer types, 3 tensors or 9: the same synchronisations (the sketches' counts,
    # each pass's counts and sums), of which two wait (the sketches; the trial)
    few, many = plan(_tensors(1)), plan(_tensors(4))
    assert many.syncs == few.syncs, (few.kinds, many.kinds)
    assert many.waits == few.waits == 2


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_trial_is_the_host_trial():  # pragma: no cover - no GPU in CI
    """Every layer type's pass enqueued on a real stream before any is read back: the same
    quantizations as the device path on host tensors."""
    tensors = _tensors(2)
    config = QuantConfig(bins=64, embedding_bins=8)
    _, host = _trial(tensors, config)
    prep = Prepared({n: t.cuda() for n, t in tensors.items()}, {}, default_policy(), 0.01)
    dev, _ = quantize_config(prep, config, seed=0, init={}, weigh=True)
    assert dev.keys() == host.keys()
    for name, q in host.items():
        d = dev[name]
        assert d.levels.is_cuda
        assert torch.equal(q.levels, d.levels.cpu()) and torch.equal(q.centroids, d.centroids.cpu())
        assert torch.equal(q.protected, d.protected.cpu())
