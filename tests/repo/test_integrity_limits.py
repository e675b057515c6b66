"""Writer and reader agree (issue 25, defect 2; DESIGN.md invariant 9): a commit the reader
would refuse is never published, and a repository an older mvc left holding one has a way out.

Before: `torch.empty((0, 2**62))` in a checkpoint was stored (the writer checked nothing), the
branch moved to a commit whose snapshot the reader refuses (a dimension past 2^48), and from
then on fsck exited 26 and gc was refused for the whole repository.
"""
from __future__ import annotations

import dataclasses
from datetime import datetime, timezone

import pytest
import torch

from cli_helpers import run
from mvc.errors import MvcWarning, UsageError
from mvc.repo import pipeline
from mvc.repo.gc import UnsafeGcError
from mvc.repo.objects import (MAX_NUMEL, Commit, MalformedObjectError, Snapshot, TensorRecord,
                              UnpublishableObjectError, UnstorableTensorError, check_tensor_shape,
                              checked_encoding, shape_problem)
from mvc.repo.repository import Repo
from mvc.search.plan import Quantization
from mvc.state import flatten
from mvc.store import RefUpdate, object_id

BAD = (0, 2**62)  # holds no data, yet a dimension past the reader's 2^48


# ---------------------------------------------------------------- one rule, both directions

SHAPES = [[], [0], [3, 4], [MAX_NUMEL], [0, MAX_NUMEL], [0, MAX_NUMEL + 1], [0, 2**62],
          [2**24, 2**24], [2**24, 2**24 + 1], [2**16] * 4, [-1], [1.0], [True], ["3"]]


def _record(shape) -> dict:
    return {"name": "t", "dtype": "float32", "shape": shape, "codec": "raw/1", "chunks": [],
            "stored_bytes": 0, "raw_bytes": 0}


@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_reader_and_writer_accept_the_same_shapes(shape):
    snap = Snapshot([TensorRecord(**_record(shape))], {"root": None})
    problem = shape_problem(shape)
    try:
        Snapshot.decode(snap.encode(), "0" * 32)
        read = True
    except MalformedObjectError:
        read = False
    assert read == (problem is None)
    try:
        checked_encoding(snap)
        written = True
    except UnpublishableObjectError:
        written = False
    assert written == read
    if all(type(d) is int and d >= 0 for d in shape):  # what a torch tensor can have
        if read:
            check_tensor_shape("t", shape)
        else:
            with pytest.raises(UnstorableTensorError, match="2\\^48"):
                check_tensor_shape("t", shape)


# ---------------------------------------------------------------- the writer refuses early

def test_commit_refuses_a_tensor_past_the_limits_and_stores_nothing(repo):
    with pytest.raises(UnstorableTensorError, match=r"tensor 'e'.*2\^48") as info:
        repo.commit({"w": torch.ones(3), "e": torch.empty(BAD)}, "x")
    assert info.value.exit_code == 173 and isinstance(info.value, UsageError)
    assert repo.head() is None and list(repo.store.blobs.iter_ids()) == []


@pytest.mark.parametrize("suffix", [".pt", ".safetensors"])
def test_cli_commit_of_such_a_file_fails_and_main_does_not_move(tmp_path, suffix):
    state = {"w": torch.ones(3), "e": torch.empty(BAD)}
    path = tmp_path / f"x{suffix}"
    if suffix == ".pt":
        torch.save(state, path)
    else:
        from safetensors.torch import save_file

        save_file(state, str(path))
    assert run(tmp_path, "init")[0] == 0
    code, _, err = run(tmp_path, "commit", "-m", "x", path.name)
    assert code == 173, err  # before: 14 "snapshot is malformed", with main moved to it
    assert "'e'" in err and "2^48" in err and "Traceback" not in err
    with Repo(tmp_path) as repo:
        assert repo.head() is None and list(repo.store.blobs.iter_ids()) == []
    assert run(tmp_path, "fsck")[0] == 0 and run(tmp_path, "gc")[0] == 0


