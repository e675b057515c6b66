"""gc retention (issue 19 item 5): --keep-last N per branch, --keep-every K from the root,
--dry-run; pruned commits stay in history, marked; kept ones restore bit-identically, even
when their deltas were encoded against a pruned commit."""
from __future__ import annotations

import pytest
from cli_helpers import run
from lossy_history import assert_bits, chained_repo, trajectory

from mvc.repo.pruned import CommitPrunedError
from mvc.repo.repository import Repo


def _reference(repo: Repo, ids: list[str]) -> dict[str, dict]:
    return {cid: repo.read_state(cid) for cid in ids}


def _assert_restores(repo: Repo, reference: dict[str, dict]) -> None:
    for cid, st in reference.items():
        got = repo.read_state(cid)
        for k, v in st.items():
            assert_bits(got[k], v, f"{cid[:8]} {k}")


def test_keep_last_prunes_older_commits_and_keeps_the_rest_exact(tmp_path):
    repo, ids = chained_repo(tmp_path / "r", 10)
    assert repo.read_commit(ids[-1]).chain_depth >= 5  # the kept tip is a delta on pruned ones
    repo.tag("v1", ids[2])
    reference = _reference(repo, ids)
    before = repo.stats().stored_bytes

    dry = repo.gc(dry_run=True, keep_last=3)
    # 10 commits: the 3 newest and the tagged one are kept.
    assert set(dry.pruned) == set(ids[:7]) - {ids[2]}
    assert dry.freed_bytes > 0 and repo.pruned() == set()
    _assert_restores(repo, reference)  # a dry run changes nothing

    report = repo.gc(keep_last=3)
    assert report.pruned == dry.pruned
    assert report.retention_rebased > 0 and report.freed_bytes > 0
    assert repo.pruned() == set(report.pruned)
    assert repo.fsck().ok
    kept = [ids[2], *ids[7:]]
    _assert_restores(repo, {c: reference[c] for c in kept})
    # History is unchanged: same ids, same parents, same metadata.
    assert [c.id for c in repo.log()] == ids[::-1]
    for cid in report.pruned:
        with pytest.raises(CommitPrunedError):
            repo.read_state(cid)
    assert repo.stats().stored_bytes < before
    # A second run prunes nothing more; a later gc keeps everything restorable.
    assert repo.gc(keep_last=3).pruned == []
    repo.gc(max_chain=1)
    assert repo.fsck().ok
    _assert_restores(repo, {c: reference[c] for c in kept})


def test_keep_every_is_anchored_at_the_root_and_stable_as_the_branch_grows(tmp_path):
    repo, ids = chained_repo(tmp_path / "r", 9)
    r = repo.gc(keep_last=2, keep_every=3, dry_run=True)
    # Distances from the root 0..8: 0, 3, 6 (every 3rd) and 7, 8 (newest two) kept.
    assert set(r.pruned) == {ids[i] for i in (1, 2, 4, 5)}
    repo.gc(keep_last=2, keep_every=3)
    for t, state in trajectory(3, seed=1):
        ids.append(repo.commit(state, f"more {t}"))
    r = repo.gc(keep_last=2, keep_every=3)
    # The every-3rd commits stay kept (6 and 9), the former newest two (7, 8) go.
    assert set(r.pruned) == {ids[i] for i in (7, 8)}
    assert repo.pruned() == {ids[i] for i in (1, 2, 4, 5, 7, 8)}
    assert repo.fsck().ok
    for i in (0, 3, 6, 9, 10, 11):
        repo.read_state(ids[i])


def test_branch_tips_and_other_branches_keep_their_commits(tmp_path):
    repo, ids = chained_repo(tmp_path / "r", 6)
    repo.branch("old", ids[1])
    repo.switch("side", create=True)
    side = [repo.commit(s, f"side {t}") for t, s in trajectory(4, seed=2)]
    repo.switch("main")
    r = repo.gc(keep_last=2)
    pruned = set(r.pruned)
    assert ids[1] not in pruned                    # a branch tip
    assert not pruned & {ids[4], ids[5]}           # main's newest two
    assert not pruned & {side[2], side[3], ids[5]}  # side's newest two (ids[5] is its fork point)
    assert ids[0] not in pruned                    # one of old's newest two
    assert {ids[2], ids[3], side[0], side[1]} == pruned
    assert repo.fsck().ok


def test_cli_retention_log_and_checkout(tmp_path):
    repo, ids = chained_repo(tmp_path, 5)
    repo.close()
    code, out, err = run(tmp_path, "gc", "--keep-last", "2", "--dry-run")
    assert code == 0, err
    assert "gc: would prune 3 commits:" in out and ids[0][:12] in out
    code, out, err = run(tmp_path, "gc", "--keep-last", "2")
    assert code == 0 and "gc: pruned 3 commits" in out
    code, out, _ = run(tmp_path, "log", "--oneline")
    lines = out.splitlines()
    assert len(lines) == 5 and all("[pruned]" in ln for ln in lines[2:]) and "[pruned]" not in lines[0]
    code, out, err = run(tmp_path, "checkout", ids[0][:12], "-o", str(tmp_path / "x.pt"))
    assert code == CommitPrunedError.exit_code == 170
    assert err.count("\n") == 1 and "pruned" in err and not (tmp_path / "x.pt").exists()
    code, out, err = run(tmp_path, "show", ids[0][:12])
    assert code == 0 and "Pruned:" in out
    code, out, err = run(tmp_path, "stats")
    assert code == 0 and out.count("pruned") == 3
    code, out, err = run(tmp_path, "gc", "--keep-last", "0")
    assert code != 0 and "--keep-last" in err
