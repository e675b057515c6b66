"""The sharded save's search is `mvc.search`'s (issue 26): in one process (the collectives
are the identity) `mvc.dcp.lossy.choose` walks the trials `find_config` walks on the same
tensors, magnitude pruning only, and records what its search records."""
from __future__ import annotations

import torch

from mvc.dcp import lossy
from mvc.quant import QuantConfig, QuantPolicy
from mvc.search import SearchSpace, find_config

POLICY = QuantPolicy(min_numel=0)


def _state() -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(3)
    return {"model/0.weight": torch.randn(128, 64, generator=g) * 0.1,
            "model/2.weight": torch.randn(64, 128, generator=g) * 0.05,
            "model/tok_emb.weight": torch.randn(300, 32, generator=g),
            "model/4.bias": torch.randn(10, generator=g)}


def _halves(t: dict[str, torch.Tensor]) -> tuple[dict[str, torch.Tensor], dict[str, dict]]:
    """Every tensor as two row shards, both held by this process."""
    tensors, shards = {}, {}
    for name, v in t.items():
        n = v.shape[0] // 2
        for lo, hi in ((0, n), (n, v.shape[0])):
            rec = f"{name}@{lo}"
            tensors[rec] = v[lo:hi].clone()
            shards[rec] = {"of": name, "shape": list(v.shape), "offsets": [lo] + [0] * (v.dim() - 1)}
    return tensors, shards


def test_sharded_search_walks_the_trials_find_config_walks():
    t = _state()
    how = lossy.How("search", space=SearchSpace(), epsilon=0.05, tensor_cap=0.5, policy=POLICY)
    qmap, config, quality = lossy.choose(t, {}, how, {})
    want = find_config(t, policy=POLICY, space=SearchSpace(prune_metric=("magnitude",)),
                       epsilon=0.05, tensor_cap=0.5)
    assert want.config is not None and config == want.config.to_dict()
    mine = [(e["config"], e["feasible"], e["bits"]) for e in quality["trials"]]
    assert mine == [(e["config"], e["feasible"], e["bits"]) for e in want.quality.trials or []]
    assert quality["sharded"] is True and quality["mode"] == "exhaustive-sharded"
    assert quality["gate"] == "proxy" and quality["bits_per_param"] == want.quality.bits_per_param
    assert sorted(qmap) == sorted(n for n, q in want.qmap.items() if q is not None)


def test_shards_in_one_process_choose_what_the_whole_tensors_choose():
    t = _state()
    how = lossy.How("search", space=SearchSpace(), epsilon=0.05, tensor_cap=0.5, policy=POLICY)
    tensors, shards = _halves(t)
    qmap, config, quality = lossy.choose(tensors, shards, how, {})
    _, whole, whole_quality = lossy.choose(t, {}, how, {})
    assert config == whole
    assert sorted(qmap) == sorted(n for n in tensors if not n.startswith("model/4.bias"))
    for e, w in zip(quality["trials"], whole_quality["trials"], strict=True):
        assert e["config"] == w["config"] and e["feasible"] == w["feasible"]


def test_nothing_feasible_and_fixed_records():
    t = _state()
    how = lossy.How("search", space=SearchSpace(), epsilon=1e-9, tensor_cap=0.5, policy=POLICY)
    qmap, config, quality = lossy.choose(t, {}, how, {})
    assert (qmap, config) == ({}, None)
    assert quality["stored"] == "lossless: no feasible configuration"
    assert quality["value"] is None and quality["closest"]["feasible"] is False
    fixed = lossy.How("fixed", config=QuantConfig(bins=8, prune=0.2).to_dict(), policy=POLICY)
    qmap, config, quality = lossy.choose(t, {}, fixed, {})
    assert config is not None and config["bins"] == 8
    assert quality["gate"] == "none" and quality["bound"] is None and quality["sharded"] is True
    assert quality["quantized_tensors"] == len(qmap) == 3 and quality["worst_tensor"] in qmap


def test_a_fixed_uniform_config_shards_like_the_whole_tensor():
    """A sharded save quantizes in the config's family: a uniform grid from the merged sketch,
    the same on every shard, the whole tensor's (was: k-means, the family ignored)."""
    from mvc.quant import quantize
    from mvc.quant.uniform import grid_size

    t = _state()
    config = QuantConfig(bins=16, prune=0.1, family="uniform")
    how = lossy.How("fixed", config=config.to_dict(), policy=POLICY)
    tensors, shards = _halves(t)
    qmap, got, _ = lossy.choose(tensors, shards, how, {})
    assert got == config.to_dict()
    for name in ("model/0.weight", "model/2.weight"):
        a, b = qmap[f"{name}@0"], qmap[f"{name}@{t[name].shape[0] // 2}"]
        assert a.centroids.numel() == grid_size(16) and torch.equal(a.centroids, b.centroids)
        whole = quantize(t[name], 16, prune=0.1, family="uniform")
        assert torch.equal(a.centroids, whole.centroids)
        assert torch.equal(torch.cat([a.levels, b.levels]), whole.levels)


def test_a_fixed_config_with_feedback_is_applied_without_it_and_says_so():
    """A sharded save has no layer inputs to take Hessians from: the config it records is the
    one it applied (feedback off), with a warning, not the one asked for."""
    import pytest

    from mvc.errors import MvcWarning

    t = _state()
    config = QuantConfig(bins=16, prune=0.1, feedback=True)
    how = lossy.How("fixed", config=config.to_dict(), policy=POLICY)
    with pytest.warns(MvcWarning, match="error feedback"):
        qmap, got, _ = lossy.choose(t, {}, how, {})
    assert got == QuantConfig(bins=16, prune=0.1).to_dict() and qmap


def test_the_default_space_refines_in_a_sharded_save_as_find_config_does():
    """How with no space searches the default one, which refines before a lossless fallback:
    shards, whole tensors and `find_config` (magnitude pruning) walk the same refined trials
    to the same config, one the default cube does not have."""
    import dataclasses

    t = _state()
    how = lossy.How("search", epsilon=0.02, tensor_cap=0.5, policy=POLICY)
    plain = lossy.How("search", space=SearchSpace(), epsilon=0.02, tensor_cap=0.5, policy=POLICY)
    assert lossy.choose(t, {}, plain, {})[1] is None            # the cube alone: lossless
    tensors, shards = _halves(t)
    qmap, config, quality = lossy.choose(tensors, shards, how, {})
    _, whole, whole_quality = lossy.choose(t, {}, how, {})
    want = find_config(t, policy=POLICY, epsilon=0.02, tensor_cap=0.5,
                       space=dataclasses.replace(SearchSpace.default(), prune_metric=("magnitude",)))
    assert want.config is not None and config == whole == want.config.to_dict()
    assert quality["refined"] is True and whole_quality["refined"] is True
    assert config["bins"] > 64 or (config.get("embedding_bins") or 0) > 32 \
        or config.get("family") == "uniform"
    trials = [(e["config"], e["feasible"]) for e in quality["trials"]]
    assert trials == [(e["config"], e["feasible"]) for e in whole_quality["trials"]]
    assert trials == [(e["config"], e["feasible"]) for e in want.quality.trials or []]
    assert quality["mode"] == "exhaustive-sharded" and qmap