def test_step_outside_what_the_reader_accepts_is_refused(repo):
    with pytest.raises(UsageError, match="2\\^62"):
        repo.commit({"w": torch.ones(3)}, "x", step=2**62 + 1)
    assert repo.head() is None
    cid = repo.commit({"w": torch.ones(3)}, "x", step=-(2**62))
    assert repo.read_commit(cid).step == -(2**62)


# ---------------------------------------------------------------- publish reads back first

def _written(repo: Repo, state: dict):
    settings = repo.commit_settings()
    plan = pipeline.plan(flatten(state), Quantization(), pipeline.ParentInfo(),
                         read_centroids=repo.reader.read_centroids, settings=settings)
    return plan, pipeline.write(plan.write, plan.write.names, blobs=repo.store.blobs,
                                read_quantized=repo.reader.read_quantized)


def test_publish_refuses_a_record_the_reader_would_refuse(repo):
    plan, records = _written(repo, {"w": torch.ones(3), "e": torch.empty(0, 3)})
    # What a writer bypassing the plan's check (another process, a bug) might hand publish.
    records = [dataclasses.replace(r, shape=list(BAD)) if r.name == "e" else r for r in records]
    before = set(repo.store.blobs.iter_ids())
    with pytest.raises(UnpublishableObjectError, match="2\\^48"):
        pipeline.publish(plan.manifest, records, pipeline.CommitInfo("x", "me"), blobs=repo.store.blobs,
                         refs=repo.store.refs, ref="refs/heads/main")
    assert repo.head() is None and set(repo.store.blobs.iter_ids()) == before


def test_publish_refuses_a_commit_the_reader_would_refuse(repo):
    # mvc.dcp hands publish a CommitInfo of its own: the step is checked there too.
    plan, records = _written(repo, {"w": torch.ones(3)})
    with pytest.raises(UnpublishableObjectError, match="step"):
        pipeline.publish(plan.manifest, records, pipeline.CommitInfo("x", "me", step=2**63),
                         blobs=repo.store.blobs, refs=repo.store.refs, ref="refs/heads/main")
    assert repo.head() is None


# ---------------------------------------------------------------- the way out

def _publish_unchecked(repo: Repo, state: dict, parent: str, *, shape_of_e=BAD,
                       step: int | None = None) -> tuple[str, str]:
    """What an older mvc did: store a commit with no read-back, and move main to it."""
    plan, records = _written(repo, state)
    if "e" in state:
        records = [dataclasses.replace(r, shape=list(shape_of_e)) if r.name == "e" else r
                   for r in records]
    snap = Snapshot(records, plan.manifest.skeleton).encode()
    commit = Commit(parents=[parent], snapshot=object_id(snap), message="bad",
                    time=datetime.now(timezone.utc).isoformat(), author="old mvc", step=step)
    sid, cid = repo.store.blobs.put_many([snap, commit.encode()])
    repo.store.refs.update_refs([RefUpdate("refs/heads/main", parent, cid)], "commit: bad")
    return cid, sid


def _unique_chunk(repo: Repo, sid: str, good_sid: str) -> str:
    data = repo.store.blobs.get(sid)
    good = set(repo.read_snapshot(good_sid).chunk_ids())
    from mvc.repo.objects import ids_named

    named = ids_named(data)
    assert named is not None
    chunks = [c for c in named if c not in good and c != sid]
    assert chunks
    return chunks[0]


def _move_main_back(repo: Repo) -> None:
    repo.branch("rescue", "main~1")
    repo.switch("rescue")
    repo.move_branch("main", "rescue")
    repo.switch("main")
    repo.delete_branch("rescue")


@pytest.fixture
def broken(repo):
    good = repo.commit({"w": torch.ones(3)}, "good")
    bad, bad_snap = _publish_unchecked(repo, {"w": torch.ones(3), "u": torch.arange(100.0),
                                              "e": torch.empty(0, 3)}, good)
    chunk = _unique_chunk(repo, bad_snap, repo.read_commit(good).snapshot)
    return repo, good, bad, bad_snap, chunk


def test_as_the_defect_left_it_gc_refuses_and_points_the_way_out(broken):
    repo, good, bad, bad_snap, chunk = broken
    assert repo.head() == bad
    assert not repo.fsck().ok
    with pytest.raises(UnsafeGcError, match="Unreadable commits"):
        repo.gc()


