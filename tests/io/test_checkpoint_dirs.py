"""Checkpoint directories as one commit (mvc.io.dirs, `mvc commit DIR`, `mvc checkout REV -o DIR`)."""
from __future__ import annotations

import json
import os
import pickle
import random
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors import safe_open
from safetensors.torch import save_file

from cli_helpers import run
from mvc.io.dirs import (DIR_MARK, CheckpointDirectoryError, MalformedDirectoryError,
                         OutputDirectoryExistsError, checkout_dir, commit_dir, load_dir, save_dir)
from mvc.io.files import UnsafeCheckpointError, load_checkpoint


class _Marker:
    """Unpickling this creates a file: proof that something unpickled it."""

    def __init__(self, path: str) -> None:
        self.path = path

    def __reduce__(self):
        return (Path(self.path).touch, ())


def _hf_like_dir(root: Path, marker: Path) -> Path:
    """A Hugging Face-shaped checkpoint: two safetensors shards + index, optimizer, scheduler,
    RNG states, trainer state, config and tokenizer files, a training_args.bin pickle."""
    d = root / "checkpoint-6"
    d.mkdir(parents=True)
    g = torch.Generator().manual_seed(1)
    shard1 = {"embed.weight": torch.randn(64, 32, generator=g), "h.0.w": torch.randn(32, 32, generator=g)}
    shard2 = {"h.1.w": torch.randn(32, 32, generator=g).to(torch.bfloat16), "ln.bias": torch.zeros(32)}
    save_file(shard1, str(d / "model-00001-of-00002.safetensors"), metadata={"format": "pt"})
    save_file(shard2, str(d / "model-00002-of-00002.safetensors"), metadata={"format": "pt"})
    index = {"metadata": {"total_size": 1234},
             "weight_map": {**{k: "model-00001-of-00002.safetensors" for k in shard1},
                            **{k: "model-00002-of-00002.safetensors" for k in shard2}}}
    (d / "model.safetensors.index.json").write_text(json.dumps(index, indent=2) + "\n")
    params = [torch.nn.Parameter(torch.randn(8, 8, generator=g)) for _ in range(2)]
    opt = torch.optim.AdamW(params, lr=1e-3)
    sum((p ** 2).sum() for p in params).backward()
    opt.step()
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0)
    torch.save(opt.state_dict(), d / "optimizer.pt")
    torch.save(sched.state_dict(), d / "scheduler.pt")
    torch.save({"python": random.getstate(), "numpy": np.random.get_state(),
                "cpu": torch.random.get_rng_state()}, d / "rng_state.pth")
    (d / "trainer_state.json").write_text(json.dumps({"global_step": 6, "log_history": [{"loss": 1.5, "step": 6}]}))
    (d / "config.json").write_text('{"model_type": "gpt2", "n_embd": 32}\n')
    (d / "tokenizer.json").write_bytes("{\"vocab\": {\"é\": 0, \"\\u00ff\": 1}}\r\n".encode())
    (d / "special_tokens_map.json").write_text("{}")
    (d / "merges.txt").write_bytes(b"")
    (d / "training_args.bin").write_bytes(pickle.dumps(_Marker(str(marker))))
    (d / "sub").mkdir()
    (d / "sub" / "notes.txt").write_bytes(bytes(range(256)) * 3)
    return d


def _files(d: Path) -> list[str]:
    return sorted(p.relative_to(d).as_posix() for p in d.rglob("*") if p.is_file())


def _same_tensors(a, b) -> None:
    if isinstance(a, torch.Tensor):
        assert isinstance(b, torch.Tensor) and a.dtype == b.dtype and torch.equal(a, b)
    elif isinstance(a, dict):
        assert list(a) == list(b)
        for k in a:
            _same_tensors(a[k], b[k])
    elif isinstance(a, (list, tuple)):
        assert type(a) is type(b) and len(a) == len(b)
        for x, y in zip(a, b):
            _same_tensors(x, y)
    elif isinstance(a, np.ndarray):
        assert np.array_equal(a, b)
    else:
        assert a == b


def _check_restored(src: Path, out: Path) -> None:
    assert _files(out) == _files(src)
    for rel in _files(src):
        a, b = src / rel, out / rel
        if a.suffix in (".safetensors", ".pt", ".pth"):
            _same_tensors(load_checkpoint(a), load_checkpoint(b))
        else:
            assert a.read_bytes() == b.read_bytes(), rel
    for shard in ("model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"):
        with safe_open(str(out / shard), framework="pt") as f:
            assert f.metadata() == {"format": "pt"}


