"""Revision syntax: full ids, unique prefixes, branch/tag names, remote-tracking branches
(``origin/main``), HEAD, REF@{n}, REV~n, REV^, REV^n."""
from __future__ import annotations

import re
from typing import Callable, NamedTuple, Sequence

from mvc.errors import MvcError
from mvc.repo.refs import FETCH_HEAD, HEAD, HEADS, REMOTES, TAGS, is_symbolic, symbolic_target
from mvc.store import InvalidRefError, ReflogEntry

_HEX = re.compile(r"^[0-9a-f]{4,32}$")
_SUFFIX = re.compile(r"(~\d*|\^\d*)$")
_AT = re.compile(r"^(.*)@\{(\d+)\}$")
ID_LEN = 32
#: The ref namespaces whose refs name commits as revisions (full names and short ones).
NAMING = (HEADS, TAGS, REMOTES)


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


class Resolved(NamedTuple):
    """What a revision without suffixes names: the commit id, and the ref it was read through."""

    oid: str
    #: The full ref name (``refs/heads/main``, ``refs/tags/v1``) the id was read from, or None
    #: for an id or prefix; for ``HEAD`` the ref HEAD is attached to, if any.
    ref: str | None


def check_spelling(rev: str) -> None:
    """Refuse a revision with whitespace, saying so: revisions are never trimmed, because a
    trimmed `" main"` that reads `main` but does not attach HEAD to it is worse than an error."""
    if not isinstance(rev, str):
        raise UnknownRevisionError(f"a revision must be a string, got {type(rev).__name__}")
    if rev != rev.strip():
        raise UnknownRevisionError(
            f"unknown revision {rev!r}: it has surrounding whitespace (revisions are never "
            f"trimmed); did you mean {rev.strip()!r}?")
    if any(c.isspace() for c in rev):
        raise UnknownRevisionError(f"unknown revision {rev!r}: revisions contain no whitespace")


def resolve_base(name: str, *, read_ref: Callable[[str], str | None],
                 resolve_ref: Callable[[str], str | None],
                 ids_with_prefix: Callable[[str], list[str]],
                 is_commit: Callable[[str], bool],
                 reflog: Callable[[str], Sequence[ReflogEntry]] | None = None) -> Resolved:
    """Resolve a revision without suffixes to a commit id, in this order:

    a full id of an existing commit (it wins over any name), ``HEAD``, ``FETCH_HEAD`` (what
    the last fetch of one revision took; never attached), a full ref
    name (``refs/heads/X`` / ``refs/tags/X`` / ``refs/remotes/R/X``, exactly that ref),
    a branch, a tag, a remote-tracking branch (``origin/main``: git's order, so a local
    branch named ``origin/main`` wins), then a unique id prefix of 4 hex digits or more.
    ``REF@{n}`` (given `reflog`) is the n-th previous value of REF from its reflog
    (`ref_history`), never attached.  A remote-tracking branch is read-only: it is
    returned as its ``refs/remotes/`` ref, which nothing attaches HEAD to.
    """
    if not name:
        raise UnknownRevisionError("empty revision")
    at = _AT.match(name)
    if at and reflog is not None:
        ref = reflog_ref(at.group(1), read_ref, reflog)
        history = ref_history(ref, reflog)
        n = int(at.group(2))
        if n >= len(history):
            raise UnknownRevisionError(
                f"unknown revision {name!r}: the reflog of {ref} has only {len(history)} entries")
        if not is_commit(history[n].oid):
            raise UnknownRevisionError(f"{name!r}: {history[n].oid[:12]} is not a stored commit")
        return Resolved(history[n].oid, None)
    low = name.lower()
    if len(low) == ID_LEN and _HEX.match(low) and is_commit(low):
        return Resolved(low, None)
    if name == HEAD:
        return _through(HEAD, name, read_ref, resolve_ref)
    if name == FETCH_HEAD and _read(read_ref, FETCH_HEAD) is not None:
        return Resolved(_through(FETCH_HEAD, name, read_ref, resolve_ref).oid, None)
    if name.startswith("refs/"):
        if not name.startswith(NAMING):
            raise UnknownRevisionError(
                f"unknown revision {name!r}: only refs/heads/, refs/tags/ and refs/remotes/ name commits")
        if _read(read_ref, name) is None:
            raise UnknownRevisionError(f"unknown revision {name!r}")
        return _through(name, name, read_ref, resolve_ref)
    for ref in (HEADS + name, TAGS + name, REMOTES + name):
        if _read(read_ref, ref) is not None:
            return _through(ref, name, read_ref, resolve_ref)
    if _HEX.match(low):
        matches = [m for m in ids_with_prefix(low) if is_commit(m)]
        if len(matches) == 1:
            return Resolved(matches[0], None)
        if len(matches) > 1:
            listing = ", ".join(m[:12] for m in matches[:10])
            raise AmbiguousRevisionError(
                f"short id {name!r} is ambiguous; candidates: {listing}"
                + (" ..." if len(matches) > 10 else ""))
    raise UnknownRevisionError(f"unknown revision {name!r}")


