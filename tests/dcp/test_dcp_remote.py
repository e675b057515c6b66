"""DCP saves and loads straight to object storage (issue 28 item 1): `MvcStorageWriter("s3://...")`.

Real gloo processes (tests/helpers/dcp_remote_worker.py), each rank in a temporary working
directory of its own, no directory shared: they meet over TCP and keep the checkpoint in one
bucket of the moto S3 server.  Shown here:

* 2 and 4 ranks save twice (lossless, then lossy with a fixed config given as `config=`);
  loads at world size 1, 2 and 4 restore the same values (bit for bit for the lossless
  commit, and the lossy commit's values as the clone's checkout restores them); ``mvc clone``
  of the bucket fscks clean;
* SIGKILL of a random rank at a random moment of a save: the branch is where it was (or at
  the new commit, when the kill came after the commit point), a clone fscks clean, and the
  next save from fresh processes lands on top;
* two jobs saving to one branch from the same head: exactly one wins, the other gets
  `RefConflictError`.
"""
from __future__ import annotations

import json
import os
import random
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
from locations import HELPERS, ROOT
from remote_helpers import S3Server

from mvc.dcp import MvcStorageReader, MvcStorageWriter
from mvc.dcp.remote import RemoteOptionError
from mvc.remote.porcelain import clone
from mvc.repo.repository import Repo
from mvc.store.objstore import open_remote


class Zygote:
    """The worker's zygote: forks the ranks of each job from one process that imported torch
    and mvc once (process start-up would be most of each kill run's time)."""

    def __init__(self) -> None:
        env = dict(os.environ, PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1")
        self.proc = subprocess.Popen([sys.executable, str(HELPERS / "dcp_remote_worker.py")],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                                     env=env)
        assert self._line() == "ready"

    def _line(self) -> str:
        assert self.proc.stdout is not None
        return self.proc.stdout.readline().strip()

    def _send(self, line: str) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(line + "\n")
        self.proc.stdin.flush()

    def start(self, job: dict) -> list[int]:
        Path(job["out"]).mkdir(parents=True, exist_ok=True)
        job.setdefault("port", free_port())
        self._send(json.dumps(job))
        return [int(p) for p in self._line().split()[1:]]

    def reap(self) -> list[int]:
        self._send("reap")
        return [int(s) for s in self._line().split()[1:]]

    def run(self, job: dict) -> list[dict]:
        """Run a job to its end; every rank's report (all must exit 0)."""
        self.start(job)
        statuses = self.reap()
        assert statuses == [0] * len(statuses), statuses
        return [torch.load(Path(job["out"], f"rank{r}.pt"), weights_only=False)
                for r in range(len(statuses))]

    def close(self) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.close()
        self.proc.wait(30)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def s3() -> S3Server:
    """The session's moto S3 server (started on first use)."""
    return S3Server.shared()


@pytest.fixture(scope="module")
def zygote():
    S3Server.shared()   # its AWS environment first: the ranks inherit the zygote's
    z = Zygote()
    yield z
    z.close()


def flat(state: dict) -> dict:
    from torch.distributed.checkpoint._nested_dict import flatten_state_dict
    return flatten_state_dict(state)[0]


def assert_same(a: object, b: object) -> None:
    fa, fb = flat(a), flat(b)   # type: ignore[arg-type]
    assert sorted(fa) == sorted(fb)
    for k, v in fa.items():
        if isinstance(v, torch.Tensor):
            assert v.dtype == fb[k].dtype and v.shape == fb[k].shape, k
            assert torch.equal(v, fb[k]), k
        else:
            assert v == fb[k], k


def load_one_process(url: str, rev: str) -> dict:
    """dcp.load into an unsharded model in this process (no process group): world size 1."""
    torch.manual_seed(5)
    model = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(),
                                torch.nn.Linear(128, 64))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    msd, osd = get_state_dict(model, opt)
    state = {"model": msd, "optim": osd}
    dcp.load(state, storage_reader=MvcStorageReader(url, rev=rev))
    set_state_dict(model, opt, model_state_dict=state["model"], optim_state_dict=state["optim"])
    msd, osd = get_state_dict(model, opt)
    return {"model": msd, "optim": osd}


