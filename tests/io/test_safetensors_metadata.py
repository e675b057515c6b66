"""A .safetensors file's header metadata (``__metadata__``) survives commit and checkout."""
from __future__ import annotations

import torch
from safetensors import safe_open
from cli_helpers import run
from safetensors.torch import save_file

from mvc.io.files import SAFETENSORS_METADATA_KEY, load_checkpoint, save_checkpoint

METADATA = {"format": "pt", "note": "epoch 3, lr=1e-3"}


def _tensors() -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    return {"w": torch.randn(8, 4, generator=g), "b": torch.arange(5, dtype=torch.int64),
            "h": torch.randn(3, generator=g).to(torch.bfloat16)}


def _metadata(path) -> dict[str, str] | None:
    with safe_open(str(path), framework="pt") as f:
        return f.metadata()


def test_metadata_survives_commit_and_checkout(work):
    tensors = _tensors()
    save_file(tensors, str(work / "model.safetensors"), metadata=METADATA)
    code, _, err = run(work, "commit", "-m", "st", "model.safetensors")
    assert code == 0, err
    code, _, err = run(work, "checkout", "HEAD", "-o", "x.safetensors")
    assert code == 0, err
    assert _metadata(work / "x.safetensors") == METADATA
    with safe_open(str(work / "x.safetensors"), framework="pt") as f:
        assert list(f.keys()) == sorted(tensors)
        for name, tensor in tensors.items():
            out = f.get_tensor(name)
            assert out.dtype == tensor.dtype and torch.equal(out.view(torch.uint8), tensor.view(torch.uint8))


def test_file_without_metadata_stays_a_plain_dict(tmp_path):
    save_file(_tensors(), str(tmp_path / "a.safetensors"))
    state = load_checkpoint(tmp_path / "a.safetensors")
    assert type(state) is dict
    save_checkpoint(state, tmp_path / "b.safetensors")
    assert _metadata(tmp_path / "b.safetensors") is None


def test_metadata_is_loaded_and_written_back(tmp_path):
    save_file(_tensors(), str(tmp_path / "a.safetensors"), metadata=METADATA)
    state = load_checkpoint(tmp_path / "a.safetensors")
    assert state._metadata == {SAFETENSORS_METADATA_KEY: METADATA}
    save_checkpoint(state, tmp_path / "b.safetensors")
    assert _metadata(tmp_path / "b.safetensors") == METADATA
    # A .pt copy keeps it too (it is an ordinary state_dict `_metadata`), and torch ignores it.
    save_checkpoint(state, tmp_path / "c.pt")
    save_checkpoint(load_checkpoint(tmp_path / "c.pt"), tmp_path / "d.safetensors")
    assert _metadata(tmp_path / "d.safetensors") == METADATA
