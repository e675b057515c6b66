"""`dcp.async_save` through `MvcStorageWriter` vs torch's `FileSystemWriter` (issue 28, item 2).

One process (no process group), an MLP + AdamW state.  For each writer, alternately `--reps`
times (a training step between saves, so each save is a new state):

* blocking: how long `dcp.async_save` holds the training loop (DCP's staging copy, then it
  returns; the save runs on a background thread);
* total: until the returned future resolves (the save done: for mvc, the commit landed);
* sync: `dcp.save` of the same kind, for scale.

Writers: mvc lossless, mvc lossy (the sharded path's proxy search, epsilon 0.05), torch's
FileSystemWriter to a fresh directory.  Reported: the median of each, and the ratios of
mvc's to FileSystemWriter's in the same run.

Usage: python benchmarks/bench_dcp_async.py [--json] [--reps R] [--hidden H]
"""
from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
import warnings
from pathlib import Path
from typing import Any, Callable

import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint import FileSystemWriter
from torch.distributed.checkpoint.state_dict import get_state_dict

from mvc.dcp import MvcStorageWriter
from mvc.repo.repository import Repo


def build(hidden: int) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(256, hidden), torch.nn.ReLU(),
                                torch.nn.Linear(hidden, hidden), torch.nn.ReLU(),
                                torch.nn.Linear(hidden, 256))
    return model, torch.optim.AdamW(model.parameters(), lr=1e-3)


def step(model: torch.nn.Module, opt: torch.optim.Optimizer, g: torch.Generator) -> None:
    x = torch.randn(64, 256, generator=g)
    loss = (model(x) - x).pow(2).mean()
    opt.zero_grad()
    loss.backward()
    opt.step()


def state_of(model: torch.nn.Module, opt: torch.optim.Optimizer) -> dict[str, Any]:
    msd, osd = get_state_dict(model, opt)
    return {"model": msd, "optim": osd}


def run(reps: int, hidden: int) -> dict[str, Any]:
    model, opt = build(hidden)
    g = torch.Generator().manual_seed(1)
    for _ in range(3):
        step(model, opt, g)
    raw = sum(t.numel() * t.element_size() for t in model.state_dict().values()) * 3
    root = Path(tempfile.mkdtemp(prefix="bench_dcp_async_"))
    Repo.init(root / "repo").close()
    counter = iter(range(1_000_000))

    writers: dict[str, Callable[[], Any]] = {
        "mvc_lossless": lambda: MvcStorageWriter(root / "repo", message=f"s{next(counter)}",
                                                 lossless=True),
        "mvc_lossy": lambda: MvcStorageWriter(root / "repo", message=f"s{next(counter)}",
                                              epsilon=0.05),
        "filesystem": lambda: FileSystemWriter(root / f"fs{next(counter)}"),
    }
    times: dict[str, dict[str, list[float]]] = {
        k: {"blocking": [], "total": [], "sync": []} for k in writers}
    for _ in range(reps):
        for name, make in writers.items():
            step(model, opt, g)
            state = state_of(model, opt)
            t0 = time.perf_counter()
            fut = dcp.async_save(state, storage_writer=make())
            t1 = time.perf_counter()
            fut.result()
            t2 = time.perf_counter()
            times[name]["blocking"].append(t1 - t0)
            times[name]["total"].append(t2 - t0)
            step(model, opt, g)
            state = state_of(model, opt)
            t0 = time.perf_counter()
            dcp.save(state, storage_writer=make())
            times[name]["sync"].append(time.perf_counter() - t0)
    med = {k: {m: statistics.median(v) for m, v in d.items()} for k, d in times.items()}
    fs = med["filesystem"]
    ratios = {k: {m: med[k][m] / fs[m] for m in fs} for k in ("mvc_lossless", "mvc_lossy")}
    return {"hidden": hidden, "state_bytes": raw, "reps": reps, "median_s": med,
            "ratio_vs_filesystem": ratios}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--hidden", type=int, default=1024)
    args = ap.parse_args()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")   # DCP's "no process group: one process" warning
        result = run(args.reps, args.hidden)
    if args.json:
        print(json.dumps(result, indent=2))
        return
    print(f"state: MLP hidden {result['hidden']} + AdamW, {result['state_bytes'] / 1e6:.1f} MB, "
          f"median of {result['reps']} reps, one process")
    print(f"{'writer':14s} {'blocking s':>11s} {'total s':>9s} {'sync s':>8s}")
    for name, m in result["median_s"].items():
        print(f"{name:14s} {m['blocking']:11.4f} {m['total']:9.4f} {m['sync']:8.4f}")
    for name, r in result["ratio_vs_filesystem"].items():
        print(f"{name} / filesystem: blocking x{r['blocking']:.2f}, total x{r['total']:.2f}, "
              f"sync x{r['sync']:.2f}")


if __name__ == "__main__":
    main()
