"""kill -9 at any moment of a retention gc (re-basing kept commits, marking, deleting) leaves
an fsck-clean repository that never lost a kept commit (issue 19 item 5)."""
from __future__ import annotations

import os
import random
import shutil
import signal
import subprocess
import sys
import textwrap
import time

import pytest
from lossy_history import assert_bits, chained_repo

from mvc.repo.pruned import CommitPrunedError
from mvc.repo.repository import Repo

# Waits for the repository path on stdin, so the next child can import torch while the current
# one is being killed.
GC_CHILD = textwrap.dedent("""
    import sys
    from mvc.repo.repository import Repo
    print("READY", flush=True)
    repo = Repo(sys.stdin.readline().strip())
    print("GO", flush=True)
    repo.gc(keep_last=2, keep_every=4, max_chain=3)
    print("DONE", flush=True)
""")
KILLS = 20


def _child() -> subprocess.Popen:
    proc = subprocess.Popen([sys.executable, "-c", GC_CHILD], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None and proc.stdout.readline().strip() == "READY"
    return proc


def _start(proc: subprocess.Popen, path) -> None:
    assert proc.stdin is not None and proc.stdout is not None
    proc.stdin.write(f"{path}\n")
    proc.stdin.flush()
    assert proc.stdout.readline().strip() == "GO"


@pytest.mark.slow
def test_sigkill_during_retention_gc(tmp_path):
    pristine = tmp_path / "pristine"
    repo, ids = chained_repo(pristine, 10)
    reference = {cid: repo.read_state(cid) for cid in ids}
    plan = repo.gc(dry_run=True, keep_last=2, keep_every=4)
    doomed = set(plan.pruned)
    kept = [c for c in ids if c not in doomed]
    assert doomed and len(kept) >= 4
    repo.close()

    def check(work, attempt):
        with Repo(work) as r:
            report = r.fsck()
            assert report.ok, (attempt, report.problems)
            assert r.pruned() in (set(), doomed), attempt  # all marks or none
            for cid in doomed & r.pruned():
                with pytest.raises(CommitPrunedError):
                    r.read_state(cid)
            for cid in kept:  # never lost, bit for bit (the doomed ones were checked by the probe)
                st = reference[cid]
                got = r.read_state(cid)
                for k, v in st.items():
                    assert_bits(got[k], v, f"attempt {attempt} {cid[:8]} {k}")

    # How long an uninterrupted run takes, so kills land inside it.
    probe = tmp_path / "probe"
    shutil.copytree(pristine, probe)
    proc = _child()
    t0 = time.monotonic()
    _start(proc, probe)
    assert proc.stdout is not None and proc.stdout.readline().strip() == "DONE"
    duration = time.monotonic() - t0
    proc.wait()
    check(probe, "probe")

    span = duration
    rng = random.Random(19)
    outcomes = {"before": 0, "marked": 0, "finished": 0}
    nxt = _child()
    for attempt in range(KILLS):
        work = tmp_path / f"try{attempt}"
        shutil.copytree(pristine, work)
        proc, nxt = nxt, (_child() if attempt + 1 < KILLS else None)
        _start(proc, work)
        # Stratified: the kill moments cover the whole run, its last part included.
        time.sleep(span * 1.1 * (attempt + rng.random()) / KILLS)
        os.kill(proc.pid, signal.SIGKILL)
        out, _ = proc.communicate()
        check(work, attempt)
        with Repo(work) as r:
            marked = bool(r.pruned())
            outcome = "finished" if "DONE" in out else "marked" if marked else "before"
            outcomes[outcome] += 1
            # A busier machine than during the probe: a kill in the second half of the run that
            # still lands before the marks stretches the schedule, so later kills reach them.
            if outcome == "before" and 2 * (attempt + 1) > KILLS:
                span *= 1.5
            if attempt % 4 == 0:
                r.gc(keep_last=2, keep_every=4, max_chain=3)  # a later gc completes the job
                assert r.pruned() == doomed
        if attempt % 4 == 0:
            check(work, f"{attempt} after a full gc")
        shutil.rmtree(work)
    # The kills landed on both sides of the marking transaction.
    assert outcomes["before"] > 0 and outcomes["marked"] + outcomes["finished"] > 0, outcomes
