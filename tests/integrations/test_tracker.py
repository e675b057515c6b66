"""The training-loop Tracker on a real small model (digits MLP, Adam)."""
from __future__ import annotations

from concurrent.futures import Future

import pytest
import torch
import torch.nn.functional as F
from digits_mlp import digits, mlp, train_step

from mvc.integrations import Tracker, TrackerError, clone_to_cpu
from mvc.quant import QuantConfig
from mvc.repo.repository import Repo
from mvc.search import SearchSpace

pytestmark = pytest.mark.usefixtures("one_torch_thread")

EPS = 0.01


@pytest.fixture(scope="module")
def data():
    return digits()


def eval_loss(data):
    _, _, xte, yte = data

    def quality(model):
        return float(F.cross_entropy(model(xte), yte).detach())
    return quality


def search_repo(path) -> Repo:
    repo = Repo.init(path)
    repo.config.set("commit.mode", "search")  # the commit hook (the default is lossless)
    return repo


def make(tmp_path, data, **kw):
    repo = search_repo(tmp_path / "r")
    model = mlp()
    opt = torch.optim.Adam(model.parameters(), 1e-3)
    kw.setdefault("quality", eval_loss(data))
    return repo, model, opt, Tracker(repo, model, opt, **kw)


def run(tracker, model, opt, data, steps, *, background=False, before_commit=None, seed=0):
    g = torch.Generator().manual_seed(seed)
    for _ in range(steps):
        train_step(model, opt, data, g, tracker.after_backward)
        if tracker.should_commit():
            if before_commit:
                before_commit()
            tracker.commit(f"step {tracker.steps}", background=background)


def params(model):
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def test_every_commit_satisfies_epsilon_on_the_restored_checkpoint(tmp_path, data):
    repo, model, opt, tr = make(tmp_path, data, every=40, grad_window=5, epsilon=EPS)
    quality = eval_loss(data)
    baselines = []
    run(tr, model, opt, data, 120, background=False,
        before_commit=lambda: baselines.append(quality(model)))
    run(tr, model, opt, data, 120, background=True, seed=1,
        before_commit=lambda: baselines.append(quality(model)))
    tr.wait()
    assert len(tr.history) == len(baselines) == 6
    fresh = mlp(seed=1)
    for h, base in zip(tr.history, baselines):
        state = repo.read_state(h["commit"])
        fresh.load_state_dict(state["model"])
        with torch.no_grad():
            value = quality(fresh)
        assert (value - base) / base <= EPS + 1e-6, h
        assert h["quality"]["baseline"] == pytest.approx(base, rel=1e-6)
        assert h["config"] is not None  # these checkpoints compress within epsilon
        assert "optimizer" in state and state["optimizer"]["state"][0]["exp_avg"].shape == (128, 64)
    modes = [h["mode"] for h in tr.history]
    assert modes[0] == "exhaustive" and "neighbourhood" in modes[1:]
    steady = [h["evaluations"] for h in tr.history[1:] if h["mode"] == "neighbourhood"]
    assert max(steady) < tr.history[0]["evaluations"]
    assert [c.step for c in repo.log()] == [240, 200, 160, 120, 80, 40]
    assert all(h["blocking_s"] >= 0 for h in tr.history)


def test_live_weights_and_mode_are_restored_exactly(tmp_path, data):
    repo, model, opt, tr = make(tmp_path, data)
    run(tr, model, opt, data, 30)
    model.train()
    before = params(model)
    seen = []

    def quality(m):
        seen.append(m.training)
        m.eval()  # the Tracker puts the mode back
        return eval_loss(data)(m)
    tr.quality = quality
    tr.commit("c")
    assert model.training and seen
    after = params(model)
    assert all(torch.equal(before[k].view(torch.uint8), after[k].view(torch.uint8)) for k in before)


def test_background_failure_surfaces_at_the_next_call(tmp_path, data):
    repo, model, opt, tr = make(tmp_path, data)
    run(tr, model, opt, data, 5)
    boom = {"on": True}

    def quality(m):
        if boom["on"]:
            raise RuntimeError("eval set went missing")
        return eval_loss(data)(m)
    tr.quality = quality
    fut = tr.commit("will fail", background=True)
    assert isinstance(fut, Future)
    with pytest.raises(RuntimeError, match="went missing"):
        fut.result()
    with pytest.raises(RuntimeError, match="went missing"):
        tr.after_backward()
    tr.after_backward()  # raised once, then cleared
    boom["on"] = False
    cid = tr.commit("works", background=True).result()
    tr.wait()
    assert repo.head() == cid and len(repo.log()) == 1
    boom["on"] = True
    tr.commit("fails again", background=True)
    with pytest.raises(RuntimeError):
        tr.wait()
    tr.close()


