"""One rank of tests/search/test_dcp_search.py: the config search spread over 2 gloo ranks.

    python search_worker.py RANK WORLD DIR

Both ranks hold the same state (data-parallel replicas).  Rank 0 leads two searches (a
first one, then one from a previous config: the neighbourhood search) in a
`mvc.search.ranks()` block, and a third whose bound only the refined cube meets, rank 1
serves their trials; rank 0 then runs both searches
alone, and reports all four results (DIR/rank0.pt); rank 1 reports what it served.
Then both ranks commit the same model through a `Tracker` (DIR/repo), which spreads
`Repo.commit`'s search over them; each reports the commit id its `commit` returned; and
commit a DistributedDataParallel model with BatchNorm buffers the same way (DIR/ddp_repo),
once in the foreground and once in the background.
"""
from __future__ import annotations

import sys
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist

import mvc.search
from mvc.quant import QuantConfig


#: A proxy bound under 64 bins' error on `state()` but over 128 bins' (the refined cube).
REFINE_EPS = 0.01


def state() -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    return {"fc1.weight": torch.randn(128, 96, generator=g) * 0.1,
            "fc2.weight": torch.randn(96, 128, generator=g) * 0.05,
            "fc2.bias": torch.randn(96, generator=g)}


def summary(res: mvc.search.SearchResult) -> dict:
    q = res.quality.to_json()
    return {"config": res.config.to_dict() if res.config else None, "trials": len(q["trials"]),
            "rounds": q.get("rounds"), "ranks": q.get("ranks"), "mode": q["mode"],
            "log": q["trials"], "refined": q.get("refined")}


def tracker_commit(path: Path) -> dict:
    from mvc.integrations.tracker import Tracker
    from mvc.repo.repository import Repo

    torch.manual_seed(0)   # the same replica on both ranks, as DDP keeps them
    model = torch.nn.Sequential(torch.nn.Linear(64, 96), torch.nn.ReLU(), torch.nn.Linear(96, 8))
    opt = torch.optim.Adam(model.parameters(), 1e-2)
    g = torch.Generator().manual_seed(1)
    x, y = torch.randn(64, 64, generator=g), torch.randint(0, 8, (64,), generator=g)
    for _ in range(3):
        loss = torch.nn.functional.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()

    def quality(m: torch.nn.Module) -> float:   # the same batch on every rank
        with torch.no_grad():
            return float(torch.nn.functional.cross_entropy(m(x), y))

    with Repo(path) as repo:
        tracker = Tracker(repo, model, opt, quality=quality, epsilon=0.02)
        cid = tracker.commit("step 3")
        return {"commit": cid, "config": tracker.history[-1]["config"],
                "quality": tracker.history[-1].get("quality")}


def ddp_commits(path: Path) -> dict:
    """A DistributedDataParallel model with buffers (BatchNorm), committed by a Tracker with a
    quality function in the foreground and then in the background: DDP's forward would
    broadcast the buffers on the training group while the ranks evaluate different trials."""
    from mvc.integrations.tracker import Tracker
    from mvc.repo.repository import Repo

    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(64, 96), torch.nn.BatchNorm1d(96), torch.nn.ReLU(),
                              torch.nn.Linear(96, 8))
    model = torch.nn.parallel.DistributedDataParallel(net)
    opt = torch.optim.Adam(model.parameters(), 1e-2)
    g = torch.Generator().manual_seed(1)
    x, y = torch.randn(64, 64, generator=g), torch.randint(0, 8, (64,), generator=g)
    seen: list[type] = []

    def quality(m: torch.nn.Module) -> float:
        seen.append(type(m))
        with torch.no_grad():
            return float(torch.nn.functional.cross_entropy(m(x), y))

    with Repo(path) as repo:
        tracker = Tracker(repo, model, opt, quality=quality, epsilon=0.02)
        out: dict = {}
        for mode in ("foreground", "background"):
            for _ in range(2):
                loss = torch.nn.functional.cross_entropy(model(x), y)
                opt.zero_grad()
                loss.backward()
                tracker.after_backward()
                opt.step()
            if mode == "foreground":
                cid = tracker.commit(mode)
            else:
                cid = tracker.commit(mode, background=True).result(timeout=120)
            out[mode] = {"commit": cid, "config": tracker.history[-1]["config"],
                         "keys": sorted(model.state_dict())}
        out["evaluated"] = sorted({t.__name__ for t in seen})
        return out


def main(rank: int, world: int, root: Path) -> None:
    dist.init_process_group("gloo", init_method=f"file://{root / 'rendezvous'}", rank=rank,
                            world_size=world, timeout=timedelta(seconds=60))
    tensors = state()
    previous = QuantConfig(bins=8, prune=0.1, protect=0.005)
    report: dict = {}
    if rank == 0:
        with mvc.search.ranks():
            report["first"] = summary(mvc.search.find_config(tensors))
            report["next"] = summary(mvc.search.find_config(tensors, previous=previous))
            # a bound the default cube cannot meet: the leader refines, the worker follows
            report["refined"] = summary(mvc.search.find_config(tensors, epsilon=REFINE_EPS))
        dist.broadcast_object_list(["finished"], src=0)
        report["first_alone"] = summary(mvc.search.find_config(tensors))
        report["next_alone"] = summary(mvc.search.find_config(tensors, previous=previous))
        report["refined_alone"] = summary(mvc.search.find_config(tensors, epsilon=REFINE_EPS))
    else:
        report["after"] = mvc.search.serve_trials(tensors)
    report["tracker"] = tracker_commit(root / "repo")
    torch.save(report, root / f"rank{rank}.pt")
    torch.save(ddp_commits(root / "ddp_repo"), root / f"ddp{rank}.pt")
    dist.destroy_process_group()


if __name__ == "__main__":
    main(int(sys.argv[1]), int(sys.argv[2]), Path(sys.argv[3]))
