"""Child process of tests/repo/test_device_boundaries.py: one lossy commit from a fresh process.

    python device_commit_worker.py JOB

JOB is a JSON file: {"repo", "device", "via": "repo" | "tracker", "phase": "first" | "next",
"out"}.  "first" trains a small MLP with Adam on `device` and commits it (the repository's
commit.* config says how: a fixed lossy config, moments compressed); "next" is the resume after
a failure: it restores HEAD onto `device`, trains on and commits again, so the new commit's
parent is read from the store and the disk level cache, never from this process's memory.
`via` commits through `Repo.commit` or through the `Tracker` (its restore and foreground commit).

OUT (a torch.save file) receives {"commit": id, "state": the exact state committed (on the
CPU), "read": this process's own restore of the commit (its in-memory level cache is warm),
"read_device": the same restored onto `device`, brought back to the CPU}.
"""
from __future__ import annotations

import json
import sys

import torch


def model_and_optimizer(device: str) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 64),
                                torch.nn.ReLU(), torch.nn.Linear(64, 10)).to(device)
    return model, torch.optim.Adam(model.parameters(), 1e-2)


def train(model: torch.nn.Module, opt: torch.optim.Optimizer, steps: int, seed: int,
          after_backward=None) -> None:
    dev = next(model.parameters()).device
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(256, 64, generator=g).to(dev)
    y = torch.randint(0, 10, (256,), generator=g).to(dev)
    for _ in range(steps):
        loss = torch.nn.functional.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        if after_backward is not None:
            after_backward()
        opt.step()


def main(job_path: str) -> None:
    from mvc.integrations import Tracker, clone_to_cpu
    from mvc.repo.repository import Repo

    with open(job_path) as fh:
        job = json.load(fh)
    torch.set_num_threads(1)
    device, first = job["device"], job["phase"] == "first"
    model, opt = model_and_optimizer(device)
    with Repo(job["repo"]) as repo:
        tracker = Tracker(repo, model, opt) if job["via"] == "tracker" else None
        if not first:   # restart, restore, train, commit
            if tracker is not None:
                tracker.restore("HEAD")
            else:
                state = repo.read_state("HEAD", map_location=device)
                model.load_state_dict(state["model"])
                opt.load_state_dict(state["optimizer"])
            assert next(model.parameters()).device.type == torch.device(device).type
        train(model, opt, 20 if first else 5, seed=1 if first else 2,
              after_backward=tracker.after_backward if tracker is not None else None)
        state = {"model": model.state_dict(), "optimizer": opt.state_dict()}
        exact = clone_to_cpu(state)
        if tracker is not None:
            cid = tracker.commit(job["phase"])
        else:
            cid = repo.commit(state, job["phase"])
        out = {"commit": cid, "state": exact, "read": repo.read_state(cid),
               "read_device": clone_to_cpu(repo.read_state(cid, map_location=device))}
    torch.save(out, job["out"])


if __name__ == "__main__":
    main(sys.argv[1])
