"""One rank of tests/dcp/test_dcp_publish.py: a peer dies around the coordinator's publish.

    python dcp_publish_worker.py RANK WORLD DIR PHASE

The state is FSDP2 + AdamW after a fixed number of training steps (tests/helpers/dcp_worker.py's
model), so a fresh pair of processes rebuilds exactly the state an earlier pair saved.
DIR holds the repository (DIR/repo), the rendezvous files and each rank's report
(DIR/<PHASE>.rank<R>.pt).  Phases (each a fresh process group; a dead peer breaks one):

``after``   a lossless save -> commit ``base``; one more step, then a save whose rank 1
            dies once rank 0 has published (rank 0 says so in a file and waits until
            rank 1 is gone, so DCP's broadcast of the result meets a dead peer): rank 0's
            save must fail *and* say that the commit landed;
``retry``   the same state saved again with the same message and step: no second commit;
            then one more step and a save whose rank 1 dies inside `write_data`, before its
            results reach rank 0: rank 0's save fails and says nothing landed.

The injection points are files and locks, not timing: rank 1 holds an exclusive lock on
DIR/rank1.alive for the rest of its life, and rank 0 (after publishing) takes that lock,
i.e. waits for the process to exit.
"""
from __future__ import annotations

import fcntl
import os
import sys
import threading
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp

from dcp_worker import DyingWriter, build, state_of, train
from mvc.dcp import MvcStorageWriter

try:  # the outcome-telling wrapper (absent before issue 25's fix: the raw dcp.save then)
    from mvc.dcp import DcpPublishedError, save
except ImportError:  # pragma: no cover - only when reproducing on the old code
    DcpPublishedError = None  # type: ignore[assignment,misc]
    save = None  # type: ignore[assignment]

ROOT: Path


def _die_when(flag: Path) -> None:
    while not flag.exists():
        time.sleep(0.01)
    sys.stdout.flush()
    os._exit(0)


def _wait_gone(lock: Path, seconds: float = 120.0) -> None:
    """Block until the process holding `lock` exits (its flock goes with it)."""
    fd = os.open(lock, os.O_RDWR)
    deadline = time.monotonic() + seconds
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return
        except BlockingIOError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.01)


class DiesAfterPublish(MvcStorageWriter):
    """Rank 1 hands over its results, then dies as soon as rank 0 has published."""

    def write_data(self, plan, planner):  # type: ignore[no-untyped-def]
        fut = super().write_data(plan, planner)
        if dist.get_rank() == 1:
            # taken before this rank's results are sent, so before rank 0 can wait on it
            fd = os.open(ROOT / "rank1.alive", os.O_RDWR | os.O_CREAT)
            fcntl.flock(fd, fcntl.LOCK_EX)
            threading.Thread(target=_die_when, args=(ROOT / "published",), daemon=True).start()
        return fut

    def finish(self, metadata, results):  # type: ignore[no-untyped-def]
        try:
            super().finish(metadata, results)
        finally:  # rank 1 dies either way: the test then sees what a failed finish did
            (ROOT / "published").write_text(str(self.commit_id))
        _wait_gone(ROOT / "rank1.alive")


def attempt(state: dict, writer: MvcStorageWriter) -> dict[str, Any]:
    """Save; what the caller was told: the outcome, the ids it learnt.

    The save runs on a group of its own with a short timeout: a send to a dead peer fails
    either at once (the connection is seen closed) or when the timeout expires (the send is
    still pending), and both are a failed collective, so the timeout only bounds the wait."""
    out: dict[str, Any] = {}
    group = dist.new_group(backend="gloo", timeout=timedelta(seconds=10))
    try:
        if save is not None:
            out["returned"] = save(state, writer, process_group=group)
        else:
            dcp.save(state, storage_writer=writer, process_group=group)
        out["outcome"] = "saved"
    except Exception as exc:  # a dead peer's error is gloo's, its type varies
        out["outcome"] = type(exc).__name__
        out["error_commit"] = getattr(exc, "commit_id", None)
        out["error"] = str(exc)[:400]
    out["writer_commit"] = writer.commit_id
    return out


def main(rank: int, world: int, root: Path, phase: str) -> None:
    global ROOT
    ROOT = root
    dist.init_process_group("gloo", init_method=f"file://{root / ('rdv_' + phase)}", rank=rank,
                            world_size=world, timeout=timedelta(seconds=60))
    repo = root / "repo"
    report: dict = {}
    path = root / f"{phase}.rank{rank}.pt"
    model, opt = build(0)
    train(model, opt, 2, 0)
    if phase == "after":
        w = MvcStorageWriter(repo, message="base", lossless=True, step=2)
        dcp.save(state_of(model, opt), storage_writer=w)
        report["base"] = w.commit_id
    train(model, opt, 1, 3)
    state = state_of(model, opt)
    if phase == "after":
        torch.save(report, path)
        report["first"] = attempt(state, DiesAfterPublish(repo, message="step 3", lossless=True,
                                                          step=3))
    else:
        report["retry"] = attempt(state, MvcStorageWriter(repo, message="step 3", lossless=True,
                                                          step=3))
        train(model, opt, 1, 9)
        torch.save(report, path)
        report["before"] = attempt(state_of(model, opt),
                                   DyingWriter(repo, message="never", lossless=True, step=4))
    torch.save(report, path)
    sys.stdout.flush()
    os._exit(0)   # the group is broken: no orderly shutdown


if __name__ == "__main__":
    main(int(sys.argv[1]), int(sys.argv[2]), Path(sys.argv[3]), sys.argv[4])
