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
