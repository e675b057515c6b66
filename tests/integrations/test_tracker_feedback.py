"""The Tracker with a module gate (`mvc.quality.from_module`): its layers' input Hessians flow
to the commit, so a space with error feedback uses them, in the foreground and in the
background (on the Tracker's private copy of the model), and the live model is untouched."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from digits_mlp import digits, mlp

from mvc.integrations import Tracker
from mvc.io import flatten
from mvc.quant import QuantConfig, quantize_state
from mvc.quant.feedback import apply_feedback, usable
from mvc.quality import from_module
from mvc.repo.repository import Repo
from mvc.search import SearchSpace, default_policy

pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.mark.parametrize("wrapped", [False, True], ids=["module", "data_parallel"])
@pytest.mark.parametrize("background", [False, True])
def test_tracker_commits_with_error_feedback(tmp_path, background, wrapped):
    """Wrapped (`DataParallel`, evaluated through its module like DDP), the gate's Hessians
    are by the module's names and reach the state's ``module.``-prefixed ones."""
    xtr, ytr, xte, _ = digits()
    model = mlp()
    opt = torch.optim.SGD(model.parameters(), 0.05)
    gate = from_module(model, xte[:300], metric="kl", threshold=0.01)
    repo = Repo.init(tmp_path)
    tracked = torch.nn.DataParallel(model) if wrapped else model
    tracker = Tracker(repo, tracked, opt, quality=gate, space=SearchSpace(feedback=(True,)),
                      every=10**6, grad_window=0)  # no gradients: plain thresholds
    g = torch.Generator().manual_seed(0)
    for _ in range(60):
        i = torch.randint(0, len(ytr), (64,), generator=g)
        loss = F.cross_entropy(model(xtr[i]), ytr[i])
        opt.zero_grad()
        loss.backward()
        tracker.after_backward()
        opt.step()
    live = {k: v.clone() for k, v in tracked.state_dict().items()}
    model.train()
    got = tracker.commit("fb", background=background)
    tracker.wait()
    cid = got.result() if background else got
    c = repo.read_commit(cid)
    assert c.quant["feedback"] is True
    # in the background, the search ran in a child process and the Hessians crossed back from here
    assert tracker.background_in_process == background
    assert model.training and all(torch.equal(v, live[k]) for k, v in tracked.state_dict().items())
    # the stored levels are the config's plus GPTQ on the committed weights' Hessians
    flat = flatten({"model": live}).tensors
    cfg = QuantConfig.from_dict(c.quant)
    prefix = "module." if wrapped else ""
    hessians = {prefix + k: h for k, h in gate.hessians_of(model).items()}
    want = apply_feedback(quantize_state(flat, cfg, default_policy(), nonfinite="lossless"),
                          flat, usable(hessians, flat))
    assert usable(hessians, flat)   # the Hessians reach the state's names
    restored = flatten(repo.read_state(cid)).tensors
    for n, q in want.items():
        if q is not None:
            assert torch.equal(restored[n], q.dequantize()), n
    repo.close()
