"""Guard rail on compressed optimizer moments (`quality.moment_cap`).

Each compressed Adam moment's error in the quantity Adam uses -- m itself, sqrt(v) for
the second moment -- is measured at commit; a second moment over `quality.moment_cap`
(a first moment worse than zeros) is stored exactly instead, and the commit records the
caps, the worst error per domain and the moments it kept exact.
"""
from __future__ import annotations

import pytest
import torch

from mvc.quant import QuantConfig
from mvc.quant.optimizer import quantize_second_moment
from mvc.repo.config import ConfigError
from mvc.repo.repository import Repo
from mvc.search.measure import DEFAULT_MOMENT_CAP, moment_distortion


def _trained_state():
    torch.manual_seed(2)
    g = torch.Generator().manual_seed(2)
    net = torch.nn.Sequential(torch.nn.Linear(32, 96), torch.nn.ReLU(), torch.nn.Linear(96, 10))
    opt = torch.optim.Adam(net.parameters(), lr=1e-2)
    x, y = torch.randn(256, 32, generator=g), torch.randint(10, (256,), generator=g)
    for _ in range(30):
        loss = torch.nn.functional.cross_entropy(net(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
    return {"model": net.state_dict(), "optimizer": opt.state_dict()}


def _spiky_state():
    """(`_trained_state()` with its first first moment replaced by a Gaussian with a few 100x
    outliers, that moment): two levels cannot follow it, zeros are closer."""
    state = _trained_state()
    g = torch.Generator().manual_seed(5)
    m = state["optimizer"]["state"][0]["exp_avg"]
    spiky = torch.randn(m.shape, generator=g)
    spiky.view(-1)[:30] *= 100
    state["optimizer"]["state"][0]["exp_avg"] = spiky
    return state, spiky


def _repo(path):
    repo = Repo.init(path)
    repo.config.set("commit.mode", "fixed")
    repo.config.set("commit.quant", {"bins": 16})
    return repo


def test_moment_distortion_in_its_domain():
    g = torch.Generator().manual_seed(0)
    v = torch.exp(1.5 * torch.randn(4096, generator=g))   # log-normal, as Adam second moments
    q = quantize_second_moment(v, 4)
    from mvc.quant.optimizer import restore
    vr = restore(q, "log").double()
    want = float((vr.sqrt() - v.double().sqrt()).norm() / v.double().sqrt().norm())
    assert moment_distortion(q, "log", v) == pytest.approx(want, rel=1e-6)  # norms reduce differently
    assert 0 < want < DEFAULT_MOMENT_CAP


def test_commit_records_moment_distortion_and_keeps_over_cap_moments_exact(tmp_path):
    state = _trained_state()
    repo = _repo(tmp_path / "a")
    q = repo.read_commit(repo.commit(state, "default caps")).quality
    assert q["moment_cap"] == {"linear": 1.0, "log": DEFAULT_MOMENT_CAP}
    assert 0 < q["moment_distortion"]["log"] <= DEFAULT_MOMENT_CAP
    assert 0 < q["moment_distortion"]["linear"] <= 1.0 and "moments_exact" not in q

    repo.config.set("quality.moment_cap", 1e-6)
    cid = repo.commit(state, "tight moment cap")
    q = repo.read_commit(cid).quality
    sq = sorted(f"optimizer/state/{i}/exp_avg_sq" for i, p in enumerate(state["optimizer"]["state"])
                if state["optimizer"]["state"][p]["exp_avg_sq"].numel() >= 128)
    assert q["moments_exact"] == sq and q["moment_cap"]["log"] == 1e-6
    restored = repo.read_state(cid)["optimizer"]["state"]
    for name in sq:
        i = int(name.split("/")[2])
        assert torch.equal(restored[i]["exp_avg_sq"], state["optimizer"]["state"][i]["exp_avg_sq"])
    snap = repo.read_snapshot(repo.read_commit(cid).snapshot)
    codecs = {r.name: r.codec for r in snap.tensors}
    assert all(not codecs[n].startswith("q") for n in sq)
    assert any(codecs[n].startswith("q") for n in codecs if n.endswith("/exp_avg"))


def test_moment_cap_config():
    from mvc.repo.config import DEFAULTS

    assert DEFAULTS["quality.moment_cap"] == DEFAULT_MOMENT_CAP


def test_moment_cap_must_be_positive(tmp_path):
    repo = Repo.init(tmp_path)
    for bad in (0, -1, "inf"):
        with pytest.raises(ConfigError):
            repo.config.set("quality.moment_cap", bad)


def test_a_first_moment_worse_than_zeros_is_stored_as_zeros(tmp_path):
    """Two levels cannot follow a Gaussian m with a few 100x outliers: the compressed m is
    further from m than zeros are (relative L2 error ~2), so the commit stores zeros."""
    state, spiky = _spiky_state()
    repo = _repo(tmp_path)
    cid = repo.commit(state, "spiky first moment")
    q = repo.read_commit(cid).quality
    assert q["moments_zeroed"] == ["optimizer/state/0/exp_avg"]
    assert q["moment_distortion"]["linear"] == pytest.approx(1.0)
    restored = repo.read_state(cid)["optimizer"]["state"]
    assert torch.equal(restored[0]["exp_avg"], torch.zeros_like(spiky))
    # the other first moments keep their compressed form
    assert restored[2]["exp_avg"].abs().sum() > 0


@pytest.mark.parametrize("where", ["device_path", pytest.param("cuda", marks=pytest.mark.skipif(
    not torch.cuda.is_available(), reason="needs CUDA"))])
def test_a_device_states_zeroed_first_moment_is_made_on_the_host(where, monkeypatch):
    """A device state's compressed moment's levels go to the host when its pass is done; a
    first moment stored as zeros instead gets its levels there too, not on the device for the
    writer to bring back, and the same record as on the host: its error, exactly m's own norm
    (1.0), is known without a second pass over m."""
    from contextlib import nullcontext

    import mvc.search.plan as plan_mod
    from mvc.quant.backend import device_path
    from mvc.search import Quantization, default_policy, plan_quantization
    from mvc.state import flatten, unflatten

    state, spiky = _spiky_state()
    whole = flatten(state)
    host = dict(whole.tensors)
    how = Quantization("fixed", config=QuantConfig(bins=16), policy=default_policy(),
                       optimizer="compressed")
    name = "optimizer/state/0/exp_avg"
    measured: list[int] = []
    real = plan_mod.moment_distortion

    def spy(q, domain, x):
        measured.append(id(x))
        return real(q, domain, x)

    monkeypatch.setattr(plan_mod, "moment_distortion", spy)
    plans = {}
    for path in ("native", where):
        measured.clear()
        tensors = host if path != "cuda" else {
            n: t.cuda() if isinstance(t, torch.Tensor) else t for n, t in host.items()}
        with device_path() if path == "device_path" else nullcontext():
            plans[path] = plan_quantization(tensors, how,
                                            to_state=lambda t: unflatten(whole.skeleton, t))
        assert len(measured) == len(set(measured))  # each moment measured once
        zeroed = plans[path].quantized[name]
        assert zeroed.levels.device.type == "cpu", path
        record = plans[path].quality
        assert record is not None
        assert record.moments_zeroed == [name], path
        assert record.moment_distortion is not None
        assert record.moment_distortion["linear"] == 1.0, path
        assert torch.equal(zeroed.dequantize(), torch.zeros_like(spiky))
    native, device = (plans[p].quality for p in ("native", where))
    assert native is not None and device is not None
    assert native.to_json() == device.to_json()
