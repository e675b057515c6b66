"""One rank of tests/dcp/test_dcp.py: FSDP2 (`fully_shard`) + AdamW on a tiny model, gloo, CPU.

    python dcp_worker.py RANK WORLD DIR

DIR holds the repository (DIR/repo), the rendezvous file and what this rank reports
(DIR/rank<R>.pt).  The steps, in one process group (process start-up is the slow part):

1. two training steps, a lossless `dcp.save` -> commit 1; the full (gathered) state as it
   was saved goes to the report;
2. a fresh model and optimizer `dcp.load` commit 1: every local shard must equal the one
   saved, bit for bit;
3. a step, a lossy save (the config search) -> commit 2; a step, another -> commit 3 (its
   quantized shards are deltas against commit 2's: the sharding did not change); each
   rank reports the config its writer chose and what `dcp.load` of commit 3 restored;
4. a save in which rank 1 dies inside `write_data` (after storing its chunks): rank 0's
   `dcp.save` must fail and publish nothing.
"""
from __future__ import annotations

import os
import sys
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_state_dict,
    set_state_dict,
)
from torch.distributed.fsdp import fully_shard

from mvc.dcp import MvcStorageReader, MvcStorageWriter


def build(seed: int, sharded: bool = True) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    """The workers' model (FSDP2-sharded unless `sharded` is False) and its AdamW."""
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(),
                                torch.nn.Linear(128, 64))
    if sharded:
        for layer in model:
            if isinstance(layer, torch.nn.Linear):
                fully_shard(layer)
        fully_shard(model)
    return model, torch.optim.AdamW(model.parameters(), lr=1e-2)


def train(model: torch.nn.Module, opt: torch.optim.Optimizer, steps: int, seed: int) -> None:
    rank = dist.get_rank() if dist.is_initialized() else 0
    g = torch.Generator().manual_seed(seed + rank)
    for _ in range(steps):
        x = torch.randn(16, 64, generator=g)
        loss = (model(x) - x).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()


def state_of(model: torch.nn.Module, opt: torch.optim.Optimizer) -> dict:
    msd, osd = get_state_dict(model, opt)
    return {"model": msd, "optim": osd}


def local(state: dict) -> dict:
    """This rank's shards: DTensors as their local tensors, cloned."""
    from torch.distributed.checkpoint._nested_dict import flatten_state_dict
    flat, _ = flatten_state_dict(state)
    out = {}
    for k, v in flat.items():
        if isinstance(v, torch.Tensor):
            v = v.to_local() if hasattr(v, "to_local") else v
            out[k] = v.detach().clone()
        else:
            out[k] = v
    return out


def full(model: torch.nn.Module, opt: torch.optim.Optimizer) -> object:
    """The gathered state (every rank must call it; rank 0 gets the tensors)."""
    msd, osd = get_state_dict(model, opt, options=StateDictOptions(full_state_dict=True,
                                                                   cpu_offload=True))
    # cloned: some entries (Adam's step) are the live tensors, which later steps change
    return _clone({"model": msd, "optim": osd})


def _clone(obj: object) -> object:
    if isinstance(obj, torch.Tensor):
        return obj.detach().clone()
    if isinstance(obj, dict):
        return {k: _clone(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_clone(v) for v in obj]
    return obj


class DyingWriter(MvcStorageWriter):
    """Rank 1 stores its chunks, then dies before DCP can gather its results."""

    def write_data(self, plan, planner):  # type: ignore[no-untyped-def]
        fut = super().write_data(plan, planner)
        if dist.get_rank() == 1:
            sys.stdout.flush()
            os._exit(0)
        return fut


def main(rank: int, world: int, root: Path) -> None:
    dist.init_process_group("gloo", init_method=f"file://{root / 'rendezvous'}", rank=rank,
                            world_size=world, timeout=timedelta(seconds=60))
    repo = root / "repo"
    report: dict = {}
    model, opt = build(0)
    train(model, opt, 2, 0)

    # 1. lossless
    state = state_of(model, opt)
    saved = local(state)
    w = MvcStorageWriter(repo, message="lossless", lossless=True, step=2)
    dcp.save(state, storage_writer=w)
    report["c1"] = w.commit_id
    report["full1"] = full(model, opt)

    # 2. load it into a fresh model on the same 2 ranks
    model2, opt2 = build(1)
    state2 = state_of(model2, opt2)
    dcp.load(state2, storage_reader=MvcStorageReader(repo, rev=report["c1"] or "HEAD"))
    set_state_dict(model2, opt2, model_state_dict=state2["model"],
                   optim_state_dict=state2["optim"])
    loaded = local(state_of(model2, opt2))
    report["same_keys"] = sorted(loaded) == sorted(saved)
    report["mismatch"] = [k for k in saved if not _equal(saved[k], loaded.get(k))]

    # 3. lossy, twice (the second one's shards continue the first one's delta chains)
    for tag, step in (("c2", 3), ("c3", 4)):
        train(model, opt, 1, step)
        w = MvcStorageWriter(repo, message=f"lossy {tag}", step=step, epsilon=0.05)
        dcp.save(state_of(model, opt), storage_writer=w)
        report[tag] = w.commit_id
        report[f"config_{tag}"] = w.last_config
        report[f"quality_{tag}"] = w.last_quality
    model3, opt3 = build(2)
    state3 = state_of(model3, opt3)
    dcp.load(state3, storage_reader=MvcStorageReader(repo, rev="HEAD"))
    set_state_dict(model3, opt3, model_state_dict=state3["model"],
                   optim_state_dict=state3["optim"])
    report["full3"] = full(model3, opt3)

    # 3b. a NaN in rank 1's shard of one weight (another repository): the ranks agree to keep
    # that tensor exact, on both ranks, and still quantize the others
    state = state_of(model, opt)
    if rank == 1:
        state["model"]["2.weight"].to_local()[0, 0] = float("nan")
    w = MvcStorageWriter(root / "repo_nan", message="nan", epsilon=0.05)
    dcp.save(state, storage_writer=w)
    report["nan"] = w.commit_id
    report["nan_config"] = w.last_config

    # 4. rank 1 dies in write_data
    train(model, opt, 1, 9)
    torch.save(report, root / f"rank{rank}.pt")
    try:
        dcp.save(state_of(model, opt), storage_writer=DyingWriter(repo, message="never",
                                                                  lossless=True))
        report["crash"] = "saved"
    except Exception as exc:  # what DCP raises when a peer is gone varies
        report["crash"] = f"failed: {type(exc).__name__}"
    torch.save(report, root / f"rank{rank}.pt")
    sys.stdout.flush()
    os._exit(0)   # the group is broken: no orderly shutdown


def _equal(a: object, b: object) -> bool:
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and a.dtype == b.dtype and a.shape == b.shape \
            and bool(torch.equal(a, b))
    return a == b


if __name__ == "__main__":
    main(int(sys.argv[1]), int(sys.argv[2]), Path(sys.argv[3]))
