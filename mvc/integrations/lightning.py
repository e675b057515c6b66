"""PyTorch Lightning integration: checkpoints as mvc commits behind small pointer files.

    from mvc.integrations.lightning import MvcCallback, MvcCheckpointIO
    io = MvcCheckpointIO("runs/exp1")                     # a path (created) or a Repo
    trainer = Trainer(plugins=[io], callbacks=[ModelCheckpoint(...), MvcCallback(io, quality=val_loss)])
    trainer.fit(model, ckpt_path="checkpoints/last.ckpt")   # a pointer file: resumes from mvc

`MvcCheckpointIO.save_checkpoint` commits the checkpoint dict Lightning builds (weights,
``optimizer_states``, ``lr_schedulers``, loops, callbacks' state, ...) and writes a small JSON
*pointer file* at `path` naming the commit, so `ModelCheckpoint`'s top-k and ``last`` logic and
``trainer.fit(ckpt_path=path)`` work unchanged.  Each pointer's commit is also held by a tag
``ckpt/<file name>-<hash of the path>``; `remove_checkpoint` deletes the pointer and that tag.
The commit stays in the branch's history (mvc keeps history cheaply; `gc` frees what no ref,
branch or reflog reaches).  ``mvc checkout <commit> -o x.ckpt`` writes a plain Lightning
checkpoint file that ``Trainer.fit(ckpt_path="x.ckpt")`` reads without mvc.

`MvcCallback` adds what needs the training loop: a gradient EMA (`GradientEMA`, keyed like the
checkpoint's ``state_dict``) for sensitivity-based pruning/protection, the metrics Lightning
logged (``trainer.callback_metrics``), and a quality function ``quality(pl_module) -> loss``
that judges the commit's quantization search.  Needs ``pip install mvc[lightning]``.
"""
from __future__ import annotations

import hashlib
import json
import math
import os
import re
import secrets
from pathlib import Path
from typing import Any, Callable, Mapping

import torch
from lightning.fabric.plugins.io.checkpoint_io import CheckpointIO
from lightning.pytorch.callbacks import Callback

from mvc.errors import UsageError
from mvc.integrations.grad_ema import BETA, GradientEMA
from mvc.io.files import load_checkpoint
from mvc.integrations.repo_handle import RepoOnDemand
from mvc.repo.repository import Repo

#: The first key of every pointer file, and its format version.
POINTER_MARK = "mvc_checkpoint_pointer"
POINTER_FORMAT = 1
#: Tags holding the pointers' commits.
TAG_PREFIX = "ckpt/"
#: Where a Lightning checkpoint keeps the module's weights (the flattened names' prefix).
STATE_DICT_PREFIX = "state_dict/"
_POINTER_MAX_BYTES = 64 * 1024


class PointerFileError(UsageError):
    """A Lightning checkpoint pointer file is malformed, or names a commit of another repository."""

    exit_code = 154


def read_pointer(path: str | os.PathLike) -> dict | None:
    """The pointer file at `path` as a dict (repo, commit, tag), or None when `path` is not one
    (a plain checkpoint file).  A file that starts like a pointer but is malformed is an error."""
    p = Path(os.fspath(path))
    try:
        with open(p, "rb") as f:
            head = f.read(_POINTER_MAX_BYTES + 1)
    except OSError as exc:
        raise PointerFileError(f"{p}: cannot be read ({exc.strerror or exc})") from None
    if not head.lstrip().startswith(b"{") or POINTER_MARK.encode() not in head[:200]:
        return None
    try:
        pointer = json.loads(head)
    except ValueError:
        raise PointerFileError(f"{p}: a damaged mvc pointer file") from None
    if (not isinstance(pointer, dict) or pointer.get(POINTER_MARK) != POINTER_FORMAT
            or not isinstance(pointer.get("commit"), str) or not isinstance(pointer.get("repo"), str)):
        raise PointerFileError(f"{p}: not an mvc pointer file of format {POINTER_FORMAT}")
    return pointer


