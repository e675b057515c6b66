"""A push killed by SIGKILL at random moments leaves a remote whose refs reach only complete
histories: it clones and fscks clean, and the next push sends only what is not there yet."""
from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from locations import HELPERS, ROOT
from lossy_history import configs, trajectory
from remote_helpers import S3Server

from mvc.remote.porcelain import clone
from mvc.remote.transfer import push
from mvc.repo.repository import Repo
from mvc.store.objstore import open_remote

KILLS = 20


@pytest.fixture(scope="module")
def source(tmp_path_factory):
    root = tmp_path_factory.mktemp("kill") / "r"
    repo = Repo.init(root)
    repo.config.set("commit.base_every", 4)
    ids = [repo.commit(state, f"step {t}", quant=configs(t)) for t, state in trajectory(10)]
    repo.close()
    return root, ids


class Zygote:
    """tests/helpers/remote_push_worker.py: forks pushers from one process that imported mvc once."""

    def __init__(self) -> None:
        env = dict(os.environ, PYTHONPATH=str(ROOT))
        self.proc = subprocess.Popen([sys.executable, str(HELPERS / "remote_push_worker.py")],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env)
        assert self._line() == "ready"

    def _line(self) -> str:
        assert self.proc.stdout is not None
        return self.proc.stdout.readline().strip()

    def push(self, root: Path, url: str, kill_after: float | None = None) -> int:
        """Run one push; with `kill_after`, SIGKILL it that many seconds after it started.
        Returns its wait status."""
        assert self.proc.stdin is not None
        self.proc.stdin.write(f"{root} {url}\n")
        self.proc.stdin.flush()
        pid = int(self._line().split()[1])
        if kill_after is not None:
            time.sleep(kill_after)
            os.kill(pid, signal.SIGKILL)  # a zombie until reaped below: never another process
        self.proc.stdin.write("reap\n")
        self.proc.stdin.flush()
        return int(self._line().split()[1])

    def close(self) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.close()
        self.proc.wait(30)


def _kill_and_check(zygote: Zygote, root: Path, ids: list[str], url: str, delay: float,
                    tmp: Path) -> bool:
    """Kill a push after `delay` s, check the remote, resume; whether the kill hit mid-push."""
    zygote.push(root, url, kill_after=delay)
    remote = open_remote(url)
    main = remote.refs.read_ref("refs/heads/main")
    present = remote.blobs.known_ids()
    if main is not None:
        # the ref moves last: once it is there the push had finished its uploads
        assert main == ids[-1]
        res = clone(url, tmp / "clone")
        c = Repo(res.path)
        assert c.head() == ids[-1] and c.fsck().problems == []
        c.close()
    # the next push completes, and sends exactly what was not there yet
    src = Repo(root)
    reach = {r.oid for r in src.odb.reachable([ids[-1]])}
    report = push(src.odb, remote, {"refs/heads/main": ids[-1]})
    after = remote.blobs.known_ids()
    assert reach <= after
    if main is None:
        assert report.objects == len(reach - present) and report.skipped == len(reach & present)
    assert remote.refs.read_ref("refs/heads/main") == ids[-1]
    res = clone(url, tmp / "clone2")
    c = Repo(res.path)
    assert c.fsck().problems == []
    c.close()
    src.close()
    remote.close()
    return main is None


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["file", "s3"])
def test_push_killed_at_random_moments(kind, source, tmp_path):
    root, ids = source
    server = S3Server.shared() if kind == "s3" else None

    def url(i: int) -> str:
        return server.fresh_url() if server else f"file://{tmp_path / f'remote{i}'}"
    zygote = Zygote()
    try:
        t = time.perf_counter()
        assert zygote.push(root, url(-1)) == 0
        full = time.perf_counter() - t
        rng = random.Random(18)
        n = KILLS if kind == "file" else KILLS // 2
        # a fresh remote each time, killed anywhere from the first request to just after the end
        mid = []
        for i in range(n):
            mid.append(_kill_and_check(zygote, root, ids, url(i), rng.uniform(0.0, full * 1.1),
                                       tmp_path / f"k{i}"))
            if not mid[-1]:
                full *= 0.8  # the push ran faster than the first one: aim earlier
    finally:
        zygote.close()
    assert sum(mid) >= n // 4, mid  # kills landed before the ref moved, not only after
