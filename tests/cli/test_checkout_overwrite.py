"""`mvc checkout` never destroys work the repository does not have (issue 25, defect 3;
DESIGN.md invariant 10): a modified or never committed checkpoint file, or a non-empty
directory, is refused (nothing written, HEAD unmoved) unless --force."""
from __future__ import annotations

import json
import os
import shutil

import pytest
import torch
from cli_helpers import run

from mvc.cli.commands_work import UncommittedChangesError
from mvc.io.dirs import OutputDirectoryExistsError
from mvc.repo import worktree
from mvc.repo.repository import Repo


@pytest.fixture
def work(work):
    """The shared lossless working directory, with `model.pt` as its checkpoint path."""
    assert run(work, "config", "checkpoint.path", "model.pt")[0] == 0
    return work


def _save(path, seed: int) -> dict:
    g = torch.Generator().manual_seed(seed)
    state = {"w": torch.randn(32, 16, generator=g)}
    torch.save(state, path)
    return state


def _head(work) -> str:
    r = Repo.discover(work)
    try:
        return r.head() or ""
    finally:
        r.close()


def _commit_two(work) -> dict:
    """Two commits of model.pt; returns the first one's state."""
    first = _save(work / "model.pt", 1)
    assert run(work, "commit", "-m", "e1")[0] == 0
    _save(work / "model.pt", 2)
    assert run(work, "commit", "-m", "e2")[0] == 0
    return first


def test_checkout_refuses_a_modified_checkpoint_unless_forced(work):
    first = _commit_two(work)
    _save(work / "model.pt", 3)  # training went on; not committed
    before, head = (work / "model.pt").read_bytes(), _head(work)
    assert "modified (not committed)" in run(work, "status")[1]
    code, _, err = run(work, "checkout", "main~1")
    assert code == UncommittedChangesError.exit_code == 172, err
    assert "modified (not committed)" in err and "nothing was written" in err
    assert "mvc commit -m" in err and "-o OTHER_FILE" in err and "--force" in err
    assert (work / "model.pt").read_bytes() == before and _head(work) == head
    code, _, err = run(work, "checkout", "main~1", "--force")
    assert code == 0, err
    assert torch.equal(torch.load(work / "model.pt")["w"], first["w"])
    assert "unchanged since HEAD" in run(work, "status")[1]


def test_checkout_writes_over_a_file_it_wrote_or_that_was_committed(work):
    _commit_two(work)
    # model.pt is the committed e2: no --force needed, nor over what checkout itself wrote.
    for rev in ("main~1", "main", "main~1"):
        code, _, err = run(work, "checkout", rev)
        assert code == 0, (rev, err)
    # A file committed by an explicit path (not checkpoint.path) may be overwritten too.
    _save(work / "other.pt", 7)
    assert run(work, "commit", "-m", "other", "other.pt")[0] == 0
    code, _, err = run(work, "checkout", "main~1", "-o", "other.pt")
    assert code == 0, err


def test_checkout_refuses_a_file_swapped_in_with_the_same_size_and_mtime(work):
    _commit_two(work)
    p = work / "model.pt"
    st = p.stat()
    (work / "new").mkdir()
    new = work / "new" / "model.pt"  # the same name inside the zip, the same shapes: the same size
    _save(new, 3)
    os.utime(new, ns=(st.st_atime_ns, st.st_mtime_ns))
    os.replace(new, p)  # as `cp -p` or `rsync -t` leave it: a new inode
    assert p.stat().st_size == st.st_size and p.stat().st_mtime_ns == st.st_mtime_ns
    before = p.read_bytes()
    code, _, err = run(work, "checkout", "main~1")
    assert code == 172, err
    assert p.read_bytes() == before


