"""`dcp.async_save` through `MvcStorageWriter` (issue 28, item 2): real gloo ranks, world size
1 and 2, each saving on a checkpoint group while its training loop goes on
(tests/helpers/dcp_async_worker.py says what the ranks do); one-process tests of the future's
typed errors and of the writer's pickling (DCP's process-based executor ships it)."""
from __future__ import annotations

import pickle
from pathlib import Path

import pytest
import torch
from rank_procs import run_ranks as start_ranks, with_helpers_path

from mvc.dcp import DcpPublishedError, MvcStorageWriter, async_save
from mvc.dcp.asyncsave import typed_error
from mvc.repo.repository import NotARepositoryError, Repo
from mvc.repo.transaction import NothingToCommitError


def run_ranks(root: Path, world: int) -> list[dict]:
    # The ranks end with os._exit (a peer may be gone): the temporary folders DCP's
    # process-based executor makes through multiprocessing (pymp-*) go under the test's folder.
    (root / "tmp").mkdir(exist_ok=True)
    return start_ranks("dcp_async_worker.py", [str(world), str(root)],
                     lambda r: root / f"rank{r}.pt", world=world,
                     env={"TMPDIR": str(root / "tmp"), **with_helpers_path()})


@pytest.fixture(scope="module", params=[1, 2], ids=["world1", "world2"])
def ranks(request, tmp_path_factory) -> tuple[Path, list[dict]]:
    root = tmp_path_factory.mktemp(f"dcp_async{request.param}")
    Repo.init(root / "repo").close()
    return root, run_ranks(root, request.param)


def flat(state: dict) -> dict:
    from torch.distributed.checkpoint._nested_dict import flatten_state_dict
    return flatten_state_dict(state)[0]


def test_async_lossless_restores_the_staged_state_bit_exactly(ranks):
    root, reports = ranks
    for r in reports:
        assert r["same_keys"] and r["mismatch"] == []
        assert r["c1"] == reports[0]["c1"] is not None    # every rank's future: the commit
    with Repo(root / "repo") as repo:
        assert repo.read_commit(reports[0]["c1"]).message == "async lossless"


def test_async_lossy_restores_the_checkout_within_the_recorded_quality(ranks):
    root, reports = ranks
    r0 = reports[0]
    assert r0["config2"] is not None and all(r["config2"] == r0["config2"] for r in reports)
    q = r0["quality2"]
    assert q["gate"] == "proxy" and q["value"] <= 0.05 and q["sharded"] is True
    with Repo(root / "repo") as repo:
        assert repo.read_commit(r0["c2"]).message == "async lossy"
        out = repo.read_state(r0["c2"])
    loaded, checkout = flat(r0["loaded2"]), flat(out)
    assert sorted(loaded) == sorted(checkout)
    for k, v in loaded.items():        # dcp.load == checkout, bit for bit
        assert v == checkout[k] if not isinstance(v, torch.Tensor) else torch.equal(v, checkout[k]), k
    quantized = 0
    for k, v in flat(r0["saved2"]["model"]).items():
        got = flat(out["model"])[k]
        err = float(torch.linalg.vector_norm(got - v) / torch.linalg.vector_norm(v))
        assert err <= q["tensor_cap"], k
        quantized += err > 0
    assert quantized >= 2


def test_errors_surface_on_the_future_typed_on_every_rank(ranks):
    root, reports = ranks
    for r in reports:
        assert r["empty_first"].startswith("ok ")
        assert r["empty"] == "NothingToCommitError"
        assert r["bad_repo"] == "NotARepositoryError"
        assert r["failing"] == "DcpValueError"
    with Repo(root / "repo") as repo:   # nothing landed between "again" and the next save
        assert repo.read_commit(reports[0]["c4"][3:]).parents == [reports[0]["empty_first"][3:]]
        assert repo.fsck().ok


def test_process_based_executor_ships_the_writer(ranks):
    root, reports = ranks
    got = reports[0]["c4"]
    assert got.startswith("ok ") and all(r["c4"] == got for r in reports)
    with Repo(root / "repo") as repo:
        cid = got[3:]
        assert repo.read_commit(cid).message == "process"
        out = repo.read_state(cid)
    for k, v in flat(reports[0]["saved4"]).items():
        if isinstance(v, torch.Tensor):
            assert torch.equal(v, flat(out)[k]), k


def _state() -> dict:
    torch.manual_seed(0)
    return {"model": {"w": torch.randn(64, 64), "b": torch.randn(64)}}


