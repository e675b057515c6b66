"""Checkpoint files: safe loading, atomic saving, and one clear error per bad input."""
from __future__ import annotations

import os
import pickle
import zipfile
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import safetensors.torch
import torch
from checkpoints import assert_identical, assert_same_sharing, realistic_checkpoint

from mvc.errors import MvcError, UsageError
from mvc.io import (
    CheckpointFileError,
    CheckpointNotFoundError,
    CorruptCheckpointError,
    UnsafeCheckpointError,
    UnsupportedCheckpointError,
    detect_format,
    load_checkpoint,
    save_checkpoint,
)


class RunsCommand:
    """A pickle payload whose __reduce__ runs a shell command when unpickled unsafely."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> Any:
        return (os.system, (f"touch {self.marker}",))


def one_line(exc: BaseException, path: Path) -> str:
    message = str(exc)
    assert "\n" not in message and str(path) in message
    return message


# ----------------------------------------------------------------------------- round trips


@pytest.mark.parametrize("suffix", [".pt", ".pth", ".ckpt", ".bin"])
def test_torch_checkpoint_roundtrip_keeps_structure_and_sharing(tmp_path: Path, suffix: str) -> None:
    state = realistic_checkpoint()
    path = tmp_path / f"ckpt{suffix}"
    save_checkpoint(state, path)
    assert detect_format(path) == "pt"
    out = load_checkpoint(path)
    assert_identical(state, out)
    assert_same_sharing(state, out)


def test_legacy_torch_format_loads(tmp_path: Path) -> None:
    path = tmp_path / "old.pt"
    torch.save({"w": torch.randn(3), "n": 2}, path, _use_new_zipfile_serialization=False)
    out = load_checkpoint(path)
    assert out["n"] == 2 and out["w"].shape == (3,)


def test_numpy_rng_state_in_torch_file_loads(tmp_path: Path) -> None:
    state = {"np_rng": np.random.get_state(), "lr": np.float64(0.1), "flags": np.array([True, False])}
    path = tmp_path / "rng.pth"
    torch.save(state, path)
    out = load_checkpoint(path)
    assert out["np_rng"][1].tobytes() == state["np_rng"][1].tobytes() and out["lr"] == state["lr"]


def test_safetensors_roundtrip(tmp_path: Path) -> None:
    state = {"a": torch.randn(3, 4), "b": torch.arange(5, dtype=torch.int64), "c": torch.randn(2).to(torch.bfloat16)}
    path = tmp_path / "model.safetensors"
    save_checkpoint(state, path)
    assert detect_format(path) == "safetensors"
    out = load_checkpoint(path)
    assert set(out) == set(state)
    for key in state:
        assert_identical(state[key], out[key])


def test_safetensors_copies_shared_tensors_apart(tmp_path: Path) -> None:
    w = torch.nn.Parameter(torch.randn(4, 3))
    state = {"embed": w, "head": w, "row": w.detach()[1], "t": torch.randn(3, 2).t()}
    path = tmp_path / "tied.safetensors"
    save_checkpoint(state, path)
    out = load_checkpoint(path)
    for key in state:
        assert torch.equal(out[key], state[key].detach())


def test_safetensors_refuses_nested_state(tmp_path: Path) -> None:
    with pytest.raises(UsageError, match="format 'pt'"):
        save_checkpoint({"model": {"w": torch.ones(1)}}, tmp_path / "x.safetensors")
    with pytest.raises(UsageError, match="format 'pt'"):
        save_checkpoint({"w": torch.ones(1, dtype=torch.complex128)}, tmp_path / "x.safetensors")
    assert list(tmp_path.iterdir()) == []


def test_explicit_format_and_unknown_extension(tmp_path: Path) -> None:
    path = tmp_path / "weights.data"
    save_checkpoint({"w": torch.ones(2)}, path, format="safetensors")
    assert detect_format(path) == "safetensors"  # sniffed from the header
    assert torch.equal(load_checkpoint(path)["w"], torch.ones(2))
    save_checkpoint({"w": torch.ones(2)}, tmp_path / "zip.data", format="pt")
    assert detect_format(tmp_path / "zip.data") == "pt"
    with pytest.raises(UnsupportedCheckpointError):
        save_checkpoint({"w": torch.ones(2)}, tmp_path / "weights.npz")
    with pytest.raises(UnsupportedCheckpointError):
        save_checkpoint({"w": torch.ones(2)}, tmp_path / "w.pt", format="onnx")


# ----------------------------------------------------------------------------- atomic writes


def test_save_replaces_atomically_and_leaves_no_temp_files(tmp_path: Path) -> None:
    path = tmp_path / "c.pt"
    save_checkpoint({"v": 1}, path)
    save_checkpoint({"v": 2}, path)
    assert load_checkpoint(path) == {"v": 2}
    assert [p.name for p in tmp_path.iterdir()] == ["c.pt"]
    mode = path.stat().st_mode & 0o777
    umask = os.umask(0)
    os.umask(umask)
    assert mode == 0o666 & ~umask


def test_failed_save_keeps_the_old_file(tmp_path: Path) -> None:
    path = tmp_path / "c.pt"
    save_checkpoint({"v": 1}, path)
    with pytest.raises(Exception):
        save_checkpoint({"v": lambda: 2}, path)  # cannot be pickled, fails mid-write
    assert load_checkpoint(path) == {"v": 1}
    assert [p.name for p in tmp_path.iterdir()] == ["c.pt"]


def test_save_to_bad_targets(tmp_path: Path) -> None:
    (tmp_path / "d.pt").mkdir()
    with pytest.raises(UsageError, match="is a directory"):
        save_checkpoint({}, tmp_path / "d.pt")
    with pytest.raises(UsageError, match="does not exist"):
        save_checkpoint({}, tmp_path / "missing" / "c.pt")


# ----------------------------------------------------------------------------- bad input


@pytest.mark.parametrize("zip_format", [True, False])
def test_a_pickle_protocol_the_weights_only_loader_refuses_is_unsupported_not_corrupt(
        tmp_path: Path, zip_format: bool) -> None:
    """torch.save(..., pickle_protocol=4) writes a valid file that torch.load(weights_only=True)
    refuses too: it is said so (exit 23) rather than called damaged (exit 21)."""
    path = tmp_path / "p4.pt"
    torch.save({"w": torch.ones(3), "n": 1}, path, pickle_protocol=4,
               _use_new_zipfile_serialization=zip_format)
    with pytest.raises(UnsupportedCheckpointError, match="pickle protocol 4.*re-save"):
        load_checkpoint(path)


def test_missing_file(tmp_path: Path) -> None:
    path = tmp_path / "nope.pt"
    with pytest.raises(CheckpointNotFoundError) as info:
        load_checkpoint(path)
    assert "no such file" in one_line(info.value, path)
    assert info.value.exit_code == 20


def test_directory(tmp_path: Path) -> None:
    with pytest.raises(CheckpointNotFoundError) as info:
        load_checkpoint(tmp_path)
    assert "is a directory; expected a checkpoint file" in one_line(info.value, tmp_path)


def test_truncated_zip_checkpoint(tmp_path: Path) -> None:
    path = tmp_path / "t.pt"
    save_checkpoint(realistic_checkpoint(), path)
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    with pytest.raises(CorruptCheckpointError) as info:
        load_checkpoint(path)
    one_line(info.value, path)
    assert info.value.exit_code == 21


def test_truncated_legacy_checkpoint(tmp_path: Path) -> None:
    path = tmp_path / "t.pt"
    torch.save({"w": torch.randn(100)}, path, _use_new_zipfile_serialization=False)
    path.write_bytes(path.read_bytes()[:-150])
    with pytest.raises(CorruptCheckpointError) as info:
        load_checkpoint(path)
    one_line(info.value, path)


@pytest.mark.parametrize("content", [b"hello, this is not a checkpoint\n", b"", b"\x80\x04garbage", b"PK\x03\x04junk"],
                         ids=["text", "empty", "bad-pickle", "bad-zip"])
def test_non_checkpoint_files_named_pt(tmp_path: Path, content: bytes) -> None:
    path = tmp_path / "x.pt"
    path.write_bytes(content)
    with pytest.raises(CorruptCheckpointError) as info:
        load_checkpoint(path)
    one_line(info.value, path)


def test_zip_that_is_not_a_torch_checkpoint(tmp_path: Path) -> None:
    path = tmp_path / "x.ckpt"
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr("readme.txt", "hi")
    with pytest.raises(CorruptCheckpointError):
        load_checkpoint(path)


@pytest.mark.parametrize("writer", ["torch-zip", "torch-legacy", "pickle-2", "pickle-5"])
def test_malicious_pickle_is_refused_and_never_runs(tmp_path: Path, writer: str) -> None:
    marker = tmp_path / "pwned"
    payload = {"model": {"w": torch.ones(2)}, "evil": RunsCommand(marker)}
    path = tmp_path / "evil.pt"
    if writer == "torch-zip":
        torch.save(payload, path)
    elif writer == "torch-legacy":
        torch.save(payload, path, _use_new_zipfile_serialization=False)
    else:
        path.write_bytes(pickle.dumps({"evil": RunsCommand(marker)}, protocol=int(writer[-1])))
    with pytest.raises(UnsafeCheckpointError) as info:
        load_checkpoint(path)
    message = one_line(info.value, path)
    assert "system" in message  # names the forbidden global (posix.system / os.system)
    assert info.value.exit_code == 22
    assert not marker.exists()


def test_unknown_format(tmp_path: Path) -> None:
    path = tmp_path / "notes.txt"
    path.write_text("just text")
    with pytest.raises(UnsupportedCheckpointError) as info:
        load_checkpoint(path)
    one_line(info.value, path)
    assert info.value.exit_code == 23


@pytest.mark.parametrize("cut", [5, 20, -3])
def test_truncated_or_garbage_safetensors(tmp_path: Path, cut: int) -> None:
    path = tmp_path / "m.safetensors"
    safetensors.torch.save_file({"a": torch.randn(10)}, str(path))
    path.write_bytes(path.read_bytes()[:cut])
    with pytest.raises(CorruptCheckpointError) as info:
        load_checkpoint(path)
    one_line(info.value, path)


def test_error_classes_are_distinct_mvc_errors() -> None:
    classes = [CheckpointNotFoundError, CorruptCheckpointError, UnsafeCheckpointError, UnsupportedCheckpointError]
    assert [c.exit_code for c in classes] == [20, 21, 22, 23]
    assert all(issubclass(c, CheckpointFileError) and issubclass(c, MvcError) for c in classes)
