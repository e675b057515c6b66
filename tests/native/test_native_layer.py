"""The native layer stands alone: it imports nothing above it, raises its own errors, and the
codecs above turn those into the `CodecError` callers catch (issue 13)."""
from __future__ import annotations

import ast
from pathlib import Path

import numpy as np
import pytest
import torch

import mvc.native
from mvc.codecs.base import CodecError, get_codec
from mvc.errors import DataError
from mvc.native import huffman
from mvc.native.status import NativeDecodeError, check_decode

NATIVE = Path(mvc.native.__file__).resolve().parent
ALLOWED = ("mvc.native", "mvc.errors", "mvc._mvc_native")


def _mvc_imports(path: Path) -> list[str]:
    """Every `mvc...` module a file imports, at module level or inside functions."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found += [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            found.append(node.module)
    return [m for m in found if m == "mvc" or m.startswith("mvc.")]


def test_native_imports_nothing_above_it():
    bad = {f"{p.name}: {m}" for p in NATIVE.glob("*.py") for m in _mvc_imports(p)
           if not m.startswith(ALLOWED)}
    assert not bad, sorted(bad)


def test_native_decode_errors_are_data_errors_of_their_own():
    assert issubclass(NativeDecodeError, DataError)
    assert not issubclass(NativeDecodeError, CodecError)
    with pytest.raises(NativeDecodeError, match="corrupt"):
        check_decode(-1, "a block")
    with pytest.raises(NativeDecodeError):
        huffman.decode(b"\x05\x00", 10)


def test_codecs_raise_codec_errors_from_native_ones():
    codec = get_codec("lossless/1")
    enc = codec.encode(torch.linspace(-1, 1, 5000))
    payload = bytearray(b"".join(bytes(p) for p in enc.parts))
    payload[16] = 9  # the first plane block's mode byte (after 4 u32 plane lengths): no such mode
    with pytest.raises(CodecError) as info:
        codec.decode(enc.meta, bytes(payload), torch.float32, (5000,))
    assert type(info.value) is CodecError and info.value.exit_code == 12
    assert isinstance(info.value.__cause__, NativeDecodeError)


def test_quantized_level_stream_errors_stay_codec_errors():
    from mvc.codecs import quantized as qc
    from mvc.quant import QuantizedTensor

    levels = torch.from_numpy(np.arange(3000, dtype=np.uint8) % 5)  # no protected level (5)
    q = QuantizedTensor(levels, torch.linspace(-1, 1, 4), torch.empty(0), torch.float32, 4)
    enc = qc.encode_base(q)
    meta, parts = enc.meta, [bytes(p) for p in enc.parts]
    parts[2] = bytes([0xFF]) * len(parts[2])  # an overlong varint block size
    meta = {**meta, "xxh3": qc._checksum(parts)}
    with pytest.raises(CodecError) as info:
        qc.decode_base(meta, b"".join(parts), torch.float32, (3000,))
    assert type(info.value) is CodecError and isinstance(info.value.__cause__, NativeDecodeError)
