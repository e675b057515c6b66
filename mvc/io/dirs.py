"""Checkpoint directories (a Hugging Face ``checkpoint-N/``, say) as one commit, and back.

    cid = commit_dir(repo, "out/checkpoint-500", "step 500", step=500)
    checkout_dir(repo, cid, "out/checkpoint-500")      # the same tree again

A directory becomes one nested state, committed like any checkpoint::

    {"mvc.directory": 1, "files": {<relative path>: <file node>, ...}}   (paths sorted)

and each file node says how the file is kept:

* ``{"kind": "safetensors", "state": {...}}``: a ``*.safetensors`` file (a shard of a sharded
  model too), its tensors through the codecs, its header ``__metadata__`` kept;
* ``{"kind": "pt", "state": ...}``: a ``*.pt / *.pth / *.bin / *.ckpt`` torch file, loaded by
  `mvc.io.files.load_checkpoint` (torch's weights-only unpickler behind the validated zip
  reader): a pickle needing any other global is refused before anything is stored;
* ``{"kind": "bytes", "data": <uint8 tensor>}``: every other file (JSON, the shard index,
  tokenizer files, ...) and the files named by `opaque` patterns (by default
  ``training_args.bin``, a pickle of the training arguments that only the trainer writes):
  their bytes, stored exactly and never interpreted, deduplicated across commits like any
  payload.

On checkout tensor files are written again in their format (torch files by ``torch.save``,
safetensors with their metadata); byte files are byte-identical.  Stored paths are untrusted:
each must be a plain relative path inside the target (no ``..``, no absolute or empty
parts).  Symbolic links and special files are refused on commit; empty directories are not
kept.  The tree is written into a temporary sibling and renamed into place, so a failed
checkout leaves no half-written directory.
"""
from __future__ import annotations

import fnmatch
import os
import secrets
import shutil
import stat
from pathlib import Path, PurePosixPath
from typing import Any, Mapping, Sequence

import torch

from mvc.errors import DataError, UsageError
from mvc.io.files import SAFETENSORS_SUFFIXES, TORCH_SUFFIXES, load_checkpoint, save_checkpoint

#: The marker key of a directory state, and its format version.
DIR_MARK = "mvc.directory"
DIR_FORMAT = 1
#: Files kept as opaque bytes whatever their extension: pickles of arbitrary objects that
#: frameworks write next to the tensors and never need mvc to read.
DEFAULT_OPAQUE = ("training_args.bin",)
_KINDS = ("bytes", "pt", "safetensors")


class CheckpointDirectoryError(UsageError):
    """A directory given to commit cannot be stored: a symbolic link or special file inside,
    an unreadable file, or no file at all."""

    exit_code = 150


class OutputDirectoryExistsError(UsageError):
    """A directory checkout's target exists and is not empty (nothing was written)."""

    exit_code = 151


class MalformedDirectoryError(DataError):
    """A stored directory state is malformed: an unknown file kind, or a path that is not a
    plain relative path inside the target (nothing was written)."""

    exit_code = 152


def is_dir_state(state: Any) -> bool:
    """True when `state` is a directory state (what `load_dir` returns, or a checkout of one)."""
    return isinstance(state, dict) and DIR_MARK in state


def load_dir(path: str | os.PathLike, *, opaque: Sequence[str] = DEFAULT_OPAQUE) -> dict:
    """Read the checkpoint directory `path` into a directory state (see the module doc).

    `opaque`: glob patterns of file names (or relative paths) kept as bytes even when their
    extension is a torch one.  Raises `CheckpointDirectoryError`, or the checkpoint-file errors
    of `load_checkpoint` naming the file (`UnsafeCheckpointError` for a refused pickle).
    """
    root = Path(os.fspath(path)).expanduser()
    if not root.is_dir():
        raise CheckpointDirectoryError(f"{root}: not a directory")
    files: dict[str, dict] = {}
    for rel in _walk(root):
        files[rel] = _load_file(root / rel, rel, opaque)
    if not files:
        raise CheckpointDirectoryError(f"{root}: no files to commit")
    return {DIR_MARK: DIR_FORMAT, "files": files}


def save_dir(state: Mapping, path: str | os.PathLike, *, replace: bool = False) -> Path:
    """Write a directory state as the tree it was read from; returns the directory.

    `path` must not exist or be an empty directory (`OutputDirectoryExistsError`), unless
    `replace`: then what is there (a tree, a file, a link) is deleted once the new tree is in
    place.  Paths and kinds are checked before anything is written (`MalformedDirectoryError`).
    """
    files = _checked_files(state)
    target = Path(os.fspath(path)).expanduser()
    if not replace and (target.is_symlink() or (target.exists() and not target.is_dir())):
        raise OutputDirectoryExistsError(f"{target}: exists and is not a directory; nothing was written")
    if not replace and target.is_dir() and any(target.iterdir()):
        raise OutputDirectoryExistsError(f"{target}: exists and is not empty; nothing was written")
    parent = target.absolute().parent
    if not parent.is_dir():
        raise UsageError(f"{parent}: directory does not exist")
    tmp = parent / f".{target.name}.{secrets.token_hex(6)}.tmp"
    tmp.mkdir()
    try:
        for rel, node in files.items():
            out = tmp.joinpath(*PurePosixPath(rel).parts)
            out.parent.mkdir(parents=True, exist_ok=True)
            if node["kind"] == "bytes":
                out.write_bytes(_tensor_bytes(node["data"], rel))
            else:
                save_checkpoint(node["state"], out, format=node["kind"])
        _swap_in(tmp, target)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return target


