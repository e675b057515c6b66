"""Which checkpoint files on disk hold a committed state, and which hold work mvc has not stored.

`mvc commit FILE` and `mvc checkout REV [-o FILE]` leave a *stamp* of the file they read or
wrote -- the commit, the resolved path, its size, mtime and inode -- in the store's metadata.
A file whose stat still matches a stamp is that commit's checkpoint: `status` reports it as
unchanged, and `checkout` may write over it, because the repository can give it back. Any
other existing file (edited since, or never seen) holds work only the file has, which
`checkout` refuses to destroy unless forced (DESIGN.md invariant 10).

Stat, not a content hash, as git's index does: a stamp costs nothing to take or check, at
the price of calling a file modified when only its mtime moved (`touch`), which errs on the
safe side.
"""
from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from mvc.store.contracts import StoreMaintenance

#: The checkpoint file the working tree tracks: the last file committed, or written by a
#: checkout to `checkpoint.path` (`status` and `diff` default to it). Its format predates
#: the stamps' table and other readers parse it, so it keeps its keys.
CURRENT_KEY = "worktree"
#: Every file committed or written by a checkout, by resolved path.
KNOWN_KEY = "worktree.known"
#: Stamps kept; the oldest go first. A forgotten stamp only makes `checkout` ask for --force.
MAX_KNOWN = 256


@dataclass(frozen=True)
class Stamp:
    """What a file held when mvc last committed or wrote it."""

    commit: str
    path: str  #: resolved
    size: int
    mtime_ns: int
    ino: int | None = None  #: None in stamps written before inodes were kept
    #: Written by a checkout with --only / --weights-only: part of `commit`, not its checkpoint.
    partial: bool = False

    @classmethod
    def of(cls, path: str | os.PathLike, commit: str, st: os.stat_result | None = None, *,
           partial: bool = False) -> Stamp:
        """The stamp of `path` as it is now (or as `st`, taken earlier, says it was)."""
        p = Path(path)
        st = p.stat() if st is None else st
        return cls(commit, str(p.resolve()), st.st_size, st.st_mtime_ns, st.st_ino, partial)

    def matches(self, path: Path, st: os.stat_result) -> bool:
        """True when the file at `path` (stat `st`) is still the one stamped."""
        return (self.path == str(path.resolve()) and self.size == st.st_size
                and self.mtime_ns == st.st_mtime_ns and self.ino in (None, st.st_ino))


def _parse(raw: object) -> Stamp | None:
    """A stamp from stored JSON; None for anything malformed (metadata is a hint, not data)."""
    if not isinstance(raw, dict):
        return None
    try:
        return Stamp(str(raw["commit"]), str(raw["path"]), int(raw["size"]), int(raw["mtime_ns"]),
                     None if raw.get("ino") is None else int(raw["ino"]), bool(raw.get("partial", False)))
    except (KeyError, TypeError, ValueError):
        return None


def _load_json(meta: StoreMaintenance, key: str) -> object:
    raw = meta.get_meta(key)
    if not raw:
        return None
    try:
        return json.loads(raw)
    except ValueError:
        return None


def current(meta: StoreMaintenance) -> Stamp | None:
    """The stamp of the checkpoint file the working tree tracks, if any."""
    return _parse(_load_json(meta, CURRENT_KEY))


def _known(meta: StoreMaintenance) -> dict[str, Stamp]:
    table = _load_json(meta, KNOWN_KEY)
    out: dict[str, Stamp] = {}
    if isinstance(table, dict):
        for raw in table.values():
            s = _parse(raw)
            if s is not None:
                out[s.path] = s
    return out


def record(meta: StoreMaintenance, stamp: Stamp, *, track: bool = False) -> None:
    """Remember `stamp`; with `track`, also as the file the working tree tracks."""
    if track:
        meta.set_meta(CURRENT_KEY, json.dumps(asdict(stamp)).encode())
    table = _known(meta)
    table.pop(stamp.path, None)  # re-inserted last: the newest survives trimming
    table[stamp.path] = stamp
    keep = list(table.values())[-MAX_KNOWN:]
    meta.set_meta(KNOWN_KEY, json.dumps({s.path: asdict(s) for s in keep}).encode())


def stamp_of(meta: StoreMaintenance, path: str | os.PathLike) -> Stamp | None:
    """The stamp the file at `path` still matches -- the commit it holds -- or None when it
    is missing, was modified since mvc last committed or wrote it, or was never seen."""
    p = Path(path)
    try:
        st = p.stat()
    except OSError:
        return None
    key = str(p.resolve())
    for s in (_known(meta).get(key), current(meta)):
        # The tracked stamp too: repositories from before the table have only it.
        if s is not None and s.matches(p, st):
            return s
    return None


def holds_unstored_work(meta: StoreMaintenance, path: str | os.PathLike) -> bool:
    """True when writing over `path` would destroy a file the repository cannot give back:
    it exists (a file, or a link to one) and matches no stamp."""
    p = Path(path)
    return p.is_file() and stamp_of(meta, p) is None