def _read(read_ref: Callable[[str], str | None], ref: str) -> str | None:
    # A revision is user input: one that cannot even be a ref name (control characters,
    # too long) names nothing, rather than failing as a malformed store request.
    try:
        return read_ref(ref)
    except InvalidRefError:
        return None


def _reflog_of(reflog: Callable[[str], Sequence[ReflogEntry]], ref: str) -> Sequence[ReflogEntry]:
    try:
        return reflog(ref)
    except InvalidRefError:
        return []


def _through(ref: str, name: str, read_ref: Callable[[str], str | None],
             resolve_ref: Callable[[str], str | None]) -> Resolved:
    """The commit `ref` points at; for a symbolic ref (HEAD), the ref it is attached to."""
    value = read_ref(ref)
    target = resolve_ref(ref)
    if target is None:
        raise UnknownRevisionError(f"{name!r} has no commits yet")
    if value is not None and is_symbolic(value):
        return Resolved(target, symbolic_target(value))
    return Resolved(target, ref)


class Move(NamedTuple):
    """One value a ref had: the commit, since when (UTC epoch seconds), and why it moved."""

    oid: str
    time: float
    reason: str


def reflog_ref(name: str, read_ref: Callable[[str], str | None],
               reflog: Callable[[str], Sequence[ReflogEntry]] | None = None) -> str:
    """The full ref whose reflog ``NAME@{n}`` reads: HEAD (also for an empty NAME), a full
    ref name, else the branch, else the tag, else the remote-tracking branch called NAME,
    else (given `reflog`) a deleted one of that name whose reflog gc has not expired yet
    (``NAME@{0}``: its last tip)."""
    if name in ("", HEAD):
        return HEAD
    if name.startswith(NAMING):
        return name
    candidates = (HEADS + name, TAGS + name, REMOTES + name)
    for ref in candidates:
        if _read(read_ref, ref) is not None:
            return ref
    if reflog is not None:
        for ref in candidates:
            if _reflog_of(reflog, ref):
                return ref
    raise UnknownRevisionError(f"unknown ref {name!r}: no branch or tag of that name")


def ref_history(ref: str, reflog: Callable[[str], Sequence[ReflogEntry]]) -> list[Move]:
    """The commits `ref` named, newest first: entry n is ``REF@{n}`` (0: the current value).

    A branch or tag's history is its reflog. HEAD's own reflog records only HEAD's moves
    (attach, detach); while attached, HEAD moved with its branch, so, as in git, HEAD's
    history also holds the branch's moves of that time, and an attach counts as a move to
    the branch's commit of that moment."""
    entries = list(reflog(ref))
    if ref != HEAD:
        return [Move(e.new, e.time, e.reason) for e in reversed(entries)
                if e.new is not None and not is_symbolic(e.new)]
    moves: list[Move] = []
    logs: dict[str, list[ReflogEntry]] = {}
    for i, e in enumerate(entries):
        if e.new is None:
            continue
        if not is_symbolic(e.new):
            moves.append(Move(e.new, e.time, e.reason))
            continue
        branch = symbolic_target(e.new)
        log = logs.setdefault(branch, list(reflog(branch)))
        until = entries[i + 1].time if i + 1 < len(entries) else float("inf")
        before = [x for x in log if x.time <= e.time and x.new is not None]
        if before:  # None: attached to a branch with no commits yet (init)
            moves.append(Move(str(before[-1].new), e.time, e.reason))
        moves += [Move(x.new, x.time, x.reason) for x in log
                  if e.time < x.time <= until and x.new is not None]
    moves.reverse()
    return moves
