"""Revision syntax: full ids, unique prefixes, branch/tag names, HEAD, REV~n, REV^, REV^n."""
from __future__ import annotations

import re
from typing import Callable

from mvc.errors import MvcError
from mvc.repo.refs import HEADS, TAGS

_HEX = re.compile(r"^[0-9a-f]{4,32}$")
_SUFFIX = re.compile(r"(~\d*|\^\d*)$")
ID_LEN = 32


class UnknownRevisionError(MvcError):
    """A revision that names nothing in this repository."""

    exit_code = 4


class AmbiguousRevisionError(MvcError):
    """A short id that matches several objects."""

    exit_code = 5


def split_suffixes(rev: str) -> tuple[str, list[tuple[str, int]]]:
    """'main~2^' -> ('main', [('~', 2), ('^', 1)])."""
    steps: list[tuple[str, int]] = []
    while True:
        m = _SUFFIX.search(rev)
        if not m or m.start() == 0:
            break
        tok = m.group(1)
        n = int(tok[1:]) if len(tok) > 1 else 1
        steps.append((tok[0], n))
        rev = rev[: m.start()]
    steps.reverse()
    return rev, steps


def resolve_base(name: str, *, read_ref: Callable[[str], str | None],
                 resolve_ref: Callable[[str], str | None],
                 ids_with_prefix: Callable[[str], list[str]],
                 is_commit: Callable[[str], bool]) -> str:
    """Resolve a revision without suffixes to a commit id."""
    if not name:
        raise UnknownRevisionError("empty revision")
    candidates = [name] if name == "HEAD" or name.startswith("refs/") else [HEADS + name, TAGS + name]
    for ref in candidates:
        if read_ref(ref) is not None:
            target = resolve_ref(ref)
            if target is None:
                raise UnknownRevisionError(f"{name!r} has no commits yet")
            return target
    low = name.lower()
    if _HEX.match(low):
        matches = [m for m in ids_with_prefix(low) if is_commit(m)]
        if len(matches) == 1:
            return matches[0]
        if len(matches) > 1:
            listing = ", ".join(m[:12] for m in matches[:10])
            raise AmbiguousRevisionError(
                f"short id {name!r} is ambiguous; candidates: {listing}"
                + (" ..." if len(matches) > 10 else ""))
    raise UnknownRevisionError(f"unknown revision {name!r}")
