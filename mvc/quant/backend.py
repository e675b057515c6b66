"""Which kernels run a tensor's quantizer work: the native C ones (host tensors) or torch's own
ops (any device: the path CUDA tensors take).

Both give identical levels, sketches and centroids; the torch path exists for tensors that
live on an accelerator.  `device_path()` makes host tensors take it too, which is how CPU-only
CI runs the code that a GPU runs (tests/repo/test_device_path.py compares the two).
"""
from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager

import torch

class Switch:
    """A process-wide switch, on while any of its `on()` blocks is open (from any thread: the
    native pool's threads follow it). For tests and benchmarks that send work down another
    path, not for use alongside other work in the same process."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._open = 0

    @property
    def active(self) -> bool:
        """Whether some `on()` block is open."""
        return self._open > 0

    @contextmanager
    def on(self) -> Iterator[None]:
        """The switch is on within this block."""
        with self._lock:
            self._open += 1
        try:
            yield
        finally:
            with self._lock:
                self._open -= 1


_device = Switch()


def on_host_kernels(t: torch.Tensor) -> bool:
    """Whether `t`'s quantizer work runs in the native kernels: a host tensor, unless
    `device_path()` is open."""
    return t.device.type == "cpu" and not _device.active


def device_path() -> AbstractContextManager[None]:
    """Within this block host tensors take the accelerator's (torch) code path. Process-wide
    (the native pool's threads follow it): meant for tests and benchmarks, not for use
    alongside other work in the same process."""
    return _device.on()
