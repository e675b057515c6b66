"""A sharded lossy save in which one rank runs out of device memory choosing the quantization
(issue 27): every rank chooses again on host copies of its shards (`mvc.dcp.writer._decide`),
and the commit is the one a save without the error makes. Real ranks (gloo, two processes)
on the device path, rank 1's first sketch pass raising torch's out-of-memory error."""
from __future__ import annotations

from pathlib import Path

from rank_procs import run_ranks, with_helpers_path

from mvc.repo.repository import Repo


def _records(root: Path, cid: str) -> dict:
    with Repo(root) as repo:
        return {r.name: (r.codec, r.chunks, r.meta)
                for r in repo.read_snapshot(repo.read_commit(cid).snapshot).tensors}


def test_a_rank_out_of_device_memory_makes_every_rank_choose_on_the_host(tmp_path):
    for name in ("want", "got"):
        Repo.init(tmp_path / name).close()
    reports = run_ranks("dcp_oom_worker.py", ["2", str(tmp_path)],
                        lambda r: tmp_path / f"rank{r}.json", env=with_helpers_path())
    assert [r["failed"] for r in reports] == [0, 1]
    assert all(r["warned"] for r in reports)           # every rank retried, and said so
    assert reports[0]["got"] is not None                 # the coordinator published it
    want = _records(tmp_path / "want", reports[0]["want"])
    got = _records(tmp_path / "got", reports[0]["got"])
    assert any(rec[0].startswith("q") for rec in want.values())   # a lossy commit
    assert got == want
