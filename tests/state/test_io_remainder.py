"""Safe serialization of non-tensor leaves: exact round-trips, strict JSON, no pickle."""
from __future__ import annotations

import collections
import json
import os
import pathlib
import random
import struct
from typing import Any

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from mvc.errors import DataError
from mvc.io import UnsupportedStateError, flatten, unflatten
from mvc.state.leaves import decode_leaf, encode_leaf, render_path


def json_roundtrip(value: Any) -> Any:
    node = encode_leaf(value, ("k",))
    return decode_leaf(json.loads(json.dumps(node, allow_nan=False)))


def float_bits(x: float) -> bytes:
    return struct.pack(">d", x)


@pytest.mark.parametrize(
    "value",
    [None, True, False, 0, -1, 2**53, 2**53 + 1, -(2**64), 10**40, "", "ünï\u0000\udc80", b"", b"\x00\xff",
     bytearray(b"xy"), torch.bfloat16, torch.float8_e4m3fn, torch.uint16, torch.Size([]), torch.Size([3, 0]),
     torch.device("cpu"), torch.device("cuda:1"), 1 + 2j, complex(float("nan"), -0.0),
     pathlib.Path("/data/run 1"), pathlib.Path("rel/x.txt"), pathlib.PurePosixPath("a/b"),
     pathlib.PureWindowsPath(r"C:\data\x"), pathlib.Path("bad\udc80name")],
    ids=repr,
)
def test_leaves_roundtrip_with_type(value: Any) -> None:
    out = json_roundtrip(value)
    assert type(out) is type(value)
    if isinstance(value, complex):
        assert float_bits(out.real) == float_bits(value.real) and float_bits(out.imag) == float_bits(value.imag)
    else:
        assert out == value


@pytest.mark.parametrize("bits", [0x7FF8000000000000, 0x7FF8000000000123, 0xFFF0000000000000, 0x7FF0000000000000,
                                  0x8000000000000000, 0x0000000000000001, 0x3FF0000000000000])
def test_floats_are_bit_exact(bits: int) -> None:
    value = struct.unpack(">d", bits.to_bytes(8, "big"))[0]
    assert float_bits(json_roundtrip(value)) == bits.to_bytes(8, "big")


@pytest.mark.parametrize(
    "array",
    [np.arange(624, dtype=np.uint32), np.zeros((), dtype=np.float64), np.empty((0, 3), dtype=np.int8),
     np.arange(6, dtype=">f4").reshape(2, 3), np.asfortranarray(np.arange(6.0).reshape(2, 3)),
     np.arange(12, dtype=np.int16).reshape(3, 4)[:, ::2], np.array([True, False]),
     np.array(["ab", "c"]), np.array([b"x"]), np.array(["2024-01-01"], dtype="datetime64[ns]"),
     np.array([1 + 2j], dtype=np.complex64), np.array([np.nan, -0.0], dtype=np.float16)],
    ids=lambda a: f"{a.dtype.str}{list(a.shape)}",
)
def test_numpy_arrays_roundtrip_exactly(array: np.ndarray) -> None:
    out = json_roundtrip(array)
    assert type(out) is np.ndarray and out.dtype == array.dtype and out.shape == array.shape
    assert out.tobytes() == array.tobytes()
    assert out.flags.f_contiguous == array.flags.f_contiguous or array.ndim < 2
    out[...] = out  # writable


@pytest.mark.parametrize("scalar", [np.float64(1.5), np.float32(np.nan), np.int64(-3), np.uint8(255), np.bool_(True),
                                    np.complex128(1j), np.str_("s"), np.float16(-0.0)], ids=repr)
def test_numpy_scalars_roundtrip_exactly(scalar: Any) -> None:
    out = json_roundtrip(scalar)
    assert type(out) is type(scalar) and out.tobytes() == scalar.tobytes()


