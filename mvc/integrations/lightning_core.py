"""What the Lightning plugin and callback do, for either Lightning package.

Lightning ships the same code under two names: ``lightning`` (``lightning.pytorch``,
``lightning.fabric``) and ``pytorch_lightning`` (with ``lightning_fabric``).  Each has its own
class hierarchy, and a Trainer of one accepts only a `CheckpointIO` subclass of its own.  So each
namespace gets thin classes (`mvc.integrations.lightning`, `mvc.integrations.pytorch_lightning`)
that combine the mixins here with that namespace's base classes; everything they do is here,
once, and this module imports neither package.
"""
from __future__ import annotations

import hashlib
import importlib.util
import json
import math
import os
import re
import secrets
from pathlib import Path
from typing import Any, Callable, Mapping

import torch

from mvc.errors import UsageError
from mvc.integrations.grad_ema import BETA, GradientEMA
from mvc.integrations.repo_handle import RepoOnDemand
from mvc.io.files import load_checkpoint
from mvc.repo.repository import Repo
from mvc.repo.transaction import NothingToCommitError
from mvc.state import flatten

#: The first key of every pointer file, and its format version.
POINTER_MARK = "mvc_checkpoint_pointer"
POINTER_FORMAT = 1
#: Tags holding the pointers' commits.
TAG_PREFIX = "ckpt/"
#: Where a Lightning checkpoint keeps the module's weights (the flattened names' prefix).
STATE_DICT_PREFIX = "state_dict/"
_POINTER_MAX_BYTES = 64 * 1024
#: Each Lightning package and the mvc module whose classes its Trainer accepts.
MODULES = {"lightning": "mvc.integrations.lightning", "pytorch_lightning": "mvc.integrations.pytorch_lightning"}
#: The top-level modules each package installs that its mvc module imports.
_TOP_LEVEL = {"lightning": ("lightning",), "pytorch_lightning": ("pytorch_lightning", "lightning_fabric")}


class PointerFileError(UsageError):
    """A Lightning checkpoint pointer file is malformed, or names a commit of another repository."""

    exit_code = 154


class LightningSetupError(UsageError):
    """The plugin and callback are wired up in a way that cannot work: mvc's classes for one
    Lightning package given to the other's Trainer, or an `MvcCallback` whose `MvcCheckpointIO`
    is not the Trainer's checkpoint IO."""

    exit_code = 105


class LightningNotInstalledError(UsageError, ModuleNotFoundError):
    """The Lightning package a module of mvc.integrations is for is not installed (an
    ImportError too, so ``pytest.importorskip`` and ``except ImportError`` see it)."""

    exit_code = 106


def not_installed(package: str, exc: ModuleNotFoundError) -> ModuleNotFoundError:
    """The error for `exc`, raised while `MODULES[package]` imported `package`: one naming the
    module to use instead when the other Lightning package is installed, or what to install;
    `exc` itself when what is missing is not `package` (a broken installation)."""
    if (exc.name or "").split(".")[0] not in _TOP_LEVEL[package]:
        return exc
    other = next(p for p in MODULES if p != package)
    if importlib.util.find_spec(other) is not None:
        hint = f", which is not installed; `{other}` is: with `import {other}`, use {MODULES[other]}"
    else:
        hint = "; neither `lightning` nor `pytorch_lightning` is installed: pip install 'mvc[lightning]' (installs both)"
    return LightningNotInstalledError(f"{MODULES[package]} needs the `{package}` package{hint}", name=package)


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


