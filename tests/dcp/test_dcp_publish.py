"""What a `dcp.save` through mvc tells its caller matches what it published (issue 25, defect 7).

The commit point is the coordinator's compare-and-swap in `MvcStorageWriter.finish`; DCP
broadcasts finish's outcome after it, so a peer dying in between fails the coordinator's
`dcp.save` although the commit landed.  The writer's `commit_id` (and `mvc.dcp.save`'s
`DcpPublishedError`) says so, and a retry of the same save makes no second commit.

One-process tests drive the writer through `dcp.save` without a process group; the slow
test runs real gloo ranks (tests/helpers/dcp_publish_worker.py) and kills rank 1 at fixed points.
"""
from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.api import CheckpointException
from rank_procs import run_ranks

from mvc.dcp import DcpPublishedError, Landed, MvcStorageWriter, save
from mvc.repo import lossy
from mvc.repo import pipeline
from mvc.repo.repository import Repo


def state(seed: int) -> dict:
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(256, 256), torch.nn.ReLU(),
                                torch.nn.Linear(256, 64))
    return {"model": {k: v.detach().clone() for k, v in model.state_dict().items()}}


def nudged(s: dict, seed: int, by: float = 1e-4) -> dict:
    """`s` plus small noise: another state whose quantization deltas against `s`'s."""
    g = torch.Generator().manual_seed(seed)
    return {"model": {k: v + by * torch.randn(v.shape, generator=g)
                      for k, v in s["model"].items()}}


@pytest.fixture
def repo_path(tmp_path: Path) -> Path:
    Repo.init(tmp_path / "repo").close()
    return tmp_path / "repo"


def log(path: Path) -> list[str]:
    with Repo(path) as repo:
        return [c.id for c in repo.log()]


def test_a_retry_of_the_head_s_save_makes_no_second_commit(repo_path):
    s = state(0)
    first = save(s, MvcStorageWriter(repo_path, message="step 1", lossless=True, step=1))
    w = MvcStorageWriter(repo_path, message="step 1", lossless=True, step=1)
    assert save(s, w) == first and w.commit_id == first and w.reused
    assert log(repo_path) == [first]
    # the same state under another message, or at another step, is a save of its own
    w2 = MvcStorageWriter(repo_path, message="again", lossless=True, step=1)
    second = save(s, w2)
    assert not w2.reused and log(repo_path) == [second, first]
    third = save(s, MvcStorageWriter(repo_path, message="again", lossless=True, step=2))
    assert log(repo_path) == [third, second, first]


def test_same_message_and_step_but_another_state_is_a_new_commit(repo_path):
    s = state(0)
    first = save(s, MvcStorageWriter(repo_path, message="ckpt", lossless=True))
    w = MvcStorageWriter(repo_path, message="ckpt", lossless=True)
    second = save(nudged(s, 1, by=1.0), w)
    assert not w.reused and log(repo_path) == [second, first]
    with Repo(repo_path) as repo:
        assert repo.read_commit(second).parents == [first]
        assert torch.equal(repo.read_state(second)["model"]["0.weight"],
                           nudged(s, 1, by=1.0)["model"]["0.weight"])


def test_a_lossy_retry_reproduces_the_head_and_makes_no_commit(repo_path):
    """A lossy save's records are deltas against its parent: the retry is written against
    the head's parent, as the first attempt was, and gives the head's snapshot exactly."""
    s1 = state(0)
    c1 = save(s1, MvcStorageWriter(repo_path, message="s1", step=1, epsilon=0.05))
    s2 = nudged(s1, 1)
    c2 = save(s2, MvcStorageWriter(repo_path, message="s2", step=2, epsilon=0.05))
    with Repo(repo_path) as repo:
        snap = repo.read_snapshot(repo.read_commit(c2).snapshot)
        assert any(lossy.is_delta(r) for r in snap.tensors)     # the case that needs the parent
    w = MvcStorageWriter(repo_path, message="s2", step=2, epsilon=0.05)
    assert save(s2, w) == c2 and w.reused
    assert log(repo_path) == [c2, c1]
    # a different state under the head's message and step: a commit on top of the head,
    # whose deltas name the snapshot they were written against (the head's parent's)
    w = MvcStorageWriter(repo_path, message="s2", step=2, epsilon=0.05)
    c3 = save(nudged(s1, 2), w)
    assert not w.reused and log(repo_path) == [c3, c2, c1]
    with Repo(repo_path) as repo:
        c3_commit = repo.read_commit(c3)
        assert c3_commit.parents == [c2]
        parents = {lossy.parent_ref(r)[0] for r in
                   repo.read_snapshot(c3_commit.snapshot).tensors if lossy.is_delta(r)}
        assert parents <= {repo.read_commit(c1).snapshot}
        out = repo.read_state(c3)["model"]
        assert all(torch.isfinite(v).all() for v in out.values())
        assert repo.fsck().ok