def test_directory_round_trip_api(repo, tmp_path):
    marker = tmp_path / "unpickled"
    src = _hf_like_dir(tmp_path / "run", marker)
    cid = commit_dir(repo, src, "checkpoint-6", step=6)
    assert repo.read_commit(cid).step == 6
    (tmp_path / "restored").mkdir()
    out = checkout_dir(repo, cid, tmp_path / "restored" / "checkpoint-6")
    assert out == tmp_path / "restored" / "checkpoint-6"
    _check_restored(src, out)
    assert not marker.exists(), "training_args.bin must never be unpickled"
    # Unchanged byte files cost nothing the second time: the same payload ids.
    snap = repo.read_snapshot(repo.read_commit(cid).snapshot)
    cid2 = commit_dir(repo, src, "again", step=6)
    snap2 = repo.read_snapshot(repo.read_commit(cid2).snapshot)
    assert [t.chunks for t in snap.tensors] == [t.chunks for t in snap2.tensors]


def test_directory_round_trip_cli(repo, tmp_path):
    marker = tmp_path / "unpickled"
    src = _hf_like_dir(tmp_path / "run", marker)
    code, out, err = run(repo.path, "commit", "-m", "dir", str(src), "--step", "6", "--lossless")
    assert code == 0, err
    target = tmp_path / "back"
    code, out, err = run(repo.path, "checkout", "HEAD", "-o", str(target))
    assert code == 0, err
    assert "Wrote directory" in out
    _check_restored(src, target)
    # A non-empty target is refused, and nothing in it is touched.
    code, out, err = run(repo.path, "checkout", "HEAD", "-o", str(target))
    assert code == OutputDirectoryExistsError.exit_code and "not empty" in err
    code, out, err = run(repo.path, "checkout", "HEAD", "-o", str(tmp_path / "part"), "--weights-only")
    assert code == 2 and "checked out whole" in err and not (tmp_path / "part").exists()
    # A directory commit cannot become the working checkpoint file.
    repo.config.set("checkpoint.path", "ck.pt")
    code, out, err = run(repo.path, "checkout", "HEAD")
    assert code == 2 and "-o DIR" in err
    assert not marker.exists()


def test_unsafe_pickle_refused_and_nothing_stored(repo, tmp_path):
    marker = tmp_path / "unpickled"
    src = _hf_like_dir(tmp_path / "run", marker)
    (src / "evil.pt").write_bytes(pickle.dumps(_Marker(str(marker))))
    before = sorted(repo.store.blobs.iter_ids())
    with pytest.raises(UnsafeCheckpointError, match="evil.pt"):
        commit_dir(repo, src, "nope")
    code, out, err = run(repo.path, "commit", "-m", "nope", str(src))
    assert code == UnsafeCheckpointError.exit_code and "evil.pt" in err
    assert sorted(repo.store.blobs.iter_ids()) == before and repo.head() is None
    assert not marker.exists()
    # Named opaque, the same file is kept as bytes (never unpickled).
    cid = commit_dir(repo, src, "opaque", opaque=("training_args.bin", "evil.pt"))
    checkout_dir(repo, cid, tmp_path / "x")
    assert (tmp_path / "x" / "evil.pt").read_bytes() == (src / "evil.pt").read_bytes()
    assert not marker.exists()


def test_symlinks_and_empty_dirs_refused(tmp_path):
    d = tmp_path / "d"
    d.mkdir()
    with pytest.raises(CheckpointDirectoryError, match="no files"):
        load_dir(d)
    (d / "a.json").write_text("{}")
    os.symlink("/etc/passwd", d / "link")
    with pytest.raises(CheckpointDirectoryError, match="symbolic link"):
        load_dir(d)


@pytest.mark.parametrize("rel", ["../escape.txt", "/abs.txt", "a/../../b", "", "a//b", "./a", "a\\b"])
def test_stored_paths_are_checked_before_writing(tmp_path, rel):
    state = {DIR_MARK: 1, "files": {"ok.txt": {"kind": "bytes", "data": torch.tensor([65], dtype=torch.uint8)},
                                    rel: {"kind": "bytes", "data": torch.tensor([66], dtype=torch.uint8)}}}
    with pytest.raises(MalformedDirectoryError):
        save_dir(state, tmp_path / "out")
    assert not (tmp_path / "out").exists() and not (tmp_path / "escape.txt").exists()
    assert [p.name for p in tmp_path.iterdir()] == []


def test_file_and_directory_of_one_name_refused(tmp_path):
    one = torch.tensor([1], dtype=torch.uint8)
    state = {DIR_MARK: 1, "files": {"a": {"kind": "bytes", "data": one}, "a/b": {"kind": "bytes", "data": one}}}
    with pytest.raises(MalformedDirectoryError, match="both a file and a directory"):
        save_dir(state, tmp_path / "out")
    with pytest.raises(MalformedDirectoryError, match="unknown file node"):
        save_dir({DIR_MARK: 1, "files": {"a": {"kind": "exec"}}}, tmp_path / "out")


def test_checkout_dir_of_a_file_commit_is_refused(repo, tmp_path):
    repo.commit({"w": torch.ones(3)}, "file")
    with pytest.raises(Exception, match="not a directory"):
        checkout_dir(repo, "HEAD", tmp_path / "o")
