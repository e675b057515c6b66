"""`mvc fsck --decode`: a payload whose id checks but which does not decode (what the rANS
encoder's inexact division wrote before its fix) is found and named, without a checkout."""
from __future__ import annotations

import pytest
import torch

from mvc.cli.main import main
from mvc.codecs.base import Encoded
from mvc.codecs.lossless import LosslessCodec
from mvc.errors import MvcError
from mvc.repo.repository import Repo


def _broken(real):
    def encode(self, tensor):
        enc = real(self, tensor)
        if tensor.numel() < 1000:
            return enc
        payload = bytearray(b"".join(bytes(p) for p in enc.parts))
        # what a bad encoder leaves: a well-framed segment whose first plane does not decode
        # (float32: four plane lengths, then plane 0's mode byte)
        payload[16] = 0xEE
        return Encoded(meta=enc.meta, parts=[bytes(payload)])
    return encode


def test_fsck_decode_names_a_tensor_that_does_not_decode(tmp_path, monkeypatch, capsys):
    repo = Repo.init(tmp_path)
    g = torch.Generator().manual_seed(0)
    good = repo.commit({"big": torch.randn(4096, generator=g), "small": torch.randn(8)}, "good",
                       lossless=True)
    monkeypatch.setattr(LosslessCodec, "encode", _broken(LosslessCodec.encode))
    bad = repo.commit({"big": torch.randn(4096, generator=g), "small": torch.randn(8)}, "bad",
                      lossless=True)
    monkeypatch.undo()
    assert repo.fsck().ok                       # every id checks
    report = repo.fsck(decode=True)
    bad_sid = repo.read_commit(bad).snapshot
    assert len(report.problems) == 1, report.problems
    assert bad_sid in report.problems[0] and "'big' does not decode" in report.problems[0]
    assert repo.read_commit(good).snapshot in report.snapshots
    with pytest.raises(MvcError):               # what a checkout of it meets
        repo.read_state(bad)
    repo.close()

    monkeypatch.chdir(tmp_path)
    assert main(["fsck", "-q"]) == 0
    code = main(["fsck", "--decode", "-q"])
    out = capsys.readouterr().out
    assert code != 0 and "'big' does not decode" in out


def test_fsck_decode_passes_a_sound_lossy_history(tmp_path):
    repo = Repo.init(tmp_path)
    g = torch.Generator().manual_seed(1)
    w = torch.randn(64, 64, generator=g)
    for t in range(3):
        w = w + 0.01 * torch.randn(64, 64, generator=g)
        repo.commit({"w": w, "b": torch.randn(64, generator=g)}, f"c{t}", epsilon=0.05)
    report = repo.fsck(decode=True)
    assert report.ok, report.problems
    assert len(report.snapshots) == 3
    repo.close()


def _old_rans(real):
    """LosslessCodec.encode as mvc wrote it before the rANS encoder's exact division: each
    segment's plane 0 (float64: eight plane lengths first) re-encoded by the old encoder."""
    import numpy as np
    import reference_coders as ref

    from mvc.native import rans

    def encode(self, tensor):
        enc = real(self, tensor)
        if tensor.dtype != torch.float64:
            return enc
        payload = b"".join(bytes(p) for p in enc.parts)
        lens = np.frombuffer(payload[:32], "<u4").copy()
        body0 = payload[32:32 + int(lens[0])]
        assert body0[0] == rans.MODE
        old0 = ref.rans_encode_legacy(rans.decode(body0, tensor.numel()))
        assert old0 != body0   # the old encoder wrote this plane wrong
        lens[0] = len(old0)
        return Encoded(meta=enc.meta, parts=[lens.astype("<u4").tobytes() + old0
                                             + payload[32 + len(body0):]])
    return encode


def test_a_tensor_the_old_rans_encoder_wrote_wrong_restores_and_fsck_says_so(
        tmp_path, monkeypatch, capsys):
    # the float64 tensor hypothesis found: its exponent plane is 88% one value
    t = torch.randn((39, 40, 40), dtype=torch.float64,
                    generator=torch.Generator().manual_seed(40)) * 0.05
    repo = Repo.init(tmp_path)
    monkeypatch.setattr(LosslessCodec, "encode", _old_rans(LosslessCodec.encode))
    cid = repo.commit({"norm": t, "step": 3}, "written before the fix", lossless=True)
    monkeypatch.undo()
    got = repo.read_state(cid)
    assert torch.equal(got["norm"].view(torch.int64), t.view(torch.int64)) and got["step"] == 3
    report = repo.fsck(decode=True)
    assert report.ok and len(report.warnings) == 1
    assert "'norm' holds 1 rANS block(s)" in report.warnings[0]
    repo.close()
    monkeypatch.chdir(tmp_path)
    assert main(["fsck", "--decode"]) == 0
    assert "rANS block(s)" in capsys.readouterr().out
