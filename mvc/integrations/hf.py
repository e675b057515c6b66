"""Hugging Face `Trainer` integration: commit every ``checkpoint-N/`` to mvc, resume from mvc.

    from mvc.integrations.hf import MvcCallback, resume_from_mvc
    trainer = Trainer(model, args, train_dataset=ds, callbacks=[MvcCallback("runs/exp1", delete=True)])
    trainer.train()
    # after a failure, in a new process:
    trainer.train(resume_from_checkpoint=resume_from_mvc("runs/exp1", args.output_dir))

`MvcCallback.on_save` runs after the Trainer has written the whole checkpoint directory
(weights, optimizer, scheduler, RNG states, ``trainer_state.json``); on the world's process
zero it commits the directory as one commit (`mvc.io.dirs`) with the global step and the
metrics ``trainer_state.json`` logged at that step, and with ``delete=True`` removes the
directory afterwards (mvc keeps every checkpoint, compressed: it replaces ``save_total_limit``).
Needs ``pip install mvc[hf]``.
"""
from __future__ import annotations

import json
import math
import os
import shutil
import warnings
from pathlib import Path
from typing import Any, Sequence

import torch.distributed as dist
from transformers import TrainerCallback

from mvc.errors import MvcWarning, UsageError
from mvc.integrations.grad_ema import GradientEMA
from mvc.io.dirs import DEFAULT_OPAQUE, checkout_dir, commit_dir
from mvc.integrations.repo_handle import RepoOnDemand
from mvc.repo.repository import Repo

#: The checkpoint directories the Trainer writes: ``<output_dir>/checkpoint-<global step>``.
CHECKPOINT_PREFIX = "checkpoint-"
#: Where a single-file model's weights live in a committed directory (what the gradient EMA is keyed by).
MODEL_PREFIX = "files/model.safetensors/state/"


class HfIntegrationError(UsageError):
    """The Trainer integration was used in a way that cannot work (a delete with
    load_best_model_at_end, a resume from a commit without a step)."""

    exit_code = 153


def step_metrics(state_file: str | os.PathLike, step: int) -> dict[str, float]:
    """The finite numbers ``trainer_state.json`` logged at `step` (its ``log_history`` entries
    of that step, merged: loss, learning_rate, eval_loss, epoch, ...); {} when there are none."""
    try:
        history = json.loads(Path(state_file).read_text()).get("log_history") or []
    except (OSError, ValueError, AttributeError):
        return {}
    metrics: dict[str, float] = {}
    for entry in history:
        if not isinstance(entry, dict) or entry.get("step") != step:
            continue
        for key, value in entry.items():
            if key != "step" and isinstance(value, (int, float)) and not isinstance(value, bool) \
                    and math.isfinite(value):
                metrics[str(key)] = float(value)
    return metrics


