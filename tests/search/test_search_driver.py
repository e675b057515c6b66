"""`find_config` on a real small model (digits MLP): epsilon honoured, deterministic,
the winner's quantization reused, neighbourhood search cheap in the steady state."""
from __future__ import annotations

import json

import pytest
import torch
import torch.nn.functional as F
from digits_mlp import digits, mlp

from mvc.io import flatten
from mvc.quant import QuantConfig, QuantPolicy, quantize_state
from mvc.search import (PROXY_EPSILON, QualityFunctionError, SearchError, SearchSpace,
                        default_policy, find_config)

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def train(model, opt, data, steps: int, seed: int = 0, ema: dict | None = None):
    """Adam steps on digits; optionally keeps a gradient EMA (beta 0.9) by flat name."""
    xtr, ytr, _, _ = data
    g = torch.Generator().manual_seed(seed)
    for _ in range(steps):
        i = torch.randint(0, len(ytr), (64,), generator=g)
        loss = F.cross_entropy(model(xtr[i]), ytr[i])
        opt.zero_grad()
        loss.backward()
        if ema is not None:
            for n, p in model.named_parameters():
                k = "model/" + n
                ema[k] = p.grad.clone() if k not in ema else ema[k].mul(0.1).add(p.grad, alpha=0.9)
        opt.step()
    return float(loss.detach())


def evaluator(model, data):
    """evaluate(flat tensors) -> held-out loss, on a scratch copy of `model`."""
    _, _, xte, yte = data

    def evaluate(tensors):
        sd = {k[len("model/"):]: v for k, v in tensors.items() if k.startswith("model/")}
        with torch.no_grad():
            return float(F.cross_entropy(torch.func.functional_call(model, sd, (xte,)), yte))
    return evaluate


@pytest.fixture(scope="module")
def trained():
    data = digits()
    model = mlp()
    opt = torch.optim.Adam(model.parameters(), 1e-3)
    ema: dict = {}
    train(model, opt, data, 150, ema=ema)
    flat = flatten({"model": model.state_dict(), "optimizer": opt.state_dict()}).tensors
    return model, data, flat, ema


def restored(flat, qmap):
    return {k: (qmap[k].dequantize() if qmap.get(k) is not None else v) for k, v in flat.items()}


def test_exhaustive_search_honours_epsilon_and_reuses_the_winner(trained):
    model, data, flat, ema = trained
    evaluate = evaluator(model, data)
    res = find_config(flat, evaluate=evaluate, epsilon=0.01, grads=ema)
    assert res.config is not None and res.quality.to_json()["mode"] == "exhaustive"
    base = evaluate(flat)
    value = evaluate(restored(flat, res.qmap))
    assert (value - base) / base <= 0.01
    assert res.quality.to_json()["baseline"] == base and res.quality.to_json()["value"] == value
    assert res.quality.to_json()["degradation"] <= 0.01 and res.quality.to_json()["epsilon"] == 0.01
    # the baseline, every trial, and the mirror of every trial that passed on its own
    trials = res.quality.to_json()["trials"]
    mirrored = [t for t in trials if "mirror" in t]
    assert mirrored and all(t["degradation"] <= 0.01 for t in mirrored)
    assert res.evaluations == res.quality.to_json()["evaluations"] == len(trials) + 1 + len(mirrored)
    assert res.quality.mirror_check and res.quality.mirror_degradation <= 0.01
    assert res.quality.to_json()["metric"].startswith("quality:")
    json.dumps(res.quality.to_json(), allow_nan=False)
    # the qmap is exactly what quantize_state gives for the chosen config
    again = quantize_state(flat, res.config, default_policy(), ema, nonfinite="lossless")
    assert set(again) == set(res.qmap)
    for k, q in again.items():
        if q is None:
            assert res.qmap[k] is None
        else:
            assert torch.equal(q.levels, res.qmap[k].levels)
            assert torch.equal(q.centroids, res.qmap[k].centroids)
            assert torch.equal(q.protected, res.qmap[k].protected)
    # optimizer state is never quantized by the default policy
    assert all(res.qmap[k] is None for k in flat if k.startswith("optimizer/"))


def test_search_is_deterministic(trained):
    model, data, flat, ema = trained
    a = find_config(flat, evaluate=evaluator(model, data), grads=ema)
    b = find_config(flat, evaluate=evaluator(model, data), grads=ema)
    assert a.config == b.config and a.quality.to_json() == b.quality.to_json()
    assert all(torch.equal(a.qmap[k].levels, b.qmap[k].levels) for k in a.qmap if a.qmap[k] is not None)


