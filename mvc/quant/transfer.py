"""Quantizations across the host/accelerator boundary, many at a time.

A commit made from CUDA tensors quantizes them on the GPU, then entropy-codes the levels in C
on the host; a checkout does the reverse. Moving one tensor at a time makes the host wait for
the device once per tensor (a synchronous copy into pageable memory). Here every tensor's
levels go through one pinned staging buffer with asynchronous copies, and the host waits once.
Levels are 1-2 bytes a parameter, so the staging buffer is a quarter of a float32 state at most.
"""
from __future__ import annotations

from collections.abc import Mapping
from typing import TypeVar

import torch

from mvc.quant.tensor import QuantizedTensor

K = TypeVar("K")

_ALIGN = 64  # each tensor's slice starts on a cache line (and any dtype's alignment)


def _nbytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()


def _staged(sources: list[torch.Tensor]) -> list[torch.Tensor]:
    """Host copies of same-device CUDA tensors, through one pinned buffer, then one wait."""
    offsets, total = [], 0
    for t in sources:
        offsets.append(total)
        total += -(-_nbytes(t) // _ALIGN) * _ALIGN
    staging = torch.empty(total, dtype=torch.uint8, pin_memory=True)
    out = []
    for t, off in zip(sources, offsets):
        dst = staging[off:off + _nbytes(t)].view(t.dtype).view(t.shape)
        dst.copy_(t, non_blocking=True)
        out.append(dst)
    torch.cuda.current_stream(sources[0].device).synchronize()
    return out


def quantized_to_host(qs: Mapping[K, QuantizedTensor]) -> dict[K, QuantizedTensor]:
    """`qs` with every quantization in host memory: those on the host as they are, those on a
    CUDA device copied in one batch per device (levels and protected values through pinned
    staging, one wait); other accelerators one tensor at a time."""
    out: dict[K, QuantizedTensor] = dict(qs)
    by_device: dict[torch.device, list[K]] = {}
    for key, q in qs.items():
        if q.levels.device.type == "cpu":
            continue
        if q.levels.device.type != "cuda" or any(t.device != q.levels.device
                                                 for t in (q.centroids, q.protected)):
            out[key] = q.to("cpu")
            continue
        by_device.setdefault(q.levels.device, []).append(key)
    for keys in by_device.values():
        parts = [p for key in keys for p in (qs[key].levels.contiguous(), qs[key].protected.contiguous())]
        host = _staged(parts)
        for i, key in enumerate(keys):
            q = qs[key]
            out[key] = QuantizedTensor(host[2 * i], q.centroids.cpu(), host[2 * i + 1], q.dtype, q.bins)
    return out


def quantized_to_device(q: QuantizedTensor, device: torch.device) -> QuantizedTensor:
    """`q` on `device`; from the host to a CUDA device the levels (and protected values) go
    through pinned memory asynchronously, so the copy overlaps the host's next tensor (the
    caching host allocator keeps the staging alive until the copy is done)."""
    device = torch.device(device)
    if device.type != "cuda" or q.levels.device.type != "cpu":
        return q.to(device)

    def send(t: torch.Tensor) -> torch.Tensor:
        if t.numel() == 0:
            return t.to(device)
        return t.contiguous().pin_memory().to(device, non_blocking=True)

    return QuantizedTensor(send(q.levels), q.centroids.to(device), send(q.protected), q.dtype, q.bins)
