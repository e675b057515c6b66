"""Error feedback in a repository: a searched commit with a module gate and a fixed-config
commit with `hessians=` restore exactly what their levels say (the levels are those of the
config plus GPTQ on the given Hessians), the next commit is a delta that restores exactly,
the config is stored and shown with "error feedback", and a fixed config asking for feedback
without Hessians warns and records it without."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from cli_helpers import run
from digits_mlp import digits, mlp
from lossy_history import assert_bits

from mvc.errors import MvcWarning
from mvc.io import flatten
from mvc.quant import QuantConfig, quantize_state
from mvc.quant.feedback import apply_feedback, usable
from mvc.quality import from_module
from mvc.repo.repository import Repo
from mvc.search import SearchSpace, default_policy

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def _train(model, steps, seed=0):
    xtr, ytr, _, _ = digits()
    opt = torch.optim.SGD(model.parameters(), 0.05)
    g = torch.Generator().manual_seed(seed)
    for _ in range(steps):
        i = torch.randint(0, len(ytr), (64,), generator=g)
        loss = F.cross_entropy(model(xtr[i]), ytr[i])
        opt.zero_grad()
        loss.backward()
        opt.step()


def _expected(state, config, hessians, init=None):
    flat = flatten(state).tensors
    q = quantize_state(flat, config, default_policy(), nonfinite="lossless", init=init)
    q = apply_feedback(q, flat, usable(hessians, flat))
    return {k: (q[k].dequantize() if q[k] is not None else v) for k, v in flat.items()}, q


def _restored(repo, cid):
    return flatten(repo.read_state(cid)).tensors


def test_searched_commit_with_module_gate_restores_its_levels(tmp_path):
    _, _, xte, _ = digits()
    model = mlp()
    _train(model, 100)
    gate = from_module(model, xte[:300], metric="kl", threshold=0.01)
    with Repo.init(tmp_path) as repo:
        state = {"model": model.state_dict()}
        cid = repo.commit(state, "fb", quality=gate, space=SearchSpace(feedback=(True,)))
        c = repo.read_commit(cid)
        assert c.quant["feedback"] is True
        assert c.quality["gate"] == "fidelity"
        cfg = QuantConfig.from_dict(c.quant)
        want, _ = _expected(state, cfg, gate.hessians_of(flatten(state).tensors))
        got = _restored(repo, cid)
        for k, v in want.items():
            assert_bits(got[k], v, k)
    code, out, _ = run(tmp_path, "show", cid[:12])
    assert code == 0 and "error feedback" in out
    code, out, _ = run(tmp_path, "log")
    assert code == 0 and "error feedback" in out


def test_fixed_config_feedback_history_with_deltas(tmp_path):
    _, _, xte, _ = digits()
    model = mlp()
    cfg = QuantConfig(bins=16, protect=0.005, feedback=True)
    gate = from_module(model, xte[:300])
    with Repo.init(tmp_path) as repo:
        repo.config.set("commit.chain_budget", 0)
        ids, wants, prev = [], [], None
        for t in range(3):
            _train(model, 20, seed=t)
            state = {"model": {k: v.clone() for k, v in model.state_dict().items()}}
            hess = gate.hessians_of(state)
            ids.append(repo.commit(state, f"step {t}", quant=cfg, hessians=hess))
            init = {k: q.centroids for k, q in (prev or {}).items() if q is not None}
            want, prev = _expected(state, cfg, hess, init)
            wants.append(want)
        c = repo.read_commit(ids[-1])
        assert QuantConfig.from_dict(c.quant) == cfg
        recs = {r.name: r for r in repo.read_snapshot(c.snapshot).tensors}
        assert recs["model/0.weight"].codec == "qdelta/1"
    with Repo(tmp_path) as fresh:
        for cid, want in zip(ids, wants):
            got = _restored(fresh, cid)
            for k, v in want.items():
                assert_bits(got[k], v, f"{cid[:8]} {k}")


def test_fixed_config_feedback_without_hessians_warns(tmp_path):
    model = mlp()
    with Repo.init(tmp_path) as repo:
        with pytest.warns(MvcWarning, match="error feedback"):
            cid = repo.commit({"model": model.state_dict()}, "no data",
                              quant=QuantConfig(bins=16, feedback=True))
        assert "feedback" not in repo.read_commit(cid).quant