def tag_for(path: str | os.PathLike) -> str:
    """The tag that holds the commit of the pointer at `path`: its file name (made a valid ref
    name) and a short hash of its absolute path, so two runs' ``last.ckpt`` never share one."""
    full = str(Path(os.fspath(path)).absolute())
    stem = re.sub(r"[^A-Za-z0-9._=-]+", "-", Path(full).name).strip("-.") or "checkpoint"
    stem = re.sub(r"\.\.+", ".", stem).removesuffix(".lock")
    return f"{TAG_PREFIX}{stem}-{hashlib.sha1(full.encode()).hexdigest()[:10]}"


class MvcCheckpointIO(CheckpointIO):
    """A Lightning `CheckpointIO` that commits checkpoints to mvc and leaves pointer files.

    repo: a `Repo` or a path (a repository is created there if none exists); commit_args:
    passed to every `Repo.commit` (``lossless=True``, ``epsilon=``, ``space=``, ``policy=``...).
    `commits` lists (pointer path, commit id) of the saves.  An `MvcCallback` given this object
    adds grads, metrics and the quality function to each commit.
    """

    def __init__(self, repo: str | os.PathLike | Repo, **commit_args: Any) -> None:
        super().__init__()
        # Opened on first use: every rank builds the plugin, only one commits.
        self._repo = RepoOnDemand(repo, create=True)
        self.commit_args = commit_args
        self.commits: list[tuple[str, str]] = []
        #: Set by `MvcCallback.on_save_checkpoint` for the next save only.
        self.pending: dict[str, Any] = {}

    @property
    def repo(self) -> Repo:
        """The repository commits go to (opened, or created, on first use)."""
        return self._repo.get()

    def save_checkpoint(self, checkpoint: dict[str, Any], path: str | os.PathLike,
                        storage_options: Any = None, **kwargs: Any) -> None:
        """Commit `checkpoint`, then write the pointer file at `path` (atomically) and move its tag."""
        if storage_options is not None:
            raise TypeError(f"{type(self).__name__} does not use storage_options; got {storage_options!r}")
        target = Path(os.fspath(path))
        pending, self.pending = self.pending, {}
        step = checkpoint.get("global_step")
        args = {**self.commit_args, **pending}
        cid = self.repo.commit(checkpoint, f"lightning: {target.name}",
                               step=step if isinstance(step, int) and not isinstance(step, bool) else None,
                               **args)
        tag = tag_for(target)
        self._move_tag(tag, cid)
        pointer = {POINTER_MARK: POINTER_FORMAT, "repo": str(self.repo.path), "commit": cid, "tag": tag,
                   "step": step if isinstance(step, int) else None}
        _write_atomic(target, (json.dumps(pointer, indent=1) + "\n").encode())
        self.commits.append((str(target), cid))

    def load_checkpoint(self, path: str | os.PathLike, map_location: Any = None,
                        weights_only: bool | None = None, **kwargs: Any) -> dict[str, Any]:
        """The checkpoint a pointer file names, read from mvc; a plain checkpoint file is read
        with mvc's safe loader (weights-only whatever `weights_only` says)."""
        pointer = read_pointer(path)
        location = map_location if isinstance(map_location, (str, torch.device)) else "cpu"
        if pointer is None:
            state = load_checkpoint(path)
        else:
            repo = self._repo_of(pointer, path)
            state = repo.read_state(pointer["commit"], map_location=location)
        if not isinstance(state, dict):
            raise PointerFileError(f"{path}: holds a {type(state).__name__}, not a Lightning checkpoint dict")
        return state

    def remove_checkpoint(self, path: str | os.PathLike, **kwargs: Any) -> None:
        """Delete the pointer file at `path` and its tag (when the tag still holds its commit)."""
        target = Path(os.fspath(path))
        if not target.exists():
            return
        pointer = read_pointer(target)
        if pointer is not None and Path(pointer["repo"]) == self.repo.path:
            tag = pointer.get("tag")
            if isinstance(tag, str) and dict(self.repo.tags()).get(tag) == pointer["commit"]:
                self.repo.delete_tag(tag)
        target.unlink()

    def _move_tag(self, tag: str, cid: str) -> None:
        if tag in dict(self.repo.tags()):
            self.repo.delete_tag(tag)
        self.repo.tag(tag, cid)

    def _repo_of(self, pointer: Mapping[str, Any], path: Any) -> Repo:
        if Path(pointer["repo"]) == self.repo.path:
            return self.repo
        try:
            return Repo(pointer["repo"])
        except Exception as exc:
            raise PointerFileError(f"{path}: names the repository {pointer['repo']}, which cannot be opened "
                                   f"({exc})") from None


