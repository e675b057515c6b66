"""A full disk is one clear error (DiskFullError, exit 75) and never damages or misreports a commit.

The repository lives on a small tmpfs that a ballast file fills to a chosen level, so LMDB,
the level cache and checkpoint writes meet a real ENOSPC (LMDB reports it as EIO).  Needs
permission to mount a tmpfs (root here and in CI); skipped elsewhere.
"""
from __future__ import annotations

import errno
import os
import subprocess
import warnings
from pathlib import Path

import pytest
import torch

from checkpoints import assert_same, realistic_state
from mvc.cli.main import main
from mvc.errors import DiskFullError, MvcWarning
from mvc.quant import QuantConfig
from mvc.repo.repository import Repo

MiB = 1 << 20


@pytest.fixture(autouse=True)
def _cwd(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # `mvc -C` changes directory in this process


@pytest.fixture
def small_fs(tmp_path):
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=6m", "tmpfs", str(mnt)],
                      capture_output=True).returncode != 0:
        pytest.skip("cannot mount a tmpfs here (needs root)")
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], capture_output=True)


def _free(path: Path) -> int:
    st = os.statvfs(path)
    return st.f_bavail * st.f_frsize


def _fill(mnt: Path, leave: int) -> Path:
    """A ballast file that leaves about `leave` bytes free on the mount."""
    ballast = mnt / "ballast"
    ballast.unlink(missing_ok=True)
    size = max(0, _free(mnt) - leave)
    with open(ballast, "wb") as fh:
        try:
            fh.write(b"\0" * size)
        except OSError as exc:  # tmpfs rounds to pages: fill what fits
            assert exc.errno == errno.ENOSPC
    return ballast


def _model_state(seed: int) -> dict:
    g = torch.Generator().manual_seed(seed)
    return {"w": torch.randn(256, 256, generator=g), "b": torch.randn(256, generator=g),
            "step": seed}


def test_commit_on_a_full_disk_is_disk_full_and_changes_nothing(small_fs, tmp_path):
    repo = Repo.init(small_fs / "r")
    repo.config.set("commit.mode", "lossless")
    first = repo.commit(_model_state(0), "first")
    _fill(small_fs, leave=16 << 10)
    with pytest.raises(DiskFullError, match="no space left"):
        repo.commit(_model_state(1), "second")
    assert repo.head() == first
    (small_fs / "ballast").unlink()
    assert not repo.fsck().problems
    assert_same(repo.read_state(first), _model_state(0))
    second = repo.commit(_model_state(1), "second")  # retried once space is free
    assert_same(repo.read_state(second), _model_state(1))
    repo.close()


def test_cli_commit_sweep_over_free_space(small_fs, tmp_path):
    """Whatever point of a lossy commit runs out of space, the outcome is either the commit
    landed (exit 0, restores exactly) or exit 75 with HEAD unchanged; fsck is clean after."""
    work = small_fs / "r"
    ckpt = tmp_path / "ckpt.pt"  # read from another filesystem: only the repository is full
    assert main(["-C", str(work.parent), "init", str(work)]) == 0
    repo = Repo(work)
    repo.config.set("commit.mode", "fixed")
    repo.config.set("commit.quant", QuantConfig(bins=16).to_dict())
    torch.save(_model_state(0), ckpt)
    assert main(["-C", str(work), "commit", "-m", "base", str(ckpt)]) == 0
    outcomes = set()
    for i, leave in enumerate(range(0, 640 << 10, 48 << 10)):
        state = _model_state(i + 1)
        torch.save(state, ckpt)
        ballast = _fill(small_fs, leave)
        before = repo.head()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", MvcWarning)
            rc = main(["-C", str(work), "commit", "-m", f"c{i}", str(ckpt)])
        assert rc in (0, DiskFullError.exit_code), rc
        outcomes.add(rc)
        ballast.unlink()
        if rc == 0:
            assert repo.head() != before
            got = repo.read_state("HEAD")
            assert torch.equal(got["b"], state["b"]) and got["step"] == state["step"]
        else:
            assert repo.head() == before
        assert not repo.fsck().problems
    assert outcomes == {0, DiskFullError.exit_code}  # the sweep crossed the boundary
    repo.close()


def test_level_cache_failure_after_the_commit_point_is_a_warning(tmp_path, monkeypatch):
    repo = Repo.init(tmp_path / "r")
    state = realistic_state(0)

    def full(*args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")

    assert repo.disk_levels is not None
    monkeypatch.setattr(repo.disk_levels, "save", full)
    with pytest.warns(MvcWarning, match="is stored, but its level cache"):
        cid = repo.commit(state, "lossy", quant=QuantConfig(bins=16))
    assert repo.head() == cid
    repo.close()
    fresh = Repo(tmp_path / "r")  # no in-memory levels: decodes from the store
    assert fresh.read_commit(cid).message == "lossy"
    assert not fresh.fsck().problems
    fresh.close()


def test_gc_shrink_on_a_full_disk(small_fs):
    repo = Repo.init(small_fs / "r")
    repo.config.set("commit.mode", "lossless")
    cids = [repo.commit(_model_state(i), f"c{i}") for i in range(3)]
    repo.branch("keep", cids[1])
    _fill(small_fs, leave=8 << 10)
    with pytest.raises(DiskFullError):
        repo.gc(shrink=True)
    assert not (small_fs / "r" / ".mvc" / "store.new").exists()
    (small_fs / "ballast").unlink()
    assert not repo.fsck().problems
    for i, cid in enumerate(cids):
        assert_same(repo.read_state(cid), _model_state(i))
    repo.gc(shrink=True)  # works once space is free
    assert_same(repo.read_state(cids[2]), _model_state(2))
    repo.close()


def test_checkout_to_a_full_disk_keeps_the_target(small_fs, tmp_path):
    repo = Repo.init(tmp_path / "r")
    repo.config.set("commit.mode", "lossless")
    repo.commit(_model_state(0), "c")
    repo.close()
    target = small_fs / "out.pt"
    target.write_bytes(b"previous contents")
    _fill(small_fs, leave=4 << 10)
    rc = main(["-C", str(tmp_path / "r"), "checkout", "HEAD", "-o", str(target), "--force"])
    assert rc == DiskFullError.exit_code
    assert target.read_bytes() == b"previous contents"
    assert {p.name for p in small_fs.iterdir()} == {"ballast", "out.pt"}  # no temp file left
