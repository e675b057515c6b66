"""A training state's copy in host memory: what a background commit encodes while training
goes on (`Tracker.commit(background=True)`).

An accelerator's tensors come back through two pinned staging buffers (`STAGING_BYTES` each)
into plain host memory of their exact size. Pinning the copies themselves would cost more
than the copy: torch's caching host allocator rounds every pinned block up to a power of two
and keeps it for the process's life, so a 124M GPT-2 state's 592 tensors (1.49 GB) would hold
2.48 GB of page-locked memory from the first background commit on. The staging buffers are a
power of two (nothing rounded) and the allocator hands the same two to every later commit:
128 MiB pinned whatever the model's size. The device fills one buffer while the host empties
the other, so the copy costs about the slower of the two transfers.
"""
from __future__ import annotations

import contextlib
import copy
import functools
from collections.abc import Callable, Sequence
from typing import Any

import torch

#: Bytes of each of the two pinned staging buffers (a power of two: see the module docstring).
STAGING_BYTES = 64 << 20

#: Where part of an item goes in a row of buffers: (buffer, offset in it, offset in the item,
#: count), see `cut`.
Piece = tuple[int, int, int, int]


def cut(lengths: Sequence[int], size: int) -> list[list[Piece]]:
    """Items of these lengths packed back to back into buffers of `size` each, an item cut
    where a buffer ends: each item's pieces (an empty item has none). The pinned staging
    here and `GradientEMA`'s slabs are laid out so."""
    out: list[list[Piece]] = []
    buf = at = 0
    for n in lengths:
        pieces: list[Piece] = []
        start = 0
        while start < n:
            if at == size:
                buf, at = buf + 1, 0
            take = min(n - start, size - at)
            pieces.append((buf, at, start, take))
            at, start = at + take, start + take
        out.append(pieces)
    return out


#: Host memory for one tensor's copy: allocate(shape, dtype) -> an empty contiguous tensor, or
#: None for one the allocator cannot hold (it is then copied as torch copies it).
Allocate = Callable[[torch.Size, torch.dtype], "torch.Tensor | None"]


def _empty(shape: torch.Size, dtype: torch.dtype) -> torch.Tensor | None:
    return None


def clone_to_cpu(obj: Any, *, staging_bytes: int = STAGING_BYTES,
                 allocate: Allocate = _empty) -> Any:
    """A deep copy of a (nested) state with every tensor copied to host memory.

    Tensors repeated in the state (tied weights) stay one object; OrderedDict `_metadata`
    (state_dict versions) is kept. Tensors on an accelerator are copied through pinned
    staging (`copy_through_staging`); the copy is complete when this returns. `allocate`
    gives each copy its memory (default: plain pageable memory; a background commit process
    passes shared memory it can map).
    """
    memo: dict[Any, torch.Tensor] = {}
    pending: list[tuple[torch.Tensor, torch.Tensor]] = []
    result = _clone(obj, memo, pending, allocate)
    by_device: dict[torch.device, list[tuple[torch.Tensor, torch.Tensor]]] = {}
    for src, dst in pending:
        by_device.setdefault(src.device, []).append((src, dst))
    for pairs in by_device.values():
        copy_through_staging(pairs, staging_bytes)
    return result


def _clone(obj: Any, memo: dict[Any, torch.Tensor],
           pending: list[tuple[torch.Tensor, torch.Tensor]], allocate: Allocate) -> Any:
    if isinstance(obj, torch.Tensor):
        hit = memo.get(id(obj))
        if hit is not None:
            return hit
        # another object viewing the same values (tied weights: a state_dict detaches each
        # name's parameter into an object of its own) gets an object of its own on the same copy,
        # as in the live state
        view = view_key(obj)
        hit = memo.get(view) if view is not None else None
        if hit is not None:
            memo[id(obj)] = same = hit.detach()
            return same
        t = obj.detach()
        dst = allocate(t.shape, t.dtype)
        if dst is None and t.device.type == "cpu":
            out = t.clone()
        elif dst is None and t.is_quantized:   # no bytes to stage: torch's own copy
            out = t.cpu()
        else:
            out = torch.empty(t.shape, dtype=t.dtype) if dst is None else dst
            if t.device.type == "cpu":
                out.copy_(t)
            else:
                pending.append((t, out))
        memo[id(obj)] = out
        if view is not None:
            memo[view] = out
        return out
    if isinstance(obj, dict):
        result = obj.__class__()
        for k, v in obj.items():
            result[k] = _clone(v, memo, pending, allocate)
        if hasattr(obj, "_metadata"):
            result._metadata = copy.deepcopy(obj._metadata)  # type: ignore[attr-defined]
        return result
    if isinstance(obj, list):
        return [_clone(v, memo, pending, allocate) for v in obj]
    if isinstance(obj, tuple) and not hasattr(obj, "_fields"):
        return tuple(_clone(v, memo, pending, allocate) for v in obj)
    return copy.deepcopy(obj)


