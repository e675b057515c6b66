"""A Tracker's quality callable with background commits in a child process: the search runs in
the child, each evaluation here (on the Tracker's model copy), and the commits are the ones a
thread makes; the quality function's exception fails the commit as itself, and the channel
stays in step for the next commit."""
from __future__ import annotations

import os
import threading

import pytest
import torch
import torch.nn.functional as F
from digits_mlp import digits, mlp, train_step

from mvc.errors import InternalError
from mvc.integrations import Tracker, shared_copy
from mvc.integrations.commit_process import CommitProcess
from mvc.integrations.parent_calls import ParentCall, ParentCallError
from mvc.quality import from_module
from mvc.repo.repository import Repo

pytestmark = [pytest.mark.usefixtures("one_torch_thread"),
              pytest.mark.skipif(not shared_copy.supported(), reason="Linux memfd and fd passing")]


@pytest.fixture(scope="module")
def data():
    return digits()


class EvalLoss:
    """The eval loss on held-out digits, noting the process and thread of each call."""

    def __init__(self, data):
        self.x, self.y = data[2], data[3]
        self.calls: list[tuple[int, str]] = []

    def __call__(self, model: torch.nn.Module) -> float:
        self.calls.append((os.getpid(), threading.current_thread().name))
        with torch.no_grad():
            return float(F.cross_entropy(model(self.x), self.y))


def _run(tmp_path, data, name, quality, **kw):
    """Two background commits of one training run; (repo, ids, in a child?)."""
    repo = Repo.init(tmp_path / name)
    model = mlp()
    opt = torch.optim.Adam(model.parameters(), 1e-3)
    tr = Tracker(repo, model, opt, quality=quality, epsilon=0.05, **kw)
    ids = []
    for k in range(2):
        g = torch.Generator().manual_seed(k)
        for _ in range(20):
            train_step(model, opt, data, g, tr.after_backward)
        ids.append(tr.commit(f"bg {k}", background=True).result())
    in_child = tr.background_in_process
    tr.close()
    return repo, ids, in_child


def test_the_search_runs_in_the_child_and_the_quality_function_here(tmp_path, data):
    here, there = EvalLoss(data), EvalLoss(data)
    proc_repo, proc_ids, in_child = _run(tmp_path, data, "p", here)
    thread_repo, thread_ids, on_thread = _run(tmp_path, data, "t", there, background_process=False)
    assert in_child and not on_thread
    # every evaluation ran in this process, on the worker thread that waits for the commit
    assert here.calls and {pid for pid, _ in here.calls} == {os.getpid()}
    assert all(name.startswith("mvc-tracker") for _, name in here.calls)
    assert len(here.calls) == len(there.calls)
    for a, b in zip(proc_ids, thread_ids):
        ca, cb = proc_repo.read_commit(a), thread_repo.read_commit(b)
        assert ca.quant and ca.quant == cb.quant and ca.snapshot == cb.snapshot   # same bytes
        assert ca.quality == cb.quality   # same judgement, evaluations, metric name
        assert ca.quality["metric"] == "tracker:EvalLoss"
    got, want = proc_repo.checkout(proc_ids[1]), thread_repo.checkout(thread_ids[1])
    for k, t in want["model"].items():
        assert torch.equal(got["model"][k], t)


class QualityBroke(Exception):
    """Not importable in the child: it comes back from there as a ParentCallError."""


def test_the_quality_functions_exception_fails_the_commit_as_itself(tmp_path, data):
    repo = Repo.init(tmp_path / "r")
    model = mlp()
    fail = {"now": True}
    raised = []
    good = EvalLoss(data)

    def quality(m):
        if fail["now"]:
            raised.append(QualityBroke("the eval set is gone"))
            raise raised[-1]
        return good(m)

    quality.__module__ = "<not importable>"
    QualityBroke.__module__ = "<not importable>"
    tr = Tracker(repo, model, quality=quality, epsilon=0.05, background_process=True)
    fut = tr.commit("fails", background=True)
    with pytest.raises(QualityBroke, match="eval set is gone") as info:
        fut.result()
    assert info.value is raised[0]   # this process's own exception, its traceback and all
    assert any("called it here" in n for n in info.value.__notes__)
    with pytest.raises(QualityBroke):
        tr.wait()
    assert repo.head() is None   # nothing was committed
    fail["now"] = False
    cid = tr.commit("works", background=True).result()   # the channel is in step
    assert repo.head() == cid and repo.read_commit(cid).quant and tr.background_in_process
    tr.close()


def test_a_fidelity_gate_judges_in_the_child_and_its_hessians_cross(tmp_path, data):
    model = mlp()
    opt = torch.optim.Adam(model.parameters(), 1e-3)
    g = torch.Generator().manual_seed(0)
    for _ in range(20):
        train_step(model, opt, data, g)
    gate = from_module(model, data[2][:200], metric="kl", threshold=0.01)
    ids = {}
    for where in ("process", "thread"):
        repo = Repo.init(tmp_path / where)
        tr = Tracker(repo, model, opt, quality=gate, background_process=where == "process")
        ids[where] = (repo, tr.commit("gate", background=True).result())
        assert tr.background_in_process == (where == "process")
        tr.close()
    (a_repo, a), (b_repo, b) = ids["process"], ids["thread"]
    ca, cb = a_repo.read_commit(a), b_repo.read_commit(b)
    assert ca.quant and ca.quant == cb.quant and ca.snapshot == cb.snapshot
    assert ca.quality == cb.quality and ca.quality["gate"] == "fidelity"


