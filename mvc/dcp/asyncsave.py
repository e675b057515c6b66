"""`dcp.async_save` through `MvcStorageWriter`: the training loop blocks for the staging copy.

    fut = mvc.dcp.async_save(state, MvcStorageWriter("runs/exp1", message="step 1000"))
    ...                                   # training goes on
    commit_id = fut.result()              # or the typed mvc error of a failed save

`torch.distributed.checkpoint.async_save(state, storage_writer=writer)` works as is: DCP
copies the state to host memory on the caller's thread (its `DefaultStager`: the only part
the loop waits for), then runs the whole save -- plan, every rank's write (the lossy path's
collectives included), the coordinator's publish -- on a background thread; with
``async_checkpointer_type=PROCESS`` in a checkpoint process instead (the writer pickles: the
repository travels by path; the caller's writer then never sees `commit_id`, which lives in the
checkpoint process's copy, so a failure after the commit point is not told apart there).
An asynchronous stager (``DefaultStager(StagingOptions())``) copies a GPU state on a stream
and a thread of its own, ordered after none of the caller's kernels, so DCP's own
`async_save` can copy values the last step has not written yet; this module's waits for the
caller's CUDA streams first.
The save's collectives should not share a group with the training loop's, which run
meanwhile: give DCP a checkpoint group (``process_group=``, a gloo group) and the writer the
same one (`MvcStorageWriter(..., process_group=)`), or call `async_save` here, which hands
its `process_group` to both.

DCP's future raises its `CheckpointException` (every rank's errors, gathered).  The future
`async_save` returns raises the typed mvc error instead: this rank's own, else the first
other rank's (in rank order) -- a failing rank's `DcpValueError` reaches every rank as
itself, chained to DCP's exception -- and on the coordinator `DcpPublishedError` when the
commit landed before the save failed (as `mvc.dcp.save`).  An error no rank raised as an mvc
error is DCP's own, unchanged.
"""
from __future__ import annotations

from concurrent.futures import Future
from typing import Any

import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.state_dict_saver import AsyncSaveResponse

from mvc.errors import MvcError

from mvc.dcp.writer import DcpPublishedError, Landed, MvcStorageWriter


def async_save(state: dict[str, Any], writer: MvcStorageWriter, *, process_group: Any = None,
               **dcp_kwargs: Any) -> Future[str | None]:
    """`dcp.async_save(state, storage_writer=writer, process_group=..., **dcp_kwargs)`; returns
    once the state is staged (copied), with a future of the commit id (on every rank, as
    `mvc.dcp.save` returns it) that raises the save's typed mvc error.

    `process_group` (else the writer's own): the group the save runs on, DCP's collectives and
    the lossy path's alike -- a gloo group kept for checkpoints, so that the background save
    never interleaves with the training loop's collectives.
    """
    if process_group is None:
        process_group = writer.process_group
    writer.process_group = process_group
    _wait_for_callers_streams()
    got = dcp.async_save(state, storage_writer=writer, process_group=process_group, **dcp_kwargs)
    if isinstance(got, AsyncSaveResponse):
        # An asynchronous stager (DefaultStager(use_async_staging=True): GPU state copied to the
        # host in the background) returns before the copy is done: the loop's next step would
        # change values the copy had not read yet, a checkpoint of two steps at once.
        try:
            got.staging_completion.result()
        except BaseException as exc:  # noqa: BLE001 - DCP's errors are BaseExceptions too
            raise typed_error(exc, writer) from exc
        upload = got.upload_completion
    else:
        upload = got
    out: Future[str | None] = Future()

    def done(fut: Future) -> None:
        try:
            metadata = fut.result()
        except BaseException as exc:  # DCP's CheckpointException is a BaseException
            out.set_exception(typed_error(exc, writer))
            return
        landed = getattr(metadata, "storage_data", None)
        out.set_result(landed.commit_id if isinstance(landed, Landed) else writer.commit_id)

    upload.add_done_callback(done)
    return out


def _wait_for_callers_streams() -> None:
    """Wait for the work queued on this thread's current CUDA streams (each device with a CUDA
    context here). DCP's asynchronous stager copies a GPU state on a stream of its own, from a
    thread of its own, ordered after none of the caller's kernels: a save called right after
    `optimizer.step()` would copy values that step had not written yet. The loop waits for
    the staging copy anyway (`async_save`), so this costs it the step's tail, no more."""
    if not torch.cuda.is_initialized():
        return
    # A device this process never used has nothing queued; waiting on it would start a CUDA
    # context there. (torch's own check; without it, the current device alone.)
    has_context = getattr(torch._C, "_cuda_hasPrimaryContext", None)
    devices = ([d for d in range(torch.cuda.device_count()) if has_context(d)]
               if has_context is not None else [torch.cuda.current_device()])
    for d in devices:
        torch.cuda.current_stream(d).synchronize()


def typed_error(exc: BaseException, writer: MvcStorageWriter) -> BaseException:
    """The error a failed save of `writer` reports on this rank: `DcpPublishedError` when its
    commit landed (coordinator); else the mvc error this rank raised, or the first other
    rank's; else `exc`.  The error returned is chained to `exc`."""
    if writer.commit_id is not None:
        published = DcpPublishedError(writer.commit_id, exc)
        published.__cause__ = exc
        return published
    if isinstance(exc, MvcError):
        return exc
    if isinstance(exc, CheckpointException):
        failures = exc.failures
        order = [writer.rank] + sorted(r for r in failures if r != writer.rank)
        for rank in order:
            err = _error_of(failures.get(rank))
            if isinstance(err, MvcError):
                err.__cause__ = exc
                return err
    return exc


def _error_of(failure: Any) -> BaseException | None:
    """The exception of one rank's entry in `CheckpointException.failures` (DCP keeps the
    exception with its formatted traceback)."""
    if isinstance(failure, BaseException):
        return failure
    if isinstance(failure, tuple) and failure and isinstance(failure[0], BaseException):
        return failure[0]
    return None
