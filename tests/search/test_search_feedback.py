"""Error feedback as a search dimension: QuantConfig.feedback and SearchSpace.feedback round
trips (stored configs without them unchanged), trials with feedback measured from their
re-assigned levels, a search given Hessians choosing it, and the module gate
(`mvc.quality.from_module`) that gives them."""
from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from digits_mlp import digits, mlp

import mvc
import mvc.quality
from mvc.io import flatten
from mvc.quant import QuantConfig, quantize_state
from mvc.quant.errors import QuantConfigError
from mvc.quant.error import cached_error_sums, relative_error
from mvc.quant.feedback import apply_feedback, collect_hessians, feedback_levels, usable
from mvc.quality import FidelityError, from_module
from mvc.search import SearchSpace, SearchSpaceError, default_policy, find_config
from mvc.search.prepared import Prepared
from mvc.search.space import quantizer, short, split_quantizer, split_variant

pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def trained():
    xtr, ytr, xte, yte = digits()
    model = mlp()
    opt = torch.optim.Adam(model.parameters(), 1e-3)
    g = torch.Generator().manual_seed(0)
    for _ in range(150):
        i = torch.randint(0, len(ytr), (64,), generator=g)
        loss = F.cross_entropy(model(xtr[i]), ytr[i])
        opt.zero_grad()
        loss.backward()
        opt.step()
    flat = flatten({"model": model.state_dict()}).tensors
    gate = from_module(model, [xte[:200], xte[200:]], metric="kl", threshold=0.01)
    return model, flat, gate, xte


def test_config_round_trip_with_and_without_feedback():
    plain = QuantConfig(bins=8, family="uniform")
    assert "feedback" not in plain.to_dict()  # stored as before error feedback existed
    assert QuantConfig.from_dict(plain.to_dict()).feedback is False
    fb = QuantConfig(bins=8, feedback=True)
    assert fb.to_dict()["feedback"] is True and QuantConfig.from_dict(fb.to_dict()) == fb
    with pytest.raises(QuantConfigError):
        QuantConfig(feedback=1)  # type: ignore[arg-type]
    assert short(fb)["feedback"] is True and "feedback" not in short(plain)


def test_space_feedback_axis():
    assert SearchSpace().feedback == (False,)
    assert SearchSpace.from_dict({}).feedback == (False,)  # stored spaces without the field
    both = SearchSpace(family=("uniform", "kmeans"), feedback=(True, False))
    assert both.feedback == (False, True)
    assert SearchSpace.from_json(both.to_json()) == both
    assert both.variants(["magnitude"]) == ["magnitude", "uniform:magnitude",
                                            "kmeans+feedback:magnitude",
                                            "uniform+feedback:magnitude"]
    assert split_quantizer(split_variant("uniform+feedback:sensitivity")[0]) == ("uniform", True)
    assert quantizer("kmeans", False) == "kmeans"
    cfg = both.config(("uniform+feedback:sensitivity", (2, 0, 0)), False)
    assert cfg.family == "uniform" and cfg.feedback and cfg.prune_metric == "sensitivity"
    assert both.canonical(("kmeans+feedback:sensitivity", (2, 5, 0)), False) == \
        ("kmeans+feedback:magnitude", (2, 5, 0))
    for bad in ((), (1,), (True, True), "yes"):
        with pytest.raises(SearchSpaceError):
            SearchSpace(feedback=bad)  # type: ignore[arg-type]


def test_feedback_trial_is_measured_from_its_reassigned_levels(trained):
    _, flat, gate, _ = trained
    hess = gate.hessians_of(flat)
    prep = Prepared(flat, {}, default_policy(), 0.01, hess)
    # the searched 2-D weights (the 10-way head is too small to quantize)
    assert set(prep.hessians) == {"model/0.weight", "model/2.weight"}
    name = "model/0.weight"
    thr = prep.tensor_thresholds(name, prep.thresholds(QuantConfig(bins=8), "linear"))
    plain = prep.quantize(name, 8, thr, seed=0, sigma=0.2, init=None, weigh=False)[name]
    fb = prep.quantize(name, 8, thr, seed=0, sigma=0.2, init=None, weigh=False,
                       feedback=True)[name]
    w = flat[name]
    assert torch.equal(fb.centroids, plain.centroids) and not torch.equal(fb.levels, plain.levels)
    assert torch.equal(fb.levels, feedback_levels(plain, w, prep.hessians[name]).levels)
    # its sums (the tensor cap, the proxy) are its own levels', not the plain ones'
    exact = float(torch.linalg.vector_norm(fb.dequantize() - w) / torch.linalg.vector_norm(w))
    assert math.isclose(relative_error(cached_error_sums(fb, w)), exact, rel_tol=1e-5)
    m = prep.measure({name: fb}, {(name, 8, thr): {name: fb}}, proxy=False)
    assert math.isclose(m.distortion[name], exact, rel_tol=1e-5)
    m_plain = prep.measure({name: plain}, {(name, 8, thr): {name: plain}}, proxy=False)
    assert m.bits != m_plain.bits  # the re-assigned levels' histogram


