"""Background commits in a child process: the same commits as on a thread, errors and warnings
brought back, a dead child survived, and the Tracker's choice of where a commit runs."""
from __future__ import annotations

import os
import signal

import pytest
import torch
from digits_mlp import digits, mlp, train_step

from mvc.integrations import CommitProcessError, Tracker, TrackerError
from mvc.integrations import shared_copy
from mvc.integrations.commit_process import CommitProcess
from mvc.repo.repository import NotARepositoryError, Repo
from mvc.search.space import SearchError
from mvc.store.memory import MemoryStore

pytestmark = [pytest.mark.usefixtures("one_torch_thread"),
              pytest.mark.skipif(not shared_copy.supported(), reason="Linux memfd and fd passing")]


@pytest.fixture(scope="module")
def data():
    return digits()


def _train(model, opt, data, steps, tracker, seed=0):
    g = torch.Generator().manual_seed(seed)
    for _ in range(steps):
        train_step(model, opt, data, g, tracker.after_backward)


def _run(tmp_path, data, name, **kw):
    """Two background commits of the same training run; (repo, ids, tracker)."""
    repo = Repo.init(tmp_path / name)
    torch.manual_seed(0)
    model = mlp()
    opt = torch.optim.Adam(model.parameters(), 1e-3)
    tr = Tracker(repo, model, opt, epsilon=0.05, **kw)
    ids = []
    for k in range(2):
        _train(model, opt, data, 20, tr, seed=k)
        ids.append(tr.commit(f"bg {k}", background=True).result())
    in_process = tr.background_in_process
    tr.close()
    return repo, ids, in_process


def test_a_commit_in_the_child_stores_what_a_thread_stores(tmp_path, data):
    proc_repo, proc_ids, in_process = _run(tmp_path, data, "p")
    thread_repo, thread_ids, on_thread = _run(tmp_path, data, "t", background_process=False)
    assert in_process and not on_thread
    for a, b in zip(proc_ids, thread_ids):
        ca, cb = proc_repo.read_commit(a), thread_repo.read_commit(b)
        assert ca.snapshot == cb.snapshot and ca.quant == cb.quant and ca.quant   # lossy, same bytes
        assert ca.parents == ([proc_ids[0]] if a == proc_ids[1] else [])
    assert proc_repo.head() == proc_ids[1]
    got, want = proc_repo.checkout(proc_ids[1]), thread_repo.checkout(thread_ids[1])
    for k, t in want["model"].items():
        assert torch.equal(got["model"][k], t)


def test_the_childs_exception_comes_back_with_its_type_and_the_child_keeps_serving(tmp_path):
    repo = Repo.init(tmp_path / "r")
    proc = CommitProcess(repo.path)
    try:
        state = {"w": torch.randn(64, 64)}
        shared = proc.copy(state)
        with pytest.raises(SearchError, match="epsilon must be") as info:
            proc.commit(shared, proc.pack(shared, shared.obj, "bad", epsilon=-1.0))
        assert any("background commit process" in n for n in info.value.__notes__)
        proc.release(shared)
        shared = proc.copy(state)
        cid = proc.commit(shared, proc.pack(shared, shared.obj, "ok", lossless=True))
        assert repo.head() == cid
        assert torch.equal(repo.checkout(cid)["w"], state["w"])
        proc.release(shared)
    finally:
        proc.close()
    assert proc.pid is None


def test_a_child_that_dies_is_reported_and_the_next_commit_starts_another(tmp_path):
    repo = Repo.init(tmp_path / "r")
    proc = CommitProcess(repo.path)
    try:
        state = {"w": torch.randn(32)}
        shared = proc.copy(state)
        first = proc.commit(shared, proc.pack(shared, shared.obj, "one", lossless=True))
        proc.release(shared)
        pid = proc.pid
        os.kill(pid, signal.SIGKILL)
        shared = proc.copy(state)
        with pytest.raises(CommitProcessError, match="exit code -9"):
            proc.commit(shared, proc.pack(shared, shared.obj, "two", lossless=True))
        assert repo.head() == first   # nothing half-written
        second = proc.commit(shared, proc.pack(shared, shared.obj, "three", lossless=True))
        assert proc.pid not in (None, pid) and repo.read_commit(second).parents == [first]
        proc.release(shared)
    finally:
        proc.close()


def test_the_childs_warnings_are_raised_here():
    proc = CommitProcess("/nonexistent")
    shared = proc.copy({"w": torch.ones(2)})
    with pytest.warns(UserWarning, match="from the child"):
        assert proc._answer(("done", "abc", [(UserWarning, "from the child"), (None, "x")], True),
                            shared) == "abc"
    assert shared.reusable
    proc.release(shared)


def test_a_copy_the_child_let_go_of_is_reused_and_one_it_kept_is_not(tmp_path):
    proc = CommitProcess(tmp_path)
    shared = proc.copy({"w": torch.ones(1000)})
    ptr = shared.obj["w"].data_ptr()
    shared.reusable = True
    proc.release(shared)
    again = proc.copy({"w": torch.zeros(1000)})
    assert again.obj["w"].data_ptr() == ptr and torch.equal(again.obj["w"], torch.zeros(1000))
    again.reusable = False   # the child still viewed it: written again, a commit would change
    proc.release(again)
    third = proc.copy({"w": torch.ones(1000)})
    assert third.arena is not again.arena
    proc.release(third)
    proc.close()


