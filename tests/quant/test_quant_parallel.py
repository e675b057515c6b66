"""The quantizer's native kernels run on the one shared thread pool (mvc.native.parallel), and a
failing chunk never leaves other chunks writing into the caller's tensors (issue 13)."""
from __future__ import annotations

import threading
import time

import pytest
import torch

from mvc.native import parallel
from mvc.quant import _kernels


@pytest.fixture
def four_threads(monkeypatch):
    monkeypatch.setattr(torch, "get_num_threads", lambda: 4)
    monkeypatch.setenv("MVC_THREADS", "4")


def _run_failing(fail_at: int, slow: float) -> tuple[list[int], list[int]]:
    """parallel_chunks over 4 chunks where chunk `fail_at` raises at once and the others take
    `slow` seconds; (chunks finished when it raised, chunks finished a while later)."""
    done: list[int] = []
    lock = threading.Lock()

    def fn(a: int, b: int) -> None:
        if a // 10 == fail_at:
            raise RuntimeError(f"chunk {fail_at} fails")
        time.sleep(slow)
        with lock:
            done.append(a // 10)

    with pytest.raises(RuntimeError, match=f"chunk {fail_at} fails"):
        _kernels.parallel_chunks(40, fn, min_chunk=1)
    at_raise = sorted(done)
    time.sleep(slow + 0.3)
    return at_raise, sorted(done)


@pytest.mark.parametrize("fail_at", [0, 1])
def test_a_failing_chunk_waits_for_every_other_chunk(four_threads, fail_at):
    # Chunks write through raw data_ptr() pointers: one still running after the error
    # reached the caller would write into tensors the caller may already have freed.
    at_raise, later = _run_failing(fail_at, slow=0.3)
    assert at_raise == later, "chunks kept running after parallel_chunks raised"


def test_chunks_run_on_the_shared_native_pool(four_threads):
    names: set[str] = set()
    lock = threading.Lock()

    def fn(a: int, b: int) -> None:
        time.sleep(0.05)
        with lock:
            names.add(threading.current_thread().name)

    _kernels.parallel_chunks(40, fn, min_chunk=1)
    assert names and all(n.startswith("mvc-native") for n in names), names
    assert not hasattr(_kernels, "_POOL")


def test_inside_a_pool_task_chunks_run_inline(four_threads):
    # No nested fan-out (and no deadlock) when a kernel runs inside a pool task.
    def task(_: int) -> set[str]:
        seen: set[str] = set()
        _kernels.parallel_chunks(40, lambda a, b: seen.add(threading.current_thread().name),
                                 min_chunk=1)
        return seen | {threading.current_thread().name}

    for seen in parallel.pmap(task, range(4)):
        assert len(seen) == 1


def test_results_match_one_thread(four_threads, monkeypatch):
    x = torch.randn(1_200_000)  # four chunks of MIN_CHUNK or more
    mids = torch.linspace(-2, 2, 15)
    out4 = torch.empty(x.numel(), dtype=torch.uint8)
    _kernels.assign_into(x, mids, out4)
    monkeypatch.setattr(torch, "get_num_threads", lambda: 1)
    out1 = torch.empty_like(out4)
    _kernels.assign_into(x, mids, out1)
    assert torch.equal(out1, out4)