def test_once_main_moved_off_gc_runs_and_keeps_the_unreadable_commit_unread(broken):
    repo, good, bad, bad_snap, chunk = broken
    _move_main_back(repo)
    with pytest.warns(MvcWarning, match="cannot read"):
        report = repo.gc()
    assert len(report.unreadable_kept) == 1 and bad_snap in report.unreadable_kept[0]
    # Nothing the unreadable commit names is deleted: the reflog still names it.
    assert all(repo.store.blobs.has(o) for o in (bad, bad_snap, chunk))
    fsck = repo.fsck()
    assert fsck.ok and any("only reflogs reach it" in w for w in fsck.warnings)
    assert torch.equal(repo.checkout("main")["w"], torch.ones(3))
    # History goes on, and gc still frees what nothing reaches.
    repo.commit({"w": torch.zeros(3)}, "next")
    orphan = repo.store.blobs.put(b"not reachable from anything")
    with pytest.warns(MvcWarning):
        assert repo.gc().removed_objects == 1
    assert not repo.store.blobs.has(orphan) and repo.store.blobs.has(chunk)


def test_deleting_the_branch_and_expiring_its_reflog_removes_it(broken):
    repo, good, bad, bad_snap, chunk = broken
    repo.branch("rescue", "main~1")
    repo.switch("rescue")
    repo.delete_branch("main", force=True)
    report = repo.gc(reflog_expire=0)
    assert report.unreadable_kept == [] and report.expired_reflogs == ["refs/heads/main"]
    assert not any(repo.store.blobs.has(o) for o in (bad, bad_snap, chunk))
    repo.rename_branch("rescue", "main")
    fsck = repo.fsck()
    assert fsck.ok and fsck.warnings == []
    assert [c.id for c in repo.stats().commits] == [good]


def test_cli_way_out(broken, tmp_path):
    repo, good, bad, bad_snap, chunk = broken
    root = repo.path
    assert run(root, "gc")[0] == 25
    for args in (["branch", "rescue", "main~1"], ["switch", "rescue"],
                 ["branch", "-f", "main", "rescue"], ["switch", "main"], ["branch", "-d", "rescue"]):
        assert run(root, *args)[0] == 0, args
    code, out, err = run(root, "gc")
    assert code == 0 and "cannot read" in err
    code, out, err = run(root, "fsck")
    assert code == 0 and "only reflogs reach it" in out + err


def test_a_missing_object_behind_a_reflog_still_stops_gc(broken):
    # Only an intact object is kept unread: one that is gone cannot be told from damage.
    repo, good, bad, bad_snap, chunk = broken
    _move_main_back(repo)
    repo.store.blobs.delete([bad_snap])
    with pytest.raises(UnsafeGcError):
        repo.gc()
    assert not repo.fsck().ok


def test_an_unreadable_commit_object_keeps_its_snapshot_and_chunks(repo):
    # A commit itself past a limit (a step an older writer let through): its parent is
    # history anyway, and what its snapshot names is kept through the bytes it names.
    good = repo.commit({"w": torch.ones(3)}, "good")
    bad, bad_snap = _publish_unchecked(repo, {"w": torch.ones(3), "u": torch.arange(100.0)},
                                       good, step=2**63)
    chunk = _unique_chunk(repo, bad_snap, repo.read_commit(good).snapshot)
    with pytest.raises(UnsafeGcError):
        repo.gc()
    _move_main_back_from_unreadable_commit(repo, good)
    with pytest.warns(MvcWarning):
        report = repo.gc()
    assert len(report.unreadable_kept) == 1
    assert all(repo.store.blobs.has(o) for o in (bad, bad_snap, chunk))
    assert repo.fsck().ok


def _move_main_back_from_unreadable_commit(repo: Repo, good: str) -> None:
    # `main~1` would read the unreadable commit: name its parent by id.
    repo.branch("rescue", good)
    repo.switch("rescue")
    repo.move_branch("main", "rescue")
    repo.switch("main")
    repo.delete_branch("rescue")
