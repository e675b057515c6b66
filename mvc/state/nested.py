"""Flatten a nested checkpoint into named tensors plus a JSON skeleton, and back.

`flatten` walks the state (dicts, OrderedDicts, lists, tuples, sets, leaves)
and returns the tensors to store, each under a stable "/"-joined key-path name
(``model/layer.0.weight``, ``optimizer/state/0/exp_avg``), plus a skeleton that
records everything else: container types and key order, leaf values (through
`mvc.state.leaves`) and, per tensor object, how to rebuild it from the stored
entries.  `unflatten` inverts it exactly.

Tensors that share storage are stored once.  Tensor objects are grouped by
(device, storage pointer):

* a group whose members are all the same view (same object repeated, or tied
  weights as ``state_dict()`` returns them) of a *dense* layout (contiguous up
  to a permutation of dimensions) becomes one entry holding the tensor's
  logical values; members are rebuilt as separate objects over one storage
  (the very same object where the state repeated one object);
* any other group (different views of one buffer, gapped or overlapping
  strides) stores the smallest covering byte span of the storage once, and
  each member is rebuilt over it with its dtype, offset, shape and stride.

Offsets are kept relative to the start of the stored span, so sharing and
strides match what `torch.save` restores while bytes outside every member's
view are not stored.  Identity of non-tensor containers is not preserved (a
list referenced twice comes back as two equal lists).
"""
from __future__ import annotations

import json
import math
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any, Mapping

import torch

from mvc.dtypes import bits_view, dtype_name, parse_dtype
from mvc.errors import DataError, MvcError
from mvc.state.devices import check_usable, target_device
from mvc.state.leaves import decode_leaf, encode_leaf, unsupported
from mvc.state.skeleton import MAX_SKELETON_DEPTH

SKELETON_FORMAT = 1
_ROOT_NAME = "tensor"  # name of a tensor that is the whole state


class SkeletonTooDeepError(DataError):
    """A stored state skeleton nests containers deeper than any checkpoint `flatten` accepts."""

    exit_code = 97


@dataclass
class FlatState:
    """A flattened checkpoint.

    ``tensors`` maps entry names to the tensors to store, in traversal order,
    one per distinct storage; values are detached and stay on their device
    (they may be non-contiguous: store their logical values).  ``skeleton`` is
    JSON-serializable (``json.dumps(skeleton, allow_nan=False)`` works) and
    with the stored tensors rebuilds the state via `unflatten`.
    """

    tensors: dict[str, torch.Tensor]
    skeleton: dict


def flatten(state: Any) -> FlatState:
    """Split `state` into named tensors and a JSON skeleton.

    Raises `UnsupportedStateError` naming the key path of the first value that
    cannot be stored safely (sparse/quantized/nested/meta tensors, tensor
    subclasses, objects torch's ``weights_only`` format cannot load, cycles).
    """
    flattener = _Flattener()
    try:
        root = flattener.encode(state, ())
    except RecursionError:
        raise unsupported(state, (), "the state is nested too deeply") from None
    return flattener.finish(root)


def unflatten(
    skeleton: dict,
    tensors: Mapping[str, torch.Tensor],
    map_location: str | torch.device | None = "cpu",
) -> Any:
    """Rebuild the state described by `skeleton` from its stored `tensors`.

    Tensors are restored on `map_location` (default CPU; ``None`` puts each on
    the device it was flattened from).  The given tensors' memory is reused
    where the layout allows, so pass tensors the caller may hand over.
    Raises `DataError` when the skeleton is malformed or a tensor is missing
    or does not match its recorded dtype and shape.
    """
    try:
        if skeleton.get("format") != SKELETON_FORMAT:
            raise DataError(f"unsupported state skeleton format {skeleton.get('format')!r}")
        builder = _Builder(skeleton, tensors, map_location)
        return builder.decode(skeleton["root"])
    except MvcError:
        raise
    except RecursionError:  # within MAX_SKELETON_DEPTH, but called from an already deep stack
        raise SkeletonTooDeepError("state skeleton is nested too deeply to rebuild") from None
    except (KeyError, TypeError, ValueError, IndexError, AttributeError) as exc:
        raise DataError(f"malformed state skeleton: {type(exc).__name__}: {exc}") from None


# --------------------------------------------------------------------------- flatten


@dataclass
class _Obj:
    """One distinct tensor object met while walking the state."""

    tensor: torch.Tensor  # detached, conj/neg bits resolved
    name: str
    param: bool
    grad: bool

    def view(self) -> tuple:
        t = self.tensor
        return (t.dtype, t.storage_offset() * t.element_size(), tuple(t.shape), tuple(t.stride()))


