"""kill -9 at any moment of gc (compaction, deletion, shrink) leaves a valid, fsck-clean repository."""
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
from lossy_history import assert_bits, chained_repo, trajectory

from mvc.repo.repository import Repo

GC_CHILD = textwrap.dedent("""
    import sys
    from mvc.repo.repository import Repo
    repo = Repo(sys.argv[1])
    print("READY", flush=True)
    repo.gc(max_chain=2, shrink=True)
    print("DONE", flush=True)
""")


@pytest.mark.slow
def test_sigkill_during_gc(tmp_path):
    pristine = tmp_path / "pristine"
    repo, ids = chained_repo(pristine, 16)
    repo.switch("side", create=True)
    side = repo.commit(next(iter(trajectory(1)))[1], "side work")
    repo.switch("main")
    repo.delete_branch("side", force=True)
    repo.store.refs.delete_reflog("refs/heads/side")  # no grace period: garbage for gc to delete
    reference = {cid: repo.read_state(cid) for cid in ids}
    repo.close()
    # How long an uninterrupted gc takes here, so kills land inside it.
    probe = tmp_path / "probe"
    shutil.copytree(pristine, probe)
    proc = subprocess.Popen([sys.executable, "-c", GC_CHILD, str(probe)],
                            stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "READY"
    t0 = time.monotonic()
    assert proc.stdout.readline().strip() == "DONE"
    duration = time.monotonic() - t0
    proc.wait()
    rng = random.Random(7)
    finished = 0
    for attempt in range(10):
        work = tmp_path / f"try{attempt}"
        shutil.copytree(pristine, work)
        proc = subprocess.Popen([sys.executable, "-c", GC_CHILD, str(work)],
                                stdout=subprocess.PIPE, text=True)
        assert proc.stdout.readline().strip() == "READY"
        time.sleep(rng.uniform(0.0, duration))
        os.kill(proc.pid, signal.SIGKILL)
        out, _ = proc.communicate()
        finished += "DONE" in out
        with Repo(work) as r:
            report = r.fsck()
            assert report.ok, (attempt, report.problems)
            for cid, st in reference.items():
                got = r.read_state(cid)
                for k, v in st.items():
                    assert_bits(got[k], v, f"attempt {attempt} {cid[:8]} {k}")
            r.gc(max_chain=2)  # a later gc completes the job
            assert r.fsck().ok
            assert not r.store.blobs.has(side)
    assert finished < 10, "every gc finished before the kill: the test exercised nothing"
