"""Every codec is a registered codec that says what it is: exact or quantized, with a parent or not,
and decodes onto a target device (issue 13)."""
from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from quantized_tensors import assert_same, evolve, make_q, payload

from mvc.codecs import (
    CodecKindError,
    exact_codecs,
    find_codec,
    get_codec,
    quantized_codec,
    registered,
    tensor_codec,
)
from mvc.codecs.quantized import DeltaParentMissingError
from mvc.repo.config import Config, ConfigError

DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])


def test_quantized_codecs_are_registered_and_describe_themselves():
    assert {"raw/1", "lossless/1", "qbase/1", "qdelta/1"} <= set(registered())
    assert registered(quantized=True) == ["qbase/1", "qdelta/1"]
    assert exact_codecs() == registered(quantized=False)
    assert "qbase/1" not in exact_codecs()
    kinds = {n: (get_codec(n).is_quantized, get_codec(n).has_parent, get_codec(n).lossless)
             for n in ("raw/1", "lossless/1", "qbase/1", "qdelta/1")}
    assert kinds == {"raw/1": (False, False, True), "lossless/1": (False, False, True),
                     "qbase/1": (True, False, False), "qdelta/1": (True, True, False)}
    assert find_codec("nosuch/1") is None and find_codec("qdelta/1") is get_codec("qdelta/1")


def test_asking_for_the_wrong_kind_is_a_bug_not_a_silent_decode():
    with pytest.raises(CodecKindError) as ei:
        tensor_codec("qbase/1")
    assert ei.value.exit_code == 115
    with pytest.raises(CodecKindError):
        quantized_codec("lossless/1")


@pytest.mark.parametrize("device", DEVICES)
def test_base_and_delta_round_trip_through_the_registry_onto_a_device(device):
    rng = np.random.default_rng(0)
    parent_lv = rng.integers(0, 10, 5000)
    parent = make_q(parent_lv, 8)
    child = make_q(evolve(parent_lv, 10, 10, 0.05, rng), 8, seed=1)
    base, delta = quantized_codec("qbase/1"), quantized_codec("qdelta/1")
    enc = base.encode_quantized(parent)
    got = base.decode_quantized(json.loads(json.dumps(enc.meta)), payload(enc), torch.float32,
                                (5000,), device=device)
    assert got.levels.device.type == device == got.centroids.device.type
    assert_same(parent, _cpu(got))
    enc = delta.encode_quantized(child, parent)
    meta = json.loads(json.dumps(enc.meta))
    got = delta.decode_quantized(meta, payload(enc), torch.float32, (5000,), parent=parent,
                                 device=device)
    assert got.levels.device.type == device
    assert_same(child, _cpu(got))
    data = payload(enc)
    walked = delta.decode_chain(parent, [(meta, lambda: data)], torch.float32, (5000,),
                                device=device)
    assert_same(child, _cpu(walked))


def test_a_delta_without_its_parent_is_refused():
    q = make_q(np.arange(100) % 6, 4)
    delta = quantized_codec("qdelta/1")
    with pytest.raises(DeltaParentMissingError) as ei:
        delta.encode_quantized(q)
    assert ei.value.exit_code == 116
    enc = quantized_codec("qdelta/1").encode_quantized(q, q)
    with pytest.raises(DeltaParentMissingError):
        delta.decode_quantized(enc.meta, payload(enc), torch.float32, (100,))


@pytest.mark.parametrize("device", DEVICES)
def test_exact_codecs_decode_onto_a_device(device):
    t = torch.randn(300, dtype=torch.float32)
    for name in exact_codecs():
        codec = tensor_codec(name)
        enc = codec.encode(t)
        got = codec.decode(enc.meta, payload(enc), t.dtype, (300,), device=device)
        assert got.device.type == device and torch.equal(got.cpu(), t)


def test_a_quantized_codec_cannot_be_the_lossless_codec(tmp_path):
    cfg = Config(tmp_path / "config.json")
    with pytest.raises(ConfigError, match="commit.lossless_codec"):
        cfg.set("commit.lossless_codec", "qbase/1")
    cfg.set("commit.lossless_codec", "raw/1")


def _cpu(q):
    from mvc.quant import QuantizedTensor

    return QuantizedTensor(q.levels.cpu(), q.centroids.cpu(), q.protected.cpu(), q.dtype, q.bins)
