"""A batched assignment chunk as one Triton kernel (issue 27: "Triton where it pays").

`mvc.quant.batched` walks a group's tensors in chunks; on the torch path each chunk is 37-48
kernel launches (masks, order-preserving keys, one `searchsorted`, the level rules, the counts'
histogram, the six float64 error sums and their segmented reductions), most a full pass over
the chunk's values. Here the levels, the rules, the level counts and the error sums are one
kernel, with five small launches around it: a program takes a block of one tensor's values,
finds each value's level by a branchless binary search of its tensor's midpoints, applies the
prune / protect rules (by magnitude or sensitivity) and the set-aside entries, writes the levels
into the group's arena, and leaves the block's histogram and its six sums. The blocks' sums are
then reduced per piece by one `segment_reduce` (fixed order, no float atomics: the same bits
every run) and the histograms added by job (integers: any order gives the same counts).

Levels and counts are exactly the torch path's: a value's level is the number of its tensor's
midpoints strictly below it (a value on a midpoint goes to the lower centroid; -0.0 and +0.0
compare equal), and the rules are the same float32 comparisons. The sums agree to float64
summation order, and in the log domain to the float32 sqrt's rounding (Triton's `sqrt_rn` is
correctly rounded; torch's host sqrt is not always).

Optional: without `triton` installed, or with `MVC_TRITON` unset, the torch path runs. On host
tensors (tests) the kernel runs in Triton's interpreter, so CPU-only CI checks it against the
torch path (tests/quant/test_triton_assign.py); a CUDA device compiles it.
"""
from __future__ import annotations

import importlib.util
import os
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager, ExitStack
from typing import Any

import numpy as np
import torch

from mvc.errors import MvcError
from mvc.quant.backend import Switch
from mvc.quant.device_chunks import upload


#: Values per program (a power of two) on a GPU, and in Triton's interpreter on the host, where
#: each program costs a Python call (the tests' speed), not a share of the device.
BLOCK = 1024
HOST_BLOCK = 1 << 13

_forced = Switch()  # on while some `triton_path()` is open
_failed = False  # a compile or launch failed once: the torch path from then on
#: Chunks the kernel has done in this process (tests check that it ran, not its fallback).
launches = 0
#: Each is called with (the tensors a launch reads, the tensors it writes) and gives a context
#: that the launch runs in: a Triton kernel is not an aten op, so tests/helpers/sync_counter.py
#: (which follows device data op by op to count launches, synchronisations and device memory
#: without a GPU) counts it here, and leaves out the interpreter's own ops inside it.
launch_observers: list[Callable[[Sequence[torch.Tensor], Sequence[torch.Tensor]],
                                AbstractContextManager[Any]]] = []


def available() -> bool:
    """Whether the Triton package is installed (it is imported on first use only: ~0.3 s)."""
    return importlib.util.find_spec("triton") is not None


def wanted(device: torch.device) -> bool:
    """Whether a batched chunk on `device` takes the Triton kernel: on a CUDA device with
    `MVC_TRITON=1` in the environment, or on any device inside `triton_path()`; never without
    triton or after the kernel failed once in this process."""
    if _failed:
        return False
    if not _forced.active and not (device.type == "cuda" and os.environ.get("MVC_TRITON", "") == "1"):
        return False
    return available()


def triton_path() -> AbstractContextManager[None]:
    """Within this block batched chunks take the Triton kernel on any device (host tensors
    through Triton's interpreter). Process-wide, like `mvc.quant.backend.device_path`: for
    tests and benchmarks."""
    return _forced.on()


class TritonUnavailable(MvcError):
    """The Triton kernel cannot run here (the batched pass then takes the torch path)."""


def mark_failed() -> None:
    """Send every later chunk of this process down the torch path (the kernel failed)."""
    global _failed
    _failed = True


def _kernel(device: torch.device) -> Any:
    """The kernel, imported on first use. On host tensors it runs in Triton's interpreter, which
    Triton enables only when `TRITON_INTERPRET=1` is set before it is first imported (the test
    suite's conftest sets it on machines without CUDA)."""
    from mvc.quant import triton_kernels
    if device.type == "cpu" and not runs_on_host():
        raise TritonUnavailable("the Triton kernel runs on host tensors only in Triton's "
                                "interpreter: set TRITON_INTERPRET=1 before triton is imported")
    return triton_kernels.assign_chunk


def _interpreted(fn: Any) -> bool:
    return type(fn).__name__ == "InterpretedFunction"


def runs_on_host() -> bool:
    """Whether the kernel can run on host tensors here: Triton is installed and its
    interpreter is on (`TRITON_INTERPRET=1` before triton was imported)."""
    if not available():
        return False
    from mvc.quant import triton_kernels
    return _interpreted(triton_kernels.assign_chunk)


