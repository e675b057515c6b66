"""Lightning integration (the ``lightning`` package): checkpoints as mvc commits behind small
pointer files.

    from mvc.integrations.lightning import MvcCallback, MvcCheckpointIO
    io = MvcCheckpointIO("runs/exp1")                     # a path (created) or a Repo
    trainer = Trainer(plugins=[io], callbacks=[ModelCheckpoint(...), MvcCallback(io, quality=val_loss)])
    trainer.fit(model, ckpt_path="checkpoints/last.ckpt")   # a pointer file: resumes from mvc

These classes are for ``import lightning`` (``lightning.pytorch.Trainer``); a project that does
``import pytorch_lightning as pl`` uses the same classes from `mvc.integrations.pytorch_lightning`
(Lightning's two packages have separate class hierarchies, and each Trainer accepts only its own).

`MvcCheckpointIO.save_checkpoint` commits the checkpoint dict Lightning builds (weights,
``optimizer_states``, ``lr_schedulers``, loops, callbacks' state, ...) and writes a small JSON
*pointer file* at `path` naming the commit, so `ModelCheckpoint`'s top-k and ``last`` logic and
``trainer.fit(ckpt_path=path)`` work unchanged.  A checkpoint equal to the branch's head (the
second of ``save_last=True``'s two saves) makes no second commit.  Each pointer's commit is also
held by a tag ``ckpt/<file name>-<hash of the path>``; `remove_checkpoint` deletes the pointer
and that tag.  The commit stays in the branch's history (mvc keeps history cheaply; `gc` frees
what no ref, branch or reflog reaches).  ``mvc checkout <commit> -o x.ckpt`` writes a plain
Lightning checkpoint file that ``Trainer.fit(ckpt_path="x.ckpt")`` reads without mvc.

`MvcCallback` adds what needs the training loop: a gradient EMA (`GradientEMA`, keyed like the
checkpoint's ``state_dict``) for sensitivity-based pruning/protection, the metrics Lightning
logged (``trainer.callback_metrics``), and a quality function ``quality(pl_module) -> loss``
that judges the commit's quantization search.  Needs ``pip install mvc[lightning]``.  What both
modules do is in `mvc.integrations.lightning_core`.
"""
from __future__ import annotations

from mvc.integrations.lightning_core import (POINTER_FORMAT, POINTER_MARK, STATE_DICT_PREFIX, TAG_PREFIX,
                                             CallbackCore, CheckpointIOCore, LightningNotInstalledError,
                                             LightningSetupError, PointerFileError, not_installed, read_pointer,
                                             tag_for)

try:
    from lightning.fabric.plugins.io.checkpoint_io import CheckpointIO
    from lightning.pytorch import Trainer
    from lightning.pytorch.callbacks import Callback
except ModuleNotFoundError as exc:
    raise not_installed("lightning", exc) from None

__all__ = ["MvcCallback", "MvcCheckpointIO", "LightningNotInstalledError", "LightningSetupError",
           "PointerFileError", "POINTER_FORMAT", "POINTER_MARK", "STATE_DICT_PREFIX", "TAG_PREFIX",
           "read_pointer", "tag_for"]


class MvcCheckpointIO(CheckpointIOCore, CheckpointIO):
    """A `lightning` `CheckpointIO` that commits checkpoints to mvc and leaves pointer files.

    repo: a `Repo` or a path (a repository is created there if none exists); commit_args:
    passed to every `Repo.commit` (``lossless=True``, ``epsilon=``, ``space=``, ``policy=``...).
    A checkpoint equal to the branch's head makes no second commit (``allow_empty=True`` in
    commit_args commits anyway).  `commits` lists (pointer path, commit id) of the saves.  An
    `MvcCallback` given this object adds grads, metrics and the quality function to each commit.
    """

    package = "lightning"


class MvcCallback(CallbackCore, Callback):
    """The training-loop side of `MvcCheckpointIO`: gradient EMA, logged metrics, quality.

    io: the `MvcCheckpointIO` the Trainer saves through (``plugins=[io]``, checked at setup);
    quality: ``quality(pl_module) -> loss`` (lower is better) that judges the quantization
    search on each commit (None: the proxy gate); grad_ema: keep an EMA of the gradients at
    each optimizer step (unscaled, whole); beta: its weight.
    """

    package = "lightning"
    io_class = MvcCheckpointIO
    trainer_class = Trainer
