"""Issue 29: the scalar gate's mirror check.

A quality function returning one loss is judged on each passing trial w + delta and on
its mirror w - delta; a trial is accepted only when both are within epsilon, so the
search cannot select a trial for the sign of its calibration noise.  The check is on by
default, recorded (`mirror_check`, `mirror_degradation`, per trial `mirror`), and off
with `mirror=False` / config `quality.mirror = false`.
"""
from __future__ import annotations

import json
import math
import warnings

import pytest
import torch

from mvc.cli.commands_history import describe_gate
from mvc.errors import MvcWarning
from mvc.quant import QuantConfig, quantize
from mvc.repo.repository import Repo
from mvc.search import QualityRecord, SearchSpace, find_config
from mvc.search.gate import MetricJudge, mirror_candidate
from mvc.search.plan import FixedConfigRefusedError

pytestmark = pytest.mark.usefixtures("one_torch_thread")

SPACE = SearchSpace(bins=(4, 8, 32), prune=(0.0, 0.2, 0.5), prune_metric=("magnitude",),
                    protect=(0.0,))


def test_mirror_candidate_reflects_each_quantized_tensor_through_its_exact_value():
    g = torch.Generator().manual_seed(0)
    w = torch.randn(32, 48, generator=g)
    wb = torch.randn(16, 16, generator=g).to(torch.bfloat16)
    bias = torch.randn(48, generator=g)
    q = quantize(w, 8, prune=0.3).dequantize().reshape(w.shape)
    qb = quantize(wb, 8).dequantize().reshape(wb.shape).to(torch.bfloat16)
    cand = {"w": q, "wb": qb, "bias": bias}
    m = mirror_candidate({"w": w, "wb": wb, "bias": bias}, cand, {"w", "wb"})
    assert list(m) == ["w", "wb", "bias"] and m["bias"] is bias   # exact tensors stay
    assert torch.equal(m["w"], w * 2 - q)
    pruned = q == 0
    assert pruned.any() and torch.equal(m["w"][pruned], 2 * w[pruned])   # a pruned weight doubles
    assert m["wb"].dtype == torch.bfloat16 and m["wb"].shape == wb.shape
    assert torch.equal(m["wb"], (wb.float() * 2 - qb.float()).to(torch.bfloat16))


def test_metric_judge_accepts_only_when_the_trial_and_its_mirror_are_within_epsilon():
    judge = MetricJudge(2.0, 0.01)
    v = judge.verdict(2.0 * (1 - 0.004), "f")           # the trial measures "better"
    assert v.feasible and judge.wants_mirror(v)
    ok = judge.with_mirror(v, 2.0 * 1.008, "f")
    assert ok.feasible and ok.degradation == pytest.approx(-0.004)
    assert ok.info["mirror"] == pytest.approx(0.008) and ok.preference == pytest.approx(0.008)
    lucky = judge.with_mirror(v, 2.0 * 1.02, "f")       # its luck: the mirror pays for it
    assert not lucky.feasible and lucky.info["mirror"] == pytest.approx(0.02)
    assert not judge.with_mirror(v, math.nan, "f").feasible
    assert not judge.wants_mirror(judge.verdict(2.03, "f"))   # refused on its own: no mirror
    assert judge.record(ok) == {"mirror_check": True, "mirror_degradation": ok.info["mirror"]}
    assert judge.record(None) == {"mirror_check": True, "mirror_degradation": None}
    off = MetricJudge(2.0, 0.01, mirror=False)
    assert not off.wants_mirror(off.verdict(2.0, "f")) and off.record(None) == {"mirror_check": False}


def _lucky(exact: dict[str, torch.Tensor], scale: float):
    """A loss linear in the weights whose slope makes every quantization look better the
    more it shrinks the weights (pruning most): the first-order "luck" of a calibration set,
    pure.  Its mirror measures the same amount worse."""
    def loss(tensors: dict[str, torch.Tensor]) -> float:
        t = tensors["model/w"] if "model/w" in tensors else tensors["model"]["w"]
        w = exact["model/w"]
        return 1.0 + scale * float(((t - w) * torch.sign(w)).sum()) / w.numel()
    return loss


@pytest.fixture()
def weights():
    return {"model/w": torch.randn(64, 96, generator=torch.Generator().manual_seed(3))}


