"""Distributed mvc (issue 17): the parallel config search and sharded commits, measured in one run.

Two gloo ranks on CPU (this script started twice, `--rank`), then the parent:

1. search: the same state on both ranks (data-parallel replicas).  Rank 0 runs
   `find_config` alone and then leading a `mvc.search.ranks()` search that rank 1 serves,
   alternately `--reps` times; reported: trials (1 rank) vs rounds (2 ranks), the minimum
   wall time of each and their ratio, for a first (exhaustive) search and for a
   neighbourhood search from a config that is too aggressive (it has to walk), both with the
   proxy gate, and for a first search judged by a quality function (the model's loss on
   `--eval` samples: a trial then costs an evaluation, as in training).  Each rank
   gets `--threads` threads (torch and mvc's native pool; default 1), so one rank stands
   for one device: with 1 thread the 1-rank search uses one core and the 2-rank search
   two.  On a small machine shared with other work, wall time is noisy: the rounds are the
   figure that carries over to N GPUs;
2. size: an FSDP2 (`fully_shard`) model + AdamW saved with `dcp.save` through
   `MvcStorageWriter` from 2 ranks (lossless, and a fixed quantization config), against
   the same state committed from one process (`Repo.commit`, same settings): stored bytes
   of each commit and their ratio (a sharded commit has one record per shard: its own
   codec header, Huffman tables, centroids).

Usage: python benchmarks/bench_distributed.py [--json] [--reps R] [--hidden H] [--threads T]
                                             [--eval N]
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from datetime import timedelta
from pathlib import Path

import torch

FIXED = {"bins": 16, "prune": 0.1, "protect": 0.005}


def model(hidden: int) -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(256, hidden), torch.nn.ReLU(),
                               torch.nn.Linear(hidden, hidden), torch.nn.ReLU(),
                               torch.nn.Linear(hidden, 256))


def train(m: torch.nn.Module, opt: torch.optim.Optimizer, steps: int) -> None:
    g = torch.Generator().manual_seed(1)
    for _ in range(steps):
        x = torch.randn(64, 256, generator=g)
        loss = (m(x) - x).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()


# ------------------------------------------------------------------ one rank
def rank_main(rank: int, root: Path, hidden: int, reps: int, n_eval: int) -> None:
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict
    from torch.distributed.fsdp import fully_shard

    import mvc.search
    from mvc.dcp import MvcStorageWriter
    from mvc.quant import QuantConfig

    dist.init_process_group("gloo", init_method=f"file://{root / 'rendezvous'}", rank=rank,
                            world_size=2, timeout=timedelta(seconds=300))
    torch.set_num_threads(int(os.environ.get("MVC_THREADS", "1")))
    out: dict = {}

    # 1. the search, on identical replicas
    m = model(hidden)
    opt = torch.optim.AdamW(m.parameters(), 1e-3)
    train(m, opt, 20)
    tensors = {f"model/{k}": v.detach().clone() for k, v in m.state_dict().items()}
    aggressive = QuantConfig(bins=4, prune=0.4, protect=0.0005)
    xe = torch.randn(n_eval, 256, generator=torch.Generator().manual_seed(2))

    def quality(candidate: dict) -> float:   # the same batch on every rank
        params = {k[len("model/"):]: v for k, v in candidate.items()}
        with torch.no_grad():
            return float((torch.func.functional_call(m, params, (xe,)) - xe).pow(2).mean())

    for kind, previous, evaluate in (("first", None, None), ("neighbourhood", aggressive, None),
                                     ("first_quality", None, quality)):
        runs: dict[str, list] = {"one": [], "two": []}
        for _ in range(reps):
            if rank == 0:
                t = time.perf_counter()
                res = mvc.search.find_config(tensors, previous=previous, evaluate=evaluate)
                runs["one"].append((time.perf_counter() - t, len(res.quality.trials or []),
                                    res.config.to_dict() if res.config else None))
            dist.barrier()
            if rank == 0:
                t = time.perf_counter()
                with mvc.search.ranks():
                    res = mvc.search.find_config(tensors, previous=previous, evaluate=evaluate)
                runs["two"].append((time.perf_counter() - t, res.quality.rounds,
                                    res.config.to_dict() if res.config else None,
                                    len(res.quality.trials or [])))
                dist.broadcast_object_list(["next"], src=0)
            else:
                mvc.search.serve_trials(tensors, evaluate=evaluate)
        out[kind] = runs

    # 2. sharded commits of an FSDP2 model + AdamW
    m = model(hidden)
    for layer in m:
        if isinstance(layer, torch.nn.Linear):
            fully_shard(layer)
    fully_shard(m)
    opt = torch.optim.AdamW(m.parameters(), 1e-3)
    train(m, opt, 20)
    msd, osd = get_state_dict(m, opt)
    state = {"model": msd, "optim": osd}
    for name, kw in (("lossless", {"lossless": True}),
                     ("fixed", {"quant": QuantConfig(**FIXED)})):
        w = MvcStorageWriter(root / f"sharded_{name}", message=name, **kw)
        t = time.perf_counter()
        dcp.save(state, storage_writer=w)
        out[f"save_{name}_s"] = time.perf_counter() - t
        out[f"commit_{name}"] = w.commit_id
    torch.save(out, root / f"rank{rank}.pt")
    dist.barrier()
    dist.destroy_process_group()


# ------------------------------------------------------------------ the parent
def by_index(state: dict) -> dict:
    """DCP's optimizer state (keyed by parameter FQN) keyed by the parameters' positions, in
    the model's parameter order."""
    order = [k for k in state["model"] if k in state["optim"]["state"]]
    optim = dict(state["optim"], state={i: state["optim"]["state"][k] for i, k in enumerate(order)})
    return dict(state, optim=optim)


