"""QuantConfig / QuantPolicy, layer types, and whole-state-dict quantization."""
from __future__ import annotations

import json

import pytest
import torch

from mvc.quant import (NonFiniteTensorError, QuantConfig, QuantConfigError, QuantPolicy,
                       QuantStateError, dequantize_state, layer_type, quantize_state)


def _state(seed: int = 0) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return {
        "emb.weight": torch.randn(500, 32, generator=g),
        "layers.0.attn.q_proj.weight": torch.randn(64, 64, generator=g) * 0.1,
        "layers.0.fc1.weight": torch.randn(128, 64, generator=g) * 0.05,
        "layers.0.fc1.bias": torch.randn(128, generator=g),
        "layers.0.fc2.weight": torch.randn(64, 128, generator=g) * 5.0,  # other scale, same type
        "layers.0.norm.weight": torch.ones(64),
        "conv.weight": torch.randn(16, 8, 3, 3, generator=g).to(torch.float16),
        "head.weight": torch.randn(10, 64, generator=g),  # small: stays lossless
        "step": torch.tensor(7),
        "mask": torch.ones(100, 100, dtype=torch.bool),
    }


POLICY = QuantPolicy(min_numel=1000)


def test_config_json_round_trip_and_validation():
    cfg = QuantConfig(bins=12, prune=0.2, prune_metric="sensitivity", protect=0.001,
                      embedding_bins=6, embedding_prune=0.4, alpha=0.02, sigma=0.3)
    assert QuantConfig.from_dict(json.loads(json.dumps(cfg.to_dict()))) == cfg
    assert QuantConfig.from_dict(QuantConfig().to_dict()) == QuantConfig()
    emb = cfg.for_layer_type("embedding")
    assert (emb.bins, emb.prune, emb.prune_metric, emb.protect) == (6, 0.4, "sensitivity", 0.001)
    lin = cfg.for_layer_type("linear")
    assert (lin.bins, lin.prune) == (12, 0.2)
    for bad in [dict(bins=0), dict(bins=True), dict(prune=2), dict(protect=-1), dict(prune_metric="x"),
                dict(embedding_bins=0), dict(embedding_prune_metric="y"), dict(alpha=1.0), dict(sigma=-1)]:
        with pytest.raises(QuantConfigError):
            QuantConfig(**bad)
    with pytest.raises(QuantConfigError):
        QuantConfig.from_dict({"bins": 4, "colour": "red"})
    with pytest.raises(QuantConfigError):
        QuantConfig.from_dict([1, 2])


def test_policy_decisions_and_round_trip():
    s = _state()
    p = POLICY
    chosen = {n for n, t in s.items() if p.should_quantize(n, t)}
    assert chosen == {"emb.weight", "layers.0.attn.q_proj.weight", "layers.0.fc1.weight",
                      "layers.0.fc2.weight", "conv.weight"}
    p2 = QuantPolicy(min_numel=1000, include=("head.*", "mask"), exclude=("emb.*",))
    chosen2 = {n for n, t in s.items() if p2.should_quantize(n, t)}
    assert "head.weight" in chosen2 and "emb.weight" not in chosen2 and "mask" not in chosen2
    assert QuantPolicy.from_dict(json.loads(json.dumps(p2.to_dict()))) == p2
    with pytest.raises(QuantConfigError):
        QuantPolicy(min_numel=-1)
    with pytest.raises(QuantConfigError):
        QuantPolicy(include="*.weight")


@pytest.mark.parametrize("name,shape,expected", [
    ("fc.bias", (4,), "bias"), ("bn1.weight", (64,), "norm"), ("bn1.running_var", (64,), "norm"),
    ("h.0.ln_1.weight", (768,), "norm"), ("encoder.layer.0.attention.output.LayerNorm.weight", (8,), "norm"),
    ("transformer.wte.weight", (50257, 768), "embedding"), ("embed_tokens.weight", (100, 8), "embedding"),
    ("h.0.attn.c_attn.weight", (768, 2304), "attention"), ("attention.self.query.weight", (8, 8), "attention"),
    ("layers.0.attention.wq.weight", (8, 8), "attention"), ("self_attn.in_proj_weight", (24, 8), "attention"),
    ("monkey.weight", (8, 8), "linear"), ("h.0.mlp.c_fc.weight", (768, 3072), "linear"),
    ("conv1.weight", (64, 3, 7, 7), "conv"), ("layer1.0.downsample.0.weight", (64, 64, 1, 1), "conv"),
    ("patch_embed.proj.weight", (768, 3, 16, 16), "conv"), ("scale", (1,), "other"), ("step", (), "other"),
])
def test_layer_type(name, shape, expected):
    assert layer_type(name, shape) == expected


