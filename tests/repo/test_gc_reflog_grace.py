"""A deleted branch's tip stays reachable through its reflog for gc.reflog_expire days
(git's gc.reflogExpire); `gc --expire now` overrides (issue 19 item 6, data loss by habit)."""
from __future__ import annotations

import torch

from cli_helpers import run
from mvc.repo.repository import Repo


def _repo_with_unmerged_branch(root):
    repo = Repo.init(root)
    base = repo.commit({"w": torch.ones(64)}, "base", lossless=True)
    repo.switch("high-lr", create=True)
    tip = repo.commit({"w": torch.arange(64.0)}, "high lr", lossless=True)
    repo.switch("main")
    repo.delete_branch("high-lr", force=True)
    return repo, base, tip


def test_deleted_branch_survives_gc_in_its_grace_period_and_can_be_restored(tmp_path):
    repo, base, tip = _repo_with_unmerged_branch(tmp_path)
    snap = repo.read_commit(tip).snapshot
    report = repo.gc()
    assert report.deleted_refs_kept == ["refs/heads/high-lr"] and report.expired_reflogs == []
    assert repo.store.blobs.has(tip) and repo.store.blobs.has(snap)
    assert repo.fsck().ok
    # NAME@{0} is the deleted branch's last tip: the branch comes back.
    assert repo.resolve("high-lr@{0}") == tip
    repo.branch("high-lr", "high-lr@{0}")
    assert torch.equal(repo.read_state("high-lr")["w"], torch.arange(64.0))
    assert repo.fsck().ok


def test_expire_now_and_the_configured_period(tmp_path):
    repo, base, tip = _repo_with_unmerged_branch(tmp_path)
    repo.config.set("gc.reflog_expire", 0.5)  # half a day: the deletion is newer
    assert repo.gc().deleted_refs_kept == ["refs/heads/high-lr"]
    dry = repo.gc(dry_run=True, reflog_expire=0)
    assert dry.expired_reflogs == ["refs/heads/high-lr"] and dry.removed_objects >= 2
    assert repo.store.blobs.has(tip)
    report = repo.gc(reflog_expire=0)
    assert report.expired_reflogs == ["refs/heads/high-lr"]
    assert not repo.store.blobs.has(tip) and repo.store.blobs.has(base)
    assert repo.fsck().ok
    assert list(repo.store.refs.reflog("refs/heads/high-lr")) == []


def test_cli_expire(tmp_path):
    repo, base, tip = _repo_with_unmerged_branch(tmp_path)
    repo.close()
    code, out, err = run(tmp_path, "gc")
    assert code == 0 and "kept the commits of deleted high-lr" in out
    code, out, err = run(tmp_path, "reflog", "high-lr")
    assert code == 0 and out.startswith(tip[:12]) and "high-lr@{0}" in out
    code, out, err = run(tmp_path, "gc", "--expire", "soon")
    assert code == 2 and "--expire" in err
    code, out, err = run(tmp_path, "gc", "--expire", "now")
    assert code == 0 and "expired the reflog of deleted refs/heads/high-lr" in out
    code, out, err = run(tmp_path, "show", tip)
    assert code != 0
    code, out, err = run(tmp_path, "config", "--", "gc.reflog_expire", "-1")
    assert code == 19
