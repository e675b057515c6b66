"""Partial states: a skeleton pruned to the selected tensors, for partial checkout.

A tensor is named by its key path as `flatten` names it (``model/fc.weight``,
``optimizer/state/0/exp_avg``; a tensor that is the whole state: ``tensor``).

``only`` patterns select tensors: a tensor is kept when any pattern matches, by
`fnmatch` (case-sensitive; ``*`` also crosses ``/``), its name, or its name with
``/`` written as ``.`` (so ``model.*`` selects ``model/fc.weight``), or when the
pattern names a container on its path (``model`` selects everything under it).

``weights_only`` drops optimizer state, which is precisely:

- the whole value of any dict key in `OPTIMIZER_KEYS` (``optimizer``,
  ``optimizer_states``, ...), at any depth, non-tensor leaves (``param_groups``)
  included;
- any tensor named like flattened optimizer state, ``.../state/<i>/<key>``
  (`mvc.quant.optimizer.OPTIMIZER_STATE_PATTERNS`: Adam's ``exp_avg``,
  ``exp_avg_sq``, ``step``, SGD's ``momentum_buffer``), e.g. an optimizer's
  ``state_dict()`` stored under another key; and state keyed by parameter name,
  ``.../state/<fqn>/<moment or step>`` (`mvc.quant.optimizer.is_state_name`), as
  ``get_optimizer_state_dict`` gives it.

Everything else stays: non-tensor leaves (step counters, config, RNG state) are
small and always kept; a container emptied by the pruning is dropped, one that
was empty already is kept.  Sequences close up (a list that loses an element is
shorter).  Both selections together keep the tensors each keeps.
"""
from __future__ import annotations

from collections.abc import Sequence
from fnmatch import fnmatchcase
from typing import Any

from mvc.errors import UsageError
from mvc.quant.optimizer import is_state_name
from mvc.state.nested import _ROOT_NAME, _Builder, _segment

#: Dict keys whose whole value is optimizer state for `weights_only`.
OPTIMIZER_KEYS = frozenset({
    "optimizer", "optimizers", "optimizer_state", "optimizer_states", "optimizer_state_dict",
    "optim", "optim_state", "optim_state_dict",
})

_DROP = object()  # a pruned node


def prune(skeleton: dict, *, only: Sequence[str] | None = None, weights_only: bool = False) -> dict:
    """`skeleton` (as `flatten` made it) restricted to the selected tensors (module docstring).

    The result's ``entries`` holds only the stored tensors the pruned state needs, so
    a reader can read just those.  Raises `UsageError` when nothing is selected.
    """
    walker = _Pruner(skeleton, list(only) if only else None, weights_only)
    root = walker.walk(skeleton["root"], ())
    if root is _DROP or (only and not walker.kept):
        what = f"--only {' '.join(only)}" if only else "--weights-only"
        raise UsageError(f"no tensor of the stored state matches {what}")
    objects = skeleton["objects"]
    needed = {objects[int(o)]["entry"] for o in walker.kept}
    entries = {name: info for name, info in skeleton["entries"].items() if name in needed}
    return dict(skeleton, root=root, entries=entries)


class _Pruner:
    def __init__(self, skeleton: dict, only: list[str] | None, weights_only: bool) -> None:
        self.only = only
        self.weights_only = weights_only
        self.keys = _Builder({"objects": [], "entries": {}}, {}, None)  # decodes keys (no tensors)
        self.kept: set[int] = set()  # object indices of the selected tensors

    def walk(self, node: Any, path: tuple) -> Any:
        if isinstance(node, list):
            return self._sequence(node, path)
        if not isinstance(node, dict):
            return node
        tag = node.get("t")
        if tag == "tensor":
            if not self._select(path):
                return _DROP
            self.kept.add(int(node["o"]))
            return node
        if tag == "tuple":
            items = self._sequence(node["v"], path)
            return _DROP if items is _DROP else dict(node, v=items)
        if tag in ("dict", "odict"):
            return self._mapping(node, path)
        return node  # sets (no tensors inside) and leaves

    def _sequence(self, items: list, path: tuple) -> Any:
        out = [new for i, item in enumerate(items) if (new := self.walk(item, path + (i,))) is not _DROP]
        return _DROP if items and not out else out

    def _mapping(self, node: dict, path: tuple) -> Any:
        items = []
        for key, item in node["items"]:
            k = self.keys.decode(key)
            if self.weights_only and type(k) is str and k in OPTIMIZER_KEYS:
                continue
            new = self.walk(item, path + (k,))
            if new is not _DROP:
                items.append([key, new])
        if node["items"] and not items:
            return _DROP
        out = dict(node, items=items)
        if "meta" in node:
            meta = self.walk(node["meta"], path + ("_metadata",))
            if meta is _DROP:
                del out["meta"]
            else:
                out["meta"] = meta
        return out

    def _select(self, path: tuple) -> bool:
        name = "/".join(_segment(k) for k in path) or _ROOT_NAME
        if self.weights_only and is_state_name(name):
            return False
        if self.only is None:
            return True
        dotted = name.replace("/", ".")
        return any(fnmatchcase(name, p) or fnmatchcase(dotted, p) or name.startswith(p.rstrip("/") + "/")
                   for p in self.only)
