"""Progress bars for CLI commands: on a terminal only, through `rich`.

`terminal_progress()` yields the `mvc.progress.Progress` a command hands to the
operation (`repo.commit(..., progress=p)`): a live bar on stderr when stderr is a
terminal, else `NO_PROGRESS` -- so nothing extra reaches a pipe, a log file or
`--json` output, and `--quiet` (`quiet_option`) silences it. The bar shows the
phase, bytes and items done of their totals, the byte rate and the time left;
it disappears when the command ends (its result line says what happened).

Usage in a command::

    @click.command()
    @quiet_option
    def push(..., quiet: bool) -> None:
        with terminal_progress(quiet=quiet) as progress:
            do_the_work(..., progress=progress)
"""
from __future__ import annotations

import os
import sys
import threading
from contextlib import contextmanager
from typing import Any, Callable, Iterator, TypeVar

import click

from mvc.progress import NO_PROGRESS, Progress

F = TypeVar("F", bound=Callable[..., Any])


def quiet_option(f: F) -> F:
    """The `-q/--quiet` flag (parameter `quiet`): no progress bar."""
    return click.option("-q", "--quiet", is_flag=True, default=False,
                        help="No progress bar (one is shown only on a terminal anyway).")(f)


def progress_wanted(*, quiet: bool = False, json_output: bool = False) -> bool:
    """Whether a command draws a bar: stderr is a terminal, no --quiet, no --json, and not
    turned off by MVC_PROGRESS=0."""
    if quiet or json_output or os.environ.get("MVC_PROGRESS", "") == "0":
        return False
    try:
        return sys.stderr.isatty()
    except (AttributeError, ValueError):  # replaced or closed stderr
        return False


@contextmanager
def terminal_progress(*, quiet: bool = False, json_output: bool = False) -> Iterator[Progress]:
    """A live progress display on stderr for the `with` block, or `NO_PROGRESS` when none is
    wanted (`progress_wanted`). The display is removed when the block ends, also on errors."""
    if not progress_wanted(quiet=quiet, json_output=json_output):
        yield NO_PROGRESS
        return
    bar = _RichProgress()
    bar.start()
    try:
        yield bar
    finally:
        bar.stop()


class _RichProgress:
    """`Progress` drawn by rich: one line per open phase. Thread-safe (rich locks its updates;
    ours guards the current-task bookkeeping)."""

    def __init__(self) -> None:
        from rich.console import Console
        from rich.progress import BarColumn, Progress as Bar, SpinnerColumn, TextColumn, TimeRemainingColumn

        console = Console(file=sys.stderr, stderr=True)
        self._bar = Bar(SpinnerColumn(), TextColumn("{task.description}"), BarColumn(),
                        TextColumn("{task.fields[done]}"), _rate_column(), TextColumn("ETA"),
                        TimeRemainingColumn(), console=console, transient=True)
        self._lock = threading.Lock()
        self._task: Any = None
        self._bytes = self._items = 0
        self._total_bytes: int | None = None
        self._total_items: int | None = None
        self._unit = "tensors"

    def start(self) -> None:
        self._bar.start()

    def stop(self) -> None:
        self.end()
        self._bar.stop()

    def phase(self, description: str, *, total_bytes: int | None = None,
              total_items: int | None = None, unit: str = "tensors") -> None:
        self.end()
        with self._lock:
            self._bytes = self._items = 0
            self._total_bytes, self._total_items, self._unit = total_bytes, total_items, unit
            # The bar measures bytes when their total is known, else items.
            by_bytes = total_bytes is not None or total_items is None
            self._task = self._bar.add_task(description, total=total_bytes if by_bytes else total_items,
                                            done=self._done_text(), unit="B" if by_bytes else unit)
            # Drawn now, not at the next tick: every phase shows, however short.
            self._bar.refresh()

    def advance(self, nbytes: int = 0, items: int = 0) -> None:
        with self._lock:
            if self._task is None:
                return
            self._bytes += nbytes
            self._items += items
            by_bytes = self._total_bytes is not None or self._total_items is None
            self._bar.update(self._task, advance=nbytes if by_bytes else items, done=self._done_text())

    def end(self) -> None:
        with self._lock:
            if self._task is not None:
                self._bar.refresh()
                self._bar.remove_task(self._task)
                self._task = None

    def _done_text(self) -> str:
        from mvc.cli.format import human_bytes

        parts = []
        if self._total_bytes is not None or self._bytes:
            total = f"/{human_bytes(self._total_bytes)}" if self._total_bytes is not None else ""
            parts.append(f"{human_bytes(self._bytes)}{total}")
        total = f"/{self._total_items}" if self._total_items is not None else ""
        parts.append(f"{self._items}{total} {self._unit}")
        return "  ".join(parts)


def _rate_column() -> Any:
    from rich.progress import ProgressColumn
    from rich.text import Text

    class RateColumn(ProgressColumn):
        """Bytes (or items) per second over the last few updates, or since the phase began
        while there are too few updates to tell (rich needs two: a phase that moves in a
        few big steps would show no rate at all)."""

        def render(self, task: Any) -> Text:
            from mvc.cli.format import human_bytes

            speed = task.finished_speed or task.speed
            if speed is None and task.completed and task.elapsed:
                speed = task.completed / task.elapsed
            if speed is None:
                return Text("", style="progress.data.speed")
            unit = task.fields.get("unit", "B")
            text = f"{human_bytes(speed)}/s" if unit == "B" else f"{speed:.1f} {unit}/s"
            return Text(text, style="progress.data.speed")

    return RateColumn()
