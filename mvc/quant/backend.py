"""Which kernels run a tensor's quantizer work: the native C ones (host tensors) or torch's own
ops (any device: the path CUDA tensors take).

Both give identical levels, sketches and centroids; the torch path exists for tensors that
live on an accelerator.  `device_path()` makes host tensors take it too, which is how CPU-only
CI runs the code that a GPU runs (tests/repo/test_device_path.py compares the two).
"""
from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager

import torch

_lock = threading.Lock()
_forced = 0  # > 0 while some `device_path()` is open (process-wide: the pool's threads see it)


def on_host_kernels(t: torch.Tensor) -> bool:
    """Whether `t`'s quantizer work runs in the native kernels: a host tensor, unless
    `device_path()` is open."""
    return t.device.type == "cpu" and _forced == 0


@contextmanager
def device_path() -> Iterator[None]:
    """Within this block host tensors take the accelerator's (torch) code path. Process-wide
    (the native pool's threads follow it): meant for tests and benchmarks, not for use
    alongside other work in the same process."""
    global _forced
    with _lock:
        _forced += 1
    try:
        yield
    finally:
        with _lock:
            _forced -= 1
