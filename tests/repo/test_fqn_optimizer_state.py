"""Optimizer state keyed by parameter name (``get_optimizer_state_dict``'s form, what DCP saves:
``optim/state/<fqn>/exp_avg``) is recognised as index-keyed state is: a one-process commit
compresses its moments (not as weights), the weight search leaves them out, joint pruning finds
each moment's weight by name, and ``weights_only`` drops it."""
from __future__ import annotations

import torch
from torch import nn

from mvc.quant.optimizer import (is_state_name, moment_domain, parse_moment_name,
                                 weights_by_name)
from mvc.repo.repository import Repo
from mvc.state import flatten


def _fqn_state() -> dict:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 32))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    for _ in range(3):
        loss = model(torch.randn(16, 64)).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
    names = [n for n, _ in model.named_parameters()]
    sd = opt.state_dict()
    # get_optimizer_state_dict's layout: state keyed by the parameter's name
    optim = {"state": {names[i]: {k: (v.clone() if isinstance(v, torch.Tensor) else v)
                                  for k, v in st.items()} for i, st in sd["state"].items()},
             "param_groups": [dict(g, params=[names[i] for i in g["params"]])
                              for g in sd["param_groups"]]}
    return {"model": {k: v.clone() for k, v in model.state_dict().items()}, "optim": optim}


def test_names():
    assert parse_moment_name("optim/state/0.weight/exp_avg") == ("optim/", "0.weight", "exp_avg")
    assert parse_moment_name("optimizer/state/3/exp_avg_sq") == ("optimizer/", 3, "exp_avg_sq")
    assert parse_moment_name("optim/state/0.weight/step") is None
    assert is_state_name("optim/state/0.weight/step") and is_state_name("opt/state/2/foo")
    assert not is_state_name("model/0.weight")
    assert moment_domain("optim/state/0.weight/exp_avg_sq") == "log"
    assert weights_by_name(["model/0.weight", "optim/state/0.weight/exp_avg", "a/x", "b/x"]) == \
        {"0.weight": "model/0.weight"}


def test_a_commit_compresses_moments_keyed_by_parameter_name(tmp_path):
    state = _fqn_state()
    with Repo.init(tmp_path / "r") as repo:
        repo.config.set("commit.mode", "fixed")
        repo.config.set("commit.quant", {"bins": 16, "prune": 0.1})
        cid = repo.commit(state, "fqn-keyed optimizer state")
        recs = {r.name: r for r in repo.read_snapshot(repo.read_commit(cid).snapshot).tensors}
        restored = repo.read_state(cid)
        weights_only = repo.read_state(cid, weights_only=True)
    m, v = recs["optim/state/0.weight/exp_avg"], recs["optim/state/0.weight/exp_avg_sq"]
    assert m.codec.startswith("q") and m.meta.get("moment")          # a first moment, bounded
    assert v.codec.startswith("q") and v.meta.get("domain") == "log"  # a second moment
    assert m.meta.get("domain", "linear") == "linear"
    assert not recs["optim/state/0.weight/step"].codec.startswith("q")
    # restored within the first-moment bound, signs kept where not pruned
    mr = restored["optim"]["state"]["0.weight"]["exp_avg"]
    vr = restored["optim"]["state"]["0.weight"]["exp_avg_sq"]
    bound = m.meta["moment"]["ratio_bound"]
    assert bool((mr.abs() <= bound * vr.clamp_min(0).sqrt() * (1 + 1e-6) + 1e-30).all())
    assert "optim" not in weights_only or not any(
        is_state_name(n) for n in flatten(weights_only).tensors)


def test_joint_pruning_finds_the_weight_by_name(tmp_path):
    state = _fqn_state()
    with Repo.init(tmp_path / "r") as repo:
        repo.config.set("commit.mode", "fixed")
        repo.config.set("commit.quant", {"bins": 16, "prune": 0.5})
        cid = repo.commit(state, "c")
        restored = repo.read_state(cid)
    w = restored["model"]["0.weight"]
    m = restored["optim"]["state"]["0.weight"]["exp_avg"]
    # where the weight was pruned (exactly 0), its first moment is pruned too
    assert bool((m[w == 0] == 0).all()) and bool((w == 0).any())