def branch(url: str) -> str | None:
    remote = open_remote(url)
    try:
        return remote.refs.read_ref("refs/heads/main")
    finally:
        remote.close()


def clone_fsck(url: str, dest: Path) -> Repo:
    """`mvc clone` of the bucket, fsck'd clean; the clone is the caller's to close."""
    repo = Repo(clone(url, dest).path)
    assert repo.fsck().problems == []
    return repo


@pytest.mark.parametrize("world", [2, 4])
def test_ranks_save_twice_and_every_world_size_loads_the_same(zygote, s3, tmp_path, world):
    url = s3.fresh_url()
    reports = zygote.run({"op": "save", "world": world, "url": url, "out": str(tmp_path / "save")})
    r0 = reports[0]
    c1, c2 = r0["c1"], r0["c2"]
    assert c1 and c2 and c1 != c2
    assert all(r["c1"] == c1 and r["c2"] == c2 for r in reports)   # one commit per save
    assert all(r["mismatch1"] == [] for r in reports)               # same world: shards bit-exact
    assert all(r["config2"] == r0["config2"] for r in reports) and r0["config2"]["bins"] == 16
    assert branch(url) == c2
    # world size W (the savers themselves), 1 (this process) and the other of 2 / 4
    assert_same(r0["load1"], r0["full1"])
    assert_same(load_one_process(url, c1), r0["full1"])
    assert_same(load_one_process(url, c2), r0["load2"])
    other = {2: 4, 4: 2}[world]
    loads = zygote.run({"op": "load", "world": other, "url": url, "out": str(tmp_path / "load"),
                        "revs": {"a": c1, "b": c2}})
    assert_same(loads[0]["a"], r0["full1"])
    assert_same(loads[0]["b"], r0["load2"])
    # the lossy restore is the quantized state, within what the fixed config loses
    w_saved = flat(r0["full2_saved"])["model.0.weight"]
    w_loaded = flat(r0["load2"])["model.0.weight"]
    assert not torch.equal(w_saved, w_loaded)
    assert (w_loaded - w_saved).norm() / w_saved.norm() < 0.1
    # a clone of the bucket: both commits, fsck clean, its checkout restores the same values
    repo = clone_fsck(url, tmp_path / "clone")
    try:
        assert [c.id for c in repo.log()] == [c2, c1]
        assert repo.read_commit(c2).quant["bins"] == 16 and repo.read_commit(c1).quant is None
        got = flat(repo.read_state(c2))
        for k, v in flat(r0["load2"]).items():
            if k.startswith("model.") and isinstance(v, torch.Tensor):
                assert torch.equal(got[k], v), k
    finally:
        repo.close()


def test_racing_jobs_on_one_branch_exactly_one_wins(zygote, s3, tmp_path):
    url = s3.fresh_url()
    reports = zygote.run({"op": "race", "world": 2, "url": url, "out": str(tmp_path / "race")})
    won = [r for r in reports if r.get("commit")]
    lost = [r for r in reports if "error" in r]
    assert len(won) == 1 and len(lost) == 1, reports
    assert "RefConflictError" in lost[0]["causes"]
    assert branch(url) == won[0]["commit"]
    repo = clone_fsck(url, tmp_path / "clone")
    try:
        assert [c.id for c in repo.log()] == [won[0]["commit"]]
    finally:
        repo.close()


