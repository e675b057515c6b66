"""Safe, JSON-able encoding of the non-tensor leaves of a checkpoint.

A checkpoint's "remainder" is everything that is not a tensor: step counters,
scheduler state, hyper-parameters, RNG states.  Each leaf becomes a JSON node
that `json.dumps(..., allow_nan=False)` accepts and that decodes to a value of
the same type with the same bits:

* ``None``, ``bool``, ``str``, finite ``float`` and ``int`` within +-2**53 are
  stored as themselves (JSON round-trips them exactly, including ``-0.0``);
* everything else is a tagged object ``{"t": <tag>, ...}``: non-finite floats
  (by bit pattern, so NaN payloads survive), big ints, bytes, complex numbers,
  ``torch.dtype`` / ``torch.Size`` / ``torch.device``, `pathlib` paths (as their text and
  class; a concrete path of another operating system comes back as its pure form), numpy
  arrays and scalars of fixed-size dtypes (RNG states hold them);
* any other object goes through torch's ``weights_only`` format: it is
  ``torch.save``-d to bytes and accepted only if ``torch.load(weights_only=True)``
  reads it back.  Plain pickle is never used, so decoding can never run code.
  The globals torch's list lacks (an ``argparse.Namespace``) go in only while the
  repository's ``checkpoint.safe_globals`` allows them (`mvc.state.safe_globals`),
  and come out only where it allows them again (`GlobalNotAllowedError` otherwise).

Containers and tensors are handled by `mvc.state.nested`; this module only sees
leaves.
"""
from __future__ import annotations

import base64
import io
import math
import os
import pathlib
import pickle
import struct
import sys
from typing import Any

import torch

from mvc.dtypes import dtype_name, parse_dtype
from mvc.errors import DataError, MvcError
from mvc.state.safe_globals import GlobalNotAllowedError, allow_hint, allowable, refused_globals

# JSON numbers beyond 2**53 lose precision in most non-Python readers.
_JSON_SAFE_INT = 2**53
#: The path classes stored as their text (`{"t": "path"}`), by class name.
_PATHS = (pathlib.PosixPath, pathlib.WindowsPath, pathlib.PurePosixPath, pathlib.PureWindowsPath)
_PATHS_BY_NAME = {k.__name__: k for k in _PATHS}
# numpy dtype kinds with a fixed-size, pointer-free byte representation.
_NUMPY_KINDS = frozenset("biufcSUmM")


class UnsupportedStateError(MvcError):
    """A value in the state cannot be stored safely; the message names its key path."""

    exit_code = 24


def render_path(path: tuple) -> str:
    """Render a key path as Python subscripts, e.g. ``state['optimizer']['state'][0]``."""
    return "state" + "".join(f"[{key!r}]" for key in path)


def unsupported(value: Any, path: tuple, reason: str) -> UnsupportedStateError:
    """Build the error for `value` at `path` (returned, so callers write ``raise unsupported(...)``)."""
    kind = f"{type(value).__module__}.{type(value).__qualname__}"
    return UnsupportedStateError(f"cannot store {kind} at {render_path(path)}: {reason}")


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def _unb64(text: str) -> bytes:
    return base64.b64decode(text.encode("ascii"), validate=True)


def _numpy() -> Any:
    # A value can only be a numpy object if numpy is already imported, so
    # checking sys.modules avoids importing numpy for states that never use it.
    return sys.modules.get("numpy")


def encode_leaf(value: Any, path: tuple) -> Any:
    """Encode one non-container, non-tensor value as a JSON node.

    Raises `UnsupportedStateError` naming `path` when the value can be stored
    neither explicitly nor through torch's ``weights_only`` format.
    """
    kind = type(value)
    if value is None or kind is bool or kind is str:
        return value
    if kind is int:
        if -_JSON_SAFE_INT <= value <= _JSON_SAFE_INT:
            return value
        return {"t": "int", "v": str(value)}
    if kind is float:
        if math.isfinite(value):
            return value
        return {"t": "float", "bits": struct.pack(">d", value).hex()}
    if kind is complex:
        return {"t": "complex", "re": encode_leaf(value.real, path), "im": encode_leaf(value.imag, path)}
    if kind is bytes:
        return {"t": "bytes", "b64": _b64(value)}
    if kind is bytearray:
        return {"t": "bytearray", "b64": _b64(bytes(value))}
    if kind is torch.dtype:
        return {"t": "dtype", "v": dtype_name(value)}
    if kind is torch.Size:
        return {"t": "size", "v": list(value)}
    if kind is torch.device:
        return {"t": "device", "v": str(value)}
    if kind in _PATHS:
        # a path is its text (torch's weights_only format refuses pathlib: a Lightning
        # module's save_hyperparameters() of a data_dir argument is one)
        return {"t": "path", "kind": kind.__name__, "v": encode_leaf(str(value), path)}
    np = _numpy()
    if np is not None:
        if kind is np.ndarray:
            return _encode_ndarray(value, path)
        if isinstance(value, np.generic) and value.dtype.kind in _NUMPY_KINDS:
            return {"t": "npscalar", "dtype": value.dtype.str, "b64": _b64(value.tobytes())}
    return _encode_weights_only(value, path)


