"""`mvc checkout -o FILE`: the format comes from --format, else the extension, else checkpoint.format."""
from __future__ import annotations

import pytest
import torch
from cli_helpers import run

from mvc.io.files import load_checkpoint


@pytest.fixture
def work(work):
    """The shared lossless working directory with one commit of `c.pt`."""
    torch.save({"w": torch.arange(12.0).reshape(3, 4), "b": torch.ones(3)}, work / "c.pt")
    assert run(work, "commit", "-m", "one", "c.pt")[0] == 0
    return work


def _is_safetensors(path) -> bool:
    # safetensors files start with an 8-byte little-endian header length, then '{'; torch's zip
    # files start with 'PK'.
    head = path.read_bytes()[:9]
    return head[8:9] == b"{" and not head.startswith(b"PK")


def test_configured_format_applies_when_the_extension_does_not_decide(work):
    assert run(work, "config", "checkpoint.format", "safetensors")[0] == 0
    code, _, err = run(work, "checkout", "HEAD", "-o", "restored.weights")
    assert code == 0, err
    assert _is_safetensors(work / "restored.weights")
    from safetensors.torch import load_file
    got = load_file(str(work / "restored.weights"))
    assert torch.equal(got["w"], torch.arange(12.0).reshape(3, 4))


def test_default_configured_format_is_pt(work):
    code, _, err = run(work, "checkout", "HEAD", "-o", "restored.out")
    assert code == 0, err
    assert (work / "restored.out").read_bytes()[:2] == b"PK"
    state = torch.load(work / "restored.out", weights_only=True)
    assert torch.equal(state["b"], torch.ones(3))


def test_extension_and_flag_win_over_the_configured_format(work):
    assert run(work, "config", "checkpoint.format", "safetensors")[0] == 0
    assert run(work, "checkout", "HEAD", "-o", "a.pt")[0] == 0
    assert (work / "a.pt").read_bytes()[:2] == b"PK"
    assert run(work, "checkout", "HEAD", "-o", "b.weights", "--format", "pt")[0] == 0
    assert (work / "b.weights").read_bytes()[:2] == b"PK"
    assert run(work, "config", "checkpoint.format", "pt")[0] == 0
    assert run(work, "checkout", "HEAD", "-o", "c.safetensors")[0] == 0
    assert _is_safetensors(work / "c.safetensors")
    assert torch.equal(load_checkpoint(work / "c.safetensors")["w"],
                       torch.arange(12.0).reshape(3, 4))