def test_restore_resumes_training(tmp_path, data):
    repo, model, opt, tr = make(tmp_path, data, every=50, grad_window=5,
                                extra_state=lambda: {"epoch": 3, "note": "digits"})
    run(tr, model, opt, data, 100, background=True)
    tr.wait()
    quality = eval_loss(data)
    model2 = mlp(seed=7)
    opt2 = torch.optim.Adam(model2.parameters(), 1e-3)
    tr2 = Tracker(repo, model2, opt2, quality=quality, every=50, grad_window=5)
    assert tr2.previous is not None  # picks up the last config from HEAD
    extra = tr2.restore("HEAD")
    assert extra == {"epoch": 3, "note": "digits"} and tr2.steps == 100
    assert repo.current_branch() == "main"
    assert opt2.state_dict()["state"][0]["step"] == 100
    with torch.no_grad():
        at_restore = quality(model2)
    run(tr2, model2, opt2, data, 200, seed=3)
    tr2.wait()
    with torch.no_grad():
        assert quality(model2) < at_restore
    assert repo.log()[0].step == 300 and len(repo.log()) == 6


def test_gradient_ema_only_in_the_window(tmp_path, data):
    repo = search_repo(tmp_path / "r")
    lin = torch.nn.Linear(3, 2, bias=False)
    tr = Tracker(repo, lin, every=10, grad_window=3)
    assert [n for n in range(1, 21) if tr.in_window(n)] == [8, 9, 10, 18, 19, 20]
    grads = []
    for step in range(1, 11):
        g = torch.full((2, 3), float(step))
        lin.weight.grad = g
        tr.after_backward()
        if tr.in_window(step):
            grads.append(g)
    ema = grads[0]
    for g in grads[1:]:
        ema = 0.9 * g + 0.1 * ema
    got = tr._take_grads()
    assert set(got) == {"model/weight"} and torch.allclose(got["model/weight"], ema)
    assert tr._take_grads() == {}  # restarts after a commit
    assert tr.should_commit()
    always = Tracker(repo, lin)
    assert all(always.in_window(n) for n in range(1, 5)) and not always.should_commit()


def test_argument_and_state_errors(tmp_path, data):
    repo, model, opt, _ = make(tmp_path, data)
    with pytest.raises(TrackerError):
        Tracker(repo, model, every=0)
    tr = Tracker(repo, model, opt, extra_state=lambda: {"model": 1})
    with pytest.raises(TrackerError) as ei:
        tr.commit("x")
    assert ei.value.exit_code == 84


def test_clone_to_cpu_keeps_ties_and_metadata():
    model = torch.nn.Linear(4, 4)
    sd = model.state_dict()
    state = {"a": sd, "b": [sd["weight"], (1, "x")], "tied": sd["weight"]}
    c = clone_to_cpu(state)
    assert c["tied"] is c["b"][0] is c["a"]["weight"]
    assert c["tied"] is not sd["weight"] and torch.equal(c["tied"], sd["weight"])
    assert c["a"]._metadata == sd._metadata and c["b"][1] == (1, "x")
    sd["weight"].add_(1.0)
    assert not torch.equal(c["tied"], sd["weight"])


class _RecordingRepo:
    """Records what the Tracker passes to Repo.commit, and forwards all of it."""

    def __init__(self, repo):
        self._repo, self.calls = repo, []

    def __getattr__(self, name):
        return getattr(self._repo, name)

    def commit(self, state, message, **kw):
        self.calls.append(kw)
        return self._repo.commit(state, message, **kw)