def _encode_ndarray(array: Any, path: tuple) -> dict:
    if array.dtype.kind not in _NUMPY_KINDS or array.dtype.names is not None:
        raise unsupported(array, path, f"numpy dtype {array.dtype!r} is not a fixed-size plain dtype")
    # Keep Fortran order when that is the array's layout, as pickle would.
    order = "F" if array.flags.f_contiguous and not array.flags.c_contiguous else "C"
    return {
        "t": "ndarray",
        "dtype": array.dtype.str,
        "shape": list(array.shape),
        "order": order,
        "b64": _b64(array.tobytes(order=order)),
    }


def _encode_weights_only(value: Any, path: tuple) -> dict:
    buffer = io.BytesIO()
    try:
        torch.save(value, buffer)
    except Exception as exc:  # pickling user objects can fail in arbitrary ways
        raise unsupported(value, path, f"torch.save failed ({_first_line(exc)})") from None
    data = buffer.getvalue()
    try:
        torch.load(io.BytesIO(data), weights_only=True, map_location="cpu")
    except Exception as exc:
        found = refused_globals(str(exc))
        need = f"needs {', '.join(found)}" if found else _first_line(exc)
        hint = "store it as plain Python values"
        if found and all(allowable(n) for n in found):
            hint += f" or, {allow_hint(found)}"
        raise unsupported(value, path, f"not loadable with torch.load(weights_only=True) ({need}); {hint}") from None
    return {"t": "torch", "b64": _b64(data)}


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[0] if text else type(exc).__name__


def decode_leaf(node: Any) -> Any:
    """Invert `encode_leaf`.  Raises `DataError` for a node it does not recognise."""
    if node is None or isinstance(node, (bool, int, float, str)):
        return node
    if not isinstance(node, dict):
        raise DataError(f"malformed state remainder: unexpected node {type(node).__name__}")
    tag = node.get("t")
    decoder = _DECODERS.get(tag) if isinstance(tag, str) else None
    if decoder is None:
        raise DataError(f"malformed state remainder: unknown tag {tag!r}")
    try:
        return decoder(node)
    except MvcError:
        raise
    except Exception as exc:
        raise DataError(f"malformed state remainder node {tag!r}: {_first_line(exc)}") from None


def _decode_dtype(node: dict) -> torch.dtype:
    return parse_dtype(node["v"], "state remainder")


def _decode_ndarray(node: dict) -> Any:
    import numpy as np

    dtype = np.dtype(node["dtype"])
    flat = np.frombuffer(_unb64(node["b64"]), dtype=dtype)
    # copy(): frombuffer arrays are read-only views of the decoded bytes.
    return flat.reshape(node["shape"], order=node["order"]).copy(order=node["order"])


def _decode_npscalar(node: dict) -> Any:
    import numpy as np

    return np.frombuffer(_unb64(node["b64"]), dtype=np.dtype(node["dtype"]))[0]


def _decode_path(node: dict) -> pathlib.PurePath:
    kind = _PATHS_BY_NAME[node["kind"]]
    text = decode_leaf(node["v"])
    if not isinstance(text, str):
        raise DataError("malformed state remainder: a path's text is not a string")
    if kind is pathlib.WindowsPath and os.name != "nt":
        kind = pathlib.PureWindowsPath    # a concrete path of another system: its pure form,
    elif kind is pathlib.PosixPath and os.name == "nt":
        kind = pathlib.PurePosixPath      # as it cannot be made here
    return kind(text)


def _decode_weights_only(node: dict) -> Any:
    try:
        return torch.load(io.BytesIO(_unb64(node["b64"])), weights_only=True, map_location="cpu")
    except pickle.UnpicklingError as exc:
        # Stored where the global was allowed (`checkpoint.safe_globals`), read where it is not.
        found = refused_globals(str(exc))
        if not found:
            raise
        raise GlobalNotAllowedError(
            f"a stored value needs {', '.join(found)}, which this repository does not allow "
            f"(nothing was run); {allow_hint(found)}") from None


_DECODERS = {
    "int": lambda n: int(n["v"]),
    "float": lambda n: struct.unpack(">d", bytes.fromhex(n["bits"]))[0],
    "complex": lambda n: complex(decode_leaf(n["re"]), decode_leaf(n["im"])),
    "bytes": lambda n: _unb64(n["b64"]),
    "bytearray": lambda n: bytearray(_unb64(n["b64"])),
    "dtype": _decode_dtype,
    "size": lambda n: torch.Size(int(v) for v in n["v"]),
    "device": lambda n: torch.device(n["v"]),
    "path": _decode_path,
    "ndarray": _decode_ndarray,
    "npscalar": _decode_npscalar,
    "torch": _decode_weights_only,
}