def _swap_in(tmp: Path, target: Path) -> None:
    """Rename the written tree `tmp` to `target`; what was at `target` is deleted only once
    the new tree is in place (a failed rename puts it back)."""
    if not (target.is_symlink() or target.exists()):
        os.replace(tmp, target)
        return
    if target.is_dir() and not target.is_symlink() and not any(target.iterdir()):
        target.rmdir()
        os.replace(tmp, target)
        return
    old = target.parent / f".{target.name}.{secrets.token_hex(6)}.old"
    os.rename(target, old)  # a link is moved, never followed
    try:
        os.replace(tmp, target)
    except BaseException:
        os.rename(old, target)
        raise
    if old.is_dir() and not old.is_symlink():
        shutil.rmtree(old, ignore_errors=True)
    else:
        try:
            old.unlink()
        except OSError:  # the checkout has succeeded; a leftover hidden file is no failure
            pass


def commit_dir(repo: Any, path: str | os.PathLike, message: str, *,
               opaque: Sequence[str] = DEFAULT_OPAQUE, **commit_args: Any) -> str:
    """Commit the checkpoint directory `path` to `repo` (a `mvc.repo.Repo`) as one commit.

    `commit_args` go to `Repo.commit` (step, metrics, lossless, quant, quality, ...).  The
    whole tree is read and checked before anything is stored, so a refused file stores nothing.
    """
    return repo.commit(load_dir(path, opaque=opaque), message, **commit_args)


def checkout_dir(repo: Any, rev: str, path: str | os.PathLike) -> Path:
    """Write the directory committed at `rev` to `path` (absent or empty); HEAD does not move."""
    state = repo.read_state(rev)
    if not is_dir_state(state):
        raise UsageError(f"{rev}: holds a checkpoint file, not a directory (check it out to a file with -o FILE)")
    return save_dir(state, path)


# --------------------------------------------------------------------------- helpers


def _walk(root: Path) -> list[str]:
    """Relative POSIX paths of every regular file under `root`, sorted; refuses links and specials."""
    found: list[str] = []
    for dirpath, dirnames, filenames in os.walk(root, followlinks=False):
        here = Path(dirpath)
        for name in dirnames + filenames:
            full = here / name
            mode = full.lstat().st_mode
            rel = full.relative_to(root).as_posix()
            if stat.S_ISLNK(mode):
                raise CheckpointDirectoryError(f"{full}: symbolic links are not stored (copy the file in)")
            if name in filenames and not stat.S_ISREG(mode):
                raise CheckpointDirectoryError(f"{full}: not a regular file")
            if name in filenames:
                found.append(rel)
    return sorted(found)


def _load_file(full: Path, rel: str, opaque: Sequence[str]) -> dict:
    suffix = full.suffix.lower()
    is_opaque = any(fnmatch.fnmatchcase(full.name, p) or fnmatch.fnmatchcase(rel, p) for p in opaque)
    if suffix in SAFETENSORS_SUFFIXES and not is_opaque:
        return {"kind": "safetensors", "state": load_checkpoint(full)}
    if suffix in TORCH_SUFFIXES and not is_opaque:
        return {"kind": "pt", "state": load_checkpoint(full)}
    try:
        data = full.read_bytes()
    except OSError as exc:
        raise CheckpointDirectoryError(f"{full}: cannot be read ({exc.strerror or exc})") from None
    return {"kind": "bytes", "data": torch.frombuffer(bytearray(data), dtype=torch.uint8) if data
            else torch.empty(0, dtype=torch.uint8)}


def _checked_files(state: Mapping) -> dict[str, dict]:
    """The state's files, every path and node checked before anything is written."""
    if not is_dir_state(state) or state.get(DIR_MARK) != DIR_FORMAT:
        raise MalformedDirectoryError(f"not a directory state of format {DIR_FORMAT}")
    files = state.get("files")
    if not isinstance(files, dict) or not files:
        raise MalformedDirectoryError("a directory state needs a non-empty 'files' map")
    prefixes: set[str] = set()
    for rel, node in files.items():
        _check_rel(rel)
        if not isinstance(node, dict) or node.get("kind") not in _KINDS:
            raise MalformedDirectoryError(f"{rel!r}: unknown file node")
        if node["kind"] == "bytes" and not isinstance(node.get("data"), torch.Tensor):
            raise MalformedDirectoryError(f"{rel!r}: a byte file needs its data as a tensor")
        if node["kind"] != "bytes" and "state" not in node:
            raise MalformedDirectoryError(f"{rel!r}: a tensor file needs its state")
        parts = rel.split("/")
        prefixes.update("/".join(parts[:i]) for i in range(1, len(parts)))
    clash = prefixes.intersection(files)
    if clash:
        raise MalformedDirectoryError(f"{sorted(clash)[0]!r}: is both a file and a directory")
    return files


def _check_rel(rel: Any) -> None:
    if not isinstance(rel, str) or not rel or "\x00" in rel or "\\" in rel:
        raise MalformedDirectoryError(f"{rel!r}: not a plain relative path")
    parts = rel.split("/")
    if rel.startswith("/") or any(p in ("", ".", "..") for p in parts):
        raise MalformedDirectoryError(f"{rel!r}: not a plain relative path inside the directory")


def _tensor_bytes(data: torch.Tensor, rel: str) -> bytes:
    if data.dtype != torch.uint8 or data.dim() != 1:
        raise MalformedDirectoryError(f"{rel!r}: byte data must be a 1-D uint8 tensor")
    return data.detach().cpu().contiguous().numpy().tobytes()