class CheckpointIOCore:
    """`MvcCheckpointIO`'s behaviour; the per-package class adds Lightning's `CheckpointIO` base.

    repo: a `Repo` or a path (a repository is created there if none exists); commit_args:
    passed to every `Repo.commit` (``lossless=True``, ``epsilon=``, ``space=``, ``policy=``...).
    A checkpoint equal to the branch's head (Lightning's ``save_last=True`` saves each state
    twice, as the top-k file and as ``last.ckpt``) makes no second commit: its pointer names
    the head (``allow_empty=True`` in commit_args commits anyway).  `commits` lists (pointer
    path, commit id) of the saves.  An `MvcCallback` given this object adds grads, metrics and
    the quality function to each commit.
    """

    #: The Lightning package whose Trainer accepts this class (set by the per-package class).
    package = ""

    def __init__(self, repo: str | os.PathLike | Repo, **commit_args: Any) -> None:
        super().__init__()
        # Opened on first use: every rank builds the plugin, only one commits.
        self._repo = RepoOnDemand(repo, create=True)
        self.commit_args = commit_args
        self.commits: list[tuple[str, str]] = []

    def __repr__(self) -> str:
        # Lightning names a plugin it refuses by its repr: say which Trainer this one is for.
        other = next(p for p in MODULES if p != self.package)
        return (f"{type(self).__name__}({str(self._repo.path)!r}) of {MODULES[self.package]}, for a "
                f"`{self.package}` Trainer only (with `{other}`, use {MODULES[other]}.{type(self).__name__})")

    @property
    def repo(self) -> Repo:
        """The repository commits go to (opened, or created, on first use)."""
        return self._repo.get()

    def save_checkpoint(self, checkpoint: dict[str, Any], path: str | os.PathLike,
                        storage_options: Any = None, **kwargs: Any) -> None:
        """Commit `checkpoint` (unless it equals the head), then write the pointer file at `path`
        (atomically) and move its tag."""
        if storage_options is not None:
            raise TypeError(f"{type(self).__name__} does not use storage_options; got {storage_options!r}")
        target = Path(os.fspath(path))
        # what MvcCallback.on_save_checkpoint gave this very checkpoint (it travels with it, to
        # the saving thread of an AsyncCheckpointIO too); nothing without the callback
        pending = checkpoint.pop(PENDING_KEY, {})
        step = checkpoint.get("global_step")
        args = {"allow_empty": False, **self.commit_args, **pending}
        try:
            cid = self.repo.commit(checkpoint, f"lightning: {target.name}",
                                   step=step if isinstance(step, int) and not isinstance(step, bool) else None,
                                   **args)
        except NothingToCommitError as same:
            cid = same.head  # already committed (the save before this one): point at it
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
        """Delete the pointer file at `path` and its tag (when the tag still holds its commit).
        A symbolic link (``save_last="link"``) is only unlinked: the tag is its target's."""
        target = Path(os.fspath(path))
        if target.is_symlink():
            target.unlink()
            return
        if not target.exists():
            return
        pointer = read_pointer(target)
        if pointer is not None and Path(pointer["repo"]) == self.repo.path:
            tag = pointer.get("tag")
            if isinstance(tag, str) and dict(self.repo.tags()).get(tag) == pointer["commit"]:
                self.repo.delete_tag(tag)
        target.unlink()

    def _move_tag(self, tag: str, cid: str) -> None:
        tags = dict(self.repo.tags())
        if tags.get(tag) == cid:
            return
        if tag in tags:
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