class MvcCallback(Callback):
    """The training-loop side of `MvcCheckpointIO`: gradient EMA, logged metrics, quality.

    io: the `MvcCheckpointIO` the Trainer saves through; quality: ``quality(pl_module) -> loss``
    (lower is better) that judges the quantization search on each commit (None: the proxy
    gate); grad_ema: keep an EMA of the gradients after each backward pass; beta: its weight.
    """

    def __init__(self, io: MvcCheckpointIO, *, quality: Callable[[Any], float] | None = None,
                 grad_ema: bool = True, beta: float = BETA) -> None:
        if not isinstance(io, MvcCheckpointIO):
            raise UsageError(f"MvcCallback needs the MvcCheckpointIO the Trainer uses, got {type(io).__name__}")
        if quality is not None and not callable(quality):
            raise UsageError("quality must be a callable taking the LightningModule")
        self.io, self.quality, self.grad_ema, self.beta = io, quality, grad_ema, beta
        self.ema: GradientEMA | None = None

    def setup(self, trainer: Any, pl_module: Any, stage: str) -> None:
        if self.grad_ema and stage == "fit":
            self.ema = GradientEMA(pl_module, beta=self.beta, prefix=STATE_DICT_PREFIX)

    def on_after_backward(self, trainer: Any, pl_module: Any) -> None:
        if self.ema is not None:
            self.ema.accumulate()

    def on_save_checkpoint(self, trainer: Any, pl_module: Any, checkpoint: dict[str, Any]) -> None:
        """Hand this save's grads, metrics and quality function to the checkpoint IO."""
        if not trainer.is_global_zero:
            return
        pending: dict[str, Any] = {"metrics": _finite_metrics(trainer.callback_metrics)}
        if self.ema is not None:
            pending["grads"] = self.ema.take()
        if self.quality is not None:
            pending["quality"] = _evaluator(pl_module, self.quality)
        self.io.pending = pending


def _finite_metrics(metrics: Mapping[str, Any]) -> dict[str, float]:
    out: dict[str, float] = {}
    for key, value in metrics.items():
        try:
            number = float(value.item() if isinstance(value, torch.Tensor) and value.numel() == 1 else value)
        except (TypeError, ValueError):
            continue
        if math.isfinite(number):
            out[str(key)] = number
    return out


def _evaluator(module: torch.nn.Module, quality: Callable[[Any], float]) -> Callable[[Mapping], float]:
    """evaluate(candidate checkpoint) -> quality(module) with the candidate's ``state_dict``
    tensors copied into the live module under no_grad; the live values and mode are put back."""
    targets = module.state_dict(keep_vars=True)

    def evaluate(candidate: Mapping) -> float:
        entries = candidate.get("state_dict")
        if not isinstance(entries, Mapping):
            entries = {k[len(STATE_DICT_PREFIX):]: v for k, v in candidate.items()
                       if isinstance(k, str) and k.startswith(STATE_DICT_PREFIX)}
        with torch.no_grad():
            mode = module.training
            saved = {k: t.detach().clone() for k, t in targets.items() if isinstance(entries.get(k), torch.Tensor)}
            try:
                for k in saved:
                    targets[k].detach().copy_(entries[k])
                return float(quality(module))
            finally:
                for k, v in saved.items():
                    targets[k].detach().copy_(v)
                module.train(mode)

    evaluate.__name__ = evaluate.__qualname__ = "lightning:" + getattr(quality, "__qualname__", "quality")
    return evaluate


def _write_atomic(target: Path, data: bytes) -> None:
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.parent / f".{target.name}.{secrets.token_hex(6)}.tmp"
    try:
        with open(tmp, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, target)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
