"""DCP's flat state (fully qualified names) <-> mvc's tensor names and skeleton.

`torch.distributed.checkpoint` flattens a nested state into FQNs (``model.0.weight``,
``optim.param_groups.0.lr``) and keeps, per FQN, its path in the nested state (the
planner's "mappings", `Metadata.planner_data`).  A commit stores the *nested* state, like
any other commit: the paths rebuild the containers, and `mvc.state.flatten` names the
tensors and writes the skeleton, so ``mvc checkout`` of a sharded save gives the same
structure as a commit of the gathered state.  Only the tensors' values are missing when
the skeleton is made (they are spread over the ranks): each is a one-element placeholder
whose dtype and shape are then set to the global ones (dense, contiguous).

Reading back, the skeleton is rebuilt with one-element tensors holding each entry's
index, and DCP's own flattening of that state gives every FQN its entry (and every
non-tensor leaf its value).  Dict keys come back as DCP saw them (strings).
"""
from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import torch
from torch.distributed.checkpoint._nested_dict import flatten_state_dict

from mvc.dtypes import dtype_name
from mvc.errors import InternalError
from mvc.state import flatten, unflatten

#: fqn -> its path in the nested state (tuple of str keys and int list positions).
Paths = dict[str, tuple]


def merged_paths(datas: Iterable[Any], fqns: Iterable[str]) -> Paths:
    """fqn -> path for `fqns`, from the planners' mappings (one per rank), in the order the
    first rank's state had them (a rank's own plan lost the items deduplicated onto
    others, its mapping did not); an FQN no mapping names (a planner that does not
    flatten) is a top-level key."""
    wanted = list(fqns)
    left = set(wanted)
    out: Paths = {}
    for data in datas:
        if not isinstance(data, Mapping):
            continue
        for fqn, path in data.items():
            if fqn in left:
                out[fqn] = tuple(path)
                left.discard(fqn)
    for fqn in wanted:
        if fqn in left:
            out[fqn] = (fqn,)
    return out


def _nest(items: Iterable[tuple[tuple, Any]]) -> dict:
    """Nested dicts (str keys) and lists (int positions) holding `items` at their paths."""
    root: dict = {}
    for path, value in items:
        node = root
        for key in path[:-1]:
            node = node.setdefault(key, {})
        node[path[-1]] = value
    return _listify(root)


def _listify(node: Any) -> Any:
    if not isinstance(node, dict):
        return node
    out = {k: _listify(v) for k, v in node.items()}
    if out and all(type(k) is int for k in out) and sorted(out) == list(range(len(out))):
        return [out[i] for i in range(len(out))]
    return out


def _placeholders(paths: Paths, tensors: Iterable[str], values: Mapping[str, Any]
                  ) -> tuple[dict, dict[int, str]]:
    marks: dict[int, str] = {}
    items: list[tuple[tuple, Any]] = []
    tensor_set = set(tensors)
    for fqn, path in paths.items():
        if fqn in tensor_set:
            t = torch.zeros(1)
            marks[_key(t)] = fqn
            items.append((path, t))
        else:
            items.append((path, values.get(fqn)))
    return _nest(items), marks


def tensor_names(paths: Paths, tensors: Iterable[str]) -> dict[str, str]:
    """fqn -> the name `mvc.state.flatten` gives that tensor in the nested state."""
    state, marks = _placeholders(paths, tensors, {})
    flat = flatten(state)
    return {marks[_key(t)]: name for name, t in flat.tensors.items()}


def skeleton(paths: Paths, tensors: Mapping[str, tuple[torch.dtype, list[int]]],
             values: Mapping[str, Any], names: Mapping[str, str]) -> dict:
    """The skeleton of the nested state: `tensors` (fqn -> global dtype and shape) stored
    under `names` (from `tensor_names`), `values` (fqn -> non-tensor leaf) inline."""
    state, marks = _placeholders(paths, tensors, values)
    flat = flatten(state)
    skel = flat.skeleton
    by_entry = {name: marks[_key(t)] for name, t in flat.tensors.items()}
    entries: dict[str, dict] = {}
    for name, fqn in by_entry.items():
        if names[fqn] != name:
            raise InternalError(f"tensor {fqn!r} named {name!r}, planned as {names[fqn]!r}")
        dtype, shape = tensors[fqn]
        entries[name] = dict(skel["entries"][name], dtype=dtype_name(dtype), shape=list(shape),
                             device="cpu")
    for record in skel["objects"]:
        dtype, shape = tensors[by_entry[record["entry"]]]
        record.update(kind="dense", dtype=dtype_name(dtype), shape=list(shape),
                      stride=_contiguous(list(shape)), param=False, grad=False, device="cpu")
        record.pop("offset", None)
    skel["entries"] = entries
    return skel


def _key(t: torch.Tensor) -> int:
    # flatten hands back detached views: a placeholder is known by its own storage
    return t.untyped_storage().data_ptr()


def _contiguous(shape: list[int]) -> list[int]:
    stride, acc = [], 1
    for n in reversed(shape):
        stride.append(acc)
        acc *= max(int(n), 1)
    return stride[::-1]


def fqn_view(skel: dict) -> tuple[dict[str, str], dict[str, Any], Paths]:
    """(fqn -> entry name of each tensor, fqn -> value of each non-tensor leaf, fqn -> path)
    of a stored skeleton, as DCP flattens the state it rebuilds."""
    names = list(skel["entries"])
    index = {n: i for i, n in enumerate(names)}
    light = dict(skel, entries={n: {"dtype": "int64", "shape": [1], "device": "cpu"}
                                for n in names},
                 objects=[{"kind": "dense", "dtype": "int64", "shape": [1], "stride": [1],
                           "param": False, "grad": False, "device": "cpu",
                           "entry": r["entry"]} for r in skel["objects"]])
    state = unflatten(light, {n: torch.tensor([index[n]]) for n in names})
    if not isinstance(state, dict):
        state = {"": state}
    flat, paths = flatten_state_dict(state)
    tensors: dict[str, str] = {}
    values: dict[str, Any] = {}
    for fqn, v in flat.items():
        if isinstance(v, torch.Tensor):
            tensors[fqn] = names[int(v.reshape(-1)[0])]
        else:
            values[fqn] = v
    return tensors, values, {k: tuple(p) for k, p in paths.items()}
