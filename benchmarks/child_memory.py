"""A benchmark child process's own memory: RSS and its high-water mark (Linux /proc), the
anonymous part sampled on a thread, and a commit's write phase apart from its plan. Each
measurement runs in a process of its own, so these figures are the step's alone."""
from __future__ import annotations

import os
import resource
import threading
import time
from typing import Any


def rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def peak() -> int:
    """This process's peak RSS (VmHWM: per address space, so not the forking parent's, which
    getrusage's ru_maxrss carries across exec)."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def reset_peak() -> bool:
    """Reset VmHWM to the current RSS (Linux >= 4.0), so the next peak is the step's own."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def anon_rss() -> int:
    """This process's anonymous resident memory (RssAnon): its heap and mappings of no file,
    without the pages of the files it maps (the libraries' code, which a CUDA process loads
    lazily as its kernels first run, and LMDB's map)."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("RssAnon:"):
                return int(line.split()[1]) * 1024
    return 0


class AnonPeak:
    """The peak of `anon_rss` over a step, sampled every 2 ms on a thread of its own (the
    kernel keeps no high-water mark of it): the step's own memory apart from file pages, which
    VmHWM counts too."""

    def __init__(self) -> None:
        """Start sampling."""
        self.base = anon_rss()
        self.peak = self.base
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(0.002):
            self.peak = max(self.peak, anon_rss())

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, anon_rss())

    @property
    def extra(self) -> int:
        return max(0, self.peak - self.base)


class WritePhase:
    """The peak extra RSS of a commit's write phase (`mvc.repo.pipeline.write`: encoding and
    storing, after the plan), apart from the plan's: what a commit of a device state holds on the
    host at its deepest, since everything after the plan runs there whatever the state's device.
    The high-water mark is reset when the write starts (`before`: the step's peak until then)."""

    def __init__(self, base_rss: int) -> None:
        self.base = base_rss
        self.before = 0
        self.peak: int | None = None
        self.seconds = 0.0   # the write phase's time: the rest of the commit is its plan

    def __enter__(self) -> WritePhase:
        from unittest import mock

        import mvc.repo.pipeline as pipeline

        write = pipeline.write

        def measured(*a: Any, **k: Any) -> Any:
            before = peak() - self.base
            t0 = time.perf_counter()
            try:
                if not reset_peak():   # no phase of its own to measure on this kernel
                    return write(*a, **k)
                self.before = max(self.before, before)
                try:
                    return write(*a, **k)
                finally:
                    self.peak = max(self.peak or 0, peak() - self.base)
            finally:
                self.seconds += time.perf_counter() - t0
        self._patch = mock.patch.object(pipeline, "write", measured)
        self._patch.__enter__()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._patch.__exit__(*exc)