def test_rng_states_roundtrip_and_are_usable() -> None:
    random.seed(3)
    np.random.seed(3)
    state = {"py": random.getstate(), "np": np.random.get_state(), "gen": np.random.default_rng(1).bit_generator.state,
             "torch": torch.get_rng_state()}
    flat = flatten(state)
    out = unflatten(json.loads(json.dumps(flat.skeleton, allow_nan=False)), {k: v.clone() for k, v in flat.tensors.items()})
    assert out["py"] == state["py"]
    assert out["gen"] == state["gen"]
    expected = (random.random(), np.random.rand())
    random.setstate(out["py"])
    np.random.set_state(out["np"])
    assert (random.random(), np.random.rand()) == expected


def test_weights_only_fallback_roundtrips_allowed_types() -> None:
    counter = collections.Counter("hello")
    node = encode_leaf(counter, ("c",))
    assert node["t"] == "torch"
    out = decode_leaf(json.loads(json.dumps(node)))
    assert type(out) is collections.Counter and out == counter


class _Evil:
    """Would create a marker file if ever unpickled without weights_only."""

    def __init__(self, marker: str) -> None:
        self.marker = marker

    def __reduce__(self) -> Any:
        return (open, (self.marker, "w"))


def test_objects_torch_cannot_load_safely_are_refused(tmp_path: Any) -> None:
    marker = tmp_path / "marker"
    with pytest.raises(UnsupportedStateError) as info:
        encode_leaf(_Evil(str(marker)), ("cfg", "hook"))
    assert "state['cfg']['hook']" in str(info.value) and "open" in str(info.value)
    assert not marker.exists()
    with pytest.raises(UnsupportedStateError, match="defaultdict"):
        encode_leaf(collections.defaultdict(list), ("d",))
    with pytest.raises(UnsupportedStateError, match="numpy dtype"):
        encode_leaf(np.array([object()]), ("o",))


def test_a_path_of_another_system_comes_back_as_its_pure_form() -> None:
    """A Lightning module's save_hyperparameters() of a data directory stored on Windows and
    read here: a WindowsPath cannot be made on POSIX (torch.load of the pickle would fail)."""
    out = decode_leaf({"t": "path", "kind": "WindowsPath", "v": "C:\\data"})
    want = pathlib.PureWindowsPath if os.name != "nt" else pathlib.WindowsPath
    assert type(out) is want and str(out) == "C:\\data"


def test_malformed_nodes_are_data_errors() -> None:
    for node in [{"t": "nope"}, {"t": "int", "v": "x"}, {"t": "bytes", "b64": "!!"}, {"t": "dtype", "v": "floaty"},
                 {"t": "torch", "b64": "AAAA"}, [1], {"t": "path", "kind": "Path", "v": "x"},
                 {"t": "path", "kind": "PosixPath", "v": 3}, {"t": "path", "kind": "PosixPath"}]:
        with pytest.raises(DataError):
            decode_leaf(node)


def test_render_path() -> None:
    assert render_path(("optimizer", "state", 0, ("a", 1))) == "state['optimizer']['state'][0][('a', 1)]"


# Arbitrary JSON-like trees (plus tuples, int keys, non-finite floats) survive flatten -> JSON -> unflatten.
_leaves = st.none() | st.booleans() | st.integers() | st.floats(allow_nan=True, allow_infinity=True) | st.text() | st.binary()
_keys = st.none() | st.booleans() | st.integers() | st.text() | st.tuples(st.integers(), st.text())
_trees = st.recursive(
    _leaves,
    lambda inner: st.lists(inner, max_size=4) | st.tuples(inner, inner) | st.dictionaries(_keys, inner, max_size=4),
    max_leaves=20,
)


def _same(a: Any, b: Any) -> bool:
    if type(a) is not type(b):
        return False
    if isinstance(a, float):
        return float_bits(a) == float_bits(b)
    if isinstance(a, dict):
        return [(type(k), k) for k in a] == [(type(k), k) for k in b] and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    return a == b


@settings(max_examples=60, deadline=None)
@given(_trees)
def test_property_trees_roundtrip(tree: Any) -> None:
    flat = flatten(tree)
    assert flat.tensors == {}
    out = unflatten(json.loads(json.dumps(flat.skeleton, allow_nan=False)), {})
    assert _same(tree, out)
