"""The lanes `mvc log --graph` draws: one column per line of history, as git draws them.

Each commit gets a row (`*` in its lane, `|` in the others), the lines under it (author,
date, message) continue the lanes, and transition lines (`/` and `\\`) show where a
branch joins the lane of the parent it forked from, or where a merge opens a lane for its
other parents.  Only the commits given are drawn: a lane whose parent was cut off by `-n`
runs to the bottom.
"""
from __future__ import annotations

import heapq
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Protocol


class _Node(Protocol):
    @property
    def id(self) -> str: ...

    @property
    def parents(self) -> list[str]: ...


@dataclass(frozen=True)
class GraphRow:
    """How to draw one commit: `row` precedes its first line, `pad` its other lines, and
    `after` are the transition lines drawn below them."""

    commit: _Node
    row: str
    pad: str
    after: list[str]


def children_first(commits: Sequence[_Node]) -> list[_Node]:
    """`commits` reordered so that every commit comes before its parents, otherwise in the
    given order (commit times can tie or go backwards across machines)."""
    index = {c.id: i for i, c in enumerate(commits)}
    waiting = {c.id: 0 for c in commits}
    for c in commits:
        for p in set(c.parents):
            if p in waiting:
                waiting[p] += 1
    ready = [i for i, c in enumerate(commits) if waiting[c.id] == 0]
    heapq.heapify(ready)
    out: list[_Node] = []
    while ready:
        c = commits[heapq.heappop(ready)]
        out.append(c)
        for p in set(c.parents):
            if p in waiting:
                waiting[p] -= 1
                if waiting[p] == 0:
                    heapq.heappush(ready, index[p])
    if len(out) < len(commits):  # a cycle cannot be stored (ids are hashes); keep the rest
        seen = {c.id for c in out}
        out += [c for c in commits if c.id not in seen]
    return out


def _lanes(cells: dict[int, str], width: int) -> str:
    return "".join(cells.get(i, " ") for i in range(width)).rstrip()


def _transition(edges: list[tuple[int, int]]) -> list[str]:
    """Lines moving each lane from column `src` to column `dst`, one step per line."""
    pos = [src for src, _ in edges]
    lines: list[str] = []
    while any(p != dst for p, (_, dst) in zip(pos, edges)):
        cells: dict[int, str] = {}
        for k, (_, dst) in enumerate(edges):
            p = pos[k]
            if p > dst:
                cells.setdefault(2 * p - 1, "/")
                pos[k] = p - 1
            elif p < dst:
                cells.setdefault(2 * p + 1, "\\")
                pos[k] = p + 1
            else:
                cells[2 * p] = "|"
        lines.append(_lanes(cells, max(cells) + 1))
    return lines


def draw(commits: Sequence[_Node]) -> Iterator[GraphRow]:
    """The graph rows of `commits` (newest first), children always above their parents."""
    lanes: list[str] = []   # the commit each lane is waiting for
    for c in children_first(commits):
        if c.id not in lanes:
            lanes.append(c.id)
        col = lanes.index(c.id)
        width = 2 * len(lanes)
        row = _lanes({2 * i: "*" if i == col else "|" for i in range(len(lanes))}, width)
        parents = list(dict.fromkeys(c.parents))
        flows = [parents if i == col else ([] if lane == c.id else [lane])
                 for i, lane in enumerate(lanes)]
        new: list[str] = []
        for f in flows:
            new += [p for p in f if p not in new]
        edges = [(i, new.index(p)) for i, f in enumerate(flows) for p in f]
        # Not stripped: the text under a root commit keeps its lane's column.
        pad = " ".join("|" if f else " " for f in flows)
        after = _transition(edges) if any(s != d for s, d in edges) else []
        lanes = new
        yield GraphRow(c, row, pad, after)