def test_repo_commit_searches_the_trackers_space_once_per_commit(tmp_path, data, monkeypatch):
    import mvc.search

    searches = []
    real = mvc.search.find_config
    monkeypatch.setattr(mvc.search, "find_config",
                        lambda *a, **kw: searches.append(kw.get("space")) or real(*a, **kw))
    repo = _RecordingRepo(Repo.init(tmp_path / "r"))
    space = SearchSpace(bins=(6, 8, 16), prune=(0.0, 0.1, 0.2), protect=(0.005, 0.01))
    model = mlp()
    opt = torch.optim.Adam(model.parameters(), 1e-3)
    quality = eval_loss(data)
    tr = Tracker(repo, model, opt, quality=quality, every=30, grad_window=5, space=space)
    bases = []
    run(tr, model, opt, data, 60, before_commit=lambda: bases.append(quality(model)))
    modes = [h["mode"] for h in tr.history]
    assert modes[0] == "exhaustive" and modes[1] in ("neighbourhood", "fallback-exhaustive")
    # Repo.commit ran the one search, in the Tracker's space; the Tracker handed down no config.
    assert searches == [space, space]
    assert all(c["space"] is space and "quant" not in c for c in repo.calls)
    for c in repo.log():
        cfg = QuantConfig.from_dict(c.quant)
        assert cfg.bins in space.bins and cfg.prune in space.prune and cfg.protect in space.protect
    assert tr.previous == QuantConfig.from_dict(repo.read_commit(repo.head()).quant)
    assert set(repo.calls[0]["grads"]) == {"model/" + n for n, _ in model.named_parameters()}
    fresh = mlp(seed=1)
    for h, base in zip(tr.history, bases):
        fresh.load_state_dict(repo.read_state(h["commit"])["model"])
        with torch.no_grad():
            assert (quality(fresh) - base) / base <= EPS + 1e-6
        assert h["quality"]["metric"].startswith("tracker:")


class _NewStyleRepo:
    """Records what the Tracker passes to a Repo.commit taking quality= / epsilon=."""

    def __init__(self, repo):
        self._repo, self.calls = repo, []

    def __getattr__(self, name):
        return getattr(self._repo, name)

    def commit(self, state, message, *, step=None, metrics=None, quality=None, epsilon=None,
               grads=None):
        self.calls.append({"quality": quality, "epsilon": epsilon, "grads": grads, "state": state})
        return self._repo.commit(state, message, step=step, metrics=metrics, lossless=True)


def test_passes_quality_and_epsilon_to_repo_commit(tmp_path, data):
    repo = _NewStyleRepo(Repo.init(tmp_path / "r"))
    model = mlp()
    opt = torch.optim.Adam(model.parameters(), 1e-3)
    tr = Tracker(repo, model, opt, quality=eval_loss(data), epsilon=0.02)
    run(tr, model, opt, data, 3)
    tr.commit("new style")
    (call,) = repo.calls
    assert callable(call["quality"]) and call["epsilon"] == 0.02
    assert set(call["grads"]) == {"model/" + n for n, _ in model.named_parameters()}
    # it takes the nested candidate state (and flat tensors alike)
    nested = call["quality"](call["state"])
    flat = call["quality"]({"model/" + k: v for k, v in model.state_dict().items()})
    assert isinstance(nested, float) and nested == flat == eval_loss(data)(model)


def _nice() -> int:
    import os
    import threading

    return os.getpriority(os.PRIO_PROCESS, threading.get_native_id())


@pytest.mark.skipif(not __import__("sys").platform.startswith("linux"),
                    reason="a per-thread nice value is Linux's")
def test_background_commits_run_below_the_training_loop(tmp_path, data):
    """The search's quality function of a background commit runs on the Tracker's worker,
    niced `background_nice` steps below the loop; the loop itself keeps its priority, and a
    foreground commit runs on it as before."""
    base = _nice()
    seen: list[int] = []
    quality = eval_loss(data)

    def spy(model):
        seen.append(_nice())
        return quality(model)

    for nice, expect in ((7, min(19, base + 7)), (0, base)):
        seen.clear()
        repo, model, opt, tr = make(tmp_path / str(nice), data, quality=spy, background_nice=nice)
        run(tr, model, opt, data, 3)
        tr.commit("bg", background=True).result()
        assert seen and set(seen) == {expect}, (nice, seen)
        seen.clear()
        tr.commit("fg")
        assert set(seen) == {base} and _nice() == base
        tr.close()
        repo.close()
    with pytest.raises(TrackerError, match="background_nice"):
        make(tmp_path / "bad", data, background_nice=20)
    with pytest.raises(TrackerError, match="background_nice"):
        make(tmp_path / "bad2", data, background_nice=-1)


