"""The commit hook: search by default, quality hooks, recorded measurements."""
from __future__ import annotations

import torch
from checkpoints import small_mlp_state

from mvc.repo.repository import Repo
from mvc.search.quality import PROXY_EPSILON


def test_default_commit_without_quality_is_lossless(tmp_path):
    """Nothing judges a lossy commit without a quality function: it is stored exactly (issue 15
    item 5, docs/quality.md); an explicit epsilon opts in to the proxy."""
    with Repo.init(tmp_path / "r") as repo:
        c = repo.read_commit(repo.commit(small_mlp_state(), "default"))
        assert c.quant is None and c.quality is None
        got = repo.read_state(c.id)
        assert torch.equal(got["model"]["fc1.weight"], small_mlp_state()["model"]["fc1.weight"])


def test_an_explicit_epsilon_searches_with_the_proxy(tmp_path):
    with Repo.init(tmp_path / "r") as repo:
        cid = repo.commit(small_mlp_state(), "proxy", epsilon=PROXY_EPSILON)
        c = repo.read_commit(cid)
        assert c.quant is not None and c.quality["metric"].startswith("proxy")
        assert c.quality["value"] <= c.quality["epsilon"]
        assert c.quality["mode"] == "exhaustive"
        # the next commit starts from the previous config (neighbourhood search)
        c2 = repo.read_commit(repo.commit(small_mlp_state(1), "second", epsilon=PROXY_EPSILON))
        assert c2.quality["mode"] in ("neighbourhood", "fallback-exhaustive")
        # the biases stay exact, the quantized weights restore within the proxy bound
        got = repo.read_state(cid)
        assert torch.equal(got["model"]["fc1.bias"], torch.zeros(256))


def test_quality_function_bounds_every_commit(tmp_path):
    x = torch.randn(64, 128, generator=torch.Generator().manual_seed(3))

    def loss_of(state) -> float:
        m = state["model"]
        h = torch.relu(x @ m["fc1.weight"].T + m["fc1.bias"])
        return float((h @ m["fc2.weight"].T).square().mean()) + 1.0

    with Repo.init(tmp_path / "r") as repo:
        for seed in range(3):
            s = small_mlp_state(seed)
            cid = repo.commit(s, f"c{seed}", quality=loss_of, epsilon=0.01)
            rec = repo.read_commit(cid).quality
            baseline = loss_of(s)
            restored = loss_of(repo.read_state(cid))
            assert abs(rec["baseline"] - baseline) < 1e-9
            assert (restored - baseline) / abs(baseline) <= 0.01 + 1e-9


def test_cli_quality_hook_from_config(tmp_path, monkeypatch):
    from cli_helpers import run

    (tmp_path / "evalhook.py").write_text(
        "def evaluate(state):\n"
        "    w = state['model']['fc1.weight']\n"
        "    return float(w.double().square().sum()) + 10.0\n")
    assert run(tmp_path, "init")[0] == 0
    assert run(tmp_path, "config", "quality.hook", "evalhook:evaluate")[0] == 0
    torch.save(small_mlp_state(), tmp_path / "c.pt")
    code, _, err = run(tmp_path, "commit", "-m", "hooked", "c.pt")
    assert code == 0, err
    with Repo(tmp_path) as repo:
        q = repo.read_commit(repo.head()).quality
        assert "evaluate" in q["metric"] and q["degradation"] <= 0.01
    # A hook that cannot be imported is refused when it is set, and the setting is kept
    code, _, err = run(tmp_path, "config", "quality.hook", "nosuchmodule:f")
    assert code == 28 and "nosuchmodule" in err and "Traceback" not in err
    assert run(tmp_path, "config", "quality.hook", "evalhook:nosuchfn")[0] == 28
    assert run(tmp_path, "config", "quality.hook", "no-colon")[0] == 28
    assert run(tmp_path, "config", "quality.hook")[1].strip() == "evalhook:evaluate"
    # ...and still at commit time, for one that stopped importing after it was set
    with Repo(tmp_path) as repo:
        repo.config.set("quality.hook", "nosuchmodule:f")
    code, _, err = run(tmp_path, "commit", "-m", "bad hook", "c.pt")
    assert code == 28 and "nosuchmodule" in err
