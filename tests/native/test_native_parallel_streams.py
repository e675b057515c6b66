"""The pool's tasks run on the calling thread's CUDA device and streams (`parallel.pmap`).

A new thread's current device is 0 and its current stream each device's default one, so a task
that touches a tensor its caller made inside ``torch.cuda.stream(s)`` (a commit's levels
crossing to the host, a moment measured, a checkout's lookup) would be ordered after none of
the caller's work on `s`. CUDA is stood in for here (this machine may have none): what each
task sees as current is recorded; tests/repo/test_device_boundaries.py has the CUDA-marked
commit and checkout inside a side stream.
"""
from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from types import SimpleNamespace
from typing import Any

import pytest
import torch

from mvc.native import parallel


class FakeStream:
    def __init__(self, device: int, sid: int) -> None:
        self.device = torch.device("cuda", device)
        self.sid = sid

    def __eq__(self, other: object) -> bool:
        return isinstance(other, FakeStream) and (self.device, self.sid) == (other.device, other.sid)

    def __hash__(self) -> int:
        return hash((self.device, self.sid))


class FakeCuda:
    """torch.cuda as far as the pool asks: per-thread current device and per-device streams."""

    def __init__(self, devices: int) -> None:
        self.n = devices
        self.local = threading.local()
        self.entered = 0

    def _state(self) -> SimpleNamespace:
        st = getattr(self.local, "st", None)
        if st is None:
            st = self.local.st = SimpleNamespace(device=0, streams={})
        return st

    def is_initialized(self) -> bool:
        return True

    def device_count(self) -> int:
        return self.n

    def current_device(self) -> int:
        return self._state().device

    def default_stream(self, device: Any) -> FakeStream:
        return FakeStream(torch.device(device).index, 0)

    def current_stream(self, device: int) -> FakeStream:
        return self._state().streams.get(device, FakeStream(device, 0))

    @contextmanager
    def device(self, index: int) -> Iterator[None]:
        st = self._state()
        prev, st.device = st.device, index
        self.entered += 1
        try:
            yield
        finally:
            st.device = prev

    @contextmanager
    def stream(self, s: FakeStream) -> Iterator[None]:
        st = self._state()
        d = s.device.index
        prev, st.streams[d] = st.streams.get(d), s
        prev_dev, st.device = st.device, d   # as torch's: the stream's device becomes current
        try:
            yield
        finally:
            st.device = prev_dev
            if prev is None:
                del st.streams[d]
            else:
                st.streams[d] = prev


@pytest.fixture
def fake_cuda(monkeypatch):
    fake = FakeCuda(devices=3)
    monkeypatch.setattr(torch, "cuda", fake)
    monkeypatch.setenv("MVC_THREADS", "2")
    return fake


def seen(fake: FakeCuda) -> tuple[int, int, dict[int, int], bool]:
    """(device, stream id on devices 0..2) as a task sees them, and whether it ran on a pool thread."""
    return (fake.current_device(), fake.current_stream(1).sid,
            {d: fake.current_stream(d).sid for d in range(3)}, parallel.in_worker())


def test_tasks_run_on_the_callers_device_and_streams(fake_cuda):
    side = FakeStream(1, 7)
    with fake_cuda.stream(side), fake_cuda.device(2):
        got = parallel.pmap(lambda _: seen(fake_cuda), range(8))
    assert any(w for *_, w in got)        # the pool ran them, not this thread alone
    assert {(d, s, tuple(sorted(m.items()))) for d, s, m, _ in got} == {(2, 7, ((0, 0), (1, 7), (2, 0)))}


def test_a_pool_thread_is_left_as_it_was_after_a_task(fake_cuda):
    with fake_cuda.stream(FakeStream(1, 7)):
        parallel.pmap(lambda _: None, range(8))
    # the same pool threads, for a caller on the defaults: they see the defaults again
    got = parallel.pmap(lambda _: seen(fake_cuda), range(8))
    assert {(d, tuple(sorted(m.items()))) for d, _, m, _ in got} == {(0, ((0, 0), (1, 0), (2, 0)))}


def test_only_the_streams_a_caller_chose_are_entered(fake_cuda):
    entered: list[FakeStream] = []
    stream = fake_cuda.stream

    def recording(s: FakeStream) -> Any:
        entered.append(s)
        return stream(s)

    fake_cuda.stream = recording  # type: ignore[method-assign]
    parallel.pmap(lambda _: None, range(4))
    assert entered == []              # a caller on the defaults: no other device made current
    with stream(FakeStream(2, 5)):
        parallel.pmap(lambda _: None, range(4))
    assert set(entered) == {FakeStream(2, 5)}


def test_without_cuda_initialized_nothing_is_entered(monkeypatch):
    from contextlib import nullcontext

    def fn(x: int) -> int:
        return x

    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: False)
    assert parallel.callers_cuda() is nullcontext
    assert parallel._under(nullcontext, fn) is fn
