"""Corruption is detected and contained; concurrent committers serialize."""
from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest
import torch
from store_contract import corrupt_object

from mvc.repo.repository import Repo
from mvc.store import IntegrityError


def test_flipped_byte_is_reported_and_contained(repo):
    good = repo.commit({"a": torch.arange(1000, dtype=torch.float32)}, "good")
    bad = repo.commit({"a": torch.arange(1000, dtype=torch.float32),
                       "b": torch.randn(1000)}, "bad")
    rec = next(t for t in repo.read_snapshot(repo.read_commit(bad).snapshot).tensors if t.name == "b")
    victim = rec.chunks[0]
    corrupt_object(repo.store, victim, 17)
    report = repo.fsck()
    assert not report.ok
    assert any(victim in p for p in report.problems)
    with pytest.raises(IntegrityError) as exc:
        repo.read_state(bad)
    assert victim in str(exc.value)
    assert torch.equal(repo.read_state(good)["a"], torch.arange(1000, dtype=torch.float32))


COMMITTER = textwrap.dedent("""
    import sys, torch
    from mvc.repo.repository import Repo
    repo = Repo(sys.argv[1])
    who = sys.argv[2]
    for i in range(6):
        repo.commit({"w": torch.randn(256, 1024), "who": who, "i": i}, f"{who} {i}")
""")

READER = textwrap.dedent("""
    import sys, time
    from mvc.repo.repository import Repo
    repo = Repo(sys.argv[1])
    seen = 0
    deadline = time.time() + 60
    while time.time() < deadline:
        log = repo.log()
        for newer, older in zip(log, log[1:]):
            assert newer.parents == [older.id], "log is not a consistent chain"
        for c in log[:2]:
            repo.read_snapshot(c.snapshot)
        seen = max(seen, len(log))
        if seen >= 12:
            break
    print(seen)
""")


@pytest.mark.slow
def test_two_processes_commit_concurrently_and_log_stays_consistent(tmp_path):
    root = tmp_path / "r"
    with Repo.init(root) as r:
        r.config.set("commit.mode", "lossless")
    procs = [subprocess.Popen([sys.executable, "-c", COMMITTER, str(root), w]) for w in ("A", "B")]
    reader = subprocess.Popen([sys.executable, "-c", READER, str(root)],
                              stdout=subprocess.PIPE, text=True)
    for p in procs:
        assert p.wait(timeout=300) == 0
    out, _ = reader.communicate(timeout=300)
    assert reader.returncode == 0, "reader saw an inconsistent history"
    with Repo(root) as repo:
        log = repo.log()
        assert len(log) == 12
        for newer, older in zip(log, log[1:]):
            assert newer.parents == [older.id]
        assert sorted(c.message for c in log) == sorted(f"{w} {i}" for w in "AB" for i in range(6))
        assert repo.fsck().ok