def test_checkout_output_refuses_an_unknown_file_unless_forced(work):
    _commit_two(work)
    exact = _save(work / "exact.pt", 9)  # an exact torch.save mvc never saw
    before = (work / "exact.pt").read_bytes()
    code, _, err = run(work, "checkout", "main~1", "-o", "exact.pt")
    assert code == 172, err
    assert "not a checkpoint mvc committed or checked out" in err
    assert "mvc commit -m MSG exact.pt" in err and "-o OTHER_FILE" in err and "--force" in err
    assert (work / "exact.pt").read_bytes() == before
    # A partial copy is refused the same way.
    code, _, err = run(work, "checkout", "main~1", "-o", "exact.pt", "--weights-only")
    assert code == 172 and (work / "exact.pt").read_bytes() == before
    assert torch.equal(torch.load(work / "exact.pt")["w"], exact["w"])
    code, _, err = run(work, "checkout", "main~1", "-o", "exact.pt", "-f")
    assert code == 0, err
    # Now checkout's own copy: another revision (whole or partial) may replace it.
    assert run(work, "checkout", "main", "-o", "exact.pt", "--weights-only")[0] == 0
    assert run(work, "checkout", "main~1", "-o", "exact.pt")[0] == 0
    # ... until it is edited.
    _save(work / "exact.pt", 10)
    assert run(work, "checkout", "main", "-o", "exact.pt")[0] == 172


def test_checkout_output_onto_the_working_checkpoint_keeps_status_right(work):
    _commit_two(work)
    head = _head(work)
    assert run(work, "checkout", "main~1", "-o", "model.pt")[0] == 0
    out = run(work, "status")[1]
    assert "unchanged since" in out and "not HEAD" in out and head == _head(work)
    assert run(work, "checkout", "main", "-o", "model.pt", "--weights-only")[0] == 0
    assert "written by checkout --only/--weights-only" in run(work, "status")[1]
    # The partial copy is mvc's own, so a full checkout writes over it.
    assert run(work, "checkout", "main")[0] == 0
    assert "unchanged since HEAD" in run(work, "status")[1]


def test_a_stamp_from_before_inodes_still_counts(work):
    _commit_two(work)
    r = Repo.discover(work)
    try:
        st = (work / "model.pt").stat()
        # What `mvc commit` recorded before the stamps' table existed.
        r.store.maintenance.set_meta(worktree.KNOWN_KEY, b"")
        r.store.maintenance.set_meta(worktree.CURRENT_KEY, json.dumps(
            {"commit": r.head(), "path": str((work / "model.pt").resolve()),
             "size": st.st_size, "mtime_ns": st.st_mtime_ns}).encode())
    finally:
        r.close()
    assert "unchanged since HEAD" in run(work, "status")[1]
    assert run(work, "checkout", "main~1")[0] == 0


def test_stamps_table_is_bounded_and_keeps_the_newest(tmp_path):
    r = Repo.init(tmp_path / "r")
    try:
        for i in range(worktree.MAX_KNOWN + 10):
            worktree.record(r.store.maintenance, worktree.Stamp("c" * 32, f"/x/{i}.pt", i, i, i))
        table = json.loads(r.store.maintenance.get_meta(worktree.KNOWN_KEY) or b"{}")
        assert len(table) == worktree.MAX_KNOWN
        assert f"/x/{worktree.MAX_KNOWN + 9}.pt" in table and "/x/0.pt" not in table
    finally:
        r.close()


def test_directory_checkout_refuses_a_non_empty_directory_unless_forced(work):
    src = work / "run" / "checkpoint-6"
    src.mkdir(parents=True)
    (src / "config.json").write_text('{"a": 1}')
    torch.save({"w": torch.ones(4)}, src / "w.pt")
    assert run(work, "commit", "-m", "dir", str(src), "--step", "6")[0] == 0
    out_dir = work / "back"
    assert run(work, "checkout", "HEAD", "-o", str(out_dir))[0] == 0
    (out_dir / "notes.txt").write_text("mine")
    code, _, err = run(work, "checkout", "HEAD", "-o", str(out_dir))
    assert code == OutputDirectoryExistsError.exit_code, err
    assert "not empty" in err and "--force" in err and (out_dir / "notes.txt").exists()
    code, _, err = run(work, "checkout", "HEAD", "-o", str(out_dir), "--force")
    assert code == 0, err
    assert sorted(p.name for p in out_dir.iterdir()) == ["config.json", "w.pt"]
    assert not [p for p in work.iterdir() if p.name.startswith(".back.")], "no leftovers"
    # --force never replaces the directory holding the repository (or the current one).
    code, _, err = run(work, "checkout", "HEAD", "-o", str(work), "--force")
    assert code == 2 and "does not replace it" in err and (work / ".mvc").is_dir()
    code, _, err = run(out_dir, "checkout", "HEAD", "-o", ".", "--force")
    assert code == 2 and (out_dir / "w.pt").exists()
    shutil.rmtree(out_dir)