class Tables:
    """A group's per-job tables as the kernel reads them, on the group's device (built once per
    group): midpoints padded with +inf to a power of two, k, the rules' thresholds and the
    measured value of each level."""

    def __init__(self, mids: list[torch.Tensor], ks: list[int], prune: torch.Tensor | None,
                 protect: torch.Tensor | None, table: torch.Tensor, width: int,
                 device: torch.device, *, protect_sens: torch.Tensor | None = None,
                 by_sens: list[bool] | None = None) -> None:
        """`prune`, `protect`, `protect_sens`: float32 thresholds per job on `device` (None: the
        rule is off for every job); `by_sens`: whether each job prunes by sensitivity (None:
        none does)."""
        n = len(mids)
        # Few distinct shapes, so few compiled variants (each a compile of a second or two in a
        # process's first commit; Triton's disk cache serves later processes): rows of 16, 64,
        # 256 or 512 midpoints, histograms of 128, 256 or 512 bins.
        self.mp = _at_least(max(m.numel() for m in mids) + 1, (16, 64, 256))
        self.log2_mp = self.mp.bit_length() - 1
        padded = torch.full((n, self.mp), float("inf"), dtype=torch.float32)
        for j, m in enumerate(mids):
            padded[j, :m.numel()] = m.to(torch.float32)
        self.mids = upload(padded.reshape(-1), device)
        self.kvec = upload(torch.tensor(ks, dtype=torch.int32), device)
        off = torch.full((n,), float("inf"), dtype=torch.float32)
        self.prune = prune if prune is not None else upload(-off, device)
        self.protect = protect if protect is not None else upload(off, device)
        self.sens = protect_sens is not None or (by_sens is not None and any(by_sens))
        self.protect_sens = protect_sens if protect_sens is not None else upload(off, device)
        self.by_sens = upload(torch.tensor(by_sens if by_sens is not None else [False] * n,
                                           dtype=torch.int8), device)
        self.table, self.width = table, width
        self.hp = _at_least(width + 1, (128, 256))  # a spare bin past the levels
        self.device = device


def _at_least(n: int, steps: tuple[int, ...]) -> int:
    """The first of `steps` that is >= n, else the power of two that is."""
    for s in steps:
        if n <= s:
            return s
    return 1 << (n - 1).bit_length()


def block_table(pieces: list[tuple[int, int, int]], block: int = BLOCK
                ) -> tuple[np.ndarray, np.ndarray]:
    """((3, blocks) int64: each block's job, start and stop in the chunk; blocks per piece) for
    a chunk's pieces (job, start, stop) laid end to end, in blocks of at most `block`."""
    jobs: list[np.ndarray] = []
    starts: list[np.ndarray] = []
    stops: list[np.ndarray] = []
    per_piece = []
    off = 0
    for j, a, b in pieces:
        n = b - a
        s = np.arange(off, off + n, block, dtype=np.int64)
        jobs.append(np.full(s.size, j, dtype=np.int64))
        starts.append(s)
        stops.append(np.full(s.size, off + n, dtype=np.int64))
        per_piece.append(s.size)
        off += n
    return (np.stack([np.concatenate(jobs), np.concatenate(starts), np.concatenate(stops)]),
            np.asarray(per_piece, dtype=np.int64))


def assign_chunk(t: Tables, pieces: list[tuple[int, int, int]], piece_jobs: torch.Tensor,
                 raw: torch.Tensor, xs: torch.Tensor, drop: torch.Tensor | None,
                 weights: torch.Tensor | None, log_domain: bool, levels_out: torch.Tensor,
                 acc: torch.Tensor, counts: torch.Tensor,
                 sens: torch.Tensor | None = None) -> None:
    """One chunk's levels into `levels_out` (the chunk's slice of the arena), its sums added to
    `acc` (jobs x 4, or x 6 with `weights`) and its level counts to `counts` (jobs x width,
    flat): what `mvc.quant.batched`'s torch loop body does for a chunk, in one launch.
    `piece_jobs`: the chunk's job index per piece, on the device; `sens`: each value's
    sensitivity |g w| (float32), where the tables' rules read it."""
    block = HOST_BLOCK if t.device.type == "cpu" else BLOCK
    if t.sens and sens is None:
        raise ValueError("assign_chunk: these rules read sensitivity values")
    table, per_piece = block_table(pieces, block)
    n_blocks = table.shape[1]
    blocks = upload(torch.from_numpy(table.reshape(-1)), t.device)
    lengths = upload(torch.from_numpy(per_piece), t.device)
    ns = acc.shape[1]
    sums = torch.empty(n_blocks, ns, dtype=torch.float64, device=t.device)
    hist = torch.empty(n_blocks, t.hp, dtype=torch.int32, device=t.device)
    kernel = _kernel(raw.device)
    with ExitStack() as observed:
        if raw.device.type == "cuda":
            # Triton launches on the current device's current stream, not the tensors': a
            # state on cuda:1 in a process whose current device is 0 would run there, unordered
            observed.enter_context(torch.cuda.device(raw.device))
        for observe in launch_observers:
            observed.enter_context(observe([x for x in (xs, raw, drop, weights, sens)
                                            if x is not None], [levels_out, sums, hist]))
        dummy = raw  # a pointer for the inputs a variant does not read
        kernel[(n_blocks,)](
            xs, raw, drop.view(torch.uint8) if drop is not None else dummy,
            weights if weights is not None else dummy, sens if t.sens else dummy, blocks,
            n_blocks, t.mids, t.kvec, t.prune, t.protect, t.protect_sens, t.by_sens, t.table,
            t.width, levels_out, sums, hist,
            MP=t.mp, LOG2_MP=t.log2_mp, HP=t.hp, LOG_DOMAIN=log_domain,
            HAS_DROP=drop is not None, HAS_SENS=t.sens, WEIGHTED=weights is not None, NS=ns,
            BLOCK_=block)
    # per piece in a fixed order (no float atomics), then one row per job: a job has one piece
    # per chunk, so no two rows of the add meet. Both reduced before either is added, so a
    # failure leaves `acc` and `counts` as they were (the caller's torch path redoes the chunk).
    per_piece_sums = torch.segment_reduce(sums, "sum", lengths=lengths, axis=0, unsafe=True)
    block_counts = hist[:, :t.width].to(counts.dtype)
    acc.index_add_(0, piece_jobs, per_piece_sums)
    counts.view(-1, t.width).index_add_(0, blocks[:n_blocks], block_counts)
    global launches
    launches += 1

