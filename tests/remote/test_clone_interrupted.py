"""A killed `mvc clone` does not block the next one (issue 25, defect 9): the clone is built in
a working directory and moved into place whole, so a SIGKILL mid-fetch leaves the destination
as it was; running the same command again succeeds (and removes the dead clone's leftovers),
and a destination that really is in use is refused (149) with what to do."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from cli_helpers import run
from remote_helpers import S3Server

import mvc
from mvc.remote.transfer import push
from mvc.repo.repository import Repo
from mvc.store.objstore import open_remote

# The mvc this test imports, for the child process too.
MVC_ROOT = str(Path(mvc.__file__).resolve().parent.parent)


@pytest.fixture(scope="module")
def pushed(tmp_path_factory):
    """A small history on a fresh S3 remote: (url, tip commit id)."""
    server = S3Server.shared()
    url = server.fresh_url()
    repo = Repo.init(tmp_path_factory.mktemp("src") / "r")
    g = torch.Generator().manual_seed(9)
    for i in range(3):
        cid = repo.commit({"w": torch.randn(64, 64, generator=g), "b": torch.randn(64, generator=g)},
                          f"step {i}")
    push(repo.odb, open_remote(url), {"refs/heads/main": cid})
    repo.close()
    return url, cid


def _kill_mid_fetch(server: S3Server, url: str, cwd: Path, dest: str) -> None:
    """Start `mvc clone URL DEST`, let every pack read fail (the client retries them), and
    SIGKILL it once it is stuck there: after the repository was created, before it is done."""
    server.reset()
    server.fail(10_000, 503, method="GET", path="/packs/")
    env = dict(os.environ, PYTHONPATH=MVC_ROOT, MVC_PROGRESS="0",
               MVC_S3_MAX_RETRIES="1000", MVC_S3_RETRY_TIMEOUT="600")
    proc = subprocess.Popen([sys.executable, "-m", "mvc", "clone", url, dest], cwd=cwd, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 120
        while server.stats()["failed"] == 0:
            assert proc.poll() is None, proc.communicate()
            assert time.monotonic() < deadline, "the clone never reached the packs"
            time.sleep(0.05)
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.communicate()
        server.fail(0)
    assert proc.returncode == -signal.SIGKILL


@pytest.mark.parametrize("existing", [False, True], ids=["absent", "empty-dir"])
def test_rerun_after_a_killed_clone_succeeds(pushed, tmp_path, existing):
    url, cid = pushed
    server = S3Server.shared()
    if existing:
        (tmp_path / "c").mkdir()
    _kill_mid_fetch(server, url, tmp_path, "c")
    # the destination is as it was; the dead clone's working directory is all that is left
    if existing:
        assert [p.name.startswith(".mvc-clone-") for p in (tmp_path / "c").iterdir()] == [True]
    else:
        assert not (tmp_path / "c").exists()
        assert [p.name.startswith(".c.mvc-clone-") for p in tmp_path.iterdir()] == [True]
    code, out, err = run(tmp_path, "clone", "-q", url, "c")
    assert code == 0, err
    c = Repo(tmp_path / "c")
    assert c.head() == cid and c.current_branch() == "main"
    assert [x.id for x in c.log()][0] == cid and len(list(c.log())) == 3
    assert c.fsck().problems == []
    c.close()
    # and the leftovers are gone: the clone is all there is
    assert [p.name for p in tmp_path.iterdir()] == ["c"]
    assert sorted(p.name for p in (tmp_path / "c").iterdir()) == [".mvc"]


def test_a_running_clone_keeps_its_working_directory(tmp_path):
    from mvc.remote.porcelain import _make_work_dir, _remove_abandoned

    live, fd = _make_work_dir(tmp_path, ".x.mvc-clone-")
    try:
        (tmp_path / ".x.mvc-clone-dead").mkdir()  # no lock held on it: a killed clone's
        (tmp_path / ".x.mvc-clone-dead" / "f").write_bytes(b"partial")
        (tmp_path / ".y.mvc-clone-other").mkdir()  # another destination's
        _remove_abandoned(tmp_path, ".x.mvc-clone-")
        assert sorted(p.name for p in tmp_path.iterdir()) == sorted([live.name, ".y.mvc-clone-other"])
    finally:
        os.close(fd)
    _remove_abandoned(tmp_path, ".x.mvc-clone-")  # released: abandoned now
    assert [p.name for p in tmp_path.iterdir()] == [".y.mvc-clone-other"]


def test_a_used_destination_is_refused_with_what_to_do(tmp_path):
    (tmp_path / "remote").mkdir()
    url = f"file://{tmp_path / 'remote'}"
    (tmp_path / "used").mkdir()
    (tmp_path / "used" / "notes.txt").write_text("mine")
    code, _, err = run(tmp_path, "clone", url, "used")
    assert code == 149 and "not empty (notes.txt)" in err and "mvc clone URL DIR" in err
    assert [p.name for p in (tmp_path / "used").iterdir()] == ["notes.txt"]
    (tmp_path / "file").write_text("x")
    code, _, err = run(tmp_path, "clone", url, "file")
    assert code == 149 and "not a directory" in err
    assert run(tmp_path, "clone", url, "repo")[0] == 0
    code, _, err = run(tmp_path, "clone", url, "repo")
    assert code == 149 and "already holds an mvc repository" in err and "rm -rf" in err
    # a failed clone leaves nothing behind: no destination, no working directory
    code, _, err = run(tmp_path, "clone", f"file://{tmp_path / 'typo'}", "t")
    assert code == 141
    assert sorted(p.name for p in tmp_path.iterdir()) == ["file", "remote", "repo", "used"]
