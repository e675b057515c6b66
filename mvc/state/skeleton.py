"""How deep a stored state skeleton nests (`unflatten` refuses more than MAX_SKELETON_DEPTH):
snapshot decoding checks it before any tensor is read.  No torch here, so reading history
does not load it."""
from __future__ import annotations

from typing import Any

#: Deepest container nesting `unflatten` rebuilds. `flatten` cannot produce more than ~330
#: (it recurses three frames a level under Python's default limit of 1000); a stored skeleton
#: nested deeper is hostile, and is refused before recursing into it.
MAX_SKELETON_DEPTH = 400


def skeleton_depth(root: Any, limit: int = MAX_SKELETON_DEPTH) -> int:
    """How deep `unflatten` would recurse into the skeleton node `root` (0: a leaf), counted
    without recursion; stops counting once past `limit`, so hostile input costs little."""
    deepest = 0
    stack = [(root, 0)]
    while stack:
        node, depth = stack.pop()
        if depth > deepest:
            deepest = depth
            if deepest > limit:
                break
        stack.extend((child, depth + 1) for child in _children(node))
    return deepest


def _children(node: Any) -> list:
    """The nodes `_Builder.decode` recurses into from `node` (malformed parts: none)."""
    if isinstance(node, list):
        return node
    if not isinstance(node, dict):
        return []
    tag = node.get("t")
    if tag in ("tuple", "set", "frozenset"):
        items = node.get("v")
        return items if isinstance(items, list) else []
    if tag in ("dict", "odict"):
        items = node.get("items")
        out = [x for pair in items if isinstance(pair, list) for x in pair] if isinstance(items, list) else []
        if "meta" in node:
            out.append(node["meta"])
        return out
    return []
