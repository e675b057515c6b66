"""The store's in-process reader/writer lock under Ctrl-C.

Python raises KeyboardInterrupt in the main thread wherever it is running, a call into
`threading.Condition.__exit__` included. An interrupt that landed between a reader's count and
the ``try`` that undoes it left the lock counted for good, and the process's next commit
(an exclusive holder) waited for ever: a notebook user's Ctrl-C during a checkout, then a commit.
Found by review (93% of interrupts injected in a checkout's store calls left a reader counted).
"""
from __future__ import annotations

import threading
from typing import Any

import pytest

from mvc.store.lock import SharedExclusiveLock


class _Interrupting:
    """A Condition whose `which`-th ``__exit__`` (1-based) raises KeyboardInterrupt after
    releasing: Ctrl-C landing in threading.Condition's own Python code."""

    def __init__(self, which: int) -> None:
        self.cond = threading.Condition(threading.Lock())
        self.which, self.exits = which, 0

    def __enter__(self) -> Any:
        return self.cond.__enter__()

    def __exit__(self, *exc: Any) -> None:
        self.cond.__exit__(*exc)
        self.exits += 1
        if self.exits == self.which:
            raise KeyboardInterrupt("Ctrl-C")

    def wait(self, timeout: float | None = None) -> bool:
        return self.cond.wait(timeout)

    def notify_all(self) -> None:
        self.cond.notify_all()


def _free(lock: SharedExclusiveLock) -> bool:
    """Whether a writer gets the lock within 2 s (from another thread: a hang fails the test)."""
    got: list[bool] = []

    def take() -> None:
        with lock.exclusive():
            got.append(True)

    t = threading.Thread(target=take, daemon=True)
    t.start()
    t.join(2.0)
    return got == [True]


@pytest.mark.parametrize("which", [1, 2], ids=["taking", "giving back"])
@pytest.mark.parametrize("mode", ["shared", "exclusive"])
def test_ctrl_c_inside_the_lock_leaves_it_free(which: int, mode: str) -> None:
    lock = SharedExclusiveLock()
    lock._cond = _Interrupting(which)  # type: ignore[assignment]
    with pytest.raises(KeyboardInterrupt):
        with getattr(lock, mode)():
            pass
    assert (lock._readers, lock._writer, lock._writers_waiting) == (0, False, 0)
    lock._cond = threading.Condition(threading.Lock())
    assert _free(lock)


def test_readers_share_and_a_writer_waits_for_them() -> None:
    lock = SharedExclusiveLock()
    with lock.shared(), lock.shared():
        assert lock._readers == 2
        assert not _free_within(lock, 0.2)
    assert _free(lock)


def _free_within(lock: SharedExclusiveLock, seconds: float) -> bool:
    got = threading.Event()

    def take() -> None:
        with lock.exclusive():
            got.set()

    threading.Thread(target=take, daemon=True).start()
    return got.wait(seconds)