class CallbackCore:
    """`MvcCallback`'s behaviour: gradient EMA, logged metrics, quality; the per-package class
    adds Lightning's `Callback` base and the classes it checks the Trainer against.

    io: the `MvcCheckpointIO` the Trainer saves through; quality: ``quality(pl_module) -> loss``
    (lower is better) that judges the quantization search on each commit (None: the proxy
    gate); grad_ema: keep an EMA of the gradients at each optimizer step (unscaled, whole);
    beta: its weight.
    """

    #: Set by the per-package class: its package, its `MvcCheckpointIO`, that package's Trainer.
    package = ""
    io_class: type = CheckpointIOCore
    trainer_class: type = object

    def __init__(self, io: CheckpointIOCore, *, quality: Callable[[Any], float] | None = None,
                 grad_ema: bool = True, beta: float = BETA) -> None:
        if not isinstance(io, self.io_class):
            if isinstance(io, CheckpointIOCore):
                raise LightningSetupError(f"{MODULES[self.package]}.MvcCallback needs that module's MvcCheckpointIO, "
                                          f"got {MODULES[io.package]}'s (one Lightning package for both)")
            raise UsageError(f"MvcCallback needs the MvcCheckpointIO the Trainer uses, got {type(io).__name__}")
        if quality is not None and not callable(quality):
            raise UsageError("quality must be a callable taking the LightningModule")
        self.io, self.quality, self.grad_ema, self.beta = io, quality, grad_ema, beta
        self.ema: GradientEMA | None = None
        self._grads: tuple[int, dict[str, torch.Tensor]] | None = None

    def setup(self, trainer: Any, pl_module: Any, stage: str) -> None:
        """Check that the Trainer saves through `io` (else nothing would reach the commits) and
        that the module's hyper-parameters can be stored (`UnsupportedStateError` naming the
        value otherwise); start the gradient EMA."""
        if not isinstance(trainer, self.trainer_class):
            package = type(trainer).__module__.split(".")[0]
            raise LightningSetupError(f"{MODULES[self.package]}.MvcCallback is for a `{self.package}` Trainer, "
                                      f"got a `{package}` one: use {MODULES.get(package, 'the module for it')}")
        if stage == "fit" and not _saves_through(trainer, self.io):
            raise LightningSetupError("the Trainer does not save through this MvcCallback's MvcCheckpointIO: "
                                      "pass it as Trainer(plugins=[io])")
        # saving through `io` (checked above), but not as the Trainer's own IO: through a wrapper
        if stage == "fit" and self.quality is not None \
                and getattr(getattr(trainer, "strategy", None), "checkpoint_io", None) is not self.io:
            raise LightningSetupError(
                "quality= with a checkpoint IO that saves on a thread of its own (Lightning's "
                "AsyncCheckpointIO): the search would copy candidate weights into the live module "
                "while training goes on, training on them and losing the updates made meanwhile. "
                "Save synchronously, or judge by the proxy (MvcCheckpointIO(..., epsilon=0.05))")
        if stage == "fit" and getattr(trainer, "is_global_zero", True):
            # every checkpoint holds them: a value mvc cannot store fails here, not at the first
            # save an epoch of training later
            hparams = getattr(pl_module, "hparams", None)
            if hparams:
                with self.io.repo.safe_globals():
                    flatten({"hyper_parameters": dict(hparams)})
        if self.grad_ema and stage == "fit":
            self.ema = GradientEMA(pl_module, beta=self.beta, prefix=STATE_DICT_PREFIX)
            self._grads = None

    def on_before_optimizer_step(self, trainer: Any, pl_module: Any, optimizer: Any) -> None:
        """Fold the step's gradients into the EMA.  Here, not after backward: a 16-mixed
        loss scaler has unscaled them by now (after backward they are still multiplied by the
        scale, 2**16 at first), and with gradient accumulation they are the whole step's."""
        if self.ema is not None:
            self.ema.accumulate()

    def on_save_checkpoint(self, trainer: Any, pl_module: Any, checkpoint: dict[str, Any]) -> None:
        """Hand this save's grads, metrics and quality function to the checkpoint IO."""
        if not trainer.is_global_zero:
            return
        pending: dict[str, Any] = {"metrics": _finite_metrics(trainer.callback_metrics)}
        if self.ema is not None:
            # Saves at one step (the top-k file, then ``last.ckpt``) are one state: give them the
            # same gradients, so that the second commits exactly what the first did (and is
            # recognised as no change) rather than a plan made without gradients.
            step = trainer.global_step
            if self._grads is None or self._grads[0] != step:
                self._grads = (step, self.ema.take())
            pending["grads"] = self._grads[1]
        if self.quality is not None:
            pending["quality"] = _evaluator(pl_module, self.quality)
        # In the checkpoint, not on the plugin: an AsyncCheckpointIO saves on a thread of its
        # own, where the next save's on_save_checkpoint could replace the plugin's before this
        # save read it (the plugin pops it before it commits).
        checkpoint[PENDING_KEY] = pending


#: The key under which `MvcCallback.on_save_checkpoint` hands a checkpoint's commit arguments
#: (gradients, metrics, quality function) to `MvcCheckpointIO.save_checkpoint`, which removes it.
PENDING_KEY = "_mvc_pending"


def _saves_through(trainer: Any, io: CheckpointIOCore) -> bool:
    """Whether `io` is the Trainer's checkpoint IO, or the one a wrapper of it (Lightning's
    `AsyncCheckpointIO`) hands the saves to."""
    current = getattr(getattr(trainer, "strategy", None), "checkpoint_io", None)
    for _ in range(8):  # wrappers of wrappers, bounded
        if current is io:
            return True
        current = getattr(current, "checkpoint_io", None)
        if current is None:
            return False
    return False


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