def view_key(t: torch.Tensor) -> tuple | None:
    """What makes two tensor objects the same values: device, storage, offset, shape, strides
    and dtype (None where there is no storage to share: empty, sparse, quantized...)."""
    try:
        storage = t.untyped_storage()
    except (RuntimeError, NotImplementedError, TypeError):
        return None
    if storage.nbytes() == 0 or t.layout != torch.strided or t.is_quantized:
        return None
    return (str(t.device), storage.data_ptr(), t.storage_offset(), tuple(t.shape), t.stride(),
            t.dtype)


def copy_through_staging(pairs: list[tuple[torch.Tensor, torch.Tensor]],
                         staging_bytes: int = STAGING_BYTES) -> None:
    """Copy each source tensor (all on one device) into its host destination (contiguous, same
    shape and dtype), in pieces of at most `staging_bytes` through two staging buffers: pinned,
    with the device's copies queued without waiting, where the sources are on CUDA; plain
    buffers elsewhere (the same pieces, so a host-only machine tests the packing)."""
    if staging_bytes <= 0:
        raise ValueError(f"staging_bytes must be positive, got {staging_bytes}")
    views: list[tuple[torch.Tensor, torch.Tensor]] = []   # (source, destination bytes)
    for src, dst in pairs:
        if src.numel() == 0:
            continue
        d = _bytes_of(dst)
        if d is None or not _byte_viewable(src.dtype):   # copied as it is, synchronously
            dst.copy_(src)
            continue
        views.append((src, d))
    # batch i: what one buffer stages, (offset in it, view, start, length in bytes)
    batches: list[list[tuple[int, int, int, int]]] = []
    last: dict[int, int] = {}   # view -> the batch its last piece is staged in
    for k, pieces in enumerate(cut([d.numel() for _, d in views], staging_bytes)):
        for b, at, start, n in pieces:
            if b == len(batches):
                batches.append([])
            batches[b].append((at, k, start, n))
            last[k] = b
    if not batches:
        return
    # A non-contiguous source's contiguous copy (on its device) is made when its first piece
    # is staged and dropped after its last: a channels_last CNN's weights and moments would
    # otherwise be copied whole on the GPU before the first piece moved.
    live: dict[int, torch.Tensor] = {}

    def source(k: int) -> torch.Tensor:
        got = live.get(k)
        if got is None:
            got = _bytes_of(views[k][0])
            assert got is not None   # its dtype views as bytes
            live[k] = got
        return got

    cuda = pairs[0][0].device.type == "cuda"
    with torch.cuda.device(pairs[0][0].device) if cuda else contextlib.nullcontext():
        bufs = [torch.empty(staging_bytes, dtype=torch.uint8, pin_memory=cuda)
                for _ in range(min(2, len(batches)))]
        ready: list[Any] = [None] * len(bufs)

        def fill(i: int) -> None:
            buf = bufs[i % len(bufs)]
            for at, k, start, n in batches[i]:
                buf[at:at + n].copy_(source(k)[start:start + n], non_blocking=cuda)
                if last[k] == i:
                    # freed while its copy may run: the allocator gives the block only to
                    # work queued after it on this stream
                    del live[k]
            if cuda:
                ready[i % len(bufs)] = torch.cuda.Event()
                ready[i % len(bufs)].record()

        for i in range(len(bufs)):
            fill(i)
        for i in range(len(batches)):
            if cuda:
                ready[i % len(bufs)].synchronize()
            buf = bufs[i % len(bufs)]
            for at, k, start, n in batches[i]:
                views[k][1][start:start + n].copy_(buf[at:at + n])
            if i + len(bufs) < len(batches):
                fill(i + len(bufs))   # this buffer is empty again


@functools.cache
def _byte_viewable(dtype: torch.dtype) -> bool:
    """Whether torch views tensors of `dtype` as bytes (not sub-byte or quantized ones)."""
    return _bytes_of(torch.empty(0, dtype=dtype)) is not None


def _bytes_of(t: torch.Tensor) -> torch.Tensor | None:
    """A tensor's bytes as a flat uint8 view (a contiguous copy first, on its device, if it is
    not contiguous); None for a dtype torch cannot view so (sub-byte and quantized ones)."""
    try:
        return t.contiguous().reshape(-1).view(torch.uint8)
    except (RuntimeError, TypeError, NotImplementedError):
        return None
