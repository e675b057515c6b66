"""A commit leaves the training process's random number generators as it found them.

The search calls the quality function a varying number of times; one that draws randomness (a
random held-out batch, dropout left on) used to advance the process's generators each time, so
the training run after a commit differed from the same run without it. Each call now starts
from the caller's generators and they are put back after the commit (`mvc.search.random_state`),
on the main thread: a background commit's calls run beside the loop, where putting them back
would rewind the loop's own draws.
"""
from __future__ import annotations

import random
import threading

import numpy as np
import pytest
import torch
from checkpoints import adam_state

from mvc.repo.repository import Repo
from mvc.search.random_state import as_the_caller_left_them


def _draws() -> tuple[float, float, float]:
    return float(torch.rand(())), float(np.random.rand()), random.random()


def _states() -> tuple:
    kind, keys, pos, *_ = np.random.get_state()
    return torch.get_rng_state(), (keys.copy(), pos), random.getstate()


def _same(a: tuple, b: tuple) -> bool:
    return (torch.equal(a[0], b[0]) and np.array_equal(a[1][0], b[1][0]) and a[1][1] == b[1][1]
            and a[2] == b[2])


def test_a_commit_with_a_random_quality_function_leaves_the_generators(tmp_path):
    seen: list[tuple[float, float, float]] = []

    def quality(state) -> float:
        seen.append(_draws())
        return float(sum(float(t.float().pow(2).sum()) for t in state["model"].values()))

    state = adam_state(64, 96, 32)
    torch.manual_seed(1)
    np.random.seed(1)
    random.seed(1)
    before = _states()
    with Repo.init(tmp_path / "r") as repo:
        repo.commit(state, "c", quality=quality, epsilon=0.05)
    assert len(seen) > 2
    assert _same(_states(), before)            # the run goes on as if nothing was committed
    assert len(set(seen)) == 1                 # every call saw the same draws (the caller's)


def test_the_generators_come_back_after_an_error():
    before = _states()
    with pytest.raises(ZeroDivisionError), as_the_caller_left_them():
        _draws()
        1 / 0
    assert _same(_states(), before)


def test_off_the_main_thread_the_generators_are_left_alone():
    """There the loop may draw meanwhile: putting the generators back would rewind its draws."""
    after: list[bool] = []

    def body() -> None:
        before = _states()
        with as_the_caller_left_them():
            _draws()
        after.append(_same(_states(), before))

    t = threading.Thread(target=body)
    t.start()
    t.join()
    assert after == [False]
