"""One rank of tests/dcp/test_dcp_moments.py: a sharded lossy save of FSDP2 + AdamW state whose
optimizer moments are compressed as a one-process commit compresses them.

    python dcp_moments_worker.py RANK WORLD DIR

Three training steps (model and AdamW as in dcp_worker.py), then the same state saved twice:
losslessly into DIR/exact and lossy (epsilon 0.05) into DIR/repo; a fresh model `dcp.load`s
the lossy commit.  DIR/rank<R>.pt gets the full state as saved and as loaded (rank 0), the
commits, and the config and quality record this rank's writer holds.
"""
from __future__ import annotations

import os
import sys
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import set_state_dict

from dcp_worker import build, full, state_of, train
from mvc.dcp import MvcStorageReader, MvcStorageWriter


def main(rank: int, world: int, root: Path) -> None:
    dist.init_process_group("gloo", init_method=f"file://{root / 'rendezvous'}", rank=rank,
                            world_size=world, timeout=timedelta(seconds=60))
    report: dict = {}
    model, opt = build(0)
    train(model, opt, 3, 0)
    report["saved"] = full(model, opt)
    w = MvcStorageWriter(root / "exact", message="exact", lossless=True)
    dcp.save(state_of(model, opt), storage_writer=w)
    report["exact"] = w.commit_id
    w = MvcStorageWriter(root / "repo", message="lossy", step=3, epsilon=0.05)
    dcp.save(state_of(model, opt), storage_writer=w)
    report["lossy"] = w.commit_id
    report["config"] = w.last_config
    report["quality"] = w.last_quality
    model2, opt2 = build(1)
    state2 = state_of(model2, opt2)
    dcp.load(state2, storage_reader=MvcStorageReader(root / "repo", rev="HEAD"))
    set_state_dict(model2, opt2, model_state_dict=state2["model"],
                   optim_state_dict=state2["optim"])
    report["loaded"] = full(model2, opt2)
    torch.save(report, root / f"rank{rank}.pt")
    dist.barrier()
    sys.stdout.flush()
    os._exit(0)


if __name__ == "__main__":
    main(int(sys.argv[1]), int(sys.argv[2]), Path(sys.argv[3]))
