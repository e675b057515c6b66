"""Shared formatting for CLI output: sizes, ratios, tables, JSON, and escaping.

Everything the CLI prints that a user or a stored object provided (messages, names,
authors, paths, metric and tensor names, error messages) goes through `escape`
(`echo` and `table` apply it), so an escape sequence in a commit message is shown,
never run by the terminal. `--json` output is exact: JSON escapes control characters.
"""
from __future__ import annotations

import json
import math
from typing import Any, Sequence

import click


def _escapes(keep: str) -> dict[int, str]:
    table_: dict[int, str] = {}
    for c in range(0x20):  # C0: caret notation, like `cat -v`
        table_[c] = "^" + chr(c + 0x40)
    table_[0x7F] = "^?"
    for c in range(0x80, 0xA0):  # C1: U+009B is CSI on terminals that honour 8-bit controls
        table_[c] = f"\\x{c:02x}"
    # Bidirectional overrides / isolates reorder what is displayed (the "Trojan Source" trick),
    # and Unicode line / paragraph separators break lines on some terminals.
    for c in (*range(0x202A, 0x202F), *range(0x2066, 0x206A), 0x200E, 0x200F, 0x061C,
              0x2028, 0x2029):
        table_[c] = f"\\u{c:04x}"
    for ch in keep:
        del table_[ord(ch)]
    return table_


_ONE_LINE = _escapes("")
_MULTI_LINE = _escapes("\n\t")


def escape(text: object, *, multiline: bool = False) -> str:
    """`text` with every terminal control character made visible: C0 as `^X` (ESC is `^[`),
    DEL as `^?`, C1 as `\\xNN`, bidi controls as `\\uNNNN`. `multiline` keeps newline and
    tab (a commit message's layout); otherwise the result is always one line."""
    return str(text).translate(_MULTI_LINE if multiline else _ONE_LINE)


def echo(text: object = "", *, multiline: bool = False, err: bool = False) -> None:
    """`click.echo` of `escape(text)`: the one way commands print user-provided text."""
    click.echo(escape(text, multiline=multiline), err=err)


def message_lines(message: str) -> list[str]:
    """A commit message's lines for display, each escaped (tabs kept, every other control
    shown; a CRLF line end is a line end)."""
    # After escaping, "\n" is the only line boundary left for splitlines to act on.
    return escape(message.replace("\r\n", "\n"), multiline=True).splitlines()


def human_bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TiB"


def ratio(r: float) -> str:
    return "inf" if math.isinf(r) else f"{r:.2f}x"


def table(rows: Sequence[Sequence[Any]], headers: Sequence[str], align: str | None = None) -> str:
    """A plain-text table; `align` is a string of 'l'/'r' per column."""
    cells = [[escape(c) for c in r] for r in rows]
    widths = [len(h) for h in headers]
    for r in cells:
        widths = [max(w, len(c)) for w, c in zip(widths, r)]
    align = align or "l" * len(headers)

    def fmt(r: Sequence[str]) -> str:
        return "  ".join(c.rjust(w) if a == "r" else c.ljust(w)
                         for c, w, a in zip(r, widths, align)).rstrip()

    lines = [fmt(list(headers)), fmt(["-" * w for w in widths])]
    lines += [fmt(r) for r in cells]
    return "\n".join(lines)


def echo_json(obj: Any) -> None:
    click.echo(json.dumps(obj, indent=2, sort_keys=False, default=str))