def test_the_search_cannot_select_a_trial_for_its_luck(weights):
    loss = _lucky(weights, 0.5)
    calls: list[dict] = []

    def counted(t):
        calls.append(t)
        return loss(t)
    before = find_config(weights, evaluate=counted, epsilon=0.01, space=SPACE,
                         tensor_cap=math.inf, mirror=False)
    assert (before.config.bins, before.config.prune) == (4, 0.5)   # "better" than the original
    assert before.quality.degradation < 0 and before.quality.mirror_check is False
    assert before.evaluations == len(calls) == len(before.quality.trials or []) + 1

    calls.clear()
    after = find_config(weights, evaluate=counted, epsilon=0.01, space=SPACE, tensor_cap=math.inf)
    q = after.quality
    assert after.config is not None and (after.config.bins, after.config.prune) != (4, 0.5)
    assert q.gate == "metric" and q.mirror_check is True
    assert q.degradation <= 0.01 and 0 <= q.mirror_degradation <= 0.01
    trials = q.trials or []
    refused = [t for t in trials if "mirror" in t and not t["feasible"]]
    assert refused and all(t["degradation"] <= 0.01 < t["mirror"] for t in refused)
    assert all("mirror" not in t for t in trials if t["degradation"] > 0.01)
    assert after.evaluations == len(calls) == len(trials) + 1 + sum("mirror" in t for t in trials)
    # the mirrored calls saw w - delta, whose loss is the trial's luck with the other sign
    w = weights["model/w"]
    chosen = after.qmap["model/w"].dequantize().reshape(w.shape)
    assert any(torch.equal(c["model/w"], w * 2 - chosen) for c in calls)
    assert q.mirror_degradation == pytest.approx(-q.degradation, rel=1e-4, abs=1e-7)
    assert QualityRecord.from_json(q.to_json()).to_json() == q.to_json()
    json.dumps(q.to_json(), allow_nan=False)


def test_quality_mirror_config_and_the_commit_record(tmp_path, weights):
    state = {"model": {"w": weights["model/w"]}}
    loss = _lucky(weights, 0.5)
    with Repo.init(tmp_path / "on") as repo:
        q = repo.read_commit(repo.commit(state, "on", quality=loss, epsilon=0.01, space=SPACE)).quality
        assert q["mirror_check"] is True and q["mirror_degradation"] <= 0.01
        assert "mirror" in describe_gate(q) and "both" in describe_gate(q)
    with Repo.init(tmp_path / "off") as repo:
        repo.config.set("quality.mirror", "false")
        assert repo.config.get("quality.mirror") is False
        q = repo.read_commit(repo.commit(state, "off", quality=loss, epsilon=0.01,
                                         space=SPACE)).quality
        assert q["mirror_check"] is False and "mirror_degradation" not in q
        assert all("mirror" not in t for t in q["trials"])
        assert "one measurement" in describe_gate(q)


def test_a_fixed_config_is_measured_with_its_mirror(tmp_path, weights):
    state = {"model": {"w": weights["model/w"]}}
    loss = _lucky(weights, 0.5)
    harsh = QuantConfig(bins=4, prune=0.5)
    with Repo.init(tmp_path / "r") as repo:
        repo.config.set("quality.tensor_cap", 10.0)
        with warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("always")
            q = repo.read_commit(repo.commit(state, "fixed", quant=harsh, quality=loss,
                                             epsilon=0.01)).quality
        assert q["gate"] == "metric" and q["degradation"] < 0 and q["mirror_degradation"] > 0.01
        assert q["within_bound"] is False and q["evaluations"] == 3
        msg = [str(w.message) for w in seen if issubclass(w.category, MvcWarning)]
        assert len(msg) == 1 and "mirror" in msg[0]
        repo.config.set("commit.fixed_gate", "refuse")
        with pytest.raises(FixedConfigRefusedError, match="mirror"):
            repo.commit(state, "refused", quant=harsh, quality=loss, epsilon=0.01)
        repo.config.set("quality.mirror", False)
        q = repo.read_commit(repo.commit(state, "no mirror", quant=harsh, quality=loss,
                                         epsilon=0.01)).quality
        assert q["within_bound"] is True and q["mirror_check"] is False and q["evaluations"] == 2