def test_a_fidelity_gates_outputs_cross_as_host_copies_in_shared_memory():
    # A GPU model's gate outputs are CUDA tensors: held in a dataclass, they were pickled whole
    # (device and all), which the commit process (no CUDA) cannot load. They are copied to the
    # host, into the call's shared memory, as any other value's tensors.
    from mvc.integrations.parent_calls import _portable
    from mvc.search.fidelity import FidelityOutputs

    gate = from_module(torch.nn.Linear(3, 4), torch.randn(5, 3), metric="kl", threshold=0.01)
    outputs = {"logits": torch.randn(5, 4)}
    arena = shared_copy.SharedArena()
    try:
        sent = _portable(FidelityOutputs(outputs, gate), arena.allocate)
        assert arena.sizes, "the outputs were not copied into shared memory"
        assert sent.outputs["logits"] is not outputs["logits"]
        assert torch.equal(sent.outputs["logits"], outputs["logits"])
        assert sent.gate == id(gate) and sent.spec == ("kl", 0.01, gate.confidence)
    finally:
        arena.release()


def test_only_the_kept_part_of_a_candidate_crosses(tmp_path):
    repo = Repo.init(tmp_path / "r")
    proc = CommitProcess(repo.path)
    seen: list[set[str]] = []

    def evaluate(candidate):
        seen.append(set(candidate))
        w = candidate["model"]["w"]
        return float((w - base).pow(2).mean())

    torch.manual_seed(0)
    base = torch.randn(128, 128)
    state = {"model": {"w": base.clone()}, "optimizer": {"m": torch.randn(128, 128)}}
    try:
        shared = proc.copy(state)
        stand_in = ParentCall("evaluate", "mse", keep=("model",))
        cid = proc.commit(shared, proc.pack(shared, shared.obj, "lossy", quality=stand_in,
                                            epsilon=0.05), {"evaluate": evaluate})
        proc.release(shared)
    finally:
        proc.close()
    assert seen and all(keys == {"model"} for keys in seen)
    c = repo.read_commit(cid)
    assert c.quality["metric"] == "mse" and c.quality["evaluations"] == len(seen)


def test_a_value_that_cannot_cross_fails_the_commit_by_name(tmp_path):
    repo = Repo.init(tmp_path / "r")
    proc = CommitProcess(repo.path)
    try:
        shared = proc.copy({"model": {"w": torch.randn(64, 64)}})
        payload = proc.pack(shared, shared.obj, "x", quality=ParentCall("evaluate", "lock"),
                            epsilon=0.05)
        with pytest.raises(ParentCallError, match="returned a lock, which cannot be sent"):
            proc.commit(shared, payload, {"evaluate": lambda c: threading.Lock()})
        proc.release(shared)
        # a function the commit did not send is a bug, named; the child keeps serving
        shared = proc.copy({"model": {"w": torch.randn(64, 64)}})
        with pytest.raises(InternalError, match="did not send"):
            proc.commit(shared, proc.pack(shared, shared.obj, "y",
                                          quality=ParentCall("evaluate"), epsilon=0.05))
        proc.release(shared)
        shared = proc.copy({"w": torch.ones(8)})
        cid = proc.commit(shared, proc.pack(shared, shared.obj, "z", lossless=True))
        proc.release(shared)
        assert repo.head() == cid
    finally:
        proc.close()


def test_a_stand_in_called_outside_a_commit_process_is_a_bug():
    with pytest.raises(InternalError, match="outside a background commit"):
        ParentCall("evaluate")({"model": {}})


def test_a_child_that_dies_during_an_evaluation_fails_that_commit_only(tmp_path, data):
    import signal

    from mvc.integrations import CommitProcessError

    repo = Repo.init(tmp_path / "r")
    model = mlp()
    good = EvalLoss(data)
    kill = {"now": True}

    def quality(m):
        if kill["now"]:
            kill["now"] = False
            os.kill(tr._process.pid, signal.SIGKILL)   # the commit process dies mid-search
        return good(m)

    tr = Tracker(repo, model, quality=quality, epsilon=0.05, background_process=True)
    with pytest.raises(CommitProcessError, match="ended with exit code -9"):
        tr.commit("dies", background=True).result()
    with pytest.raises(CommitProcessError):
        tr.wait()
    assert repo.head() is None
    cid = tr.commit("next", background=True).result()   # a new child
    assert repo.head() == cid and repo.read_commit(cid).quant
    tr.close()


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_model_evaluates_here_while_the_child_commits_its_host_copy(tmp_path, data):
    """The child has no CUDA device: its candidates cross as host tensors, and the evaluation
    loads them into the Tracker's copy of the model on the GPU."""
    repo = Repo.init(tmp_path / "r")
    model = mlp().cuda()
    x, y = data[2].cuda(), data[3].cuda()
    devices = []

    def quality(m):
        devices.append(next(m.parameters()).device.type)
        with torch.no_grad():
            return float(F.cross_entropy(m(x), y))

    tr = Tracker(repo, model, quality=quality, epsilon=0.05, background_process=True)
    cid = tr.commit("cuda", background=True).result()
    tr.close()
    assert tr.background_in_process and devices and set(devices) == {"cuda"}
    c = repo.read_commit(cid)
    assert c.quant and c.quality["metric"].endswith("quality")
    got = repo.read_state(cid, map_location="cuda")
    assert all(t.device.type == "cuda" for t in got["model"].values())