def exited(pid: int) -> bool:
    """Whether the zygote's child `pid` has exited (a zombie until the zygote reaps it)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except FileNotFoundError:
        return True


def wait_for(path: Path, timeout: float = 60.0) -> None:
    deadline = time.time() + timeout
    while not path.exists():
        assert time.time() < deadline, f"{path} never appeared"
        time.sleep(0.005)


def _kill_runs(zygote: Zygote, s3: S3Server, tmp: Path, runs: int, seed: int) -> dict:
    """`runs` saves on 2 ranks, each SIGKILLed (a random rank, at a random moment between
    `dcp.save`'s start and the time a whole save takes) and checked; returns how many left
    the branch where it was / moved it."""
    rng = random.Random(seed)
    url = s3.fresh_url()
    # a first save, timed from the moment dcp.save begins to the ranks' exit: kills land in it
    first = zygote.start({"op": "step", "world": 2, "url": url, "seed": 0,
                          "out": str(tmp / "first")})
    wait_for(tmp / "first" / "ready")
    t0 = time.time()
    while not all(map(exited, first)):
        time.sleep(0.01)
    span = time.time() - t0
    assert zygote.reap() == [0, 0]
    head = branch(url)
    assert head is not None
    outcome = {"unmoved": 0, "moved": 0, "span_ms": int(span * 1000)}
    for i in range(1, runs + 1):
        out = tmp / f"kill{i}"
        pids = zygote.start({"op": "step", "world": 2, "url": url, "seed": 2 * i - 1,
                             "out": str(out), "timeout": 10})
        wait_for(out / "ready")   # dcp.save begins
        time.sleep(rng.uniform(0.0, span))
        os.kill(rng.choice(pids), signal.SIGKILL)   # a zombie until reaped: never another process
        deadline = time.time() + 20
        while time.time() < deadline and not all(map(exited, pids)):
            time.sleep(0.1)
        for pid in pids:   # a survivor still waiting on its dead peer
            os.kill(pid, signal.SIGKILL)
        zygote.reap()
        now = branch(url)
        repo = clone_fsck(url, tmp / f"clone{i}")
        try:
            if now == head:
                outcome["unmoved"] += 1
            else:   # killed after the commit point: the new commit, on top of the old head
                assert repo.read_commit(now).parents == [head]
                outcome["moved"] += 1
        finally:
            repo.close()
        # the next save, from fresh processes, lands on top
        nxt = zygote.run({"op": "step", "world": 2, "url": url, "seed": 2 * i,
                          "out": str(tmp / f"next{i}")})
        assert nxt[0]["commit"] == nxt[1]["commit"] == branch(url)
        repo = clone_fsck(url, tmp / f"after{i}")
        try:
            assert repo.read_commit(nxt[0]["commit"]).parents == [now]
        finally:
            repo.close()
        head = nxt[0]["commit"]
    return outcome


def test_killed_ranks_leave_the_branch_and_the_next_save_works(zygote, s3, tmp_path):
    out = _kill_runs(zygote, s3, tmp_path, runs=3, seed=1)
    assert out["unmoved"] + out["moved"] == 3


@pytest.mark.slow
def test_twenty_kills_at_random_moments(zygote, s3, tmp_path):
    out = _kill_runs(zygote, s3, tmp_path, runs=20, seed=28)
    print(f"20 SIGKILLs: {out}")
    assert out["unmoved"] + out["moved"] == 20


def test_remote_options_need_a_remote(tmp_path):
    Repo.init(tmp_path / "r").close()
    with pytest.raises(RemoteOptionError):
        MvcStorageWriter(tmp_path / "r", message="m", branch="dev")
    with pytest.raises(RemoteOptionError):
        MvcStorageReader(tmp_path / "r", cache_dir=tmp_path / "c")


def test_a_remote_writer_pickles_by_url(tmp_path):
    """DCP's process-based async executor ships the writer: the remote travels by URL."""
    import pickle

    url = (tmp_path / "remote").as_uri()
    w = MvcStorageWriter(url, message="m", branch="exp", config={"commit.mode": "lossless"})
    back = pickle.loads(pickle.dumps(w))
    assert back.checkpoint_id == url and back._repo.branch == "exp"
    assert back._repo.settings == {"commit.mode": "lossless"}


def test_a_one_process_save_to_file_url_clones_and_loads(tmp_path):
    """file:// remotes too, and a save to a directory holding nothing yet (its first)."""
    (tmp_path / "remote").mkdir()
    url = (tmp_path / "remote").as_uri()
    torch.manual_seed(0)
    state = {"model": {"w": torch.randn(300, 300), "b": torch.randn(300)}, "step": 3}
    w = MvcStorageWriter(url, message="one", lossless=True, branch="exp")
    dcp.save(state, storage_writer=w)
    back = {"model": {"w": torch.zeros(300, 300), "b": torch.zeros(300)}, "step": 0}
    dcp.load(back, storage_reader=MvcStorageReader(url, rev="exp"))
    assert torch.equal(back["model"]["w"], state["model"]["w"]) and back["step"] == 3
    repo = clone_fsck(url, tmp_path / "clone")
    try:
        assert repo.resolve("origin/exp") == w.commit_id
    finally:
        repo.close()