def test_a_loop_that_commits_faster_than_its_commits_finish_waits_for_room(tmp_path, data):
    """Each pending background commit holds a copy of the state: one runs, one may wait behind
    it, and a third call blocks until the first is done, however slow the commits are."""
    import threading

    from mvc.integrations import tracker as tracker_mod

    repo, model, opt, tr = make(tmp_path, data, quality=None)
    release = threading.Event()
    started: list[str] = []
    real_job = tr._job

    def slow_job(state, message, *args):
        started.append(message)
        assert release.wait(60)
        return real_job(state, message, *args)

    tr._job = slow_job
    run(tr, model, opt, data, 2)
    first = tr.commit("one", background=True)
    second = tr.commit("two", background=True)
    assert tracker_mod.MAX_QUEUED == 1 and not first.done() and not second.done()
    third: list[object] = []
    caller = threading.Thread(target=lambda: third.append(tr.commit("three", background=True)))
    caller.start()
    caller.join(0.5)
    assert caller.is_alive() and not third   # blocked: two commits pending already
    release.set()
    caller.join(60)
    assert not caller.is_alive() and first.done()
    tr.wait()
    assert [repo.read_commit(h["commit"]).message for h in tr.history] == ["one", "two", "three"]
    assert started == ["one", "two", "three"]
    tr.close()
    repo.close()


@pytest.mark.parametrize("in_process", [False, True], ids=["thread", "child_process"])
def test_a_background_commit_evaluates_on_the_callers_cuda_device_and_streams(
        tmp_path, data, monkeypatch, in_process):
    """The background commit's quality function runs on the Tracker's worker thread, whose
    CUDA device and stream would be device 0 and the default stream: a rank that set its own
    device and moves its batch with `.cuda()` would evaluate on GPU 0. The job runs under the
    CUDA context of the thread that called `commit` (`mvc.native.parallel.callers_cuda`, read
    at the call; stood in for here, as this machine may have no GPU), in both background modes
    (a child process's commit calls its quality function back on that thread)."""
    import sys
    import threading
    from contextlib import contextmanager

    from mvc.integrations import tracker as tracker_mod
    if in_process and not sys.platform.startswith("linux"):
        pytest.skip("background commits in a child process are Linux's")
    local = threading.local()
    captured: list[int] = []

    def callers_cuda():
        captured.append(threading.get_ident())
        caller = captured[-1]

        @contextmanager
        def on_callers():
            local.caller = caller
            try:
                yield
            finally:
                local.caller = None
        return on_callers

    monkeypatch.setattr(tracker_mod, "callers_cuda", callers_cuda)
    seen: list[tuple[int, int | None]] = []
    quality = eval_loss(data)

    def spy(model):
        seen.append((threading.get_ident(), getattr(local, "caller", None)))
        return quality(model)

    repo, model, opt, tr = make(tmp_path, data, quality=spy, background_process=in_process)
    run(tr, model, opt, data, 3)
    tr.commit("bg", background=True).result()
    me = threading.get_ident()
    assert captured == [me]
    assert seen and all(t != me and caller == me for t, caller in seen), seen
    tr.close()
    repo.close()


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_background_quality_runs_on_the_callers_device_and_stream(
        tmp_path, data):  # pragma: no cover - no GPU in CI
    """A CUDA model trained and committed inside a side stream on the last GPU: the background
    commit's quality function sees that device and stream, and its `.cuda()` batch lands there."""
    dev = torch.cuda.device_count() - 1
    xte, yte = data[2], data[3]
    seen: list[tuple[int, int, torch.device]] = []

    def quality(model):
        x = xte.cuda()
        seen.append((torch.cuda.current_device(), torch.cuda.current_stream().cuda_stream, x.device))
        return float(F.cross_entropy(model(x), yte.cuda()).detach())

    repo = search_repo(tmp_path / "r")
    side = torch.cuda.Stream(device=dev)
    with torch.cuda.device(dev), torch.cuda.stream(side):
        model = mlp().cuda()
        opt = torch.optim.Adam(model.parameters(), 1e-3)
        tr = Tracker(repo, model, opt, quality=quality, epsilon=EPS)
        cuda_data = tuple(t.cuda() for t in data)
        g = torch.Generator().manual_seed(0)
        for _ in range(3):
            i = torch.randint(0, len(cuda_data[1]), (64,), generator=g).cuda()
            loss = F.cross_entropy(model(cuda_data[0][i]), cuda_data[1][i])
            opt.zero_grad()
            loss.backward()
            tr.after_backward()
            opt.step()
        tr.commit("bg", background=True).result()
    assert seen and set(seen) == {(dev, side.cuda_stream, torch.device("cuda", dev))}
    tr.close()
    repo.close()