def test_quantize_state_round_trip_and_lossless_entries():
    s = _state()
    cfg = QuantConfig(bins=8, prune=0.1, protect=0.01, embedding_bins=4)
    q = quantize_state(s, cfg, POLICY)
    assert set(q) == set(s)
    assert q["head.weight"] is None and q["step"] is None and q["mask"] is None
    assert q["emb.weight"].bins == 4 and q["layers.0.fc1.weight"].bins == 8
    lossless = {n: t for n, t in s.items() if q[n] is None}
    out = dequantize_state(q, lossless)
    for n, t in s.items():
        assert out[n].dtype == t.dtype and out[n].shape == t.shape
        if q[n] is None:
            assert out[n] is t
    with pytest.raises(QuantStateError):
        dequantize_state(q, {})


def test_one_fraction_per_layer_type():
    """Thresholds come from the union of a type's tensors: the small-scale tensor of the
    linear group loses far more than the requested fraction, the large-scale one less."""
    s = _state()
    q = quantize_state(s, QuantConfig(bins=8, prune=0.5), POLICY)
    f1 = (q["layers.0.fc1.weight"].levels == 8).float().mean().item()
    f2 = (q["layers.0.fc2.weight"].levels == 8).float().mean().item()
    n1, n2 = s["layers.0.fc1.weight"].numel(), s["layers.0.fc2.weight"].numel()
    assert f1 > 0.9 and f2 < 0.1
    assert abs((f1 * n1 + f2 * n2) / (n1 + n2) - 0.5) < 0.02
    # a single-tensor type gets exactly its own fraction
    fa = (q["layers.0.attn.q_proj.weight"].levels == 8).float().mean().item()
    assert abs(fa - 0.5) < 0.02


def test_quantize_state_with_grads_is_deterministic():
    s = _state()
    grads = {n: torch.randn_like(t) for n, t in s.items() if t.is_floating_point()}
    cfg = QuantConfig(bins=6, prune=0.2, prune_metric="sensitivity", protect=0.01)
    a = quantize_state(s, cfg, POLICY, grads=grads, seed=3)
    b = quantize_state(s, cfg, POLICY, grads=grads, seed=3)
    for n in s:
        if a[n] is None:
            assert b[n] is None
            continue
        assert torch.equal(a[n].levels, b[n].levels) and torch.equal(a[n].centroids, b[n].centroids)
        assert torch.equal(a[n].dequantize()[a[n].levels == 7], s[n][a[n].levels == 7])
    missing = dict(grads)
    del missing["layers.0.fc2.weight"]
    with pytest.raises(QuantConfigError, match="fc2"):
        quantize_state(s, cfg, POLICY, grads=missing)
    with pytest.raises(QuantConfigError):
        quantize_state(s, cfg, POLICY)


def test_quantize_state_non_finite_policy():
    s = _state()
    s["layers.0.fc1.weight"][0, 0] = float("nan")
    with pytest.raises(NonFiniteTensorError, match="layers.0.fc1.weight"):
        quantize_state(s, QuantConfig(), POLICY)
    q = quantize_state(s, QuantConfig(), POLICY, nonfinite="lossless")
    assert q["layers.0.fc1.weight"] is None and q["layers.0.fc2.weight"] is not None
    with pytest.raises(QuantConfigError):
        quantize_state(s, QuantConfig(), POLICY, nonfinite="ignore")


def test_nesting_levels_are_name_components_for_layer_types():
    """A nested checkpoint's flattened names ("model/wte.weight") get the layer types of the
    flat state dict's ("wte.weight"): embeddings are embeddings, norms are kept exact."""
    from mvc.layer_types import layer_type
    from mvc.quant import QuantPolicy

    for flat, nested, shape in [("wte.weight", "model/wte.weight", (50, 8)),
                                ("ln_f.weight", "model/ln_f.weight", (4096,)),
                                ("h.0.attn.c_attn.weight", "model/h.0.attn.c_attn.weight", (8, 24)),
                                ("embed.weight", "model/embed.weight", (50, 8))]:
        assert layer_type(nested, shape) == layer_type(flat, shape), nested
    assert not QuantPolicy(min_numel=0).should_quantize("model/ln_f.weight", torch.ones(4096))