class MvcCallback(TrainerCallback):
    """Commits each checkpoint directory the Trainer saves (world process zero only).

    repo: a `Repo` or a path (a repository is created there if none exists); delete: remove
    ``checkpoint-N/`` once committed; grad_ema: keep an EMA of the gradients (before each
    optimizer step) for sensitivity-based pruning/protection of ``model.safetensors``'s
    tensors; opaque: file patterns kept as bytes (`mvc.io.dirs.DEFAULT_OPAQUE`);
    commit_args: passed to `Repo.commit` (``lossless=True``, ``epsilon=``, ``space=``, ...).
    `commits` lists (step, commit id) of the commits made.
    """

    def __init__(self, repo: str | os.PathLike | Repo, *, delete: bool = False, grad_ema: bool = False,
                 opaque: Sequence[str] = DEFAULT_OPAQUE, **commit_args: Any) -> None:
        # Opened on first use: every rank builds the callback, only one commits.
        self._repo = RepoOnDemand(repo, create=True)
        self.delete = delete
        self.opaque = tuple(opaque)
        self.commit_args = commit_args
        self.commits: list[tuple[int, str]] = []
        self._want_ema = grad_ema
        self._ema: GradientEMA | None = None

    @property
    def repo(self) -> Repo:
        """The repository commits go to (opened, or created, on first use)."""
        return self._repo.get()

    def on_train_begin(self, args: Any, state: Any, control: Any, model: Any = None, **kwargs: Any) -> None:
        """Refuse settings that need the deleted directories; start the gradient EMA."""
        if self.delete and getattr(args, "load_best_model_at_end", False):
            raise HfIntegrationError("MvcCallback(delete=True) removes the checkpoint directories that "
                                     "load_best_model_at_end reloads; use one or the other")
        if self._want_ema and model is not None:
            self._ema = GradientEMA(model, prefix=MODEL_PREFIX)

    def on_pre_optimizer_step(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        """The gradients are complete here (after clipping, before the step zeroes them)."""
        if self._ema is not None:
            self._ema.accumulate()

    def on_save(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        """Commit ``<output_dir>/checkpoint-<global step>`` with its step and logged metrics.

        On several processes every one first waits for the others: each writes its own RNG
        state (``rng_state_<rank>.pth``) into the directory with no barrier before this
        callback, so process zero would commit (and with ``delete=True`` remove) it while
        another is still writing."""
        _barrier()
        if not state.is_world_process_zero:
            return
        step = int(state.global_step)
        folder = Path(args.output_dir) / f"{CHECKPOINT_PREFIX}{step}"
        metrics = step_metrics(folder / "trainer_state.json", step)
        extra = dict(self.commit_args)
        if self._ema is not None and "grads" not in extra:
            extra["grads"] = self._ema.take()
        cid = commit_dir(self.repo, folder, f"{folder.name}", step=step, metrics=metrics,
                         opaque=self.opaque, **extra)
        self.commits.append((step, cid))
        if self.delete:
            shutil.rmtree(folder)


def checkout_checkpoint(repo: str | os.PathLike | Repo, output_dir: str | os.PathLike,
                        rev: str = "HEAD") -> str:
    """Write the checkpoint directory committed at `rev` to ``<output_dir>/checkpoint-<its step>``
    (absent or empty) and return that path, for ``trainer.train(resume_from_checkpoint=...)``."""
    r = RepoOnDemand(repo, create=True).get()
    cid, target = _checkout_target(r, output_dir, rev)
    target.parent.mkdir(parents=True, exist_ok=True)
    checkout_dir(r, cid, target)
    return str(target)


#: The short name the module doc uses.
resume_from_mvc = checkout_checkpoint


def train_from_mvc(trainer: Any, repo: str | os.PathLike | Repo, rev: str = "HEAD", *,
                   cleanup: bool | None = None, **train_args: Any) -> Any:
    """Check `rev` out into the trainer's output directory and resume training from it.

    cleanup: remove the checked-out ``checkpoint-N/`` when training ends or fails (the
    checkpoint is in mvc); None (the default): remove it when the trainer has an
    `MvcCallback(delete=True)`, so that such a run leaves no checkpoint directory behind.

    Launched on several processes (torchrun), every process calls it: the one that saves the
    Trainer's checkpoints (`args.should_save`: process zero, or each node's local zero with
    `save_on_each_node`) checks out and cleans up, and the others wait for its checkout."""
    r = RepoOnDemand(repo, create=True).get()
    cid, target = _checkout_target(r, trainer.args.output_dir, rev)
    writes = bool(getattr(trainer.args, "should_save", True))
    existed = target.exists()  # then empty (checkout refuses anything else): the caller's
    ours = None
    if existed and (not target.is_dir() or any(target.iterdir())):
        # The Trainer's own checkpoint-N (kept by MvcCallback(delete=False), the default):
        # never overwritten. The commit goes beside it, in a directory of ours, removed after.
        ours = Path(trainer.args.output_dir) / f"{RESUME_PREFIX}{cid[:12]}"
        warnings.warn(MvcWarning(
            f"{target} exists (the Trainer's own checkpoint, kept); resuming from commit "
            f"{cid[:12]} checked out to {ours / target.name} instead, removed after training "
            f"(to resume from the directory itself: trainer.train(resume_from_checkpoint="
            f"{str(target)!r}))"), stacklevel=2)
        target, existed = ours / target.name, False
    # every process has chosen the directory before the writer writes there
    _barrier()
    try:
        if writes:
            if ours is not None:
                shutil.rmtree(ours, ignore_errors=True)   # an earlier attempt's
            target.parent.mkdir(parents=True, exist_ok=True)
            checkout_dir(r, cid, target)
    finally:
        # every process reaches the barrier, a failed checkout's too: the others then find no
        # checkpoint and fail, rather than wait for one forever
        _barrier()
    try:
        return trainer.train(resume_from_checkpoint=str(target), **train_args)
    finally:
        # the others are past reading it: a Trainer loads its checkpoint before its first step
        if writes and ours is not None:
            shutil.rmtree(ours, ignore_errors=True)
        elif writes and _cleans_up(trainer, cleanup) and target.is_dir():
            shutil.rmtree(target)
            if existed:
                target.mkdir()


#: Where `train_from_mvc` checks a commit out when the Trainer's own ``checkpoint-N`` is there:
#: ``<output_dir>/.mvc-resume-<commit id>/checkpoint-N`` (hidden, so the Trainer's rotation of
#: ``checkpoint-*`` never sees it).
RESUME_PREFIX = ".mvc-resume-"


def _barrier() -> None:
    """Wait for every process of the Trainer's process group (the default one; nothing to
    wait for in one process)."""
    if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
        dist.barrier()


def _checkout_target(r: Repo, output_dir: str | os.PathLike, rev: str) -> tuple[str, Path]:
    """`rev`'s commit id and ``<output_dir>/checkpoint-<its step>``."""
    cid = r.resolve(rev)
    step = r.read_commit(cid).step
    if step is None:
        raise HfIntegrationError(f"{rev}: commit {cid[:12]} records no step; check it out with "
                                 "`mvc checkout REV -o DIR` and name the directory yourself")
    return cid, Path(output_dir) / f"{CHECKPOINT_PREFIX}{step}"


def _cleans_up(trainer: Any, cleanup: bool | None) -> bool:
    if cleanup is not None:
        return cleanup
    callbacks = getattr(getattr(trainer, "callback_handler", None), "callbacks", ())
    return any(isinstance(cb, MvcCallback) and cb.delete for cb in callbacks)