class FailsAfterPublish(MvcStorageWriter):
    """What a peer dying after the commit point does to the coordinator: the save raises."""

    def finish(self, metadata, results):  # type: ignore[no-untyped-def]
        super().finish(metadata, results)
        raise RuntimeError("[gloo] Connection closed by peer")


def test_a_failure_after_the_commit_point_says_the_commit_landed(repo_path):
    s = state(0)
    w = FailsAfterPublish(repo_path, message="step 3", lossless=True, step=3)
    with pytest.raises(DcpPublishedError) as err:
        save(s, w)
    assert err.value.commit_id == w.commit_id == log(repo_path)[0]
    assert "rank 0: RuntimeError: [gloo] Connection closed by peer" in str(err.value)
    assert err.value.exit_code == 166
    # the raw dcp.save raises the peer's error; the writer's commit_id says what landed
    w = FailsAfterPublish(repo_path, message="step 3", lossless=True, step=3)
    with pytest.raises((RuntimeError, CheckpointException)):
        dcp.save(s, storage_writer=w)
    assert w.commit_id == err.value.commit_id and w.reused
    # and a plain retry of the save is the same commit
    assert save(s, MvcStorageWriter(repo_path, message="step 3", lossless=True, step=3)) \
        == err.value.commit_id
    assert len(log(repo_path)) == 1


def test_a_failure_at_the_commit_point_says_nothing_landed(repo_path, monkeypatch):
    first = save(state(0), MvcStorageWriter(repo_path, message="one", lossless=True))

    def refuse(*args, **kwargs):
        raise OSError("disk went away")
    monkeypatch.setattr(pipeline, "publish", refuse)
    w = MvcStorageWriter(repo_path, message="two", lossless=True)
    with pytest.raises(CheckpointException) as err:   # DCP wraps finish's error
        save(state(1), w)
    assert "disk went away" in str(err.value)
    assert w.commit_id is None and log(repo_path) == [first]


def test_the_outcome_travels_in_dcp_s_metadata(repo_path):
    w = MvcStorageWriter(repo_path, message="m", lossless=True)
    md = dcp.save(state(0), storage_writer=w)
    assert md.storage_data == Landed(w.commit_id, False)


# ------------------------------------------------------------------ real ranks

def run_phase(root: Path, phase: str) -> list[dict]:
    return run_ranks("dcp_publish_worker.py", ["2", str(root), phase],
                     lambda r: root / f"{phase}.rank{r}.pt")


@pytest.mark.slow
def test_two_ranks_a_peer_dying_around_the_commit_point(tmp_path):
    root = tmp_path
    Repo.init(root / "repo").close()
    # rank 1 dies once rank 0 has published: rank 0's save fails, saying the commit landed
    r0, r1 = run_phase(root, "after")
    first, base = r0["first"], r0["base"]
    assert first["outcome"] == "DcpPublishedError"
    landed = first["error_commit"]
    assert landed is not None and first["writer_commit"] == landed
    assert "first" not in r1                        # rank 1 died inside that save
    assert log(root / "repo") == [landed, base]
    # fresh processes retry the same save: no second commit, every rank learns its id;
    # then rank 1 dies inside write_data (before publish): the branch does not move
    r0, r1 = run_phase(root, "retry")
    assert r0["retry"] == {"outcome": "saved", "returned": landed, "writer_commit": landed}
    assert r1["retry"]["returned"] == landed
    before = r0["before"]
    assert before["outcome"] != "DcpPublishedError" and before["outcome"] != "saved"
    assert before["writer_commit"] is None and before["error_commit"] is None
    with Repo(root / "repo") as repo:
        assert [c.id for c in repo.log()] == [landed, base]
        assert [e.new for e in repo.store.refs.reflog("refs/heads/main")] == [base, landed]
        assert repo.fsck().ok
