"""rANS mode 4 (eight 64-bit states, 32-bit words): blocks written before mode 5 replaced it
still decode, by every kernel path and inside lossless/1 payloads (tests/fixtures/rans_mode4)."""
from __future__ import annotations

import json

import numpy as np
import pytest
import reference_coders as ref
import torch
from locations import FIXTURES

from mvc.codecs.lossless import LosslessCodec
from mvc.native import ffi, lib, rans
from mvc.native.status import NativeDecodeError

HERE = FIXTURES / "rans_mode4"


def _ragged_input() -> np.ndarray:
    return (127 - np.random.default_rng(1).geometric(0.45, 100_003)).astype(np.uint8)[:4101]


def _floats() -> torch.Tensor:
    rng = np.random.default_rng(0)
    x = rng.lognormal(-4, 0.7, 20_000) * np.sign(rng.standard_normal(20_000))
    return torch.from_numpy(x.astype(np.float32))


def test_a_mode4_block_decodes_to_its_input():
    block = (HERE / "ragged.rans").read_bytes()
    assert block[0] == rans.LEGACY_MODE
    data = _ragged_input()
    assert np.array_equal(rans.decode(block, data.size), data)
    assert np.array_equal(ref.rans_decode_block(block, data.size), data)
    for kernel in rans.kernels():  # mode 4 has one decoder: the kernel choice must not matter
        out = np.zeros(data.size, np.uint8)
        assert lib.mvc_rans_decode_with(ffi.from_buffer(block), len(block), ffi.from_buffer(out),
                                        data.size, kernel) == 0
        assert np.array_equal(out, data)


def test_a_damaged_mode4_block_is_an_error_not_a_crash():
    block = (HERE / "ragged.rans").read_bytes()
    for cut in (1, 10, 100, len(block) - 3, len(block) - 1):
        with pytest.raises(NativeDecodeError):
            rans.decode(block[:cut], 4101)
    flipped = bytearray(block)
    flipped[-7] ^= 0x10
    try:
        out = rans.decode(bytes(flipped), 4101)
    except NativeDecodeError:
        return
    assert out.size == 4101


@pytest.mark.parametrize("name,dtype", [("float32", torch.float32), ("bfloat16", torch.bfloat16)])
def test_old_lossless_payloads_restore_bit_identically(name, dtype):
    meta = json.loads((HERE / f"{name}.meta.json").read_text())
    payload = (HERE / f"{name}.lossless").read_bytes()
    back = LosslessCodec().decode(meta, payload, dtype, (20_000,))
    want = _floats().to(dtype)
    assert torch.equal(back.view(torch.uint8), want.view(torch.uint8))
    # and the payload really holds mode-4 exponent blocks (else this test proves nothing)
    planes = 4 if name == "float32" else 2
    assert payload[4 * planes] == rans.LEGACY_MODE