def stored(repo: object, cid: str) -> tuple[int, int, int]:
    """(stored bytes of the commit's tensors, raw bytes, records)."""
    snap = repo.read_snapshot(repo.read_commit(cid).snapshot)  # type: ignore[attr-defined]
    return (sum(r.stored_bytes for r in snap.tensors), sum(r.raw_bytes for r in snap.tensors),
            len(snap.tensors))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--hidden", type=int, default=512)
    ap.add_argument("--threads", type=int, default=1, help="threads per rank")
    ap.add_argument("--eval", type=int, default=8192, help="samples the quality function runs")
    ap.add_argument("--rank", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--root", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.rank is not None:
        rank_main(args.rank, Path(args.root), args.hidden, args.reps, args.eval)
        return

    from mvc.quant import QuantConfig
    from mvc.repo.repository import Repo

    root = Path(tempfile.mkdtemp(prefix="bench_distributed_"))
    for name in ("sharded_lossless", "sharded_fixed", "one_lossless", "one_fixed"):
        Repo.init(root / name).close()
    env = dict(os.environ, OMP_NUM_THREADS=str(args.threads), MVC_THREADS=str(args.threads))
    procs = [subprocess.Popen([sys.executable, __file__, "--rank", str(r), "--root", str(root),
                               "--hidden", str(args.hidden), "--reps", str(args.reps),
                               "--eval", str(args.eval)], env=env)
             for r in range(2)]
    if any(p.wait() for p in procs):
        sys.exit("a rank failed")
    r0 = torch.load(root / "rank0.pt", weights_only=False)

    result: dict = {"hidden": args.hidden, "reps": args.reps, "threads_per_rank": args.threads,
                    "search": {}, "size": {}}
    for kind in ("first", "neighbourhood", "first_quality"):
        one, two = r0[kind]["one"], r0[kind]["two"]
        t1, t2 = min(r[0] for r in one), min(r[0] for r in two)
        result["search"][kind] = {
            "trials_1_rank": one[0][1], "rounds_2_ranks": two[0][1],
            "trials_2_ranks": two[0][3], "rounds_ratio": one[0][1] / max(two[0][1], 1),
            "wall_1_rank_s": t1, "wall_2_ranks_s": t2, "wall_ratio": t1 / t2,
            "same_config": one[0][2] == two[0][2]}

    # the same state from one process: read back exactly from the lossless sharded commit, its
    # optimizer state keyed by parameter index as `optimizer.state_dict()` keys it (a Tracker's
    # commit), so that both commits compress the moments alike (commit.optimizer = compressed)
    with Repo(root / "sharded_lossless") as src:
        state = by_index(src.read_state(r0["commit_lossless"]))
        s_lossless = stored(src, r0["commit_lossless"])
    with Repo(root / "sharded_fixed") as src:
        s_fixed = stored(src, r0["commit_fixed"])
    for name, kw in (("lossless", {"lossless": True}), ("fixed", {"quant": QuantConfig(**FIXED)})):
        with Repo(root / f"one_{name}") as repo:
            t = time.perf_counter()
            cid = repo.commit(state, name, **kw)
            result["size"][f"commit_one_process_{name}_s"] = time.perf_counter() - t
            one = stored(repo, cid)
        sharded = s_lossless if name == "lossless" else s_fixed
        result["size"][name] = {
            "raw_bytes": one[1], "one_process_bytes": one[0], "sharded_bytes": sharded[0],
            "sharded_over_one": sharded[0] / one[0], "records_one": one[2],
            "records_sharded": sharded[2], "save_2_ranks_s": r0[f"save_{name}_s"]}
    if args.json:
        print(json.dumps(result, indent=2))
        return
    print(f"state: MLP 256-{args.hidden}-{args.hidden}-256 + AdamW, 2 gloo ranks on CPU, "
          f"{args.threads} thread(s) per rank, {args.reps} reps (min wall time)")
    for kind, r in result["search"].items():
        print(f"search {kind:>13}: 1 rank {r['trials_1_rank']} trials {r['wall_1_rank_s']:.2f}s"
              f" | 2 ranks {r['rounds_2_ranks']} rounds ({r['trials_2_ranks']} trials)"
              f" {r['wall_2_ranks_s']:.2f}s | rounds x{r['rounds_ratio']:.2f},"
              f" wall x{r['wall_ratio']:.2f}, same config: {r['same_config']}")
    for name in ("lossless", "fixed"):
        r = result["size"][name]
        print(f"size {name:>8}: raw {r['raw_bytes']:,} | one process {r['one_process_bytes']:,}"
              f" ({r['records_one']} records) | 2-rank sharded {r['sharded_bytes']:,}"
              f" ({r['records_sharded']} records) | sharded/one = {r['sharded_over_one']:.4f}")


if __name__ == "__main__":
    main()