def test_neighbourhood_search_is_cheap_and_never_more_aggressive(trained):
    model, data, flat, ema = trained
    evaluate = evaluator(model, data)
    first = find_config(flat, evaluate=evaluate, grads=ema)
    prev = QuantConfig(bins=16, prune=0.1, prune_metric="magnitude", protect=0.005)
    nxt = find_config(flat, evaluate=evaluate, grads=ema, previous=prev)
    assert nxt.quality.to_json()["mode"] in ("neighbourhood", "fallback-exhaustive")
    if nxt.quality.to_json()["mode"] == "neighbourhood":
        c = nxt.config
        assert c.bins >= prev.bins and c.prune <= prev.prune and c.protect >= prev.protect
        assert nxt.evaluations < first.evaluations
    assert nxt.quality.to_json()["degradation"] <= 0.01
    # from its own previous winner the steady state costs at most baseline + 2 trials (and
    # the mirror of each trial that passed on its own: the scalar gate's mirror check)
    steady = find_config(flat, evaluate=evaluate, grads=ema, previous=first.config)
    trials = steady.quality.to_json()["trials"]
    assert steady.quality.to_json()["mode"] == "neighbourhood" and len(trials) <= 2
    assert steady.evaluations == 1 + len(trials) + sum("mirror" in t for t in trials) <= 5
    assert steady.config.bins == first.config.bins


def test_fallback_to_exhaustive_when_the_neighbourhood_fails(trained):
    model, data, flat, ema = trained
    base_eval = evaluator(model, data)
    calls = []

    def evaluate(t):  # any pruning is unacceptable here: two steps from prune 0.2
        calls.append(1)
        pruned = float((t["model/0.weight"] == 0).float().mean())
        return base_eval(t) + (1.0 if pruned > 0.01 else 0.0)
    prev = QuantConfig(bins=8, prune=0.2, protect=0.0005)
    res = find_config(flat, evaluate=evaluate, previous=prev)
    assert res.quality.to_json()["mode"] == "fallback-exhaustive"
    assert res.config is not None and res.config.prune == 0.0
    assert res.quality.to_json()["degradation"] <= 0.01 and len(calls) == res.evaluations


def test_nothing_feasible_means_lossless(trained):
    model, data, flat, _ = trained
    base_eval = evaluator(model, data)

    def evaluate(t):
        return base_eval(t) + (0.0 if torch.equal(t["model/0.weight"], flat["model/0.weight"]) else 1.0)
    res = find_config(flat, evaluate=evaluate)
    assert res.config is None and all(q is None for q in res.qmap.values())
    assert res.quality.to_json()["value"] is None and res.quality.to_json()["evaluations"] == res.evaluations >= 2
    json.dumps(res.quality.to_json(), allow_nan=False)


def test_nothing_to_quantize(trained):
    _, _, flat, _ = trained
    res = find_config(flat, evaluate=lambda t: 1.0, policy=QuantPolicy(min_numel=10**9))
    assert res.config is None and res.evaluations == 0
    assert res.quality.to_json()["mode"] == "nothing-to-quantize"


def test_proxy_mode(trained):
    _, _, flat, ema = trained
    res = find_config(flat)
    assert res.quality.to_json()["metric"] == "proxy:magnitude_weighted_rel_l2"
    assert res.quality.to_json()["epsilon"] == PROXY_EPSILON and res.quality.to_json()["value"] <= PROXY_EPSILON
    assert res.evaluations == 0  # the proxy is not a quality-function call
    with_g = find_config(flat, grads=ema)
    assert with_g.quality.to_json()["metric"] == "proxy:max(magnitude,grad)_weighted_rel_l2"


def test_sensitivity_metric_needs_gradients(trained):
    model, data, flat, ema = trained
    evaluate = evaluator(model, data)
    no_g = find_config(flat, evaluate=evaluate)
    assert all(t["config"]["metric"] == "magnitude" for t in no_g.quality.to_json()["trials"])
    with_g = find_config(flat, evaluate=evaluate, grads=ema)
    assert any(t["config"]["metric"] == "sensitivity" for t in with_g.quality.to_json()["trials"])


def test_custom_space_and_errors(trained):
    model, data, flat, _ = trained
    sp = SearchSpace(bins=(16, 32), prune=(0.0,), prune_metric=("magnitude",), protect=(0.005,))
    res = find_config(flat, evaluate=evaluator(model, data), space=sp)
    assert res.config.bins in (16, 32) and res.config.prune == 0.0
    with pytest.raises(QualityFunctionError):
        find_config(flat, evaluate=lambda t: float("nan"))
    with pytest.raises(SearchError):
        find_config(flat, epsilon=-1.0)
