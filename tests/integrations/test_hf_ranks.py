"""The Hugging Face integration under a 2-process launch (torchrun-style environment, gloo on
CPU, real Trainers): every rank runs `train_from_mvc`, and `MvcCallback` commits checkpoints
that every rank writes into (each its own RNG state).  tests/helpers/hf_ranks_worker.py is one
rank."""
from __future__ import annotations

import socket

import pytest

pytest.importorskip("transformers")

from hf_tiny import trainer  # noqa: E402
from rank_procs import run_ranks  # noqa: E402

from mvc.integrations.hf import MvcCallback  # noqa: E402
from mvc.repo.repository import Repo  # noqa: E402


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_every_rank_resumes_from_one_checkout_and_commits_hold_every_ranks_files(tmp_path):
    """Each rank checked out into the same directory: a late one found it non-empty
    (`OutputDirectoryExistsError`), or replaced it under an earlier one's Trainer. And process
    zero committed (and with delete=True removed) a checkpoint while the other was still
    writing its RNG state into it."""
    trainer(tmp_path / "first", callbacks=[MvcCallback(tmp_path / "runs", delete=True)]).train()
    reports = run_ranks("hf_ranks_worker.py", ["2", str(_free_port()), str(tmp_path), "1.0"],
                        lambda r: tmp_path / f"rank{r}.json")
    for r, rep in enumerate(reports):
        assert "error" not in rep, (r, rep)
        assert rep["step"] == 10
    assert reports[0]["left"] == []     # the checkout cleaned up, the commits' dirs deleted
    with Repo(tmp_path / "runs") as repo:
        log = repo.log()
        assert [c.step for c in log] == [10, 8, 6, 4, 2]
        for c in log[:2]:                 # the 2-process run's commits
            files = repo.read_state(c.id)["files"]
            assert {"rng_state_0.pth", "rng_state_1.pth"} <= set(files), c.step