def test_a_repository_the_child_cannot_open_fails_the_commit_not_the_loop(tmp_path):
    proc = CommitProcess(tmp_path / "no-repo")
    try:
        shared = proc.copy({"w": torch.ones(2)})
        with pytest.raises(NotARepositoryError, match="not an mvc repository"):
            proc.commit(shared, proc.pack(shared, shared.obj, "x", lossless=True))
        proc.release(shared)
    finally:
        proc.close()


def test_the_tracker_commits_on_a_thread_where_a_child_cannot(tmp_path, data):
    model = mlp()
    with_quality = Tracker(Repo.init(tmp_path / "q"), model, quality=lambda m: 0.0)
    assert with_quality._why_no_process() is None   # it evaluates here, called from the child
    in_memory = Repo(tmp_path / "m", store=MemoryStore())
    with pytest.raises(TrackerError, match="not one on disk"):
        Tracker(in_memory, model, background_process=True)
    with pytest.raises(TrackerError, match="True, False or None"):
        Tracker(Repo.init(tmp_path / "q3"), model, background_process="yes")
    # a lossless background commit of a plain model, and what it restores
    repo = Repo.init(tmp_path / "plain")
    tr = Tracker(repo, model)
    cid = tr.commit("lossless", background=True).result()
    assert tr.background_in_process
    tr.close()
    for k, t in model.state_dict().items():
        assert torch.equal(repo.checkout(cid)["model"][k], t)


def test_an_argument_that_cannot_cross_commits_on_the_thread(tmp_path, monkeypatch):
    import pickle

    def refuse(*a, **k):
        raise pickle.PicklingError("a lambda cannot be pickled")

    monkeypatch.setattr(CommitProcess, "pack", staticmethod(refuse))
    model = mlp()
    repo = Repo.init(tmp_path / "auto")
    tr = Tracker(repo, model)
    cid = tr.commit("on the thread", background=True).result()
    assert repo.head() == cid and not tr.background_in_process
    assert tr._process is not None and tr._process.pid is None   # the child never started
    tr.close()
    forced = Tracker(Repo.init(tmp_path / "forced"), model, background_process=True)
    forced.commit("refused", background=True)
    with pytest.raises(TrackerError, match="cannot be sent to a child process"):
        forced.close()   # re-raises the background commit's failure


def test_the_child_commits_to_the_branch_the_training_process_switched_to(tmp_path):
    torch.manual_seed(0)
    model = torch.nn.Linear(16, 16)
    repo = Repo.init(tmp_path / "r")
    tr = Tracker(repo, model, background_process=True)
    on_main = tr.commit("on main", background=True).result()
    repo.switch("exp", create=True)
    with torch.no_grad():
        model.weight.add_(1)
    on_exp = tr.commit("on exp", background=True).result()
    repo.switch("main")
    again = tr.commit("main again", background=True).result()
    tr.close()
    assert tr.background_in_process
    assert repo.resolve("exp") == on_exp and repo.read_commit(on_exp).parents == [on_main]
    assert repo.resolve("main") == again and repo.read_commit(again).parents == [on_main]
    assert torch.equal(repo.checkout(on_exp)["model"]["weight"], model.weight.detach())


def test_metrics_are_floats_at_the_call_and_a_bad_one_fails_it(tmp_path):
    # a GPU loss (a CUDA scalar) would cross to the commit process whole, which cannot load
    # it: metrics are floats before anything crosses, and a bad one is the caller's error now
    from mvc.errors import UsageError

    repo = Repo.init(tmp_path / "r")
    tr = Tracker(repo, mlp(), background_process=True)
    try:
        with pytest.raises(UsageError, match="loss"):
            tr.commit("nan", metrics={"loss": torch.tensor(float("nan"))}, background=True)
        cid = tr.commit("ok", metrics={"loss": torch.tensor(0.5)}, background=True).result()
        assert tr.background_in_process
        assert repo.read_commit(cid).metrics == {"loss": 0.5}
    finally:
        tr.close()


def test_a_tied_models_commit_is_the_same_in_the_foreground_on_a_thread_and_in_the_child(tmp_path):
    def tied() -> torch.nn.Module:
        torch.manual_seed(0)
        m = torch.nn.Sequential(torch.nn.Embedding(50, 16), torch.nn.Linear(16, 50, bias=False))
        m[1].weight = m[0].weight
        return m

    snapshots = {}
    for how in ("foreground", "thread", "process"):
        repo = Repo.init(tmp_path / how)
        tr = Tracker(repo, tied(), background_process=how == "process")
        got = tr.commit("c", background=how != "foreground")
        cid = got if how == "foreground" else got.result()
        assert how != "process" or tr.background_in_process
        snapshots[how] = repo.read_commit(cid).snapshot
        assert [t.name for t in repo.read_snapshot(snapshots[how]).tensors] == ["model/0.weight"]
        tr.close()
    assert len(set(snapshots.values())) == 1, snapshots
