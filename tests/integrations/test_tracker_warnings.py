"""Tracker: a commit that falls back to lossless says so, naming a preceding restore; a
background commit's failure carries which commit it was (issue 19 item 6)."""
from __future__ import annotations

import pytest
import torch

from mvc.errors import MvcWarning
from mvc.integrations.tracker import Tracker
from mvc.repo.repository import Repo


def _setup(tmp_path, quality, epsilon):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(32, 128), torch.nn.ReLU(), torch.nn.Linear(128, 2))
    return Repo.init(tmp_path), model, Tracker(Repo(tmp_path), model, quality=quality, epsilon=epsilon)


def test_lossless_fallback_is_a_warning_naming_the_restore(tmp_path):
    x = torch.randn(64, 32)
    ref = {}

    def strict(m):  # any change of the outputs is a large relative degradation
        with torch.no_grad():
            out = m(x)
        base = ref.setdefault("out", out.clone())
        return 1.0 + 1e6 * float((out - base).abs().max())

    repo, model, tr = _setup(tmp_path, strict, 1e-6)
    with pytest.warns(MvcWarning, match="stored losslessly"):
        first = tr.commit("first")
    assert repo.read_commit(first).quant is None
    tr.restore(first)
    with pytest.warns(MvcWarning, match=r"first since restore\("):
        tr.commit("after restore")


def test_background_failure_says_which_commit(tmp_path):
    def broken(m):
        raise ValueError("eval data missing")

    repo, model, tr = _setup(tmp_path, broken, None)
    tr.commit("bg", background=True, step=7)
    with pytest.raises(ValueError, match="eval data missing") as info:
        tr.wait()
    assert any("background commit 'bg' (step 7)" in n for n in info.value.__notes__)
    assert repo.head() is None


def test_no_warning_when_the_search_succeeds_or_nothing_is_quantizable(tmp_path, recwarn):
    repo, model, tr = _setup(tmp_path, None, 0.05)  # an explicit epsilon opts in to the proxy
    assert repo.read_commit(tr.commit("proxy")).quant is not None
    tiny = torch.nn.Linear(4, 2)
    # epsilon: lossy commits opted in, nothing to quantize (without it, a lossless commit after
    # a lossy HEAD warns that nothing judges lossy commits here: issue 30 item 8)
    Tracker(repo, tiny, epsilon=0.05).commit("tiny")
    assert not [w for w in recwarn if issubclass(w.category, MvcWarning)]


def _weight_error_setup(tmp_path):
    """quality = 1 + the worst relative L2 error of a large weight: 32 bins unpruned
    measures about 0.034 on this model, 64 bins about 0.017."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(32, 128), torch.nn.ReLU(), torch.nn.Linear(128, 2))
    ref = {k: v.detach().clone() for k, v in model.state_dict().items()}

    def quality(m):
        sd = m.state_dict()
        return 1.0 + max(float((sd[k] - ref[k]).norm() / ref[k].norm())
                         for k in ref if ref[k].numel() > 1000)
    return Repo.init(tmp_path), model, quality


def test_a_commit_whose_32_bin_trial_misses_epsilon_gets_64_bins_not_lossless(tmp_path, recwarn):
    # The cause of the "lossless after restore" reports: the finest point of the paper's
    # cube (32 bins, nothing pruned) measured above epsilon, and the next step was lossless.
    repo, model, quality = _weight_error_setup(tmp_path)
    cid = Tracker(repo, model, quality=quality, epsilon=0.02).commit("fits only at 64 bins")
    c = repo.read_commit(cid)
    assert c.quant is not None and c.quant["bins"] == 64 and c.quality["degradation"] <= 0.02
    missed = [t for t in c.quality["trials"]
              if t["config"]["bins"] == 32 and t["config"]["prune"] == 0.0]
    assert missed and all(t["degradation"] > 0.02 for t in missed)
    assert not [w for w in recwarn if issubclass(w.category, MvcWarning)]


def test_the_lossless_warning_names_the_closest_trial(tmp_path):
    repo, model, quality = _weight_error_setup(tmp_path)
    # the default space refines before it gives up: the closest trial is its finest one
    with pytest.warns(MvcWarning, match=r"closest trial, 128 uniform bins / prune 0\.0, "
                                        r"measured \+0\.00"):
        cid = Tracker(repo, model, quality=quality, epsilon=0.005).commit("too strict")
    rec = repo.read_commit(cid).quality
    assert rec["stored"].startswith("lossless") and rec["closest"]["config"]["bins"] == 128
    assert rec["closest"]["degradation"] > 0.005 and rec["refined"] is True


def test_a_restore_that_detaches_head_says_so(tmp_path):
    """Restoring an earlier commit by a revision that names no branch ("main~1") detaches HEAD:
    the commits that follow go on no branch, and a later switch would leave them behind."""
    import warnings

    repo, model, tr = _setup(tmp_path, None, None)
    first = tr.commit("first")
    tr.commit("second")
    with warnings.catch_warnings():
        warnings.simplefilter("error", MvcWarning)
        tr.restore("main")                       # the branch: HEAD stays attached
    with pytest.warns(MvcWarning, match=f"HEAD is detached at {first[:12]}"):
        tr.restore("main~1")
    assert repo.current_branch() is None


def test_a_lossless_tracker_stores_exactly_whatever_the_repository_says(tmp_path):
    """A repository configured lossy (`quality.epsilon`) would make a Tracker's commits lossy
    silently: `lossless=True` keeps them exact."""
    from mvc.integrations.tracker import TrackerError

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 2))
    repo = Repo.init(tmp_path)
    repo.config.set("quality.epsilon", 0.05)
    assert repo.read_commit(Tracker(repo, model).commit("lossy")).quant is not None
    cid = Tracker(repo, model, lossless=True).commit("exact")
    assert repo.read_commit(cid).quant is None
    for k, v in repo.read_state(cid)["model"].items():
        assert torch.equal(v, model.state_dict()[k])
    with pytest.raises(TrackerError, match="lossless must be"):
        Tracker(repo, model, lossless="yes")


def test_a_tracker_takes_a_path_as_the_other_integrations_do(tmp_path):
    """Tracker("runs/exp", ...) failed with an AttributeError deep in its constructor."""
    model = torch.nn.Linear(8, 2)
    tr = Tracker(tmp_path / "runs", model)          # created, as the Lightning / HF ones do
    cid = tr.commit("first")
    assert Repo(tmp_path / "runs").head() == cid
    assert Tracker(str(tmp_path / "runs"), model).repo.head() == cid
