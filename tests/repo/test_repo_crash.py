"""Crash safety: SIGKILL in the middle of large commits, then recover."""
from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import torch

from mvc.repo.repository import Repo

CHILD = textwrap.dedent("""
    import sys, torch
    from mvc.repo.repository import Repo

    def state(seed):
        g = torch.Generator().manual_seed(seed)
        return {"model": {f"l{i}.weight": torch.randn(512, 1024, generator=g) for i in range(6)},
                "step": seed}

    repo = Repo(sys.argv[1])
    start = int(sys.argv[2])
    print("READY", flush=True)
    for seed in range(start, start + 1000):
        cid = repo.commit(state(seed), f"seed {seed}", step=seed)
        print(f"ACK {cid} {seed}", flush=True)
""")


def expected(seed: int) -> dict:
    g = torch.Generator().manual_seed(seed)
    return {"model": {f"l{i}.weight": torch.randn(512, 1024, generator=g) for i in range(6)},
            "step": seed}


def _kill_during_commits(root: Path, start: int, delay: float) -> list[tuple[str, int]]:
    proc = subprocess.Popen([sys.executable, "-c", CHILD, str(root), str(start)],
                            stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "READY"
    time.sleep(delay)
    os.kill(proc.pid, signal.SIGKILL)
    out, _ = proc.communicate()
    acks = []
    for line in out.splitlines():
        parts = line.split()
        if len(parts) == 3 and parts[0] == "ACK":
            acks.append((parts[1], int(parts[2])))
    return acks


@pytest.mark.slow
def test_sigkill_during_commits_20_times(tmp_path):
    root = tmp_path / "repo"
    Repo.init(root).close()
    with Repo(root) as r:
        r.config.set("commit.chunk_mib", 1)  # many chunks: more places to be killed
        r.config.set("commit.mode", "lossless")  # exact restores are what we compare
    rng = random.Random(1234)
    acknowledged: list[tuple[str, int]] = []
    for attempt in range(20):
        acks = _kill_during_commits(root, start=attempt * 1000, delay=rng.uniform(0.05, 1.2))
        acknowledged += acks
        with Repo(root) as repo:
            report = repo.fsck()
            assert report.ok, report.problems
            head = repo.head()
            if head is not None:  # HEAD names a complete, restorable commit
                seed = repo.read_commit(head).step
                got = repo.read_state(head)
                assert all(torch.equal(got["model"][k], v) for k, v in expected(seed)["model"].items())
    with Repo(root) as repo:
        # every acknowledged commit restores exactly
        for cid, seed in acknowledged:
            got = repo.read_state(cid)
            exp = expected(seed)
            assert got["step"] == seed
            for k, v in exp["model"].items():
                assert torch.equal(got["model"][k], v)
        history = {c.id for c in repo.log()}
        assert {cid for cid, _ in acknowledged} <= history
        first = repo.gc()
        assert repo.gc().removed_objects == 0
        assert repo.fsck().ok
        # what gc kept is exactly what history needs: another commit round-trips fine
        assert first.kept_objects == sum(1 for _ in repo.store.blobs.iter_ids())
    assert len(acknowledged) >= 1
