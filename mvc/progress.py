"""Progress reporting for long operations (commit, checkout, gc, fsck, push/pull).

The library itself never draws anything: an operation takes an optional
`progress` argument (a `Progress`) and reports through it; `NO_PROGRESS`, the
default, ignores every call.  The CLI passes a terminal renderer
(`mvc.cli.progress`) when stderr is a terminal, so scripts, pipes and `--json`
output see nothing extra.

An operation reports in *phases*: `phase(...)` starts one with its totals (None
when unknown: a spinner), `advance(...)` adds what was done (from any thread),
and `end()` closes it.  Bytes are the raw (uncompressed) tensor bytes handled.
"""
from __future__ import annotations

from contextlib import contextmanager
from typing import Iterator, Protocol


class Progress(Protocol):
    """What an operation reports its progress to. Calls may come from worker threads."""

    def phase(self, description: str, *, total_bytes: int | None = None,
              total_items: int | None = None, unit: str = "tensors") -> None:
        """Start a phase (the previous one, if open, ends)."""

    def advance(self, nbytes: int = 0, items: int = 0) -> None:
        """Add `nbytes` bytes and `items` items done to the current phase."""

    def end(self) -> None:
        """End the current phase."""


class _NoProgress:
    """Ignores everything: the library's default."""

    def phase(self, description: str, *, total_bytes: int | None = None,
              total_items: int | None = None, unit: str = "tensors") -> None:
        pass

    def advance(self, nbytes: int = 0, items: int = 0) -> None:
        pass

    def end(self) -> None:
        pass


#: The default of every `progress=` parameter: reports nothing.
NO_PROGRESS: Progress = _NoProgress()


@contextmanager
def phase(progress: Progress | None, description: str, *, total_bytes: int | None = None,
          total_items: int | None = None, unit: str = "tensors") -> Iterator[Progress]:
    """`progress.phase(...)` ... `progress.end()` as a `with` block (None: `NO_PROGRESS`)."""
    p = progress if progress is not None else NO_PROGRESS
    p.phase(description, total_bytes=total_bytes, total_items=total_items, unit=unit)
    try:
        yield p
    finally:
        p.end()