class _Flattener:
    def __init__(self) -> None:
        self.names: set[str] = set()
        self.objects: list[_Obj] = []
        self.index_of: dict[int, int] = {}  # id(tensor) -> index in objects
        self.keep_alive: list[torch.Tensor] = []  # ids stay valid while we hold them
        self.active: set[int] = set()  # containers on the current path (cycle check)

    # -- tree walk
    def encode(self, value: Any, path: tuple) -> Any:
        if isinstance(value, torch.Tensor):
            return self._tensor(value, path)
        kind = type(value)
        if kind in (dict, OrderedDict, list, tuple, set, frozenset):
            if id(value) in self.active:
                raise unsupported(value, path, "the state contains a reference cycle")
            self.active.add(id(value))
            try:
                return self._container(value, kind, path)
            finally:
                self.active.discard(id(value))
        return encode_leaf(value, path)

    def _container(self, value: Any, kind: type, path: tuple) -> Any:
        if kind is list:
            return [self.encode(item, path + (i,)) for i, item in enumerate(value)]
        if kind is tuple:
            return {"t": "tuple", "v": [self.encode(item, path + (i,)) for i, item in enumerate(value)]}
        if kind in (set, frozenset):
            return {"t": kind.__name__, "v": _sorted_nodes(self._key(item, path) for item in value)}
        items = [[self._key(key, path), self.encode(item, path + (key,))] for key, item in value.items()]
        if kind is dict:
            return {"t": "dict", "items": items}
        node = {"t": "odict", "items": items}
        # state_dict() carries per-module versions in `_metadata`; load_state_dict reads it.
        metadata = getattr(value, "_metadata", None)
        if metadata is not None:
            node["meta"] = self.encode(metadata, path + ("_metadata",))
        return node

    def _key(self, key: Any, path: tuple) -> Any:
        """Encode a dict key or set element: hashable leaves and tuples/frozensets of them."""
        if isinstance(key, torch.Tensor):
            raise unsupported(key, path, "tensors cannot be dict keys or set elements in a stored state")
        if type(key) is tuple:
            return {"t": "tuple", "v": [self._key(item, path) for item in key]}
        if type(key) is frozenset:
            return {"t": "frozenset", "v": _sorted_nodes(self._key(item, path) for item in key)}
        return encode_leaf(key, path)

    def _tensor(self, tensor: torch.Tensor, path: tuple) -> dict:
        known = self.index_of.get(id(tensor))
        if known is not None:
            return {"t": "tensor", "o": known}
        _check_tensor(tensor, path)
        flat = tensor.detach()
        if flat.is_conj() or flat.is_neg():
            # Lazy conj/neg bits are not in the storage bytes: store the values.
            flat = flat.resolve_conj().resolve_neg()
        obj = _Obj(
            tensor=flat,
            name=self._unique("/".join(_segment(k) for k in path) or _ROOT_NAME),
            param=type(tensor) is torch.nn.Parameter,
            grad=tensor.requires_grad,
        )
        self.index_of[id(tensor)] = len(self.objects)
        self.objects.append(obj)
        self.keep_alive.append(tensor)
        return {"t": "tensor", "o": self.index_of[id(tensor)]}

    def _unique(self, base: str) -> str:
        name, n = base, 0
        while name in self.names:
            n += 1
            name = f"{base}~{n}"
        self.names.add(name)
        return name

    # -- storage grouping
    def finish(self, root: Any) -> FlatState:
        groups: dict[Any, list[int]] = {}
        for index, obj in enumerate(self.objects):
            t = obj.tensor
            if t.numel() == 0 or t.untyped_storage().nbytes() == 0:
                key: Any = ("solo", index)  # nothing to share
            else:
                key = (str(t.device), t.untyped_storage().data_ptr())
            groups.setdefault(key, []).append(index)

        tensors: dict[str, torch.Tensor] = {}
        entries: dict[str, dict] = {}
        records: list[dict] = [{} for _ in self.objects]
        for members in groups.values():
            first = self.objects[members[0]]
            views = {self.objects[i].view() for i in members}
            t = first.tensor
            if len(views) == 1 and (t.numel() == 0 or _is_dense(t.shape, t.stride())):
                entry = t
                for i in members:
                    records[i] = self._record(i, "dense", 0)
            else:
                entry, start = _span(self.objects[i].tensor for i in members)
                for i in members:
                    offset = self.objects[i].view()[1] - start
                    records[i] = self._record(i, "view", offset)
            tensors[first.name] = entry
            entries[first.name] = {
                "dtype": dtype_name(entry.dtype),
                "shape": list(entry.shape),
                "device": str(entry.device),
            }
            for i in members:
                records[i]["entry"] = first.name

        skeleton = {"format": SKELETON_FORMAT, "root": root, "entries": entries, "objects": records}
        return FlatState(tensors=tensors, skeleton=skeleton)

    def _record(self, index: int, kind: str, offset: int) -> dict:
        obj = self.objects[index]
        t = obj.tensor
        record = {
            "kind": kind,
            "dtype": dtype_name(t.dtype),
            "shape": list(t.shape),
            "stride": list(t.stride()),
            "param": obj.param,
            "grad": obj.grad,
            "device": str(t.device),
        }
        if kind == "view":
            record["offset"] = offset
        return record


