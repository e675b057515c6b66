"""One rank of tests/dcp/test_dcp_device_memory.py: a sharded lossy save in which rank 1 runs
out of device memory choosing the quantization.

    python dcp_oom_worker.py RANK WORLD DIR

FSDP2 + AdamW as in dcp_worker.py, three training steps, then the same state saved lossy
(epsilon 0.05, moments compressed) twice on the device path (`device_path()`: host tensors take
the code a GPU runs): into DIR/want, and into DIR/got with rank 1's first sketch pass raising
torch's out-of-memory error. DIR/rank<R>.json gets both commits, whether this rank's pass failed
and the warnings it saw.
"""
from __future__ import annotations

import json
import os
import sys
import warnings
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp

import mvc.quant.sketch as sketch
from dcp_worker import build, state_of, train
from mvc.dcp import MvcStorageWriter
from mvc.quant.backend import device_path
from mvc.state.device_memory import DEVICE_OUT_OF_MEMORY


def main(rank: int, world: int, root: Path) -> None:
    dist.init_process_group("gloo", init_method=f"file://{root / 'rendezvous'}", rank=rank,
                            world_size=world, timeout=timedelta(seconds=60))
    model, opt = build(0)
    train(model, opt, 3, 0)
    report: dict = {"failed": 0}
    with device_path():
        w = MvcStorageWriter(root / "want", message="lossy", step=3, epsilon=0.05)
        dcp.save(state_of(model, opt), storage_writer=w)
        report["want"] = w.commit_id
        real = sketch.bucket_keys

        def bucket_keys(x: torch.Tensor, alpha: float) -> torch.Tensor:
            if rank == 1 and not report["failed"]:
                report["failed"] += 1
                raise DEVICE_OUT_OF_MEMORY("CUDA out of memory. Tried to allocate 2.00 GiB")
            return real(x, alpha)

        sketch.bucket_keys = bucket_keys
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            w = MvcStorageWriter(root / "got", message="lossy", step=3, epsilon=0.05)
            dcp.save(state_of(model, opt), storage_writer=w)
        report["got"] = w.commit_id
        report["warned"] = [str(c.message) for c in caught if "device memory" in str(c.message)]
    (root / f"rank{rank}.json").write_text(json.dumps(report))
    dist.barrier()
    sys.stdout.flush()
    os._exit(0)


if __name__ == "__main__":
    main(int(sys.argv[1]), int(sys.argv[2]), Path(sys.argv[3]))
