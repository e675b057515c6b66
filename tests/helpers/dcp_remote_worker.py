"""Gloo ranks for tests/dcp/test_dcp_remote.py: DCP saves and loads straight to a remote URL.

A zygote: it imports torch and mvc once, then for each JSON line on stdin forks one process
per rank of a job, prints ``pids P0 P1 ...``, and on the next line (``reap``) waits for them
and prints ``exit S0 S1 ...`` (wait statuses).  Until reaped a finished rank stays a zombie, so
the test's SIGKILL can never reach a process that reused its pid.  Nothing is opened before
the fork (no process group, no S3 client), so each rank starts clean.

Every rank runs in a temporary working directory of its own, and the ranks share no
directory: they meet over TCP (``MASTER_ADDR`` / ``MASTER_PORT``) and keep the checkpoint in
the remote.  What a rank reports goes to ``job["out"]/rank<R>.pt`` (the test's channel).

Jobs (``job["op"]``):

* ``save``: two training steps, a lossless save (commit ``c1``), a step, a lossy save with a
  fixed config (``c2``); then a fresh model loads ``c1`` at the same world size (its shards
  must equal the saved ones bit for bit) and ``c2``.  Reports the full states saved and
  loaded (rank 0) and the mismatches.
* ``load``: a fresh model loads ``c1`` and ``c2`` (`job["revs"]`) at this world size.
* ``step``: one save of a model trained ``job["seed"]`` steps; writes ``ready`` in `out` right
  before `dcp.save` (the kill test's clock starts there).
* ``race``: two jobs of one process each (no process group), "job0" and "job1", saving
  different states to one branch; each one's `finish` waits until the other has planned too
  (``planned-<name>`` files in `out`), so both plan from the same head.
"""
from __future__ import annotations

import json
import os
import sys
import tempfile
import time
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import set_state_dict

from dcp_worker import _equal, build, full, local, state_of, train

from mvc.dcp import MvcStorageReader, MvcStorageWriter, save

#: The lossy save's settings: what a repository's config would say (a remote holds none).
FIXED = {"commit.mode": "fixed",
         "commit.quant": {"bins": 16, "prune": 0.1, "protect": 0.005}}


def loaded(url: str, rev: str, seed: int, cache: str | None = None
           ) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    model, opt = build(seed)
    state = state_of(model, opt)
    dcp.load(state, storage_reader=MvcStorageReader(url, rev=rev, cache_dir=cache))
    set_state_dict(model, opt, model_state_dict=state["model"], optim_state_dict=state["optim"])
    return model, opt


def job_save(job: dict, report: dict) -> None:
    url = job["url"]
    model, opt = build(0)
    train(model, opt, 2, 0)
    state = state_of(model, opt)
    saved1 = local(state)
    report["c1"] = save(state, MvcStorageWriter(url, message="lossless", lossless=True, step=2))
    report["full1"] = full(model, opt)
    train(model, opt, 1, 1)
    w = MvcStorageWriter(url, message="lossy", step=3, config=FIXED, cache_dir="cache")
    report["c2"] = save(state_of(model, opt), w)
    report["config2"] = w.last_config
    report["full2_saved"] = full(model, opt)
    m1, o1 = loaded(url, report["c1"], 7)
    got = local(state_of(m1, o1))
    report["mismatch1"] = [k for k in saved1 if not _equal(saved1[k], got.get(k))]
    report["load1"] = full(m1, o1)
    m2, o2 = loaded(url, report["c2"], 8, cache="cache")
    report["load2"] = full(m2, o2)


def job_load(job: dict, report: dict) -> None:
    for tag, rev in job["revs"].items():
        model, opt = loaded(job["url"], rev, 9)
        report[tag] = full(model, opt)


def job_step(job: dict, report: dict) -> None:
    model, opt = build(0)
    train(model, opt, 1, job["seed"])
    state = state_of(model, opt)
    lossy = job["seed"] % 2 == 1
    w = MvcStorageWriter(job["url"], message=f"run {job['seed']}", step=job["seed"],
                         lossless=not lossy, config=FIXED if lossy else None)
    if dist.get_rank() == 0:
        Path(job["out"], "ready").write_text("")
    report["commit"] = save(state, w)


class RacingWriter(MvcStorageWriter):
    """Publishes only once the other job of the race has planned from the same head."""

    def __init__(self, *args, name: str, other: str, out: str, **kwargs) -> None:  # type: ignore[no-untyped-def]
        super().__init__(*args, **kwargs)
        self.name, self.other, self.out = name, other, out

    def finish(self, metadata, results):  # type: ignore[no-untyped-def]
        Path(self.out, f"planned-{self.name}").write_text("")
        deadline = time.time() + 60
        while not Path(self.out, f"planned-{self.other}").exists() and time.time() < deadline:
            time.sleep(0.02)
        return super().finish(metadata, results)


def job_race(job: dict, report: dict) -> None:
    me = report["rank"]
    torch.manual_seed(100 + me)
    model = torch.nn.Linear(64, 64)
    state = {"model": {k: v.detach().clone() for k, v in model.state_dict().items()}}
    w = RacingWriter(job["url"], message=f"job{me}", lossless=True, name=f"job{me}",
                     other=f"job{1 - me}", out=job["out"])
    try:
        report["commit"] = save(state, w)
    except BaseException as exc:  # noqa: BLE001 - DCP's CheckpointException is a BaseException
        failures = getattr(exc, "failures", {})
        report["error"] = type(exc).__name__
        report["causes"] = [type(e).__name__ for e, _ in failures.values()]


def rank_main(job: dict, rank: int) -> None:
    # under the test's own folder: a rank the test kills leaves it there, not in /tmp
    with tempfile.TemporaryDirectory(prefix=f"mvc-rank{rank}-", dir=job["out"]) as cwd:
        os.chdir(cwd)   # a working directory of its own
        try:
            _rank_main(job, rank)
        finally:
            os.chdir(Path(cwd).parent)


def _rank_main(job: dict, rank: int) -> None:
    world = job["world"]
    report: dict = {"rank": rank}
    if job["op"] != "race":
        os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(job["port"]))
        dist.init_process_group("gloo", rank=rank, world_size=world,
                                timeout=timedelta(seconds=job.get("timeout", 60)))
    {"save": job_save, "load": job_load, "step": job_step, "race": job_race}[job["op"]](job, report)
    torch.save(report, Path(job["out"], f"rank{rank}.pt"))


def main() -> None:
    torch.set_num_threads(1)
    print("ready", flush=True)
    for line in sys.stdin:
        job = json.loads(line)
        pids = []
        for rank in range(job["world"]):
            pid = os.fork()
            if pid == 0:
                code = 0
                try:
                    rank_main(job, rank)
                except BaseException as exc:  # noqa: BLE001 - reported through the exit status
                    print(f"rank {rank} failed: {exc!r}", file=sys.stderr, flush=True)
                    code = 1
                sys.stdout.flush()
                os._exit(code)   # no orderly shutdown: a peer may be gone
            pids.append(pid)
        print("pids " + " ".join(map(str, pids)), flush=True)
        sys.stdin.readline()
        statuses = [os.waitpid(pid, 0)[1] for pid in pids]
        print("exit " + " ".join(map(str, statuses)), flush=True)


if __name__ == "__main__":
    main()
