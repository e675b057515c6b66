"""The training process's random number generators, as a quality function found them.

A search calls the user's quality function many times (a varying number: 5 on one commit, 19
on the next), and a function that draws randomness (dropout left on, a random held-out batch)
would advance the process's generators each time: the training run after a commit would then
differ from the same run without it, which `torch.save` never does.  `as_the_caller_left_them`
puts torch's CPU generator, the CUDA generators of the devices this process has initialised,
numpy's global generator and Python's `random` back after each call.

Only on the main thread: a background commit's quality calls on another thread run beside
the training loop, and putting a generator back there would rewind the loop's own draws made
meanwhile. There a quality function that must not disturb the run draws from its own
`torch.Generator`.
"""
from __future__ import annotations

import random
import threading
from collections.abc import Iterator
from contextlib import contextmanager

import numpy as np
import torch


@contextmanager
def as_the_caller_left_them() -> Iterator[None]:
    """Within the block the generators advance as the code in it draws; after it (an error
    included) they are as they were before it, on the main thread (module docstring)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    py, npy = random.getstate(), np.random.get_state()
    # CUDA's generators only where CUDA is up already: asking for them would start it
    devices = list(range(torch.cuda.device_count())) if torch.cuda.is_initialized() else []
    try:
        with torch.random.fork_rng(devices=devices):
            yield
    finally:
        random.setstate(py)
        np.random.set_state(npy)
