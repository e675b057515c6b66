"""The search over both quantizer families: variants in the space, the winner with the fewest
measured bits, the neighbourhood staying in the previous family, reuse kept per family, and a
source that quantizes k-means only searched over k-means."""
from __future__ import annotations

import json

import pytest
import torch
import torch.nn.functional as F
from digits_mlp import digits, mlp

from mvc.io import flatten
from mvc.quant import QuantConfig, quantize_state
from mvc.search import SearchSpace, SearchSpaceError, default_policy, find_config
from mvc.search.prepared import Prepared
from mvc.search.space import short, split_variant, variant

pytestmark = pytest.mark.usefixtures("one_torch_thread")

BOTH = SearchSpace(family=("uniform", "kmeans"))


@pytest.fixture(scope="module")
def trained():
    data = digits()
    model = mlp()
    opt = torch.optim.Adam(model.parameters(), 1e-3)
    xtr, ytr, xte, yte = data
    g = torch.Generator().manual_seed(0)
    for _ in range(150):
        i = torch.randint(0, len(ytr), (64,), generator=g)
        loss = F.cross_entropy(model(xtr[i]), ytr[i])
        opt.zero_grad()
        loss.backward()
        opt.step()
    flat = flatten({"model": model.state_dict()}).tensors

    def evaluate(tensors):
        sd = {k[len("model/"):]: v for k, v in tensors.items()}
        with torch.no_grad():
            return float(F.cross_entropy(torch.func.functional_call(model, sd, (xte,)), yte))
    return flat, evaluate


def test_space_variants_and_json():
    assert BOTH.family == ("kmeans", "uniform")  # sorted: k-means first
    assert SearchSpace().family == ("kmeans",)
    assert BOTH.variants(["magnitude"]) == ["magnitude", "uniform:magnitude"]
    assert split_variant("uniform:sensitivity") == ("uniform", "sensitivity")
    assert split_variant("magnitude") == ("kmeans", "magnitude")
    assert variant("kmeans", "sensitivity") == "sensitivity"
    cfg = BOTH.config(("uniform:sensitivity", (2, 0, 0)), False)
    assert cfg.family == "uniform" and cfg.prune_metric == "sensitivity"
    # prune 0 (last prune index): the metric is normalized, the family kept
    assert BOTH.canonical(("uniform:sensitivity", (2, 5, 0)), False) == \
        ("uniform:magnitude", (2, 5, 0))
    assert SearchSpace.from_json(BOTH.to_json()) == BOTH
    assert SearchSpace.from_dict({}).family == ("kmeans",)  # stored spaces without the field
    with pytest.raises(SearchSpaceError):
        SearchSpace(family=("lloyd",))
    assert short(cfg)["family"] == "uniform" and "family" not in short(QuantConfig())


def test_search_picks_the_family_with_fewer_measured_bits(trained):
    flat, evaluate = trained
    per = {}
    for fam in ("kmeans", "uniform"):
        per[fam] = find_config(flat, evaluate=evaluate, epsilon=0.01,
                               space=SearchSpace(family=(fam,)))
        assert per[fam].config is not None and per[fam].config.family == fam
    both = find_config(flat, evaluate=evaluate, epsilon=0.01, space=BOTH)
    want = min(per.values(), key=lambda r: r.quality.bits_per_param)
    assert both.config == want.config
    assert both.quality.bits_per_param == want.quality.bits_per_param
    assert both.quality.degradation <= 0.01
    # trials of both families are in the record; the winner's qmap is its config's
    fams = {t["config"].get("family", "kmeans") for t in both.quality.to_json()["trials"]}
    assert fams == {"kmeans", "uniform"}
    again = quantize_state(flat, both.config, default_policy(), nonfinite="lossless")
    for k, q in again.items():
        assert (q is None) == (both.qmap[k] is None)
        if q is not None:
            assert torch.equal(q.levels, both.qmap[k].levels)
            assert torch.equal(q.centroids, both.qmap[k].centroids)
    json.dumps(both.quality.to_json(), allow_nan=False)


def test_uniform_only_search_is_deterministic_and_honours_epsilon(trained):
    flat, evaluate = trained
    space = SearchSpace(family=("uniform",))
    a = find_config(flat, evaluate=evaluate, epsilon=0.01, space=space)
    b = find_config(flat, evaluate=evaluate, epsilon=0.01, space=space)
    assert a.config == b.config and a.quality.to_json() == b.quality.to_json()
    base = evaluate(flat)
    got = evaluate({k: (a.qmap[k].dequantize() if a.qmap[k] is not None else v)
                    for k, v in flat.items()})
    assert (got - base) / base <= 0.01


def test_neighbourhood_stays_in_the_previous_family(trained):
    flat, evaluate = trained
    first = find_config(flat, evaluate=evaluate, epsilon=0.01, space=SearchSpace(family=("uniform",)))
    steady = find_config(flat, evaluate=evaluate, epsilon=0.01, space=BOTH, previous=first.config)
    rec = steady.quality.to_json()
    assert rec["mode"] == "neighbourhood" and steady.config.family == "uniform"
    assert all(t["config"].get("family") == "uniform" for t in rec["trials"])
    # a previous family the space does not search: a fresh exhaustive search
    km = find_config(flat, evaluate=evaluate, epsilon=0.01, space=SearchSpace(),
                     previous=first.config)
    assert km.quality.to_json()["mode"] == "exhaustive" and km.config.family == "kmeans"


class _KMeansOnly:
    """A trial source without `families` (as a sharded save's): searched over k-means only."""

    def __init__(self, prep: Prepared) -> None:
        self._prep = prep

    def __getattr__(self, name):
        if name == "families":
            raise AttributeError(name)
        return getattr(self._prep, name)

    def quantize(self, name, bins, thr, *, seed, sigma, init, weigh):
        return self._prep.quantize(name, bins, thr, seed=seed, sigma=sigma, init=init,
                                   weigh=weigh)


def test_a_kmeans_only_source_is_searched_over_kmeans(trained):
    from mvc.search import search_trials
    flat, _ = trained
    src = _KMeansOnly(Prepared(flat, {}, default_policy(), BOTH.alpha))
    res = search_trials(src, space=BOTH)
    assert res.config is not None and res.config.family == "kmeans"
    assert all("family" not in t["config"] for t in res.quality.to_json()["trials"])