def _check_tensor(tensor: torch.Tensor, path: tuple) -> None:
    if type(tensor) not in (torch.Tensor, torch.nn.Parameter):
        raise unsupported(tensor, path, "tensor subclasses cannot be stored; convert to a plain tensor")
    if tensor.layout != torch.strided:
        raise unsupported(tensor, path, f"{tensor.layout} tensors cannot be stored; convert to dense")
    if tensor.is_quantized:
        raise unsupported(tensor, path, "quantized tensors cannot be stored; dequantize first")
    if tensor.is_nested:
        raise unsupported(tensor, path, "nested tensors cannot be stored")
    if tensor.device.type == "meta":
        raise unsupported(tensor, path, "meta tensors hold no data")


def _segment(key: Any) -> str:
    return key if type(key) is str else str(key) if type(key) is int else repr(key)


def _sorted_nodes(nodes: Any) -> list:
    # Set iteration order varies between runs; sort to keep skeletons stable.
    return sorted(nodes, key=lambda node: json.dumps(node, sort_keys=True))


def _is_dense(shape: tuple, stride: tuple) -> bool:
    """True if the view covers a gap-free, overlap-free block (contiguous up to permutation)."""
    expected = 1
    for step, size in sorted((p for p in zip(stride, shape) if p[1] != 1), key=lambda p: p[0]):
        if step != expected:
            return False
        expected *= size
    return True


def _extent(t: torch.Tensor) -> int:
    """Bytes from the view's first element to just past its last."""
    last = sum((size - 1) * step for size, step in zip(t.shape, t.stride()))
    return (last + 1) * t.element_size()