def test_search_with_hessians_can_choose_feedback(trained):
    _, flat, gate, _ = trained
    hess = gate.hessians_of(flat)
    per = {fb: find_config(flat, evaluate=gate_eval(gate), space=SearchSpace(feedback=(fb,)),
                           hessians=hess) for fb in (False, True)}
    assert per[True].config.feedback and not per[False].config.feedback
    both = find_config(flat, evaluate=gate_eval(gate), space=SearchSpace(feedback=(False, True)),
                       hessians=hess)
    want = min(per.values(), key=lambda r: r.quality.bits_per_param)
    assert both.config == want.config
    assert {bool(t["config"].get("feedback")) for t in both.quality.to_json()["trials"]} == \
        {False, True}
    if both.config.feedback:  # the winner's qmap is what its config and the Hessians give
        again = quantize_state(flat, both.config, default_policy(), nonfinite="lossless")
        again = apply_feedback(again, flat, usable(hess, flat))
        for n, q in both.qmap.items():
            if q is not None:
                assert torch.equal(q.levels, again[n].levels), n
    # without Hessians the feedback half of the space is not searched
    none = find_config(flat, evaluate=gate_eval(gate), space=SearchSpace(feedback=(False, True)))
    assert not any(t["config"].get("feedback") for t in none.quality.to_json()["trials"])


def gate_eval(gate):
    return lambda tensors: gate(tensors)


def test_module_gate_outputs_and_hessians(trained):
    model, flat, gate, xte = trained
    assert mvc.quality.fidelity.from_module is from_module
    before = {k: v.clone() for k, v in model.state_dict().items()}
    with torch.no_grad():
        want = torch.cat([model(xte[:200]), model(xte[200:])])
    assert torch.equal(gate(model).outputs, want)
    assert torch.equal(gate({"model": dict(model.state_dict())}).outputs, want)
    zeroed = dict(flat, **{"model/4.weight": torch.zeros_like(flat["model/4.weight"])})
    assert not torch.equal(gate(zeroed).outputs, want)
    assert all(torch.equal(v, before[k]) for k, v in model.state_dict().items())  # untouched
    h = gate.hessians_of(flat)
    ref = collect_hessians(model, [xte[:200], xte[200:]])
    assert set(h) == set(ref) and all(torch.allclose(h[k], ref[k]) for k in ref)
    assert gate.hessians() is gate.hessians()  # computed once while the weights stay
    with pytest.raises(FidelityError):
        gate({"other": torch.zeros(3)})
    with pytest.raises(FidelityError):
        from_module(lambda x: x, xte)  # type: ignore[arg-type]


@pytest.mark.parametrize("threshold", [0.01, 1e-7])
def test_default_space_collects_hessians_only_when_it_refines(trained, tmp_path, monkeypatch,
                                                              threshold):
    """The default space searches no error feedback, so a module gate's Hessians are not
    collected -- unless every point is refused and the refined space (which searches it)
    takes over; then once."""
    model, _, _, xte = trained
    gate = from_module(model, [xte[:200], xte[200:]], metric="kl", threshold=threshold)
    calls = []
    real = type(gate).hessians_of
    monkeypatch.setattr(type(gate), "hessians_of",
                        lambda self, subject: calls.append(1) or real(self, subject))
    repo = mvc.Repo.init(tmp_path / "r")
    cid = repo.commit({"model": model.state_dict()}, "gated", quality=gate)
    rec = repo.read_commit(cid).quality
    fb = [t for t in rec["trials"] if t["config"].get("feedback")]
    if threshold == 0.01:   # the base space serves: nothing refined, nothing collected
        assert repo.read_commit(cid).quant is not None and "refined" not in rec
        assert calls == [] and fb == []
    else:                   # refused everywhere: refined, feedback tried, then lossless
        assert rec["refined"] is True and rec["stored"].startswith("lossless")
        assert calls == [1] and fb
