"""`mvc.repo.records` answers what a record is without torch; its table of the shipped codecs
must say what the codec registry says."""
from __future__ import annotations

import subprocess
import sys

import pytest

from mvc.codecs.base import find_codec, registered
from mvc.repo.objects import TensorRecord
from mvc.repo.records import BUILTIN_CODECS, BrokenChainError, codec_kind, is_delta, is_quantized, parent_ref


def test_the_table_matches_the_registry() -> None:
    assert set(BUILTIN_CODECS) <= set(registered())
    for name, kind in BUILTIN_CODECS.items():
        codec = find_codec(name)
        assert codec is not None and kind == (codec.is_quantized, codec.has_parent), name


def test_names_outside_the_table_ask_the_registry() -> None:
    assert codec_kind("no-such-codec/9") is None
    for name in registered():
        codec = find_codec(name)
        assert codec is not None and codec_kind(name) == (codec.is_quantized, codec.has_parent)


def _rec(codec: str, meta: dict | None = None) -> TensorRecord:
    return TensorRecord(name="w", dtype="float32", shape=[2], codec=codec, meta=meta or {},
                        chunks=[], raw_bytes=8, stored_bytes=8)


def test_kinds_and_parent_refs() -> None:
    assert not is_quantized(_rec("raw/1")) and not is_delta(_rec("lossless/1"))
    assert is_quantized(_rec("qbase/1")) and not is_delta(_rec("qbase/1"))
    delta = _rec("qdelta/1", {"parent": {"snapshot": "a" * 32, "name": "w"}})
    assert is_delta(delta) and parent_ref(delta) == ("a" * 32, "w")
    with pytest.raises(BrokenChainError):
        parent_ref(_rec("qdelta/1"))
    assert not is_quantized(_rec("unknown/1")) and parent_ref(_rec("unknown/1")) is None


def test_importing_it_does_not_import_torch() -> None:
    code = ("import sys\nimport mvc.repo.records, mvc.repo.levelfile, mvc.repo.fsck, mvc.repo.objectdb\n"
            "print('torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"