def test_one_process_future_gives_the_commit_and_typed_errors(tmp_path):
    Repo.init(tmp_path / "repo").close()
    s = _state()
    cid = async_save(s, MvcStorageWriter(tmp_path / "repo", message="a", lossless=True)).result()
    with Repo(tmp_path / "repo") as repo:
        assert repo.head() == cid
        assert torch.equal(repo.read_state(cid)["model"]["w"], s["model"]["w"])
    again = async_save(s, MvcStorageWriter(tmp_path / "repo", message="b", lossless=True,
                                           allow_empty=False))
    with pytest.raises(NothingToCommitError):
        again.result()
    with pytest.raises(NotARepositoryError):
        async_save(s, MvcStorageWriter(tmp_path / "none", message="b")).result()


def test_an_asynchronous_stager_has_copied_the_state_when_async_save_returns(tmp_path):
    # DCP's asynchronous staging (a GPU's zero-overhead path: DefaultStager with
    # use_async_staging) returns before the copy is done; the training loop's next step must not
    # reach the checkpoint. This stager copies on a thread, late on purpose.
    import copy
    import threading
    import time
    from concurrent.futures import Future

    from torch.distributed.checkpoint.staging import AsyncStager

    class LateStager(AsyncStager):
        def stage(self, state_dict):
            staged: Future = Future()

            def copy_late() -> None:
                time.sleep(0.3)
                staged.set_result(copy.deepcopy(state_dict))
            threading.Thread(target=copy_late, daemon=True).start()
            return staged

    Repo.init(tmp_path / "repo").close()
    state = {"w": torch.zeros(1000)}
    fut = async_save(state, MvcStorageWriter(tmp_path / "repo", message="m", lossless=True),
                     async_stager=LateStager(), no_dist=True)
    state["w"].add_(1.0)   # the optimizer step right after async_save returned
    cid = fut.result()
    with Repo(tmp_path / "repo") as repo:
        assert torch.equal(repo.read_state(cid)["w"], torch.zeros(1000))


def test_async_save_waits_for_the_callers_streams_before_dcp_stages(tmp_path, monkeypatch):
    """DCP's asynchronous stager copies on a stream and thread of its own: `async_save` waits
    for the caller's current stream on each device with a CUDA context first, and on no other
    device (that wait would start a context there). CUDA is stood in for: this machine may have
    none; the CUDA-marked test below runs it on a GPU."""
    import mvc.dcp.asyncsave as asyncsave

    events: list[str] = []

    class Stream:
        def __init__(self, d: int) -> None:
            self.d = d

        def synchronize(self) -> None:
            events.append(f"wait {self.d}")

    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 3)
    monkeypatch.setattr(torch.cuda, "current_stream", lambda d: Stream(d))
    monkeypatch.setattr(torch._C, "_cuda_hasPrimaryContext", lambda d: d != 1, raising=False)
    real = asyncsave.dcp.async_save

    def staged(*a, **kw):
        events.append("dcp")
        return real(*a, **kw)

    monkeypatch.setattr(asyncsave.dcp, "async_save", staged)
    Repo.init(tmp_path / "repo").close()
    async_save({"w": torch.zeros(10)}, MvcStorageWriter(tmp_path / "repo", message="m",
                                                        lossless=True), no_dist=True).result()
    assert events == ["wait 0", "wait 2", "dcp"]


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_an_asynchronous_default_stager_copies_after_the_last_step(
        tmp_path):  # pragma: no cover - no GPU in CI
    """The step's update is queued behind a sleep on the stream when `async_save` is called
    with DCP's asynchronous, non-blocking stager: the commit holds the updated values."""
    from torch.distributed.checkpoint.staging import DefaultStager, StagingOptions

    Repo.init(tmp_path / "repo").close()
    p = torch.zeros(1 << 20, device="cuda")
    torch.cuda.synchronize()
    torch.cuda._sleep(200_000_000)
    p.add_(1.0)
    stager = DefaultStager(StagingOptions(use_async_staging=True, use_non_blocking_copy=True))
    cid = async_save({"p": p}, MvcStorageWriter(tmp_path / "repo", message="m", lossless=True),
                     async_stager=stager, no_dist=True).result()
    stager.close()
    with Repo(tmp_path / "repo") as repo:
        assert torch.equal(repo.read_state(cid)["p"], torch.ones(1 << 20))


def test_a_failure_after_the_commit_landed_is_published_error():
    w = MvcStorageWriter("unused", message="x")
    w.commit_id = "c" * 32
    err = typed_error(RuntimeError("peer gone"), w)
    assert isinstance(err, DcpPublishedError) and err.commit_id == "c" * 32


def test_the_writer_pickles_without_its_open_repository_or_group(tmp_path):
    Repo.init(tmp_path / "repo").close()
    w = MvcStorageWriter(tmp_path / "repo", message="m", step=3, epsilon=0.05,
                         process_group=object())
    w.repo   # opened here
    back = pickle.loads(pickle.dumps(w))
    assert back.path == w.path and back.options == w.options and back.process_group is None
    assert back.repo is not w.repo and back.repo.path == w.repo.path
    w.close()
    back.close()