def _span(members: Any) -> tuple[torch.Tensor, int]:
    """One tensor viewing the covering span of `members` (non-empty views of one storage).

    Returns it and the span's start in storage bytes.  The span keeps the
    members' dtype when they agree (so a quantizer sees real values) and the
    shape of a member that covers it exactly and contiguously; otherwise it
    is a 1-D byte tensor.
    """
    members = list(members)
    starts = [t.storage_offset() * t.element_size() for t in members]
    start = min(starts)
    end = max(s + _extent(t) for s, t in zip(starts, members))
    dtypes = {t.dtype for t in members}
    if len(dtypes) == 1:
        dtype = members[0].dtype
    else:
        dtype = torch.uint8
        # Align so every member's offset stays a whole number of its elements.
        start -= start % max(t.element_size() for t in members)
    size = torch.empty(0, dtype=dtype).element_size()
    length = (end - start) // size
    span = torch.empty(0, dtype=dtype, device=members[0].device)
    span.set_(members[0].untyped_storage(), start // size, (length,), (1,))
    for t, s in zip(members, starts):
        if t.dtype == dtype and s == start and t.is_contiguous() and t.numel() == length:
            return span.view(t.shape), start
    return span, start


# --------------------------------------------------------------------------- unflatten


class _Builder:
    def __init__(self, skeleton: dict, tensors: Mapping[str, torch.Tensor], map_location: Any) -> None:
        self.records: list[dict] = skeleton["objects"]
        self.entries: dict[str, dict] = skeleton["entries"]
        self.tensors = tensors
        self.location = target_device(map_location)
        self.built: dict[int, torch.Tensor] = {}
        self.bases: dict[str, torch.Tensor] = {}  # entry name -> prepared tensor on target device

    def decode(self, node: Any, depth: int = 0) -> Any:
        if depth > MAX_SKELETON_DEPTH:
            raise SkeletonTooDeepError(f"state skeleton nests containers deeper than {MAX_SKELETON_DEPTH} levels")
        inner = depth + 1
        if isinstance(node, list):
            return [self.decode(item, inner) for item in node]
        if not isinstance(node, dict):
            return decode_leaf(node)
        tag = node.get("t")
        if tag == "tensor":
            return self._object(int(node["o"]))
        if tag == "tuple":
            return tuple(self.decode(item, inner) for item in node["v"])
        if tag in ("set", "frozenset"):
            return (set if tag == "set" else frozenset)(self.decode(item, inner) for item in node["v"])
        if tag in ("dict", "odict"):
            pairs = [(self.decode(key, inner), self.decode(item, inner)) for key, item in node["items"]]
            if tag == "dict":
                return dict(pairs)
            result = OrderedDict(pairs)
            if "meta" in node:
                result._metadata = self.decode(node["meta"], inner)  # type: ignore[attr-defined]
            return result
        return decode_leaf(node)

    def _device(self, recorded: str) -> torch.device:
        if self.location is not None:
            return self.location
        try:
            device = torch.device(recorded)
        except (RuntimeError, ValueError, TypeError):
            raise DataError(f"malformed state skeleton: recorded device {recorded!r} is no "
                            "device") from None
        check_usable(device, f"the state was saved on {recorded}")
        return device

    def _base(self, name: str) -> torch.Tensor:
        base = self.bases.get(name)
        if base is not None:
            return base
        info = self.entries[name]
        if name not in self.tensors:
            raise DataError(f"stored state is missing tensor {name!r}")
        stored = self.tensors[name]
        dtype = _dtype(info["dtype"])
        if stored.dtype != dtype or list(stored.shape) != list(info["shape"]):
            raise DataError(
                f"stored tensor {name!r} is {dtype_name(stored.dtype)}{list(stored.shape)}, "
                f"expected {info['dtype']}{list(info['shape'])}"
            )
        base = stored.detach().to(self._device(info["device"]))
        self.bases[name] = base
        return base

    def _object(self, index: int) -> torch.Tensor:
        built = self.built.get(index)
        if built is not None:
            return built
        record = self.records[index]
        base = self._base(record["entry"])
        dtype = _dtype(record["dtype"])
        shape, stride = _layout(record)
        if record["kind"] == "dense":
            tensor = self._dense(record["entry"], base, shape, stride)
        elif record["kind"] == "view":
            tensor = self._view(record["entry"], base, dtype, shape, stride, int(record["offset"]))
        else:
            raise DataError(f"malformed state skeleton: unknown tensor kind {record['kind']!r}")
        if record["param"]:
            tensor = torch.nn.Parameter(tensor, requires_grad=bool(record["grad"]))
        elif record["grad"]:
            tensor.requires_grad_(True)
        self.built[index] = tensor
        return tensor

    def _dense(self, name: str, base: torch.Tensor, shape: tuple, stride: tuple) -> torch.Tensor:
        if tuple(base.shape) != shape:
            raise DataError(f"malformed state skeleton: tensor {name!r} shape mismatch")
        if tuple(base.stride()) != stride:
            if base.is_contiguous() and _same_addressing(shape, stride, base.stride()):
                base = base.as_strided(shape, stride)  # only size-1 dims differ: no copy
            elif math.prod(shape) and not _is_dense(shape, stride):
                # A hostile stride would make empty_strided allocate its whole claimed span.
                raise DataError(f"malformed state skeleton: tensor {name!r} has a non-dense layout")
            else:
                out = torch.empty_strided(shape, stride, dtype=base.dtype, device=base.device)
                bits_view(out).copy_(bits_view(base))
                base = out
            # Later objects of this entry share the re-laid-out storage.
            self.bases[name] = base
        return base.detach()  # a new object over the same storage

    def _view(
        self, name: str, base: torch.Tensor, dtype: torch.dtype, shape: tuple, stride: tuple, offset: int
    ) -> torch.Tensor:
        if not base.is_contiguous() or base.storage_offset() != 0:
            base = bits_view(base).clone(memory_format=torch.contiguous_format).view(base.dtype)
            self.bases[name] = base
        size = torch.empty(0, dtype=dtype).element_size()
        extent = (sum((n - 1) * s for n, s in zip(shape, stride)) + 1) * size
        if offset < 0 or offset % size or offset + extent > base.numel() * base.element_size():
            raise DataError(f"malformed state skeleton: a view of {name!r} lies outside its stored span")
        view = torch.empty(0, dtype=dtype, device=base.device)
        return view.set_(base.untyped_storage(), offset // size, shape, stride)


def _layout(record: dict) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """A tensor record's shape and stride, checked: stored skeletons are untrusted."""
    shape, stride = record.get("shape"), record.get("stride")
    if (not isinstance(shape, list) or not isinstance(stride, list) or len(shape) != len(stride)
            or not all(type(v) is int and v >= 0 for v in shape + stride)):
        raise DataError(f"malformed state skeleton: bad shape/stride {shape!r}/{stride!r}")
    return tuple(shape), tuple(stride)


def _dtype(name: str) -> torch.dtype:
    return parse_dtype(name, "state")


def _same_addressing(shape: tuple, stride_a: tuple, stride_b: tuple) -> bool:
    if math.prod(shape) == 0:
        return True
    return all(a == b for n, a, b in zip(shape, stride_a, stride_b) if n != 1)
