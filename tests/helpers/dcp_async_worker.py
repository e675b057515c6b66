"""One rank of tests/dcp/test_dcp_async.py: `dcp.async_save` through `MvcStorageWriter`, gloo, CPU.

    python dcp_async_worker.py RANK WORLD DIR

FSDP2 + AdamW as in dcp_worker.py.  The saves run on a gloo group kept for checkpoints while
the training loop goes on (on the default group) before their futures are awaited.  What
this rank saw goes to DIR/rank<R>.pt:

1. `mvc.dcp.async_save` of a lossless save, a training step while it runs, then its result;
   a fresh model `dcp.load`s it: every local shard must equal the one staged, bit for bit;
2. `torch.distributed.checkpoint.async_save` itself with a lossy writer (epsilon=0.05), a
   step while it runs; the full state as saved, and as `dcp.load` restores it;
3. errors on the future: the same state again with allow_empty=False (nothing to commit),
   a repository that does not exist, and a rank that fails in `write_data` (rank WORLD-1);
4. a lossless save through DCP's process-based executor (the writer pickled into a
   checkpoint process per rank).
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
from torch.distributed.checkpoint.state_dict_saver import AsyncCheckpointerType

from dcp_worker import build, full, local, state_of, train
from mvc.dcp import DcpValueError, MvcStorageReader, MvcStorageWriter, async_save


class FailingWriter(MvcStorageWriter):
    """The last rank fails in `write_data` with a typed mvc error (as a full disk would)."""

    def write_data(self, plan, planner):  # type: ignore[no-untyped-def]
        if dist.get_rank() == dist.get_world_size() - 1:
            raise DcpValueError("rank cannot store its shards (test)")
        return super().write_data(plan, planner)


def outcome(fut) -> str:  # type: ignore[no-untyped-def]
    try:
        return f"ok {fut.result(timeout=120)}"
    except BaseException as exc:   # DCP's CheckpointException is a BaseException
        return f"{type(exc).__name__}"


def main(rank: int, world: int, root: Path) -> None:
    dist.init_process_group("gloo", init_method=f"file://{root / 'rendezvous'}", rank=rank,
                            world_size=world, timeout=timedelta(seconds=60))
    ckpt = dist.new_group(backend="gloo")     # the saves' collectives, apart from training's
    repo = root / "repo"
    report: dict = {}
    model, opt = build(0)
    train(model, opt, 2, 0)

    # 1. lossless, mvc.dcp.async_save; the loop goes on while it runs
    state = state_of(model, opt)
    staged = local(state)
    fut = async_save(state, MvcStorageWriter(repo, message="async lossless", lossless=True,
                                             step=2), process_group=ckpt)
    train(model, opt, 1, 7)
    report["c1"] = fut.result(timeout=120)
    model2, opt2 = build(1)
    state2 = state_of(model2, opt2)
    dcp.load(state2, storage_reader=MvcStorageReader(repo, rev=report["c1"]))
    set_state_dict(model2, opt2, model_state_dict=state2["model"],
                   optim_state_dict=state2["optim"])
    loaded = local(state_of(model2, opt2))
    report["mismatch"] = sorted(k for k in staged if not _equal(staged[k], loaded.get(k)))
    report["same_keys"] = sorted(staged) == sorted(loaded)

    # 2. lossy, through torch's own async_save
    train(model, opt, 1, 3)
    report["saved2"] = full(model, opt)
    w = MvcStorageWriter(repo, message="async lossy", step=4, epsilon=0.05, process_group=ckpt)
    dfut = dcp.async_save(state_of(model, opt), storage_writer=w, process_group=ckpt)
    train(model, opt, 1, 8)
    dfut.result(timeout=120)
    report["c2"] = w.commit_id
    report["config2"] = w.last_config
    report["quality2"] = w.last_quality
    model3, opt3 = build(2)
    state3 = state_of(model3, opt3)
    dcp.load(state3, storage_reader=MvcStorageReader(repo, rev="HEAD"))
    set_state_dict(model3, opt3, model_state_dict=state3["model"],
                   optim_state_dict=state3["optim"])
    report["loaded2"] = full(model3, opt3)

    # 3. errors surface on the future, typed, on every rank
    state = state_of(model, opt)
    report["empty_first"] = outcome(async_save(
        state, MvcStorageWriter(repo, message="again", lossless=True), process_group=ckpt))
    report["empty"] = outcome(async_save(
        state, MvcStorageWriter(repo, message="again 2", lossless=True, allow_empty=False),
        process_group=ckpt))
    report["bad_repo"] = outcome(async_save(
        state, MvcStorageWriter(root / "no-repo", message="x", lossless=True),
        process_group=ckpt))
    report["failing"] = outcome(async_save(
        state, FailingWriter(repo, message="never", lossless=True), process_group=ckpt))

    # 4. DCP's process-based executor: the writer is pickled into a checkpoint process
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    train(model, opt, 1, 11)
    report["saved4"] = full(model, opt)
    report["c4"] = outcome(async_save(
        state_of(model, opt), MvcStorageWriter(repo, message="process", lossless=True),
        process_group=ckpt, async_checkpointer_type=AsyncCheckpointerType.PROCESS))
    torch.save(report, root / f"rank{rank}.pt")
    dist.barrier()
    sys.stdout.flush()
    os._exit(0)


def _equal(a: object, b: object) -> bool:
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and a.dtype == b.dtype and a.shape == b.shape \
            and bool(torch.equal(a, b))
    return a == b


if __name__ == "__main__":
    main(int(sys.argv[1]), int(sys.argv[2]), Path(sys.argv[3]))
