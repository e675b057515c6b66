"""One set of dtype helpers (mvc.dtypes) for snapshots, state skeletons and leaves, and
checkpoint files (issue 13): no module keeps a copy of its own."""
from __future__ import annotations

import ast
from pathlib import Path

import pytest
import torch

import mvc
from mvc import dtypes
from mvc.errors import DataError

ALL_DTYPES = sorted({v for v in vars(torch).values() if isinstance(v, torch.dtype)}, key=str)


@pytest.mark.parametrize("dtype", ALL_DTYPES, ids=str)
def test_names_round_trip(dtype):
    assert dtypes.parse_dtype(dtypes.dtype_name(dtype)) is dtype


@pytest.mark.parametrize("name", ["float99", "Tensor", "__class__", "", 7, None, ["float32"]])
def test_unknown_names_are_data_errors(name):
    with pytest.raises(DataError, match="in state"):
        dtypes.parse_dtype(name, "state")


def test_bits_view_keeps_bytes():
    t = torch.tensor([1.5, -2.0], dtype=torch.bfloat16)
    assert dtypes.bits_view(t).dtype == torch.int16
    assert torch.equal(dtypes.bits_view(t).view(torch.bfloat16), t)
    c = torch.zeros(2, dtype=torch.complex128)  # 16-byte elements: no integer of that size
    assert dtypes.bits_view(c) is c


def test_every_layer_uses_the_one_implementation():
    from mvc.io import torch_zip
    from mvc.repo import tensors
    from mvc.state import leaves, nested

    assert tensors.dtype_name is dtypes.dtype_name and tensors.parse_dtype is dtypes.parse_dtype
    assert torch_zip.dtype_name is nested.dtype_name is leaves.dtype_name is dtypes.dtype_name
    root = Path(mvc.__file__).resolve().parent
    copies = []
    for path in root.rglob("*.py"):
        if path.name == "dtypes.py" and path.parent == root:
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                    and node.func.attr == "removeprefix" and node.args
                    and isinstance(node.args[0], ast.Constant) and node.args[0].value == "torch."):
                copies.append(str(path.relative_to(root)))
    assert not copies, f"dtype names formatted outside mvc.dtypes: {copies}"
