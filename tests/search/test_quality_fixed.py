"""Fixed-config commits (`commit.mode = fixed`, `quant=`) are measured by the gates.

The config is the user's choice, so it is not searched; but the tensor cap and, with a
quality function, the gate it selects measure it, the commit records the result, and a
measurement outside its bound warns (`commit.fixed_gate = warn`, the default) or refuses
the commit (`refuse`, exit code 190, nothing stored).
"""
from __future__ import annotations

import warnings

import pytest
import torch

from mvc.cli.commands_history import describe_gate
from mvc.errors import MvcWarning
from mvc.quant import QuantConfig
from mvc.search.plan import FixedConfigRefusedError
from mvc.repo.repository import Repo

HARSH = QuantConfig(bins=4, prune=0.3)
GENTLE = QuantConfig(bins=32, prune=0.0)


@pytest.fixture()
def setup(tmp_path):
    g = torch.Generator().manual_seed(4)
    net = torch.nn.Sequential(torch.nn.Linear(32, 128), torch.nn.ReLU(), torch.nn.Linear(128, 10))
    torch.manual_seed(4)
    for p in net.parameters():
        torch.nn.init.normal_(p, std=0.3)
    with torch.no_grad():
        net[0].weight.pow_(3)                    # heavy tails: 4 bins break the tensor cap
    x = torch.randn(96, 32, generator=g)
    y = net(x).argmax(1)
    state = {"model": {k: v.detach().clone() for k, v in net.state_dict().items()}}

    def per_example(s):
        out = torch.func.functional_call(net, s["model"], (x,))
        return torch.nn.functional.cross_entropy(out, y, reduction="none")
    repo = Repo.init(tmp_path / "r")
    repo.config.set("commit.optimizer", "exact")
    return repo, state, per_example


def _commit(repo, state, **kw):
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        cid = repo.commit(state, "fixed", **kw)
    return cid, [w for w in seen if issubclass(w.category, MvcWarning)]


def test_within_bounds_no_warning_and_recorded(setup):
    repo, state, per_example = setup
    cid, seen = _commit(repo, state, quant=GENTLE, quality=per_example, epsilon=0.05)
    q = repo.read_commit(cid).quality
    assert not seen, [str(w.message) for w in seen]
    assert q["mode"] == "fixed" and q["gate"] == "per-example-ucb"
    assert q["within_cap"] and q["within_bound"] and "outside" not in q
    assert q["ucb"] <= q["epsilon"] == 0.05 and q["tensor_cap"] == 0.5
    assert q["rel_l2_weights"] > 0 and q["metric"] == "fixed-config:per-example-ucb"
    line = describe_gate(q)
    assert line.startswith("fixed config, measured (not chosen) by the per-example-ucb")
    assert "OUTSIDE" not in line


def test_outside_the_cap_warns_and_stores_as_configured(setup):
    repo, state, _ = setup
    cid, seen = _commit(repo, state, quant=HARSH)
    q = repo.read_commit(cid).quality
    assert q["gate"] == "none" and not q["within_cap"] and q["max_distortion"] > 0.5
    assert q["worst_tensor"] == "model/0.weight" and repo.read_commit(cid).quant["bins"] == 4
    (w,) = seen
    assert "model/0.weight" in str(w.message) and "quality.tensor_cap 0.5" in str(w.message)
    assert "OUTSIDE: tensor model/0.weight" in describe_gate(q)
    # the cap is the configured one
    repo.config.set("quality.tensor_cap", 0.99)
    cid, seen = _commit(repo, state, quant=HARSH)
    assert not seen and repo.read_commit(cid).quality["within_cap"]


def test_outside_the_quality_bound_warns(setup):
    repo, state, per_example = setup
    repo.config.set("quality.tensor_cap", 10.0)
    cid, seen = _commit(repo, state, quant=HARSH, quality=per_example, epsilon=0.001)
    q = repo.read_commit(cid).quality
    assert not q["within_bound"] and q["within_cap"] and q["ucb"] > 0.001
    (w,) = seen
    assert "per-example-ucb gate measured it outside its bound" in str(w.message)
    assert q["outside"] and "OUTSIDE: the per-example-ucb gate" in describe_gate(q)


def test_refuse_stores_nothing(setup):
    repo, state, per_example = setup
    first = repo.commit(state, "exact", lossless=True)
    repo.config.set("commit.fixed_gate", "refuse")
    with pytest.raises(FixedConfigRefusedError) as ei:
        repo.commit(state, "harsh", quant=HARSH)
    assert ei.value.exit_code == 190 and "nothing stored" in str(ei.value)
    repo.config.set("quality.tensor_cap", 10.0)
    with pytest.raises(FixedConfigRefusedError):
        repo.commit(state, "harsh", quant=HARSH, quality=per_example, epsilon=0.001)
    assert repo.resolve("HEAD") == first
    # commit.mode = fixed with commit.quant goes through the same rule
    repo.config.set("commit.mode", "fixed")
    repo.config.set("commit.quant", HARSH.to_dict())
    repo.config.set("quality.tensor_cap", 0.5)
    with pytest.raises(FixedConfigRefusedError):
        repo.commit(state, "harsh")
    repo.config.set("commit.quant", GENTLE.to_dict())
    cid = repo.commit(state, "gentle")
    assert repo.read_commit(cid).quality["within_cap"]


def test_fixed_gate_config_values(setup):
    from mvc.repo.config import ConfigError

    repo, _, _ = setup
    assert repo.config.get("commit.fixed_gate") == "warn"
    with pytest.raises(ConfigError):
        repo.config.set("commit.fixed_gate", "ignore")
